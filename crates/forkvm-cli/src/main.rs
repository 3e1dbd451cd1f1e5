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

mod doctor;
mod doctor_jail;
mod doctor_net;
mod files;
mod gc;
mod image;
mod lifetime;
mod procs;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use clap::{Parser, Subcommand};
use forkvm_api::{
    Client, ClientError, CreateSandbox, ExecEvent, ExecRequest, OutputEncoding, Target,
};

#[derive(Parser)]
#[command(
    name = "forkvm",
    version,
    about = "Run AI-agent sandboxes as microVMs and fork them while they run"
)]
struct Cli {
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct SpawnArgs {
    /// Image to boot.
    #[arg(long, default_value = "default")]
    image: String,
    /// Guest RAM in MiB.
    #[arg(long, value_name = "MiB")]
    memory: Option<u32>,
    /// Number of vCPUs.
    #[arg(long)]
    cpus: Option<u32>,
    /// Always cold-boot the image (do not use or create its boot template).
    #[arg(long)]
    no_template: bool,
    /// Root disk size, e.g. 8G (default: the image's); a larger size grows
    /// the filesystem.
    #[arg(long, value_name = "SIZE", value_parser = image::parse_size)]
    disk_size: Option<u64>,
    #[command(flatten)]
    net: NetArgs,
    #[command(flatten)]
    limits: lifetime::LimitArgs,
}

#[derive(clap::Args, Clone)]
struct NetArgs {
    /// nat (a network of its own with NAT egress; the default where the
    /// host supports it) or none.
    #[arg(long, value_parser = ["none", "nat"])]
    network: Option<String>,
    /// Publish a guest TCP port on a host loopback port; HOST 0 or omitted
    /// picks a free one (repeatable; see `forkvm port ID`).
    #[arg(long = "port", value_name = "GUEST[:HOST]", value_parser = parse_port)]
    ports: Vec<forkvm_api::PortForward>,
    /// Allow egress only to this IPv4 address or network, optionally only
    /// to these TCP/UDP ports (repeatable). Without it, anything but the
    /// host and other sandboxes is reachable.
    #[arg(long = "allow", value_name = "CIDR[:PORT,...]", value_parser = parse_allow)]
    allow: Vec<forkvm_api::EgressRule>,
    /// Return without proving the guest's network works first.
    #[arg(long)]
    no_wait_network: bool,
}

fn parse_port(s: &str) -> Result<forkvm_api::PortForward, String> {
    let num = |t: &str| {
        t.parse::<u16>()
            .map_err(|_| format!("{t:?} is not a port number (0-65535)"))
    };
    let (g, h) = match s.split_once(':') {
        Some((g, h)) => (num(g)?, num(h)?),
        None => (num(s)?, 0),
    };
    if g == 0 {
        return Err("the guest port cannot be 0".into());
    }
    Ok(forkvm_api::PortForward { guest: g, host: h })
}

fn parse_allow(s: &str) -> Result<forkvm_api::EgressRule, String> {
    let (cidr, ports) = match s.split_once(':') {
        Some((c, p)) => (
            c,
            p.split(',')
                .map(|t| {
                    t.parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| format!("{t:?} is not a port number (1-65535)"))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => (s, Vec::new()),
    };
    Ok(forkvm_api::EgressRule {
        cidr: cidr.to_string(),
        ports,
    })
}

#[derive(clap::Args, Clone)]
struct ExecArgs {
    /// Forward this process's stdin to the command.
    #[arg(short = 'i', long = "interactive")]
    stdin: bool,
    /// Set an environment variable (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory in the guest.
    #[arg(short = 'w', long = "workdir")]
    cwd: Option<String>,
    /// Kill the command after this many seconds.
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Run as this user (`name`, `uid`, `name:group`, `uid:gid`); default:
    /// the image's `User`, else root.
    #[arg(short = 'u', long = "user")]
    user: Option<String>,
    /// The command and its arguments; omitted: the image's default command
    /// (its Entrypoint and Cmd).
    #[arg(last = true, value_name = "CMD")]
    argv: Vec<String>,
}

#[derive(Subcommand)]
enum SnapCmd {
    /// List snapshots.
    Ls,
    /// Show a snapshot.
    Inspect { id: String },
    /// Remove snapshots.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
        /// Also remove the sandboxes and snapshots that depend on it.
        #[arg(long)]
        force: bool,
    },
    /// Keep N QEMU processes started ahead of time for a snapshot (0 = off,
    /// `default` = follow the daemon's `serve --pool-size`).
    Pool {
        id: String,
        #[arg(value_name = "SIZE|default", value_parser = parse_pool_size)]
        size: PoolSize,
    },
    /// Merge a diff snapshot's chain into one standalone snapshot.
    Flatten {
        id: String,
        /// A name for the flat snapshot.
        #[arg(long)]
        tag: Option<String>,
    },
    /// Keep a snapshot (and what it builds on) from garbage collection.
    Pin { id: String },
    /// Let garbage collection take a snapshot again once nothing needs it.
    Unpin { id: String },
    /// Remove now the branch points nothing needs (untagged, unpinned, no
    /// sandbox or snapshot built on them) older than the daemon's grace
    /// period, and say what that freed.
    Prune {
        /// Ignore the grace period: take unneeded branch points however young.
        #[arg(long)]
        all: bool,
        /// Only list what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

/// A warm-pool size on the command line; `None` is `default`.
#[derive(Debug, Clone, Copy)]
struct PoolSize(Option<u32>);

fn parse_pool_size(s: &str) -> Result<PoolSize, String> {
    if s == "default" {
        return Ok(PoolSize(None));
    }
    s.parse::<u32>()
        .map(|n| PoolSize(Some(n)))
        .map_err(|_| format!("{s:?} is not a size: give a number (0 = off) or `default`"))
}

#[derive(Subcommand)]
enum Cmd {
    /// Spawn a sandbox, run one command in it, print its output, remove it.
    Run {
        #[command(flatten)]
        spawn: SpawnArgs,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Pull, import, build and manage images.
    Image {
        #[command(subcommand)]
        cmd: image::ImageCmd,
    },
    /// Spawn sandboxes (from an image or a snapshot) and print their ids.
    Spawn {
        #[command(flatten)]
        spawn: SpawnArgs,
        /// Spawn from this snapshot (id or tag).
        #[arg(long, value_name = "REF", conflicts_with_all = ["memory", "cpus"])]
        snapshot: Option<String>,
        /// How many sandboxes to spawn at once (1-1000).
        #[arg(long, value_name = "N")]
        count: Option<u32>,
        #[command(flatten)]
        life: lifetime::LifeArgs,
    },
    /// Snapshot a sandbox (`forkvm snapshot ID [--tag T]`), or manage snapshots.
    #[command(args_conflicts_with_subcommands = true)]
    Snapshot {
        #[command(subcommand)]
        cmd: Option<SnapCmd>,
        /// The sandbox to snapshot.
        id: Option<String>,
        /// A unique name for the snapshot.
        #[arg(long)]
        tag: Option<String>,
    },
    /// Run a command in a sandbox.
    Exec {
        id: String,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Background processes and PTYs in a sandbox.
    Proc {
        #[command(subcommand)]
        cmd: procs::ProcCmd,
    },
    /// Files and directories in a sandbox: stat, list, mkdir, move, remove,
    /// watch, download and upload several at once.
    Fs {
        #[command(subcommand)]
        cmd: files::FsCmd,
    },
    /// Branch a running sandbox: snapshot it now (it keeps running) and
    /// spawn children that continue from that instant.
    Branch {
        id: String,
        /// live (memory copied while the guest runs) or full.
        #[arg(long, default_value = "live", value_parser = ["live", "diff", "full"])]
        mode: String,
        /// Children to spawn (0-1000).
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// A unique name for the branch point's snapshot.
        #[arg(long)]
        tag: Option<String>,
        /// Return once the source has resumed; the snapshot shows `writing`,
        /// then `ready` (or `failed`) in `forkvm snapshot inspect`, and the
        /// children come up in the background.
        #[arg(long)]
        no_wait: bool,
        /// Publish this guest port for each child (repeatable; default: the
        /// source's guest ports, each on a newly allocated host port).
        #[arg(long = "port", value_name = "GUEST[:HOST]", value_parser = parse_port)]
        ports: Vec<forkvm_api::PortForward>,
        /// Return without proving each child's network works first.
        #[arg(long)]
        no_wait_network: bool,
        #[command(flatten)]
        limits: lifetime::LimitArgs,
    },
    /// List sandboxes.
    Ps {
        /// Only sandboxes with this metadata label (repeatable).
        #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = lifetime::parse_pair)]
        metadata: Vec<(String, String)>,
    },
    #[command(flatten)]
    Life(lifetime::LifeCmd),
    /// Remove sandboxes.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print a sandbox's serial console.
    Logs { id: String },
    /// List a sandbox's published ports (guest port -> host loopback port).
    Port { id: String },
    /// Show a sandbox in detail (with its memory use).
    Inspect { id: String },
    /// Show the daemon's version, accelerator, QEMU and limits.
    Info,
    /// Check everything forkvm needs on this host.
    Doctor,
    /// Run the daemon in the foreground.
    Serve {
        /// Data directory.
        #[arg(long, env = "FORKVM_HOME", default_value = forkvm_api::DEFAULT_HOME)]
        home: PathBuf,
        /// Unix socket (default: $FORKVM_HOME/forkvm.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Also listen on TCP at ADDR:PORT (requires FORKVM_TOKEN).
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<std::net::SocketAddr>,
        /// Force the accelerator instead of detecting it.
        #[arg(long, value_parser = ["kvm", "tcg"])]
        accel: Option<String>,
        /// Warm-pool size of every snapshot that has none of its own: boot
        /// templates and snapshots you take (a branch's snapshot starts at 0).
        /// Set one snapshot's with `forkvm snapshot pool`.
        #[arg(long, default_value_t = 0, value_name = "N", env = "FORKVM_POOL_SIZE",
              value_parser = clap::value_parser!(u32).range(0..=i64::from(forkvm_daemon::MAX_POOL)))]
        pool_size: u32,
        /// Requests handled at once; more are refused with 429.
        #[arg(long, default_value_t = 256, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=65536))]
        max_requests: u32,
        /// Most sandboxes at once (including warm-pool ones); more give 429.
        #[arg(long, default_value_t = 1000, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=100000))]
        max_sandboxes: u32,
        /// The IPv4 pool sandbox uplinks get a /30 from (host side of each
        /// sandbox's NAT).
        #[arg(long, default_value = forkvm_net_default_pool(), value_name = "CIDR", env = "FORKVM_NET_POOL")]
        net_pool: String,
        /// Garbage collection never takes a branch point younger than this
        /// (seconds; `forkvm snapshot prune --all` ignores it).
        #[arg(long, value_name = "SECONDS", env = "FORKVM_GC_GRACE",
              default_value_t = forkvm_daemon::config::DEFAULT_GC_GRACE_SECS)]
        gc_grace: u64,
        /// Seconds between background collections of unneeded branch
        /// points; 0 turns background collection off (prune still works).
        #[arg(long, value_name = "SECONDS", env = "FORKVM_GC_INTERVAL",
              default_value_t = forkvm_daemon::config::DEFAULT_GC_INTERVAL_SECS)]
        gc_interval: u64,
        /// After a snapshot, a sandbox whose disk reads through more qcow2
        /// layers than this has them streamed into its top in the background
        /// (docs/disk-chain.md); 0 never streams.
        #[arg(long, value_name = "N", env = "FORKVM_DISK_CHAIN_MAX",
              default_value_t = forkvm_daemon::config::DEFAULT_DISK_CHAIN_MAX)]
        disk_chain_max: u32,
        /// Pull only from these registries (`host[:port]`, comma-separated);
        /// empty: any. Builds pull their base images through the same check.
        #[arg(
            long,
            value_name = "HOSTS",
            env = "FORKVM_ALLOWED_REGISTRIES",
            value_delimiter = ','
        )]
        allowed_registries: Vec<String>,
        /// The memory sandboxes may use in all, in MiB; spawns, branches and
        /// resumes that would pass it are refused (default: host RAM less a
        /// tenth, at least 512 MiB).
        #[arg(long, value_name = "MiB", env = "FORKVM_MEMORY_COMMIT_MIB")]
        memory_commit_mib: Option<u64>,
        /// Refuse new work when the home's filesystem has less free space.
        #[arg(long, value_name = "MiB", env = "FORKVM_DISK_RESERVE_MIB",
              default_value_t = forkvm_daemon::config::DEFAULT_DISK_RESERVE_MIB)]
        disk_reserve_mib: u64,
        /// Run QEMU unconfined: as root, in the host's mount namespace, with
        /// no seccomp filter and no cgroup of its own. For debugging only
        /// (docs/security.md).
        #[arg(long, env = "FORKVM_NO_JAIL",
              value_parser = clap::builder::BoolishValueParser::new())]
        no_jail: bool,
        /// The uids jailed QEMUs run as, one each (gid = uid): FIRST-LAST.
        #[arg(long, value_name = "FIRST-LAST", env = "FORKVM_JAIL_UIDS",
              default_value = "2000000-2999999", value_parser = parse_uid_range)]
        jail_uids: (u32, u32),
    },
    /// Print the OpenAPI document of the REST API.
    Openapi,
}

