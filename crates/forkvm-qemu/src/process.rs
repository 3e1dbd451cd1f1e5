//! Launching and tracking QEMU processes.
//!
//! QEMU is started in its own process group so that a signal aimed at the
//! daemon's terminal (Ctrl-C) does not reach the VMs, and without
//! `kill_on_drop`, so that sandboxes outlive a daemon restart. While the
//! daemon that launched it runs, it holds the `Child` and learns the exit
//! status; a restarted daemon re-finds the process by pid and verifies it is
//! still the same QEMU by its command line before trusting it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::jail::{Jail, JailError};
use crate::qmp::{Qmp, QmpError};
use crate::spec::MachineSpec;

/// Errors while launching QEMU.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {bin}: {source}; install QEMU >= 10 (run scripts/setup.sh) or set FORKVM_QEMU")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU exited during start-up ({status}): {stderr}")]
    EarlyExit { status: String, stderr: String },
    #[error(transparent)]
    Jail(#[from] JailError),
    #[error("QEMU started but its QMP socket did not answer")]
    Qmp(#[source] QmpError),
}

/// A freshly launched QEMU with its QMP session.
pub struct Launched {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub qmp: Arc<Qmp>,
}

/// Start a TCG QEMU with transparent huge pages turned off for it
/// (`PR_SET_THP_DISABLE`, kept across exec; the host's THP setting for
/// everything else is untouched).
///
/// QEMU asks for huge pages (`MADV_HUGEPAGE`) on its TCG translation
/// buffer and its translated-block hash table, so with the host's THP mode
/// `madvise` (Debian's default) every 2 MiB of either that is touched at
/// all is backed whole: the hash table's 2 MiB are resident in every QEMU
/// although an idle clone fills a fraction of it, and the buffer's
/// resident size is rounded up to the next 2 MiB. Without THP an idle
/// 512 MiB clone had ~3 MiB less private memory (29.0 -> 26.0 MiB;
/// docs/benchmarks.md, "Clone density"). Guest RAM is not affected: a clone's RAM is a private file
/// mapping and a boot's a shared one, neither of which gets anonymous
/// huge pages. KVM machines keep THP.
pub const NO_THP_UNDER_TCG: bool = true;

/// Whether a QEMU for `accel` starts with THP turned off.
pub fn disables_thp(accel: crate::spec::Accel) -> bool {
    NO_THP_UNDER_TCG && accel == crate::spec::Accel::Tcg
}

/// The QEMU binary to use: `$FORKVM_QEMU` or `qemu-system-x86_64` on PATH.
pub fn qemu_binary() -> PathBuf {
    std::env::var_os("FORKVM_QEMU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"))
}

