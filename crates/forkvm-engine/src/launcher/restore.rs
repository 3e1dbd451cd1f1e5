//! Spawning from a snapshot: start QEMU with `-incoming defer` (or take one
//! from the warm pool), load the device state, resume, and give the clone
//! its own identity through the agent before anything else runs in it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::{Sandbox, SandboxState, SpawnTimings};
use forkvm_qemu::process::Launched;
use forkvm_qemu::{migrate, MachineSpec, MemoryBackend};
use forkvm_store::Snapshot as StoredSnapshot;

use crate::agent::{self, AgentError};
use crate::config::SandboxPaths;
use crate::db::SandboxRow;
use crate::error::{EngineError, ErrorKind};
use crate::manager::{Live, Manager, Phase, Prepared, Waiter};
use crate::snapshot::{entropy, hex_random, kind, qemu_err, DEVICES_ONLY};
use crate::util::{self, ms};

/// Does the snapshot's device state start with a configuration section?
/// (Streams written by older QEMUs, or with it turned off, do not.)
fn has_configuration(snap: &StoredSnapshot) -> bool {
    let mut head = [0u8; 9];
    let n = std::fs::File::open(snap.path(forkvm_store::DEVICE_STATE))
        .and_then(|f| {
            use std::os::unix::fs::FileExt;
            f.read_at(&mut head, 0)
        })
        .unwrap_or(0);
    migrate::has_configuration(&head[..n])
}

/// The migration capabilities the snapshot's stream was written with. A
/// devices-only stream carries no RAM and no capability subsection, so the
/// validated capabilities stay off for it; a live save's stream (of any
/// kind: a clone's is a diff) was written with mapped-ram and without
/// x-ignore-shared.
async fn set_restore_capabilities(
    qmp: &forkvm_qemu::Qmp,
    m: &forkvm_store::Manifest,
) -> Result<(), EngineError> {
    let devices_only = m.state_format.as_deref() == Some(DEVICES_ONLY);
    let mapped_ram = m.ram_format.as_deref() == Some("mapped-ram");
    let shared = kind(m) == "shared";
    migrate::set_capabilities(
        qmp,
        &[
            ("x-ignore-shared", shared && !devices_only && !mapped_ram),
            ("mapped-ram", mapped_ram),
        ],
    )
    .await
    .map_err(|e| qemu_err("cannot set migration capabilities", e))
}

impl Manager {
    /// Start a QEMU for a snapshot, waiting in `-incoming defer`.
    pub async fn prepare_restore(
        &self,
        snap: &StoredSnapshot,
        id: &str,
    ) -> Result<Prepared, EngineError> {
        let t0 = Instant::now();
        let paths = self.cfg.sandbox_paths(id);
        // Each step undoes what the ones before it made if it fails, so a
        // failed prepare leaves no directory, namespace or QEMU behind.
        let memory = match self.restore_files(snap, &paths).await {
            Ok(m) => m,
            Err(e) => {
                paths.remove_all();
                return Err(e);
            }
        };
        let netns = if snap.manifest.machine.nic.is_some() {
            match self.net.create_ns(id).await {
                Ok(p) => Some(p),
                Err(e) => {
                    paths.remove_all();
                    return Err(e);
                }
            }
        } else {
            None
        };
        let spec = self.restore_spec(snap, id, &paths, memory, netns);
        let prepare_ms = ms(t0.elapsed());
        let t1 = Instant::now();
        let Launched { child, qemu, qmp } = match self.launch_qemu(&spec, &paths).await {
            Ok(l) => l,
            Err(e) => {
                self.net.teardown(id, None).await;
                paths.remove_all();
                return Err(e);
            }
        };
        let p = Prepared {
            id: id.to_string(),
            paths,
            child,
            qemu,
            machine: spec.config,
            qmp,
            prepare_ms,
            qemu_start_ms: ms(t1.elapsed()),
            net: None,
        };
        if let Err(e) = set_restore_capabilities(&p.qmp, &snap.manifest).await {
            // The QEMU was not started with kill-on-drop (sandboxes outlive
            // the daemon), so it is killed here, with its namespace and files.
            self.kill_prepared(vec![p]).await;
            return Err(e);
        }
        Ok(p)
    }

