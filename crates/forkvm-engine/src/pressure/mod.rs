//! Disk pressure: sandboxes suspended before (or because) the home is full,
//! and resumed when space returns; `ENOSPC` reported as `507 no_space`.
//!
//! A guest that writes to its disk grows its top overlay in the daemon's
//! home. When the filesystem fills, QEMU stops every guest whose write fails
//! (`werror=enospc`, its default: the run state becomes `io-error`), idle
//! ones too, and nothing used to notice: the API said `running` and calls
//! into the guest hung. The watcher here runs every second:
//!
//! - While the home has at least `--disk-reserve-mib` free and nothing is
//!   suspended, it only calls `statvfs`.
//! - Under the reserve, it asks each running sandbox's QEMU for its run
//!   state. One stopped by `io-error` is marked **suspended** with the reason.
//! - Under half the reserve (the *floor*), every running sandbox whose disk
//!   grew since the last look is stopped (`stop` over QMP) and marked
//!   suspended, before the home is full: the daemon and its database keep
//!   the other half of the reserve.
//! - Once the home has the reserve free again, every suspended sandbox is
//!   resumed (`cont`) and unmarked. One that still cannot write stops again
//!   and is marked again at the next look.
//!
//! A suspended sandbox is shown with `suspended: <reason>` (its state stays
//! `running`: its QEMU and memory are all there), and every call that needs
//! its guest answers at once with `507 no_space` and that reason
//! ([`Manager::running`] checks), instead of waiting for a guest that cannot
//! run. Every failure and every change is logged with the sandbox id.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use crate::admission::disk_free_mib;
use crate::error::{EngineError, ErrorKind, HintAction};
use crate::manager::Phase;
use crate::Manager;

/// How often the watcher looks.
pub const EVERY: Duration = Duration::from_secs(1);

pub use suspended::Suspended;

pub mod suspended;

/// Allocated bytes of a file (0 if it cannot be read).
pub fn allocated(path: &std::path::Path) -> u64 {
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

impl Manager {
    /// The reason sandbox `id` is suspended by disk pressure, if it is.
    pub fn suspended(&self, id: &str) -> Option<String> {
        self.suspended.get(id)
    }

    /// The error for a call that needs the guest of a suspended sandbox.
    pub fn suspended_error(&self, id: &str, reason: &str) -> EngineError {
        EngineError::new(
            ErrorKind::NoSpace,
            format!(
                "sandbox {id} is suspended ({reason}); it resumes by itself once {} has {} MiB \
                 free",
                self.cfg.home.display(),
                self.cfg.disk_reserve_mib
            ),
        )
        .hint(HintAction::FreeSpace)
    }

    /// Start the watcher (once, at start).
    pub fn start_pressure_watch(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut sizes: HashMap<String, u64> = HashMap::new();
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.pressure_tick(&mut sizes).await;
            }
        });
    }

    async fn pressure_tick(&self, sizes: &mut HashMap<String, u64>) {
        let Some(free) = disk_free_mib(&self.cfg.home) else {
            return;
        };
        let reserve = self.cfg.disk_reserve_mib;
        let floor = reserve / 2;
        let suspended = self.suspended.ids();
        // With no reserve (0), a home at 0 MiB is still pressure: that is
        // when QEMU stops guests with `io-error`.
        if free >= reserve.max(1) {
            sizes.clear();
            for id in suspended {
                self.unsuspend(&id, free).await;
            }
            return;
        }
        let live: Vec<_> = self.live_map().values().cloned().collect();
        for l in live {
            if l.phase() != Phase::Running {
                continue;
            }
            let paths = self.cfg.sandbox_paths(&l.id);
            let size = allocated(&paths.disk);
            let grew = sizes
                .insert(l.id.clone(), size)
                .is_some_and(|before| size > before);
            if self.suspended.get(&l.id).is_some() {
                continue;
            }
            // An operation (snapshot, pause) holds the machine: leave it.
            let Ok(_op) = l.op_lock.try_lock() else {
                continue;
            };
            let Ok(qmp) = forkvm_qemu::Qmp::connect(&paths.qmp, Duration::from_secs(2)).await
            else {
                continue;
            };
            let status = qmp.status().await.unwrap_or_default();
            if status == "io-error" {
                self.suspend(
                    &l.id,
                    format!(
                        "disk full: QEMU stopped the guest when a write failed, with {free} MiB \
                         left in the home"
                    ),
                );
            } else if status == "running" && grew && free < floor {
                match qmp.execute("stop", None).await {
                    Ok(_) => self.suspend(
                        &l.id,
                        format!(
                            "disk full: stopped while its disk grew with {free} MiB left in the \
                             home, under half the {reserve} MiB reserve"
                        ),
                    ),
                    Err(e) => tracing::error!(
                        sandbox = %l.id,
                        "cannot stop sandbox {} under disk pressure: {e}",
                        l.id
                    ),
                }
            }
        }
    }

    fn suspend(&self, id: &str, reason: String) {
        if self.suspended.set(id, reason.clone()) {
            tracing::warn!(sandbox = %id, "sandbox {id} suspended: {reason}");
        }
    }

    async fn unsuspend(&self, id: &str, free: u64) {
        let Some(l) = self.live(id) else {
            self.suspended.clear(id);
            return;
        };
        let paths = self.cfg.sandbox_paths(id);
        let r = async {
            let qmp = forkvm_qemu::Qmp::connect(&paths.qmp, Duration::from_secs(5))
                .await
                .map_err(|e| e.to_string())?;
            let st = qmp.status().await.map_err(|e| e.to_string())?;
            if st == "io-error" || st == "paused" {
                qmp.execute("cont", None).await.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        }
        .await;
        match r {
            Ok(()) => {
                self.suspended.clear(id);
                tracing::info!(sandbox = %id, "sandbox {id} resumed: the home has {free} MiB free again");
            }
            Err(e) => {
                // Keep it suspended; the next look tries again.
                tracing::warn!(sandbox = %id, "cannot resume sandbox {id} after disk pressure: {e}");
                let _ = l;
            }
        }
    }
}
