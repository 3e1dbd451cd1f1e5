//! `forkvm serve --ephemeral`: the one way tests, SDK suites and benches start
//! a daemon (docs/testing.md#the-test-launcher).
//!
//! It makes a temporary home that links the installed guest artefacts and
//! images, takes a host-wide slot that gives it a network pool and jail uid
//! range of its own, generates a token, serves 127.0.0.1 on a free port,
//! and prints one JSON line when it is ready. Its life is bound to its
//! parent: it ends when its stdin reaches end of file (the kernel closes
//! the parent's end of the pipe however the parent dies, SIGKILL included),
//! when `--parent-pid` exits (watched through a pidfd, so it is the
//! process, not the thread that forked, as `PR_SET_PDEATHSIG` would be),
//! or on SIGTERM/SIGINT. Then every sandbox is removed and the home deleted.
//!
//! A SIGKILL of the daemon itself cannot be handled by it, and jailed QEMUs
//! outlive their daemon by design (a restarted daemon re-attaches to them).
//! So a temporary home gets a *reaper*: a process in a session of its own
//! that blocks on a pipe only the daemon holds. When the daemon is gone
//! and the home is still there, the reaper runs this same command on that
//! home (`--session-home`) with its stdin already closed: it re-attaches to
//! the orphans like any restarted daemon, then tears them down and deletes
//! the home.
//!
//! `--session-home DIR` is for harnesses that restart a daemon on one home
//! (crash and restart tests): SIGTERM/SIGINT then stop it like a plain
//! daemon, leaving the sandboxes for the next one; only the end of stdin or
//! of `--parent-pid` tears down and deletes DIR. It gets no reaper.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// `forkvm serve`'s launcher options.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct EphemeralArgs {
    /// Run as a test daemon: a temporary home linking the artefacts of
    /// --artifacts, a free network pool and jail uid range, a generated
    /// token (unless FORKVM_TOKEN is set) and 127.0.0.1 on a free port
    /// (unless --listen). It ends when its stdin reaches end of file (keep
    /// the pipe open; the kernel closes it however the parent dies, SIGKILL
    /// included; PR_SET_PDEATHSIG is not used, as it fires when the parent
    /// *thread* exits), when --parent-pid exits (a pidfd), or on
    /// SIGTERM/SIGINT, and then removes every sandbox and deletes its home.
    /// A reaper process does the same if the daemon itself is killed with
    /// SIGKILL. Not ready within 60 s: exit 1. See docs/testing.md.
    #[arg(long)]
    pub(crate) ephemeral: bool,
    /// With --ephemeral: print one JSON line on stdout when ready (url,
    /// token, home, socket, pid, port, net_pool, jail_uids).
    #[arg(long, requires = "ephemeral")]
    pub(crate) print_json: bool,
    /// With --ephemeral: where `guest/` and `images/` are linked from
    /// (default: --home, i.e. $FORKVM_HOME or /var/lib/forkvm). Ignored
    /// without --ephemeral (so that the variable never stops a plain serve).
    #[arg(long, value_name = "DIR", env = "FORKVM_ARTIFACTS")]
    pub(crate) artifacts: Option<PathBuf>,
    /// With --ephemeral: make the temporary home in DIR (default: $TMPDIR
    /// or /tmp; keep it short, socket paths are limited to 107 bytes).
    #[arg(long, value_name = "DIR", requires = "ephemeral")]
    pub(crate) home_parent: Option<PathBuf>,
    /// With --ephemeral: use DIR as the home (made, and the artefacts
    /// linked, when missing) so that another daemon can be started on it;
    /// SIGTERM/SIGINT then leave the sandboxes running for it, and only the
    /// end of stdin or of --parent-pid removes them and deletes DIR.
    #[arg(long, value_name = "DIR", requires = "ephemeral")]
    pub(crate) session_home: Option<PathBuf>,
    /// With --ephemeral: also end when this process exits.
    #[arg(long, value_name = "PID", requires = "ephemeral")]
    pub(crate) parent_pid: Option<i32>,
    /// Internal: this is the reaper of a killed daemon's home; wait for
    /// stdin to close, then tear down what is left in --session-home.
    #[arg(long, hide = true, requires = "session_home")]
    pub(crate) reaper: bool,
}

