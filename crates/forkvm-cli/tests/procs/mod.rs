//! Finding a daemon's QEMUs from outside it, without its records and
//! without parsing command lines.
//!
//! The daemon opens each QEMU's standard error as `qemu.log` in the
//! sandbox's directory before QEMU starts, so a process whose fd 2 is a file
//! under `<home>/sandboxes/` is a QEMU of that home, whatever its pid or
//! network namespace or jail (the link reads as the reader sees the file,
//! `(deleted)` appended if it was removed since). Reading another user's
//! `/proc/<pid>/fd` needs root, which these tests have (a test that finds
//! itself without it fails saying so, rather than seeing nothing).

use std::path::Path;

/// Live processes whose standard error is a file under `dir`.
pub fn writing_under(dir: &Path) -> Vec<u32> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "finding QEMUs by their open files needs root (run the VM tests as root)"
    );
    let prefix = format!("{}/", dir.display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(target) = std::fs::read_link(e.path().join("fd/2")) else {
            continue;
        };
        if target.to_string_lossy().starts_with(&prefix) && running(pid) {
            out.push(pid);
        }
    }
    out
}

/// Running (not a zombie, which keeps no files anyway).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}
