//! The wire protocol between the forkvm host daemon and the guest agent.
//!
//! The agent runs inside every microVM and is reached over a virtio-serial port
//! (`org.forkvm.agent.0`) that QEMU exposes on the host as a unix socket. A serial
//! port is a plain byte stream, so messages are framed:
//!
//! ```text
//!  0        4        8        12                  12+H               12+H+P
//!  +--------+--------+--------+-------------------+------------------+
//!  | magic  | hlen   | plen   | header: JSON      | payload: raw     |
//!  | "FVA1" | u32 LE | u32 LE | (hlen bytes)      | (plen bytes)     |
//!  +--------+--------+--------+-------------------+------------------+
//! ```
//!
//! * `magic` is checked on every frame, so a desynchronised stream (for example
//!   a host that reconnected half-way through a frame) is detected at once
//!   instead of being misread as a giant length.
//! * The header is a JSON object tagged by `type` ([`HostMsg`] or [`GuestMsg`]).
//! * The payload carries bulk bytes without base64 inflation: stdin for an
//!   exec, stdout/stderr chunks, file contents.
//! * `hlen` is limited to [`MAX_HEADER`] and `plen` to [`MAX_PAYLOAD`]; a frame
//!   over either limit is a protocol error, never an allocation.
//!
//! Every request carries an `id` chosen by the host; every message the guest
//! sends about that request echoes it. An exec produces any number of
//! [`GuestMsg::Output`] frames followed by exactly one [`GuestMsg::Exited`] (or
//! [`GuestMsg::Error`]); a detached exec produces exactly one
//! [`GuestMsg::Started`] (or `Error`). The streams of protocol 3
//! (`proc_start`, `proc_connect`, `fs_watch`) are described in [`caps`].
//! Every other request produces exactly one reply.
//!
//! Connection semantics: the host may disconnect and reconnect at any time
//! (daemon restart). The guest then discards any partial frame it had read.
//! Replies written while no host was connected are delivered to the next
//! connection; the host drops replies whose `id` it does not know.
//!
//! Compatibility rule: [`PROTOCOL_VERSION`] changes when a message changes
//! meaning. New optional fields may be added without a bump (both sides ignore
//! unknown fields in replies, and requests only gain fields with defaults).
//! An agent answers a request type it does not know with an `Error` whose
//! code is [`ERR_UNSUPPORTED`] (agents of protocol 1 used [`ERR_INVALID`]
//! with serde's "unknown variant" message) and keeps serving.
//!
//! Because an old agent *ignores* unknown fields, a request field whose
//! meaning an old agent would silently drop must come with a version bump,
//! and the host must check the agent's version (from `pong`) before sending
//! it. Protocol 2 added, and hosts must check for:
//!
//! * `exec.user`: run as another user (an old agent would run it as root);
//! * `exec.detach` / `exec.log_path`: start a long-running process and answer
//!   at once with `started` (an old agent would run it attached);
//! * `put_archive.append_at` (with `put_archive` itself);
//!
//! and the new request types `port_probe`, `put_archive`, `resize_rootfs`
//! and `sync`, which an old agent rejects by itself.
//!
//! Protocol 3 added background processes with replayable output, PTYs,
//! filesystem operations and directory watches, all new request types
//! (`proc_*`, `stream_cancel`, `fs_*`, `watcher_*`, `get_archive`); see [`caps`] for what
//! each does and how their streams begin and end.
//!
//! The `put_archive` payload is an uncompressed tar stream; see [`tar`] for
//! the accepted format and for how a host splits an archive bigger than
//! [`MAX_PAYLOAD`] into several requests.

pub mod caps;
pub mod tar;
pub mod volume;

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

pub use caps::{
    EntryInfo, FileKind, FsEvent, FsOp, ProcEnd, ProcInfo, ProcRef, ProcResize, ProcSignal,
    ProcStart, ProcStream, PtySize,
};

