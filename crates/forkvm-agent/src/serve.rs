//! The request server: reads framed [`HostMsg`]s from any byte stream and
//! answers with [`GuestMsg`]s.
//!
//! It is written against plain `Read`/`Write` so the same code serves the
//! virtio-serial port in the VM and a `UnixStream` in tests.
//!
//! Requests (each handled on its own thread):
//!
//! * `ping` → `pong`: liveness, agent version and uptime;
//! * `exec` → `output`* then `exited`: run a program (see [`crate::exec`]);
//! * `write_file` / `read_file` → `file_written` / `file_data` (see
//!   [`crate::files`]);
//! * `identity` → `identity_ack`: give a freshly restored clone its own
//!   identity (see [`crate::identity`]). QEMU's `microvm` has no VMGenID
//!   device, so a guest restored from a snapshot cannot tell it was cloned:
//!   every clone would share the snapshot's RNG state, stale clock, hostname
//!   and ids. The host sends this first after every restore, with fresh
//!   entropy as the payload, and the agent reseeds the kernel RNG, sets the
//!   clock, hostname, machine id and instance id before any user code runs;
//! * `shutdown` → `shutdown_ack`, then power off.

use std::io::{self, Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::{
    decode, encode, parse_prefix, Frame, FrameError, GuestMsg, HostMsg, ERR_INVALID, ERR_IO, MAGIC,
    PREFIX_LEN, PROTOCOL_VERSION,
};

use crate::exec::{self, ExecRequest};
use crate::files;
use crate::identity::{Identity, IdentityPaths, Targets};

/// Bytes requested per read from the channel.
const READ_CHUNK: usize = 256 << 10;
/// How long to wait before reading again after EOF on a virtio port.
const EOF_POLL: Duration = Duration::from_millis(5);
/// Shrink the frame buffer back after a big frame, so one 64 MiB upload
/// does not pin 64 MiB for the rest of the VM's life.
const BUF_KEEP: usize = 1 << 20;

/// What end-of-file on the channel means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EofPolicy {
    /// A virtio-serial port returns EOF whenever no host is connected; the
    /// host may connect later, so drop any partial frame and keep reading.
    Retry,
    /// A socket's EOF is final: return so the caller can reconnect or stop.
    Return,
}

/// A request failure, sent as `GuestMsg::Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqError {
    pub code: &'static str,
    pub message: String,
}

impl ReqError {
    fn into_msg(self, id: u64) -> GuestMsg {
        GuestMsg::Error {
            id,
            code: self.code.to_string(),
            message: self.message,
        }
    }
}

/// The single writer all replies go through. One mutex around whole frames
/// keeps frames from concurrent requests from interleaving.
pub struct Outbox {
    writer: Mutex<Box<dyn Write + Send>>,
    warned: AtomicBool,
}

impl Outbox {
    pub fn new(writer: Box<dyn Write + Send>) -> Self {
        Outbox {
            writer: Mutex::new(writer),
            warned: AtomicBool::new(false),
        }
    }

    /// Send one frame. On a virtio port this blocks while no host is
    /// connected, which is what delivers replies to the next connection.
    pub fn send(&self, msg: &GuestMsg, payload: &[u8]) -> io::Result<()> {
        let bytes = encode(msg, payload).map_err(io::Error::other)?;
        let result = {
            let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            w.write_all(&bytes).and_then(|()| w.flush())
        };
        if let Err(e) = &result {
            // Once per connection: a dead host makes every send fail.
            if !self.warned.swap(true, Ordering::Relaxed) {
                crate::log(&format!("cannot send to the host: {e} (dropping replies)"));
            }
        }
        result
    }

    /// Switch to a new connection.
    pub fn replace(&self, writer: Box<dyn Write + Send>) {
        *self.writer.lock().unwrap_or_else(PoisonError::into_inner) = writer;
        self.warned.store(false, Ordering::Relaxed);
    }
}

/// Shared state of the server, cloned into every request thread.
#[derive(Clone)]
pub struct Agent {
    pub outbox: Arc<Outbox>,
    /// Called after `ShutdownAck` was sent (power off, or exit when testing).
    on_shutdown: Arc<dyn Fn() + Send + Sync>,
    /// What the `identity` request writes to, opened when the agent
    /// started (the real paths outside tests).
    identity: Arc<Mutex<Targets>>,
}

