//! Spawning: check a request, then restore from a snapshot, clone the
//! image's boot template, or cold-boot; a failed spawn leaves nothing.
//!
//! ```text
//!  POST /v1/sandboxes
//!      │ validate (image, limits)        → 4xx, nothing created
//!      ▼
//!  starting ── QEMU exits / boot timeout ──▶ error; row and files removed
//!      │ agent answers ping
//!      ▼
//!  running
//! ```

use std::sync::Arc;
use std::time::Instant;

use forkvm_api::{CreateSandbox, Sandbox};

use crate::error::{EngineError, ErrorKind, HintAction};
use crate::images::BootReq;
use crate::manager::Manager;
use crate::util::ms;

/// Defaults for a spawn request.
pub const DEFAULT_IMAGE: &str = "default";
pub const DEFAULT_MEMORY_MIB: u32 = 512;
pub const DEFAULT_CPUS: u32 = 1;
/// Smallest guest the default kernel and image boot in.
pub const MIN_MEMORY_MIB: u32 = 128;

/// What a spawn request produced.
pub enum Created {
    One(Box<Sandbox>),
    Batch(forkvm_api::SandboxBatch),
}

impl Manager {
    /// Check a spawn request against the limits and the installed images.
    pub fn validate(&self, req: &CreateSandbox) -> Result<BootReq, EngineError> {
        let l = &self.cfg.limits;
        let image = req.image.clone().unwrap_or_else(|| DEFAULT_IMAGE.into());
        if !forkvm_image::valid_image_name(&image) {
            return Err(EngineError::invalid(format!(
                "image name {image:?} is not valid: use letters, digits, '.', '-' and '_'"
            )));
        }
        let memory = req.memory_mib.unwrap_or(DEFAULT_MEMORY_MIB);
        if memory < MIN_MEMORY_MIB || memory > l.max_memory_mib {
            return Err(EngineError::invalid(format!(
                "memory_mib must be between {MIN_MEMORY_MIB} and {} (got {memory})",
                l.max_memory_mib
            )));
        }
        let cpus = req.cpus.unwrap_or(DEFAULT_CPUS);
        if cpus == 0 || cpus > l.max_cpus {
            return Err(EngineError::invalid(format!(
                "cpus must be between 1 and {} (got {cpus})",
                l.max_cpus
            )));
        }
        if !self.cfg.image_rootfs(&image).is_file() {
            let have = self.cfg.images();
            return Err(EngineError::new(ErrorKind::ImageNotFound, format!(
                    "image {image:?} not found; available: {}. Build the default image with scripts/setup.sh",
                    if have.is_empty() { "none".to_string() } else { have.join(", ") }
                ),
            ));
        }
        for (what, p) in [
            ("kernel", self.cfg.kernel()),
            ("initramfs", self.cfg.initrd()),
        ] {
            if !p.is_file() {
                return Err(EngineError::internal(format!(
                    "guest {what} {} is missing; run scripts/setup.sh",
                    p.display()
                )));
            }
        }
        let initrd = std::fs::metadata(self.cfg.initrd()).map_or(0, |m| m.len());
        forkvm_qemu::spec::check_initrd_size(initrd).map_err(EngineError::internal)?;
        if self.db.count()? >= l.max_sandboxes {
            return Err(EngineError::new(
                ErrorKind::LimitExceeded,
                format!(
                    "the daemon already holds {} sandboxes (the limit)",
                    l.max_sandboxes
                ),
            )
            .hint(HintAction::RemoveSandboxes));
        }
        let disk_size = self.check_disk_size(&image, req.disk_size)?;
        Ok(BootReq {
            image,
            memory_mib: memory,
            cpus,
            disk_size,
        })
    }

    /// Handle `POST /v1/sandboxes`: from a snapshot, from the image's boot
    /// template, or by a cold boot.
    pub async fn create(self: &Arc<Self>, req: CreateSandbox) -> Result<Created, EngineError> {
        let t0 = Instant::now();
        let n = u64::from(req.count.unwrap_or(1));
        let r = self.create_unmetered(req).await;
        crate::metrics::METRICS.spawned(n, r.is_ok(), t0.elapsed().as_secs_f64());
        r
    }

