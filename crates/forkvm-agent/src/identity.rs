//! The `identity` request: give a freshly restored clone its own identity.
//!
//! A snapshot of a running VM is restored into many clones, and each of them
//! starts with the snapshot's memory: the same kernel RNG state, a wall clock
//! stopped at snapshot time, the same hostname and the same ids. QEMU's
//! `microvm` machine has no VMGenID device, so the guest kernel never learns
//! that it was cloned and cannot reseed itself. The host daemon therefore sends
//! `Identity` as the very first request after a clone resumes, and waits for
//! the ack before it lets any user code run. The agent then, in this order:
//!
//! 1. mixes the payload (fresh host entropy, at least [`MIN_ENTROPY`] bytes)
//!    into the input pool with `RNDADDENTROPY` and forces a CRNG reseed with
//!    `RNDRESEEDCRNG`, so no two clones produce the same random bytes;
//! 2. sets `CLOCK_REALTIME` to the host's time;
//! 3. sets the hostname (only the kernel's: `/etc/hostname` is left alone,
//!    as writing it would cost disk I/O on the clone path);
//! 4. overwrites `/etc/machine-id` with the new machine id if the image has a
//!    non-empty one (an empty or missing file is left for systemd), and
//!    `/var/lib/dbus/machine-id` if it is a regular non-empty file rather
//!    than the usual symlink to `/etc/machine-id`;
//! 5. overwrites `/run/forkvm/instance-id` with the new instance id. (A booted
//!    VM's instance id is its kernel's `boot_id`, written when the agent
//!    starts.)
//! 6. overwrites `/run/forkvm/boot_id` with a fresh random UUID, read from
//!    the RNG just reseeded.
//!
//! Step 6 and why the boot id is a file of ours: [`crate::boot_id`].
//!
//! Every field is validated before anything is changed, so a malformed
//! request changes nothing. A failing step (for example `EPERM` when the
//! agent is not root) stops there and is reported as an `io` error: the host
//! must never believe a clone was reseeded when it was not.
//!
//! **Why the files are found and opened when the agent starts.** A clone runs
//! in a fresh QEMU process. Under TCG every kernel code path the guest takes
//! is translated again in each new process, so on the resume path each
//! distinct syscall costs milliseconds: measured in clones of the default
//! image, a `stat` of `/etc/machine-id` 13–19 ms, a lookup of the dbus copy
//! 35–50 ms, and creating plus renaming the instance id on tmpfs 20–35 ms,
//! against 2–3 ms for the clock and the hostname together. [`Targets::open`]
//! therefore runs in the booted VM, before any snapshot: it decides which
//! machine-id files exist, opens them and `/dev/urandom`, and creates the
//! instance id file. A clone then only issues the two RNG ioctls,
//! `clock_settime`, `sethostname`, and one `pwrite` per file. The files are
//! overwritten in place (no fsync: they matter only while this VM runs, and a
//! snapshot captures the page cache together with the disk). The price is
//! that a machine-id file created after the agent started is not seen.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use forkvm_agent_protocol::{ERR_INVALID, ERR_IO};

use crate::boot_id::{uuid_v4, KERNEL_BOOT_ID};
use crate::serve::ReqError;
use crate::sys;

/// Fewest bytes of host entropy accepted (256 bits).
pub const MIN_ENTROPY: usize = 32;
/// HOST_NAME_MAX on Linux.
const MAX_HOSTNAME: usize = 64;
const MAX_INSTANCE_ID: usize = 64;
/// Mode of the files written here: nobody is meant to edit them.
const ID_FILE_MODE: u32 = 0o444;

/// Where the identity lives. [`Default`] gives the real paths; tests point
/// them into a temporary directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityPaths {
    /// A random device to issue the RNG ioctls on.
    pub random: PathBuf,
    pub machine_id: PathBuf,
    pub dbus_machine_id: PathBuf,
    /// Holds `instance-id` and `boot_id`; created (mode 0755) if missing.
    pub run_dir: PathBuf,
    /// The kernel's boot id file, which `run_dir/boot_id` is bind-mounted
    /// over. `None` (the default, and in tests) mounts nothing: only the
    /// agent running as pid 1 of a guest sets it.
    pub boot_id_over: Option<PathBuf>,
}

