//! The forkvm host daemon (`forkvm serve`): the front-ends over the engine.
//!
//! The engine (`forkvm-engine`) owns every microVM on the host. This crate
//! serves it: the REST API and dashboard ([`api`]) on a unix socket and
//! optionally on TCP with a bearer token, where the E2B API ([`e2b`]), MCP
//! ([`mcp`]) and the node's read-only OCI registry ([`oci`]) are served too.
//!
//! Start-up order matters:
//! 1. take an exclusive `flock` on `daemon.lock`, so two daemons never manage
//!    the same data directory;
//! 2. choose the accelerator (which may boot a probe VM);
//! 3. re-attach to sandboxes an earlier daemon left running;
//! 4. only then bind the socket, so a client never sees a half-started daemon.
//!
//! On SIGTERM/SIGINT the daemon stops serving and exits, leaving the VMs
//! running; the next daemon re-attaches to them. With no VM left running it
//! also deletes its host nftables table.

pub mod api;
pub mod e2b;
pub use forkvm_listen as listen;
pub mod mcp;
pub mod oci;
pub mod session;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

// The engine's modules this crate names: the facade and the error, which
// the front-ends use, and what the start-up (`serve`) and the CLI need. No
// other engine module is in reach of a front-end.
pub use forkvm_engine::{actions, cgroup, config, db, error, net, registry, util};
pub use forkvm_engine::{choose_accel, Config, Engine, MAX_POOL};

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Setup(String),
    #[error(
        "another forkvm daemon already manages {0} (its lock is held); use it, or stop it first"
    )]
    AlreadyRunning(String),
}

fn lock_home(home: &Path) -> Result<std::fs::File, StartError> {
    use std::os::unix::io::AsRawFd;
    let path = home.join("daemon.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StartError::Setup(format!("cannot open {}: {e}", path.display())))?;
    // SAFETY: flock(2) on a file descriptor we own; no memory is involved.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(StartError::AlreadyRunning(home.display().to_string()));
    }
    Ok(f)
}

/// Run the daemon until SIGTERM/SIGINT.
pub async fn serve(cfg: Config) -> Result<(), StartError> {
    serve_session(cfg, session::Session::default())
        .await
        .map(|_| ())
}

