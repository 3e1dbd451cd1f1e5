//! Launching and tracking QEMU processes.
//!
//! QEMU is started in its own process group so that a signal aimed at the
//! daemon's terminal (Ctrl-C) does not reach the VMs, and without
//! `kill_on_drop`, so that sandboxes outlive a daemon restart. While the
//! daemon that launched it runs, it holds the `Child` and learns the exit
//! status; a restarted daemon re-finds the process by its recorded
//! [`QemuId`] (pid and start time) and trusts it only while both match.

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
    /// Which process it is (taken while `child` is unreaped, so certainly it).
    pub qemu: QemuId,
    pub qmp: Arc<Qmp>,
}

/// Which process a recorded QEMU is: its pid, when it started, and in which
/// boot of the host.
///
/// A pid alone names a process only while it runs: once it has exited the
/// kernel may give the number to any new process, and a restarted daemon
/// reading a pid from its db or a pid file cannot tell. The start time
/// (field 22 of `/proc/<pid>/stat`, in clock ticks since boot) tells: a pid
/// is handed out again only after its holder has gone, and the pid space
/// cannot wrap within one tick, so two holders of one pid never share a
/// start time within a boot; the boot id covers a reboot, after which start
/// times repeat. It is taken at launch, while the daemon holds QEMU as an
/// unreaped child (so the pid is certainly QEMU's), recorded in the db row,
/// the live record and the sandbox's `qemu.pid` file, and compared before a
/// recorded pid is trusted (signalled, waited on, re-attached).
///
/// A pidfd would be exact too, but it lives only as long as the daemon that
/// opened it, and the case that needs the check is a daemon that restarted
/// (or was killed) and finds the QEMUs again from its records.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QemuId {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot: String,
}

impl QemuId {
    /// The identity of the process that holds `pid` now.
    pub fn of(pid: u32) -> std::io::Result<QemuId> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let start = stat_start(&stat).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat has no start time: {stat:?}"),
            )
        })?;
        Ok(QemuId {
            pid,
            start,
            boot: boot_id()?,
        })
    }

    /// The `qemu.pid` file's text: `<pid> <start> <boot id>`, the pid
    /// first, as in any pid file.
    pub fn to_file(&self) -> String {
        format!("{} {} {}\n", self.pid, self.start, self.boot)
    }

    /// A `qemu.pid` file's text (see [`Self::to_file`]). A bare pid, which
    /// daemons before the start time was recorded wrote, is `Err(Some(pid))`:
    /// its identity must be checked another way ([`qmp_peer_pid`]).
    pub fn parse(text: &str) -> Result<QemuId, Option<u32>> {
        let t: Vec<&str> = text.split_whitespace().collect();
        let pid = t.first().and_then(|p| p.parse::<u32>().ok());
        match (pid, t.as_slice()) {
            (Some(pid), [_, start, boot]) => match start.parse() {
                Ok(start) => Ok(QemuId {
                    pid,
                    start,
                    boot: boot.to_string(),
                }),
                Err(_) => Err(None),
            },
            (Some(pid), [_]) => Err(Some(pid)),
            _ => Err(None),
        }
    }
}

