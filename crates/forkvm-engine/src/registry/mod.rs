//! Snapshots that travel: push a snapshot with its chain and base image to
//! an OCI registry, pull one, and spawn it here (docs/registry.md).
//!
//! * [`export`]: what a push sends (the chain, disk backing, chunk lists);
//! * [`import`]: what a pull writes (staging, checks, re-sealing);
//! * [`host`]: this host for the compatibility rule, and the digest cache;
//!
//! The REST handlers are in `api::registry`; this node's snapshots are served
//! read-only over the OCI distribution API (`/v2/`) by the `oci` front-end.
//!
//! The artifact format and the protocol are in the forkvm-artifact crate.
//! A pull decides compatibility from the configs alone, then stages every
//! file it needs, and publishes (image, then links base first) only when all
//! of them checked: a failure at any point leaves nothing new here.

pub mod export;
pub mod host;
pub mod import;

use std::sync::Arc;
use std::time::Instant;

use forkvm_api::{PullResult, PullSnapshot, PushResult, PushSnapshot, TransferEvent};
use forkvm_artifact::fetch::FetchError;
use forkvm_artifact::push::PushError;
use tokio::sync::mpsc;

use crate::db::{Origin, SnapshotInfo, SnapshotRow};
use crate::error::{EngineError, ErrorKind};
use crate::images::install::pull_error;
use crate::images::stream::Emitter;
use crate::manager::Manager;
use import::LinkPlan;

/// Map a pull failure to the API's codes: a blob that fails its digest is
/// 422 like an image's.
pub fn fetch_error(e: &FetchError) -> EngineError {
    match e {
        FetchError::Registry(p) => pull_error(p),
        FetchError::Format(f) => EngineError::new(ErrorKind::InvalidImage, f.to_string()),
        FetchError::Chunk(c) => match c {
            forkvm_artifact::chunk::ChunkError::Io { source, .. }
                if source.raw_os_error() == Some(libc::ENOSPC) =>
            {
                EngineError::new(
                    ErrorKind::NoSpace,
                    format!("{e}: the disk holding FORKVM_HOME is full; free space and pull again"),
                )
            }
            forkvm_artifact::chunk::ChunkError::Io { .. } => EngineError::internal(e.to_string()),
            _ => EngineError::new(
                ErrorKind::InvalidImage,
                format!("{e} (the registry's copy is corrupt or was tampered with)"),
            ),
        },
        FetchError::Task(t) => EngineError::internal(t.clone()),
    }
}

fn push_error(e: &PushError) -> EngineError {
    match e {
        PushError::Registry(p) => pull_error(p),
        other => EngineError::internal(other.to_string()),
    }
}

fn check_reference(
    reference: &str,
    user: &Option<String>,
    pass: &Option<String>,
) -> Result<(), EngineError> {
    if reference.trim().is_empty() {
        return Err(EngineError::invalid(
            "reference must name a repository, e.g. 127.0.0.1:5000/team/warm:v1",
        ));
    }
    if user.is_some() != pass.is_some() {
        return Err(EngineError::invalid("give username and password together"));
    }
    forkvm_image::pull::parse_reference(reference).map_err(|e| pull_error(&e))?;
    Ok(())
}

impl Manager {
    /// Checks made before a push streams anything.
    pub fn check_push(&self, id: &str, req: &PushSnapshot) -> Result<String, EngineError> {
        check_reference(&req.reference, &req.username, &req.password)?;
        if let Some(p) = self.pending.get(id) {
            return Err(EngineError::conflict(format!(
                "snapshot {} is still being written ({}); push it once it is ready",
                p.id, p.state
            )));
        }
        Ok(self.snapshot_row(id)?.id)
    }

    /// `POST /v1/snapshots/{id}/push`.
    pub async fn push_snapshot(
        self: &Arc<Self>,
        id: String,
        req: PushSnapshot,
        tx: mpsc::UnboundedSender<TransferEvent>,
    ) -> Result<TransferEvent, EngineError> {
        let emit = Arc::new(Emitter::new(tx, format!("snapshot {id}: push")));
        let r = self.push_inner(&id, &req, emit).await;
        match &r {
            Ok(p) => tracing::info!(
                "snapshot {id}: pushed to {} ({} blobs, {} bytes sent; {} skipped)",
                p.reference,
                p.blobs_sent,
                p.bytes_sent,
                p.blobs_skipped
            ),
            Err(e) => tracing::warn!(
                "snapshot {id}: push to {} failed: {}",
                req.reference,
                e.message
            ),
        }
        r.map(|result| TransferEvent::Pushed { result })
    }

