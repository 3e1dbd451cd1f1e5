//! Connection hygiene for forkvm's HTTP listeners: the daemon's TCP listener and
//! unix socket, and the cluster gateway's TCP listener.
//!
//! A client that connects and then sends nothing, or sends a request head one
//! byte at a time, costs the daemon one file descriptor for as long as it
//! likes. axum's `serve` accepts without bound and never times such a client
//! out, so a flood of idle connections used to take every descriptor of the
//! process: `accept` failed with `EMFILE`, the unix socket stopped answering,
//! and the daemon's own bookkeeping of its QEMUs (which opens `/proc` files,
//! sockets and namespaces) failed with it. This module accepts connections
//! itself and serves each with hyper's HTTP/1 server under four rules:
//!
//! 1. **Header timeout.** A request head (request line and headers) must
//!    arrive within [`ConnLimits::header_timeout`] of the moment the server
//!    starts waiting for it, or the connection is closed (hyper's
//!    `header_read_timeout`). That ends slowloris clients.
//! 2. **Idle timeout.** A connection with no request in flight is closed after
//!    [`ConnLimits::idle_timeout`], or
//!    [`ConnLimits::unauthenticated_idle_timeout`] while it has not yet shown
//!    a valid credential. A request "in flight" lasts until its response body
//!    ends, so streams (exec output, events, PTYs, watches) are never idle.
//!    hyper starts its header timer whenever it waits for a request head, the
//!    next one on a kept-alive connection included, so in practice a
//!    connection idle between requests closes after the header timeout; the
//!    idle timers here are the backstop for what hyper does not see.
//! 3. **Caps.** Each listener holds at most [`ConnLimits::max`] connections,
//!    and the TCP listener at most [`ConnLimits::max_unauthenticated`] that
//!    have not authenticated. When a cap is reached, the oldest idle
//!    connection is closed to make room (unauthenticated ones first), so an
//!    attacker holding idle connections only ever evicts its own, and a new
//!    client always gets in. When every connection is busy, the new one is
//!    answered `503` with `Connection: close` and closed at once.
//! 4. **A descriptor budget.** The daemon raises its soft `RLIMIT_NOFILE` to
//!    the hard limit at start ([`raise_nofile`]), and the caps are derived
//!    from the result ([`budgets`]): half of the descriptors for connections,
//!    the rest for sandboxes and the daemon's own files. Each listener has its
//!    own accept task and its own cap, so a flood on TCP never takes the unix
//!    socket's share.
//!
//! A connection counts as authenticated once one of its requests carried a
//! valid credential: the REST bearer token or dashboard session
//! (the daemon's `api` module), or the E2B API key or envd access token (its
//! `e2b` module); the cluster gateway marks its own clients the same way.
//! Those checks call [`mark_authenticated`]. Every unix-socket connection is
//! trusted (the socket is `0600`, root's).

pub mod session;

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// The limits of one listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once.
    pub max: usize,
    /// Of those, connections that have not authenticated (TCP only).
    pub max_unauthenticated: usize,
    /// A request head must arrive within this long.
    pub header_timeout: Duration,
    /// An authenticated connection with nothing in flight is closed after this.
    pub idle_timeout: Duration,
    /// An unauthenticated connection with nothing in flight is closed after this.
    pub unauthenticated_idle_timeout: Duration,
}

/// The hard ceilings of [`budgets`], whatever the descriptor limit.
const MAX_TCP_CONNECTIONS: usize = 16_384;
const MAX_UNIX_CONNECTIONS: usize = 4_096;

