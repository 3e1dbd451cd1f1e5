//! The forkvm engine: every sandbox operation, with no protocol in it.
//!
//! It owns the microVMs of one host: it spawns, restores, branches,
//! snapshots, pauses and removes them (through `forkvm-qemu` and the guest
//! agent, [`agent`]), keeps their state in SQLite ([`db`]) and the snapshot
//! store, and runs the background work (pools, lifetimes, GC, pressure,
//! events). Its errors are [`error::EngineError`]: a kind, a message and a
//! hint, with no HTTP in them.
//!
//! The front-ends live in `forkvm-daemon` (REST, the dashboard, E2B, MCP,
//! the node's OCI server); each maps engine results to its own protocol.
//! This crate depends on no HTTP server crate, and a test of the daemon's
//! module graph keeps it so.

pub mod actions;
pub mod admission;
pub mod agent;
pub mod branch;
pub mod builder;
pub mod catalog;
pub mod cgroup;
pub mod changes;
pub mod checkpoint;
pub mod cleanup;
pub mod compact;
pub mod config;
pub mod db;
pub mod error;
pub mod events;
pub mod exec;
pub mod exec_events;
pub mod failure;
pub mod fs;
pub mod gc;
pub mod images;
pub mod jail;
pub mod launcher;
pub mod lease;
pub mod lifetime;
pub mod limits;
pub mod manager;
pub mod metrics;
pub mod net;
pub mod pool;
pub mod pressure;
pub mod process;
pub mod recovery;
pub mod registry;

pub mod sandbox;
pub mod snapshot;
pub mod spawn;
pub mod teardown;
pub mod template;
pub mod treediff;
pub mod usage;
pub mod user_files;
pub mod util;
pub mod views;
pub mod volumes;

use std::time::{Duration, Instant};

use forkvm_qemu::{Accel, AccelChoice, HostVirt};

pub use actions::Engine;
pub use config::Config;
pub use manager::{Manager, MAX_POOL};

/// Boot our kernel with `forkvm.probe=1` under KVM and check that the guest
/// reaches its init within a few seconds.
async fn kvm_probe(cfg: &Config) -> Result<Duration, String> {
    if !cfg.kernel().is_file() || !cfg.initrd().is_file() {
        return Err("guest kernel/initramfs not built yet, so no probe could run".into());
    }
    let dir = cfg.home.join("tmp");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let log = dir.join(format!("kvm-probe-{}.log", std::process::id()));
    let t = Instant::now();
    let mut child = tokio::process::Command::new(&cfg.qemu)
        .args([
            "-M",
            // The same machine as every sandbox (see spec::MACHINE): the
            // legacy PIC/PIT could kill this probe in early boot too.
            forkvm_qemu::spec::MACHINE,
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            "256M",
        ])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(cfg.kernel())
        .arg("-initrd")
        .arg(cfg.initrd())
        .args(["-append", "console=ttyS0 panic=-1 forkvm.probe=1"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start QEMU: {e}"))?;
    let r = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    if r.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    if out.contains("FORKVM_PROBE_OK") {
        Ok(t.elapsed())
    } else if r.is_err() {
        Err("the probe VM did not reach init within 20 s".into())
    } else {
        let tail: String = out.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        Err(format!("the probe VM stopped before init: {tail}"))
    }
}

/// Choose the accelerator for this host (see `forkvm_qemu::accel`).
pub async fn choose_accel(cfg: &Config, requested: Option<Accel>) -> Result<AccelChoice, String> {
    let host = HostVirt::read();
    forkvm_qemu::accel::choose(requested, &host, || kvm_probe(cfg)).await
}

/// Re-exported for the CLI.
pub use forkvm_qemu::features;
