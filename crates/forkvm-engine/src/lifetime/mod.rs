//! Lifetimes: metadata, default environments, timeouts, and pause/resume.
//!
//! ```text
//!   spawn {timeout: T}          deadline = now + T     (lifecycles table)
//!   PUT .../timeout {T'}        deadline = now + T'
//!   sweeper (every 250 ms)      deadline <= now  →  remove,
//!                                                   or pause (on_timeout: pause)
//!   pause                       remaining = deadline - now, deadline = NULL
//!   resume                      deadline = now + remaining
//!                               (the whole timeout again after an expiry)
//! ```
//!
//! Deadlines are absolute Unix times in SQLite, so they keep running while
//! the daemon is down: the first sweep after a restart handles whatever ran
//! out meanwhile. Paused time does not count, because a paused sandbox has no
//! deadline, only the time it had left. Pause and resume themselves live in
//! [`pause`].

pub mod cold;
pub mod connect;
pub mod pause;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use forkvm_api::{CreateSandbox, Lifetime, OnTimeout, SandboxState, MAX_TIMEOUT_S};

use crate::db::LifecycleRow;
use crate::error::EngineError;
use crate::manager::Manager;

/// How often the sweeper looks for timeouts that ran out.
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// A failed timeout action is tried again this much later (and logged).
const RETRY_AFTER_MS: i64 = 5_000;
const MAX_METADATA: usize = 64;
const MAX_KEY: usize = 64;
const MAX_VALUE: usize = 512;
const MAX_ENV: usize = 256;
const MAX_ENV_VALUE: usize = 32 * 1024;

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn rfc3339_ms(ms: i64) -> String {
    crate::util::rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

/// Check metadata labels.
pub fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), EngineError> {
    if m.len() > MAX_METADATA {
        return Err(EngineError::invalid(format!(
            "metadata has {} pairs; at most {MAX_METADATA} are allowed",
            m.len()
        )));
    }
    for (k, v) in m {
        let ok = !k.is_empty()
            && k.len() <= MAX_KEY
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b));
        if !ok {
            return Err(EngineError::invalid(format!(
                "metadata key {k:?} is not valid: use 1 to {MAX_KEY} letters, digits and '._-/:'"
            )));
        }
        if v.len() > MAX_VALUE {
            return Err(EngineError::invalid(format!(
                "metadata value of {k:?} is {} bytes; at most {MAX_VALUE} are allowed",
                v.len()
            )));
        }
    }
    Ok(())
}

/// Check default environment variables.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), EngineError> {
    if env.len() > MAX_ENV {
        return Err(EngineError::invalid(format!(
            "env has {} variables; at most {MAX_ENV} are allowed",
            env.len()
        )));
    }
    for (k, v) in env {
        let ok = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(EngineError::invalid(format!(
                "env name {k:?} is not valid: use letters, digits and '_', not starting with a digit"
            )));
        }
        if v.len() > MAX_ENV_VALUE || v.contains('\0') {
            return Err(EngineError::invalid(format!(
                "env value of {k} must be under {MAX_ENV_VALUE} bytes with no NUL byte"
            )));
        }
    }
    Ok(())
}

/// Check a timeout in seconds.
pub fn check_timeout(t: u64) -> Result<(), EngineError> {
    if t == 0 || t > MAX_TIMEOUT_S {
        return Err(EngineError::invalid(format!(
            "timeout must be between 1 and {MAX_TIMEOUT_S} seconds (got {t})"
        )));
    }
    Ok(())
}

/// The lifecycle record a spawn request asks for, checked before anything
/// is created.
pub fn from_request(req: &CreateSandbox) -> Result<LifecycleRow, EngineError> {
    let metadata = req.metadata.clone().unwrap_or_default();
    check_metadata(&metadata)?;
    let env = req.env.clone().unwrap_or_default();
    check_env(&env)?;
    if let Some(t) = req.timeout {
        check_timeout(t)?;
    } else if req.on_timeout.is_some() {
        return Err(EngineError::invalid(
            "on_timeout needs a timeout: give timeout (seconds) too",
        ));
    }
    Ok(LifecycleRow {
        metadata,
        env,
        timeout_s: req.timeout,
        on_timeout: req.on_timeout.unwrap_or_default(),
        limits: req.limits.clone().unwrap_or_default(),
        ..Default::default()
    })
}