    /// A restore's files: its directory and root disk overlay, and the
    /// memory it maps (for a diff, the chain's head, built at its first
    /// spawn, crate::catalog::head).
    async fn restore_files(
        &self,
        snap: &StoredSnapshot,
        paths: &SandboxPaths,
    ) -> Result<MemoryBackend, EngineError> {
        let io = |e: std::io::Error| {
            EngineError::internal(format!("cannot create the sandbox directory: {e}"))
        };
        std::fs::create_dir_all(&paths.dir).map_err(io)?;
        std::fs::create_dir_all(&self.cfg.run_dir).map_err(io)?;
        forkvm_qemu::disk::create_overlay(&snap.path(forkvm_store::DISK), &paths.disk)
            .await
            .map_err(|e| EngineError::internal(format!("cannot create the root disk: {e}")))?;
        let m = &snap.manifest;
        Ok(match kind(m) {
            "diff" => {
                let c = self.chain(snap)?;
                self.verify_chain(&c).await?;
                let ram_bytes = u64::from(m.machine.memory_mib) << 20;
                MemoryBackend {
                    path: self.chain_head(&c, ram_bytes).await?,
                    share: false,
                    readonly: true,
                }
            }
            "shared" => MemoryBackend {
                path: snap.path(forkvm_store::MEMORY),
                share: false,
                readonly: true,
            },
            _ => MemoryBackend {
                path: paths.mem.clone(),
                share: true,
                readonly: false,
            },
        })
    }

    /// The QEMU of a restore: the snapshot's machine (the devices its
    /// stream holds) on this host's accelerator, waiting for its state.
    fn restore_spec(
        &self,
        snap: &StoredSnapshot,
        id: &str,
        paths: &SandboxPaths,
        memory: MemoryBackend,
        netns: Option<std::path::PathBuf>,
    ) -> MachineSpec {
        let m = &snap.manifest;
        let devices_only = m.state_format.as_deref() == Some(DEVICES_ONLY);
        MachineSpec {
            name: id.to_string(),
            config: forkvm_qemu::MachineConfig {
                accel: self.accel.accel,
                ..m.machine.clone()
            },
            memory,
            root_disk: paths.disk.clone(),
            agent_socket: paths.agent.clone(),
            volume_socket: paths.volumes_sock.clone(),
            qmp_socket: paths.qmp.clone(),
            console_log: paths.console.clone(),
            incoming: Some("defer".into()),
            device_state_only: devices_only,
            no_configuration_section: devices_only && !has_configuration(snap),
            netns,
            later_reads: vec![snap.path(forkvm_store::DEVICE_STATE)],
        }
    }