impl Default for IdentityPaths {
    fn default() -> Self {
        IdentityPaths {
            random: "/dev/urandom".into(),
            machine_id: "/etc/machine-id".into(),
            dbus_machine_id: "/var/lib/dbus/machine-id".into(),
            run_dir: "/run/forkvm".into(),
            boot_id_over: None,
        }
    }
}

impl IdentityPaths {
    /// The real paths of a guest, with the boot id mounted over the kernel's.
    pub fn guest() -> Self {
        IdentityPaths {
            boot_id_over: Some(KERNEL_BOOT_ID.into()),
            ..Default::default()
        }
    }

    pub fn instance_id(&self) -> PathBuf {
        self.run_dir.join("instance-id")
    }

    pub fn boot_id(&self) -> PathBuf {
        self.run_dir.join("boot_id")
    }
}

/// A decoded `identity` request.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub hostname: &'a str,
    pub unix_time_ns: u64,
    pub machine_id: &'a str,
    pub instance_id: &'a str,
    /// The frame payload.
    pub entropy: &'a [u8],
}

fn invalid(message: impl Into<String>) -> ReqError {
    ReqError {
        code: ERR_INVALID,
        message: message.into(),
    }
}

fn io_error(message: impl Into<String>) -> ReqError {
    ReqError {
        code: ERR_IO,
        message: message.into(),
    }
}

/// Check every field without changing anything.
pub fn validate(req: &Identity<'_>) -> Result<(), ReqError> {
    if req.entropy.len() < MIN_ENTROPY {
        return Err(invalid(format!(
            "identity needs at least {MIN_ENTROPY} bytes of entropy in the payload, got {}",
            req.entropy.len()
        )));
    }
    let h = req.hostname;
    if h.is_empty()
        || h.len() > MAX_HOSTNAME
        || !h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(invalid(format!(
            "hostname {h:?} must be 1 to {MAX_HOSTNAME} characters of A-Z, a-z, 0-9, '-' and '.'"
        )));
    }
    let m = req.machine_id;
    if m.len() != 32 || !m.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(invalid(format!(
            "machine id {m:?} must be 32 lowercase hexadecimal digits"
        )));
    }
    if m.bytes().all(|b| b == b'0') {
        // systemd treats the all-zero id as "no id".
        return Err(invalid("machine id must not be all zeros"));
    }
    let i = req.instance_id;
    if i.is_empty()
        || i.len() > MAX_INSTANCE_ID
        || !i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(invalid(format!(
            "instance id {i:?} must be 1 to {MAX_INSTANCE_ID} characters of A-Z, a-z, 0-9 and '-'"
        )));
    }
    Ok(())
}

/// A file the identity request overwrites in place.
#[derive(Debug)]
struct Slot {
    path: PathBuf,
    file: File,
    /// Its length after our last write (or when opened).
    len: u64,
}

impl Slot {
    /// Write `data` over the whole file: `pwrite` at 0, and `ftruncate`
    /// only when the length changes (ids have a fixed length, so a clone
    /// normally pays one syscall per file).
    fn overwrite(&mut self, data: &[u8]) -> Result<(), ReqError> {
        let p = self.path.display();
        self.file
            .write_all_at(data, 0)
            .map_err(|e| io_error(format!("cannot write {p}: {e}")))?;
        let n = data.len() as u64;
        if n != self.len {
            self.file
                .set_len(n)
                .map_err(|e| io_error(format!("cannot truncate {p}: {e}")))?;
            self.len = n;
        }
        Ok(())
    }
}

