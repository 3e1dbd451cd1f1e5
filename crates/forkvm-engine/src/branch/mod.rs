//! Branching: snapshot a running sandbox and spawn clones of it in one
//! call, in the mode the caller asks for. A paused sandbox branches from
//! the snapshot its pause saved, without resuming (see [`paused`]).

mod paused;

use std::sync::Arc;
use std::time::Instant;

use forkvm_api::{BranchMode, SnapshotSizes};

use crate::db::Origin;
use crate::error::{EngineError, ErrorKind, HintAction};
use crate::lease::Lease;
use crate::manager::Manager;
use crate::snapshot::freeze::Frozen;
use crate::snapshot::{kind, Save};
use crate::util::{self, ms};

impl Manager {
    /// Branch: snapshot the sandbox at this instant and spawn children. A
    /// failure is logged with the source's id (the source keeps running).
    pub async fn branch(
        self: &Arc<Self>,
        id: &str,
        req: forkvm_api::BranchRequest,
    ) -> Result<forkvm_api::BranchResult, EngineError> {
        let over = req.limits.clone();
        if let Some(o) = &over {
            crate::limits::check(o, self.cfg.limits.max_cpus)?;
        }
        let child_timeout = req.timeout;
        if let Some(t) = child_timeout {
            crate::lifetime::check_timeout(t)?;
        }
        let mode = serde_json::to_value(req.mode.unwrap_or_default())
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let mut r = self.branch_unlogged(id, req).await;
        crate::metrics::METRICS.branched(&mode, r.is_ok(), r.as_ref().ok().map(|b| b.pause_ms));
        match &mut r {
            Err(e) => {
                tracing::warn!(sandbox = %id, code = e.code(), "branch of sandbox {id} failed: {}", e.message)
            }
            Ok(b) => {
                // Children carry the source's metadata, env, timeout and
                // limits; a child that cannot be limited does not stay.
                let ids: Vec<String> = b.children.iter().map(|c| c.id.clone()).collect();
                if let Err(e) = self
                    .inherit_lifecycle(id, &ids, over.as_ref(), child_timeout)
                    .await
                {
                    tracing::warn!(sandbox = %id, "children of sandbox {id} did not get its lifecycle: {}", e.message);
                    for c in &ids {
                        let _ = self.remove(c).await;
                    }
                    return Err(e);
                }
                for c in &mut b.children {
                    if let Ok(v) = self.get(&c.id) {
                        *c = forkvm_api::Sandbox {
                            timings: c.timings.take(),
                            ..v
                        };
                    }
                }
                // Through the notices, so that it follows the children's own.
                self.db
                    .changes
                    .send(crate::changes::Change::Branch(Box::new(
                        forkvm_api::BranchEvent {
                            source: id.to_string(),
                            snapshot: b.snapshot.id.clone(),
                            mode: b.mode.as_str().into(),
                            children: ids,
                            pause_ms: b.pause_ms,
                            total_ms: b.total_ms,
                        },
                    )));
            }
        }
        r
    }

    /// [`Manager::branch`] without its log line, metrics and lifecycle:
    /// check the request, freeze the source as a branch point, then
    /// publish and spawn the children (now, or in the background).
    pub async fn branch_unlogged(
        self: &Arc<Self>,
        id: &str,
        req: forkvm_api::BranchRequest,
    ) -> Result<forkvm_api::BranchResult, EngineError> {
        let t0 = Instant::now();
        let mode = req.mode.unwrap_or_default();
        let count = req.count.unwrap_or(1);
        self.check_branch_count(count)?;
        if let Some(pause) = self.paused_branch_point(id)? {
            return self.branch_paused(id, &req, pause, t0).await;
        }
        // Each child starts mapping what the source has touched.
        let each = self
            .live(id)
            .and_then(|l| util::memory_usage(l.pid))
            .map_or(1, |m| (m.pss_kib >> 10).max(1));
        let _admitted = self.admit(u64::from(count) * each, &format!("branch of sandbox {id}"))?;
        let net = self.children_network(id, &req, count)?;
        // A branch point's children are all spawned now: a pool of the
        // daemon's default size would only hold QEMUs nobody claims.
        let mut frozen = self
            .freeze(
                id,
                req.tag,
                None,
                Some(0),
                save_mode(mode),
                crate::snapshot::Onto::Origin,
            )
            .await?;
        // A branch point: garbage collection takes it once nothing needs it
        // (see crate::gc), but not before its children run.
        frozen.srow.origin = Origin::Branch;
        frozen.info.mode = Some(mode.as_str().into());
        frozen.head_ahead = count > 0;
        let lease = self.gc_lease_new(&frozen.srow.id);
        let children = Children {
            count,
            net,
            mode,
            t0,
        };
        if req.wait == Some(false) {
            return Ok(self.finish_branch_later(frozen, lease, children));
        }
        self.publish_and_spawn(frozen, children).await
    }

    /// Refuse a count out of range, or one that would pass the daemon's
    /// limit of sandboxes.
    fn check_branch_count(&self, count: u32) -> Result<(), EngineError> {
        if count > 1000 {
            return Err(EngineError::invalid(format!(
                "count must be between 0 and 1000 (got {count})"
            )));
        }
        let free = self
            .cfg
            .limits
            .max_sandboxes
            .saturating_sub(self.db.count()?);
        if count > free {
            return Err(EngineError::new(
                ErrorKind::LimitExceeded,
                format!(
                    "{count} children would pass the limit of {} sandboxes ({free} free)",
                    self.cfg.limits.max_sandboxes
                ),
            )
            .hint(HintAction::RemoveSandboxes));
        }
        Ok(())
    }