/// The limits of the TCP listener and of the unix socket for a process whose
/// soft `RLIMIT_NOFILE` is `nofile`: half of the descriptors go to
/// connections (three quarters of that half to TCP, of which at most half may
/// be unauthenticated; one quarter to the unix socket); the other half stays
/// for sandboxes (sockets, pidfds, log files, namespaces) and the daemon.
pub fn budgets(nofile: u64) -> (ConnLimits, ConnLimits) {
    let half = usize::try_from(nofile / 2).unwrap_or(usize::MAX);
    let tcp_max = (half / 4 * 3).clamp(16, MAX_TCP_CONNECTIONS);
    let unix_max = (half / 4).clamp(8, MAX_UNIX_CONNECTIONS);
    let tcp = ConnLimits {
        max: tcp_max,
        max_unauthenticated: (tcp_max / 2).max(8),
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        unauthenticated_idle_timeout: Duration::from_secs(10),
    };
    let unix = ConnLimits {
        max: unix_max,
        max_unauthenticated: unix_max,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
        unauthenticated_idle_timeout: Duration::from_secs(120),
    };
    (tcp, unix)
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (at most 1 Mi) and return
/// the soft limit in force afterwards, and what it was before. The daemon
/// holds a descriptor per connection, per sandbox socket and per open file;
/// systemd's default soft limit of 1,024 is far too low for that, while its
/// hard limit (524,288) is plenty.
pub fn raise_nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (1024, 1024);
    }
    let before = r.rlim_cur;
    let want = r.rlim_max.min(1 << 20);
    if want > r.rlim_cur {
        let n = libc::rlimit {
            rlim_cur: want,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &n) } == 0 {
            return (want, before);
        }
    }
    (before, before)
}

/// One accepted connection's shared state.
struct Conn {
    /// Its socket, valid while the connection is in the table (its task
    /// removes it before the socket closes); -1 in unit tests.
    fd: std::os::fd::RawFd,
    authenticated: AtomicBool,
    /// Requests whose response has not ended yet.
    busy: AtomicUsize,
    /// Milliseconds since the table's epoch of the last request start or
    /// response end.
    last_active: AtomicU64,
    /// Told to close (evicted to make room).
    close: Notify,
}

impl Conn {
    fn idle(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }
    fn authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }
    /// Bytes the client sent that nobody has read yet. A new client's
    /// request sits there until its task first runs; an idle or slowloris
    /// connection has none (hyper reads what a slowloris client sends).
    fn unread(&self) -> bool {
        // The fd is open while the connection is in the table.
        self.fd >= 0 && sent_something(self.fd)
    }
    /// Can it be closed to make room? Not while a request is in flight, nor
    /// while a request it sent waits to be read: under a flood of new
    /// connections, a client that sent its request at once would otherwise
    /// be evicted before its task ever ran.
    fn evictable(&self) -> bool {
        self.idle() && !self.unread()
    }
}

/// The request extension through which an auth check marks its connection.
#[derive(Clone)]
pub struct ConnAuth(Arc<Conn>);

/// Mark the connection `req` came on as authenticated (a no-op for requests
/// that did not come through [`serve`], e.g. in unit tests).
pub fn mark_authenticated(req: &Request) {
    if let Some(a) = req.extensions().get::<ConnAuth>() {
        a.0.authenticated.store(true, Ordering::Release);
    }
}

/// Compare two credentials without an early exit, so timing does not
/// reveal how long a matching prefix was.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

/// Bytes waiting on a socket that nobody has read yet. True when it cannot
/// be told (unit tests pass -1).
fn sent_something(fd: std::os::fd::RawFd) -> bool {
    if fd < 0 {
        return true;
    }
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; the caller holds the socket.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    r != 0 || n > 0
}

/// Why a new connection could not be admitted.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Every connection is busy.
    Full,
}

/// Every open connection of one listener, oldest first.
struct Table {
    epoch: Instant,
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    limits: ConnLimits,
    /// Connections count as authenticated from the start (the unix socket).
    trusted: bool,
}

