//! A live sandbox as the manager tracks it: its QEMU, the phase of its
//! lifecycle, and its agent connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::agent::{AgentConn, AgentError};
use crate::config::SandboxPaths;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Booting,
    Running,
    Removing,
}

/// A sandbox whose QEMU the daemon is watching.
pub struct Live {
    pub id: String,
    pub pid: u32,
    pub(crate) phase: Mutex<Phase>,
    pub(crate) agent: tokio::sync::Mutex<Option<Arc<AgentConn>>>,
    pub(crate) exited: watch::Receiver<Option<String>>,
    pub(crate) paths: SandboxPaths,
    /// Serialises operations that must not overlap (snapshots).
    pub(crate) op_lock: tokio::sync::Mutex<()>,
    /// Which process its QEMU is (pid reuse: see `QemuId`).
    pub(crate) qemu: forkvm_qemu::process::QemuId,
    /// The machine it runs (a snapshot records it; its NIC and volume port
    /// are read here, never from the process).
    pub(crate) machine: forkvm_qemu::MachineConfig,
    /// A background stream is shortening its disk chain (crate::compact).
    pub(crate) streaming: std::sync::atomic::AtomicBool,
    /// One stream task at a time, from its first block-graph query to its
    /// clean-up (crate::compact).
    pub(crate) stream_lock: tokio::sync::Mutex<()>,
    /// A pause is saving it: the snapshot leaves the guest stopped.
    pub(crate) keep_stopped: std::sync::atomic::AtomicBool,
}

impl Live {
    pub(crate) fn agent_slot(&self) -> &tokio::sync::Mutex<Option<Arc<AgentConn>>> {
        &self.agent
    }

    pub(crate) fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub(crate) fn set_phase(&self, p: Phase) -> Phase {
        let mut g = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *g, p)
    }

    /// The agent connection, reconnecting if the previous one closed.
    pub async fn agent(&self) -> Result<Arc<AgentConn>, AgentError> {
        let mut g = self.agent.lock().await;
        if let Some(c) = g.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let c = AgentConn::connect(&self.paths.agent).await?;
        *g = Some(c.clone());
        Ok(c)
    }

    /// Wait until QEMU has exited (returns at once if it already has).
    pub(crate) async fn wait_exit(&self, timeout: Duration) -> bool {
        let mut rx = self.exited.clone();
        let r = tokio::time::timeout(timeout, rx.wait_for(|e| e.is_some())).await;
        r.is_ok()
    }
}

/// How the monitor waits for QEMU.
pub(crate) enum Waiter {
    /// We launched it: wait(2) gives the real status.
    Child(tokio::process::Child),
    /// An earlier daemon launched it: poll /proc.
    Foreign,
}