/// The start time (field 22) of a `/proc/<pid>/stat` line. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after
/// its last `)`: field 3 (the state) is the first there.
fn stat_start(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// This boot's id (read once: it does not change while we run).
fn boot_id() -> std::io::Result<String> {
    static BOOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(b) = BOOT.get() {
        return Ok(b.clone());
    }
    let b = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string();
    Ok(BOOT.get_or_init(|| b).clone())
}

/// The pid of the process serving the unix socket `path` (`SO_PEERCRED`,
/// which for a client is the listener's, in the daemon's pid namespace even
/// for a jailed QEMU in its own). Only QEMU itself listens on a sandbox's QMP
/// socket, so this identifies the QEMU of a record that has no [`QemuId`]
/// (written before it was recorded). QEMU serves one QMP client at a time;
/// a second waits in the backlog, which is enough for the credentials, and
/// is closed here without a word.
pub async fn qmp_peer_pid(path: &Path, timeout: Duration) -> std::io::Result<u32> {
    let s = tokio::time::timeout(timeout, tokio::net::UnixStream::connect(path))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let cred = s.peer_cred()?;
    cred.pid()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| std::io::Error::other("the socket's peer has no pid in our namespace"))
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
            let tap = spec.config.nic.as_ref().map(|n| n.tap.as_str());
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
    let no_thp = disables_thp(spec.config.accel);
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
    // Unreaped, so the pid is certainly this QEMU's (even if it exited).
    let qemu = match QemuId::of(pid) {
        Ok(q) => q,
        Err(e) => {
            kill(pid, libc::SIGKILL);
            let _ = child.wait().await;
            return Err(LaunchError::Spawn {
                bin: format!(
                    "{} (cannot read the start time of pid {pid})",
                    bin.display()
                ),
                source: e,
            });
        }
    };
    let qmp = tokio::select! {
        r = Qmp::connect(&spec.qmp_socket, timeout) => r,
        status = child.wait() => {
            let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            let stderr = std::fs::read_to_string(stderr_log).unwrap_or_default();
            return Err(LaunchError::EarlyExit { status, stderr: stderr.trim().to_string() });
        }
    };
    match qmp {
        Ok(qmp) => Ok(Launched { child, qemu, qmp }),
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

/// What can be known about a QEMU the daemon recorded.
#[derive(Debug)]
pub enum Liveness {
    /// Running, and the same process that was recorded.
    Ours,
    /// Certainly not running: no such process, a zombie, or a pid reused by
    /// another process (another start time or boot).
    Gone,
    /// The check itself failed (e.g. `EMFILE` opening `/proc`): the process
    /// may well be running. Never treat this as an exit.
    Unknown(std::io::Error),
}

/// Whether the recorded QEMU `q` still runs (see [`QemuId`] for why its
/// start time decides). Only a missing process, a zombie or another
/// process on the pid count as gone; a failure to look (out of file
/// descriptors, say) is `Unknown`, because a daemon that took it for an
/// exit would forget a VM that still runs.
pub fn liveness(q: &QemuId) -> Liveness {
    let pid = q.pid;
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
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if gone(&e) => return Liveness::Gone,
        Err(e) => return Liveness::Unknown(e),
    };
    // A zombie has exited; it only waits to be reaped.
    if is_zombie(&stat) {
        return Liveness::Gone;
    }
    match stat_start(&stat) {
        // Another process holds the pid now.
        Some(start) if start != q.start => return Liveness::Gone,
        Some(_) => {}
        None => {
            return Liveness::Unknown(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat has no start time"),
            ))
        }
    }
    match boot_id() {
        Ok(b) if b == q.boot => Liveness::Ours,
        // The record is from another boot of the host.
        Ok(_) => Liveness::Gone,
        Err(e) => Liveness::Unknown(e),
    }
}

fn is_zombie(stat: &str) -> bool {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        .unwrap_or(true)
}

/// True only when the recorded QEMU `q` is known to run still: what a
/// caller needs before it signals its pid. (An `Unknown` answer is not
/// enough to kill on, nor to forget on: see [`liveness`].)
pub fn is_our_qemu(q: &QemuId) -> bool {
    matches!(liveness(q), Liveness::Ours)
}