/// Frame magic: "FVA1".
pub const MAGIC: [u8; 4] = *b"FVA1";
/// Bytes before the header.
pub const PREFIX_LEN: usize = 12;
/// Largest accepted JSON header.
pub const MAX_HEADER: u32 = 1 << 20;
/// Largest accepted payload in one frame (file transfers and stdin above this
/// are refused by the sender).
pub const MAX_PAYLOAD: u32 = 64 << 20;
/// Size of the stdout/stderr chunks the agent sends.
pub const OUTPUT_CHUNK: usize = 64 << 10;
/// Protocol version reported by `pong` (see the compatibility rule above).
pub const PROTOCOL_VERSION: u32 = 3;
/// The first protocol version with `exec.user`, `exec.detach`, `port_probe`,
/// `put_archive`, `resize_rootfs` and `sync`.
pub const PROTOCOL_V2: u32 = 2;
/// The first protocol version with processes, PTYs, filesystem operations
/// and watches (see [`caps`]).
pub const PROTOCOL_V3: u32 = 3;
/// Where a detached exec's output goes when the request names no
/// `log_path`: `start-<pid>.log` in this directory (a tmpfs in the VM).
pub const DEFAULT_LOG_DIR: &str = "/run/forkvm";
/// The virtio-serial port name the agent listens on.
pub const PORT_NAME: &str = "org.forkvm.agent.0";

/// The name of the volume port ([`volume`]), present on machines booted
/// since volumes exist.
pub const VOLUME_PORT_NAME: &str = "org.forkvm.volumes.0";

