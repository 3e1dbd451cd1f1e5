//! Why a VM stopped, in words a user can act on.
//!
//! A sandbox's QEMU can end in boot (a guest kernel panic or Oops, a bad
//! initramfs, a QEMU that refuses its arguments) or later (a panic, a
//! SIGKILL). The reason combines the guest's last word from the serial
//! console (which `earlyprintk` makes cover early boot too), QEMU's exit
//! status, and QEMU's stderr; failed spawns also carry the console tail.

use crate::config::SandboxPaths;
use crate::error::{EngineError, ErrorKind};
use crate::util;

/// How a QEMU process ended.
pub fn describe_status(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = s.signal() {
        let name = match sig {
            libc::SIGKILL => " (SIGKILL)",
            libc::SIGTERM => " (SIGTERM)",
            libc::SIGSEGV => " (SIGSEGV)",
            libc::SIGABRT => " (SIGABRT)",
            _ => "",
        };
        format!("QEMU was killed by signal {sig}{name}")
    } else {
        format!("QEMU exited with status {}", s.code().unwrap_or(-1))
    }
}

/// Turn an exit status plus the console log into a reason a user can act on:
/// the guest's own last word (a panic, an Oops, the agent's fatal error),
/// then how QEMU ended, then what QEMU wrote on stderr.
pub fn failure_reason(status: &str, paths: &SandboxPaths) -> String {
    let console = util::tail_file(&paths.console, 64 << 10);
    let mut reason = match guest_last_word(&console) {
        Some(word) => format!("{word} ({status})"),
        None => status.to_string(),
    };
    let qemu_err = util::tail_file(&paths.qemu_log, 2000);
    let qemu_err = qemu_err.trim();
    if !qemu_err.is_empty() {
        reason.push_str(": ");
        reason.push_str(qemu_err);
    }
    reason
}

/// The lines of a console log that say why the guest stopped, if any: the
/// panic line, with the first Oops before it (the panic of an Oops is only
/// "Attempted to kill the idle task"; the Oops names the fault).
fn guest_last_word(console: &str) -> Option<String> {
    let panic = console.lines().rev().find(|l| l.contains("Kernel panic"));
    // The first Oops is the cause; later ones are consequences.
    let oops = console.lines().find(|l| l.contains("Oops:"));
    match (panic, oops) {
        (Some(p), Some(o)) => Some(format!(
            "guest kernel panic: {}, after {}",
            p.trim(),
            o.trim()
        )),
        (Some(p), None) => Some(format!("guest kernel panic: {}", p.trim())),
        (None, Some(o)) => Some(format!("guest kernel oops: {}", o.trim())),
        (None, None) => console
            .lines()
            .rev()
            .find(|l| l.contains("forkvm-agent: FATAL"))
            .map(|line| format!("guest init failed: {}", line.trim())),
    }
}

/// The last lines of a sandbox's serial console, for error messages.
pub fn console_tail(paths: &SandboxPaths) -> String {
    const LINES: usize = 25;
    let text = util::tail_file(&paths.console, 16 << 10);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
    if tail.is_empty() {
        "(the console is empty)".to_string()
    } else {
        tail
    }
}

/// The error of a spawn whose VM exited before its agent answered.
pub fn died_while_booting(why: &str, paths: &SandboxPaths) -> EngineError {
    EngineError::new(
        ErrorKind::QemuFailed,
        format!(
            "the VM died while booting: {why}. Last console lines:\n{}",
            console_tail(paths)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const OOPS: &str = "[    0.176] rcu: srcu_init: Setting srcu_struct sizes\n\
[    0.176810] Oops: divide error: 0000 [#1] PREEMPT SMP NOPTI\n\
[    0.181] RIP: 0010:__x86_return_thunk+0x0/0x10\n\
[    0.190] Oops: general protection fault\n\
[    0.2] Kernel panic - not syncing: Attempted to kill the idle task!\n";

    #[test]
    fn the_panic_line_wins_then_the_first_oops() {
        assert_eq!(
            guest_last_word(OOPS).unwrap(),
            "guest kernel panic: [    0.2] Kernel panic - not syncing: Attempted to kill the idle task!, \
             after [    0.176810] Oops: divide error: 0000 [#1] PREEMPT SMP NOPTI"
        );
        assert_eq!(
            guest_last_word("[ 1.0] Kernel panic - not syncing: VFS\n").unwrap(),
            "guest kernel panic: [ 1.0] Kernel panic - not syncing: VFS"
        );
        let no_panic = OOPS.replace("Kernel panic", "something");
        assert!(guest_last_word(&no_panic)
            .unwrap()
            .contains("oops: [    0.176810] Oops: divide error"));
        assert_eq!(
            guest_last_word("x\nforkvm-agent: FATAL: no root\n").unwrap(),
            "guest init failed: forkvm-agent: FATAL: no root"
        );
        assert!(guest_last_word("a quiet boot\n").is_none());
    }

    #[test]
    fn reasons_and_tails_read_the_sandbox_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let paths = SandboxPaths {
            disk: d.join("disk.qcow2"),
            qmp: d.join("qmp.sock"),
            agent: d.join("agent.sock"),
            volumes_sock: d.join("volumes.sock"),
            volumes: d.join("volume-data"),
            console: d.join("console.log"),
            qemu_log: d.join("qemu.log"),
            mem: d.join("x.mem"),
            shm: d.join("x.d"),
            dir: d.to_path_buf(),
        };
        assert_eq!(console_tail(&paths), "(the console is empty)");
        assert_eq!(
            failure_reason("QEMU exited with status 0", &paths),
            "QEMU exited with status 0"
        );
        let many: String = (0..100).map(|i| format!("line {i}\n\n")).collect();
        std::fs::write(&paths.console, many + OOPS).unwrap();
        std::fs::write(&paths.qemu_log, "qemu: warning: x\n").unwrap();
        let tail = console_tail(&paths);
        assert_eq!(tail.lines().count(), 25);
        assert!(tail.ends_with("Attempted to kill the idle task!"));
        let r = failure_reason("QEMU exited with status 0", &paths);
        assert!(r.starts_with("guest kernel panic: "), "{r}");
        assert!(
            r.contains("(QEMU exited with status 0): qemu: warning: x"),
            "{r}"
        );
        let e = died_while_booting(&r, &paths);
        assert_eq!(e.kind, crate::error::ErrorKind::QemuFailed);
        assert!(e.message.contains("Last console lines:\n"), "{}", e.message);
        assert!(e.message.contains("Oops: divide error"), "{}", e.message);
    }
}
