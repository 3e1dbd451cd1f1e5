//! `forkvm pause`, `resume`, `timeout` and `network`, and the spawn flags for
//! metadata, environment and timeouts.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use forkvm_api::{Client, OnTimeout, PauseRequest, ResumeRequest, Sandbox, SetNetwork, SetTimeout};

/// Resource limit flags (docs/limits.md); omitted ones are unlimited (or,
/// on a branch, the source's).
#[derive(clap::Args, Clone, Default)]
pub struct LimitArgs {
    /// CPU time QEMU may use, in percent of one host core (50 = half a core).
    #[arg(long, value_name = "PERCENT")]
    pub cpu_percent: Option<u32>,
    /// Memory QEMU may use beyond the guest's RAM, in MiB.
    #[arg(long, value_name = "MiB")]
    pub memory_overhead: Option<u32>,
    /// Disk operations per second (reads and writes together).
    #[arg(long, value_name = "N")]
    pub disk_iops: Option<u64>,
    /// Disk bandwidth per second, e.g. 20M.
    #[arg(long, value_name = "SIZE", value_parser = crate::image::parse_size)]
    pub disk_bps: Option<u64>,
    /// Network rate in each direction, kbit/s.
    #[arg(long, value_name = "KBIT")]
    pub net_kbps: Option<u64>,
    /// Processes and threads QEMU may have.
    #[arg(long, value_name = "N")]
    pub pids: Option<u32>,
}

impl LimitArgs {
    pub fn limits(&self) -> Option<forkvm_api::SandboxLimits> {
        let l = forkvm_api::SandboxLimits {
            cpu_percent: self.cpu_percent,
            memory_overhead_mib: self.memory_overhead,
            disk_iops: self.disk_iops,
            disk_bps: self.disk_bps,
            net_kbps: self.net_kbps,
            pids: self.pids,
        };
        (!l.is_empty()).then_some(l)
    }
}

/// `spawn` flags for what a sandbox carries through its life (`run`
/// removes its sandbox at once, and its `-e`/`--timeout` are the command's).
#[derive(clap::Args, Clone, Default)]
pub struct LifeArgs {
    /// A metadata label KEY=VALUE (repeatable); `forkvm ps --metadata`
    /// filters by it.
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_pair)]
    pub metadata: Vec<(String, String)>,
    /// An environment variable every exec starts with (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_pair)]
    pub env: Vec<(String, String)>,
    /// Remove the sandbox after this many seconds (or pause it, with
    /// --on-timeout pause).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// What happens when the timeout runs out: kill, pause, or
    /// pause-filesystem (keep only the disk; the resume cold-boots).
    #[arg(long, value_parser = parse_on_timeout, requires = "timeout")]
    pub on_timeout: Option<OnTimeout>,
}

impl LifeArgs {
    pub fn apply(&self, req: &mut forkvm_api::CreateSandbox) {
        if !self.metadata.is_empty() {
            req.metadata = Some(self.metadata.iter().cloned().collect());
        }
        if !self.env.is_empty() {
            req.env = Some(self.env.iter().cloned().collect());
        }
        req.timeout = self.timeout;
        req.on_timeout = self.on_timeout;
    }
}

pub fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn parse_on_timeout(s: &str) -> Result<OnTimeout, String> {
    match s {
        "kill" => Ok(OnTimeout::Kill),
        "pause" => Ok(OnTimeout::Pause),
        "pause-filesystem" | "pause_filesystem" => Ok(OnTimeout::PauseFilesystem),
        _ => Err(format!("{s:?}: use kill, pause or pause-filesystem")),
    }
}

fn parse_timeout(s: &str) -> Result<Option<u64>, String> {
    if s == "none" {
        return Ok(None);
    }
    s.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("{s:?} is not a number of seconds (or `none`)"))
}

/// The lifetime commands.
#[derive(Subcommand)]
pub enum LifeCmd {
    /// Save a running sandbox to disk and free its RAM and QEMU.
    Pause {
        id: String,
        /// Keep only the disk: no memory is saved, and the resume cold-boots
        /// from the disk (same id, network and ports; no processes).
        #[arg(long)]
        no_memory: bool,
    },
    /// Bring a paused sandbox back (same id, memory, disk, ports).
    Resume {
        id: String,
        /// A new timeout in seconds (default: what it had left).
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
        /// Cold-boot from the saved disk even if memory was saved.
        #[arg(long)]
        no_memory: bool,
    },
    /// Print the daemon's Prometheus metrics.
    Metrics,
    /// Set a sandbox's timeout, from now: SECS, or `none` to clear it.
    Timeout {
        id: String,
        #[arg(value_name = "SECS|none")]
        secs: String,
        /// Also change what happens when it runs out.
        #[arg(long, value_parser = parse_on_timeout)]
        on_timeout: Option<OnTimeout>,
    },
    /// Replace a running sandbox's egress allow-list, without a restart:
    /// new connections follow it at once, established ones are kept.
    #[command(group = clap::ArgGroup::new("egress").required(true).args(["allow", "any"]))]
    Network {
        id: String,
        /// Allow egress only to this IPv4 address or network, optionally
        /// only to these TCP/UDP ports (repeatable), as `spawn --allow`.
        #[arg(long = "allow", value_name = "CIDR[:PORT,...]", value_parser = crate::args::parse_allow)]
        allow: Vec<forkvm_api::EgressRule>,
        /// Let the --allow entries reach the host itself.
        #[arg(long, requires = "allow")]
        allow_host: bool,
        /// Drop the allow-list: any egress (but the host and other
        /// sandboxes), as a spawn without --allow.
        #[arg(long, conflicts_with_all = ["allow", "allow_host"])]
        any: bool,
    },
}