impl Agent {
    /// `identity_paths` are opened now (see [`Targets`]); outside tests
    /// they are [`IdentityPaths::default`].
    pub fn new(
        writer: Box<dyn Write + Send>,
        on_shutdown: impl Fn() + Send + Sync + 'static,
        identity_paths: &IdentityPaths,
    ) -> Self {
        Agent {
            outbox: Arc::new(Outbox::new(writer)),
            on_shutdown: Arc::new(on_shutdown),
            identity: Arc::new(Mutex::new(Targets::open(identity_paths))),
        }
    }

    fn reply(&self, msg: &GuestMsg, payload: &[u8]) {
        // Errors are logged by the outbox; there is nobody else to tell.
        let _ = self.outbox.send(msg, payload);
    }
}

/// Serve requests read from `reader`, writing replies to `writer`, until EOF
/// (with [`EofPolicy::Return`]) or a read error.
///
/// The binary uses [`serve_conn`] directly, because it swaps connections
/// under one [`Agent`] when the port is reopened; this is the whole loop for
/// a single connection.
#[cfg_attr(not(test), allow(dead_code))]
pub fn serve<R, W>(
    mut reader: R,
    writer: W,
    eof: EofPolicy,
    on_shutdown: impl Fn() + Send + Sync + 'static,
    identity_paths: &IdentityPaths,
) -> io::Result<()>
where
    R: Read,
    W: Write + Send + 'static,
{
    let agent = Agent::new(Box::new(writer), on_shutdown, identity_paths);
    serve_conn(&mut reader, &agent, eof)
}