/// What the identity request writes to, found and opened once when the
/// agent starts (see the module docs for why). A target that cannot be
/// opened keeps its error, which every identity request then reports: a
/// clone is never acknowledged as reseeded when it was not.
#[derive(Debug)]
pub struct Targets {
    random: Result<(PathBuf, File), ReqError>,
    machine_ids: Result<Vec<Slot>, ReqError>,
    instance_id: Result<Slot, ReqError>,
    boot_id: Result<Slot, ReqError>,
}

impl Targets {
    /// Open everything under `paths`, and give a booted VM its instance id
    /// (the kernel's `boot_id`).
    pub fn open(paths: &IdentityPaths) -> Targets {
        let random = OpenOptions::new()
            .write(true)
            .open(&paths.random)
            .map(|f| (paths.random.clone(), f))
            .map_err(|e| io_error(format!("cannot open {}: {e}", paths.random.display())));
        let machine_ids = [(&paths.machine_id, true), (&paths.dbus_machine_id, false)]
            .into_iter()
            .filter_map(|(p, follow)| open_machine_id(p, follow).transpose())
            .collect();
        let instance_id = open_instance_id(paths);
        let boot_id = open_boot_id(paths);
        Targets {
            random,
            machine_ids,
            instance_id,
            boot_id,
        }
    }

    /// Validate, then apply the whole identity (see the module docs).
    pub fn apply(&mut self, req: &Identity<'_>) -> Result<(), ReqError> {
        validate(req)?;
        let (path, dev) = self.random.as_ref().map_err(Clone::clone)?;
        reseed_rng(path, dev, req.entropy)?;
        sys::set_realtime_ns(req.unix_time_ns)
            .map_err(|e| io_error(format!("cannot set the clock (clock_settime): {e}")))?;
        sys::set_hostname(req.hostname).map_err(|e| {
            io_error(format!(
                "cannot set the hostname to {:?} (sethostname): {e}",
                req.hostname
            ))
        })?;
        self.apply_files(req)
    }

    /// Steps 4 to 6: the machine id, instance id and boot id files.
    pub fn apply_files(&mut self, req: &Identity<'_>) -> Result<(), ReqError> {
        let content = format!("{}\n", req.machine_id);
        for slot in self.machine_ids.as_mut().map_err(|e| e.clone())? {
            slot.overwrite(content.as_bytes())?;
        }
        let slot = self.instance_id.as_mut().map_err(|e| e.clone())?;
        slot.overwrite(format!("{}\n", req.instance_id).as_bytes())?;
        let mut raw = [0u8; 16];
        sys::random_bytes(&mut raw)
            .map_err(|e| io_error(format!("cannot draw a boot id (getrandom): {e}")))?;
        let slot = self.boot_id.as_mut().map_err(|e| e.clone())?;
        slot.overwrite(format!("{}\n", uuid_v4(raw)).as_bytes())
    }
}

/// Step 1: mix `entropy` into the kernel RNG and reseed the CRNG from it.
/// `dev` is `path` opened for writing.
pub fn reseed_rng(path: &Path, dev: &File, entropy: &[u8]) -> Result<(), ReqError> {
    let d = path.display();
    sys::add_entropy(dev, entropy)
        .map_err(|e| io_error(format!("cannot add entropy (RNDADDENTROPY on {d}): {e}")))?;
    sys::reseed_crng(dev).map_err(|e| {
        io_error(format!(
            "cannot reseed the CRNG (RNDRESEEDCRNG on {d}): {e}"
        ))
    })?;
    Ok(())
}