/// A message from the host to the guest agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMsg {
    /// Liveness check. Answered by [`GuestMsg::Pong`].
    Ping { id: u64 },
    /// Run a program. The frame payload is the whole of its stdin (it is then
    /// closed). Answered by `Output*` then `Exited`; with `detach`, by
    /// `Started` alone.
    ///
    /// `env` is added to the agent's own environment (PATH and
    /// HOME=/root); PATH from `env` is the one searched for `argv[0]`. A `cwd` that
    /// does not exist is an `Error` (code [`ERR_SPAWN`]).
    Exec {
        id: u64,
        argv: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        cwd: Option<String>,
        /// Kill the process group after this long; `None` means no limit.
        /// Not allowed with `detach`.
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Run as this user, in the OCI forms `name`, `uid`, `name:group`,
        /// `uid:gid`, `uid:group`, `name:gid`, resolved against the guest's
        /// /etc/passwd and /etc/group. Without a group the user's primary
        /// group and its memberships in /etc/group are used (initgroups);
        /// with one, that group alone. HOME defaults to the user's home
        /// directory ("/" for a uid with no passwd entry) unless `env` sets
        /// it. `None`: root, as the agent. Protocol 2.
        #[serde(default)]
        user: Option<String>,
        /// Start the process in its own session with stdin from /dev/null
        /// and stdout and stderr appended to `log_path`, answer `Started` at
        /// once and leave it running: it outlives the request and the host
        /// connection, and the agent reaps it when it exits (appending a
        /// line with its exit status to the log). The payload must be empty.
        /// Protocol 2.
        #[serde(default)]
        detach: bool,
        /// The log file of a detached process (created if missing, appended
        /// to otherwise; its directory must exist). Default:
        /// `/run/forkvm/start-<pid>.log` (see [`DEFAULT_LOG_DIR`]).
        #[serde(default)]
        log_path: Option<String>,
    },
    /// Write the payload to `path`, replacing it. Answered by `FileWritten`.
    WriteFile {
        id: u64,
        path: String,
        #[serde(default = "default_mode")]
        mode: u32,
        /// Create missing parent directories.
        #[serde(default)]
        create_dirs: bool,
    },
    /// Read a file of at most `max_bytes`. Answered by `FileData`.
    ReadFile {
        id: u64,
        path: String,
        max_bytes: u64,
    },
    /// Flush filesystems and power the VM off. Answered by `ShutdownAck`.
    Shutdown { id: u64 },
    /// Give a freshly restored clone its own identity, before it runs any
    /// user code. The frame payload is fresh entropy from the host (at least
    /// 32 bytes), mixed into the guest RNG with RNDADDENTROPY followed by
    /// RNDRESEEDCRNG, so two clones of one snapshot never produce the same
    /// random bytes. Answered by `IdentityAck`.
    Identity {
        id: u64,
        hostname: String,
        /// Host wall clock (CLOCK_REALTIME) when the message was sent.
        unix_time_ns: u64,
        /// A fresh 32-hex-digit machine id, written to /etc/machine-id only
        /// if the image has a non-empty one.
        machine_id: String,
        /// A fresh per-instance id (like boot_id, which the kernel cannot
        /// change after boot), written to /run/forkvm/instance-id.
        instance_id: String,
    },
    /// Set the wall clock. Sent right after `Identity` is acknowledged: the
    /// agent is then running warm, so the time arrives within milliseconds
    /// of being read, whereas `Identity`'s own time can be late by however
    /// long a just-restored guest takes to process it. Answered by
    /// `ClockSet`.
    SetClock { id: u64, unix_time_ns: u64 },
    /// Check that the guest's network path works: open a TCP connection to
    /// `addr:port` (the gateway) within `timeout_ms`. A refused connection
    /// counts as success, since a reset proves the round trip. Answered by
    /// `NetReady`, or `Error` with the reason.
    NetProbe {
        id: u64,
        addr: String,
        port: u16,
        timeout_ms: u32,
    },
    /// Does a TCP server in the guest accept connections on `port` of
    /// 127.0.0.1 (or, failing that, of ::1) right now? One attempt per
    /// address, each bounded by `timeout_ms`; refused or timed out means
    /// closed (unlike `NetProbe`). Answered by `PortOpen`. Protocol 2.
    PortProbe { id: u64, port: u16, timeout_ms: u32 },
    /// Extract the payload, an uncompressed tar stream (see [`tar`]), under
    /// the directory `dest` (an absolute guest path, created with its
    /// missing parents if needed). Entry paths are taken relative to `dest`
    /// (a leading `/` is dropped); an entry with a `..` component, or whose
    /// parent directory would be reached through a symlink leading out of
    /// `dest`, is refused. Ownership is `owner` (the user forms of
    /// `Exec::user`) for every entry, or else each header's numeric uid and
    /// gid. Answered by `ArchiveWritten`. Protocol 2.
    PutArchive {
        id: u64,
        dest: String,
        #[serde(default)]
        owner: Option<String>,
        /// Continue a file a previous `PutArchive` began: the archive then
        /// holds exactly one regular-file entry, whose data is written at
        /// this byte offset of the existing file (a regular file exactly
        /// this long), after which its mode, owner and mtime are applied
        /// again. This is how a file bigger than [`MAX_PAYLOAD`] is sent;
        /// see [`tar::split()`].
        #[serde(default)]
        append_at: Option<u64>,
    },
    /// Grow the mounted root ext4 filesystem online to the size of its
    /// block device. A no-op when it already fills it. Answered by
    /// `RootfsResized`. Protocol 2.
    ResizeRootfs { id: u64 },
    /// Flush every filesystem (sync(2)). Answered by `Synced`. Protocol 2.
    Sync { id: u64 },
    /// Mount volumes: FUSE mounts whose requests the agent relays over the
    /// volume port ([`volume`]) to the host, which serves them. Answered by
    /// `Ack` once every mount is in place, or `Error` (nothing mounted).
    MountVolumes {
        id: u64,
        volumes: Vec<VolumeMountSpec>,
    },
    /// Start a background process; a stream (see [`caps`]). Protocol 3.
    ProcStart(ProcStart),
    /// Attach to a process: replay its buffered output, then follow it.
    ProcConnect(ProcRef),
    /// Answered by `Processes`.
    ProcList { id: u64 },
    /// Write the payload to the process's stdin (or its PTY). `Ack`.
    ProcInput(ProcRef),
    /// Close the process's stdin pipe (after queued input). `Ack`.
    ProcCloseStdin(ProcRef),
    /// `Ack`.
    ProcSignal(ProcSignal),
    /// `Ack`.
    ProcResize(ProcResize),
    /// End the stream opened by request `stream` (a `proc_start`,
    /// `proc_connect` or `fs_watch`). `Ack`, also when it had ended.
    StreamCancel { id: u64, stream: u64 },
    /// Answered by `FsEntry`.
    FsStat { id: u64, path: String },
    /// Answered by `Exists` (a dangling symlink exists).
    FsExists { id: u64, path: String },
    /// Answered by `FsEntries`, the entries in the payload.
    FsList {
        id: u64,
        path: String,
        #[serde(default)]
        depth: u32,
    },
    /// `mkdir -p`. Answered by `DirMade`.
    FsMkdir { id: u64, path: String },
    /// rename(2). Answered by `FsEntry` for `destination`.
    FsMove {
        id: u64,
        source: String,
        destination: String,
    },
    /// `rm -r`. `Ack`.
    FsRemove { id: u64, path: String },
    /// Watch a directory; a stream of `fs_events`.
    FsWatch {
        id: u64,
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Create a polled watcher. Answered by `Watcher`.
    WatcherCreate {
        id: u64,
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// The events since the last poll. Answered by `FsEvents`.
    WatcherPoll { id: u64, watcher_id: String },
    /// `Ack`.
    WatcherRemove { id: u64, watcher_id: String },
    /// Download several files: a tar of `paths` (directories with all
    /// they hold). Answered by `ArchiveData`.
    GetArchive {
        id: u64,
        paths: Vec<String>,
        /// Refuse (`too_large`) an archive over this many bytes; at most
        /// [`MAX_PAYLOAD`] either way.
        #[serde(default)]
        max_bytes: Option<u64>,
    },
}

fn default_mode() -> u32 {
    0o644
}

/// One mount of [`HostMsg::MountVolumes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMountSpec {
    /// The volume's index on the volume port.
    pub index: u8,
    /// The guest directory (created if missing).
    pub path: String,
    pub read_only: bool,
}

