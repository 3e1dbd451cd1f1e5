//! The request server: reads framed [`HostMsg`]s from any byte stream and
//! answers with [`GuestMsg`]s.
//!
//! It is written against plain `Read`/`Write` so the same code serves the
//! virtio-serial port in the VM and a `UnixStream` in tests.
//!
//! Each request is handled on its own thread (but for the few short ones
//! that must run in order, see [`dispatch`]) by [`handlers::handle`], which
//! lists them all. A frame whose header is not a request this agent knows
//! is skipped and, if it has an id, answered with an error (see
//! [`reject_frame`]), so a newer host talking to an older agent gets a
//! clear "unsupported" instead of a hang.
//!
//! `identity` deserves a word: QEMU's `microvm` has no VMGenID device, so a
//! guest restored from a snapshot cannot tell it was cloned: every clone
//! would share the snapshot's RNG state, stale clock, hostname and ids. The
//! host sends it first after every restore, with fresh entropy as the
//! payload, and the agent reseeds the kernel RNG, sets the clock, hostname,
//! machine id and instance id before any user code runs (see
//! [`crate::identity`]).

use std::io::{self, Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use forkvm_agent_protocol::{
    decode, encode, parse_prefix, Frame, FrameError, GuestMsg, HostMsg, ERR_INVALID, ERR_IO,
    ERR_UNSUPPORTED, MAGIC, PREFIX_LEN,
};

use crate::handlers;
use crate::identity::{IdentityPaths, Targets};
use crate::procs::Procs;
use crate::streams::Streams;
use crate::watch::Watchers;

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
    pub(crate) fn into_msg(self, id: u64) -> GuestMsg {
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
    pub(crate) identity: Arc<Mutex<Targets>>,
    /// Background processes (`proc_*`).
    pub(crate) procs: Arc<Procs>,
    /// Polled directory watchers.
    pub(crate) watchers: Arc<Watchers>,
    /// Open streams and the connection epoch.
    pub(crate) streams: Arc<Streams>,
    /// How long a stream may be silent before it sends `keepalive`.
    pub(crate) keepalive: Duration,
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
            procs: Arc::default(),
            streams: Arc::default(),
            watchers: Arc::default(),
            keepalive: crate::procs::KEEPALIVE,
        }
    }

    /// The host connection changed (or is gone): end the streams opened on
    /// the old one (see [`crate::streams`]).
    pub(crate) fn new_connection(&self) {
        self.streams.new_epoch();
        self.procs.wake_all();
    }

    pub(crate) fn reply(&self, msg: &GuestMsg, payload: &[u8]) {
        // Errors are logged by the outbox; there is nobody else to tell.
        let _ = self.outbox.send(msg, payload);
    }

    /// Run the shutdown hook (after `ShutdownAck` was sent).
    pub(crate) fn shutdown(&self) {
        (self.on_shutdown)();
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
    // Whether anything was read since the last EOF: a virtio port reads EOF
    // every EOF_POLL while no host is there, and one new epoch is enough.
    let mut had_data = true;
    loop {
        match reader.read(&mut chunk) {
            Ok(0) => {
                // The host went away (or was never there): whatever part of a
                // frame we hold will never be completed.
                buf.clear();
                buf.shrink_to(BUF_KEEP);
                in_sync = true;
                if std::mem::take(&mut had_data) {
                    agent.new_connection();
                }
                match eof {
                    EofPolicy::Retry => thread::sleep(EOF_POLL),
                    EofPolicy::Return => return Ok(()),
                }
            }
            Ok(n) => {
                had_data = true;
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
/// if the header has an id, tell the host so it does not wait forever: an
/// unknown type with [`ERR_UNSUPPORTED`] (the host is newer than this agent),
/// anything else with [`ERR_INVALID`].
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
    // serde's wording for a `type` that names no request: the host is
    // newer than this agent.
    let err = if e.to_string().contains("unknown variant") {
        ReqError {
            code: ERR_UNSUPPORTED,
            message: format!(
                "this agent (version {}) does not support the request: {e}",
                env!("CARGO_PKG_VERSION")
            ),
        }
    } else {
        ReqError {
            code: ERR_INVALID,
            message: format!("malformed request: {e}"),
        }
    };
    if let Some(id) = id {
        agent.reply(&err.into_msg(id), &[]);
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
///   translated again in every new QEMU process;
/// - the process controls (`proc_input`, `proc_close_stdin`, `proc_signal`,
///   `proc_resize`, and `proc_list`, `stream_cancel`) only queue or look
///   up, and must apply in the order they were sent: input typed into a
///   terminal must not be reordered by thread scheduling.
fn dispatch(frame: Frame<HostMsg>, agent: &Agent) {
    if matches!(
        frame.msg,
        HostMsg::Ping { .. }
            | HostMsg::Identity { .. }
            | HostMsg::SetClock { .. }
            | HostMsg::ProcList { .. }
            | HostMsg::ProcInput(_)
            | HostMsg::ProcCloseStdin(_)
            | HostMsg::ProcSignal(_)
            | HostMsg::ProcResize(_)
            | HostMsg::StreamCancel { .. }
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

/// [`handlers::handle`], answering with an error if it panics: a bug in a handler
/// must not leave the host waiting forever.
fn handle_guarded(frame: Frame<HostMsg>, agent: &Agent) {
    let id = frame.msg.id();
    if panic::catch_unwind(AssertUnwindSafe(|| handlers::handle(frame, agent))).is_err() {
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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fs;
#[cfg(test)]
mod tests_procs;
#[cfg(test)]
mod tests_v2;