/// The read loop for one connection. Returns `Ok(())` on EOF under
/// [`EofPolicy::Return`] and `Err` on a read error (the caller reopens).
pub fn serve_conn<R: Read + ?Sized>(
    reader: &mut R,
    agent: &Agent,
    eof: EofPolicy,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut in_sync = true;
    loop {
        match reader.read(&mut chunk) {
            Ok(0) => {
                // The host went away (or was never there): whatever part of a
                // frame we hold will never be completed.
                buf.clear();
                buf.shrink_to(BUF_KEEP);
                in_sync = true;
                match eof {
                    EofPolicy::Retry => thread::sleep(EOF_POLL),
                    EofPolicy::Return => return Ok(()),
                }
            }
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                process_buffer(&mut buf, agent, &mut in_sync);
                if buf.is_empty() && buf.capacity() > BUF_KEEP {
                    buf.shrink_to(BUF_KEEP);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Decode and dispatch every complete frame at the front of `buf`.
fn process_buffer(buf: &mut Vec<u8>, agent: &Agent, in_sync: &mut bool) {
    loop {
        match decode::<HostMsg>(buf) {
            Ok(Some(frame)) => {
                *in_sync = true;
                dispatch(frame, agent);
            }
            Ok(None) => return,
            Err(FrameError::BadHeader(e)) => reject_frame(buf, &e, agent),
            Err(e) => {
                // Log once per desync, not once per garbage byte.
                if *in_sync {
                    crate::log(&format!("{e}; resynchronising"));
                    *in_sync = false;
                }
                resync(buf);
            }
        }
    }
}

/// Drop bytes up to the next possible frame start (the next "FVA1"), keeping
/// a tail that may be the beginning of a magic split across reads.
fn resync(buf: &mut Vec<u8>) {
    let next = buf
        .windows(MAGIC.len())
        .skip(1)
        .position(|w| w == MAGIC)
        .map(|i| i + 1);
    let cut = match next {
        Some(i) => i,
        None => buf
            .len()
            .saturating_sub(MAGIC.len() - 1)
            .max(1)
            .min(buf.len()),
    };
    buf.drain(..cut);
}

/// A frame with valid framing but a header that is not a request we know
/// (malformed JSON, unknown type, missing field). Skip exactly that frame and,
/// if the header has an id, tell the host so it does not wait forever.
fn reject_frame(buf: &mut Vec<u8>, e: &serde_json::Error, agent: &Agent) {
    let mut prefix = [0u8; PREFIX_LEN];
    prefix.copy_from_slice(&buf[..PREFIX_LEN]);
    // decode() already validated the prefix and that the whole frame is here.
    let Ok((hlen, plen)) = parse_prefix(&prefix) else {
        resync(buf);
        return;
    };
    let hend = PREFIX_LEN + hlen as usize;
    let total = (hend + plen as usize).min(buf.len());
    let id = serde_json::from_slice::<serde_json::Value>(&buf[PREFIX_LEN..hend.min(buf.len())])
        .ok()
        .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64));
    buf.drain(..total);
    crate::log(&format!("rejected a request with an invalid header: {e}"));
    if let Some(id) = id {
        agent.reply(
            &ReqError {
                code: ERR_INVALID,
                message: format!("unsupported or malformed request: {e}"),
            }
            .into_msg(id),
            &[],
        );
    }
}

/// Handle each request on its own thread, so a long exec never delays a
/// ping or a file transfer; except the few that are short, need no waiting
/// and matter on a clone's resume path, which run right here on the reader:
///
/// - `identity` and `set_clock` are then applied before any later request is
///   even read, so no command the host sends next can run with the
///   snapshot's identity or clock, whatever order threads are scheduled in;
/// - a new thread (clone, a stack mapping, a first schedule) is kernel code a
///   freshly restored clone has not run yet, and under TCG every such path is
///   translated again in every new QEMU process.
fn dispatch(frame: Frame<HostMsg>, agent: &Agent) {
    if matches!(
        frame.msg,
        HostMsg::Ping { .. } | HostMsg::Identity { .. } | HostMsg::SetClock { .. }
    ) {
        return handle_guarded(frame, agent);
    }
    let id = frame.msg.id();
    let a = agent.clone();
    let spawned = thread::Builder::new()
        .name(format!("req-{id}"))
        .spawn(move || handle_guarded(frame, &a));
    if let Err(e) = spawned {
        agent.reply(
            &ReqError {
                code: ERR_IO,
                message: format!("cannot start a thread: {e}"),
            }
            .into_msg(id),
            &[],
        );
    }
}

/// [`handle`], answering with an error if it panics: a bug in a handler
/// must not leave the host waiting forever.
fn handle_guarded(frame: Frame<HostMsg>, agent: &Agent) {
    let id = frame.msg.id();
    if panic::catch_unwind(AssertUnwindSafe(|| handle(frame, agent))).is_err() {
        agent.reply(
            &ReqError {
                code: ERR_IO,
                message: "agent bug: the request handler panicked".into(),
            }
            .into_msg(id),
            &[],
        );
    }
}

fn handle(frame: Frame<HostMsg>, agent: &Agent) {
    let Frame { msg, payload } = frame;
    match msg {
        HostMsg::Ping { id } => agent.reply(
            &GuestMsg::Pong {
                id,
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                protocol: PROTOCOL_VERSION,
                uptime_ms: uptime_ms(),
            },
            &[],
        ),
        HostMsg::Exec {
            id,
            argv,
            env,
            cwd,
            timeout_ms,
        } => {
            let req = ExecRequest {
                id,
                argv,
                env,
                cwd,
                timeout_ms,
                stdin: payload,
            };
            let msg = match exec::run(req, &agent.outbox) {
                Ok(r) => GuestMsg::Exited {
                    id,
                    exit_code: r.exit_code,
                    signal: r.signal,
                    timed_out: r.timed_out,
                    duration_ms: r.duration_ms,
                },
                Err(e) => e.into_msg(id),
            };
            agent.reply(&msg, &[]);
        }
        HostMsg::WriteFile {
            id,
            path,
            mode,
            create_dirs,
        } => {
            let msg = match files::write_file(&path, mode, create_dirs, &payload) {
                Ok(size) => GuestMsg::FileWritten { id, size },
                Err(e) => e.into_msg(id),
            };
            agent.reply(&msg, &[]);
        }
        HostMsg::ReadFile {
            id,
            path,
            max_bytes,
        } => match files::read_file(&path, max_bytes) {
            Ok(f) => agent.reply(
                &GuestMsg::FileData {
                    id,
                    size: f.data.len() as u64,
                    mode: f.mode,
                },
                &f.data,
            ),
            Err(e) => agent.reply(&e.into_msg(id), &[]),
        },
        HostMsg::Shutdown { id } => {
            agent.reply(&GuestMsg::ShutdownAck { id }, &[]);
            (agent.on_shutdown)();
        }
        HostMsg::Identity {
            id,
            hostname,
            unix_time_ns,
            machine_id,
            instance_id,
        } => {
            let start = Instant::now();
            let req = Identity {
                hostname: &hostname,
                unix_time_ns,
                machine_id: &machine_id,
                instance_id: &instance_id,
                entropy: &payload,
            };
            let result = agent
                .identity
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .apply(&req);
            let took_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            let msg = match result {
                Ok(()) => GuestMsg::IdentityAck { id, took_us },
                Err(e) => {
                    crate::log(&format!("identity failed: {}", e.message));
                    e.into_msg(id)
                }
            };
            agent.reply(&msg, &[]);
        }
        HostMsg::NetProbe {
            id,
            addr,
            port,
            timeout_ms,
        } => {
            let msg = match net_probe(&addr, port, timeout_ms) {
                Ok(took_us) => GuestMsg::NetReady { id, took_us },
                Err(message) => GuestMsg::Error {
                    id,
                    code: forkvm_agent_protocol::ERR_IO.into(),
                    message,
                },
            };
            agent.reply(&msg, &[]);
        }
        HostMsg::SetClock { id, unix_time_ns } => {
            let msg = match crate::sys::set_realtime_ns(unix_time_ns) {
                Ok(()) => GuestMsg::ClockSet { id },
                Err(e) => GuestMsg::Error {
                    id,
                    code: forkvm_agent_protocol::ERR_IO.into(),
                    message: format!("cannot set the clock: {e}"),
                },
            };
            agent.reply(&msg, &[]);
        }
    }
}

/// Connect to `addr:port`, retrying until `timeout_ms`: connected or refused
/// means the path works. Returns the microseconds it took.
fn net_probe(addr: &str, port: u16, timeout_ms: u32) -> Result<u64, String> {
    let ip: std::net::Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
    let to = std::net::SocketAddr::from((ip, port));
    let start = Instant::now();
    let limit = std::time::Duration::from_millis(u64::from(timeout_ms.max(1)));
    let mut last = String::new();
    while start.elapsed() < limit {
        let left = limit
            .saturating_sub(start.elapsed())
            .max(std::time::Duration::from_millis(1));
        match std::net::TcpStream::connect_timeout(
            &to,
            left.min(std::time::Duration::from_millis(200)),
        ) {
            Ok(_) => return Ok(start.elapsed().as_micros() as u64),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Ok(start.elapsed().as_micros() as u64)
            }
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
    Err(format!("no route to {to} within {timeout_ms} ms: {last}"))
}

/// Milliseconds since the guest kernel booted.
fn uptime_ms() -> u64 {
    if let Ok(s) = std::fs::read_to_string("/proc/uptime") {
        if let Some(secs) = s
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<f64>().ok())
        {
            return (secs * 1000.0) as u64;
        }
    }
    // /proc not mounted: CLOCK_BOOTTIME is the same clock.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0 {
        let ms = i128::from(ts.tv_sec) * 1000 + i128::from(ts.tv_nsec) / 1_000_000;
        return u64::try_from(ms).unwrap_or(0);
    }
    0
}

#[cfg(test)]
mod tests {
    //! End-to-end tests of the serve loop over a socket pair, playing the
    //! host's side of the protocol.

    use super::*;
    use crate::files::tests::temp_dir;
    use crate::identity;
    use forkvm_agent_protocol::{
        read_frame, write_frame, Stream, ERR_NOT_FOUND, ERR_SPAWN, ERR_TOO_LARGE, OUTPUT_CHUNK,
    };
    use std::collections::BTreeMap;
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;
    use std::time::Instant;

    struct Host {
        w: UnixStream,
        r: UnixStream,
        shutdowns: mpsc::Receiver<()>,
    }

    /// Never the real /etc/machine-id or /run of the machine running the
    /// tests.
    fn nowhere() -> IdentityPaths {
        let nowhere = std::path::Path::new("/nonexistent/forkvm-agent-test");
        IdentityPaths {
            random: "/dev/urandom".into(),
            machine_id: nowhere.join("machine-id"),
            dbus_machine_id: nowhere.join("dbus-machine-id"),
            run_dir: nowhere.join("run"),
        }
    }

    fn start() -> Host {
        start_with(nowhere())
    }

    fn start_with(identity_paths: IdentityPaths) -> Host {
        let (host, guest) = UnixStream::pair().unwrap();
        let mut reader = guest.try_clone().unwrap();
        let (tx, shutdowns) = mpsc::channel();
        let tx = Mutex::new(tx);
        let agent = Agent::new(
            Box::new(guest),
            move || {
                let _ = tx.lock().unwrap().send(());
            },
            &identity_paths,
        );
        thread::spawn(move || serve_conn(&mut reader, &agent, EofPolicy::Return));
        host.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Host {
            w: host.try_clone().unwrap(),
            r: host,
            shutdowns,
        }
    }

    #[derive(Debug, Default)]
    struct ExecOut {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        end: Option<GuestMsg>,
        max_chunk: usize,
    }

    impl Host {
        fn send(&mut self, msg: &HostMsg, payload: &[u8]) {
            write_frame(&mut self.w, msg, payload).unwrap();
        }
        fn recv(&mut self) -> Frame<GuestMsg> {
            read_frame(&mut self.r)
                .unwrap()
                .expect("agent closed the connection")
        }
        fn call(&mut self, msg: &HostMsg, payload: &[u8]) -> Frame<GuestMsg> {
            self.send(msg, payload);
            let f = self.recv();
            assert_eq!(f.msg.id(), msg.id());
            f
        }
        fn exec(
            &mut self,
            id: u64,
            argv: &[&str],
            env: &[(&str, &str)],
            cwd: Option<&str>,
            timeout_ms: Option<u64>,
            stdin: &[u8],
        ) -> ExecOut {
            let msg = HostMsg::Exec {
                id,
                argv: argv.iter().map(|s| s.to_string()).collect(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
                cwd: cwd.map(str::to_string),
                timeout_ms,
            };
            self.send(&msg, stdin);
            self.collect(id)
        }
        fn collect(&mut self, id: u64) -> ExecOut {
            let mut out = ExecOut::default();
            loop {
                let f = self.recv();
                assert_eq!(f.msg.id(), id);
                match f.msg {
                    GuestMsg::Output { stream, .. } => {
                        out.max_chunk = out.max_chunk.max(f.payload.len());
                        match stream {
                            Stream::Stdout => out.stdout.extend(f.payload),
                            Stream::Stderr => out.stderr.extend(f.payload),
                        }
                    }
                    m => {
                        out.end = Some(m);
                        return out;
                    }
                }
            }
        }
    }

    fn exited(out: &ExecOut) -> (Option<i32>, Option<i32>, bool) {
        match &out.end {
            Some(GuestMsg::Exited {
                exit_code,
                signal,
                timed_out,
                ..
            }) => (*exit_code, *signal, *timed_out),
            other => panic!("expected exited, got {other:?}"),
        }
    }

    fn error_code(msg: &Option<GuestMsg>) -> (&str, &str) {
        match msg {
            Some(GuestMsg::Error { code, message, .. }) => (code, message),
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn ping() {
        let mut h = start();
        let f = h.call(&HostMsg::Ping { id: 42 }, b"");
        match f.msg {
            GuestMsg::Pong {
                id,
                agent_version,
                protocol,
                uptime_ms,
            } => {
                assert_eq!(id, 42);
                assert_eq!(agent_version, env!("CARGO_PKG_VERSION"));
                assert_eq!(protocol, PROTOCOL_VERSION);
                assert!(uptime_ms > 0);
            }
            m => panic!("unexpected {m:?}"),
        }
    }

    #[test]
    fn exec_streams_and_exit_code() {
        let mut h = start();
        let out = h.exec(
            1,
            &["sh", "-c", "echo hi; echo err >&2; exit 3"],
            &[],
            None,
            None,
            b"",
        );
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(exited(&out), (Some(3), None, false));
    }

    #[test]
    fn exec_stdin_reaches_cat() {
        let mut h = start();
        let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let out = h.exec(2, &["cat"], &[], None, None, &input);
        assert_eq!(exited(&out), (Some(0), None, false));
        assert!(out.stdout == input, "stdin did not round-trip through cat");
    }

    #[test]
    fn exec_env_and_cwd() {
        let mut h = start();
        let dir = temp_dir("cwd").canonicalize().unwrap();
        let dir_s = dir.to_str().unwrap();
        let out = h.exec(
            3,
            &[
                "sh",
                "-c",
                "echo \"$FOO|$BAR\"; pwd -P; test -n \"$PATH\" && echo path-inherited",
            ],
            &[("FOO", "foo value"), ("BAR", "")],
            Some(dir_s),
            None,
            b"",
        );
        assert_eq!(exited(&out), (Some(0), None, false));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("foo value|\n{dir_s}\npath-inherited\n")
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let out = h.exec(4, &["pwd"], &[], None, None, b"");
        assert_eq!(out.stdout, b"/\n", "default cwd is /");
    }

    #[test]
    fn exec_large_output_streams_through() {
        let mut h = start();
        const N: usize = 10 * 1024 * 1024;
        let out = h.exec(
            5,
            &["sh", "-c", &format!("head -c {N} /dev/urandom")],
            &[],
            None,
            Some(60_000),
            b"",
        );
        assert_eq!(exited(&out), (Some(0), None, false));
        assert_eq!(out.stdout.len(), N);
        assert!(out.max_chunk <= OUTPUT_CHUNK && out.max_chunk > 0);
        // And a second, differently shaped stream on stderr.
        let out = h.exec(
            6,
            &["sh", "-c", &format!("yes abcdefgh | head -c {N} >&2")],
            &[],
            None,
            Some(60_000),
            b"",
        );
        assert_eq!(exited(&out), (Some(0), None, false));
        assert_eq!(out.stderr.len(), N);
        assert!(out.stderr.chunks(9).all(|c| c == &b"abcdefgh\n"[..c.len()]));
    }

    #[test]
    fn exec_timeout_kills() {
        let mut h = start();
        let t = Instant::now();
        let out = h.exec(7, &["sleep", "30"], &[], None, Some(300), b"");
        let took = t.elapsed();
        let (code, signal, timed_out) = exited(&out);
        assert!(timed_out);
        assert_eq!((code, signal), (None, Some(libc::SIGKILL)));
        assert!(took < Duration::from_millis(1300), "took {took:?}");
        match out.end {
            Some(GuestMsg::Exited { duration_ms, .. }) => {
                assert!((300..1300).contains(&duration_ms))
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn exec_errors() {
        let mut h = start();
        let out = h.exec(8, &["forkvm-no-such-command-xyz"], &[], None, None, b"");
        assert_eq!(
            error_code(&out.end),
            (
                ERR_NOT_FOUND,
                "executable not found: forkvm-no-such-command-xyz"
            )
        );
        let out = h.exec(9, &[], &[], None, None, b"");
        assert_eq!(error_code(&out.end).0, ERR_INVALID);
        let out = h.exec(10, &["true"], &[], Some("/forkvm/no/such/dir"), None, b"");
        assert_eq!(
            error_code(&out.end),
            (ERR_SPAWN, "cwd /forkvm/no/such/dir does not exist")
        );
    }

    #[test]
    fn concurrent_requests_do_not_block_each_other() {
        let mut h = start();
        h.send(
            &HostMsg::Exec {
                id: 1,
                argv: vec!["sh".into(), "-c".into(), "sleep 1; echo done".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout_ms: None,
            },
            b"",
        );
        let t = Instant::now();
        let f = h.call(&HostMsg::Ping { id: 2 }, b"");
        assert!(matches!(f.msg, GuestMsg::Pong { id: 2, .. }));
        assert!(t.elapsed() < Duration::from_millis(500));
        let out = h.collect(1);
        assert_eq!(out.stdout, b"done\n");
        assert_eq!(exited(&out), (Some(0), None, false));
    }

    #[test]
    fn files_roundtrip_and_limits() {
        let mut h = start();
        let dir = temp_dir("files");
        let path = dir.join("sub/dir/data.bin");
        let path_s = path.to_str().unwrap().to_string();
        let content: Vec<u8> = (0..1_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();

        let f = h.call(
            &HostMsg::WriteFile {
                id: 1,
                path: path_s.clone(),
                mode: 0o640,
                create_dirs: false,
            },
            &content,
        );
        assert_eq!(error_code(&Some(f.msg)).0, ERR_NOT_FOUND);

        let f = h.call(
            &HostMsg::WriteFile {
                id: 2,
                path: path_s.clone(),
                mode: 0o640,
                create_dirs: true,
            },
            &content,
        );
        assert_eq!(
            f.msg,
            GuestMsg::FileWritten {
                id: 2,
                size: content.len() as u64
            }
        );

        let f = h.call(
            &HostMsg::ReadFile {
                id: 3,
                path: path_s.clone(),
                max_bytes: 2_000_000,
            },
            b"",
        );
        assert_eq!(
            f.msg,
            GuestMsg::FileData {
                id: 3,
                size: content.len() as u64,
                mode: 0o640
            }
        );
        assert!(f.payload == content, "file content differs");

        let f = h.call(
            &HostMsg::ReadFile {
                id: 4,
                path: path_s.clone(),
                max_bytes: 1000,
            },
            b"",
        );
        let reply = Some(f.msg);
        let (code, message) = error_code(&reply);
        assert_eq!(code, ERR_TOO_LARGE);
        assert_eq!(
            message,
            "file is 1000000 bytes, over the limit of 1000 bytes"
        );

        let f = h.call(
            &HostMsg::ReadFile {
                id: 5,
                path: dir.join("nope").to_str().unwrap().into(),
                max_bytes: 10,
            },
            b"",
        );
        assert_eq!(error_code(&Some(f.msg)).0, ERR_NOT_FOUND);
        let f = h.call(
            &HostMsg::ReadFile {
                id: 6,
                path: dir.to_str().unwrap().into(),
                max_bytes: 10,
            },
            b"",
        );
        assert_eq!(error_code(&Some(f.msg)).0, ERR_INVALID);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shutdown_acks_then_calls_hook() {
        let mut h = start();
        let f = h.call(&HostMsg::Shutdown { id: 9 }, b"");
        assert_eq!(f.msg, GuestMsg::ShutdownAck { id: 9 });
        h.shutdowns.recv_timeout(Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn identity_validates_then_acks() {
        let dir = temp_dir("identity-serve");
        let paths = IdentityPaths {
            random: "/dev/urandom".into(),
            machine_id: dir.join("machine-id"),
            dbus_machine_id: dir.join("dbus-machine-id"),
            run_dir: dir.join("run-forkvm"),
        };
        std::fs::write(&paths.machine_id, "ffffffffffffffffffffffffffffffff\n").unwrap();
        let mut h = start_with(paths.clone());
        // A booted VM's instance id is its boot_id, written at start.
        let boot_id = std::fs::read_to_string(paths.instance_id()).unwrap();
        assert_eq!(boot_id.len(), 37, "{boot_id:?}");
        let hostname = identity::current_hostname();
        let msg = |id, unix_time_ns| HostMsg::Identity {
            id,
            hostname: hostname.clone(),
            unix_time_ns,
            machine_id: "00112233445566778899aabbccddeeff".into(),
            instance_id: "inst-1".into(),
        };

        // Too little entropy: rejected before anything changes.
        let f = h.call(&msg(1, identity::now_ns()), &[0u8; 31]);
        let reply = Some(f.msg);
        let (code, message) = error_code(&reply);
        assert_eq!(code, ERR_INVALID);
        assert!(message.contains("entropy"), "{message}");
        assert_eq!(
            std::fs::read_to_string(paths.instance_id()).unwrap(),
            boot_id
        );

        if !identity::is_root() {
            // The RNG ioctls need CAP_SYS_ADMIN: an error, never an ack.
            let f = h.call(&msg(2, identity::now_ns()), &[5u8; 64]);
            assert_eq!(error_code(&Some(f.msg)).0, ERR_IO);
            eprintln!("skipped the ack half: not root");
        } else {
            // The clock is set to what it already is, the hostname likewise.
            let f = h.call(&msg(3, identity::now_ns()), &[5u8; 64]);
            match f.msg {
                GuestMsg::IdentityAck { id, took_us } => {
                    assert_eq!(id, 3);
                    assert!(took_us < 5_000_000, "took {took_us} us");
                }
                m => panic!("expected identity_ack, got {m:?}"),
            }
            assert_eq!(
                std::fs::read_to_string(&paths.machine_id).unwrap(),
                "00112233445566778899aabbccddeeff\n"
            );
            assert_eq!(
                std::fs::read_to_string(paths.instance_id()).unwrap(),
                "inst-1\n"
            );
            assert!(!paths.dbus_machine_id.exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_and_unknown_requests_are_survived() {
        let mut h = start();
        // Garbage, including a fake magic with an absurd length, then a ping.
        let mut junk = b"hello there FVA1\xff\xff\xff\xff\xff\xff\xff\xff and more".to_vec();
        junk.extend(encode(&HostMsg::Ping { id: 1 }, b"").unwrap());
        h.w.write_all(&junk).unwrap();
        assert!(matches!(h.recv().msg, GuestMsg::Pong { id: 1, .. }));

        // An unknown request type with an id gets an error for that id.
        let header = br#"{"type":"format_disk","id":77}"#;
        let mut bytes = MAGIC.to_vec();
        bytes.extend((header.len() as u32).to_le_bytes());
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(header);
        bytes.extend(b"xyz");
        bytes.extend(encode(&HostMsg::Ping { id: 2 }, b"").unwrap());
        h.w.write_all(&bytes).unwrap();
        let f = h.recv();
        assert_eq!(f.msg.id(), 77);
        assert_eq!(error_code(&Some(f.msg)).0, ERR_INVALID);
        assert!(matches!(h.recv().msg, GuestMsg::Pong { id: 2, .. }));
    }

    #[test]
    fn resync_keeps_a_split_magic() {
        let mut b = b"xxFV".to_vec();
        resync(&mut b);
        assert_eq!(b, b"xFV"); // "FV" might continue as "A1"; at least one byte dropped
        let mut b = b"FVA1junkFVA1rest".to_vec();
        resync(&mut b);
        assert_eq!(b, b"FVA1rest");
        let mut b = b"F".to_vec();
        resync(&mut b);
        assert!(b.is_empty());
    }

    /// A reader that plays back a script of reads, like a virtio port whose
    /// host disconnects (EOF) mid-frame and reconnects.
    struct Script(std::collections::VecDeque<Vec<u8>>);
    impl Read for Script {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            match self.0.pop_front() {
                Some(mut chunk) => {
                    let n = chunk.len().min(out.len());
                    out[..n].copy_from_slice(&chunk[..n]);
                    if n < chunk.len() {
                        chunk.drain(..n);
                        self.0.push_front(chunk);
                    }
                    Ok(n)
                }
                None => Err(io::Error::new(io::ErrorKind::BrokenPipe, "end of script")),
            }
        }
    }

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn eof_discards_partial_frame_and_keeps_reading() {
        let ping = |id| encode(&HostMsg::Ping { id }, b"").unwrap();
        let p1 = ping(1);
        let script = Script(
            vec![
                p1[..7].to_vec(), // host disconnects mid-frame...
                vec![],           // ...EOF...
                vec![],
                p1[7..].to_vec(), // ...stale tail from the old connection (resync)
                ping(2),          // the new connection
            ]
            .into(),
        );
        let cap = Capture::default();
        let r = serve(script, cap.clone(), EofPolicy::Retry, || {}, &nowhere());
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        // Replies come from request threads; give them a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut ids = Vec::new();
        while Instant::now() < deadline {
            let mut bytes = cap.0.lock().unwrap().clone();
            ids.clear();
            while let Some(f) = decode::<GuestMsg>(&mut bytes).unwrap() {
                ids.push(f.msg.id());
            }
            if !ids.is_empty() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ids, vec![2]);
    }
}