/// Wait until a process that is not our child exits. Only the parent can
/// wait(2) for it, so this holds a pidfd, which becomes readable when the
/// process exits, and checks [`liveness`] once the pidfd is open (so a pid
/// reused before the pidfd was taken is not waited on). If no pidfd can be
/// had (an old kernel, or no descriptor free), it polls [`liveness`] and
/// tries again for a pidfd later. It returns only when the process is
/// certainly gone: a failed check never ends the wait.
pub async fn wait_foreign_exit(q: &QemuId, name: &str) {
    let pid = q.pid;
    let mut logged = false;
    loop {
        match pidfd_open(pid) {
            Ok(fd) => match liveness(q) {
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
            if matches!(liveness(q), Liveness::Gone) {
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

    fn me() -> QemuId {
        QemuId::of(std::process::id()).unwrap()
    }

    #[test]
    fn liveness_tells_gone_from_unknown() {
        // This process, as recorded now, runs.
        assert!(matches!(liveness(&me()), Liveness::Ours));
        // The same pid with another start time, or from another boot, is
        // another process: a reused pid.
        let mut other = me();
        other.start += 1;
        assert!(matches!(liveness(&other), Liveness::Gone));
        let mut other = me();
        other.boot = "00000000-0000-0000-0000-000000000000".into();
        assert!(matches!(liveness(&other), Liveness::Gone));
        let none = |pid| QemuId { pid, ..me() };
        assert!(matches!(liveness(&none(0)), Liveness::Gone));
        // A pid that cannot exist (above pid_max).
        assert!(matches!(liveness(&none(u32::MAX >> 1)), Liveness::Gone));
        assert!(is_zombie("12 (qemu) Z 1 2"));
        assert!(is_zombie("12 (a) b) Z 1"));
        assert!(!is_zombie("12 (qemu) S 1 2"));
        assert!(is_zombie("garbage"));
    }

    #[test]
    fn the_start_time_is_field_22_whatever_the_command_name() {
        let rest = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 21 22";
        assert_eq!(stat_start(&format!("12 (qemu) {rest}")), Some(987654));
        assert_eq!(stat_start(&format!("12 (a b) c)) {rest}")), Some(987654));
        assert_eq!(stat_start("12 (qemu) S 1 2"), None);
        assert_eq!(stat_start("garbage"), None);
        assert_eq!(stat_start(""), None);
        let s = me();
        assert!(s.start > 0 && s.boot.len() == 36, "{s:?}");
        assert!(QemuId::of(u32::MAX >> 1).is_err());
    }

    #[test]
    fn pid_files_old_and_new_parse() {
        let q = me();
        assert_eq!(QemuId::parse(&q.to_file()), Ok(q.clone()));
        assert_eq!(QemuId::parse(&format!("{}\n", q.to_file())), Ok(q));
        // A bare pid from an older daemon: to be checked another way.
        assert_eq!(QemuId::parse("1234\n"), Err(Some(1234)));
        assert_eq!(QemuId::parse(""), Err(None));
        assert_eq!(QemuId::parse("{\"pid\": 3}"), Err(None));
        assert_eq!(QemuId::parse("12 x b"), Err(None));
        assert_eq!(QemuId::parse("12 3"), Err(None));
        assert_eq!(QemuId::parse("12 3 b extra"), Err(None));
        assert!(me()
            .to_file()
            .starts_with(&format!("{} ", std::process::id())));
        assert_eq!(QemuId::parse("\u{0}\u{ff}"), Err(None));
    }

    #[tokio::test]
    async fn a_foreign_wait_ends_when_the_process_exits() {
        // A child reaped elsewhere: the wait ends once it is a zombie.
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let q = QemuId::of(c.id()).unwrap();
        let w = tokio::spawn(async move { wait_foreign_exit(&q, "unit1").await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!w.is_finished(), "the wait ended while the process ran");
        c.kill().unwrap();
        // Not reaped yet: a zombie has exited.
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("the wait did not end with the process")
            .unwrap();
        c.wait().unwrap();
    }

    #[tokio::test]
    async fn a_foreign_wait_on_a_reused_pid_ends_at_once() {
        // The pid runs, but not the process that was recorded.
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut q = QemuId::of(c.id()).unwrap();
        q.start -= 1;
        let t = std::time::Instant::now();
        wait_foreign_exit(&q, "x").await;
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(!is_our_qemu(&q));
        c.kill().unwrap();
        c.wait().unwrap();
    }

    #[tokio::test]
    async fn the_peer_of_a_socket_is_its_listener() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("qmp.sock");
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert_eq!(
            qmp_peer_pid(&p, Duration::from_secs(5)).await.unwrap(),
            std::process::id()
        );
        assert!(qmp_peer_pid(&d.path().join("none"), Duration::from_secs(5))
            .await
            .is_err());
    }

    #[test]
    fn kill_of_a_missing_pid_is_false() {
        assert!(!kill(0, 0));
        assert!(kill(std::process::id(), 0));
    }
}
