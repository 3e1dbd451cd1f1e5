//! The command line: every command, its arguments and their parsers.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::{image, lifetime};

#[derive(Parser)]
#[command(
    name = "forkvm",
    version,
    about = "Run AI-agent sandboxes as microVMs and fork them while they run"
)]
pub(crate) struct Cli {
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(clap::Args, Clone)]
pub(crate) struct SpawnArgs {
    /// Image to boot.
    #[arg(long, default_value = "default")]
    pub(crate) image: String,
    /// Guest RAM in MiB.
    #[arg(long, value_name = "MiB")]
    pub(crate) memory: Option<u32>,
    /// Number of vCPUs.
    #[arg(long)]
    pub(crate) cpus: Option<u32>,
    /// Always cold-boot the image (do not use or create its boot template).
    #[arg(long)]
    pub(crate) no_template: bool,
    /// Root disk size, e.g. 8G (default: the image's); a larger size grows
    /// the filesystem.
    #[arg(long, value_name = "SIZE", value_parser = image::parse_size)]
    pub(crate) disk_size: Option<u64>,
    /// Mount a host directory or named volume (repeatable):
    /// SOURCE:GUEST_PATH[:OPTIONS], OPTIONS from ro, rw, shared (children of
    /// a branch see the same directory; the default), copy (each child gets
    /// its own copy), uid=N, gid=N. See docs/volumes.md.
    #[arg(long = "volume", short = 'v', value_name = "SRC:PATH[:OPTS]", value_parser = forkvm_api::VolumeMount::parse)]
    pub(crate) volumes: Vec<forkvm_api::VolumeMount>,
    #[command(flatten)]
    pub(crate) net: NetArgs,
    #[command(flatten)]
    pub(crate) limits: lifetime::LimitArgs,
}

#[derive(clap::Args, Clone)]
pub(crate) struct NetArgs {
    /// nat (a network of its own with NAT egress; the default where the
    /// host supports it) or none.
    #[arg(long, value_parser = ["none", "nat"])]
    pub(crate) network: Option<String>,
    /// Publish a guest TCP port on a host loopback port; HOST 0 or omitted
    /// picks a free one (repeatable; see `forkvm port ID`).
    #[arg(long = "port", value_name = "GUEST[:HOST]", value_parser = parse_port)]
    pub(crate) ports: Vec<forkvm_api::PortForward>,
    /// Allow egress only to this IPv4 address or network, optionally only
    /// to these TCP/UDP ports (repeatable). Without it, anything but the
    /// host and other sandboxes is reachable. The list holds for the guest
    /// and for every process in the sandbox's namespace.
    #[arg(long = "allow", value_name = "CIDR[:PORT,...]", value_parser = parse_allow)]
    pub(crate) allow: Vec<forkvm_api::EgressRule>,
    /// Let the --allow entries reach the host itself (its own services on
    /// the addresses and ports they name). Without it no --allow entry,
    /// not even 0.0.0.0/0, opens the host.
    #[arg(long, requires = "allow")]
    pub(crate) allow_host: bool,
    /// Return without proving the guest's network works first.
    #[arg(long)]
    pub(crate) no_wait_network: bool,
}

