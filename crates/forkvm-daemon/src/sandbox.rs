//! The sandbox lifecycle: spawn, monitor, exec, remove, and re-attach after a
//! daemon restart.
//!
//! ```text
//!  POST /v1/sandboxes
//!      │ validate (image, limits)        → 4xx, nothing created
//!      ▼
//!  starting ── QEMU exits / boot timeout ──▶ error; row and files removed
//!      │ agent answers ping
//!      ▼
//!  running ─── QEMU exits (panic, kill) ──▶ failed (reason kept, runtime files removed)
//!      │ DELETE                                   │ DELETE
//!      ▼                                          ▼
//!   removed (process killed, files and row gone)
//! ```
//!
//! Each live sandbox has a monitor task that owns the wait for its QEMU. Any
//! exit the daemon did not ask for turns the sandbox into `failed` with a
//! reason read from the exit status and the serial console.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use forkvm_api::{codes, CreateSandbox, Sandbox, SandboxState, SpawnTimings};
use forkvm_qemu::process::{self, Launched};
use forkvm_qemu::spec::kernel_cmdline;
use forkvm_qemu::{MachineSpec, MemoryBackend};
use tokio::sync::watch;

use crate::agent::{self};
use crate::config::SandboxPaths;
use crate::db::SandboxRow;
use crate::error::ApiError;
use crate::failure::{console_tail, describe_status, died_while_booting, failure_reason};
use crate::images::BootReq;
use crate::manager::{Live, Manager, Phase, Waiter};
use crate::util::{self, ms};

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
    /// The API view of a row (with memory figures when asked and running).
    pub fn view(&self, r: SandboxRow, with_memory: bool) -> Sandbox {
        let memory = match (with_memory, r.state, r.pid) {
            (true, SandboxState::Running, Some(pid)) => util::memory_usage(pid),
            _ => None,
        };
        let disk = match (with_memory, r.state) {
            (true, SandboxState::Running) => self.disk_chain(&r.id),
            _ => None,
        };
        let usage = match (with_memory, r.state, r.pid) {
            (true, SandboxState::Running, Some(pid)) => crate::usage::usage(
                pid,
                &self.cfg.sandbox_paths(&r.id).dir,
                r.network.as_ref().map(|_| forkvm_net::TAP_NAME),
            ),
            _ => None,
        };
        let life = self.db.lifecycle(&r.id).unwrap_or_else(|e| {
            tracing::error!(sandbox = %r.id, "cannot read the lifecycle of {}: {e}", r.id);
            Default::default()
        });
        Sandbox {
            lifetime: crate::lifetime::lifetime_view(&life),
            metadata: life.metadata,
            env: life.env,
            paused: life.pause,
            limits: (!life.limits.is_empty()).then_some(life.limits),
            usage,
            disk,
            id: r.id,
            state: r.state,
            image: r.image,
            memory_mib: r.memory_mib,
            cpus: r.cpus,
            accel: r.accel,
            pid: r.pid,
            created_at: r.created_at,
            failure: r.failure,
            timings: r.timings,
            memory,
            snapshot: r.snapshot,
            network: r.network.as_ref().map(crate::net::SandboxNet::info),
        }
    }

    /// The stored row of a sandbox, or 404 (also for ids we could never
    /// have made, before they reach a path).
    fn row(&self, id: &str) -> Result<SandboxRow, ApiError> {
        if !util::valid_id(id) {
            return Err(ApiError::sandbox_not_found(id));
        }
        self.db
            .get(id)?
            .ok_or_else(|| ApiError::sandbox_not_found(id))
    }

    pub fn get(&self, id: &str) -> Result<Sandbox, ApiError> {
        Ok(self.view(self.row(id)?, true))
    }

    /// Every sandbox with all the given metadata pairs.
    pub fn list(
        &self,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<Sandbox>, ApiError> {
        Ok(self
            .db
            .list()?
            .into_iter()
            .map(|r| self.view(r, false))
            .filter(|s| crate::lifetime::matches(&s.metadata, metadata))
            .collect())
    }

    /// Check a spawn request against the limits and the installed images.
    fn validate(&self, req: &CreateSandbox) -> Result<BootReq, ApiError> {
        let l = &self.cfg.limits;
        let image = req.image.clone().unwrap_or_else(|| DEFAULT_IMAGE.into());
        if !forkvm_image::valid_image_name(&image) {
            return Err(ApiError::invalid(format!(
                "image name {image:?} is not valid: use letters, digits, '.', '-' and '_'"
            )));
        }
        let memory = req.memory_mib.unwrap_or(DEFAULT_MEMORY_MIB);
        if memory < MIN_MEMORY_MIB || memory > l.max_memory_mib {
            return Err(ApiError::invalid(format!(
                "memory_mib must be between {MIN_MEMORY_MIB} and {} (got {memory})",
                l.max_memory_mib
            )));
        }
        let cpus = req.cpus.unwrap_or(DEFAULT_CPUS);
        if cpus == 0 || cpus > l.max_cpus {
            return Err(ApiError::invalid(format!(
                "cpus must be between 1 and {} (got {cpus})",
                l.max_cpus
            )));
        }
        if !self.cfg.image_rootfs(&image).is_file() {
            let have = self.cfg.images();
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                codes::IMAGE_NOT_FOUND,
                format!(
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
                return Err(ApiError::internal(format!(
                    "guest {what} {} is missing; run scripts/setup.sh",
                    p.display()
                )));
            }
        }
        let initrd = std::fs::metadata(self.cfg.initrd()).map_or(0, |m| m.len());
        forkvm_qemu::spec::check_initrd_size(initrd).map_err(ApiError::internal)?;
        if self.db.count()? >= l.max_sandboxes {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::LIMIT_EXCEEDED,
                format!(
                    "the daemon already holds {} sandboxes (the limit); remove some with `forkvm rm`",
                    l.max_sandboxes
                ),
            ));
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
    pub async fn create(self: &Arc<Self>, req: CreateSandbox) -> Result<Created, ApiError> {
        let t0 = Instant::now();
        let n = u64::from(req.count.unwrap_or(1));
        let r = self.create_unmetered(req).await;
        crate::metrics::METRICS.spawned(n, r.is_ok(), t0.elapsed().as_secs_f64());
        r
    }

    async fn create_unmetered(self: &Arc<Self>, req: CreateSandbox) -> Result<Created, ApiError> {
        let t0 = Instant::now();
        // Checked first: a bad label, timeout or limit creates nothing.
        let life = crate::lifetime::from_request(&req)?;
        crate::limits::check(&life.limits, self.cfg.limits.max_cpus)?;
        let n = match req.count {
            None => 1,
            Some(c) if (1..=1000).contains(&c) => c,
            Some(c) => {
                return Err(ApiError::invalid(format!(
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
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                codes::LIMIT_EXCEEDED,
                format!(
                    "{n} more sandboxes would pass the limit of {} ({free} free); remove some with `forkvm rm`",
                    self.cfg.limits.max_sandboxes
                ),
            ));
        }
        let sandboxes = if let Some(snap_ref) = &req.snapshot {
            if req.image.is_some()
                || req.memory_mib.is_some()
                || req.cpus.is_some()
                || req.disk_size.is_some()
            {
                return Err(ApiError::invalid(
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
            let nic = crate::net::Net::has_nic(&snap.manifest.machine.cmdline);
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
                    .snapshot_by_template(&crate::snapshot::template_key(self, &boot))?
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
        if let Err(e) = self.start_lifecycle(&ids, &life).await {
            for id in &ids {
                let _ = self.remove(id).await;
            }
            return Err(e);
        }
        // Shown with what was just stored (nothing to re-read otherwise).
        let sandboxes = sandboxes
            .into_iter()
            .map(
                |s| match self.db.get(&s.id).ok().filter(|_| !life.is_empty()) {
                    Some(Some(r)) => Sandbox {
                        timings: s.timings.clone(),
                        ..self.view(r, false)
                    },
                    _ => s,
                },
            )
            .collect::<Vec<_>>();
        Ok(match req.count {
            None => Created::One(Box::new(
                sandboxes
                    .into_iter()
                    .next()
                    .ok_or_else(|| ApiError::internal("no sandbox was spawned"))?,
            )),
            Some(_) => Created::Batch(forkvm_api::SandboxBatch {
                sandboxes,
                total_ms: ms(t0.elapsed()),
            }),
        })
    }

    fn net_request(
        &self,
        req: &CreateSandbox,
        nic: bool,
        n: u32,
    ) -> Result<crate::net::NetRequest, ApiError> {
        self.net.validate(
            req.network,
            req.ports.as_deref(),
            req.egress.as_deref(),
            req.wait_for_network,
            nic,
            n,
        )
    }

    /// Spawn from the image's boot template, creating it from a cold boot the
    /// first time.
    async fn spawn_via_template(
        self: &Arc<Self>,
        boot: &BootReq,
        n: u32,
        net: &crate::net::NetRequest,
    ) -> Result<Vec<Sandbox>, ApiError> {
        let image = boot.image.as_str();
        let key = crate::snapshot::template_key(self, boot);
        if let Some(t) = self.db.snapshot_by_template(&key)? {
            match self.open_verified(&t.id).await {
                Ok(snap) => return self.spawn_clones(&snap, n, net).await,
                Err(e) => {
                    // A broken template is replaced, not fatal.
                    tracing::warn!(
                        "boot template {} is unusable ({}); making a new one",
                        t.id,
                        e.message
                    );
                    let _ = self.db.delete_snapshot(&t.id);
                }
            }
        }
        let claimed = self
            .templating
            .lock()
            .map(|mut s| s.insert(key.clone()))
            .unwrap_or(false);
        if !claimed {
            // Someone else is making this template: wait for it, then clone
            // it, so every default sandbox is a clone (diff-capable, sharing
            // its pages) whoever asked first.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(300)
                && self
                    .templating
                    .lock()
                    .map(|s| s.contains(&key))
                    .unwrap_or(false)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if let Some(t) = self.db.snapshot_by_template(&key)? {
                if let Ok(snap) = self.open_verified(&t.id).await {
                    return self.spawn_clones(&snap, n, net).await;
                }
            }
            let mut v = Vec::new();
            for _ in 0..n {
                v.push(self.cold_boot(boot, net).await?);
            }
            return Ok(v);
        }
        // The template's source only makes the template: it needs a NIC
        // (so its clones have one) but no way out.
        let first = match self.cold_boot(boot, &crate::net::NetRequest::none()).await {
            Ok(f) => f,
            Err(e) => {
                if let Ok(mut s) = self.templating.lock() {
                    s.remove(&key);
                }
                return Err(e);
            }
        };
        let t = Instant::now();
        let made = self
            .snapshot(
                &first.id,
                None,
                Some(key.clone()),
                crate::snapshot::Save::Stopped,
            )
            .await;
        if let Ok(mut s) = self.templating.lock() {
            s.remove(&key);
        }
        let template_ms = ms(t.elapsed());
        let clones = match made {
            Ok(snap) => {
                // The booted sandbox only made the template: every sandbox
                // handed out is a clone of it, so they all share its pages
                // and can all be branched in `diff` mode.
                match self.open_verified(&snap.id).await {
                    Ok(s) => self.spawn_clones(&s, n, net).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match clones {
            Ok(mut v) => {
                if let Err(e) = self.remove(&first.id).await {
                    tracing::warn!(
                        "could not remove template source {}: {}",
                        first.id,
                        e.message
                    );
                }
                if let (Some(c), Some(b)) = (
                    v.first_mut().and_then(|c| c.timings.as_mut()),
                    first.timings.as_ref(),
                ) {
                    c.boot_ms = b.boot_ms;
                    c.template_ms = Some(template_ms);
                    c.total_ms += b.total_ms + template_ms;
                }
                Ok(v)
            }
            Err(e) => {
                tracing::warn!("could not make the boot template of {image}: {}", e.message);
                // The template failed: hand out its source, with the network
                // the caller asked for, and cold boots for the rest.
                if let Err(e) = self.connect_booted(&first.id, net).await {
                    let _ = self.remove(&first.id).await;
                    return Err(e);
                }
                let first = self.get(&first.id)?;
                let mut v = vec![first];
                for _ in 1..n {
                    v.push(self.cold_boot(boot, net).await?);
                }
                Ok(v)
            }
        }
    }

    /// Boot a new sandbox from its image and wait until its agent answers.
    pub async fn cold_boot(
        self: &Arc<Self>,
        boot: &BootReq,
        net: &crate::net::NetRequest,
    ) -> Result<Sandbox, ApiError> {
        let (image, memory_mib, cpus) = (boot.image.as_str(), boot.memory_mib, boot.cpus);
        let t0 = Instant::now();
        let id = util::new_id("sb");
        let paths = self.cfg.sandbox_paths(&id);
        let row = SandboxRow {
            id: id.clone(),
            state: SandboxState::Starting,
            image: image.to_string(),
            memory_mib,
            cpus,
            accel: self.accel.accel.to_string(),
            pid: None,
            created_at: util::now_rfc3339(),
            failure: None,
            timings: None,
            snapshot: None,
            network: None,
        };
        self.db.insert(&row)?;
        let r = async {
            let mut t = self.boot(&id, boot, &paths, t0).await?;
            // The image's disk size and start command (crate::images::start).
            self.after_boot(&id, boot).await?;
            let (setup_ms, ready_ms) = self.connect_booted(&id, net).await?;
            t.network_ms = setup_ms;
            t.network_ready_ms = ready_ms;
            t.total_ms = ms(t0.elapsed());
            self.db
                .set_running(&id, self.live(&id).map_or(0, |l| l.pid), &t)?;
            Ok(t)
        }
        .await;
        self.conclude_spawn(&id, r).await
    }

    /// Give a booted sandbox (its namespace made before QEMU started) the
    /// network `net` asks for, and wait for the guest to use it. Returns the
    /// set-up and ready times.
    pub(crate) async fn connect_booted(
        &self,
        id: &str,
        net: &crate::net::NetRequest,
    ) -> Result<(Option<f64>, Option<f64>), ApiError> {
        let Some(live) = self.live(id) else {
            return Err(ApiError::conflict(format!("sandbox {id} is not running")));
        };
        if !crate::net::Net::has_nic(&live.cmdline) {
            return Ok((None, None));
        }
        let t = Instant::now();
        let n = self.net.setup(id, net).await?;
        self.db.set_network(id, Some(&n))?;
        let setup_ms = ms(t.elapsed());
        if !net.wait {
            return Ok((Some(setup_ms), None));
        }
        let t = Instant::now();
        let conn = live.agent().await.map_err(|e| {
            ApiError::new(StatusCode::BAD_GATEWAY, codes::GUEST_ERROR, e.to_string())
        })?;
        crate::net::Net::probe_guest(&conn).await?;
        Ok((Some(setup_ms), Some(ms(t.elapsed()))))
    }

    /// The end of every spawn: the sandbox with its timings, or, on failure,
    /// nothing left of it.
    pub(crate) async fn conclude_spawn(
        &self,
        id: &str,
        r: Result<SpawnTimings, ApiError>,
    ) -> Result<Sandbox, ApiError> {
        match r {
            Ok(timings) => {
                let mut row = self.db.get(id)?.ok_or_else(|| {
                    ApiError::internal("the sandbox row vanished during its spawn")
                })?;
                row.timings = Some(timings);
                Ok(self.view(row, false))
            }
            Err(e) => {
                let from = match self.db.get(id) {
                    Ok(Some(SandboxRow {
                        snapshot: Some(s), ..
                    })) => format!("restore from snapshot {s}"),
                    _ => "cold boot".to_string(),
                };
                tracing::warn!(sandbox = %id, code = e.code, "spawn of sandbox {id} ({from}) failed: {}", e.message);
                self.discard_failed_spawn(id).await;
                Err(e)
            }
        }
    }

    /// Nothing of a failed spawn stays behind: process, files, row.
    pub(crate) async fn discard_failed_spawn(&self, id: &str) {
        let live = self.live_map().remove(id);
        if let Some(live) = live {
            live.set_phase(Phase::Removing);
            process::kill(live.pid, libc::SIGKILL);
            live.wait_exit(Duration::from_secs(10)).await;
        }
        let net = self.db.get(id).ok().flatten().and_then(|r| r.network);
        self.net.teardown(id, net.as_ref()).await;
        self.cfg.sandbox_paths(id).remove_all();
        let _ = self.db.delete(id);
    }

    async fn boot(
        self: &Arc<Self>,
        id: &str,
        boot: &BootReq,
        paths: &SandboxPaths,
        t0: Instant,
    ) -> Result<SpawnTimings, ApiError> {
        let (image, memory_mib, cpus) = (boot.image.as_str(), boot.memory_mib, boot.cpus);
        let io = |what: &str, e: std::io::Error| {
            ApiError::internal(format!(
                "cannot create {what}: {e}; check free space and permissions"
            ))
        };
        std::fs::create_dir_all(&paths.dir).map_err(|e| io("the sandbox directory", e))?;
        std::fs::create_dir_all(&self.cfg.run_dir).map_err(|e| io("the RAM directory", e))?;
        forkvm_qemu::disk::create_overlay_sized(
            &self.cfg.image_rootfs(image),
            &paths.disk,
            boot.disk_size,
        )
        .await
        .map_err(|e| ApiError::internal(format!("cannot create the root disk: {e}")))?;
        let netns = if self.net.available() {
            Some(self.net.create_ns(id).await?)
        } else {
            None
        };
        let prepare_ms = ms(t0.elapsed());
        let extra = if netns.is_some() {
            self.net.cmdline()
        } else {
            String::new()
        };

        let spec = MachineSpec {
            name: id.to_string(),
            machine: forkvm_qemu::spec::MACHINE.to_string(),
            accel: self.accel.accel,
            memory_mib,
            cpus,
            kernel: self.cfg.kernel(),
            initrd: self.cfg.initrd(),
            cmdline: kernel_cmdline(id, self.accel.accel, &extra),
            memory: MemoryBackend {
                path: paths.mem.clone(),
                share: true,
                readonly: false,
            },
            root_disk: paths.disk.clone(),
            agent_socket: paths.agent.clone(),
            qmp_socket: paths.qmp.clone(),
            console_log: paths.console.clone(),
            incoming: None,
            device_state_only: false,
            no_configuration_section: false,
            nic: netns.as_ref().map(|_| crate::net::Net::nic()),
            netns,
            later_reads: vec![],
        };
        let t1 = Instant::now();
        let Launched { child, pid, qmp } = self.launch_qemu(&spec, paths).await?;
        // The QMP session is not needed after start-up; closing it is fine
        // (QEMU's QMP server accepts a new client later).
        drop(qmp);
        self.db.set_pid(id, pid)?;
        let qemu_start_ms = ms(t1.elapsed());
        let live = self.attach(
            id,
            pid,
            paths.clone(),
            Phase::Booting,
            Waiter::Child(child),
            spec.cmdline.clone(),
        );

        let t2 = Instant::now();
        let deadline = Duration::from_secs(self.cfg.boot_timeout_secs);
        let mut exited = live.exited.clone();
        let mut exited_after = live.exited.clone();
        // Ok(agent answer) or Err(QEMU's exit reason); handled after the
        // select so that no watch guard is held across an await.
        let outcome = tokio::select! {
            r = agent::wait_ready(&paths.agent, deadline) => Ok(r),
            r = exited.wait_for(|e| e.is_some()) => {
                Err(r.map(|g| g.clone().unwrap_or_default()).unwrap_or_default())
            }
        };
        let conn = match outcome {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                // The agent's socket closes the moment QEMU exits, a little
                // before the daemon reaps it: wait for the exit so the error
                // says why instead of "connection closed".
                return Err(
                    match exit_within(&mut exited_after, Duration::from_secs(3)).await {
                        Some(why) => died_while_booting(&why, paths),
                        None => ApiError::new(
                            StatusCode::GATEWAY_TIMEOUT,
                            codes::GUEST_TIMEOUT,
                            format!(
                                "the guest did not come up: {e}; QEMU is still running, so the guest may be hung. Last console lines:\n{}",
                                console_tail(paths)
                            ),
                        ),
                    },
                );
            }
            Err(why) => return Err(died_while_booting(&why, paths)),
        };
        *live.agent.lock().await = Some(conn);
        let boot_ms = ms(t2.elapsed());
        let timings = SpawnTimings {
            prepare_ms,
            qemu_start_ms,
            boot_ms,
            total_ms: ms(t0.elapsed()),
            ..Default::default()
        };
        // Only now does an unexpected exit count as a failure of a running
        // sandbox; before this the spawn itself reports it.
        if live.set_phase(Phase::Running) != Phase::Booting {
            return Err(ApiError::conflict(
                "the sandbox was removed while it booted",
            ));
        }
        self.db.set_running(id, pid, &timings)?;
        Ok(timings)
    }

    /// Start QEMU for a sandbox and leave its pid in `qemu.pid`, by which a
    /// restarted daemon finds processes that have no row (see
    /// `reap_orphans`).
    pub(crate) async fn launch_qemu(
        &self,
        spec: &MachineSpec,
        paths: &SandboxPaths,
    ) -> Result<Launched, ApiError> {
        let jail = self.jail.prepare(&spec.name, spec, paths)?;
        let l = process::launch(
            &self.cfg.qemu,
            spec,
            &paths.qemu_log,
            Duration::from_secs(30),
            jail,
        )
        .await
        .map_err(|e| {
            self.jail.release(&spec.name);
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                codes::QEMU_FAILED,
                e.to_string(),
            )
        })?;
        // Written aside and renamed, so that a reader (crash recovery, or a
        // test looking for pooled QEMUs) never sees the file empty.
        let tmp = paths.dir.join("qemu.pid.tmp");
        if std::fs::write(&tmp, l.pid.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, paths.dir.join("qemu.pid"));
        }
        Ok(l)
    }

    /// Register a live sandbox and start its monitor.
    pub(crate) fn attach(
        self: &Arc<Self>,
        id: &str,
        pid: u32,
        paths: SandboxPaths,
        phase: Phase,
        waiter: Waiter,
        cmdline: String,
    ) -> Arc<Live> {
        let (tx, rx) = watch::channel(None);
        let live = Arc::new(Live {
            id: id.to_string(),
            pid,
            phase: Mutex::new(phase),
            agent: tokio::sync::Mutex::new(None),
            exited: rx,
            paths,
            op_lock: tokio::sync::Mutex::new(()),
            cmdline,
            streaming: std::sync::atomic::AtomicBool::new(false),
            stream_lock: tokio::sync::Mutex::new(()),
            keep_stopped: std::sync::atomic::AtomicBool::new(false),
        });
        self.live_map().insert(id.to_string(), live.clone());
        let me = self.clone();
        let l2 = live.clone();
        tokio::spawn(async move {
            let status = match waiter {
                Waiter::Child(mut c) => match c.wait().await {
                    Ok(s) => describe_status(s),
                    Err(e) => format!("could not wait for QEMU: {e}"),
                },
                Waiter::Foreign => {
                    process::wait_foreign_exit(l2.pid, &l2.id).await;
                    "QEMU exited (started by an earlier daemon, so its exit status is unknown)"
                        .to_string()
                }
            };
            me.jail.release(&l2.id);
            let reason = failure_reason(&status, &l2.paths);
            let _ = tx.send(Some(reason.clone()));
            if me.on_exit(&l2, &reason) {
                // A failed sandbox keeps its record, not its network.
                let net = me.db.get(&l2.id).ok().flatten().and_then(|r| r.network);
                me.net.teardown(&l2.id, net.as_ref()).await;
                let _ = me.db.set_network(&l2.id, None);
            }
        });
        live
    }

    /// QEMU exited. If nobody asked for that, the sandbox has failed (and
    /// `true` is returned).
    fn on_exit(&self, live: &Live, reason: &str) -> bool {
        if live.phase() != Phase::Running {
            return false; // a removal or a failing spawn handles its own cleanup
        }
        tracing::warn!("sandbox {} failed: {reason}", live.id);
        if let Err(e) = self.db.set_failed(&live.id, reason) {
            tracing::error!("cannot record failure of {}: {e}", live.id);
        }
        live.paths.remove_runtime();
        self.live_map().remove(&live.id);
        true
    }

    /// Remove a sandbox: kill its VM and delete its files and record.
    pub async fn remove(self: &Arc<Self>, id: &str) -> Result<(), ApiError> {
        let row = self.row(id)?;
        if let Some(live) = self.live(id) {
            match live.set_phase(Phase::Removing) {
                Phase::Booting => {
                    live.set_phase(Phase::Booting);
                    return Err(ApiError::conflict(format!(
                        "sandbox {id} is still starting; remove it once the spawn returns"
                    )));
                }
                Phase::Removing => {
                    return Err(ApiError::conflict(format!(
                        "sandbox {id} is already being removed"
                    )))
                }
                Phase::Running => {}
            }
            self.kill_live(&live).await?;
        } else if row.state == SandboxState::Starting {
            // Its spawn is still preparing (no QEMU attached yet): removing
            // its files now would fail that spawn halfway. (Rows left
            // `starting` by a dead daemon are swept at start, so this spawn
            // is one of ours and will finish.)
            return Err(ApiError::conflict(format!(
                "sandbox {id} is still starting; remove it once the spawn returns"
            )));
        } else if let (SandboxState::Running | SandboxState::Starting, Some(pid)) =
            (row.state, row.pid)
        {
            // Not attached (should not happen after recovery), but never leave
            // a VM behind.
            if process::is_our_qemu(pid, id) {
                process::kill(pid, libc::SIGKILL);
            }
        }
        self.net.teardown(id, row.network.as_ref()).await;
        self.cfg.sandbox_paths(id).remove_all();
        self.db.delete(id)?;
        // The saved states of its pauses go with it.
        self.drop_pause_snapshots(id).await;
        // Its disk files may have been the last to name a removed snapshot's
        // layer.
        self.collect_layers().await;
        // And it may have been the last user of a branch point.
        self.poke_gc();
        Ok(())
    }

    /// End a sandbox's QEMU (its phase already `Removing`) and forget it.
    pub(crate) async fn kill_live(&self, live: &Live) -> Result<(), ApiError> {
        process::kill(live.pid, libc::SIGKILL);
        if !live.wait_exit(Duration::from_secs(15)).await {
            return Err(ApiError::internal(format!(
                "QEMU (pid {}) of sandbox {} did not exit after SIGKILL",
                live.pid, live.id
            )));
        }
        self.live_map().remove(&live.id);
        Ok(())
    }

    /// A running sandbox, or a clear error.
    pub fn running(&self, id: &str) -> Result<Arc<Live>, ApiError> {
        let row = self.get(id)?;
        match row.state {
            SandboxState::Running => self.live(id).ok_or_else(|| {
                ApiError::conflict(format!("sandbox {id} is not attached to this daemon"))
            }),
            SandboxState::Starting => Err(ApiError::conflict(format!(
                "sandbox {id} is still starting"
            ))),
            SandboxState::Failed => Err(ApiError::conflict(format!(
                "sandbox {id} has failed ({}); remove it with `forkvm rm {id}`",
                row.failure.unwrap_or_default()
            ))),
            SandboxState::Paused => Err(ApiError::conflict(format!(
                "sandbox {id} is paused; resume it first (`forkvm resume {id}`)"
            ))),
        }
    }

    /// Re-attach to the sandboxes of an earlier daemon (run once at start).
    pub async fn recover(self: &Arc<Self>) -> Result<(), ApiError> {
        for row in self.db.list()? {
            let paths = self.cfg.sandbox_paths(&row.id);
            let alive = row.pid.is_some_and(|p| process::is_our_qemu(p, &row.id));
            match (row.state, row.pid) {
                (SandboxState::Running, Some(pid)) if alive => {
                    tracing::info!("re-attached to sandbox {} (pid {pid})", row.id);
                    let cmdline = process::append_arg(pid).unwrap_or_default();
                    // A daemon that died in the middle of a snapshot left the
                    // source stopped: resume it.
                    if let Ok(qmp) =
                        forkvm_qemu::Qmp::connect(&paths.qmp, Duration::from_secs(5)).await
                    {
                        if let Ok(st) = qmp.status().await {
                            if st == "paused" || st == "postmigrate" || st == "io-error" {
                                tracing::warn!(
                                    "sandbox {} was left {st} by a crash; resuming it",
                                    row.id
                                );
                                let _ = qmp.execute("cont", None).await;
                            }
                        }
                    }
                    self.attach(
                        &row.id,
                        pid,
                        paths,
                        Phase::Running,
                        Waiter::Foreign,
                        cmdline,
                    );
                }
                (SandboxState::Starting, pid) if self.resuming(&row.id) => {
                    // A resume died with the old daemon: the sandbox is
                    // still paused, its saved state untouched.
                    if let Some(pid) = pid.filter(|_| alive) {
                        process::kill(pid, libc::SIGKILL);
                    }
                    self.back_to_paused(&row.id, &paths).await;
                }
                (SandboxState::Starting, pid) => {
                    // The spawn request died with the old daemon; its caller
                    // never got an id, so nobody can use this sandbox.
                    if let Some(pid) = pid.filter(|_| alive) {
                        process::kill(pid, libc::SIGKILL);
                        process::wait_foreign_exit(pid, &row.id).await;
                    }
                    self.jail.release(&row.id);
                    paths.remove_all();
                    self.db.delete(&row.id)?;
                }
                (SandboxState::Running, _) => {
                    let reason = "QEMU exited while the daemon was not running";
                    self.db.set_failed(&row.id, reason)?;
                    // Its namespace and pool claim go in `reconcile` below.
                    self.db.set_network(&row.id, None)?;
                    paths.remove_runtime();
                    self.jail.release(&row.id);
                }
                (SandboxState::Failed, _) => paths.remove_runtime(),
                (SandboxState::Paused, _) => {}
            }
        }
        self.reap_orphans();
        // Cgroups of QEMUs that ended while no daemon watched them.
        self.jail.sweep();
        let running: Vec<(String, Option<crate::net::SandboxNet>)> = self
            .db
            .list()?
            .into_iter()
            .filter(|r| r.state == SandboxState::Running)
            .map(|r| (r.id, r.network))
            .collect();
        self.net.reconcile(&running).await;
        Ok(())
    }
}

/// The exit reason of a VM if it exits within `d`.
async fn exit_within(rx: &mut watch::Receiver<Option<String>>, d: Duration) -> Option<String> {
    let r = tokio::time::timeout(d, rx.wait_for(|e| e.is_some())).await;
    match r {
        Ok(Ok(g)) => g.clone(),
        _ => None,
    }
}