/// Start QEMU for `spec`, with its stderr in `stderr_log`, and connect QMP.
/// With a `jail`, QEMU runs confined (see [`crate::jail`]) and with its
/// seccomp filter on.
pub async fn launch(
    bin: &Path,
    spec: &MachineSpec,
    stderr_log: &Path,
    timeout: Duration,
    jail: Option<Jail>,
) -> Result<Launched, LaunchError> {
    let spawn_err = |source| LaunchError::Spawn {
        bin: bin.display().to_string(),
        source,
    };
    let log = std::fs::File::create(stderr_log).map_err(spawn_err)?;
    let (jail, tap_fd) = match jail {
        Some(j) => {
            let tap = spec.nic.as_ref().map(|n| n.tap.as_str());
            let (p, fd) = j.prepare(tap).map_err(LaunchError::Jail)?;
            (Some(Arc::new(p)), fd)
        }
        None => (None, None),
    };
    // Inside the jail PATH is not searched: name the binary the host would run.
    let program = if jail.is_some() {
        resolve(bin).ok_or_else(|| {
            spawn_err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not found on PATH",
            ))
        })?
    } else {
        bin.to_path_buf()
    };
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(spec.args(jail.is_some(), tap_fd))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(spawn_err)?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false);
    // Held open until the child has started.
    let ns_file = match &spec.netns {
        Some(p) => Some(std::fs::File::open(p).map_err(spawn_err)?),
        None => None,
    };
    let ns_fd = {
        use std::os::fd::AsRawFd;
        ns_file.as_ref().map(|f| f.as_raw_fd())
    };
    // Under TCG, no transparent huge pages for QEMU (see NO_THP_UNDER_TCG).
    let no_thp = disables_thp(spec.accel);
    {
        let jail = jail.clone();
        // SAFETY: the closure runs in the forked child before exec and makes
        // only syscalls on data prepared above (prctl(2), setns(2),
        // close_range(2) and the jail's steps, see `jail::Prepared`); the fds
        // and the prepared jail stay alive until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if no_thp && libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(j) = &jail {
                    j.join_cgroups()?;
                }
                if let Some(fd) = ns_fd {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                match &jail {
                    // (Its last step closes what QEMU must not inherit.)
                    Some(j) => {
                        j.open_tap()?;
                        j.enter()?;
                    }
                    None => crate::fds::cloexec_all_except(&[])?,
                }
                Ok(())
            });
        }
    }
    let spawned = if jail.is_some() {
        spawn_in_new_pid_ns(&mut cmd)
    } else {
        cmd.spawn()
    };
    drop(ns_file);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            // A jail step names itself in the log (only its errno reaches us).
            let log = std::fs::read_to_string(stderr_log).unwrap_or_default();
            return Err(LaunchError::Spawn {
                bin: format!("{} ({})", bin.display(), log.trim()),
                source: e,
            });
        }
    };
    // The parent's copies (uid lock, reserved tap number, cgroup files)
    // close now; QEMU holds its own.
    drop(cmd);
    drop(jail);
    let pid = child.id().unwrap_or(0);
    let qmp = tokio::select! {
        r = Qmp::connect(&spec.qmp_socket, timeout) => r,
        status = child.wait() => {
            let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            let stderr = std::fs::read_to_string(stderr_log).unwrap_or_default();
            return Err(LaunchError::EarlyExit { status, stderr: stderr.trim().to_string() });
        }
    };
    match qmp {
        Ok(qmp) => Ok(Launched { child, pid, qmp }),
        Err(e) => {
            kill(pid, libc::SIGKILL);
            let _ = child.wait().await;
            Err(LaunchError::Qmp(e))
        }
    }
}

/// Fork `cmd` as pid 1 of a new pid namespace, so that a jailed QEMU sees
/// no other process (and cannot signal or ptrace one by pid).
///
/// `unshare(CLONE_NEWPID)` puts only the caller's later children in the
/// new namespace, and once per thread, so the fork runs on a fresh thread
/// that unshares first (a thread may: only CLONE_NEWUSER and CLONE_NEWNS
/// need a single-threaded caller). The daemon keeps its view: the pid it
/// gets is the host's, and it can read QEMU's /proc files, wait for it and
/// kill it. As a namespace's init, QEMU gets from the daemon only the
/// signals it has handlers for, plus SIGKILL and SIGSTOP: the daemon sends
/// only SIGKILL, and QEMU handles SIGTERM, SIGINT and SIGHUP (it quits).
fn spawn_in_new_pid_ns(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    // tokio registers the child with the runtime's SIGCHLD handling.
    let rt = tokio::runtime::Handle::current();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _rt = rt.enter();
            // SAFETY: unshare(2) on a flag; it changes only this thread's
            // namespace for children, and the thread ends after the fork.
            if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            cmd.spawn()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the spawning thread panicked")))
    })
}