/// Open the machine id file at `path` for writing if it is a non-empty
/// regular file; `None` if it is empty, missing or something else. With
/// `follow`, a symlink is opened at its target; without, a symlink is left
/// alone (`/var/lib/dbus/machine-id` normally points at `/etc/machine-id`,
/// which is handled on its own).
fn open_machine_id(path: &Path, follow: bool) -> Result<Option<Slot>, ReqError> {
    let p = path.display();
    let stat_err = |e: io::Error| io_error(format!("cannot stat {p}: {e}"));
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(stat_err(e)),
    };
    let (target, meta) = if meta.file_type().is_symlink() {
        if !follow {
            return Ok(None);
        }
        match fs::canonicalize(path) {
            Ok(t) => {
                let m = fs::metadata(&t).map_err(stat_err)?;
                (t, m)
            }
            // A dangling symlink: there is no id to replace.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(stat_err(e)),
        }
    } else {
        (path.to_path_buf(), meta)
    };
    if !meta.is_file() || meta.len() == 0 {
        return Ok(None);
    }
    let file = OpenOptions::new()
        .write(true)
        .open(&target)
        .map_err(|e| io_error(format!("cannot open {} for writing: {e}", target.display())))?;
    Ok(Some(Slot {
        path: target,
        file,
        len: meta.len(),
    }))
}

/// Create `<run_dir>/boot_id` holding the kernel's `boot_id`, keep it open,
/// and bind-mount it read-only over [`IdentityPaths::boot_id_over`] when
/// that is set. A mount that fails is reported on the console and leaves
/// the kernel's file in view (every clone then shows its source's boot id,
/// as before); the file is still written, so identities are never refused
/// for it.
fn open_boot_id(paths: &IdentityPaths) -> Result<Slot, ReqError> {
    let slot = create_id_file(paths, &paths.boot_id(), KERNEL_BOOT_ID)?;
    if let Some(over) = &paths.boot_id_over {
        crate::boot_id::mount_over(&paths.boot_id(), over);
    }
    Ok(slot)
}

/// Create `<run_dir>/instance-id` (and `run_dir`, mode 0755, if needed)
/// holding the kernel's `boot_id`, and keep it open.
fn open_instance_id(paths: &IdentityPaths) -> Result<Slot, ReqError> {
    create_id_file(paths, &paths.instance_id(), KERNEL_BOOT_ID)
}

/// Create the id file `path` in `run_dir` (made, mode 0755, if needed),
/// read-only, holding what `initial` holds; keep it open for overwriting.
fn create_id_file(paths: &IdentityPaths, path: &Path, initial: &str) -> Result<Slot, ReqError> {
    let run_dir = &paths.run_dir;
    let d = run_dir.display();
    match DirBuilder::new().mode(0o755).create(run_dir) {
        // Exactly 0755 whatever the umask.
        Ok(()) => fs::set_permissions(run_dir, Permissions::from_mode(0o755))
            .map_err(|e| io_error(format!("cannot chmod {d}: {e}")))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && run_dir.is_dir() => {}
        Err(e) => return Err(io_error(format!("cannot create {d}: {e}"))),
    }
    let p = path.display();
    // A leftover file may be read-only: start afresh.
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(format!("cannot remove {p}: {e}"))),
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(ID_FILE_MODE)
        .open(path)
        .map_err(|e| io_error(format!("cannot create {p}: {e}")))?;
    // Exactly ID_FILE_MODE whatever the umask.
    file.set_permissions(Permissions::from_mode(ID_FILE_MODE))
        .map_err(|e| io_error(format!("cannot chmod {p}: {e}")))?;
    let mut slot = Slot {
        path: path.to_path_buf(),
        file,
        len: 0,
    };
    let boot_id = fs::read_to_string(initial).unwrap_or_default();
    slot.overwrite(format!("{}\n", boot_id.trim()).as_bytes())?;
    Ok(slot)
}

/// Whether the RNG and clock syscalls can work here (they need root).
#[cfg(test)]
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The current wall clock, for tests that set the clock without moving it.
#[cfg(test)]
pub(crate) fn now_ns() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(d.as_nanos()).unwrap()
}