/// Host-wide slots: slot K has its own network pool and jail uids, so
/// parallel test daemons never share either (the pool registry and uid
/// locks would keep them apart anyway; separate ranges keep one run's
/// addresses and uids recognisable and its pool from filling another's).
const SLOT_DIR: &str = "/run/forkvm/ephemeral";
const SLOTS: u32 = 128;

/// How long a start may take before the launcher gives up (exits 1 with no
/// JSON line; the reaper then removes what it made). It is the one
/// readiness timeout of every harness: they wait for the line or its end.
/// Choosing the accelerator may boot a probe VM, and a restarted daemon
/// re-attaches to every sandbox first; 60 s holds under TCG on 2 busy cores.
pub(crate) const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The pool of slot `k`: a /20 (1,024 sandboxes) in 10.200.0.0/13.
fn slot_pool(k: u32) -> String {
    let base = u32::from(std::net::Ipv4Addr::new(10, 200, 0, 0)) + k * 4096;
    format!("{}/20", std::net::Ipv4Addr::from(base))
}

/// The jail uids of slot `k`: 10,000 from 3,000,000 + 10,000·k (above
/// the default range of a plain daemon).
fn slot_uids(k: u32) -> (u32, u32) {
    (3_000_000 + k * 10_000, 10_000)
}

/// A prepared ephemeral daemon: its home and what it was given.
pub(crate) struct Prepared {
    pub(crate) home: PathBuf,
    /// True when the home is ours to delete whatever ends the daemon.
    temporary: bool,
    pub(crate) slot: Option<(String, (u32, u32))>,
    _slot_lock: Option<std::fs::File>,
}

/// Make (or take) the home and a slot. `artifacts_default` is --home.
/// `None` for a reaper whose daemon ended cleanly (nothing to do).
pub(crate) fn prepare(a: &EphemeralArgs, artifacts_default: &Path) -> Result<Option<Prepared>> {
    if a.reaper {
        // Wait for the daemon whose home this is to be gone; one that ended
        // cleanly deleted its home.
        drain_stdin();
        let home = a.session_home.as_deref().unwrap_or(artifacts_default);
        if !home.exists() {
            return Ok(None);
        }
        // The kernel closes a dying process's descriptors one by one: the
        // pipe can reach end of file before the lock on the home is let go.
        wait_for_lock(&home.join("daemon.lock"));
        // Never eprintln!: stderr may be a pipe nobody reads any more.
        let _ = writeln!(
            std::io::stderr(),
            "forkvm: the ephemeral daemon of {} is gone and left it; tearing down what is in it",
            home.display()
        );
    }
    let art = a
        .artifacts
        .clone()
        .unwrap_or_else(|| artifacts_default.to_path_buf());
    let (home, temporary) = match &a.session_home {
        Some(h) => {
            std::fs::create_dir_all(h).with_context(|| format!("creating {}", h.display()))?;
            (h.clone(), false)
        }
        None => {
            let parent = a.home_parent.clone().unwrap_or_else(std::env::temp_dir);
            let d = tempfile::Builder::new()
                .prefix("forkvm-eph-")
                .tempdir_in(&parent)
                .with_context(|| format!("making a temporary home in {}", parent.display()))?;
            (d.keep(), true)
        }
    };
    if let Err(e) = link_artifacts(&art, &home) {
        if temporary {
            let _ = std::fs::remove_dir_all(&home);
        }
        return Err(e);
    }
    let (slot, lock) = match take_slot() {
        Ok((k, f)) => (Some((slot_pool(k), slot_uids(k))), Some(f)),
        Err(e) => {
            if temporary {
                let _ = std::fs::remove_dir_all(&home);
            }
            return Err(e);
        }
    };
    Ok(Some(Prepared {
        home,
        temporary,
        slot,
        _slot_lock: lock,
    }))
}

