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
mod commands;
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
mod timeline;
mod transfer;
mod ui;
mod volume;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::args::*;
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
    match rt.block_on(commands::run(cli)) {
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
