//! Connect to a sandbox whatever its state: a paused one is resumed, a
//! running one has its timeout extended (never shortened). E2B's `connect`
//! is this action; any front-end may offer it.

use std::sync::Arc;

use forkvm_api::{ResumeRequest, Sandbox, SandboxState, SetTimeout};

use crate::error::EngineError;
use crate::manager::Manager;

/// What [`Manager::resume_or_extend`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connected {
    /// The sandbox was paused and now runs again.
    Resumed,
    /// It was running; its timeout is now at least the one asked for.
    Extended,
}

impl Manager {
    /// Resume a paused sandbox (with `timeout` and `memory` as for
    /// [`Manager::resume`]), or, for a running one, make its remaining
    /// time at least `timeout` seconds.
    pub async fn resume_or_extend(
        self: &Arc<Self>,
        id: &str,
        timeout: Option<u64>,
        memory: Option<bool>,
    ) -> Result<(Sandbox, Connected), EngineError> {
        let sb = self.get(id)?;
        if sb.state == SandboxState::Paused {
            let sb = self.resume(id, ResumeRequest { timeout, memory }).await?;
            return Ok((sb, Connected::Resumed));
        }
        let left = sb.lifetime.as_ref().map(|l| l.remaining_s);
        let longer = timeout.filter(|t| left.is_some_and(|l| (*t as f64) > l));
        let sb = match longer {
            Some(t) => self.set_timeout(
                id,
                SetTimeout {
                    timeout: Some(t),
                    on_timeout: None,
                },
            )?,
            None => sb,
        };
        Ok((sb, Connected::Extended))
    }
}