impl HostMsg {
    /// The request id.
    pub fn id(&self) -> u64 {
        match self {
            HostMsg::Ping { id }
            | HostMsg::Exec { id, .. }
            | HostMsg::WriteFile { id, .. }
            | HostMsg::ReadFile { id, .. }
            | HostMsg::Shutdown { id }
            | HostMsg::Identity { id, .. }
            | HostMsg::SetClock { id, .. }
            | HostMsg::NetProbe { id, .. }
            | HostMsg::PortProbe { id, .. }
            | HostMsg::PutArchive { id, .. }
            | HostMsg::ResizeRootfs { id }
            | HostMsg::Sync { id }
            | HostMsg::MountVolumes { id, .. }
            | HostMsg::ProcList { id }
            | HostMsg::StreamCancel { id, .. }
            | HostMsg::FsStat { id, .. }
            | HostMsg::FsExists { id, .. }
            | HostMsg::FsList { id, .. }
            | HostMsg::FsMkdir { id, .. }
            | HostMsg::FsMove { id, .. }
            | HostMsg::FsRemove { id, .. }
            | HostMsg::FsWatch { id, .. }
            | HostMsg::WatcherCreate { id, .. }
            | HostMsg::WatcherPoll { id, .. }
            | HostMsg::WatcherRemove { id, .. }
            | HostMsg::GetArchive { id, .. } => *id,
            HostMsg::ProcStart(r) => r.id,
            HostMsg::ProcConnect(r) | HostMsg::ProcInput(r) | HostMsg::ProcCloseStdin(r) => r.id,
            HostMsg::ProcSignal(r) => r.id,
            HostMsg::ProcResize(r) => r.id,
        }
    }
}