    /// Spawn `n` clones of a snapshot, concurrently. All or nothing: if one
    /// fails, the others are removed and the first error is returned.
    pub async fn spawn_clones(
        self: &Arc<Self>,
        snap: &StoredSnapshot,
        n: u32,
        net: &crate::net::NetRequest,
    ) -> Result<Vec<Sandbox>, EngineError> {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let me = self.clone();
            let s = snap.clone();
            let net = net.clone();
            set.spawn(async move { me.spawn_clone(&s, &net).await });
        }
        let mut ok = Vec::new();
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(sb)) => ok.push(sb),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err
                        .get_or_insert(EngineError::internal(format!("spawn task failed: {e}")));
                }
            }
        }
        if let Some(e) = first_err {
            for sb in &ok {
                let _ = self.remove(&sb.id).await;
            }
            return Err(e);
        }
        ok.sort_by(|a, b| a.id.cmp(&b.id));
        self.refill_pool(&snap.manifest.id);
        Ok(ok)
    }

    /// Spawn one clone: from the warm pool when one is waiting.
    pub async fn spawn_clone(
        self: &Arc<Self>,
        snap: &StoredSnapshot,
        net: &crate::net::NetRequest,
    ) -> Result<Sandbox, EngineError> {
        let t0 = Instant::now();
        let m = &snap.manifest;
        self.pools.note_request(&m.id, net.is_default_nat());
        let mut pooled = None;
        while let Some(mut p) = self.pools.take(&m.id) {
            // A pooled QEMU may have died while it waited.
            if matches!(p.child.try_wait(), Ok(None)) {
                pooled = Some(p);
                break;
            }
            self.net.teardown(&p.id, p.net.as_ref()).await;
            p.paths.remove_all();
        }
        let from_pool = pooled.is_some();
        let id = match &pooled {
            Some(p) => p.id.clone(),
            None => self.new_id("sb"),
        };
        let row = SandboxRow {
            id: id.clone(),
            state: SandboxState::Starting,
            image: m.image.clone(),
            memory_mib: m.machine.memory_mib,
            cpus: m.machine.cpus,
            accel: self.accel.accel.to_string(),
            pid: pooled.as_ref().map(|p| p.qemu.pid),
            created_at: util::now_rfc3339(),
            failure: None,
            timings: None,
            snapshot: Some(m.id.clone()),
            network: None,
        };
        self.db.insert(&row)?;
        let r = async {
            let p = match pooled {
                Some(p) => p,
                None => self.prepare_restore(snap, &id).await?,
            };
            self.finish_restore(p, snap, from_pool, t0, net, true).await
        }
        .await;
        self.conclude_spawn(&id, r).await
    }

    /// Load the state, resume, and give the clone its identity. A resume
    /// of a paused sandbox (`fresh_identity: false`) keeps the identity it
    /// had and only has its clock set.
    pub async fn finish_restore(
        self: &Arc<Self>,
        p: Prepared,
        snap: &StoredSnapshot,
        from_pool: bool,
        t0: Instant,
        net: &crate::net::NetRequest,
        fresh_identity: bool,
    ) -> Result<SpawnTimings, EngineError> {
        let (live, r) = self.attach_restored(p)?;
        // Connect to the agent's socket before the guest runs (QEMU listens
        // from its start), so the identity can go out right after `cont`.
        let conn = agent::AgentConn::connect(&r.paths.agent)
            .await
            .map_err(|e| EngineError::new(ErrorKind::Guest, e.to_string()))?;
        let network_ms = self.connect_network(&r.id, &live, r.ready_net, net).await?;
        let resumed = load_and_resume(r.qmp, snap, &live).await?;
        let identity_ms = give_identity(&r.id, &live, &conn, fresh_identity).await?;
        let network_ready_ms = if net.wait && network_ms.is_some() {
            crate::net::Net::probe_guest(&conn).await?;
            Some(ms(resumed.at.elapsed()))
        } else {
            None
        };
        *live.agent_slot().lock().await = Some(conn);
        // The guest has its volumes mounted already; serve them (a copy of
        // each `copy` one for a fresh clone, its own for a resume).
        self.attach_restored_volumes(&r.id, snap, !fresh_identity)
            .await?;
        let timings = SpawnTimings {
            prepare_ms: if from_pool { 0.0 } else { r.prepare_ms },
            qemu_start_ms: if from_pool { 0.0 } else { r.qemu_start_ms },
            boot_ms: 0.0,
            restore_ms: Some(resumed.restore_ms),
            identity_ms: Some(identity_ms),
            from_pool: Some(from_pool),
            template_ms: None,
            network_ms,
            network_ready_ms,
            resumed_unix_ms: resumed.unix_ms,
            total_ms: ms(t0.elapsed()),
        };
        self.mark_restored_running(&r.id, &live, &timings)?;
        Ok(timings)
    }

    /// Record the launched QEMU in the database and attach it as a booting
    /// sandbox; answers what the later steps need of the prepared one.
    fn attach_restored(
        self: &Arc<Self>,
        p: Prepared,
    ) -> Result<(Arc<Live>, Attached), EngineError> {
        let Prepared {
            id,
            paths,
            child,
            qemu,
            machine,
            qmp,
            prepare_ms,
            qemu_start_ms,
            net: ready_net,
        } = p;
        self.db.set_launched(&id, &qemu, &machine)?;
        let live = self.attach(
            &id,
            qemu,
            paths.clone(),
            Phase::Booting,
            Waiter::Child(child),
            machine,
        );
        let attached = Attached {
            id,
            paths,
            qmp,
            prepare_ms,
            qemu_start_ms,
            ready_net,
        };
        Ok((live, attached))
    }

    /// Set up the clone's network (a machine with a NIC only) and answer
    /// how long it took.
    async fn connect_network(
        &self,
        id: &str,
        live: &Live,
        ready_net: Option<crate::net::SandboxNet>,
        net: &crate::net::NetRequest,
    ) -> Result<Option<f64>, EngineError> {
        // The network is complete before the guest runs a single
        // instruction: its first packet already finds its way out.
        if live.machine.nic.is_none() {
            return Ok(None);
        }
        let t = Instant::now();
        let n = match ready_net {
            // A warm pool set up exactly this network ahead of time.
            Some(n) if n.serves(net) => n,
            // It set up the default one, and this spawn asks for
            // another: undo the uplink part, keep the namespace (the
            // QEMU's tap lives in it), and set up what was asked.
            Some(n) => {
                self.net.release_uplink(id, &n).await;
                self.net.setup(id, net).await?
            }
            None => self.net.setup(id, net).await?,
        };
        self.db.set_network(id, Some(&n))?;
        Ok(Some(ms(t.elapsed())))
    }

    /// Mark the restored sandbox running (unless it was removed meanwhile)
    /// and stream a long inherited disk chain down.
    fn mark_restored_running(
        self: &Arc<Self>,
        id: &str,
        live: &Live,
        timings: &SpawnTimings,
    ) -> Result<(), EngineError> {
        if live.set_phase(Phase::Running) != Phase::Booting {
            return Err(EngineError::conflict(
                "the sandbox was removed while it started",
            ));
        }
        self.db.set_running(id, live.pid, timings)?;
        // A clone deep in a branch tree inherits its snapshot's whole chain:
        // stream it down when it is long (a header read decides; most are not).
        if crate::compact::layers(&live.paths)
            .is_some_and(|n| n as usize > crate::compact::INHERITED_BOUND)
        {
            self.stream_disk_later(id, crate::compact::INHERITED_BOUND);
        }
        Ok(())
    }
}

