//! Reaching the daemon: the client, and a local daemon started when the
//! default socket does not answer.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use forkvm_api::{Client, ClientError, Target};

/// A client for the daemon, starting a local one when the default socket
/// does not answer.
pub(crate) async fn client() -> Result<Client> {
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

pub(crate) fn start_daemon(home: &std::path::Path) -> Result<()> {
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