    /// The children's network: the source's mode, egress and host access,
    /// and the ports asked for (by default the source's guest ports, on
    /// new host ports); validated before anything is frozen.
    fn children_network(
        &self,
        id: &str,
        req: &forkvm_api::BranchRequest,
        count: u32,
    ) -> Result<crate::net::NetRequest, EngineError> {
        let src_net = self.db.get(id)?.and_then(|r| r.network);
        let nic = self.live(id).is_some_and(|l| l.machine.nic.is_some());
        self.children_network_of(src_net, req, count, nic)
    }

    /// [`Manager::children_network`] from the source's network as stored
    /// and whether its machine has a NIC (a paused source has no live
    /// machine to ask, and keeps its network aside until it resumes).
    fn children_network_of(
        &self,
        src_net: Option<crate::net::types::SandboxNet>,
        req: &forkvm_api::BranchRequest,
        count: u32,
        nic: bool,
    ) -> Result<crate::net::NetRequest, EngineError> {
        let ports: Vec<forkvm_api::PortForward> = match &req.ports {
            Some(p) => p.clone(),
            None => src_net
                .as_ref()
                .map(|n| {
                    n.ports
                        .iter()
                        .map(|p| forkvm_api::PortForward {
                            guest: p.guest,
                            host: 0,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        self.net.validate(
            Some(
                src_net
                    .as_ref()
                    .map_or(forkvm_api::NetworkMode::None, |n| n.mode),
            )
            .filter(|_| nic),
            Some(&ports),
            src_net.as_ref().and_then(|n| n.egress.as_deref()),
            src_net.as_ref().map(|n| n.allow_host),
            req.wait_for_network,
            nic,
            count,
        )
    }

    /// `wait: false`: the source has resumed, so answer now with the
    /// snapshot marked as being written, and publish it and spawn the
    /// children in the background (a failure marks the pending snapshot).
    fn finish_branch_later(
        self: &Arc<Self>,
        frozen: Frozen,
        lease: Option<Lease>,
        children: Children,
    ) -> forkvm_api::BranchResult {
        let Children {
            count,
            net,
            mode,
            t0,
        } = children;
        let pending = self.pending_snapshot(&frozen);
        self.pending.set(pending.clone());
        let pause_ms = frozen.timings.pause_ms;
        let me = self.clone();
        let sid = pending.id.clone();
        tokio::spawn(async move {
            let _lease = lease;
            match me.publish_frozen(frozen).await {
                Ok(_) => {
                    me.pending.remove(&sid);
                    if count > 0 {
                        let r = match me.open_verified(&sid).await {
                            Ok(s) => me.spawn_clones(&s, count, &net).await.map(drop),
                            Err(e) => Err(e),
                        };
                        if let Err(e) = r {
                            tracing::warn!("children of branch {sid}: {}", e.message);
                        }
                    }
                }
                Err(e) => {
                    if let Some(mut p) = me.pending.get(&sid) {
                        p.state = "failed".into();
                        p.failure = Some(e.message.clone());
                        me.pending.set(p);
                    }
                }
            }
        });
        forkvm_api::BranchResult {
            mode,
            pause_ms,
            snapshot: pending,
            children: Vec::new(),
            snapshot_ms: ms(t0.elapsed()),
            spawn_ms: 0.0,
            total_ms: ms(t0.elapsed()),
        }
    }

    /// The branch point as the API shows it while it is being written.
    fn pending_snapshot(&self, frozen: &Frozen) -> forkvm_api::Snapshot {
        let r = &frozen.srow;
        forkvm_api::Snapshot {
            id: r.id.clone(),
            tag: r.tag.clone(),
            parent: r.parent.clone(),
            source: r.source.clone(),
            image: r.image.clone(),
            memory_mib: r.memory_mib,
            cpus: r.cpus,
            created_at: r.created_at.clone(),
            kind: kind(&frozen.manifest).into(),
            depth: 0,
            state: "writing".into(),
            failure: None,
            template: false,
            qemu_version: self.qemu_version.clone(),
            sizes: SnapshotSizes::default(),
            pool_size: 0,
            pool_default: false,
            sandboxes: Vec::new(),
            children: Vec::new(),
            origin: Origin::Branch.as_str().into(),
            pinned: false,
            mode: frozen.info.mode.clone(),
            pause_ms: frozen.info.pause_ms,
            flattened_from: None,
            timings: Some(frozen.timings.clone()),
        }
    }

    /// Publish the branch point, then spawn its children from it.
    async fn publish_and_spawn(
        self: &Arc<Self>,
        frozen: Frozen,
        children: Children,
    ) -> Result<forkvm_api::BranchResult, EngineError> {
        let Children {
            count,
            net,
            mode,
            t0,
        } = children;
        let snap = self.publish_frozen(frozen).await?;
        let snapshot_ms = ms(t0.elapsed());
        let t1 = Instant::now();
        let children = if count > 0 {
            let s = self.open_verified(&snap.id).await?;
            self.spawn_clones(&s, count, &net).await?
        } else {
            Vec::new()
        };
        Ok(forkvm_api::BranchResult {
            mode,
            pause_ms: snap.timings.as_ref().map_or(0.0, |t| t.pause_ms),
            snapshot: snap,
            children,
            snapshot_ms,
            spawn_ms: ms(t1.elapsed()),
            total_ms: ms(t0.elapsed()),
        })
    }
}

/// What the branch's children need once the branch point is frozen.
struct Children {
    count: u32,
    net: crate::net::NetRequest,
    mode: BranchMode,
    /// When the branch began: its times are counted from here.
    t0: Instant,
}

/// The save a branch mode asks for.
fn save_mode(mode: BranchMode) -> Save {
    match mode {
        BranchMode::Live => Save::Live,
        BranchMode::Diff => Save::Diff,
        BranchMode::Full => Save::Stopped,
    }
}