/// What [`Manager::finish_restore`] keeps of a [`Prepared`] QEMU once it
/// is attached.
struct Attached {
    id: String,
    paths: crate::config::SandboxPaths,
    qmp: Arc<forkvm_qemu::Qmp>,
    prepare_ms: f64,
    qemu_start_ms: f64,
    /// The network a warm pool set up ahead of time.
    ready_net: Option<crate::net::SandboxNet>,
}

/// When the clone resumed, and how long loading its state took.
struct Resumed {
    at: Instant,
    unix_ms: Option<f64>,
    restore_ms: f64,
}

/// Load the snapshot's device state into the waiting QEMU, start the
/// record of the guest's disk writes, and let the guest run. The QMP
/// connection is closed after: nothing else needs it.
async fn load_and_resume(
    qmp: Arc<forkvm_qemu::Qmp>,
    snap: &StoredSnapshot,
    live: &Live,
) -> Result<Resumed, EngineError> {
    let t2 = Instant::now();
    migrate::load_state(&qmp, &snap.path(forkvm_store::DEVICE_STATE))
        .await
        .map_err(|e| qemu_err("loading the snapshot failed", e))?;
    // Before the guest writes anything: a checkpoint onto this snapshot
    // (the sandbox's first, or after a rewind to it) then stores only what
    // changed since (forkvm_qemu::incremental). Without it, the whole layer.
    match forkvm_qemu::incremental::start_record(&qmp, "root").await {
        Ok(()) => {
            if let Ok(mut s) = live.tracked_since.lock() {
                *s = Some(snap.manifest.id.clone());
            }
        }
        Err(e) => tracing::debug!(sandbox = %live.id, "no record of disk writes: {e}"),
    }
    qmp.execute("cont", None)
        .await
        .map_err(|e| qemu_err("cannot resume the clone", e))?;
    let at = Instant::now();
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .ok();
    drop(qmp);
    Ok(Resumed {
        at,
        unix_ms,
        restore_ms: ms(t2.elapsed()),
    })
}

/// Give the clone a fresh identity (or, resuming a paused sandbox, only
/// its clock), then set the clock again; answers how long both took.
async fn give_identity(
    id: &str,
    live: &Live,
    conn: &agent::AgentConn,
    fresh_identity: bool,
) -> Result<f64, EngineError> {
    // The identity is the first request the clone sees: its answer also
    // proves the agent is alive, so no separate ping round trip is paid
    // (under TCG each guest round trip right after a restore costs ~100 ms
    // of code translation).
    let t3 = Instant::now();
    let guest_us = first_request(id, live, conn, fresh_identity).await?;
    let ident_rt = t3.elapsed();
    // Now that the agent runs warm, set the clock again so it is off by
    // one short round trip at most.
    conn.set_clock(Duration::from_secs(30)).await.map_err(|e| {
        EngineError::new(
            ErrorKind::Guest,
            format!("the clone did not set its clock: {e}"),
        )
    })?;
    let identity_ms = ms(t3.elapsed());
    tracing::debug!(
        sandbox = %id,
        identity_round_trip_ms = ms(ident_rt),
        identity_in_guest_ms = guest_us as f64 / 1000.0,
        set_clock_ms = identity_ms - ms(ident_rt),
        "clone identity"
    );
    Ok(identity_ms)
}

/// The identity (or clock) request, raced against the QEMU dying; answers
/// the microseconds the guest took.
async fn first_request(
    id: &str,
    live: &Live,
    conn: &agent::AgentConn,
    fresh_identity: bool,
) -> Result<u64, EngineError> {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut exited = live.exited.clone();
    let (machine_id, instance_id, seed) = (
        hex_random(16),
        format!("{id}-{}", hex_random(4)),
        entropy(64),
    );
    let ident = async {
        if fresh_identity {
            conn.identity(
                id,
                now_ns,
                &machine_id,
                &instance_id,
                &seed,
                Duration::from_secs(60),
            )
            .await
        } else {
            conn.set_clock(Duration::from_secs(60)).await.map(|_| 0)
        }
    };
    let guest_us = tokio::select! {
        r = ident => { r.map_err(|e| match e {
            AgentError::Timeout(_) => EngineError::new(ErrorKind::GuestTimeout, format!("the clone did not take its identity: {e}"),
            ),
            other => EngineError::new(ErrorKind::Guest, format!("the clone refused its identity: {other}"),
            ),
        })? }
        r = exited.wait_for(|e| e.is_some()) => {
            let why = r.map(|g| g.clone().unwrap_or_default()).unwrap_or_default();
            return Err(qemu_err("the clone died while resuming", why));
        }
    };
    Ok(guest_us)
}
