//! Admission control: a spawn, branch or resume is refused before any work
//! starts when it would take the host past its memory commitment, or when
//! the filesystem holding `FORKVM_HOME` is nearly full.
//!
//! Memory is counted by what sandboxes really use, not by their size:
//!
//! * a running sandbox counts its QEMU's PSS (proportional set size): pages
//!   it shares copy-on-write with its snapshot and its siblings are split
//!   between them, so a hundred idle clones of one 512 MiB snapshot count
//!   tens of MiB each, not 512;
//! * a sandbox about to start counts an estimate: its full RAM for a cold
//!   boot (it may touch every page), and for a restore the memory its
//!   snapshot's guest had touched (the allocated part of the sparse memory
//!   image, or the pages a diff adds), since that is what a clone maps when
//!   it starts;
//! * admissions in flight hold a reservation until their sandboxes run and
//!   their PSS counts instead, so concurrent spawns cannot both squeeze in.
//!
//! A refusal is 503 `capacity_exceeded` (memory) or 507 `no_space` (disk),
//! with the figures and what to do; `GET /v1/info` shows `capacity`.

use forkvm_api::{Capacity, SandboxState};

use crate::error::{EngineError, ErrorKind, HintAction};
use reserve::Admitted;

pub mod reserve;
use crate::manager::Manager;

/// Free MiB on the filesystem holding `path`.
pub fn disk_free_mib(path: &std::path::Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes into the struct we own; the path is NUL-terminated.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some((s.f_bavail as u64).saturating_mul(s.f_frsize as u64) >> 20)
}

/// What a snapshot's clone maps when it starts, in MiB (at least 1).
pub fn clone_estimate_mib(sizes: &forkvm_api::SnapshotSizes, kind: &str) -> u64 {
    let bytes = match kind {
        "shared" => sizes.memory_allocated_bytes,
        "diff" => sizes.memory_allocated_bytes.max(sizes.memory_diff_bytes),
        // `stream` and `live`: the RAM travels in the device state.
        _ => sizes.device_state_bytes.max(sizes.memory_allocated_bytes),
    };
    (bytes >> 20).max(1)
}

impl Manager {
    /// Memory the running sandboxes use now (sum of their QEMUs' PSS), MiB.
    fn memory_used_mib(&self) -> (u64, u32) {
        let mut kib = 0u64;
        let mut n = 0u32;
        for r in self.db.list().unwrap_or_default() {
            if let (SandboxState::Running | SandboxState::Starting, Some(pid)) = (r.state, r.pid) {
                if let Some(m) = crate::util::memory_usage(pid) {
                    kib += m.pss_kib;
                    n += 1;
                }
            }
        }
        (kib >> 10, n)
    }

    /// Capacity used and left (`GET /v1/info`).
    pub fn capacity(&self) -> Capacity {
        let (used, counted) = self.memory_used_mib();
        let reserved = *self.admissions.0.lock().unwrap_or_else(|p| p.into_inner());
        let commit = self.cfg.memory_commit_mib;
        Capacity {
            memory_commit_mib: commit,
            memory_used_mib: used,
            memory_reserved_mib: reserved,
            memory_left_mib: commit.saturating_sub(used + reserved),
            counted_sandboxes: counted,
            disk_free_mib: disk_free_mib(&self.cfg.home).unwrap_or(0),
            disk_reserve_mib: self.cfg.disk_reserve_mib,
        }
    }

    /// Admit an operation that starts sandboxes needing `need_mib` in all,
    /// or refuse it with what to do. `what` names it in the message.
    pub fn admit(&self, need_mib: u64, what: &str) -> Result<Admitted<'_>, EngineError> {
        self.admit_unlogged(need_mib, what).inspect_err(|e| {
            tracing::warn!(code = e.code(), "{}", e.message);
        })
    }

    /// Refuse work that writes to the home (a snapshot, a pause, an image
    /// import, pull or build, a snapshot pull) while the home is under its
    /// free-space reserve, before anything is written: the reserve is what
    /// keeps the daemon, its database and running guests writing.
    pub fn check_disk(&self, what: &str) -> Result<(), EngineError> {
        self.check_disk_unlogged(what).inspect_err(|e| {
            tracing::warn!(code = e.code(), "{}", e.message);
        })
    }

    /// Bytes a write may take before the home goes under its reserve
    /// (`None` when free space cannot be read): bounds copies whose size is
    /// only known as they go, such as `copy` volumes.
    pub fn disk_budget_bytes(&self) -> Option<u64> {
        disk_free_mib(&self.cfg.home)
            .map(|free| free.saturating_sub(self.cfg.disk_reserve_mib) * 1024 * 1024)
    }

    fn check_disk_unlogged(&self, what: &str) -> Result<(), EngineError> {
        if let Some(free) = disk_free_mib(&self.cfg.home) {
            if free < self.cfg.disk_reserve_mib {
                return Err(EngineError::new(
                    ErrorKind::NoSpace,
                    format!(
                        "{what} refused: {} has {free} MiB free, under the {} MiB the daemon keeps \
                         (--disk-reserve-mib)",
                        self.cfg.home.display(),
                        self.cfg.disk_reserve_mib
                    ),
                )
                .hint(HintAction::FreeSpace));
            }
        }
        Ok(())
    }

    fn admit_unlogged(&self, need_mib: u64, what: &str) -> Result<Admitted<'_>, EngineError> {
        self.check_disk_unlogged(what)?;
        let (used, _) = self.memory_used_mib();
        let mut reserved = self.admissions.0.lock().unwrap_or_else(|p| p.into_inner());
        let commit = self.cfg.memory_commit_mib;
        if used + *reserved + need_mib > commit {
            return Err(EngineError::new(
                ErrorKind::CapacityExceeded,
                format!(
                    "{what} refused: it needs about {need_mib} MiB and {used} MiB are in use \
                     ({} MiB more being started) of the {commit} MiB memory commitment \
                     (--memory-commit-mib); remove or pause sandboxes, or raise the commitment",
                    *reserved
                ),
            ));
        }
        *reserved += need_mib;
        Ok(Admitted {
            r: &self.admissions,
            mib: need_mib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::reserve::Reservations;
    use super::*;

    #[test]
    fn estimates_follow_the_snapshot_kind() {
        let s = forkvm_api::SnapshotSizes {
            memory_bytes: 512 << 20,
            memory_allocated_bytes: 100 << 20,
            device_state_bytes: 300 << 20,
            disk_bytes: 0,
            memory_diff_bytes: 20 << 20,
            device_state_allocated_bytes: 300 << 20,
            on_disk_bytes: 0,
        };
        assert_eq!(clone_estimate_mib(&s, "shared"), 100);
        assert_eq!(clone_estimate_mib(&s, "diff"), 100);
        assert_eq!(clone_estimate_mib(&s, "stream"), 300);
        assert_eq!(clone_estimate_mib(&Default::default(), "shared"), 1);
    }

    #[test]
    fn reservations_are_given_back() {
        let r = Reservations::default();
        {
            *r.0.lock().unwrap() += 10;
            let _a = Admitted { r: &r, mib: 10 };
            assert_eq!(*r.0.lock().unwrap(), 10);
        }
        assert_eq!(*r.0.lock().unwrap(), 0);
    }

    #[test]
    fn free_space_is_read() {
        assert!(disk_free_mib(std::path::Path::new("/")).is_some());
        assert!(disk_free_mib(std::path::Path::new("/nonexistent/x")).is_none());
    }
}