/// Which output stream an [`GuestMsg::Output`] chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A message from the guest agent to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GuestMsg {
    Pong {
        id: u64,
        agent_version: String,
        protocol: u32,
        /// Milliseconds since the guest kernel booted.
        uptime_ms: u64,
    },
    /// A chunk of output; the bytes are the frame payload.
    Output {
        id: u64,
        stream: Stream,
    },
    /// The process ended. Exactly one of `exit_code`/`signal` is set.
    Exited {
        id: u64,
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        duration_ms: u64,
    },
    FileWritten {
        id: u64,
        size: u64,
    },
    /// The file contents are the frame payload.
    FileData {
        id: u64,
        size: u64,
        mode: u32,
    },
    ShutdownAck {
        id: u64,
    },
    /// The identity was applied; `took_us` is the time the agent spent.
    IdentityAck {
        id: u64,
        took_us: u64,
    },
    /// The clock was set.
    ClockSet {
        id: u64,
    },
    /// The probe's round trip worked after `took_us`.
    NetReady {
        id: u64,
        took_us: u64,
    },
    /// A detached exec is running as `pid`, its output going to
    /// `log_path`.
    Started {
        id: u64,
        pid: u32,
        log_path: String,
    },
    /// The answer to `PortProbe`.
    PortOpen {
        id: u64,
        open: bool,
    },
    /// `PutArchive` wrote `entries` entries (of every type) holding `bytes`
    /// bytes of file data.
    ArchiveWritten {
        id: u64,
        entries: u64,
        bytes: u64,
    },
    /// The root filesystem's size before and after `ResizeRootfs` (equal
    /// when there was nothing to do).
    RootfsResized {
        id: u64,
        old_bytes: u64,
        new_bytes: u64,
    },
    /// `Sync` finished.
    Synced {
        id: u64,
    },
    /// A process stream began: the process is `pid`. Protocol 3.
    ProcStarted {
        id: u64,
        pid: u32,
    },
    /// Output of a process; the bytes are the payload. `lost` bytes were
    /// dropped from the ring just before them.
    ProcData {
        id: u64,
        stream: ProcStream,
        #[serde(default)]
        lost: u64,
    },
    /// The last message of a process stream.
    ProcEnd(ProcEnd),
    /// A stream is alive but has had nothing to say for a while.
    Keepalive {
        id: u64,
    },
    /// The answer to `ProcList`.
    Processes {
        id: u64,
        processes: Vec<ProcInfo>,
    },
    /// A request with nothing to report succeeded.
    Ack {
        id: u64,
    },
    FsEntry {
        id: u64,
        entry: EntryInfo,
    },
    Exists {
        id: u64,
        exists: bool,
    },
    /// `count` entries, as a JSON array of [`EntryInfo`] in the payload.
    FsEntries {
        id: u64,
        count: u64,
    },
    /// `FsMkdir` made the directory, or it was one already (`existed`).
    DirMade {
        id: u64,
        entry: EntryInfo,
        existed: bool,
    },
    /// An `FsWatch` stream began.
    WatchStarted {
        id: u64,
    },
    /// Watch events; `dropped` were lost before them (queue overflow).
    FsEvents {
        id: u64,
        events: Vec<FsEvent>,
        #[serde(default)]
        dropped: u64,
    },
    /// A polled watcher was created.
    Watcher {
        id: u64,
        watcher_id: String,
    },
    /// The payload is a tar of `entries` entries holding `bytes` bytes of
    /// file data (the answer to `GetArchive`).
    ArchiveData {
        id: u64,
        entries: u64,
        bytes: u64,
    },
    /// The request failed. `code` is one of the `ERR_*` constants.
    Error {
        id: u64,
        code: String,
        message: String,
    },
}

impl GuestMsg {
    /// The id of the request this message answers.
    pub fn id(&self) -> u64 {
        match self {
            GuestMsg::Pong { id, .. }
            | GuestMsg::Output { id, .. }
            | GuestMsg::Exited { id, .. }
            | GuestMsg::FileWritten { id, .. }
            | GuestMsg::FileData { id, .. }
            | GuestMsg::ShutdownAck { id }
            | GuestMsg::IdentityAck { id, .. }
            | GuestMsg::ClockSet { id }
            | GuestMsg::NetReady { id, .. }
            | GuestMsg::Started { id, .. }
            | GuestMsg::PortOpen { id, .. }
            | GuestMsg::ArchiveWritten { id, .. }
            | GuestMsg::RootfsResized { id, .. }
            | GuestMsg::Synced { id }
            | GuestMsg::Error { id, .. }
            | GuestMsg::ProcStarted { id, .. }
            | GuestMsg::ProcData { id, .. }
            | GuestMsg::Keepalive { id }
            | GuestMsg::Processes { id, .. }
            | GuestMsg::Ack { id }
            | GuestMsg::FsEntry { id, .. }
            | GuestMsg::Exists { id, .. }
            | GuestMsg::FsEntries { id, .. }
            | GuestMsg::DirMade { id, .. }
            | GuestMsg::WatchStarted { id }
            | GuestMsg::FsEvents { id, .. }
            | GuestMsg::Watcher { id, .. }
            | GuestMsg::ArchiveData { id, .. } => *id,
            GuestMsg::ProcEnd(e) => e.id,
        }
    }
}

/// Error codes carried by [`GuestMsg::Error`].
pub const ERR_NOT_FOUND: &str = "not_found";
pub const ERR_SPAWN: &str = "spawn_failed";
pub const ERR_TOO_LARGE: &str = "too_large";
pub const ERR_IO: &str = "io";
pub const ERR_INVALID: &str = "invalid";
/// The agent does not know this request type (it is older than the host).
pub const ERR_UNSUPPORTED: &str = "unsupported";