/// The API view of a lifecycle's timeout.
pub fn lifetime_view(l: &LifecycleRow) -> Option<Lifetime> {
    let timeout = l.timeout_s?;
    let now = now_ms();
    let remaining_ms = match (l.deadline_ms, l.remaining_ms) {
        (Some(d), _) => (d - now).max(0),
        (None, Some(r)) => r.max(0),
        (None, None) => 0,
    };
    Some(Lifetime {
        timeout,
        on_timeout: l.on_timeout,
        expires_at: l.deadline_ms.map(rfc3339_ms),
        remaining_s: remaining_ms as f64 / 1000.0,
    })
}

/// Does a sandbox with this metadata match every `metadata.K=V` filter?
pub fn matches(metadata: &BTreeMap<String, String>, filters: &BTreeMap<String, String>) -> bool {
    filters
        .iter()
        .all(|(k, v)| metadata.get(k).is_some_and(|have| have == v))
}

impl Manager {
    /// Give freshly spawned sandboxes their lifecycle and limits: the
    /// timeout starts now, when they answer.
    pub async fn start_lifecycle(
        &self,
        ids: &[String],
        l: &LifecycleRow,
    ) -> Result<(), EngineError> {
        if l.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        for id in ids {
            let mut l = l.clone();
            l.deadline_ms = l.timeout_s.map(|t| now + (t as i64) * 1000);
            self.db.set_lifecycle(id, &l)?;
            self.apply_limits(id, &l.limits).await?;
        }
        Ok(())
    }

    /// A branch's children inherit the source's metadata, environment,
    /// timeout (counted afresh from their start; `timeout` replaces it) and
    /// limits, the latter field by field under the branch's own.
    pub async fn inherit_lifecycle(
        &self,
        source: &str,
        children: &[String],
        limits: Option<&forkvm_api::SandboxLimits>,
        timeout: Option<u64>,
    ) -> Result<(), EngineError> {
        let l = self.db.lifecycle(source)?;
        let l = LifecycleRow {
            limits: match limits {
                Some(over) => l.limits.merged(over),
                None => l.limits,
            },
            metadata: l.metadata,
            env: l.env,
            timeout_s: timeout.or(l.timeout_s),
            on_timeout: l.on_timeout,
            ..Default::default()
        };
        self.start_lifecycle(children, &l).await
    }