/// Link `guest/` and each image of `art` into `home` (what is there
/// already, e.g. a test's own broken initramfs, is kept). Images get a
/// directory of the home's own, so images a test builds stay in it.
fn link_artifacts(art: &Path, home: &Path) -> Result<()> {
    if !art.join("guest").join("vmlinux").is_file() {
        bail!(
            "no guest kernel at {}: run scripts/setup.sh, or give --artifacts DIR",
            art.join("guest/vmlinux").display()
        );
    }
    if !home.join("guest").exists() {
        std::os::unix::fs::symlink(art.join("guest"), home.join("guest"))
            .context("linking guest/")?;
    }
    if !home.join("images").exists() {
        std::fs::create_dir(home.join("images")).context("making images/")?;
        let rd = std::fs::read_dir(art.join("images"))
            .with_context(|| format!("reading {}", art.join("images").display()))?;
        for e in rd.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), home.join("images").join(&name))
                .context("linking an image")?;
        }
    }
    Ok(())
}

/// Wait (up to 60 s) until nobody holds the flock on `path`: the killed
/// daemon's lock goes with its last descriptor.
fn wait_for_lock(path: &Path) {
    let Ok(f) = std::fs::OpenOptions::new().write(true).open(path) else {
        return;
    };
    let t = std::time::Instant::now();
    // SAFETY: flock(2) on a descriptor we own; closing it below unlocks.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0
        && t.elapsed() < std::time::Duration::from_secs(60)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Take the first free slot: its flock is held as long as the daemon runs.
fn take_slot() -> Result<(u32, std::fs::File)> {
    std::fs::create_dir_all(SLOT_DIR).with_context(|| format!("creating {SLOT_DIR}"))?;
    for k in 0..SLOTS {
        let p = Path::new(SLOT_DIR).join(format!("slot-{k}"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .with_context(|| format!("opening {}", p.display()))?;
        // SAFETY: flock(2) on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((k, f));
        }
    }
    bail!("all {SLOTS} test-daemon slots in {SLOT_DIR} are taken: too many ephemeral daemons run")
}

/// 32 hex digits from the kernel's random source.
pub(crate) fn token() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Block until stdin reaches end of file (or fails).
fn drain_stdin() {
    let mut buf = [0u8; 512];
    let mut stdin = std::io::stdin();
    while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
}

/// Block until process `pid` exits.
fn wait_pid(pid: i32) -> Result<()> {
    // SAFETY: pidfd_open(2) takes no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        bail!("--parent-pid {pid}: {}", std::io::Error::last_os_error());
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on our stack; a pidfd turns readable when the
    // process exits.
    while unsafe { libc::poll(&mut p, 1, -1) } < 0 {}
    // SAFETY: closing the pidfd opened above.
    unsafe { libc::close(fd) };
    Ok(())
}

/// Start the reaper of a temporary home (see the module's docs): this
/// command again, with `--session-home HOME --reaper`, in a session of its
/// own, its stdin a pipe whose write end only this process holds.
fn start_reaper(home: &Path, cfg: &forkvm_daemon::Config) -> Result<std::process::ChildStdin> {
    use std::os::unix::process::CommandExt;
    // This very binary, even if its file was replaced since (a rebuild
    // while tests run): /proc/self/exe, read by the forked child.
    let mut cmd = std::process::Command::new("/proc/self/exe");
    if let Some(a0) = std::env::args_os().next() {
        cmd.arg0(a0);
    }
    cmd.args(std::env::args_os().skip(1))
        .arg("--session-home")
        .arg(home)
        .arg("--reaper")
        // The daemon's own pool and uids (an explicit flag gives the same).
        .env("FORKVM_NET_POOL", &cfg.net_pool)
        .env(
            "FORKVM_JAIL_UIDS",
            format!(
                "{}-{}",
                cfg.jail_uids.0,
                cfg.jail_uids.0 + cfg.jail_uids.1 - 1
            ),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    // SAFETY: setsid() is async-signal-safe; the reaper must survive a
    // signal to our process group.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the reaper")?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow!("no pipe to the reaper"))
}

/// Run the prepared daemon until its parent goes away (or a signal).
pub(crate) async fn serve(
    mut cfg: forkvm_daemon::Config,
    a: &EphemeralArgs,
    p: Prepared,
) -> Result<()> {
    let _reaper = if p.temporary {
        Some(start_reaper(&p.home, &cfg)?)
    } else {
        None
    };
    if cfg.tcp.is_none() {
        cfg.tcp = Some("127.0.0.1:0".parse().expect("loopback"));
    }
    if cfg.token.is_none() {
        cfg.token = Some(token()?);
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let (why_tx, mut why_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    {
        let tx = why_tx.clone();
        std::thread::spawn(move || {
            drain_stdin();
            let _ = tx.send("stdin closed".into());
        });
    }
    if let Some(pid) = a.parent_pid {
        let tx = why_tx.clone();
        // Checked now, so that a wrong pid fails the start.
        // SAFETY: kill(pid, 0) only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            bail!("--parent-pid {pid}: no such process");
        }
        std::thread::spawn(move || {
            let why = match wait_pid(pid) {
                Ok(()) => format!("parent {pid} exited"),
                Err(e) => format!("{e:#}"),
            };
            let _ = tx.send(why);
        });
    }
    tokio::spawn(async move {
        if let Some(why) = why_rx.recv().await {
            let _ = stop_tx.send(why);
        }
    });
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let session = forkvm_daemon::session::Session {
        ready: Some(ready_tx),
        stop: Some(stop_rx),
        teardown_on_signal: p.temporary,
        teardown_on_stop: true,
    };
    let token = cfg.token.clone().unwrap_or_default();
    let net_pool = cfg.net_pool.clone();
    let uids = cfg.jail_uids;
    let run_dir = cfg.run_dir.clone();
    let home = p.home.clone();
    let print = a.print_json;
    let ready_flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ready_flag.clone();
    let server = tokio::spawn(forkvm_daemon::serve_session(cfg, session));
    let reporter = tokio::spawn(async move {
        let Ok(r) = ready_rx.await else { return };
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        let port = r.tcp.map(|t| t.port());
        let line = serde_json::json!({
            "url": r.tcp.map(|t| format!("http://{t}")),
            "token": token,
            "home": home,
            "socket": r.socket,
            "pid": std::process::id(),
            "port": port,
            "net_pool": net_pool,
            "jail_uids": format!("{}-{}", uids.0, uids.0 + uids.1 - 1),
        });
        if print {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            // Nothing else goes to stdout: a harness that reads one line
            // and then no more must never block us.
            // SAFETY: dup2 onto our own stdout.
            unsafe { libc::dup2(2, 1) };
        }
        tracing::info!("ephemeral daemon ready: {line}");
    });
    // The readiness deadline (READY_TIMEOUT), on a thread of its own so
    // that nothing in the start can hold it up.
    {
        let flag = ready_flag.clone();
        std::thread::spawn(move || {
            std::thread::sleep(READY_TIMEOUT);
            if !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = writeln!(
                    std::io::stderr(),
                    "forkvm serve --ephemeral: not ready within {} s; giving up",
                    READY_TIMEOUT.as_secs()
                );
                std::process::exit(1);
            }
        });
    }
    let r = server.await?;
    reporter.abort();
    let ended = match r {
        Ok(e) => Some(e),
        Err(e) => {
            if p.temporary {
                let _ = std::fs::remove_dir_all(&p.home);
            }
            return Err(e.into());
        }
    };
    if p.temporary || ended.as_ref().is_some_and(|e| e.torn_down()) {
        let _ = std::fs::remove_dir_all(&run_dir);
        if let Err(e) = std::fs::remove_dir_all(&p.home) {
            // A mount point (a test's small filesystem) stays, emptied.
            tracing::debug!("removing {}: {e}", p.home.display());
        }
    }
    Ok(())
}
