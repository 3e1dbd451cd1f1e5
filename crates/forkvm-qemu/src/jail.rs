//! The QEMU jail: what a sandbox's QEMU process can see and do.
//!
//! A jailed QEMU is set up between `fork` and `exec`, in the child, while it
//! is still root:
//!
//! ```text
//!  write "0" to each cgroup.procs fd      its own cgroup before its first instruction
//!  setns(netns)                            (process.rs: the sandbox's network)
//!  open /dev/net/tun, TUNSETIFF tap0       the tap as an fd, dup2'd onto a reserved number
//!  (fork, from a thread that unshared      pid 1 of a pid namespace of its own
//!   CLONE_NEWPID: process.rs)
//!  unshare(CLONE_NEWNS|CLONE_NEWIPC)      mounts from here on stay in QEMU's namespace;
//!  / rprivate                              no System V IPC or mqueues shared with anyone
//!  tmpfs on <root>, then per entry:        binds at the SAME absolute paths as on the host
//!     mkdir parents / touch, bind, remount ro,nosuid,nodev[,noexec]
//!  pivot_root(<root>), detach the old /    the host's tree is gone
//!  remount / read-only
//!  no_new_privs, drop the bounding set
//!  setgroups([]), setresgid, setresuid     an unprivileged uid/gid of its own
//!  setrlimit NOFILE, FSIZE                 hard = soft (see [`Rlimits`])
//!  capset(0)                               nothing inheritable either
//!  close_range(CLOEXEC) all but 0-2,       nothing the daemon inherited or opened
//!     the tap and the uid lock             reaches QEMU
//!  exec qemu … -sandbox on,…               QEMU installs its seccomp filter
//! ```
//!
//! Keeping every path identical is the point: the daemon keeps handing QEMU
//! absolute host paths over QMP after start-up (snapshot files, new disk
//! overlays, incoming migration files), and each one means the same file
//! inside the jail, provided it lies in a directory that is mounted.
//! QEMU's own `-run-with chroot=` cannot do that (it chroots after start-up,
//! so later paths would need rewriting and the tree would have to be built
//! on the host), and `-run-with user=` cannot be combined with
//! `-sandbox elevateprivileges=deny`: QEMU installs the filter first and is
//! then killed by it (SIGSYS) when it calls setgid. docs/security.md has the
//! reasoning.
//!
//! Everything the child does is a plain syscall on data prepared before the
//! fork ([`Jail::prepare`]): after `fork` in a multi-threaded daemon the child
//! must not allocate.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How a host path is made visible inside the jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only data: no exec, no devices, no setuid.
    ReadOnly,
    /// Read-write data (the sandbox's own directory and RAM file).
    ReadWrite,
    /// Read-only programs and libraries (QEMU and what it links).
    Exec,
    /// A device node such as `/dev/urandom`.
    Device,
}

/// One host path shown at the same path inside the jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub path: PathBuf,
    pub access: Access,
}

/// Everything that confines one QEMU.
#[derive(Debug)]
pub struct Jail {
    /// QEMU's uid and gid (never 0).
    pub uid: u32,
    pub gid: u32,
    /// An existing empty directory on the host. A tmpfs is mounted on it
    /// inside QEMU's mount namespace only, and becomes QEMU's root.
    pub root: PathBuf,
    /// What QEMU sees, besides an empty read-only tmpfs.
    pub mounts: Vec<Mount>,
    /// `cgroup.procs` files (one per v1 hierarchy, or one v2 file) that QEMU
    /// joins before it execs.
    pub cgroup_procs: Vec<PathBuf>,
    /// Files whose open descriptions QEMU inherits and so keeps alive (a
    /// flock on one holds the uid allocated for QEMU's lifetime).
    pub inherit: Vec<std::fs::File>,
    /// QEMU's resource limits.
    pub rlimits: Rlimits,
}

/// The rlimits of a jailed QEMU, soft = hard so that QEMU cannot raise them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimits {
    /// Open files. A microVM's QEMU holds about 35 (measured: 33 for a
    /// cold boot, 34 for a clone; docs/security.md).
    pub nofile: u64,
    /// The largest file QEMU may write, in bytes (its disk layers, its RAM
    /// file and a snapshot's RAM stream); `u64::MAX` for no limit. Past it
    /// a write fails with EFBIG: QEMU is pid 1 of its pid namespace, and a
    /// namespace's init ignores the SIGXFSZ it would otherwise die of.
    pub fsize: u64,
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits {
            nofile: DEFAULT_NOFILE,
            fsize: u64::MAX,
        }
    }
}