/// `bin` as an absolute path: itself when it has a slash, else the first
/// executable of that name on PATH.
pub fn resolve(bin: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if bin.components().count() > 1 || bin.is_absolute() {
        return std::fs::canonicalize(bin).ok();
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(bin))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// Send a signal to a pid. Returns false when the process does not exist.
pub fn kill(pid: u32, sig: i32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill(2) takes plain integers and has no memory-safety effects.
    unsafe { libc::kill(pid as i32, sig) == 0 }
}

/// What can be known about a QEMU the daemon recorded by pid.
#[derive(Debug)]
pub enum Liveness {
    /// Running, and its command line names the VM.
    Ours,
    /// Certainly not running: no such process, a zombie, or a pid reused by
    /// another program.
    Gone,
    /// The check itself failed (e.g. `EMFILE` opening `/proc`): the process
    /// may well be running. Never treat this as an exit.
    Unknown(std::io::Error),
}

/// Whether `pid` is a live process whose command line names the VM
/// `forkvm-<name>` (a pid recorded before a daemon restart may have been
/// reused by an unrelated process). Only a missing process, a zombie or a
/// foreign command line count as gone; a failure to look (out of file
/// descriptors, say) is `Unknown`, because a daemon that took it for an
/// exit would forget a VM that still runs.
pub fn liveness(pid: u32, name: &str) -> Liveness {
    if pid == 0 {
        return Liveness::Gone;
    }
    // SAFETY: kill(2) with signal 0 only checks existence; no fd is needed.
    if unsafe { libc::kill(pid as i32, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return Liveness::Gone;
    }
    let gone =
        |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH));
    let cmdline = match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(c) => c,
        Err(e) if gone(&e) => return Liveness::Gone,
        Err(e) => return Liveness::Unknown(e),
    };
    let needle = format!("forkvm-{name},");
    if !cmdline
        .split(|b| *b == 0)
        .any(|arg| arg.starts_with(needle.as_bytes()))
    {
        // An exiting process shows an empty command line; a reused pid a
        // foreign one. Neither is our VM.
        return Liveness::Gone;
    }
    // A zombie still has its cmdline until reaped; it is not running.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) if is_zombie(&stat) => Liveness::Gone,
        Ok(_) => Liveness::Ours,
        Err(e) if gone(&e) => Liveness::Gone,
        Err(e) => Liveness::Unknown(e),
    }
}

fn is_zombie(stat: &str) -> bool {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        .unwrap_or(true)
}

/// True only when `pid` is known to be the VM `forkvm-<name>`: what a caller
/// needs before it signals the pid. (An `Unknown` answer is not enough to
/// kill on, nor to forget on: see [`liveness`].)
pub fn is_our_qemu(pid: u32, name: &str) -> bool {
    matches!(liveness(pid, name), Liveness::Ours)
}

/// The `-append` (kernel command line) argument of a running QEMU.
pub fn append_arg(pid: u32) -> Option<String> {
    arg_of(pid, b"-append")
}

/// The machine options (`-M`, without the memory backend that
/// `MachineSpec::to_args` adds) of a running QEMU: what a snapshot of it
/// must be restored into.
pub fn machine_arg(pid: u32) -> Option<String> {
    let m = arg_of(pid, b"-M")?;
    Some(strip_memory_backend(&m))
}

/// Does the QEMU with this pid have the volume port (a machine booted since
/// volumes exist, or restored from one)? `None` when its command line
/// cannot be read.
pub fn has_volume_port(pid: u32) -> Option<bool> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let needle = format!("name={}", crate::spec::VOLUME_PORT_NAME);
    Some(
        cmdline
            .split(|b| *b == 0)
            .any(|a| String::from_utf8_lossy(a).contains(&needle)),
    )
}

fn strip_memory_backend(m: &str) -> String {
    m.split(',')
        .filter(|o| !o.starts_with("memory-backend="))
        .collect::<Vec<_>>()
        .join(",")
}

fn arg_of(pid: u32, flag: &[u8]) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    while let Some(a) = args.next() {
        if a == flag {
            return args.next().map(|v| String::from_utf8_lossy(v).into_owned());
        }
    }
    None
}

