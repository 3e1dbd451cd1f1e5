//! Bringing the VM up: stage 1 (initramfs to real root) and the pid-1 part of
//! stage 2 (pseudo filesystems, hostname, loopback, environment).

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmdline::{self, BootParams};
use crate::{log, sys};

/// Present only in the initramfs: its existence selects stage 1.
pub const MODULES_LIST: &str = "/etc/forkvm/modules.list";
const MODULES_DIR: &str = "/lib/modules";
const NEW_ROOT: &str = "/newroot";
const ROOT_WAIT: Duration = Duration::from_secs(10);

/// A boot failure that leaves the VM useless. As pid 1 it is printed and
/// the VM powered off, so the host sees QEMU exit with the reason on the
/// console instead of a hang.
#[derive(Debug)]
pub struct Fatal {
    pub what: String,
    pub hint: String,
}

impl Fatal {
    pub fn new(what: impl Into<String>, hint: impl Into<String>) -> Self {
        Fatal {
            what: what.into(),
            hint: hint.into(),
        }
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "forkvm-agent: FATAL: {} — {}", self.what, self.hint)
    }
}

struct MountSpec {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: libc::c_ulong,
    data: Option<&'static str>,
}

const NOSUID_NODEV_NOEXEC: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

/// The kernel filesystems both stages need, in mount order.
const BASE_MOUNTS: [MountSpec; 3] = [
    MountSpec {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: NOSUID_NODEV_NOEXEC,
        data: None,
    },
    MountSpec {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: NOSUID_NODEV_NOEXEC,
        data: None,
    },
    MountSpec {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: libc::MS_NOSUID,
        data: Some("mode=0755"),
    },
];

/// What a normal Linux userland expects on top of those in the real root.
const ROOT_MOUNTS: [MountSpec; 4] = [
    MountSpec {
        source: "devpts",
        target: "/dev/pts",
        fstype: "devpts",
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        // gid 5 is "tty" on Debian; ptmxmode so unprivileged users get ptys.
        data: Some("mode=0620,gid=5,ptmxmode=0666"),
    },
    MountSpec {
        source: "tmpfs",
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: Some("mode=1777"),
    },
    MountSpec {
        source: "tmpfs",
        target: "/run",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: Some("mode=0755"),
    },
    MountSpec {
        source: "tmpfs",
        target: "/tmp",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: Some("mode=1777"),
    },
];

/// Mount `m` unless something is already mounted there. (Checking first
/// matters: proc, sysfs and devtmpfs happily stack a second mount instead of
/// failing with EBUSY.)
fn ensure_mount(m: &MountSpec) -> io::Result<()> {
    let target = Path::new(m.target);
    fs::create_dir_all(target)?;
    if sys::is_mountpoint(target).unwrap_or(false) {
        return Ok(());
    }
    match sys::mount(m.source, target, Some(m.fstype), m.flags, m.data) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
        r => r,
    }
}

/// The kernel command line, split into parameters.
pub fn cmdline_tokens() -> Vec<String> {
    match fs::read_to_string("/proc/cmdline") {
        Ok(s) => cmdline::split_cmdline(&s),
        Err(e) => {
            log(&format!("cannot read /proc/cmdline: {e} (using defaults)"));
            Vec::new()
        }
    }
}

/// Stage 1: in the initramfs, load modules, mount the root disk and switch
/// to it. Returns in the new root (or powers off for a probe boot).
pub fn stage1() -> Result<(), Fatal> {
    for m in &BASE_MOUNTS {
        ensure_mount(m).map_err(|e| {
            Fatal::new(
                format!("cannot mount {} on {}: {e}", m.fstype, m.target),
                "the kernel must have proc, sysfs and devtmpfs built in",
            )
        })?;
    }
    let tokens = cmdline_tokens();
    let params = cmdline::boot_params(&tokens);

    let modules = match fs::read_to_string(MODULES_LIST) {
        Ok(s) => cmdline::parse_modules_list(&s),
        Err(e) => {
            log(&format!(
                "cannot read {MODULES_LIST}: {e} (loading no modules)"
            ));
            Vec::new()
        }
    };
    let paths = load_modules(&modules, &tokens);

    if params.probe {
        // The host only wants to know that this accelerator boots us.
        println!("FORKVM_PROBE_OK");
        sys::power_off();
    }

    mount_root(&params)?;
    // The modules are in the kernel now; their files would only pin RAM.
    for p in &paths {
        let _ = fs::remove_file(p);
    }
    switch_root(Path::new(NEW_ROOT)).map_err(|e| {
        Fatal::new(
            format!(
                "cannot switch to the root filesystem on {}: {e}",
                params.root
            ),
            "the root image needs /dev, /proc and /sys directories (or must be writable)",
        )
    })
}

/// Load each listed module in order. A failure is reported and skipped: an
/// optional module must not stop the boot, and a missing essential one shows
/// up as a clearer fatal error later (no root device). Returns the files.
fn load_modules(modules: &[String], tokens: &[String]) -> Vec<PathBuf> {
    let mut paths = Vec::with_capacity(modules.len());
    for name in modules {
        let path = if name.starts_with('/') {
            PathBuf::from(name)
        } else {
            Path::new(MODULES_DIR).join(name)
        };
        let params = cmdline::module_params(tokens, &cmdline::module_name(name));
        // Compressed modules work if the kernel can decompress them itself.
        let compressed = [".ko.xz", ".ko.zst", ".ko.gz"]
            .iter()
            .any(|ext| name.ends_with(ext));
        let flags = if compressed {
            sys::MODULE_INIT_COMPRESSED_FILE
        } else {
            0
        };
        let r = File::open(&path).and_then(|f| sys::finit_module(&f, &params, flags));
        match r {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {} // built in or already loaded
            Err(e) => println!(
                "forkvm-agent: cannot load module {}: {e} (continuing)",
                path.display()
            ),
        }
        paths.push(path);
    }
    paths
}