/// RLIMIT_NOFILE of a jailed QEMU: Firecracker's jailer default, over 50
/// times what a QEMU uses.
pub const DEFAULT_NOFILE: u64 = 2048;

/// Entering the jail failed before QEMU ran.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("cannot prepare the jail: {path} is not a usable path ({why})")]
    Path { path: String, why: String },
    #[error("cannot open {path} for the jail: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A file-system step the child takes, with every path already a C string.
#[derive(Debug)]
enum Op {
    Mkdir(CString),
    /// Create an empty file to bind a file (or device) onto.
    Touch(CString),
    Bind {
        src: CString,
        dst: CString,
        /// Flags of the read-only/nosuid remount that follows the bind.
        remount: libc::c_ulong,
    },
    Symlink {
        target: CString,
        at: CString,
    },
}

/// A [`Jail`] turned into syscalls, made before `fork`.
#[derive(Debug)]
pub struct Prepared {
    uid: u32,
    gid: u32,
    root: CString,
    ops: Vec<Op>,
    cgroups: Vec<OwnedFd>,
    inherit: Vec<RawFd>,
    /// Descriptors above 2 that QEMU gets (the tap, the uid lock), sorted:
    /// every other one is closed at exec.
    keep: Vec<RawFd>,
    rlimits: Rlimits,
    tap: Option<Tap>,
    _keep: Vec<std::fs::File>,
}

/// The tap the child opens in the sandbox's network namespace.
#[derive(Debug)]
struct Tap {
    ifreq: [u8; 40],
    /// A descriptor number reserved in the parent (it points at /dev/null
    /// there); the child replaces it with the tap.
    fd: OwnedFd,
}

fn cstr(p: &Path) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| JailError::Path {
        path: p.display().to_string(),
        why: "it contains a NUL byte".into(),
    })
}

/// `root` + `p` for an absolute `p`.
fn under(root: &Path, p: &Path) -> PathBuf {
    let rel = p.strip_prefix("/").unwrap_or(p);
    root.join(rel)
}

/// The top-level links and directories that hold the dynamic loader and
/// libraries (symlinks into /usr on a merged-/usr system).
const LIB_ROOTS: &[&str] = &["/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"];