    async fn push_inner(
        self: &Arc<Self>,
        id: &str,
        req: &PushSnapshot,
        emit: Arc<Emitter<TransferEvent>>,
    ) -> Result<PushResult, EngineError> {
        let t0 = Instant::now();
        let opts = self.registry_options(
            &req.reference,
            req.username.clone().zip(req.password.clone()),
            req.insecure,
        )?;
        // The chain's snapshots must not be removed while they are read.
        let _lease = self.gc.leases.try_lease(id).ok_or_else(|| {
            EngineError::conflict(format!(
                "snapshot {id} is being collected; it cannot be pushed"
            ))
        })?;
        // Reach the registry first: a wrong address or password should not
        // wait for the chunking of a first push.
        let session = forkvm_artifact::push::connect(&req.reference, &opts)
            .await
            .map_err(|e| push_error(&e))?;
        let (image, links) = self.export(id, emit.as_ref()).await?;
        let n = links.len() as u32;
        let p = forkvm_artifact::push::push(&session, image, links, emit.as_ref())
            .await
            .map_err(|e| push_error(&e))?;
        Ok(PushResult {
            reference: p.reference,
            digest: p.index_digest,
            snapshot: id.to_string(),
            links: n,
            links_skipped: p.links_skipped,
            image_sent: p.image_sent,
            blobs_sent: p.blobs_sent,
            bytes_sent: p.bytes_sent,
            blobs_skipped: p.blobs_skipped,
            bytes_skipped: p.bytes_skipped,
            manifests_sent: p.manifests_sent,
            total_ms: t0.elapsed().as_millis() as u64,
        })
    }

    /// Checks made before a pull streams anything.
    pub fn check_pull_snapshot(&self, req: &PullSnapshot) -> Result<(), EngineError> {
        check_reference(&req.reference, &req.username, &req.password)?;
        self.check_tag(req.tag.as_deref())
    }

    /// `POST /v1/snapshots/pull`.
    pub async fn pull_snapshot(
        self: &Arc<Self>,
        req: PullSnapshot,
        tx: mpsc::UnboundedSender<TransferEvent>,
    ) -> Result<TransferEvent, EngineError> {
        let emit = Arc::new(Emitter::new(tx, format!("pull {}", req.reference)));
        let r = match self.check_disk(&format!("pull of snapshot {}", req.reference)) {
            Ok(()) => self.pull_snapshot_inner(&req, emit).await,
            Err(e) => Err(e),
        };
        match &r {
            Ok(p) => tracing::info!(
                "snapshot {}: pulled from {} ({} of {} links fetched, {} bytes)",
                p.snapshot.id,
                req.reference,
                p.links - p.links_cached,
                p.links,
                p.bytes_fetched
            ),
            Err(e) => tracing::warn!("pull of {} failed: {}", req.reference, e.message),
        }
        r.map(|result| TransferEvent::Pulled {
            result: Box::new(result),
        })
    }