impl Table {
    fn new(limits: ConnLimits, trusted: bool) -> Table {
        Table {
            epoch: Instant::now(),
            next: AtomicU64::new(0),
            conns: Mutex::new(BTreeMap::new()),
            limits,
            trusted,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Admit a new connection, evicting the oldest idle one if a cap is
    /// reached: an unauthenticated one first, and only an unauthenticated one
    /// when it is their cap that is reached.
    fn admit(&self, fd: std::os::fd::RawFd) -> Result<(u64, Arc<Conn>), Refusal> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let unauthenticated = if self.trusted {
            0
        } else {
            conns.values().filter(|c| !c.authenticated()).count()
        };
        let total_full = conns.len() >= self.limits.max;
        let unauth_full = !self.trusted && unauthenticated >= self.limits.max_unauthenticated;
        if total_full || unauth_full {
            // The oldest idle connection with nothing unread goes first: a
            // client whose request waits for its task to run is kept while
            // there is any other choice.
            let pick =
                |want: &dyn Fn(&Conn) -> bool| conns.iter().find(|(_, c)| want(c)).map(|(k, _)| *k);
            let victim = pick(&|c| !c.authenticated() && c.evictable())
                .or_else(|| pick(&|c| !c.authenticated() && c.idle()))
                .or_else(|| {
                    if unauth_full {
                        None
                    } else {
                        pick(&|c| c.evictable()).or_else(|| pick(&|c| c.idle()))
                    }
                });
            match victim {
                Some(k) => {
                    if let Some(c) = conns.remove(&k) {
                        c.close.notify_one();
                    }
                }
                None => return Err(Refusal::Full),
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let c = Arc::new(Conn {
            fd,
            authenticated: AtomicBool::new(self.trusted),
            busy: AtomicUsize::new(0),
            last_active: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
        });
        conns.insert(id, c.clone());
        Ok((id, c))
    }

    fn forget(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    fn len(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Ends a request's time in flight when dropped: with its response body, or
/// with the request future if the connection goes first.
struct InFlight {
    conn: Arc<Conn>,
    table: Arc<Table>,
}

impl InFlight {
    fn new(conn: Arc<Conn>, table: Arc<Table>) -> InFlight {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        conn.last_active.store(table.now_ms(), Ordering::Release);
        InFlight { conn, table }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn
            .last_active
            .store(self.table.now_ms(), Ordering::Release);
        self.conn.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The TCP listener's accept queue: longer than tokio's default (1,024) and
/// than the connections an attacker can hold open within the caps, so a
/// client that reconnects as fast as it is evicted cannot fill the queue and
/// make the kernel drop a new client's SYN. The kernel clamps it to
/// `net.core.somaxconn` (4,096 by default since Linux 5.4).
const TCP_BACKLOG: u32 = 8_192;

/// Bind the TCP listener with [`TCP_BACKLOG`].
pub fn bind_tcp(addr: std::net::SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let s = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(TCP_BACKLOG)
}

/// What a listener hands out: a stream per accepted connection.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + std::os::fd::AsRawFd + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
    /// Best effort: write `bytes` to a fresh stream without waiting.
    fn try_write(io: &Self::Io, bytes: &[u8]);
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
    fn try_write(io: &Self::Io, bytes: &[u8]) {
        let _ = io.try_write(bytes);
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        Ok(tokio::net::UnixListener::accept(self).await?.0)
    }
    fn try_write(io: &Self::Io, bytes: &[u8]) {
        let _ = io.try_write(bytes);
    }
}

/// The answer to a connection that finds every slot busy.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Connection: close\r\nRetry-After: 1\r\nContent-Length: 117\r\n\r\n\
{\"error\":{\"code\":\"limit_exceeded\",\"message\":\"the daemon holds its maximum of connections, all busy; retry shortly\"}}\n\
";

/// Serve `app` on `listener` under `limits` until `stop` turns true, then
/// stop accepting, ask every connection to finish its requests, and return
/// when all have closed.
pub async fn serve<L: Accept>(
    listener: L,
    app: Router,
    limits: ConnLimits,
    trusted: bool,
    what: &'static str,
    mut stop: watch::Receiver<bool>,
) {
    let table = Arc::new(Table::new(limits, trusted));
    let mut tasks = JoinSet::new();
    let mut refused: u64 = 0;
    let mut errors: u64 = 0;
    let mut last_report = Instant::now() - Duration::from_secs(60);
    loop {
        let io = tokio::select! {
            r = listener.accept() => r,
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        };
        while tasks.try_join_next().is_some() {}
        let io = match io {
            Ok(io) => io,
            Err(e) => {
                // EMFILE/ENFILE: the caps keep the daemon's own share, so
                // this means the host or another part of the daemon ran out.
                // Back off briefly instead of spinning, and say so at most
                // once a minute.
                errors += 1;
                if last_report.elapsed() >= Duration::from_secs(60) {
                    tracing::error!(
                        "{what}: accept failed ({e}); {errors} failures so far, {} connections open",
                        table.len()
                    );
                    last_report = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&io);
        let (id, conn) = match table.admit(fd) {
            Ok(x) => x,
            Err(Refusal::Full) => {
                L::try_write(&io, FULL);
                refused += 1;
                if last_report.elapsed() >= Duration::from_secs(60) {
                    tracing::warn!(
                        "{what}: refused {refused} connections so far: the table is full \
                         ({} connections, {} unauthenticated at most)",
                        table.limits.max,
                        table.limits.max_unauthenticated
                    );
                    last_report = Instant::now();
                }
                continue;
            }
        };
        tasks.spawn(serve_one(
            io,
            app.clone(),
            table.clone(),
            id,
            conn,
            stop.clone(),
        ));
    }
    while tasks.join_next().await.is_some() {}
}

async fn serve_one<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: I,
    app: Router,
    table: Arc<Table>,
    id: u64,
    conn: Arc<Conn>,
    mut stop: watch::Receiver<bool>,
) {
    let svc = {
        let conn = conn.clone();
        let table = table.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let guard = InFlight::new(conn.clone(), table.clone());
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut().insert(ConnAuth(conn.clone()));
            let app = app.clone();
            async move {
                use tower::ServiceExt;
                let resp = app.oneshot(req).await;
                resp.map(|r| {
                    r.map(move |b| {
                        axum::body::Body::new(b.map_frame(move |f| {
                            let _ = &guard;
                            f
                        }))
                    })
                })
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(table.limits.header_timeout)
        .keep_alive(true);
    let mut http = pin!(builder
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades());
    let mut stopping = false;
    loop {
        let limit = if conn.authenticated() {
            table.limits.idle_timeout
        } else {
            table.limits.unauthenticated_idle_timeout
        };
        let since = table.now_ms() - conn.last_active.load(Ordering::Acquire).min(table.now_ms());
        let wait = limit.saturating_sub(Duration::from_millis(since));
        tokio::select! {
            _ = http.as_mut() => break,
            _ = conn.close.notified() => break,
            _ = async { let _ = stop.wait_for(|s| *s).await; }, if !stopping => {
                stopping = true;
                http.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep(wait) => {
                let since = table.now_ms()
                    - conn.last_active.load(Ordering::Acquire).min(table.now_ms());
                if conn.idle() && Duration::from_millis(since) >= limit {
                    break;
                }
                // Busy, or active since: wait again (at least a little, so a
                // stream's long life does not spin this loop).
                if !conn.idle() {
                    tokio::time::sleep(Duration::from_millis(500).min(limit)).await;
                }
            }
        }
    }
    table.forget(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, unauth: usize) -> ConnLimits {
        ConnLimits {
            max,
            max_unauthenticated: unauth,
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            unauthenticated_idle_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn budgets_leave_half_the_descriptors_and_scale() {
        let (tcp, unix) = budgets(2048);
        assert_eq!(tcp.max, 768);
        assert_eq!(tcp.max_unauthenticated, 384);
        assert_eq!(unix.max, 256);
        assert!(tcp.max + unix.max <= 1024);
        // A tiny limit still gives each listener something.
        let (tcp, unix) = budgets(16);
        assert!(tcp.max >= 16 && unix.max >= 8);
        // A huge one is capped.
        let (tcp, unix) = budgets(1 << 40);
        assert_eq!(tcp.max, MAX_TCP_CONNECTIONS);
        assert_eq!(unix.max, MAX_UNIX_CONNECTIONS);
    }

    #[test]
    fn the_oldest_idle_unauthenticated_connection_makes_room() {
        let t = Table::new(limits(4, 2), false);
        let (a, ca) = t.admit(-1).unwrap();
        let (_b, cb) = t.admit(-1).unwrap();
        // Two unauthenticated: the cap. A third evicts the oldest, `a`.
        let (_c, _cc) = t.admit(-1).unwrap();
        assert!(!t.conns.lock().unwrap().contains_key(&a));
        // Its task is told to close (a stored permit, so it sees it later).
        let _ = ca;
        // An authenticated connection is never evicted for the unauth cap.
        cb.authenticated.store(true, Ordering::Release);
        let (_d, _cd) = t.admit(-1).unwrap();
        assert!(t.conns.lock().unwrap().values().any(|c| c.authenticated()));
    }

    #[test]
    fn busy_connections_are_kept_and_a_full_table_refuses() {
        let t = Arc::new(Table::new(limits(2, 2), false));
        let (_a, ca) = t.admit(-1).unwrap();
        let (_b, cb) = t.admit(-1).unwrap();
        let _g1 = InFlight::new(ca.clone(), t.clone());
        let g2 = InFlight::new(cb.clone(), t.clone());
        assert_eq!(t.admit(-1).err(), Some(Refusal::Full));
        // The response of `b` ends: it is idle again and can be evicted.
        drop(g2);
        assert!(t.admit(-1).is_ok());
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_connection_whose_request_waits_unread_is_not_evicted() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let t = Table::new(limits(2, 2), false);
        // The older connection has sent its request; nobody read it yet.
        let (mut client, server) = std::os::unix::net::UnixStream::pair().unwrap();
        client
            .write_all(b"GET /v1/health HTTP/1.1\r\n\r\n")
            .unwrap();
        let (a, _ca) = t.admit(server.as_raw_fd()).unwrap();
        let (b, _cb) = t.admit(-1).unwrap();
        // The unauthenticated cap is reached: the idle one goes, not `a`.
        let (_c, _) = t.admit(-1).unwrap();
        let conns = t.conns.lock().unwrap();
        assert!(conns.contains_key(&a));
        assert!(!conns.contains_key(&b));
    }

    #[test]
    fn when_every_idle_connection_has_unread_bytes_the_oldest_still_goes() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let t = Table::new(limits(2, 2), false);
        let mut keep = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let (mut client, server) = std::os::unix::net::UnixStream::pair().unwrap();
            client.write_all(b"X-Slow: 1\r\n").unwrap();
            ids.push(t.admit(server.as_raw_fd()).unwrap().0);
            keep.push((client, server));
        }
        // No choice without unread bytes: the oldest idle one makes room,
        // so clients that keep sending cannot pin the table.
        assert!(t.admit(-1).is_ok());
        let conns = t.conns.lock().unwrap();
        assert!(!conns.contains_key(&ids[0]));
        assert!(conns.contains_key(&ids[1]));
    }

    #[test]
    fn the_total_cap_evicts_idle_authenticated_connections_last() {
        let t = Table::new(limits(2, 2), false);
        let (a, ca) = t.admit(-1).unwrap();
        ca.authenticated.store(true, Ordering::Release);
        let (b, _cb) = t.admit(-1).unwrap();
        let (_c, _) = t.admit(-1).unwrap();
        let conns = t.conns.lock().unwrap();
        assert!(conns.contains_key(&a), "the authenticated one stays");
        assert!(!conns.contains_key(&b), "the unauthenticated one went");
    }

    #[test]
    fn a_trusted_listener_counts_no_one_as_unauthenticated() {
        let t = Table::new(limits(3, 0), true);
        for _ in 0..3 {
            t.admit(-1).unwrap();
        }
        // Full: the oldest idle connection goes.
        assert!(t.admit(-1).is_ok());
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn the_refusal_is_well_formed_http() {
        let text = std::str::from_utf8(FULL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), len);
        assert!(serde_json::from_str::<serde_json::Value>(body.trim()).is_ok());
    }

    #[test]
    fn raising_the_limit_never_lowers_it() {
        let (after, before) = raise_nofile();
        assert!(after >= before);
    }
}