pub(crate) fn parse_port(s: &str) -> Result<forkvm_api::PortForward, String> {
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

pub(crate) fn parse_allow(s: &str) -> Result<forkvm_api::EgressRule, String> {
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
pub(crate) struct ExecArgs {
    /// Forward this process's stdin to the command.
    #[arg(short = 'i', long = "interactive")]
    pub(crate) stdin: bool,
    /// Set an environment variable (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub(crate) env: Vec<String>,
    /// Working directory in the guest.
    #[arg(short = 'w', long = "workdir")]
    pub(crate) cwd: Option<String>,
    /// Kill the command after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub(crate) timeout: Option<f64>,
    /// Run as this user (`name`, `uid`, `name:group`, `uid:gid`); default:
    /// the image's `User`, else root.
    #[arg(short = 'u', long = "user")]
    pub(crate) user: Option<String>,
    /// Run this program instead of the image's Entrypoint (`''`: none), as
    /// `docker run --entrypoint` does; the image's Cmd is then dropped.
    #[arg(long, value_name = "PROG")]
    pub(crate) entrypoint: Option<String>,
    /// Arguments, as `docker run IMAGE ARGS` takes them: they replace the
    /// image's Cmd and go to its Entrypoint (an image without one runs them
    /// as the command); omitted: the image's Entrypoint and Cmd.
    #[arg(last = true, value_name = "ARGS")]
    pub(crate) argv: Vec<String>,
}

/// How to reach a registry.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct RegistryArgs {
    /// Registry user (default: ~/.docker/config.json, else anonymous).
    #[arg(long, requires = "password")]
    pub(crate) username: Option<String>,
    /// Registry password (`-` reads it from stdin).
    #[arg(long, requires = "username")]
    pub(crate) password: Option<String>,
    /// Speak plain HTTP to the registry (loopback registries always may).
    #[arg(long)]
    pub(crate) insecure: bool,
}

#[derive(Subcommand)]
pub(crate) enum SnapCmd {
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
    /// Push a snapshot, with its chain and base image, to an OCI registry
    /// (e.g. 127.0.0.1:5000/team/warm:v1). What the registry has is not sent.
    Push {
        id: String,
        reference: String,
        #[command(flatten)]
        auth: RegistryArgs,
    },
    /// Pull a pushed snapshot (with the links and image this host lacks) so
    /// that `forkvm spawn --snapshot` can start it here.
    Pull {
        reference: String,
        /// A tag for the pulled snapshot on this host.
        #[arg(long)]
        tag: Option<String>,
        #[command(flatten)]
        auth: RegistryArgs,
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
pub(crate) struct PoolSize(pub(crate) Option<u32>);

pub(crate) fn parse_pool_size(s: &str) -> Result<PoolSize, String> {
    if s == "default" {
        return Ok(PoolSize(None));
    }
    s.parse::<u32>()
        .map(|n| PoolSize(Some(n)))
        .map_err(|_| format!("{s:?} is not a size: give a number (0 = off) or `default`"))
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
    /// Create, list and remove named volumes (docs/volumes.md).
    Volume {
        #[command(subcommand)]
        cmd: crate::volume::VolumeCmd,
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
        cmd: crate::procs::ProcCmd,
    },
    /// Files and directories in a sandbox: stat, list, mkdir, move, remove,
    /// watch, download and upload several at once.
    Fs {
        #[command(subcommand)]
        cmd: crate::files::FsCmd,
    },
    /// Branch a running sandbox: snapshot it now (it keeps running) and
    /// spawn children that continue from that instant.
    Branch(BranchArgs),
    /// List sandboxes.
    Ps {
        /// Only sandboxes with this metadata label (repeatable).
        #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = lifetime::parse_pair)]
        metadata: Vec<(String, String)>,
    },
    #[command(flatten)]
    Life(lifetime::LifeCmd),
    #[command(flatten)]
    Time(crate::timeline::TimeCmd),
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
    Serve(ServeArgs),
    /// Print the OpenAPI document of the REST API.
    Openapi,
    /// Open the web dashboard (docs/dashboard.md): on the unix socket, relay
    /// a loopback port to it and print a one-time login link; on TCP, print
    /// the daemon's /ui URL.
    Ui {
        /// Loopback port for the relay (0: any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Only print the URL; do not start a browser.
        #[arg(long)]
        no_open: bool,
    },
    /// Serve MCP (Model Context Protocol) on stdin/stdout, for Claude Desktop
    /// and other MCP clients: tools to create, run in, branch and remove
    /// sandboxes of the daemon (docs/mcp.md).
    Mcp,
    /// A cluster of nodes on Ray behind one endpoint (docs/cluster.md).
    Cluster {
        #[command(subcommand)]
        cmd: crate::cluster::ClusterCmd,
    },
}

pub(crate) fn parse_node(s: &str) -> Result<String, String> {
    forkvm_daemon::util::check_node_name(s).map(|()| s.to_string())
}

pub(crate) fn parse_uid_range(s: &str) -> Result<(u32, u32), String> {
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

// The arguments of `forkvm serve` (its help is the variant's doc).
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Data directory.
    #[arg(long, env = "FORKVM_HOME", default_value = forkvm_api::DEFAULT_HOME)]
    pub(crate) home: PathBuf,
    /// Unix socket (default: $FORKVM_HOME/forkvm.sock).
    #[arg(long)]
    pub(crate) socket: Option<PathBuf>,
    /// Also listen on TCP at ADDR:PORT (requires FORKVM_TOKEN).
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Force the accelerator instead of detecting it.
    #[arg(long, value_parser = ["kvm", "tcg"])]
    pub(crate) accel: Option<String>,
    /// Warm-pool size of every snapshot that has none of its own: boot
    /// templates and snapshots you take (a branch's snapshot starts at 0).
    /// Set one snapshot's with `forkvm snapshot pool`.
    #[arg(long, default_value_t = 0, value_name = "N", env = "FORKVM_POOL_SIZE",
          value_parser = clap::value_parser!(u32).range(0..=i64::from(forkvm_daemon::MAX_POOL)))]
    pub(crate) pool_size: u32,
    /// Requests handled at once; more are refused with 429.
    #[arg(long, default_value_t = 256, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) max_requests: u32,
    /// Most sandboxes at once (including warm-pool ones); more give 429.
    #[arg(long, default_value_t = 1000, value_name = "N", env = "FORKVM_MAX_SANDBOXES",
          value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub(crate) max_sandboxes: u32,
    /// The IPv4 pool sandbox uplinks get a /30 from (host side of each
    /// sandbox's NAT).
    /// (Default: 10.231.0.0/16; with --ephemeral, a /20 of 10.200.0.0/13
    /// no other ephemeral daemon has.)
    #[arg(long, value_name = "CIDR", env = "FORKVM_NET_POOL")]
    pub(crate) net_pool: Option<String>,
    /// Garbage collection never takes a branch point younger than this
    /// (seconds; `forkvm snapshot prune --all` ignores it).
    #[arg(long, value_name = "SECONDS", env = "FORKVM_GC_GRACE",
          default_value_t = forkvm_daemon::config::DEFAULT_GC_GRACE_SECS)]
    pub(crate) gc_grace: u64,
    /// Seconds between background collections of unneeded branch
    /// points; 0 turns background collection off (prune still works).
    #[arg(long, value_name = "SECONDS", env = "FORKVM_GC_INTERVAL",
          default_value_t = forkvm_daemon::config::DEFAULT_GC_INTERVAL_SECS)]
    pub(crate) gc_interval: u64,
    /// After a snapshot, a sandbox whose disk reads through more qcow2
    /// layers than this has them streamed into its top in the background
    /// (docs/disk-chain.md); 0 never streams.
    #[arg(long, value_name = "N", env = "FORKVM_DISK_CHAIN_MAX",
          default_value_t = forkvm_daemon::config::DEFAULT_DISK_CHAIN_MAX)]
    pub(crate) disk_chain_max: u32,
    /// Pull only from these registries (`host[:port]`, comma-separated);
    /// empty: any. Builds pull their base images through the same check.
    #[arg(
        long,
        value_name = "HOSTS",
        env = "FORKVM_ALLOWED_REGISTRIES",
        value_delimiter = ','
    )]
    pub(crate) allowed_registries: Vec<String>,
    /// The memory sandboxes may use in all, in MiB; spawns, branches and
    /// resumes that would pass it are refused (default: host RAM less a
    /// tenth, at least 512 MiB).
    #[arg(long, value_name = "MiB", env = "FORKVM_MEMORY_COMMIT_MIB")]
    pub(crate) memory_commit_mib: Option<u64>,
    /// Refuse new work when the home's filesystem has less free space.
    #[arg(long, value_name = "MiB", env = "FORKVM_DISK_RESERVE_MIB",
          default_value_t = forkvm_daemon::config::DEFAULT_DISK_RESERVE_MIB)]
    pub(crate) disk_reserve_mib: u64,
    /// Run QEMU unconfined: as root, in the host's mount namespace, with
    /// no seccomp filter and no cgroup of its own. For debugging only
    /// (docs/security.md).
    #[arg(long, env = "FORKVM_NO_JAIL",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) no_jail: bool,
    /// The uids jailed QEMUs run as, one each (gid = uid): FIRST-LAST
    /// (default: 2000000-2999999; with --ephemeral, 10,000 of
    /// 3000000-4279999 no other ephemeral daemon has).
    #[arg(long, value_name = "FIRST-LAST", env = "FORKVM_JAIL_UIDS",
          value_parser = parse_uid_range)]
    pub(crate) jail_uids: Option<(u32, u32)>,
    /// This daemon's node name in a forkvm cluster (docs/cluster.md):
    /// 1-16 of a-z and 0-9, starting with a letter. New sandbox and
    /// snapshot ids carry it (`sb-NAME-<12 hex>`).
    #[arg(long, value_name = "NAME", env = "FORKVM_NODE", value_parser = parse_node)]
    pub(crate) node: Option<String>,
    #[command(flatten)]
    pub(crate) ephemeral: crate::ephemeral::EphemeralArgs,
}