/// The current hostname, for tests that set it without changing it.
#[cfg(test)]
pub(crate) fn current_hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;
    use std::os::unix::fs::{symlink, MetadataExt};

    const MID: &str = "0123456789abcdef0123456789abcdef";
    const ENTROPY: [u8; 32] = [7; 32];

    fn req<'a>() -> Identity<'a> {
        Identity {
            hostname: "sb-1.example",
            unix_time_ns: 1_700_000_000_000_000_000,
            machine_id: MID,
            instance_id: "i-0abc-DEF",
            entropy: &ENTROPY,
        }
    }

    fn paths_in(dir: &Path) -> IdentityPaths {
        IdentityPaths {
            random: "/dev/urandom".into(),
            machine_id: dir.join("etc/machine-id"),
            dbus_machine_id: dir.join("var/lib/dbus/machine-id"),
            // Like /run, the parent exists.
            run_dir: dir.join("run-forkvm"),
            boot_id_over: None,
        }
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn validation() {
        assert_eq!(validate(&req()), Ok(()));
        let code = |r: Identity<'_>| validate(&r).unwrap_err().code;
        let short = [1u8; MIN_ENTROPY - 1];
        assert_eq!(
            code(Identity {
                entropy: &short,
                ..req()
            }),
            ERR_INVALID
        );
        assert_eq!(
            code(Identity {
                entropy: &[],
                ..req()
            }),
            ERR_INVALID
        );
        let long_host = "a".repeat(65);
        for h in ["", "bad host", "bad_host", "évian", "a/b", &long_host] {
            assert_eq!(
                code(Identity {
                    hostname: h,
                    ..req()
                }),
                ERR_INVALID,
                "{h:?}"
            );
        }
        assert_eq!(
            validate(&Identity {
                hostname: &"a".repeat(64),
                ..req()
            }),
            Ok(())
        );
        let upper = MID.to_uppercase();
        let zeros = "0".repeat(32);
        for m in [
            "",
            "0123",
            &upper,
            &zeros,
            &format!("{MID}0"),
            &MID.replace('0', "g"),
        ] {
            assert_eq!(
                code(Identity {
                    machine_id: m,
                    ..req()
                }),
                ERR_INVALID,
                "{m:?}"
            );
        }
        let long_id = "x".repeat(65);
        for i in ["", "a.b", "a b", "a\n", &long_id] {
            assert_eq!(
                code(Identity {
                    instance_id: i,
                    ..req()
                }),
                ERR_INVALID,
                "{i:?}"
            );
        }
    }

    /// Open the targets under `p` and apply the files part of `req()`.
    fn apply_files_in(p: &IdentityPaths) -> Result<(), ReqError> {
        Targets::open(p).apply_files(&req())
    }

    #[test]
    fn machine_id_replaced_only_when_non_empty() {
        let d = temp_dir("identity-mid");
        let p = paths_in(&d);
        // Missing everywhere: nothing is created, the instance id is.
        apply_files_in(&p).unwrap();
        assert!(!p.machine_id.exists());
        assert!(!p.dbus_machine_id.exists());
        assert_eq!(fs::read_to_string(p.instance_id()).unwrap(), "i-0abc-DEF\n");
        assert_eq!(mode(&p.run_dir), 0o755);
        assert_eq!(mode(&p.instance_id()), 0o444);

        // Empty: left for systemd to fill in at boot.
        fs::create_dir_all(p.machine_id.parent().unwrap()).unwrap();
        fs::write(&p.machine_id, "").unwrap();
        apply_files_in(&p).unwrap();
        assert_eq!(fs::read(&p.machine_id).unwrap(), b"");

        // Non-empty: overwritten in place (same inode, same mode), shorter
        // and longer old contents alike, with no temp files left behind.
        for old in [
            "ffff\n",
            "ffffffffffffffffffffffffffffffff\n",
            &"e".repeat(100),
        ] {
            fs::write(&p.machine_id, old).unwrap();
            fs::set_permissions(&p.machine_id, Permissions::from_mode(0o640)).unwrap();
            let ino = fs::metadata(&p.machine_id).unwrap().ino();
            apply_files_in(&p).unwrap();
            assert_eq!(
                fs::read_to_string(&p.machine_id).unwrap(),
                format!("{MID}\n")
            );
            assert_eq!(fs::metadata(&p.machine_id).unwrap().ino(), ino);
            assert_eq!(mode(&p.machine_id), 0o640);
            assert_eq!(fs::read_dir(d.join("etc")).unwrap().count(), 1);
        }

        // The dbus copy: a symlink is left alone, a regular file replaced.
        let dbus_dir = p.dbus_machine_id.parent().unwrap();
        fs::create_dir_all(dbus_dir).unwrap();
        symlink(&p.machine_id, &p.dbus_machine_id).unwrap();
        apply_files_in(&p).unwrap();
        assert!(fs::symlink_metadata(&p.dbus_machine_id)
            .unwrap()
            .file_type()
            .is_symlink());
        fs::remove_file(&p.dbus_machine_id).unwrap();
        fs::write(&p.dbus_machine_id, "ffffffffffffffffffffffffffffffff\n").unwrap();
        apply_files_in(&p).unwrap();
        assert_eq!(
            fs::read_to_string(&p.dbus_machine_id).unwrap(),
            format!("{MID}\n")
        );
        // Empty dbus copy: left alone.
        fs::write(&p.dbus_machine_id, "").unwrap();
        apply_files_in(&p).unwrap();
        assert_eq!(fs::read(&p.dbus_machine_id).unwrap(), b"");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn targets_are_found_when_opened_and_written_each_time() {
        let d = temp_dir("identity-targets");
        let p = paths_in(&d);
        fs::create_dir_all(d.join("etc")).unwrap();
        fs::write(&p.machine_id, "ffffffffffffffffffffffffffffffff\n").unwrap();
        let mut t = Targets::open(&p);
        // A booted VM's instance id: the kernel's boot_id.
        let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(fs::read_to_string(p.instance_id()).unwrap(), boot_id);
        // So is its boot id file (mounted over the kernel's in a guest).
        assert_eq!(fs::read_to_string(p.boot_id()).unwrap(), boot_id);
        let mut boot_ids = vec![boot_id];
        // Two identities in a row (a clone of a clone): each one lands.
        for (mid, iid) in [
            (MID, "first-id"),
            ("fedcba9876543210fedcba9876543210", "the-second-instance"),
        ] {
            let r = Identity {
                machine_id: mid,
                instance_id: iid,
                ..req()
            };
            t.apply_files(&r).unwrap();
            assert_eq!(
                fs::read_to_string(&p.machine_id).unwrap(),
                format!("{mid}\n")
            );
            assert_eq!(
                fs::read_to_string(p.instance_id()).unwrap(),
                format!("{iid}\n")
            );
            // A fresh boot id each time, spelled as the kernel's.
            let b = fs::read_to_string(p.boot_id()).unwrap();
            assert_eq!(b.len(), 37, "{b:?}");
            assert_eq!(&b[14..15], "4", "version 4: {b:?}");
            assert!(!boot_ids.contains(&b), "{b:?} repeats");
            boot_ids.push(b);
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlinked_etc_machine_id_is_replaced_at_its_target() {
        let d = temp_dir("identity-link");
        let p = paths_in(&d);
        fs::create_dir_all(d.join("etc")).unwrap();
        fs::create_dir_all(d.join("real")).unwrap();
        let target = d.join("real/machine-id");
        fs::write(&target, "ffffffffffffffffffffffffffffffff\n").unwrap();
        symlink(&target, &p.machine_id).unwrap();
        apply_files_in(&p).unwrap();
        assert!(fs::symlink_metadata(&p.machine_id)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&target).unwrap(), format!("{MID}\n"));
        // Dangling: nothing to replace.
        fs::remove_file(&target).unwrap();
        apply_files_in(&p).unwrap();
        assert!(!target.exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn instance_id_replaced_in_existing_dir_and_errors_are_io() {
        let d = temp_dir("identity-iid");
        let p = paths_in(&d);
        fs::create_dir_all(&p.run_dir).unwrap();
        fs::write(p.instance_id(), "old\n").unwrap();
        fs::set_permissions(p.instance_id(), Permissions::from_mode(0o444)).unwrap();
        apply_files_in(&p).unwrap();
        assert_eq!(fs::read_to_string(p.instance_id()).unwrap(), "i-0abc-DEF\n");
        // instance-id and boot_id.
        assert_eq!(fs::read_dir(&p.run_dir).unwrap().count(), 2);

        // run_dir is a file: an io error at every identity, not a silent
        // success.
        let bad = IdentityPaths {
            run_dir: d.join("etc-file"),
            ..p.clone()
        };
        fs::write(&bad.run_dir, "x").unwrap();
        let mut t = Targets::open(&bad);
        for _ in 0..2 {
            let e = t.apply_files(&req()).unwrap_err();
            assert_eq!(e.code, ERR_IO, "{}", e.message);
        }
        // So is a random device that cannot be opened, before anything
        // else changes.
        let e = Targets::open(&IdentityPaths {
            random: d.join("missing"),
            ..p.clone()
        })
        .apply(&req())
        .unwrap_err();
        assert_eq!(e.code, ERR_IO, "{}", e.message);
        assert!(e.message.contains("missing"), "{}", e.message);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn rng_ioctl_failure_is_an_io_error() {
        // A regular file is not a random device: the ioctl fails (ENOTTY),
        // and that must be reported, never ignored.
        let d = temp_dir("identity-rng");
        let f = d.join("not-a-device");
        fs::write(&f, "").unwrap();
        let dev = OpenOptions::new().write(true).open(&f).unwrap();
        let e = reseed_rng(&f, &dev, &ENTROPY).unwrap_err();
        assert_eq!(e.code, ERR_IO);
        assert!(e.message.contains("RNDADDENTROPY"), "{}", e.message);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_encoding() {
        // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
        let ioc = |dir: libc::Ioctl, nr: libc::Ioctl, size: libc::Ioctl| {
            (dir << 30) | (size << 16) | (libc::Ioctl::from(b'R') << 8) | nr
        };
        let write = 1;
        let two_ints = (2 * std::mem::size_of::<libc::c_int>()) as libc::Ioctl;
        assert_eq!(sys::RNDADDENTROPY, ioc(write, 0x03, two_ints));
        assert_eq!(sys::RNDRESEEDCRNG, ioc(0, 0x07, 0));
    }

    /// The real syscalls, on the real /dev/urandom. Needs root; the clock is
    /// set to what it already is and the hostname to what it already is.
    #[test]
    fn rng_clock_and_hostname_as_root() {
        if !is_root() {
            eprintln!("skipped: not root");
            return;
        }
        // Odd length: the last word of the ioctl buffer is partly used.
        let entropy: Vec<u8> = (0..77u8).collect();
        for dev in ["/dev/urandom", "/dev/random"] {
            let f = OpenOptions::new().write(true).open(dev).unwrap();
            reseed_rng(Path::new(dev), &f, &entropy).unwrap();
        }

        let d = temp_dir("identity-root");
        let p = paths_in(&d);
        let host = current_hostname();
        let r = Identity {
            hostname: &host,
            unix_time_ns: now_ns(),
            ..req()
        };
        Targets::open(&p).apply(&r).unwrap();
        assert_eq!(current_hostname(), host);
        let drift = now_ns().abs_diff(r.unix_time_ns);
        assert!(drift < 5_000_000_000, "clock moved by {drift} ns");
        assert!(p.instance_id().exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn invalid_request_changes_nothing() {
        let d = temp_dir("identity-invalid");
        let p = paths_in(&d);
        let mut t = Targets::open(&p);
        let before = fs::read_to_string(p.instance_id()).unwrap();
        let e = t
            .apply(&Identity {
                instance_id: "no spaces",
                ..req()
            })
            .unwrap_err();
        assert_eq!(e.code, ERR_INVALID);
        assert_eq!(fs::read_to_string(p.instance_id()).unwrap(), before);
        fs::remove_dir_all(&d).unwrap();
    }
}