/// Wait until a process that is not our child exits. Only the parent can
/// wait(2) for it, so this holds a pidfd, which becomes readable when the
/// process exits, and checks [`liveness`] once the pidfd is open (so a pid
/// reused before the pidfd was taken is not waited on). If no pidfd can be
/// had (an old kernel, or no descriptor free), it polls [`liveness`] and
/// tries again for a pidfd later. It returns only when the process is
/// certainly gone: a failed check never ends the wait.
pub async fn wait_foreign_exit(pid: u32, name: &str) {
    let mut logged = false;
    loop {
        match pidfd_open(pid) {
            Ok(fd) => match liveness(pid, name) {
                Liveness::Gone => return,
                Liveness::Ours => {
                    // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so it
                    // stays open and the same for the AsyncFd's lifetime.
                    if let Ok(afd) = unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            fd,
                            tokio::io::Interest::READABLE,
                        )
                    } {
                        let _ = afd.readable().await;
                        return;
                    }
                }
                Liveness::Unknown(_) => {}
            },
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return,
            Err(e) => {
                if !logged {
                    tracing::warn!(
                        "cannot watch QEMU (pid {pid}) of {name} through a pidfd ({e}); polling it"
                    );
                    logged = true;
                }
            }
        }
        // Polled while no pidfd can be had.
        for _ in 0..25 {
            if matches!(liveness(pid, name), Liveness::Gone) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `pidfd_open(2)`: a descriptor that becomes readable when `pid` exits.
fn pidfd_open(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: the syscall takes two integers and returns a new descriptor
    // that we own, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else holds.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tcg_turns_thp_off() {
        use crate::spec::Accel;
        assert!(disables_thp(Accel::Tcg));
        assert!(!disables_thp(Accel::Kvm));
    }

    #[test]
    fn liveness_tells_gone_from_unknown() {
        // This process runs but is not a VM: a foreign command line is gone.
        assert!(matches!(liveness(std::process::id(), "x"), Liveness::Gone));
        assert!(matches!(liveness(0, "x"), Liveness::Gone));
        // A pid that cannot exist (above pid_max).
        assert!(matches!(liveness(u32::MAX >> 1, "x"), Liveness::Gone));
        assert!(is_zombie("12 (qemu) Z 1 2"));
        assert!(is_zombie("12 (a) b) Z 1"));
        assert!(!is_zombie("12 (qemu) S 1 2"));
        assert!(is_zombie("garbage"));
    }

    #[tokio::test]
    async fn a_foreign_wait_ends_when_the_process_exits() {
        // A child we do not reap through this function: `sleep`'s cmdline
        // does not name a VM, so the wait ends at once (gone).
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        wait_foreign_exit(c.id(), "x").await;
        assert!(t.elapsed() < Duration::from_secs(5));
        c.kill().unwrap();
        c.wait().unwrap();
    }

    #[tokio::test]
    async fn a_foreign_wait_lasts_as_long_as_the_vm() {
        // A process whose command line names the VM `forkvm-unit1`.
        let mut c = std::process::Command::new("bash")
            .args(["-c", "exec -a forkvm-unit1,process=x sleep 30"])
            .spawn()
            .unwrap();
        let pid = c.id();
        let t = std::time::Instant::now();
        while !is_our_qemu(pid, "unit1") {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "exec -a did not happen"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let w = tokio::spawn(async move { wait_foreign_exit(pid, "unit1").await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!w.is_finished(), "the wait ended while the VM ran");
        c.kill().unwrap();
        // Not reaped yet: a zombie has exited.
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("the wait did not end with the process")
            .unwrap();
        c.wait().unwrap();
    }

    #[test]
    fn own_pid_is_not_a_qemu() {
        assert!(!is_our_qemu(std::process::id(), "x"));
        assert!(!is_our_qemu(0, "x"));
    }

    #[test]
    fn machine_options_drop_the_memory_backend() {
        assert_eq!(
            strip_memory_backend("microvm,acpi=on,pic=off,pit=off,memory-backend=mem"),
            "microvm,acpi=on,pic=off,pit=off"
        );
        assert_eq!(
            strip_memory_backend("microvm,acpi=on,memory-backend=mem"),
            "microvm,acpi=on"
        );
        assert!(machine_arg(std::process::id()).is_none());
    }

    #[test]
    fn kill_of_a_missing_pid_is_false() {
        assert!(!kill(0, 0));
        assert!(kill(std::process::id(), 0));
    }
}