    pub async fn create_unmetered(
        self: &Arc<Self>,
        req: CreateSandbox,
    ) -> Result<Created, EngineError> {
        let t0 = Instant::now();
        // Checked first: a bad label, timeout or limit creates nothing.
        let life = crate::lifetime::from_request(&req)?;
        crate::limits::check(&life.limits, self.cfg.limits.max_cpus)?;
        let n = match req.count {
            None => 1,
            Some(c) if (1..=1000).contains(&c) => c,
            Some(c) => {
                return Err(EngineError::invalid(format!(
                    "count must be between 1 and 1000 (got {c})"
                )))
            }
        };
        let free = self
            .cfg
            .limits
            .max_sandboxes
            .saturating_sub(self.db.count()?);
        if n > free {
            return Err(EngineError::new(
                ErrorKind::LimitExceeded,
                format!(
                    "{n} more sandboxes would pass the limit of {} ({free} free)",
                    self.cfg.limits.max_sandboxes
                ),
            )
            .hint(HintAction::RemoveSandboxes));
        }
        let volumes = match &req.volumes {
            Some(v) if !v.is_empty() => Some(self.resolve_volumes(v)?),
            _ => None,
        };
        let sandboxes = if let Some(snap_ref) = &req.snapshot {
            if req.image.is_some()
                || req.memory_mib.is_some()
                || req.cpus.is_some()
                || req.disk_size.is_some()
            {
                return Err(EngineError::invalid(
                    "a snapshot fixes the image, memory, cpus and disk: omit image, memory_mib, \
                     cpus and disk_size",
                ));
            }
            let row = self.snapshot_row(snap_ref)?;
            let v = self.snapshot_view(&row)?;
            let _admitted = self.admit(
                u64::from(n) * crate::admission::clone_estimate_mib(&v.sizes, &v.kind),
                "spawn",
            )?;
            // Held until the sandbox rows exist: they keep it from then on.
            let _lease = self.gc_lease(&row.id)?;
            let snap = self.open_verified(&row.id).await?;
            if volumes.is_some() && snap.manifest.volumes.is_some() {
                return Err(EngineError::invalid(format!(
                    "snapshot {} has volumes of its own, which its clones get; omit volumes",
                    row.id
                )));
            }
            if volumes.is_some() && !snap.manifest.machine.volume_port {
                return Err(EngineError::invalid(format!(
                    "snapshot {} was taken before volumes existed and cannot mount them; spawn \
                     from an image, or from a snapshot taken since",
                    row.id
                )));
            }
            let nic = snap.manifest.machine.nic.is_some();
            let net = self.net_request(&req, nic, n)?;
            self.spawn_clones(&snap, n, &net).await?
        } else {
            let boot = self.validate(&req)?;
            let net = self.net_request(&req, self.net.available(), n)?;
            // A clone of an existing boot template maps what the template
            // touched; a cold boot (or the template's own) may touch it all.
            let template = match req.use_template {
                Some(false) => None,
                _ => self
                    .db
                    .snapshot_by_template(&crate::template::template_key(self, &boot))?
                    .and_then(|t| self.snapshot_view(&t).ok()),
            };
            let each = match &template {
                Some(v) => crate::admission::clone_estimate_mib(&v.sizes, &v.kind),
                None => u64::from(boot.memory_mib),
            };
            let _admitted = self.admit(u64::from(n) * each, "spawn")?;
            if req.use_template == Some(false) {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(self.cold_boot(&boot, &net).await?);
                }
                v
            } else {
                self.spawn_via_template(&boot, n, &net).await?
            }
        };
        let ids: Vec<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
        if let Some(v) = &volumes {
            for id in &ids {
                if let Err(e) = self.attach_volumes(id, v).await {
                    tracing::warn!(sandbox = %id, "volumes of sandbox {id} failed: {}", e.message);
                    for id in &ids {
                        let _ = self.remove(id).await;
                    }
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.start_lifecycle(&ids, &life).await {
            for id in &ids {
                let _ = self.remove(id).await;
            }
            return Err(e);
        }
        // Shown with what was just stored (nothing to re-read otherwise).
        let sandboxes = sandboxes
            .into_iter()
            .map(|s| {
                match self
                    .db
                    .get(&s.id)
                    .ok()
                    .filter(|_| !life.is_empty() || volumes.is_some())
                {
                    Some(Some(r)) => Sandbox {
                        timings: s.timings.clone(),
                        ..self.view(r, false)
                    },
                    _ => s,
                }
            })
            .collect::<Vec<_>>();
        Ok(match req.count {
            None => Created::One(Box::new(
                sandboxes
                    .into_iter()
                    .next()
                    .ok_or_else(|| EngineError::internal("no sandbox was spawned"))?,
            )),
            Some(_) => Created::Batch(forkvm_api::SandboxBatch {
                sandboxes,
                total_ms: ms(t0.elapsed()),
            }),
        })
    }

    pub fn net_request(
        &self,
        req: &CreateSandbox,
        nic: bool,
        n: u32,
    ) -> Result<crate::net::NetRequest, EngineError> {
        self.net.validate(
            req.network,
            req.ports.as_deref(),
            req.egress.as_deref(),
            req.allow_host,
            req.wait_for_network,
            nic,
            n,
        )
    }
}