/// Whether an `Error` reply means the agent does not know the request type:
/// [`ERR_UNSUPPORTED`] from protocol 2 on, or protocol 1's [`ERR_INVALID`]
/// carrying serde's "unknown variant" message.
pub fn is_unsupported_error(code: &str, message: &str) -> bool {
    code == ERR_UNSUPPORTED || (code == ERR_INVALID && message.contains("unknown variant"))
}

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic {0:02x?}: the stream is out of sync")]
    BadMagic([u8; 4]),
    #[error("frame header of {0} bytes exceeds the {MAX_HEADER} byte limit")]
    HeaderTooLarge(u32),
    #[error("frame payload of {0} bytes exceeds the {MAX_PAYLOAD} byte limit")]
    PayloadTooLarge(u32),
    #[error("frame header is not a valid message")]
    BadHeader(#[source] serde_json::Error),
    #[error("i/o error on the agent channel")]
    Io(#[from] io::Error),
}

/// One decoded frame: a typed header and its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<M> {
    pub msg: M,
    pub payload: Vec<u8>,
}

/// Encode a frame into bytes.
pub fn encode<M: Serialize>(msg: &M, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if payload.len() > MAX_PAYLOAD as usize {
        return Err(FrameError::PayloadTooLarge(
            u32::try_from(payload.len()).unwrap_or(u32::MAX),
        ));
    }
    let header = serde_json::to_vec(msg).map_err(FrameError::BadHeader)?;
    if header.len() > MAX_HEADER as usize {
        return Err(FrameError::HeaderTooLarge(header.len() as u32));
    }
    let mut out = Vec::with_capacity(PREFIX_LEN + header.len() + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Parse the 12-byte prefix into (header length, payload length).
pub fn parse_prefix(prefix: &[u8; PREFIX_LEN]) -> Result<(u32, u32), FrameError> {
    let magic = [prefix[0], prefix[1], prefix[2], prefix[3]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let hlen = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
    let plen = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]);
    if hlen > MAX_HEADER {
        return Err(FrameError::HeaderTooLarge(hlen));
    }
    if plen > MAX_PAYLOAD {
        return Err(FrameError::PayloadTooLarge(plen));
    }
    Ok((hlen, plen))
}

/// Try to decode one frame from the front of `buf`. On success the frame's
/// bytes are removed from `buf`. `Ok(None)` means more bytes are needed.
pub fn decode<M: for<'de> Deserialize<'de>>(
    buf: &mut Vec<u8>,
) -> Result<Option<Frame<M>>, FrameError> {
    if buf.len() < PREFIX_LEN {
        return Ok(None);
    }
    let mut prefix = [0u8; PREFIX_LEN];
    prefix.copy_from_slice(&buf[..PREFIX_LEN]);
    let (hlen, plen) = parse_prefix(&prefix)?;
    let total = PREFIX_LEN + hlen as usize + plen as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let hend = PREFIX_LEN + hlen as usize;
    let msg = serde_json::from_slice(&buf[PREFIX_LEN..hend]).map_err(FrameError::BadHeader)?;
    let payload = buf[hend..total].to_vec();
    buf.drain(..total);
    Ok(Some(Frame { msg, payload }))
}

/// Read exactly one frame from a blocking reader. `Ok(None)` is a clean EOF
/// before the first byte of a frame.
pub fn read_frame<M: for<'de> Deserialize<'de>, R: Read>(
    r: &mut R,
) -> Result<Option<Frame<M>>, FrameError> {
    let mut prefix = [0u8; PREFIX_LEN];
    let mut got = 0;
    while got < PREFIX_LEN {
        // A signal handler of this process (the agent's SIGCHLD reaper, when
        // a host runs in the same process as in the tests) can interrupt the
        // read; `read_exact` below retries by itself, this loop must too.
        let n = match r.read(&mut prefix[got..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        got += n;
    }
    let (hlen, plen) = parse_prefix(&prefix)?;
    let mut header = vec![0u8; hlen as usize];
    r.read_exact(&mut header)?;
    let mut payload = vec![0u8; plen as usize];
    r.read_exact(&mut payload)?;
    let msg = serde_json::from_slice(&header).map_err(FrameError::BadHeader)?;
    Ok(Some(Frame { msg, payload }))
}

/// Write one frame to a blocking writer.
pub fn write_frame<M: Serialize, W: Write>(
    w: &mut W,
    msg: &M,
    payload: &[u8],
) -> Result<(), FrameError> {
    let bytes = encode(msg, payload)?;
    w.write_all(&bytes)?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod request_tests;

#[cfg(test)]
mod frame_tests;
