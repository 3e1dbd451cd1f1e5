//! Cold boots: start QEMU on an image, wait for the agent, and make the
//! result a sandbox (or take a failed start apart again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_api::{Sandbox, SandboxState, SpawnTimings};
use forkvm_qemu::process::{self, Launched};
use forkvm_qemu::spec::kernel_cmdline;
use forkvm_qemu::{MachineConfig, MachineSpec, MemoryBackend};
use tokio::sync::watch;

use crate::agent;
use crate::config::SandboxPaths;
use crate::db::SandboxRow;
use crate::error::{EngineError, ErrorKind};
use crate::failure::{console_tail, died_while_booting};
use crate::images::BootReq;
use crate::manager::{Manager, Phase, Waiter};
use crate::util::{self, ms};

impl Manager {
    /// Boot a new sandbox from its image and wait until its agent answers.
    pub async fn cold_boot(
        self: &Arc<Self>,
        boot: &BootReq,
        net: &crate::net::NetRequest,
    ) -> Result<Sandbox, EngineError> {
        let (image, memory_mib, cpus) = (boot.image.as_str(), boot.memory_mib, boot.cpus);
        let t0 = Instant::now();
        let id = self.new_id("sb");
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
    pub async fn connect_booted(
        &self,
        id: &str,
        net: &crate::net::NetRequest,
    ) -> Result<(Option<f64>, Option<f64>), EngineError> {
        let Some(live) = self.live(id) else {
            return Err(EngineError::conflict(format!(
                "sandbox {id} is not running"
            )));
        };
        if live.machine.nic.is_none() {
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
        let conn = live
            .agent()
            .await
            .map_err(|e| EngineError::new(ErrorKind::Guest, e.to_string()))?;
        crate::net::Net::probe_guest(&conn).await?;
        Ok((Some(setup_ms), Some(ms(t.elapsed()))))
    }

    /// The end of every spawn: the sandbox with its timings, or, on failure,
    /// nothing left of it.
    pub async fn conclude_spawn(
        &self,
        id: &str,
        r: Result<SpawnTimings, EngineError>,
    ) -> Result<Sandbox, EngineError> {
        match r {
            Ok(timings) => {
                let mut row = self.db.get(id)?.ok_or_else(|| {
                    EngineError::internal("the sandbox row vanished during its spawn")
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
                tracing::warn!(sandbox = %id, code = e.code(), "spawn of sandbox {id} ({from}) failed: {}", e.message);
                self.discard_failed_spawn(id).await;
                Err(e)
            }
        }
    }

    /// Nothing of a failed spawn stays behind: process, files, row.
    pub async fn discard_failed_spawn(&self, id: &str) {
        let live = self.live_map().remove(id);
        if let Some(live) = live {
            live.set_phase(Phase::Removing);
            process::kill(live.pid, libc::SIGKILL);
            live.wait_exit(Duration::from_secs(10)).await;
        }
        let net = self.db.get(id).ok().flatten().and_then(|r| r.network);
        self.net.teardown(id, net.as_ref()).await;
        self.detach_volumes(id);
        self.cfg.sandbox_paths(id).remove_all();
        self.cfg.sandbox_paths(id).remove_volumes();
        let _ = self.db.delete(id);
    }

    pub async fn boot(
        self: &Arc<Self>,
        id: &str,
        boot: &BootReq,
        paths: &SandboxPaths,
        t0: Instant,
    ) -> Result<SpawnTimings, EngineError> {
        self.boot_on(id, boot, paths, t0, false).await
    }

    /// [`Self::boot`]; with `keep_disk`, on the disk already at
    /// `paths.disk` (a cold resume, crate::lifetime::cold) instead of a new
    /// overlay of the image.
    pub async fn boot_on(
        self: &Arc<Self>,
        id: &str,
        boot: &BootReq,
        paths: &SandboxPaths,
        t0: Instant,
        keep_disk: bool,
    ) -> Result<SpawnTimings, EngineError> {
        let (image, memory_mib, cpus) = (boot.image.as_str(), boot.memory_mib, boot.cpus);
        let io = |what: &str, e: std::io::Error| {
            EngineError::internal(format!(
                "cannot create {what}: {e}; check free space and permissions"
            ))
        };
        std::fs::create_dir_all(&paths.dir).map_err(|e| io("the sandbox directory", e))?;
        std::fs::create_dir_all(&self.cfg.run_dir).map_err(|e| io("the RAM directory", e))?;
        if !keep_disk {
            forkvm_qemu::disk::create_overlay_sized(
                &self.cfg.image_rootfs(image),
                &paths.disk,
                boot.disk_size,
            )
            .await
            .map_err(|e| EngineError::internal(format!("cannot create the root disk: {e}")))?;
        }
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
            config: MachineConfig {
                machine: forkvm_qemu::spec::MACHINE.to_string(),
                accel: self.accel.accel,
                memory_mib,
                cpus,
                kernel: self.cfg.kernel(),
                initrd: self.cfg.initrd(),
                cmdline: kernel_cmdline(id, self.accel.accel, &extra),
                volume_port: true,
                nic: netns.as_ref().map(|_| crate::net::Net::nic()),
            },
            memory: MemoryBackend {
                path: paths.mem.clone(),
                share: true,
                readonly: false,
            },
            root_disk: paths.disk.clone(),
            agent_socket: paths.agent.clone(),
            volume_socket: paths.volumes_sock.clone(),
            qmp_socket: paths.qmp.clone(),
            console_log: paths.console.clone(),
            incoming: None,
            device_state_only: false,
            no_configuration_section: false,
            netns,
            later_reads: vec![],
        };
        let t1 = Instant::now();
        let Launched { child, qemu, qmp } = self.launch_qemu(&spec, paths).await?;
        let pid = qemu.pid;
        // The QMP session is not needed after start-up; closing it is fine
        // (QEMU's QMP server accepts a new client later).
        drop(qmp);
        self.db.set_launched(id, &qemu, &spec.config)?;
        let qemu_start_ms = ms(t1.elapsed());
        let live = self.attach(
            id,
            qemu,
            paths.clone(),
            Phase::Booting,
            Waiter::Child(child),
            spec.config.clone(),
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
                        None => EngineError::new(ErrorKind::GuestTimeout, format!(
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
            return Err(EngineError::conflict(
                "the sandbox was removed while it booted",
            ));
        }
        self.db.set_running(id, pid, &timings)?;
        Ok(timings)
    }

    /// Start QEMU for a sandbox and leave its identity (pid and start time)
    /// in `qemu.pid`, by which a restarted daemon finds processes that have
    /// no row (see `reap_orphans` and `reap_strays`).
    pub async fn launch_qemu(
        &self,
        spec: &MachineSpec,
        paths: &SandboxPaths,
    ) -> Result<Launched, EngineError> {
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
            EngineError::new(ErrorKind::QemuFailed, e.to_string())
        })?;
        // Written aside and renamed, so that a reader (crash recovery, or a
        // test looking for pooled QEMUs) never sees the file empty.
        let tmp = paths.dir.join("qemu.pid.tmp");
        if std::fs::write(&tmp, l.qemu.to_file()).is_ok() {
            let _ = std::fs::rename(&tmp, paths.dir.join("qemu.pid"));
        }
        Ok(l)
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