/// The body of `forkvm network`.
fn set_network(allow: Vec<forkvm_api::EgressRule>, allow_host: bool, any: bool) -> SetNetwork {
    SetNetwork {
        egress: (!any).then_some(allow),
        allow_host: allow_host.then_some(true),
    }
}

fn network_summary(id: &str, n: &forkvm_api::NetworkInfo) -> String {
    let list = match &n.egress {
        None => "any egress".to_string(),
        Some(l) if l.is_empty() => "no egress".to_string(),
        Some(l) => l
            .iter()
            .map(|r| {
                if r.ports.is_empty() {
                    r.cidr.clone()
                } else {
                    let p: Vec<String> = r.ports.iter().map(u16::to_string).collect();
                    format!("{}:{}", r.cidr, p.join(","))
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
    };
    let host = if n.allow_host { " (host too)" } else { "" };
    format!("{id} egress: {list}{host}")
}

fn summary(s: &Sandbox) -> String {
    let state = serde_json::to_value(s.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut out = format!("{} {state}", s.id);
    if let Some(p) = &s.paused {
        out += &match &p.snapshot {
            Some(snap) if p.memory => format!(
                " (saved {} memory + {} disk bytes as {snap}, stopped {:.1} ms)",
                p.memory_bytes, p.disk_bytes, p.pause_ms
            ),
            _ => format!(
                " (disk only, {} bytes kept; a resume cold-boots; stopped {:.1} ms)",
                p.disk_bytes, p.pause_ms
            ),
        };
    }
    if let Some(l) = &s.lifetime {
        out += &format!(
            " timeout {} s, {:.0} s left, then {}",
            l.timeout,
            l.remaining_s,
            match l.on_timeout {
                OnTimeout::Kill => "kill",
                OnTimeout::Pause => "pause",
                OnTimeout::PauseFilesystem => "pause (disk only)",
            }
        );
    }
    out
}

pub async fn run(c: &Client, cmd: LifeCmd, json: bool) -> Result<ExitCode> {
    let s = match cmd {
        LifeCmd::Network {
            id,
            allow,
            allow_host,
            any,
        } => {
            let n = c
                .set_network(&id, &set_network(allow, allow_host, any))
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&n)?);
            } else {
                println!("{}", network_summary(&id, &n));
            }
            return Ok(ExitCode::SUCCESS);
        }
        LifeCmd::Metrics => {
            let b = c.call(forkvm_api::Method::GET, "/metrics", None).await?;
            print!("{}", String::from_utf8_lossy(&b));
            return Ok(ExitCode::SUCCESS);
        }
        LifeCmd::Pause { id, no_memory } => {
            let req = PauseRequest {
                memory: no_memory.then_some(false),
            };
            c.pause(&id, &req).await?
        }
        LifeCmd::Resume {
            id,
            timeout,
            no_memory,
        } => {
            let req = ResumeRequest {
                timeout,
                memory: no_memory.then_some(false),
            };
            c.resume(&id, &req).await?
        }
        LifeCmd::Timeout {
            id,
            secs,
            on_timeout,
        } => {
            let timeout = parse_timeout(&secs).map_err(anyhow::Error::msg)?;
            c.set_timeout(
                &id,
                &SetTimeout {
                    timeout,
                    on_timeout,
                },
            )
            .await?
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{}", summary(&s));
    }
    Ok(ExitCode::SUCCESS)
}

/// `forkvm ps --metadata K=V` filters.
pub fn filters(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    pairs.iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_timeouts_parse() {
        assert_eq!(parse_pair("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert_eq!(parse_pair("a=").unwrap(), ("a".into(), String::new()));
        assert!(parse_pair("=b").is_err());
        assert!(parse_pair("ab").is_err());
        assert_eq!(parse_timeout("none").unwrap(), None);
        assert_eq!(parse_timeout("30").unwrap(), Some(30));
        assert!(parse_timeout("-1").is_err());
        assert_eq!(parse_on_timeout("pause").unwrap(), OnTimeout::Pause);
        assert_eq!(
            parse_on_timeout("pause-filesystem").unwrap(),
            OnTimeout::PauseFilesystem
        );
        assert!(parse_on_timeout("stop").is_err());
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: LifeCmd,
    }

    fn network(args: &[&str]) -> Result<SetNetwork, clap::Error> {
        use clap::Parser;
        let cli = Cli::try_parse_from(std::iter::once("forkvm").chain(args.iter().copied()))?;
        match cli.cmd {
            LifeCmd::Network {
                allow,
                allow_host,
                any,
                ..
            } => Ok(set_network(allow, allow_host, any)),
            _ => unreachable!(),
        }
    }

    #[test]
    fn network_takes_an_allow_list_or_any() {
        let n = network(&[
            "network",
            "x",
            "--allow",
            "10.0.0.0/8:80,443",
            "--allow-host",
        ])
        .unwrap();
        let list = n.egress.unwrap();
        assert_eq!(list[0].cidr, "10.0.0.0/8");
        assert_eq!(list[0].ports, vec![80, 443]);
        assert_eq!(n.allow_host, Some(true));
        let n = network(&["network", "x", "--any"]).unwrap();
        assert_eq!(n.egress, None);
        assert_eq!(n.allow_host, None);
        // Nothing said, or both said: refused rather than guessed.
        assert!(network(&["network", "x"]).is_err());
        assert!(network(&["network", "x", "--any", "--allow", "10.0.0.1"]).is_err());
        assert!(network(&["network", "x", "--allow-host"]).is_err());
    }
}
