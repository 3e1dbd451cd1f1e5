//! `forkvm`: the command-line interface.
//!
//! Every command except `serve`, `doctor` and `openapi` talks to the daemon
//! over its REST API (the `FORKVM_URL` socket, or the default one). When the
//! default socket does not answer, the CLI starts a local daemon itself
//! (`forkvm serve`, detached, logging to `$FORKVM_HOME/daemon.log`).
//!
//! Every command takes `--json` for machine-readable output. Exit codes:
//! `forkvm run`/`exec` exit with the command's own code (124 when it timed
//! out, 128+N when a signal killed it); other failures exit 1 (2 for usage).

mod args;
mod cluster;
mod daemon;
mod doctor;
mod doctor_jail;
mod doctor_net;
mod doctor_volumes;
mod ephemeral;
mod exec;
mod files;
mod gc;
mod hint;
mod image;
mod lifetime;
mod mcp;
mod procs;
mod snapshot;
mod transfer;
mod ui;
mod volume;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Parser;

use crate::args::*;
use crate::daemon::client;
use crate::exec::{do_exec, exec_req};
use crate::snapshot::snapshot_cmd;
use forkvm_api::CreateSandbox;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("forkvm: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("forkvm: {e:#}");
            if let Some(line) = hint::line(&e) {
                eprintln!("{line}");
            }
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let json = cli.json;
    match cli.cmd {
        Cmd::Serve {
            home,
            socket,
            listen,
            accel,
            pool_size,
            max_requests,
            max_sandboxes,
            net_pool,
            gc_grace,
            gc_interval,
            disk_chain_max,
            allowed_registries,
            memory_commit_mib,
            disk_reserve_mib,
            no_jail,
            jail_uids,
            node,
            ephemeral,
        } => {
            init_tracing();
            let eph = if ephemeral.ephemeral {
                match ephemeral::prepare(&ephemeral, &home)? {
                    Some(p) => Some(p),
                    None => return Ok(ExitCode::SUCCESS), // a reaper with nothing to do
                }
            } else {
                None
            };
            let home = eph.as_ref().map_or(home, |p| p.home.clone());
            let slot = eph.as_ref().and_then(|p| p.slot.clone());
            let mut cfg = forkvm_daemon::Config::for_home(&home);
            if let Some(s) = socket {
                cfg.socket = s;
            }
            cfg.tcp = listen;
            cfg.default_pool_size = pool_size;
            cfg.limits.max_concurrent_requests = max_requests;
            cfg.limits.max_sandboxes = max_sandboxes;
            if let Some(p) = net_pool.or(slot.as_ref().map(|s| s.0.clone())) {
                cfg.net_pool = p;
            }
            cfg.gc_grace = Duration::from_secs(gc_grace);
            cfg.gc_interval = (gc_interval > 0).then(|| Duration::from_secs(gc_interval));
            cfg.disk_chain_max = disk_chain_max;
            if let Some(m) = memory_commit_mib {
                cfg.memory_commit_mib = m;
            }
            cfg.disk_reserve_mib = disk_reserve_mib;
            cfg.jail = !no_jail;
            if let Some(u) = jail_uids.or(slot.as_ref().map(|s| s.1)) {
                cfg.jail_uids = u;
            }
            cfg.node = node;
            cfg.allowed_registries = allowed_registries
                .into_iter()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect();
            cfg.token = std::env::var(forkvm_api::ENV_TOKEN)
                .ok()
                .filter(|t| !t.is_empty());
            cfg.accel = accel
                .map(|a| a.parse())
                .transpose()
                .map_err(|e: String| anyhow!(e))?;
            if let Some(p) = eph {
                ephemeral::serve(cfg, &ephemeral, p).await?;
                return Ok(ExitCode::SUCCESS);
            }
            forkvm_daemon::serve(cfg).await?;
            Ok(ExitCode::SUCCESS)
        }
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
        Cmd::Info => {
            let c = client().await?;
            let i = c.info().await?;
            if json {
                print_json(&i)?;
            } else {
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
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Spawn {
            spawn,
            snapshot,
            count,
            life,
        } => {
            let c = client().await?;
            let mut req = spawn_req(&spawn);
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
        Cmd::Branch {
            id,
            mode,
            count,
            tag,
            no_wait,
            ports,
            no_wait_network,
            limits,
            timeout,
        } => {
            let c = client().await?;
            let mode = match mode.as_str() {
                "full" => forkvm_api::BranchMode::Full,
                "diff" => forkvm_api::BranchMode::Diff,
                _ => forkvm_api::BranchMode::Live,
            };
            let r = c
                .branch(
                    &id,
                    &forkvm_api::BranchRequest {
                        mode: Some(mode),
                        count: Some(count),
                        tag,
                        wait: no_wait.then_some(false),
                        ports: (!ports.is_empty()).then_some(ports),
                        wait_for_network: no_wait_network.then_some(false),
                        limits: limits.limits(),
                        timeout,
                    },
                )
                .await?;
            if json {
                print_json(&r)?;
            } else {
                println!("{}", r.snapshot.id);
                for k in &r.children {
                    println!("{}", k.id);
                }
                eprintln!(
                    "forkvm: branched {id} in {} mode ({} snapshot): source paused {:.1} ms; snapshot {:.0} ms, {} children {:.0} ms, total {:.0} ms",
                    format!("{:?}", r.mode).to_lowercase(),
                    r.snapshot.kind,
                    r.pause_ms,
                    r.snapshot_ms,
                    r.children.len(),
                    r.spawn_ms,
                    r.total_ms
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Snapshot { cmd, id, tag } => {
            let c = client().await?;
            snapshot_cmd(&c, cmd, id, tag, json).await
        }
        Cmd::Image { cmd } => {
            let c = client().await?;
            image::run(&c, cmd, json).await
        }
        Cmd::Volume { cmd } => {
            let c = client().await?;
            volume::run(&c, cmd, json).await
        }
        Cmd::Proc { cmd } => procs::run(&client().await?, cmd, json).await,
        Cmd::Fs { cmd } => files::run(&client().await?, cmd, json).await,
        Cmd::Exec { id, exec } => {
            // No command: the image's Entrypoint and Cmd, as the API does.
            let c = client().await?;
            do_exec(&c, &id, &exec, json).await
        }
        Cmd::Run { spawn, exec } => {
            let c = client().await?;
            let req = exec_req(&exec)?; // validate before booting anything
            drop(req);
            let sb = c.create_sandbox(&spawn_req(&spawn)).await?;
            let r = do_exec(&c, &sb.id, &exec, json).await;
            // The sandbox goes whatever happened to the command.
            if let Err(e) = c.delete_sandbox(&sb.id).await {
                eprintln!("forkvm: warning: could not remove sandbox {}: {e}", sb.id);
            }
            r
        }
        Cmd::Life(cmd) => lifetime::run(&client().await?, cmd, json).await,
        Cmd::Ps { metadata } => {
            let c = client().await?;
            let l = c.list_sandboxes_by(&lifetime::filters(&metadata)).await?;
            if json {
                print_json(&l)?;
            } else {
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
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Inspect { id } => {
            let c = client().await?;
            print_json(&c.get_sandbox(&id).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Rm { ids } => {
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
        Cmd::Port { id } => {
            let c = client().await?;
            let ports = c.ports(&id).await?;
            if json {
                print_json(&ports)?;
            } else {
                for p in ports {
                    println!("{}/tcp -> 127.0.0.1:{}", p.guest, p.host);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Logs { id } => {
            let c = client().await?;
            let b = c.logs(&id).await?;
            if json {
                print_json(
                    &serde_json::json!({ "id": id, "console": String::from_utf8_lossy(&b) }),
                )?;
            } else {
                std::io::stdout().write_all(&b)?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FORKVM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| QuietStderr)
        .try_init();
}

/// Stderr for the log that never fails: a daemon whose stderr is a pipe
/// nobody reads any more (its test harness was killed) must go on, and tear
/// down, instead of panicking at its next log line (tracing reports a
/// failed write with `eprintln!`, which panics on a broken pipe).
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Remove each named thing with `rm`: print each name removed, each error
/// with its name, and fail if any failed (`image rm`, `volume rm`).
pub(crate) async fn remove_each<F, Fut, E>(names: Vec<String>, mut rm: F) -> ExitCode
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut failed = false;
    for n in names {
        match rm(n.clone()).await {
            Ok(()) => println!("{n}"),
            Err(e) => {
                eprintln!("forkvm: {n}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn spawn_req(a: &SpawnArgs) -> CreateSandbox {
    let mut req = CreateSandbox {
        image: Some(a.image.clone()),
        memory_mib: a.memory,
        cpus: a.cpus,
        use_template: a.no_template.then_some(false),
        network: a.net.network.as_deref().map(|m| match m {
            "none" => forkvm_api::NetworkMode::None,
            _ => forkvm_api::NetworkMode::Nat,
        }),
        ports: (!a.net.ports.is_empty()).then(|| a.net.ports.clone()),
        egress: (!a.net.allow.is_empty()).then(|| a.net.allow.clone()),
        allow_host: a.net.allow_host.then_some(true),
        wait_for_network: a.net.no_wait_network.then_some(false),
        disk_size: a.disk_size,
        volumes: (!a.volumes.is_empty()).then(|| a.volumes.clone()),
        ..Default::default()
    };
    req.limits = a.limits.limits();
    req
}

#[cfg(test)]
mod cli_tests {
    /// clap checks the whole command tree (duplicate flags across
    /// flattened argument groups, bad defaults) only when asked; a clash
    /// would otherwise surface as a panic of the command at run time.
    #[test]
    fn the_command_tree_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
