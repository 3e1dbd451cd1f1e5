//! `forkvm cluster`: run the cluster gateway, show a cluster, and start or
//! stop one on Ray (docs/cluster.md).
//!
//! `gateway` and `status` are here; `up`, `start` and `down` drive Ray, so
//! they run the Python side (`python -m forkvm.ray`, from the SDK's `ray`
//! extra) with the interpreter in `FORKVM_PYTHON`, else the checkout's
//! `.venv`, else `python3`.

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
        /// Move snapshots between nodes through this registry
        /// (HOST[:PORT]/REPOSITORY) instead of the nodes' own /v2 endpoints;
        /// credentials from FORKVM_REGISTRY_USER and FORKVM_REGISTRY_PASSWORD.
        #[arg(long, value_name = "HOST[:PORT]/REPO")]
        registry: Option<String>,
        /// The registry speaks plain HTTP.
        #[arg(long, requires = "registry")]
        registry_insecure: bool,
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
        ClusterCmd::Gateway {
            listen,
            state_dir,
            registry,
            registry_insecure,
        } => {
            crate::init_tracing();
            if let Some(r) = &registry {
                if !r.contains('/')
                    || (r.contains(':') && r.rsplit('/').next().is_some_and(|t| t.contains(':')))
                {
                    bail!("--registry {r:?}: give HOST[:PORT]/REPOSITORY, without a tag");
                }
            }
            let cfg = forkvm_cluster::Config {
                listen,
                state_dir,
                client_token: std::env::var(forkvm_api::ENV_TOKEN).unwrap_or_default(),
                cluster_token: std::env::var("FORKVM_CLUSTER_TOKEN").unwrap_or_default(),
                registry: registry.map(|repository| forkvm_cluster::Registry {
                    repository,
                    username: std::env::var("FORKVM_REGISTRY_USER").ok(),
                    password: std::env::var("FORKVM_REGISTRY_PASSWORD").ok(),
                    insecure: registry_insecure,
                }),
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

/// The Python that runs `forkvm.ray`: `FORKVM_PYTHON`, else the `.venv` of
/// the checkout this binary was built in (`target/*/forkvm` two levels
/// below it, where `scripts/setup.sh` installs `forkvm[ray]`), else `python3`.
fn python_for_ray() -> String {
    if let Ok(p) = std::env::var("FORKVM_PYTHON") {
        return p;
    }
    let venv = std::env::current_exe().ok().and_then(|exe| {
        let repo = exe.parent()?.parent()?.parent()?;
        let py = repo.join(".venv/bin/python");
        py.exists().then(|| py.to_string_lossy().into_owned())
    });
    venv.unwrap_or_else(|| "python3".into())
}

fn python(what: &str, args: &[String]) -> Result<ExitCode> {
    let py = python_for_ray();
    let mut cmd = std::process::Command::new(&py);
    // The node services start this same binary unless told otherwise.
    if std::env::var_os("FORKVM_BIN").is_none() {
        if let Ok(exe) = std::env::current_exe() {
            cmd.env("FORKVM_BIN", exe);
        }
    }
    let status = cmd
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
