//! Actions on sandboxes as a whole: create, look up, list, remove, pause,
//! resume, branch, their network and their time to live.

use std::collections::BTreeMap;

use forkvm_api::{
    BranchRequest, BranchResult, CreateSandbox, EgressRule, NetworkInfo, ResumeRequest, Sandbox,
    SetTimeout,
};

use super::{Connected, Created, Engine};
use crate::error::EngineError;

impl Engine {
    /// Create a sandbox (or a batch): from a snapshot, from its image's boot
    /// template, or by a cold boot.
    pub async fn create(&self, req: CreateSandbox) -> Result<Created, EngineError> {
        self.m.create(req).await
    }

    /// One sandbox by id, with its current state.
    pub fn get(&self, id: &str) -> Result<Sandbox, EngineError> {
        self.m.get(id)
    }

    /// Every sandbox that has all the given metadata pairs.
    pub fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<Sandbox>, EngineError> {
        self.m.list(metadata)
    }

    /// Whether a sandbox still recorded as running is being torn down: a
    /// removal has begun, or its VM is already gone.
    pub fn going_away(&self, id: &str) -> bool {
        match self.m.live(id) {
            Some(l) => l.phase() == crate::manager::Phase::Removing,
            None => true,
        }
    }

    /// Remove a sandbox: kill its VM and delete its files and record.
    pub async fn remove(&self, id: &str) -> Result<(), EngineError> {
        self.m.remove(id).await
    }

    /// Remove every sandbox of this daemon, so that none outlives it;
    /// returns what could not be removed.
    pub async fn remove_all(&self) -> Vec<String> {
        self.m.remove_all().await
    }

    /// Replace a running sandbox's egress allow-list (and host access) in
    /// place, keeping established connections, and record it.
    pub async fn set_network(
        &self,
        id: &str,
        egress: Option<Vec<EgressRule>>,
        allow_host: Option<bool>,
    ) -> Result<NetworkInfo, EngineError> {
        self.m.set_network(id, egress, allow_host).await
    }

    /// Pause a sandbox, keeping its memory or (with `memory: false`) only
    /// its disk; `reason` is `request` or `timeout`.
    pub async fn pause(
        &self,
        id: &str,
        reason: &str,
        memory: bool,
    ) -> Result<Sandbox, EngineError> {
        self.m.pause(id, reason, memory).await
    }

    /// Resume a paused sandbox where it stopped.
    pub async fn resume(&self, id: &str, req: ResumeRequest) -> Result<Sandbox, EngineError> {
        self.m.resume(id, req).await
    }

    /// Resume a paused sandbox, or make a running one's remaining time at
    /// least `timeout` seconds.
    pub async fn resume_or_extend(
        &self,
        id: &str,
        timeout: Option<u64>,
        memory: Option<bool>,
    ) -> Result<(Sandbox, Connected), EngineError> {
        self.m.resume_or_extend(id, timeout, memory).await
    }

    /// Set or clear a sandbox's timeout and what happens when it runs out.
    pub fn set_timeout(&self, id: &str, req: SetTimeout) -> Result<Sandbox, EngineError> {
        self.m.set_timeout(id, req)
    }

    /// Fork a running sandbox into children that go on from its current
    /// state, the parent kept running.
    pub async fn branch(&self, id: &str, req: BranchRequest) -> Result<BranchResult, EngineError> {
        self.m.branch(id, req).await
    }

    /// The last MiB of a sandbox's serial console (empty when there is
    /// none yet).
    pub fn console_log(&self, id: &str) -> String {
        crate::util::tail_file(&self.m.cfg.sandbox_paths(id).console, 1 << 20)
    }
}