impl Jail {
    /// The mounts every QEMU needs to run at all: /usr, the library roots,
    /// the loader cache and a few device nodes.
    pub fn base_mounts(qemu: &Path, kvm: bool) -> Vec<Mount> {
        let mut v = vec![Mount {
            path: "/usr".into(),
            access: Access::Exec,
        }];
        if !qemu.starts_with("/usr") {
            v.push(Mount {
                path: qemu.to_path_buf(),
                access: Access::Exec,
            });
        }
        for f in ["/etc/ld.so.cache"] {
            if Path::new(f).exists() {
                v.push(Mount {
                    path: f.into(),
                    access: Access::ReadOnly,
                });
            }
        }
        let mut devs = vec!["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];
        if kvm {
            devs.push("/dev/kvm");
        }
        v.extend(devs.into_iter().map(|d| Mount {
            path: d.into(),
            access: Access::Device,
        }));
        v
    }

    /// Resolve every path and build the child's steps. `tap` names a tap
    /// device the child opens (after joining the sandbox's network
    /// namespace) onto the descriptor number returned with the result.
    pub fn prepare(mut self, tap: Option<&str>) -> Result<(Prepared, Option<RawFd>), JailError> {
        if self.uid == 0 || self.gid == 0 {
            return Err(JailError::Path {
                path: self.root.display().to_string(),
                why: "a jailed QEMU must not run as uid or gid 0".into(),
            });
        }
        let mut ops = Vec::new();
        let mut made: std::collections::HashSet<PathBuf> = Default::default();
        let mut mkdirs = |ops: &mut Vec<Op>, dir: &Path| -> Result<(), JailError> {
            // Every ancestor, outermost first, each once.
            let mut chain: Vec<&Path> = dir.ancestors().collect();
            chain.reverse();
            for a in chain {
                if a == Path::new("/") || !made.insert(a.to_path_buf()) {
                    continue;
                }
                ops.push(Op::Mkdir(cstr(&under(&self.root, a))?));
            }
            Ok(())
        };
        for l in LIB_ROOTS {
            let p = Path::new(l);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = std::fs::read_link(p).map_err(|e| JailError::Open {
                        path: l.to_string(),
                        source: e,
                    })?;
                    ops.push(Op::Symlink {
                        target: cstr(&target)?,
                        at: cstr(&under(&self.root, p))?,
                    });
                }
                Ok(m) if m.is_dir() => self.mounts.push(Mount {
                    path: p.into(),
                    access: Access::Exec,
                }),
                _ => {}
            }
        }
        // Parents before children: a bind of /a must come before /a/b.
        self.mounts.sort_by(|a, b| a.path.cmp(&b.path));
        self.mounts.dedup_by(|a, b| a.path == b.path);
        for m in &self.mounts {
            if !m.path.is_absolute() {
                return Err(JailError::Path {
                    path: m.path.display().to_string(),
                    why: "jail paths must be absolute".into(),
                });
            }
            let meta = std::fs::metadata(&m.path).map_err(|e| JailError::Open {
                path: m.path.display().to_string(),
                source: e,
            })?;
            let dst = under(&self.root, &m.path);
            if meta.is_dir() {
                mkdirs(&mut ops, &m.path)?;
            } else {
                if let Some(parent) = m.path.parent() {
                    mkdirs(&mut ops, parent)?;
                }
                ops.push(Op::Touch(cstr(&dst)?));
            }
            let base = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID;
            let remount = match m.access {
                Access::ReadOnly => base | libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOEXEC,
                Access::ReadWrite => base | libc::MS_NODEV | libc::MS_NOEXEC,
                Access::Exec => base | libc::MS_RDONLY | libc::MS_NODEV,
                Access::Device => base | libc::MS_NOEXEC,
            };
            ops.push(Op::Bind {
                src: cstr(&m.path)?,
                dst: cstr(&dst)?,
                remount,
            });
        }
        let mut cgroups = Vec::new();
        for p in &self.cgroup_procs {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(|e| JailError::Open {
                    path: p.display().to_string(),
                    source: e,
                })?;
            cgroups.push(OwnedFd::from(f));
        }
        let tap = match tap {
            Some(name) => {
                let bytes = OsStr::new(name).as_bytes();
                if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
                    return Err(JailError::Path {
                        path: name.into(),
                        why: "not a network interface name".into(),
                    });
                }
                let mut ifreq = [0u8; 40];
                ifreq[..bytes.len()].copy_from_slice(bytes);
                // IFF_TAP | IFF_NO_PI | IFF_VNET_HDR: what QEMU asks for when
                // it opens a tap by name itself.
                let flags: libc::c_short = (libc::IFF_TAP | libc::IFF_NO_PI | 0x4000) as _;
                ifreq[16..18].copy_from_slice(&flags.to_ne_bytes());
                let null = std::fs::File::open("/dev/null").map_err(|e| JailError::Open {
                    path: "/dev/null".into(),
                    source: e,
                })?;
                Some(Tap {
                    ifreq,
                    fd: OwnedFd::from(null),
                })
            }
            None => None,
        };
        let tap_fd = tap.as_ref().map(|t| t.fd.as_raw_fd());
        let inherit: Vec<RawFd> = self.inherit.iter().map(|f| f.as_raw_fd()).collect();
        let mut keep: Vec<RawFd> = inherit.iter().copied().chain(tap_fd).collect();
        keep.sort_unstable();
        Ok((
            Prepared {
                uid: self.uid,
                gid: self.gid,
                root: cstr(&self.root)?,
                ops,
                cgroups,
                inherit,
                keep,
                rlimits: self.rlimits,
                tap,
                _keep: self.inherit,
            },
            tap_fd,
        ))
    }
}

