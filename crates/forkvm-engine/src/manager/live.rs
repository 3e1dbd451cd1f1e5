//! A live sandbox as the manager tracks it: its QEMU, the phase of its
//! lifecycle, and its agent connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::agent::{AgentConn, AgentError};
use crate::config::SandboxPaths;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Booting,
    Running,
    Removing,
}

/// A sandbox whose QEMU the daemon is watching.
pub struct Live {
    pub id: String,
    pub pid: u32,
    pub phase: Mutex<Phase>,
    pub agent: tokio::sync::Mutex<Option<Arc<AgentConn>>>,
    pub exited: watch::Receiver<Option<String>>,
    pub paths: SandboxPaths,
    /// Serialises operations that must not overlap (snapshots).
    pub op_lock: tokio::sync::Mutex<()>,
    /// Which process its QEMU is (pid reuse: see `QemuId`).
    pub qemu: forkvm_qemu::process::QemuId,
    /// The machine it runs (a snapshot records it; its NIC and volume port
    /// are read here, never from the process).
    pub machine: forkvm_qemu::MachineConfig,
    /// A background stream is shortening its disk chain (crate::compact).
    pub streaming: std::sync::atomic::AtomicBool,
    /// One stream task at a time, from its first block-graph query to its
    /// clean-up (crate::compact).
    pub stream_lock: tokio::sync::Mutex<()>,
    /// A pause is saving it: the snapshot leaves the guest stopped.
    pub keep_stopped: std::sync::atomic::AtomicBool,
    /// The checkpoint since which the dirty bitmap on its top disk layer
    /// records the guest's writes (forkvm_qemu::incremental); `None` while
    /// it keeps no such record (it started since, or a freeze could not
    /// carry the bitmap).
    pub tracked_since: Mutex<Option<String>>,
}

impl Live {
    pub fn agent_slot(&self) -> &tokio::sync::Mutex<Option<Arc<AgentConn>>> {
        &self.agent
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn set_phase(&self, p: Phase) -> Phase {
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
    pub async fn wait_exit(&self, timeout: Duration) -> bool {
        let mut rx = self.exited.clone();
        let r = tokio::time::timeout(timeout, rx.wait_for(|e| e.is_some())).await;
        r.is_ok()
    }
}

/// How the monitor waits for QEMU.
pub enum Waiter {
    /// We launched it: wait(2) gives the real status.
    Child(tokio::process::Child),
    /// An earlier daemon launched it: poll /proc.
    Foreign,
}
