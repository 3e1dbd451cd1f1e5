//! What each `forkvm` command does. [`run`] hands the parsed command line to
//! one function per command; the commands with their own module (images,
//! volumes, processes, files, lifetimes, snapshots, doctor, cluster) are
//! called there, the small ones are here.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use forkvm_api::{BranchMode, BranchRequest, Info};

use crate::args::*;
use crate::daemon::client;
use crate::exec::{do_exec, exec_req};
use crate::snapshot::snapshot_cmd;
use crate::{cluster, doctor, ephemeral, files, gc, image, init_tracing, lifetime, mcp};
use crate::{print_json, procs, spawn_req, ui, volume};

/// Run one command line; the exit code is the command's own for `run` and
/// `exec`, success or failure for the others.
pub(crate) async fn run(cli: Cli) -> Result<ExitCode> {
    let json = cli.json;
    match cli.cmd {
        Cmd::Serve(a) => serve(a).await,
        Cmd::Openapi => {
            print!("{}", forkvm_daemon::api::openapi_json());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mcp => {
            mcp::run().await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cluster { cmd } => cluster::run(cmd, json).await,
        Cmd::Ui { port, no_open } => {
            ui::run(port, !no_open).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Doctor => doctor::run(json).await,
        Cmd::Info => info(json).await,
        Cmd::Spawn {
            spawn,
            snapshot,
            count,
            life,
        } => spawn_cmd(&spawn, snapshot, count, &life, json).await,
        Cmd::Branch(a) => branch(a, json).await,
        Cmd::Snapshot { cmd, id, tag } => snapshot_cmd(&client().await?, cmd, id, tag, json).await,
        Cmd::Image { cmd } => image::run(&client().await?, cmd, json).await,
        Cmd::Volume { cmd } => volume::run(&client().await?, cmd, json).await,
        Cmd::Proc { cmd } => procs::run(&client().await?, cmd, json).await,
        Cmd::Fs { cmd } => files::run(&client().await?, cmd, json).await,
        // No command: the image's Entrypoint and Cmd, as the API does.
        Cmd::Exec { id, exec } => do_exec(&client().await?, &id, &exec, json).await,
        Cmd::Run { spawn, exec } => run_once(&spawn, &exec, json).await,
        Cmd::Life(cmd) => lifetime::run(&client().await?, cmd, json).await,
        Cmd::Time(cmd) => crate::timeline::run(&client().await?, cmd, json).await,
        Cmd::Ps { metadata } => ps(&metadata, json).await,
        Cmd::Inspect { id } => {
            print_json(&client().await?.get_sandbox(&id).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Rm { ids } => rm(ids, json).await,
        Cmd::Port { id } => port(&id, json).await,
        Cmd::Logs { id } => logs(&id, json).await,
    }
}

/// `forkvm serve`: the daemon in the foreground, or with `--ephemeral` in a
/// home and slot of its own.
async fn serve(a: ServeArgs) -> Result<ExitCode> {
    init_tracing();
    let eph = if a.ephemeral.ephemeral {
        match ephemeral::prepare(&a.ephemeral, &a.home)? {
            Some(p) => Some(p),
            None => return Ok(ExitCode::SUCCESS), // a reaper with nothing to do
        }
    } else {
        None
    };
    let home = eph.as_ref().map_or(a.home.clone(), |p| p.home.clone());
    let slot = eph.as_ref().and_then(|p| p.slot.clone());
    let cfg = serve_config(&a, &home, slot)?;
    if let Some(p) = eph {
        ephemeral::serve(cfg, &a.ephemeral, p).await?;
        return Ok(ExitCode::SUCCESS);
    }
    forkvm_daemon::serve(cfg).await?;
    Ok(ExitCode::SUCCESS)
}

/// The daemon's configuration from `serve`'s arguments, for `home`; an
/// ephemeral daemon's `slot` (network pool, jail uids) fills in what the
/// arguments leave open.
fn serve_config(
    a: &ServeArgs,
    home: &Path,
    slot: Option<(String, (u32, u32))>,
) -> Result<forkvm_daemon::Config> {
    let mut cfg = forkvm_daemon::Config::for_home(home);
    if let Some(s) = &a.socket {
        cfg.socket = s.clone();
    }
    cfg.tcp = a.listen;
    cfg.default_pool_size = a.pool_size;
    cfg.limits.max_concurrent_requests = a.max_requests;
    cfg.limits.max_sandboxes = a.max_sandboxes;
    if let Some(p) = a.net_pool.clone().or(slot.as_ref().map(|s| s.0.clone())) {
        cfg.net_pool = p;
    }
    cfg.gc_grace = Duration::from_secs(a.gc_grace);
    cfg.gc_interval = (a.gc_interval > 0).then(|| Duration::from_secs(a.gc_interval));
    cfg.disk_chain_max = a.disk_chain_max;
    if let Some(m) = a.memory_commit_mib {
        cfg.memory_commit_mib = m;
    }
    cfg.disk_reserve_mib = a.disk_reserve_mib;
    cfg.jail = !a.no_jail;
    if let Some(u) = a.jail_uids.or(slot.as_ref().map(|s| s.1)) {
        cfg.jail_uids = u;
    }
    cfg.node = a.node.clone();
    cfg.allowed_registries = a
        .allowed_registries
        .iter()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .collect();
    cfg.token = std::env::var(forkvm_api::ENV_TOKEN)
        .ok()
        .filter(|t| !t.is_empty());
    cfg.accel = a
        .accel
        .as_deref()
        .map(|a| a.parse())
        .transpose()
        .map_err(|e: String| anyhow!(e))?;
    Ok(cfg)
}

/// `forkvm info`.
async fn info(json: bool) -> Result<ExitCode> {
    let i = client().await?.info().await?;
    if json {
        print_json(&i)?;
    } else {
        print_info(&i);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_info(i: &Info) {
    println!("forkvm {}", i.version);
    if let Some(n) = &i.node {
        println!("node:        {n}");
    }
    println!("accelerator: {} — {}", i.accel.kind, i.accel.reason);
    println!("qemu:        {} ({})", i.qemu.version, i.qemu.path);
    println!("home:        {}", i.home);
    println!("images:      {}", i.images.join(", "));
    println!("sandboxes:   {}", i.sandboxes);
    let c = &i.capacity;
    println!(
        "capacity:    memory {} MiB used + {} starting of {} MiB committed ({} left, {} sandboxes counted); disk {} MiB free (reserve {} MiB)",
        c.memory_used_mib,
        c.memory_reserved_mib,
        c.memory_commit_mib,
        c.memory_left_mib,
        c.counted_sandboxes,
        c.disk_free_mib,
        c.disk_reserve_mib
    );
    println!("{}", gc::info_line(&i.gc));
    let l = &i.limits;
    println!(
        "limits:      memory ≤ {} MiB, cpus ≤ {}, sandboxes ≤ {}, exec output ≤ {} MiB/stream, files ≤ {} MiB",
        l.max_memory_mib,
        l.max_cpus,
        l.max_sandboxes,
        l.max_exec_output_bytes >> 20,
        l.max_file_bytes >> 20
    );
}

/// `forkvm spawn`: one sandbox, or `count` of them, from an image or a
/// snapshot.
async fn spawn_cmd(
    spawn: &SpawnArgs,
    snapshot: Option<String>,
    count: Option<u32>,
    life: &lifetime::LifeArgs,
    json: bool,
) -> Result<ExitCode> {
    let c = client().await?;
    let mut req = spawn_req(spawn);
    life.apply(&mut req);
    if snapshot.is_some() {
        req.image = None;
        req.snapshot = snapshot;
    }
    req.count = count;
    if count.is_some() {
        let b = c.create_batch(&req).await?;
        if json {
            print_json(&b)?;
        } else {
            for s in b.sandboxes {
                println!("{}", s.id);
            }
        }
    } else {
        let sb = c.create_sandbox(&req).await?;
        if json {
            print_json(&sb)?;
        } else {
            println!("{}", sb.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `forkvm branch`: the snapshot's id and the children's on stdout, the
/// timings on stderr.
async fn branch(a: BranchArgs, json: bool) -> Result<ExitCode> {
    let c = client().await?;
    let mode = match a.mode.as_str() {
        "full" => BranchMode::Full,
        "diff" => BranchMode::Diff,
        _ => BranchMode::Live,
    };
    let req = BranchRequest {
        mode: Some(mode),
        count: Some(a.count),
        tag: a.tag,
        wait: a.no_wait.then_some(false),
        ports: (!a.ports.is_empty()).then_some(a.ports),
        wait_for_network: a.no_wait_network.then_some(false),
        limits: a.limits.limits(),
        timeout: a.timeout,
    };
    let r = c.branch(&a.id, &req).await?;
    if json {
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", r.snapshot.id);
    for k in &r.children {
        println!("{}", k.id);
    }
    eprintln!(
        "forkvm: branched {} in {} mode ({} snapshot): source paused {:.1} ms; snapshot {:.0} ms, {} children {:.0} ms, total {:.0} ms",
        a.id,
        format!("{:?}", r.mode).to_lowercase(),
        r.snapshot.kind,
        r.pause_ms,
        r.snapshot_ms,
        r.children.len(),
        r.spawn_ms,
        r.total_ms
    );
    Ok(ExitCode::SUCCESS)
}

/// `forkvm run`: spawn a sandbox, run one command in it, remove it.
async fn run_once(spawn: &SpawnArgs, exec: &ExecArgs, json: bool) -> Result<ExitCode> {
    let c = client().await?;
    let req = exec_req(exec)?; // validate before booting anything
    drop(req);
    let sb = c.create_sandbox(&spawn_req(spawn)).await?;
    let r = do_exec(&c, &sb.id, exec, json).await;
    // The sandbox goes whatever happened to the command.
    if let Err(e) = c.delete_sandbox(&sb.id).await {
        eprintln!("forkvm: warning: could not remove sandbox {}: {e}", sb.id);
    }
    r
}

/// `forkvm ps`: a table of the sandboxes with all the metadata pairs.
async fn ps(metadata: &[(String, String)], json: bool) -> Result<ExitCode> {
    let c = client().await?;
    let l = c.list_sandboxes_by(&lifetime::filters(metadata)).await?;
    if json {
        print_json(&l)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<16} {:<9} {:<10} {:>7} {:>4} {:<5} {:<24} FAILURE",
        "ID", "STATE", "IMAGE", "MEM", "CPUS", "ACCEL", "CREATED"
    );
    for s in l.sandboxes {
        println!(
            "{:<16} {:<9} {:<10} {:>6}M {:>4} {:<5} {:<24} {}",
            s.id,
            if s.suspended.is_some() {
                "suspended".to_string()
            } else {
                format!("{:?}", s.state).to_lowercase()
            },
            s.image,
            s.memory_mib,
            s.cpus,
            s.accel,
            s.created_at,
            s.suspended.or(s.failure).unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `forkvm rm`: remove each sandbox, go on past failures, and fail if any
/// failed.
async fn rm(ids: Vec<String>, json: bool) -> Result<ExitCode> {
    let c = client().await?;
    let mut failed = false;
    let mut removed = Vec::new();
    for id in ids {
        match c.delete_sandbox(&id).await {
            Ok(()) => {
                if !json {
                    println!("{id}");
                }
                removed.push(id);
            }
            Err(e) => {
                eprintln!("forkvm: cannot remove {id}: {e}");
                failed = true;
            }
        }
    }
    if json {
        print_json(&serde_json::json!({ "removed": removed }))?;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `forkvm port`: a sandbox's published ports.
async fn port(id: &str, json: bool) -> Result<ExitCode> {
    let ports = client().await?.ports(id).await?;
    if json {
        print_json(&ports)?;
    } else {
        for p in ports {
            println!("{}/tcp -> 127.0.0.1:{}", p.guest, p.host);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `forkvm logs`: a sandbox's serial console.
async fn logs(id: &str, json: bool) -> Result<ExitCode> {
    let b = client().await?.logs(id).await?;
    if json {
        print_json(&serde_json::json!({ "id": id, "console": String::from_utf8_lossy(&b) }))?;
    } else {
        std::io::stdout().write_all(&b)?;
    }
    Ok(ExitCode::SUCCESS)
}
