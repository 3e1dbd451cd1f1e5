//! `forkvm cluster`: run the cluster gateway, show a cluster, and start or
//! stop one on Ray (docs/cluster.md).
//!
//! `gateway` and `status` are here; `up`, `start` and `down` drive Ray, so
//! they run the Python side (`python -m forkvm.ray`, from the SDK's `ray`
//! extra) with the interpreter in `FORKVM_PYTHON` (default `python3`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use forkvm_api::{Client, NodeState};

#[derive(Subcommand)]
pub(crate) enum ClusterCmd {
    /// Run the cluster endpoint: the REST, E2B and MCP API of a daemon,
    /// routed to the nodes listed in STATE_DIR/nodes.json. Needs
    /// FORKVM_TOKEN (what clients send) and FORKVM_CLUSTER_TOKEN (what it
    /// sends to nodes). Normally started by the Ray supervisor.
    Gateway {
        /// TCP address to listen on.
        #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        /// Holds nodes.json (written by the supervisor) and gateway/.
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
    },
    /// Nodes, their state and capacity, and sandboxes, from the cluster
    /// endpoint in FORKVM_URL.
    Status,
    /// Start a local trial cluster: N Ray nodes on 127.0.0.1, a daemon on
    /// each, and the endpoint (runs `python -m forkvm.ray up`).
    Up {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// On a running Ray cluster (`ray start` on every host): start a daemon
    /// on every node and the endpoint (runs `python -m forkvm.ray start`).
    Start {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Stop what `up` or `start` started (runs `python -m forkvm.ray down`).
    Down {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

pub(crate) async fn run(cmd: ClusterCmd, json: bool) -> Result<ExitCode> {
    match cmd {
        ClusterCmd::Gateway { listen, state_dir } => {
            crate::init_tracing();
            let cfg = forkvm_cluster::Config {
                listen,
                state_dir,
                client_token: std::env::var(forkvm_api::ENV_TOKEN).unwrap_or_default(),
                cluster_token: std::env::var("FORKVM_CLUSTER_TOKEN").unwrap_or_default(),
            };
            forkvm_cluster::run(cfg).await.map_err(anyhow::Error::msg)?;
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::Status => {
            let c = Client::from_env().map_err(anyhow::Error::msg)?;
            let s = c.cluster().await.with_context(|| {
                "`forkvm cluster status` asks the cluster endpoint: set FORKVM_URL and \
                 FORKVM_TOKEN to it (a single daemon does not answer /v1/cluster)"
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<8} {:<12} {:>9} {:>12} {:>12}  URL",
                "NODE", "STATE", "SANDBOXES", "MEM LEFT", "DISK FREE"
            );
            for n in &s.nodes {
                let state = match n.state {
                    NodeState::Alive => "alive",
                    NodeState::Unreachable => "unreachable",
                    NodeState::Dead => "dead",
                };
                let (mem, disk) = n.capacity.as_ref().map_or(("-".into(), "-".into()), |c| {
                    (
                        format!("{} MiB", c.memory_left_mib),
                        format!("{} MiB", c.disk_free_mib),
                    )
                });
                println!(
                    "{:<8} {:<12} {:>9} {:>12} {:>12}  {}",
                    n.name, state, n.sandboxes, mem, disk, n.url
                );
                if let Some(r) = &n.reason {
                    println!("         {r}");
                }
            }
            println!("{} sandbox(es) on live nodes, {} lost", s.sandboxes, s.lost);
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::Up { args } => python("up", &args),
        ClusterCmd::Start { args } => python("start", &args),
        ClusterCmd::Down { args } => python("down", &args),
    }
}

fn python(what: &str, args: &[String]) -> Result<ExitCode> {
    let py = std::env::var("FORKVM_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = std::process::Command::new(&py)
        .args(["-m", "forkvm.ray", what])
        .args(args)
        .status()
        .with_context(|| {
            format!("cannot run {py} (set FORKVM_PYTHON to a Python with forkvm[ray])")
        })?;
    if !status.success() {
        bail!(
            "`{py} -m forkvm.ray {what}` failed ({status}); install the extra with `pip install \
             'forkvm[ray]'` into that Python, or set FORKVM_PYTHON"
        );
    }
    Ok(ExitCode::SUCCESS)
}