// The arguments of `forkvm branch` (its help is the variant's doc).
#[derive(clap::Args)]
pub(crate) struct BranchArgs {
    pub(crate) id: String,
    /// live (memory copied while the guest runs) or full.
    #[arg(long, default_value = "live", value_parser = ["live", "diff", "full"])]
    pub(crate) mode: String,
    /// Children to spawn (0-1000).
    #[arg(long, default_value_t = 1)]
    pub(crate) count: u32,
    /// A unique name for the branch point's snapshot.
    #[arg(long)]
    pub(crate) tag: Option<String>,
    /// Return once the source has resumed; the snapshot shows `writing`,
    /// then `ready` (or `failed`) in `forkvm snapshot inspect`, and the
    /// children come up in the background.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Publish this guest port for each child (repeatable; default: the
    /// source's guest ports, each on a newly allocated host port).
    #[arg(long = "port", value_name = "GUEST[:HOST]", value_parser = parse_port)]
    pub(crate) ports: Vec<forkvm_api::PortForward>,
    /// Return without proving each child's network works first.
    #[arg(long)]
    pub(crate) no_wait_network: bool,
    #[command(flatten)]
    pub(crate) limits: lifetime::LimitArgs,
    /// The children's timeout in seconds, from their start (default:
    /// the source's).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) timeout: Option<u64>,
}