/// Refuse a connection to a jailed QEMU's socket whose listener is not that
/// QEMU.
///
/// A jailed QEMU owns the sockets it creates in its sandbox directory, so a
/// compromised one could replace them with symlinks to another sandbox's
/// sockets. The directory itself is the daemon's (`root:<gid>`, sticky, see
/// the daemon's jail module) and names the uid (= gid) of the QEMU that may
/// listen in it; the kernel's record of the listener's credentials
/// (SO_PEERCRED) must match it. Sockets outside such a directory (an
/// unjailed QEMU's) are not checked.
pub fn check_peer(stream: &tokio::net::UnixStream, socket: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = socket.parent() else {
        return Ok(());
    };
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    let jailed = m.is_dir() && m.uid() == 0 && m.gid() != 0 && m.mode() & 0o1000 != 0;
    if !jailed {
        return Ok(());
    }
    let cred = stream.peer_cred()?;
    if cred.uid() != m.gid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by uid {}, not by this sandbox's QEMU (uid {}): refusing it",
                socket.display(),
                cred.uid(),
                m.gid()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check(r: libc::c_int, what: &'static str) -> io::Result<()> {
    if r < 0 {
        let e = io::Error::last_os_error();
        // Only the errno crosses back to the daemon, so name the step on
        // QEMU's stderr (its log, which the spawn error quotes). Static
        // bytes and write(2): nothing here allocates.
        for part in [
            b"forkvm jail: failed at ".as_slice(),
            what.as_bytes(),
            b"\n",
        ] {
            // SAFETY: writing a valid buffer to fd 2.
            unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
        }
        return Err(e);
    }
    Ok(())
}

const NULL: *const libc::c_char = std::ptr::null();

impl Prepared {
    /// Join the cgroups (first, so that everything QEMU does is accounted).
    ///
    /// # Safety
    /// Only between `fork` and `exec` (it changes the calling process).
    pub unsafe fn join_cgroups(&self) -> io::Result<()> {
        for fd in &self.cgroups {
            // SAFETY: writing two bytes from a static buffer to an fd we own.
            let r = unsafe { libc::write(fd.as_raw_fd(), b"0\n".as_ptr().cast(), 2) };
            check(r as libc::c_int, "joining the cgroup")?;
        }
        Ok(())
    }

    /// Open the tap in the current network namespace onto the reserved fd.
    ///
    /// # Safety
    /// Only between `fork` and `exec`, after joining the sandbox's netns.
    pub unsafe fn open_tap(&self) -> io::Result<()> {
        let Some(t) = &self.tap else { return Ok(()) };
        // SAFETY: plain syscalls on a static path and a buffer we own; the
        // ifreq is 40 bytes, the size TUNSETIFF reads and writes.
        unsafe {
            let fd = libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            );
            check(fd, "opening /dev/net/tun")?;
            let mut ifreq = t.ifreq;
            const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
            check(
                libc::ioctl(fd, TUNSETIFF as _, ifreq.as_mut_ptr()),
                "attaching to the tap (TUNSETIFF)",
            )?;
            // dup2 also clears close-on-exec on the reserved number.
            check(libc::dup2(fd, t.fd.as_raw_fd()), "dup2 of the tap")?;
            libc::close(fd);
        }
        Ok(())
    }

    /// Build the root, switch to it, drop privileges.
    ///
    /// # Safety
    /// Only between `fork` and `exec`: it replaces the calling process's
    /// mount namespace and credentials.
    pub unsafe fn enter(&self) -> io::Result<()> {
        // SAFETY: every call below is a syscall on NUL-terminated strings
        // prepared before the fork, or on integers.
        unsafe {
            for &fd in &self.inherit {
                check(libc::fcntl(fd, libc::F_SETFD, 0), "keeping the uid lock")?;
            }
            check(
                libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC),
                "unshare(CLONE_NEWNS|CLONE_NEWIPC)",
            )?;
            // Nothing mounted from here on may reach the host's namespace.
            check(
                libc::mount(
                    NULL,
                    c"/".as_ptr(),
                    NULL,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ),
                "making mounts private",
            )?;
            check(
                libc::mount(
                    c"tmpfs".as_ptr(),
                    self.root.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=0755,size=1m".as_ptr().cast(),
                ),
                "mounting the root tmpfs",
            )?;
            for op in &self.ops {
                match op {
                    Op::Mkdir(p) => {
                        if libc::mkdir(p.as_ptr(), 0o755) < 0
                            && *libc::__errno_location() != libc::EEXIST
                        {
                            check(-1, "mkdir in the jail")?;
                        }
                    }
                    Op::Touch(p) => {
                        let fd = libc::open(
                            p.as_ptr(),
                            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o644,
                        );
                        check(fd, "creating a mount point in the jail")?;
                        libc::close(fd);
                    }
                    Op::Bind { src, dst, remount } => {
                        check(
                            libc::mount(
                                src.as_ptr(),
                                dst.as_ptr(),
                                NULL,
                                libc::MS_BIND,
                                std::ptr::null(),
                            ),
                            "bind mount into the jail",
                        )?;
                        check(
                            libc::mount(NULL, dst.as_ptr(), NULL, *remount, std::ptr::null()),
                            "remounting a jail bind",
                        )?;
                    }
                    Op::Symlink { target, at } => check(
                        libc::symlink(target.as_ptr(), at.as_ptr()),
                        "symlink in the jail",
                    )?,
                }
            }
            // pivot_root(".", "."): the old root ends up stacked under the
            // new one and is detached at once, so no path leads back to it.
            check(libc::chdir(self.root.as_ptr()), "chdir to the jail root")?;
            check(
                libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int,
                "pivot_root",
            )?;
            check(
                libc::umount2(c".".as_ptr(), libc::MNT_DETACH),
                "detaching the host root",
            )?;
            check(libc::chdir(c"/".as_ptr()), "chdir /")?;
            check(
                libc::mount(
                    NULL,
                    c"/".as_ptr(),
                    NULL,
                    libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                    std::ptr::null(),
                ),
                "remounting the jail root read-only",
            )?;
            check(
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
                "no_new_privs",
            )?;
            // The bounding set: no exec can ever regain a capability.
            for cap in 0..64 {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0
                    && *libc::__errno_location() == libc::EINVAL
                {
                    break; // past the last capability this kernel knows
                }
            }
            for (res, v, what) in [
                (libc::RLIMIT_NOFILE, self.rlimits.nofile, "RLIMIT_NOFILE"),
                (libc::RLIMIT_FSIZE, self.rlimits.fsize, "RLIMIT_FSIZE"),
            ] {
                let v = if v == u64::MAX {
                    libc::RLIM_INFINITY
                } else {
                    v
                };
                let lim = libc::rlimit {
                    rlim_cur: v,
                    rlim_max: v,
                };
                check(libc::setrlimit(res, &lim), what)?;
            }
            check(libc::setgroups(0, std::ptr::null()), "setgroups")?;
            check(libc::setresgid(self.gid, self.gid, self.gid), "setresgid")?;
            check(libc::setresuid(self.uid, self.uid, self.uid), "setresuid")?;
            // Leaving uid 0 cleared the permitted and effective sets; clear
            // the inheritable one too.
            let mut hdr = CapHeader {
                version: 0x2008_0522,
                pid: 0,
            };
            let data = [CapData::default(); 2];
            check(
                libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) as libc::c_int,
                "capset",
            )?;
            crate::fds::cloexec_all_except(&self.keep)?;
        }
        Ok(())
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jail(root: &Path, mounts: Vec<Mount>) -> Jail {
        Jail {
            uid: 1234,
            gid: 1234,
            root: root.into(),
            mounts,
            cgroup_procs: vec![],
            inherit: vec![],
            rlimits: Rlimits::default(),
        }
    }

    #[test]
    fn binds_land_at_the_same_path_under_the_root_parents_first() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a/b/file");
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, b"x").unwrap();
        let mounts = vec![
            Mount {
                path: f.clone(),
                access: Access::ReadOnly,
            },
            Mount {
                path: d.path().join("a"),
                access: Access::ReadWrite,
            },
        ];
        let (p, tap) = jail(Path::new("/jr"), mounts).prepare(None).unwrap();
        assert!(tap.is_none());
        let dsts: Vec<String> = p
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::Bind { dst, remount, .. } => Some(format!(
                    "{} {}",
                    dst.to_str().unwrap(),
                    remount & libc::MS_RDONLY
                )),
                _ => None,
            })
            .collect();
        let a = format!("/jr{}", d.path().join("a").display());
        assert_eq!(
            dsts,
            vec![format!("{a} 0"), format!("{a}/b/file {}", libc::MS_RDONLY)]
        );
    }

    #[tokio::test]
    async fn a_socket_in_a_jail_directory_must_be_served_by_its_uid() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // chown needs root; the VM tests cover this as root
        }
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("qmp.sock");
        let _l = tokio::net::UnixListener::bind(&sock).unwrap();
        // An ordinary directory: not checked.
        let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
        check_peer(&s, &sock).unwrap();
        // A jail directory for uid 4242: our (root) listener is refused.
        std::os::unix::fs::chown(d.path(), Some(0), Some(4242)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1770)).unwrap();
        let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
        let e = check_peer(&s, &sock).unwrap_err();
        assert!(e.to_string().contains("uid 4242"), "{e}");
    }

    #[test]
    fn uid_zero_and_relative_paths_are_refused() {
        let mut j = jail(Path::new("/jr"), vec![]);
        j.uid = 0;
        assert!(j.prepare(None).is_err());
        let j = jail(
            Path::new("/jr"),
            vec![Mount {
                path: "rel".into(),
                access: Access::ReadOnly,
            }],
        );
        assert!(j.prepare(None).is_err());
        let j = jail(Path::new("/jr"), vec![]);
        assert!(j.prepare(Some("a-name-far-too-long-for-linux")).is_err());
        let (_, fd) = jail(Path::new("/jr"), vec![])
            .prepare(Some("tap0"))
            .unwrap();
        assert!(fd.is_some());
    }
}
