//! The host side of the guest-agent channel (see `forkvm_agent_protocol`).
//!
//! One connection per sandbox, to the unix socket QEMU listens on for the
//! agent's virtio-serial port. A reader task routes each guest frame to the
//! request that owns its id. Ids start at a random point for every connection
//! so that a reply written by the guest for a request from a previous daemon
//! (delivered when we reconnect) can never be taken for a new request's reply.
//!
//! Agents live inside snapshots, so a sandbox can run an agent older than
//! this daemon. A request type the agent does not know comes back as an
//! error that [`AgentError::Unsupported`] names; a request *field* an old
//! agent would silently ignore (`exec.user`, `exec.detach`) is only sent
//! after checking the agent's protocol version (learnt from `pong`, asked
//! for once per connection). The protocol-2 operations (start commands,
//! port probes, archives, resizing the root filesystem) are in [`ops`];
//! the protocol-3 ones (background processes, PTYs, filesystem operations,
//! watches, downloads), which need a protocol-3 agent, in [`caps`].

mod caps;
#[cfg(test)]
mod caps_tests;
mod ops;
#[cfg(test)]
mod tests;

pub use caps::{AgentStream, Archive, DirMade, ProcEvent, ProcSpec, ProcTarget, WatchEvent};
pub use ops::{ArchiveSummary, RootfsSize, StartSpec, StartedProcess};

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkvm_agent_protocol::{self as proto, Frame, GuestMsg, HostMsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot connect to the agent socket {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("the guest agent connection closed (the VM stopped or crashed)")]
    Closed,
    #[error("the guest agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the guest agent refused the request: {message} ({code})")]
    Guest { code: String, message: String },
    #[error("protocol error on the agent channel: {0}")]
    Protocol(String),
    #[error(
        "this sandbox's guest agent is older than the daemon and cannot {what}; rebuild the template (a fresh boot of the current guest image carries the current agent) and start the sandbox from it"
    )]
    Unsupported { what: String },
    #[error("the archive cannot be sent to the guest: {0}")]
    InvalidArchive(String),
}

/// The error for an `Error` reply to a request that does `what` (e.g.
/// "probe ports"): [`AgentError::Unsupported`] when the agent does not
/// know the request type, [`AgentError::Guest`] otherwise.
pub fn guest_error(code: String, message: String, what: &str) -> AgentError {
    if proto::is_unsupported_error(&code, &message) {
        AgentError::Unsupported {
            what: what.to_string(),
        }
    } else {
        AgentError::Guest { code, message }
    }
}

type Routes = Arc<Mutex<HashMap<u64, mpsc::Sender<Frame<GuestMsg>>>>>;

/// A connection to one guest agent.
pub struct AgentConn {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    routes: Routes,
    closed: watch::Receiver<bool>,
    /// Set when a write timed out and the stream may be out of sync.
    broken: std::sync::atomic::AtomicBool,
    /// The agent's protocol version from its last `pong`; 0 until then.
    protocol: AtomicU32,
}

/// How long one request may take to be written to the guest.
const WRITE_TIMEOUT: Duration = Duration::from_secs(20);

/// A finished command.
#[derive(Debug, Clone, Default)]
pub struct ExecOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// An exec request as the daemon issues it.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub stdin: Vec<u8>,
    pub timeout_ms: Option<u64>,
    /// Keep at most this many bytes of each stream.
    pub max_output: u64,
    /// Run as this user (see [`AgentConn::exec_as`]); `None`: root.
    pub user: Option<String>,
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64;
    }
    u64::from_le_bytes(b)
}

/// A request id no other request of this daemon has had, on any
/// connection: one counter, started at a random point (so a new daemon
/// does not repeat the ids of the last one either).
fn next_request_id() -> u64 {
    static NEXT: std::sync::OnceLock<AtomicU64> = std::sync::OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(random_u64() >> 12))
        .fetch_add(1, Ordering::Relaxed)
}