fn mount_root(params: &BootParams) -> Result<(), Fatal> {
    let dev = Path::new(&params.root);
    // virtio-mmio devices are probed asynchronously after their modules load.
    let deadline = Instant::now() + ROOT_WAIT;
    loop {
        if fs::metadata(dev).is_ok_and(|m| m.file_type().is_block_device()) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Fatal::new(
                format!(
                    "root device {} did not appear within {} s",
                    params.root,
                    ROOT_WAIT.as_secs()
                ),
                "check that QEMU attached the disk and that virtio_mmio and virtio_blk are in \
                 /etc/forkvm/modules.list",
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
    fs::create_dir_all(NEW_ROOT).map_err(|e| {
        Fatal::new(
            format!("cannot create {NEW_ROOT}: {e}"),
            "the initramfs must be writable",
        )
    })?;
    sys::mount(&params.root, Path::new(NEW_ROOT), Some("ext4"), 0, None).map_err(|e| {
        Fatal::new(
            format!("cannot mount {} as ext4 on {NEW_ROOT}: {e}", params.root),
            "the root image must be ext4, and ext4.ko and its dependencies (jbd2, mbcache, crc16, \
             crc32c) must be in /etc/forkvm/modules.list",
        )
    })
}

/// Make `new_root` the root of the filesystem tree, carrying /dev, /proc and
/// /sys along (what busybox `switch_root` does, minus exec).
fn switch_root(new_root: &Path) -> io::Result<()> {
    for m in ["/dev", "/proc", "/sys"] {
        let target = new_root.join(&m[1..]);
        fs::create_dir_all(&target)?;
        sys::mount(m, &target, None, libc::MS_MOVE, None)
            .map_err(|e| io::Error::new(e.kind(), format!("moving {m}: {e}")))?;
    }
    std::env::set_current_dir(new_root)?;
    sys::mount(".", Path::new("/"), None, libc::MS_MOVE, None)
        .map_err(|e| io::Error::new(e.kind(), format!("moving the new root onto /: {e}")))?;
    std::os::unix::fs::chroot(".")?;
    std::env::set_current_dir("/")?;
    Ok(())
}

/// The first NIC's address, route and nameserver, from `forkvm.ip=`,
/// `forkvm.gw=` and `forkvm.dns=`. Every sandbox gets the same values (see
/// the forkvm-net crate): a clone keeps them, so nothing is redone on resume.
fn configure_nic(
    addr: std::net::Ipv4Addr,
    prefix: u8,
    gw: Option<std::net::Ipv4Addr>,
    dns: Option<std::net::Ipv4Addr>,
) {
    const NIC: &str = "eth0";
    // virtio_net was loaded in stage 1, so the interface exists by now.
    let r = sys::set_ipv4(NIC, addr, prefix)
        .and_then(|_| sys::interface_up(NIC))
        .and_then(|_| gw.map_or(Ok(()), sys::add_default_route));
    if let Err(e) = r {
        log(&format!("cannot configure {NIC} ({addr}/{prefix}): {e}"));
        return;
    }
    if let Some(d) = dns {
        // Replace a symlink (systemd-resolved's) with a plain file.
        let _ = std::fs::remove_file("/etc/resolv.conf");
        if let Err(e) = std::fs::write("/etc/resolv.conf", format!("nameserver {d}\n")) {
            log(&format!("cannot write /etc/resolv.conf: {e}"));
        }
    }
}

/// Stage 2 as pid 1: everything a normal userland expects. Failures are
/// logged, not fatal: a sandbox without /dev/shm is still useful.
///
/// Must run before any other thread exists (it sets environment variables).
pub fn stage2_setup() {
    for m in BASE_MOUNTS.iter().chain(&ROOT_MOUNTS) {
        if let Err(e) = ensure_mount(m) {
            log(&format!("cannot mount {} on {}: {e}", m.fstype, m.target));
        }
    }
    // devtmpfs does not provide these; bash process substitution needs /dev/fd.
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        match std::os::unix::fs::symlink(target, link) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                log(&format!("cannot create {link}: {e}"))
            }
            _ => {}
        }
    }

    let params = cmdline::boot_params(&cmdline_tokens());
    if let Some(h) = &params.hostname {
        // HOST_NAME_MAX is 64 on Linux.
        if h.len() > 64 {
            log(&format!("hostname {h:?} is longer than 64 bytes; not set"));
        } else if let Err(e) = sys::set_hostname(h) {
            log(&format!("cannot set hostname {h:?}: {e}"));
        }
    }
    if let Err(e) = sys::interface_up("lo") {
        log(&format!("cannot bring up lo: {e}"));
    }
    if let Some((addr, prefix)) = params.ip {
        configure_nic(addr, prefix, params.gw, params.dns);
    }

    // Inherited by every command the agent runs, which gets the image's
    // `Env` on top: PATH and HOME only, as in a Docker container (whose
    // runtime also adds HOSTNAME, and TERM with a terminal; the agent sets
    // TERM for PTYs). What the kernel gave init (TERM=linux, HOME=/, any
    // undotted cmdline `key=value`) is dropped: images see only their own
    // variables (docs/images.md).
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    std::env::set_var(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    std::env::set_var("HOME", "/root");
}