    async fn pull_snapshot_inner(
        self: &Arc<Self>,
        req: &PullSnapshot,
        emit: Arc<Emitter<TransferEvent>>,
    ) -> Result<PullResult, EngineError> {
        let t0 = Instant::now();
        let opts = self.registry_options(
            &req.reference,
            req.username.clone().zip(req.password.clone()),
            req.insecure,
        )?;
        let remote = forkvm_artifact::fetch::resolve(&req.reference, &opts, emit.as_ref())
            .await
            .map_err(|e| fetch_error(&e))?;
        // Compatibility first: nothing has been written yet.
        let host = self.host_profile().await?;
        for l in &remote.links {
            if let Err(why) = forkvm_artifact::compat::check(&l.config.requires, &host) {
                return Err(EngineError::new(
                    ErrorKind::IncompatibleSnapshot,
                    format!(
                        "{} cannot be restored on this host: {}; nothing was written",
                        remote.session.canonical,
                        why.join("; ")
                    ),
                ));
            }
        }
        let plans: Vec<LinkPlan> = remote
            .links
            .iter()
            .map(|l| self.plan_link(l))
            .collect::<Result<_, _>>()?;
        let top_id = remote.top().config.id.clone();
        let top_cached = matches!(plans.last(), Some(LinkPlan::Have(_)));
        if !top_cached {
            self.check_tag(req.tag.as_deref())?;
        } else if let Some(t) = &req.tag {
            // Tags are sealed in the manifest: an existing snapshot keeps its own.
            let row = self.snapshot_row(&top_id)?;
            if row.tag.as_deref() != Some(t.as_str()) {
                return Err(EngineError::conflict(format!(
                    "this host already has snapshot {top_id} ({}); spawn it by id, or remove \
                     it and pull again to tag it {t:?}",
                    row.tag
                        .map_or("untagged".to_string(), |x| format!("tagged {x:?}"))
                )));
            }
        }
        let mut bytes = 0u64;
        let mut fetched = 0u32;
        let (image, mut image_staging) = match self.matching_image(&remote).await? {
            Some(name) => {
                emit.send(TransferEvent::Cached {
                    item: format!("image {name}"),
                });
                (name, None)
            }
            None if plans.iter().all(|p| matches!(p, LinkPlan::Have(_))) => {
                return Err(EngineError::conflict(format!(
                    "this host has snapshot {top_id} but not its image; remove the snapshot and pull again"
                )))
            }
            None => {
                let (st, n) = self.stage_image(&remote, emit.as_ref()).await?;
                bytes += n;
                fetched += remote.image.files[0].chunks.len() as u32;
                (st.name.clone(), Some(st))
            }
        };
        // Stage every missing link; the parent digests come from this host's
        // copies (existing, or sealed just now).
        let mut staged = Vec::new();
        let mut parent_digest: Option<String> = None;
        let mut cached = 0u32;
        for (l, plan) in remote.links.iter().zip(&plans) {
            match plan {
                LinkPlan::Have(d) => {
                    cached += 1;
                    emit.send(TransferEvent::Cached {
                        item: format!("snapshot {}", l.config.id),
                    });
                    parent_digest = Some(d.clone());
                }
                LinkPlan::Fetch => {
                    let is_top = l.config.id == top_id;
                    let (st, m, n) = self
                        .stage_link(
                            &remote,
                            l,
                            parent_digest.as_deref(),
                            &image,
                            if is_top { req.tag.as_deref() } else { None },
                            emit.as_ref(),
                        )
                        .await?;
                    bytes += n;
                    fetched += l.manifest.layers.len() as u32;
                    staged.push((st, m));
                    // Its digest is known once the store seals it at
                    // publication, below, where its child's is set.
                    parent_digest = None;
                }
            }
        }
        emit.send(TransferEvent::Phase {
            phase: "publishing".into(),
        });
        let image_created = image_staging.is_some();
        if let Some(st) = image_staging.take() {
            self.publish_image(st)?;
        }
        let mut last_digest: Option<String> = None;
        for (st, mut m) in staged {
            if let (Some(p), Some(d)) = (&mut m.parent, &last_digest) {
                p.manifest_sha256 = d.clone();
            }
            let store = self.store.clone();
            let published = tokio::task::spawn_blocking(move || store.publish(st, m))
                .await
                .map_err(|e| EngineError::internal(e.to_string()))?
                .map_err(crate::snapshot::store_err)?;
            last_digest = Some(published.digest.clone());
            let m = &published.manifest;
            self.db.set_snapshot_info(&m.id, &SnapshotInfo::default())?;
            self.db.insert_snapshot(&SnapshotRow {
                id: m.id.clone(),
                tag: m.tag.clone(),
                parent: m.parent.as_ref().map(|p| p.id.clone()),
                source: m.source.clone(),
                image: m.image.clone(),
                memory_mib: m.machine.memory_mib,
                cpus: m.machine.cpus,
                created_at: m.created_at.clone(),
                template_key: None,
                // Pulled snapshots are spawned from right away or kept: no
                // warm pool unless asked for.
                pool_size: Some(0),
                origin: Origin::Pull,
                pinned: false,
            })?;
        }
        let row = self.snapshot_row(&top_id)?;
        Ok(PullResult {
            snapshot: self.snapshot_view(&row)?,
            digest: remote.index_digest.clone(),
            links: remote.links.len() as u32,
            links_cached: cached,
            image_created,
            image,
            blobs_fetched: fetched,
            bytes_fetched: bytes,
            total_ms: t0.elapsed().as_millis() as u64,
        })
    }
}