/// Run the daemon until SIGTERM/SIGINT or the session's stop, reporting
/// readiness to the session and tearing the sandboxes down at the end if
/// it asks for that (crate::session).
pub async fn serve_session(
    cfg: Config,
    mut session: session::Session,
) -> Result<session::Ended, StartError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| StartError::Setup(format!("{what}: {e}"));
    // Before anything opens a file: every connection, sandbox socket and
    // log holds a descriptor (crate::listen).
    let (nofile, nofile_before) = listen::raise_nofile();
    let (tcp_limits, unix_limits) = listen::budgets(nofile);
    tracing::info!(
        "file descriptors: soft limit {nofile} (was {nofile_before}); at most {} TCP connections \
         ({} unauthenticated) and {} on the unix socket",
        tcp_limits.max,
        tcp_limits.max_unauthenticated,
        unix_limits.max
    );
    std::fs::create_dir_all(&cfg.home)
        .map_err(|e| setup(&format!("cannot create {}", cfg.home.display()), &e))?;
    std::fs::create_dir_all(cfg.sandboxes_dir())
        .map_err(|e| setup("cannot create sandboxes dir", &e))?;
    let _lock = lock_home(&cfg.home)?;
    // Leftovers of a crash while images were uploaded or installed: never
    // complete, never listed (see the forkvm-image crate).
    let _ = std::fs::remove_dir_all(cfg.home.join("uploads"));
    forkvm_image::install::clean_leftovers(&cfg.images_dir());
    if let Ok(b) = forkvm_image::blobs::BlobStore::open(cfg.home.join("blobs")) {
        b.clean_ingest();
        // Blobs of pulls and imports a killed daemon left: no image has
        // them and no install runs yet.
        let st = forkvm_image::install::gc_blobs(&b, &cfg.images_dir());
        if st.blobs > 0 {
            tracing::info!(
                "blobs: {} no image uses removed at start ({} bytes)",
                st.blobs,
                st.bytes
            );
        }
    }

    if let Some(n) = &cfg.node {
        util::check_node_name(n).map_err(StartError::Setup)?;
    }
    // A sandbox's QEMU sockets live under the home: the longest one must fit
    // a unix socket path (108 bytes with the NUL), or every spawn would fail.
    let longest = cfg.sandbox_paths(&util::node_id("sb", cfg.node.as_deref()));
    let longest = longest.volumes_sock.as_os_str().len();
    if longest > 107 {
        return Err(StartError::Setup(format!(
            "the home {} is too long: a sandbox's socket path there would be {longest} bytes, \
             over the 107 a unix socket allows; use a home path at most {} bytes long",
            cfg.home.display(),
            cfg.home.as_os_str().len() - (longest - 107)
        )));
    }
    if cfg.tcp.is_some() && cfg.token.as_deref().is_none_or(str::is_empty) {
        return Err(StartError::Setup(
            "serving on TCP needs a bearer token: set FORKVM_TOKEN".into(),
        ));
    }
    let qemu_version = features::version(&cfg.qemu).await.map_err(|e| {
        StartError::Setup(format!("{e}; run scripts/setup.sh to install QEMU >= 10"))
    })?;
    if qemu_version.major < 10 {
        return Err(StartError::Setup(format!(
            "{} is too old: forkvm needs QEMU >= 10 (run scripts/setup.sh)",
            qemu_version.text
        )));
    }
    let accel = choose_accel(&cfg, cfg.accel)
        .await
        .map_err(StartError::Setup)?;
    tracing::info!("accelerator: {} ({})", accel.accel, accel.reason);

    let db =
        db::Db::open(&cfg.db_path()).map_err(|e| setup("cannot open the state database", &e))?;
    let store = forkvm_store::Store::open(&cfg.snapshots_dir())
        .map_err(|e| setup("cannot open the snapshot store", &e))?;
    let socket = cfg.socket.clone();
    let tcp = cfg.tcp;
    let token = cfg.token.clone();
    let pool_size = cfg.default_pool_size;
    // Every listener is bound before the unix socket appears: clients (and
    // the tests) take an accepting unix socket to mean the daemon is ready,
    // so the TCP port must already accept by then. It is bound before
    // anything is set up on the host (the home's nftables table, cgroups),
    // so a port that is taken fails the start with nothing to undo; a
    // client that connects this early waits in the backlog until serving.
    let tcp_listener = match tcp {
        Some(addr) => {
            Some(listen::bind_tcp(addr).map_err(|e| setup(&format!("cannot bind {addr}"), &e))?)
        }
        None => None,
    };
    let tcp_bound = tcp_listener.as_ref().and_then(|l| l.local_addr().ok());
    let net = net::Net::start(&cfg.home, &cfg.net_pool)
        .await
        .map_err(|e| StartError::Setup(format!("{e}; fix --net-pool")))?;
    let engine = Engine::new(cfg, db, store, accel, qemu_version.text, pool_size, net);
    engine
        .start()
        .await
        .map_err(|e| StartError::Setup(format!("cannot re-attach sandboxes: {e}")))?;

    if let Some(addr) = tcp_bound.or(tcp) {
        tracing::info!("listening on http://{addr} (bearer token required)");
    }
    // We hold the lock, so a socket file left here is stale.
    let _ = std::fs::remove_file(&socket);
    let ul = match tokio::net::UnixListener::bind(&socket) {
        Ok(ul) => ul,
        Err(e) => {
            // What this start set up on the host goes with it.
            engine.abandon().await;
            return Err(setup(&format!("cannot bind {}", socket.display()), &e));
        }
    };
    let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600));
    tracing::info!("listening on {}", socket.display());

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let unix_app = api::router(engine.clone(), None);
    let unix_task = tokio::spawn(listen::serve(
        ul,
        unix_app,
        unix_limits,
        true,
        "unix socket",
        stop_rx.clone(),
    ));
    let tcp_task = match tcp_listener {
        Some(tl) => {
            // One listener, two APIs: forkvm's own under /v1 (and /mcp), and
            // the E2B-compatible one for everything else (crate::e2b).
            let token = token.unwrap_or_default();
            let rest = api::router(engine.clone(), Some(token.clone()));
            let e2b = e2b::router(engine.clone(), token.clone());
            // And the node's snapshots, read-only over the OCI distribution
            // API, for other nodes to pull (crate::oci).
            let oci = oci::router(Arc::new(oci::Served::new(
                Box::new(oci::EngineSource(engine.clone())),
                token,
            )));
            let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
                let (rest, e2b, oci) = (rest.clone(), e2b.clone(), oci.clone());
                async move {
                    use tower::ServiceExt;
                    if oci::is_oci_path(req.uri().path()) {
                        axum::response::IntoResponse::into_response(oci.oneshot(req).await)
                    } else {
                        e2b::dispatch(rest, e2b, req).await
                    }
                }
            });
            Some(tokio::spawn(listen::serve(
                tl,
                app,
                tcp_limits,
                false,
                "TCP listener",
                stop_rx.clone(),
            )))
        }
        None => None,
    };

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| setup("cannot install SIGTERM handler", &e))?;
    if let Some(tx) = session.ready.take() {
        let _ = tx.send(session::Ready {
            socket: socket.clone(),
            tcp: tcp_bound,
        });
    }
    let stop = session.stop.take();
    let stopped = async move {
        match stop {
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| "the session's stop was dropped".into()),
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        _ = term.recv() => session::Ended::Signal(session.teardown_on_signal),
        _ = tokio::signal::ctrl_c() => session::Ended::Signal(session.teardown_on_signal),
        why = stopped => session::Ended::Stopped(why, session.teardown_on_stop),
    };
    if ended.torn_down() {
        tracing::info!("shutting down ({ended:?}); removing every sandbox");
    } else {
        tracing::info!("shutting down; sandboxes keep running");
    }
    let _ = stop_tx.send(true);
    // In-flight requests get a moment to finish; VMs are not touched.
    let _ = tokio::time::timeout(Duration::from_secs(5), unix_task).await;
    if let Some(t) = tcp_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    if ended.torn_down() {
        for p in session::teardown(&engine).await {
            tracing::warn!("teardown: cannot remove {p}");
        }
    }
    // Pooled QEMUs go; running sandboxes keep their host rules for the
    // next daemon (crate::actions::Engine::stop).
    engine.stop().await;
    let _ = std::fs::remove_file(&socket);
    Ok(ended)
}

/// Re-exported for the CLI.
pub use forkvm_engine::features;