    /// `PUT /v1/sandboxes/{id}/timeout`.
    pub fn set_timeout(
        &self,
        id: &str,
        req: forkvm_api::SetTimeout,
    ) -> Result<forkvm_api::Sandbox, EngineError> {
        if let Some(t) = req.timeout {
            check_timeout(t)?;
        }
        let row = self.get(id)?;
        if row.state == SandboxState::Starting {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is still starting; set its timeout once the spawn returns"
            )));
        }
        let mut l = self.db.lifecycle(id)?;
        l.timeout_s = req.timeout;
        if let Some(o) = req.on_timeout {
            l.on_timeout = o;
        }
        match (req.timeout, row.state) {
            (None, _) => {
                l.deadline_ms = None;
                l.remaining_ms = None;
            }
            // Paused time does not count: the new timeout starts at resume.
            (Some(t), SandboxState::Paused) => {
                l.deadline_ms = None;
                l.remaining_ms = Some(t as i64 * 1000);
            }
            (Some(t), _) => {
                l.deadline_ms = Some(now_ms() + t as i64 * 1000);
                l.remaining_ms = None;
            }
        }
        self.db.set_lifecycle(id, &l)?;
        tracing::info!(sandbox = %id, timeout = ?req.timeout, "timeout of sandbox {id} set");
        self.get(id)
    }

    /// Act on every timeout that has run out.
    pub async fn sweep_timeouts(self: &Arc<Self>) {
        let now = now_ms();
        let expired = match self.db.expired(now) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!("cannot read timeouts: {e}");
                return;
            }
        };
        for id in expired {
            let (Ok(Some(row)), Ok(l)) = (self.db.get(&id), self.db.lifecycle(&id)) else {
                continue;
            };
            if row.state == SandboxState::Starting {
                continue; // its spawn or resume is still running
            }
            let pause = l.on_timeout.pauses() && row.state == SandboxState::Running;
            tracing::info!(sandbox = %id, "timeout of sandbox {id} ran out: {}", if pause { "pausing it" } else { "removing it" });
            crate::metrics::METRICS.timed_out(if pause { "pause" } else { "kill" });
            let r = if pause {
                let memory = l.on_timeout != OnTimeout::PauseFilesystem;
                self.pause(&id, "timeout", memory).await.map(drop)
            } else {
                self.remove(&id).await
            };
            if let Err(e) = r {
                tracing::error!(sandbox = %id, code = e.code(), "timeout of sandbox {id}: {} (trying again in {} s)", e.message, RETRY_AFTER_MS / 1000);
                if let Ok(mut l) = self.db.lifecycle(&id) {
                    if l.deadline_ms.is_some() {
                        l.deadline_ms = Some(now_ms() + RETRY_AFTER_MS);
                        let _ = self.db.set_lifecycle(&id, &l);
                    }
                }
            }
        }
    }

    /// Run the timeout sweeper until the daemon ends.
    pub fn start_sweeper(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_retry = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                me.sweep_timeouts().await;
                if last_retry.elapsed() >= crate::cleanup::RETRY_EVERY {
                    me.retry_cleanups().await;
                    last_retry = tokio::time::Instant::now();
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn metadata_and_env_are_checked() {
        assert!(check_metadata(&m(&[("team", "a"), ("k8s.io/run-1:x", "")])).is_ok());
        assert!(check_metadata(&m(&[("", "a")])).is_err());
        assert!(check_metadata(&m(&[("a b", "a")])).is_err());
        assert!(check_metadata(&m(&[("k", &"v".repeat(513))])).is_err());
        let many: BTreeMap<_, _> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check_metadata(&many).is_err());
        assert!(check_env(&m(&[("PATH_2", "/x"), ("_A", "")])).is_ok());
        assert!(check_env(&m(&[("2X", "")])).is_err());
        assert!(check_env(&m(&[("A=B", "")])).is_err());
        assert!(check_env(&m(&[("A", "x\0y")])).is_err());
    }

    #[test]
    fn timeouts_are_checked_and_need_each_other() {
        assert!(check_timeout(0).is_err());
        assert!(check_timeout(1).is_ok());
        assert!(check_timeout(MAX_TIMEOUT_S + 1).is_err());
        let req = CreateSandbox {
            on_timeout: Some(OnTimeout::Pause),
            ..Default::default()
        };
        assert!(from_request(&req).is_err());
        let req = CreateSandbox {
            timeout: Some(5),
            on_timeout: Some(OnTimeout::Pause),
            metadata: Some(m(&[("a", "b")])),
            ..Default::default()
        };
        let l = from_request(&req).unwrap();
        assert_eq!((l.timeout_s, l.on_timeout), (Some(5), OnTimeout::Pause));
        assert_eq!(
            l.deadline_ms, None,
            "the clock starts when the sandbox runs"
        );
    }

    #[test]
    fn views_and_filters() {
        let mut l = LifecycleRow {
            metadata: m(&[("team", "a"), ("run", "7")]),
            timeout_s: Some(10),
            deadline_ms: Some(now_ms() + 10_000),
            ..Default::default()
        };
        let v = lifetime_view(&l).unwrap();
        assert!(v.remaining_s > 9.0 && v.remaining_s <= 10.0, "{v:?}");
        assert!(v.expires_at.is_some());
        l.deadline_ms = None;
        l.remaining_ms = Some(4_000);
        let v = lifetime_view(&l).unwrap();
        assert_eq!((v.remaining_s, v.expires_at), (4.0, None));
        assert!(matches(&l.metadata, &m(&[("team", "a")])));
        assert!(matches(&l.metadata, &m(&[("team", "a"), ("run", "7")])));
        assert!(!matches(&l.metadata, &m(&[("team", "b")])));
        assert!(!matches(&l.metadata, &m(&[("other", "a")])));
        assert!(matches(&l.metadata, &BTreeMap::new()));
        assert!(lifetime_view(&LifecycleRow::default()).is_none());
    }
}
