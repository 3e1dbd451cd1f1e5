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
    #[error("QEMU started but its QMP socket did not answer")]
    Qmp(#[source] QmpError),
}

/// A freshly launched QEMU with its QMP session.
pub struct Launched {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub qmp: Arc<Qmp>,
}

/// The QEMU binary to use: `$FORKVM_QEMU` or `qemu-system-x86_64` on PATH.
pub fn qemu_binary() -> PathBuf {
    std::env::var_os("FORKVM_QEMU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"))
}

/// Start QEMU for `spec`, with its stderr in `stderr_log`, and connect QMP.
pub async fn launch(
    bin: &Path,
    spec: &MachineSpec,
    stderr_log: &Path,
    timeout: Duration,
) -> Result<Launched, LaunchError> {
    let spawn_err = |source| LaunchError::Spawn {
        bin: bin.display().to_string(),
        source,
    };
    let log = std::fs::File::create(stderr_log).map_err(spawn_err)?;
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(spec.to_args())
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
    if let Some(f) = &ns_file {
        use std::os::fd::AsRawFd;
        let fd = f.as_raw_fd();
        // SAFETY: setns(2) is async-signal-safe and affects only the forked
        // child; the fd stays open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(spawn_err)?;
    drop(ns_file);
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

/// Send a signal to a pid. Returns false when the process does not exist.
pub fn kill(pid: u32, sig: i32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill(2) takes plain integers and has no memory-safety effects.
    unsafe { libc::kill(pid as i32, sig) == 0 }
}

/// True when `pid` is a live process whose command line names the VM
/// `forkvm-<name>`: a pid recorded before a daemon restart may have been
/// reused by an unrelated process.
pub fn is_our_qemu(pid: u32, name: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = format!("forkvm-{name},");
    if !cmdline
        .split(|b| *b == 0)
        .any(|arg| arg.starts_with(needle.as_bytes()))
    {
        return false;
    }
    // A zombie still has its cmdline until reaped; it is not running.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
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

/// Wait until a process that is not our child exits (polled via /proc, since
/// only the parent can wait(2) for it).
pub async fn wait_foreign_exit(pid: u32, name: &str) {
    while is_our_qemu(pid, name) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