fn parse_uid_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not FIRST-LAST"))?;
    let a: u32 = a.trim().parse().map_err(|e| format!("{a:?}: {e}"))?;
    let b: u32 = b.trim().parse().map_err(|e| format!("{b:?}: {e}"))?;
    if a == 0 || b < a {
        return Err(format!(
            "{s:?}: the range must start above 0 (QEMU never runs as root) and end at or after its start"
        ));
    }
    Ok((a, b - a + 1))
}

const fn forkvm_net_default_pool() -> &'static str {
    "10.231.0.0/16"
}

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
        } => {
            init_tracing();
            let mut cfg = forkvm_daemon::Config::for_home(&home);
            if let Some(s) = socket {
                cfg.socket = s;
            }
            cfg.tcp = listen;
            cfg.default_pool_size = pool_size;
            cfg.limits.max_concurrent_requests = max_requests;
            cfg.limits.max_sandboxes = max_sandboxes;
            cfg.net_pool = net_pool;
            cfg.gc_grace = Duration::from_secs(gc_grace);
            cfg.gc_interval = (gc_interval > 0).then(|| Duration::from_secs(gc_interval));
            cfg.disk_chain_max = disk_chain_max;
            if let Some(m) = memory_commit_mib {
                cfg.memory_commit_mib = m;
            }
            cfg.disk_reserve_mib = disk_reserve_mib;
            cfg.jail = !no_jail;
            cfg.jail_uids = jail_uids;
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
            forkvm_daemon::serve(cfg).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Openapi => {
            print!("{}", forkvm_daemon::api::openapi_json());
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
        Cmd::Proc { cmd } => procs::run(&client().await?, cmd, json).await,
        Cmd::Fs { cmd } => files::run(&client().await?, cmd, json).await,
        Cmd::Exec { id, exec } => {
            // Unlike `run`, exec has no image default to fall back on:
            // a missing command is a usage error, as for any other.
            if exec.argv.is_empty() {
                eprintln!(
                    "error: forkvm exec needs a command\n\nUsage: forkvm exec [OPTIONS] <ID> -- <CMD>..."
                );
                return Ok(ExitCode::from(2));
            }
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
                        format!("{:?}", s.state).to_lowercase(),
                        s.image,
                        s.memory_mib,
                        s.cpus,
                        s.accel,
                        s.created_at,
                        s.failure.unwrap_or_default()
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

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FORKVM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
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
        wait_for_network: a.net.no_wait_network.then_some(false),
        disk_size: a.disk_size,
        ..Default::default()
    };
    req.limits = a.limits.limits();
    req
}

async fn snapshot_cmd(
    c: &Client,
    cmd: Option<SnapCmd>,
    id: Option<String>,
    tag: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let show = |s: &forkvm_api::Snapshot| {
        println!(
            "{:<16} {:<14} {:<7} {:<16} {:>6}M {:>4} {:>9} {:<24} {}",
            s.id,
            s.tag.clone().unwrap_or_else(|| if s.template {
                "(template)".into()
            } else if s.pinned {
                "(pinned)".into()
            } else {
                "-".into()
            }),
            s.kind,
            s.parent.clone().unwrap_or_else(|| "-".into()),
            s.memory_mib,
            s.cpus,
            format!(
                "{}M",
                (s.sizes.memory_allocated_bytes
                    + s.sizes.memory_diff_bytes
                    + s.sizes.device_state_bytes)
                    >> 20
            ),
            s.created_at,
            s.sandboxes.len()
        );
    };
    match cmd {
        None => {
            let id = id.ok_or_else(|| {
                anyhow!("name the sandbox to snapshot: forkvm snapshot ID [--tag T]")
            })?;
            let s = c.snapshot(&id, &forkvm_api::CreateSnapshot { tag }).await?;
            if json {
                print_json(&s)?;
            } else {
                println!("{}", s.id);
                if let Some(t) = &s.timings {
                    eprintln!(
                        "forkvm: snapshot of {id}: source paused {:.1} ms, total {:.0} ms",
                        t.pause_ms, t.total_ms
                    );
                }
            }
        }
        Some(SnapCmd::Ls) => {
            let l = c.list_snapshots().await?;
            if json {
                print_json(&l)?;
            } else {
                println!(
                    "{:<16} {:<14} {:<7} {:<16} {:>7} {:>4} {:>9} {:<24} SANDBOXES",
                    "ID", "TAG", "KIND", "PARENT", "MEM", "CPUS", "ON DISK", "CREATED"
                );
                for s in &l.snapshots {
                    show(s);
                }
            }
        }
        Some(SnapCmd::Inspect { id }) => print_json(&c.get_snapshot(&id).await?)?,
        Some(SnapCmd::Rm { ids, force }) => {
            let mut failed = false;
            for id in ids {
                match c.delete_snapshot(&id, force).await {
                    Ok(()) => {
                        if !json {
                            println!("{id}");
                        }
                    }
                    Err(e) => {
                        eprintln!("forkvm: cannot remove snapshot {id}: {e}");
                        failed = true;
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        Some(SnapCmd::Flatten { id, tag }) => {
            let s = c.flatten(&id, &forkvm_api::FlattenRequest { tag }).await?;
            if json {
                print_json(&s)?;
            } else {
                println!("{}", s.id);
            }
        }
        Some(SnapCmd::Pin { id }) => gc::pin(c, &id, true, json).await?,
        Some(SnapCmd::Unpin { id }) => gc::pin(c, &id, false, json).await?,
        Some(SnapCmd::Prune { all, dry_run }) => return gc::prune(c, all, dry_run, json).await,
        Some(SnapCmd::Pool { id, size }) => {
            let s = c.set_pool(&id, size.0).await?;
            if json {
                print_json(&s)?;
            } else if s.pool_default {
                println!(
                    "{}: warm pool of {} (the daemon's default)",
                    s.id, s.pool_size
                );
            } else {
                println!("{}: warm pool of {}", s.id, s.pool_size);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn exec_req(a: &ExecArgs) -> Result<ExecRequest> {
    let mut env = BTreeMap::new();
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {kv:?} must look like KEY=VALUE"))?;
        if k.is_empty() {
            bail!("--env {kv:?} has an empty name");
        }
        env.insert(k.to_string(), v.to_string());
    }
    let timeout_ms = match a.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => {
            bail!("--timeout must be a positive number of seconds")
        }
        Some(t) => Some((t * 1000.0).ceil() as u64),
        None => None,
    };
    Ok(ExecRequest {
        argv: a.argv.clone(),
        env,
        cwd: a.cwd.clone(),
        user: a.user.clone(),
        timeout_ms,
        encoding: Some(OutputEncoding::Base64),
        ..Default::default()
    })
}

async fn do_exec(c: &Client, id: &str, a: &ExecArgs, json: bool) -> Result<ExitCode> {
    let mut req = exec_req(a)?;
    if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        req.stdin_base64 = Some(base64::engine::general_purpose::STANDARD.encode(buf));
    }
    if json {
        req.encoding = Some(OutputEncoding::Utf8);
    }
    if json {
        let r = c.exec(id, &req).await?;
        print_json(&r)?;
        return Ok(exit_code(
            r.timed_out,
            r.exit_code,
            r.signal,
            r.duration_ms,
            true,
        ));
    }
    // On a terminal the output is streamed: a long command shows it live.
    let dec = |s: &str| base64::engine::general_purpose::STANDARD.decode(s);
    let mut write_err = None;
    let last = c
        .exec_stream(id, &req, |ev| {
            let r = match ev {
                ExecEvent::Stdout { data } => dec(data).map(|b| {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&b).and_then(|_| o.flush())
                }),
                ExecEvent::Stderr { data } => dec(data).map(|b| {
                    let mut o = std::io::stderr().lock();
                    o.write_all(&b).and_then(|_| o.flush())
                }),
                _ => Ok(Ok(())),
            };
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    write_err.get_or_insert_with(|| anyhow!("writing the output: {e}"));
                }
                Err(e) => {
                    write_err.get_or_insert_with(|| anyhow!("bad output chunk from daemon: {e}"));
                }
            }
        })
        .await?;
    if let Some(e) = write_err {
        return Err(e);
    }
    let ExecEvent::Exit {
        exit_code: code,
        signal,
        timed_out,
        duration_ms,
        ..
    } = last
    else {
        bail!("the exec stream ended without an exit status");
    };
    Ok(exit_code(timed_out, code, signal, duration_ms, false))
}

/// The CLI's exit status for a finished command: its own, 128+signal, or 124
/// when it timed out (as `timeout(1)` does).
fn exit_code(
    timed_out: bool,
    code: Option<i32>,
    signal: Option<i32>,
    duration_ms: u64,
    quiet: bool,
) -> ExitCode {
    if timed_out {
        if !quiet {
            eprintln!("forkvm: the command timed out after {duration_ms} ms and was killed");
        }
        return ExitCode::from(124);
    }
    match (code, signal) {
        (Some(c), _) => ExitCode::from((c & 0xff) as u8),
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        _ => ExitCode::from(1),
    }
}

/// A client for the daemon, starting a local one when the default socket
/// does not answer.
async fn client() -> Result<Client> {
    let c = Client::from_env().map_err(|e| anyhow!(e))?;
    match c.health().await {
        Ok(_) => return Ok(c),
        Err(ClientError::Connect { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let explicit = std::env::var(forkvm_api::ENV_URL).is_ok_and(|u| !u.is_empty());
    let Target::Unix(sock) = &c.target else {
        bail!(
            "no forkvm daemon answers at {}; start one with `forkvm serve --listen ...`",
            c.target
        );
    };
    let home = forkvm_api::home_dir();
    if explicit && *sock != home.join(forkvm_api::SOCKET_NAME) {
        bail!(
            "no forkvm daemon answers at {}; start one with `forkvm serve --socket {}`",
            c.target,
            sock.display()
        );
    }
    start_daemon(&home)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match c.health().await {
            Ok(_) => return Ok(c),
            Err(ClientError::Connect { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                let log = home.join("daemon.log");
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                bail!(
                    "started a daemon but it does not answer ({e}); its log {} ends with:\n{}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
    }
}

fn start_daemon(home: &std::path::Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("daemon.log"))
        .context("opening daemon.log")?;
    let exe = std::env::current_exe().context("finding the forkvm binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve")
        .env(forkvm_api::ENV_HOME, home)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid() is async-signal-safe and touches no memory; it detaches
    // the daemon from our terminal and session so it outlives this command.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting `forkvm serve`")?;
    eprintln!(
        "forkvm: started a local daemon (pid {}, home {}, log daemon.log)",
        child.id(),
        home.display()
    );
    Ok(())
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