impl AgentConn {
    /// Connect to the agent socket.
    pub async fn connect(path: &Path) -> Result<Arc<AgentConn>, AgentError> {
        let s = UnixStream::connect(path)
            .await
            .map_err(|e| AgentError::Connect(path.display().to_string(), e))?;
        forkvm_qemu::jail::check_peer(&s, path)
            .map_err(|e| AgentError::Connect(path.display().to_string(), e))?;
        let (mut read, write) = s.into_split();
        let routes: Routes = Arc::default();
        let (closed_tx, closed) = watch::channel(false);
        let r2 = routes.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1 << 16);
            let mut chunk = vec![0u8; 1 << 16];
            'outer: loop {
                let n = match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                loop {
                    match proto::decode::<GuestMsg>(&mut buf) {
                        Ok(Some(frame)) => {
                            let id = frame.msg.id();
                            let tx = r2.lock().ok().and_then(|m| m.get(&id).cloned());
                            if let Some(tx) = tx {
                                // Backpressure: a slow consumer slows the guest.
                                let _ = tx.send(frame).await;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("agent channel out of sync: {e}");
                            break 'outer;
                        }
                    }
                }
            }
            if let Ok(mut m) = r2.lock() {
                m.clear();
            }
            let _ = closed_tx.send(true);
        });
        Ok(Arc::new(AgentConn {
            writer: tokio::sync::Mutex::new(write),
            routes,
            closed,
            broken: Default::default(),
            protocol: AtomicU32::new(0),
        }))
    }

    /// True once the connection has closed.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow() || self.broken.load(Ordering::Relaxed)
    }

    async fn start(
        &self,
        make: impl FnOnce(u64) -> HostMsg,
        payload: &[u8],
    ) -> Result<(u64, mpsc::Receiver<Frame<GuestMsg>>), AgentError> {
        if self.is_closed() {
            return Err(AgentError::Closed);
        }
        let id = next_request_id();
        let (tx, rx) = mpsc::channel(256);
        if let Ok(mut m) = self.routes.lock() {
            m.insert(id, tx);
        }
        let bytes = match proto::encode(&make(id), payload) {
            Ok(b) => b,
            Err(e) => {
                self.finish(id);
                return Err(AgentError::Protocol(e.to_string()));
            }
        };
        // QEMU stops reading the chardev while the guest has the port closed
        // (booting, or hung), so a write can block once the socket buffer is
        // full. Bound it; after a timed-out write the stream may hold half a
        // frame, so the connection is shut down and the next request
        // reconnects (the agent resynchronises on the frame magic).
        let mut w = self.writer.lock().await;
        match tokio::time::timeout(WRITE_TIMEOUT, w.write_all(&bytes)).await {
            Ok(Ok(())) => Ok((id, rx)),
            Ok(Err(_)) => {
                self.finish(id);
                Err(AgentError::Closed)
            }
            Err(_) => {
                self.finish(id);
                let _ = w.shutdown().await;
                self.broken.store(true, Ordering::Relaxed);
                Err(AgentError::Timeout(WRITE_TIMEOUT))
            }
        }
    }

    fn finish(&self, id: u64) {
        if let Ok(mut m) = self.routes.lock() {
            m.remove(&id);
        }
    }

    /// Send a request that has exactly one reply. `what` names what it
    /// does, for [`AgentError::Unsupported`].
    async fn one_reply(
        &self,
        make: impl FnOnce(u64) -> HostMsg,
        payload: &[u8],
        timeout: Duration,
        what: &str,
    ) -> Result<Frame<GuestMsg>, AgentError> {
        let (id, mut rx) = self.start(make, payload).await?;
        let r = tokio::time::timeout(timeout, rx.recv()).await;
        self.finish(id);
        match r {
            Err(_) => Err(AgentError::Timeout(timeout)),
            Ok(None) => Err(AgentError::Closed),
            Ok(Some(Frame {
                msg: GuestMsg::Error { code, message, .. },
                ..
            })) => Err(guest_error(code, message, what)),
            Ok(Some(f)) => Ok(f),
        }
    }

    /// Ping; returns the agent version (and records its protocol version).
    pub async fn ping(&self, timeout: Duration) -> Result<String, AgentError> {
        match self
            .one_reply(|id| HostMsg::Ping { id }, b"", timeout, "answer a ping")
            .await?
            .msg
        {
            GuestMsg::Pong {
                agent_version,
                protocol,
                ..
            } => {
                self.protocol.store(protocol, Ordering::Relaxed);
                Ok(agent_version)
            }
            other => Err(AgentError::Protocol(format!(
                "expected pong, got {other:?}"
            ))),
        }
    }

    /// The agent's protocol version, from the last pong or else from a ping
    /// sent now (bounded by `timeout`).
    pub async fn protocol(&self, timeout: Duration) -> Result<u32, AgentError> {
        match self.protocol.load(Ordering::Relaxed) {
            0 => {
                self.ping(timeout).await?;
                Ok(self.protocol.load(Ordering::Relaxed))
            }
            p => Ok(p),
        }
    }

    /// Fail with [`AgentError::Unsupported`] unless the agent speaks at
    /// least `min`: for request fields an older agent would silently ignore.
    pub async fn require_protocol(&self, min: u32, what: &str) -> Result<(), AgentError> {
        if self.protocol(Duration::from_secs(10)).await? < min {
            return Err(AgentError::Unsupported {
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// Run a command to completion, keeping at most `max_output` bytes of each
    /// stream. `deadline` bounds the whole call on the host side, so a hung
    /// guest cannot hold a request forever.
    pub async fn exec(
        &self,
        spec: ExecSpec,
        deadline: Duration,
    ) -> Result<ExecOutcome, AgentError> {
        self.exec_tapped(spec, deadline, None).await
    }

    /// [`AgentConn::exec`], also handing every output chunk to `tap` as it
    /// arrives (the chunks are not kept: `stdout`/`stderr` stay empty).
    pub async fn exec_tapped(
        &self,
        spec: ExecSpec,
        deadline: Duration,
        tap: Option<tokio::sync::mpsc::UnboundedSender<(proto::Stream, Vec<u8>)>>,
    ) -> Result<ExecOutcome, AgentError> {
        let user = spec.user.clone();
        self.exec_as(spec, user.as_deref(), deadline, tap).await
    }

    /// [`AgentConn::exec_tapped`] as `user` (the OCI forms `name`, `uid`,
    /// `name:group`, `uid:gid`, resolved in the guest; `None`: root). HOME
    /// defaults to the user's home unless `spec.env` sets it. A user needs
    /// a protocol-2 agent: an older one is refused before anything runs.
    pub async fn exec_as(
        &self,
        spec: ExecSpec,
        user: Option<&str>,
        deadline: Duration,
        tap: Option<tokio::sync::mpsc::UnboundedSender<(proto::Stream, Vec<u8>)>>,
    ) -> Result<ExecOutcome, AgentError> {
        if user.is_some() {
            self.require_protocol(proto::PROTOCOL_V2, "run commands as another user")
                .await?;
        }
        let user = user.map(str::to_string);
        let ExecSpec {
            argv,
            env,
            cwd,
            stdin,
            timeout_ms,
            max_output,
            user: _,
        } = spec;
        let (id, mut rx) = self
            .start(
                |id| HostMsg::Exec {
                    id,
                    argv,
                    env,
                    cwd,
                    timeout_ms,
                    user,
                    detach: false,
                    log_path: None,
                },
                &stdin,
            )
            .await?;
        let mut out = ExecOutcome::default();
        let collect = async {
            while let Some(f) = rx.recv().await {
                match f.msg {
                    GuestMsg::Output { stream, .. } => {
                        let (buf, count) = match stream {
                            proto::Stream::Stdout => (&mut out.stdout, &mut out.stdout_bytes),
                            proto::Stream::Stderr => (&mut out.stderr, &mut out.stderr_bytes),
                        };
                        *count += f.payload.len() as u64;
                        if let Some(t) = &tap {
                            // A gone reader (the client hung up) just stops
                            // the stream; the command still runs to its end.
                            let _ = t.send((stream, f.payload));
                            continue;
                        }
                        let room = max_output.saturating_sub(buf.len() as u64) as usize;
                        buf.extend_from_slice(&f.payload[..f.payload.len().min(room)]);
                    }
                    GuestMsg::Exited {
                        exit_code,
                        signal,
                        timed_out,
                        duration_ms,
                        ..
                    } => {
                        out.exit_code = exit_code;
                        out.signal = signal;
                        out.timed_out = timed_out;
                        out.duration_ms = duration_ms;
                        return Ok(());
                    }
                    GuestMsg::Error { code, message, .. } => {
                        return Err(guest_error(code, message, "run commands"))
                    }
                    other => {
                        return Err(AgentError::Protocol(format!(
                            "unexpected reply to exec: {other:?}"
                        )))
                    }
                }
            }
            Err(AgentError::Closed)
        };
        let r = tokio::time::timeout(deadline, collect).await;
        self.finish(id);
        match r {
            Err(_) => Err(AgentError::Timeout(deadline)),
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Ok(out),
        }
    }

    /// Give a restored clone its identity (see `HostMsg::Identity`).
    pub async fn identity(
        &self,
        hostname: &str,
        unix_time_ns: u64,
        machine_id: &str,
        instance_id: &str,
        entropy: &[u8],
        timeout: Duration,
    ) -> Result<u64, AgentError> {
        let (hostname, machine_id, instance_id) = (
            hostname.to_string(),
            machine_id.to_string(),
            instance_id.to_string(),
        );
        let f = self
            .one_reply(
                |id| HostMsg::Identity {
                    id,
                    hostname,
                    unix_time_ns,
                    machine_id,
                    instance_id,
                },
                entropy,
                timeout,
                "take an identity",
            )
            .await?;
        match f.msg {
            GuestMsg::IdentityAck { took_us, .. } => Ok(took_us),
            other => Err(AgentError::Protocol(format!(
                "expected identity_ack, got {other:?}"
            ))),
        }
    }

    /// Set the guest's wall clock to the host's, read just before sending.
    pub async fn set_clock(&self, timeout: Duration) -> Result<(), AgentError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        match self
            .one_reply(
                |id| HostMsg::SetClock {
                    id,
                    unix_time_ns: now,
                },
                b"",
                timeout,
                "set the clock",
            )
            .await?
            .msg
        {
            GuestMsg::ClockSet { .. } => Ok(()),
            other => Err(AgentError::Protocol(format!(
                "expected clock_set, got {other:?}"
            ))),
        }
    }

    /// Ask the guest to prove its network path to `addr:port` works.
    pub async fn net_probe(
        &self,
        addr: std::net::Ipv4Addr,
        port: u16,
        timeout: Duration,
    ) -> Result<u64, AgentError> {
        let timeout_ms = timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        match self
            .one_reply(
                |id| HostMsg::NetProbe {
                    id,
                    addr: addr.to_string(),
                    port,
                    timeout_ms,
                },
                b"",
                timeout + Duration::from_secs(10),
                "probe the network",
            )
            .await?
            .msg
        {
            GuestMsg::NetReady { took_us, .. } => Ok(took_us),
            other => Err(AgentError::Protocol(format!(
                "expected net_ready, got {other:?}"
            ))),
        }
    }

    /// Write a file in the guest.
    pub async fn write_file(
        &self,
        path: &str,
        mode: u32,
        data: &[u8],
        timeout: Duration,
    ) -> Result<u64, AgentError> {
        let path = path.to_string();
        let f = self
            .one_reply(
                |id| HostMsg::WriteFile {
                    id,
                    path,
                    mode,
                    create_dirs: true,
                },
                data,
                timeout,
                "write files",
            )
            .await?;
        match f.msg {
            GuestMsg::FileWritten { size, .. } => Ok(size),
            other => Err(AgentError::Protocol(format!(
                "expected file_written, got {other:?}"
            ))),
        }
    }

    /// Read a file from the guest.
    pub async fn read_file(
        &self,
        path: &str,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, AgentError> {
        let path = path.to_string();
        let f = self
            .one_reply(
                |id| HostMsg::ReadFile {
                    id,
                    path,
                    max_bytes,
                },
                b"",
                timeout,
                "read files",
            )
            .await?;
        match f.msg {
            GuestMsg::FileData { .. } => Ok(f.payload),
            other => Err(AgentError::Protocol(format!(
                "expected file_data, got {other:?}"
            ))),
        }
    }
}

/// Connect to the agent and wait until it answers a ping, or until `deadline`
/// passes. A ping sent before the guest opened its port waits in QEMU (which
/// does not read the chardev until then), so pings are re-sent only every
/// couple of seconds, in case the guest kernel dropped one while opening.
pub async fn wait_ready(socket: &Path, deadline: Duration) -> Result<Arc<AgentConn>, AgentError> {
    let start = tokio::time::Instant::now();
    let r = tokio::time::timeout(deadline, async {
        let mut conn = loop {
            match AgentConn::connect(socket).await {
                Ok(c) => break c,
                Err(e) if start.elapsed() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        loop {
            if conn.is_closed() {
                conn = AgentConn::connect(socket).await?;
            }
            match conn.ping(Duration::from_secs(2)).await {
                Ok(_) => return Ok(conn),
                Err(AgentError::Timeout(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    r.unwrap_or(Err(AgentError::Timeout(deadline)))
}
