//! The protocol-3 operations of [`AgentConn`]: background processes and
//! PTYs, filesystem operations, directory watches and multi-file downloads
//! (see `forkvm_agent_protocol::caps` for what the agent does).
//!
//! Every operation first checks that the agent speaks protocol 3, so a
//! sandbox restored from a snapshot of an older agent is refused with
//! [`AgentError::Unsupported`] (which says to rebuild the template) before
//! anything is sent.
//!
//! `proc_start`, `proc_connect` and `fs_watch` open a stream: an
//! [`AgentStream`] receives its frames, multiplexed on the connection like
//! every other request, and turns them into typed events. A stream dropped
//! before its end sends `stream_cancel`, so the agent stops sending frames
//! nobody reads; the process itself goes on (it belongs to the agent, not to
//! the stream).
//!
//! ```text
//!  proc_start / proc_connect            fs_watch
//!  ───────────────────────────          ─────────────────────
//!  ProcEvent::Started {pid}             WatchEvent::Started
//!  ProcEvent::Data {stream,lost,data}*  WatchEvent::Events*
//!  ProcEvent::Keepalive*                WatchEvent::Keepalive*
//!  ProcEvent::End (last)                (until dropped, or an error)
//! ```

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use forkvm_agent_protocol::{
    self as proto, EntryInfo, Frame, FsEvent, GuestMsg, HostMsg, ProcEnd, ProcInfo, ProcRef,
    ProcResize, ProcSignal, ProcStart, ProcStream, PtySize,
};
use tokio::sync::mpsc;

use super::{guest_error, AgentConn, AgentError};

/// How long a small request (stat, signal, list...) may take.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a listing or an archive may take.
const BULK_TIMEOUT: Duration = Duration::from_secs(300);
/// A stream with no frame for this long (the agent sends a keepalive every
/// `KEEPALIVE_SECS`) is taken for a hung guest.
const STREAM_IDLE: Duration = Duration::from_secs(proto::caps::KEEPALIVE_SECS * 2 + 30);

/// A process to start (`proc_start`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcSpec {
    /// The program, looked up on PATH.
    pub cmd: String,
    pub args: Vec<String>,
    /// Added to the agent's environment.
    pub envs: BTreeMap<String, String>,
    /// Working directory; `/` when absent.
    pub cwd: Option<String>,
    /// OCI user form; root when absent.
    pub user: Option<String>,
    /// A name to find it by, unique among running processes.
    pub tag: Option<String>,
    /// Run it on a PTY of this size.
    pub pty: Option<PtySize>,
    /// Give it a stdin pipe (always writable with a PTY).
    pub stdin: bool,
}

/// Which process: by pid or by the tag it was started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcTarget {
    Pid(u32),
    Tag(String),
}

impl ProcTarget {
    fn parts(&self) -> (Option<u32>, Option<String>) {
        match self {
            ProcTarget::Pid(p) => (Some(*p), None),
            ProcTarget::Tag(t) => (None, Some(t.clone())),
        }
    }

    fn proc_ref(&self, id: u64) -> ProcRef {
        let (pid, tag) = self.parts();
        ProcRef { id, pid, tag }
    }
}

/// One event of a process stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcEvent {
    /// The first event: the stream follows process `pid`.
    Started { pid: u32 },
    /// Output; `lost` bytes were dropped from the ring just before it.
    Data {
        stream: ProcStream,
        lost: u64,
        data: Vec<u8>,
    },
    /// The stream is alive but the process said nothing for a while.
    Keepalive,
    /// The process ended; the last event.
    End(ProcEnd),
}

/// One event of a watch stream.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// The first event: the watch is in place.
    Started,
    /// Changes; `dropped` were lost before them.
    Events { events: Vec<FsEvent>, dropped: u64 },
    /// Nothing changed for a while.
    Keepalive,
}

/// What `fs_mkdir` did.
#[derive(Debug, Clone, PartialEq)]
pub struct DirMade {
    pub entry: EntryInfo,
    /// The directory was there already.
    pub existed: bool,
}

/// A tar of several guest paths (`get_archive`).
#[derive(Debug, Clone, PartialEq)]
pub struct Archive {
    pub tar: Vec<u8>,
    pub entries: u64,
    pub bytes: u64,
}

/// How the frames of one kind of stream become events.
pub trait StreamEvent: Sized + Send + 'static {
    /// Turn a frame into an event; `Err` for an `error` frame or one that
    /// does not belong in this stream.
    fn decode(f: Frame<GuestMsg>) -> Result<Self, AgentError>;
    /// Whether this event ends the stream.
    fn is_last(&self) -> bool;
}

impl StreamEvent for ProcEvent {
    fn decode(f: Frame<GuestMsg>) -> Result<Self, AgentError> {
        match f.msg {
            GuestMsg::ProcStarted { pid, .. } => Ok(ProcEvent::Started { pid }),
            GuestMsg::ProcData { stream, lost, .. } => Ok(ProcEvent::Data {
                stream,
                lost,
                data: f.payload,
            }),
            GuestMsg::Keepalive { .. } => Ok(ProcEvent::Keepalive),
            GuestMsg::ProcEnd(e) => Ok(ProcEvent::End(e)),
            GuestMsg::Error { code, message, .. } => {
                Err(guest_error(code, message, "run background processes"))
            }
            other => Err(unexpected("a process event", &other)),
        }
    }
    fn is_last(&self) -> bool {
        matches!(self, ProcEvent::End(_))
    }
}

impl StreamEvent for WatchEvent {
    fn decode(f: Frame<GuestMsg>) -> Result<Self, AgentError> {
        match f.msg {
            GuestMsg::WatchStarted { .. } => Ok(WatchEvent::Started),
            GuestMsg::FsEvents {
                events, dropped, ..
            } => Ok(WatchEvent::Events { events, dropped }),
            GuestMsg::Keepalive { .. } => Ok(WatchEvent::Keepalive),
            GuestMsg::Error { code, message, .. } => {
                Err(guest_error(code, message, "watch directories"))
            }
            other => Err(unexpected("a watch event", &other)),
        }
    }
    fn is_last(&self) -> bool {
        false
    }
}

/// An open stream of the agent. Dropping it before its end cancels it in
/// the guest.
pub struct AgentStream<E: StreamEvent> {
    conn: Arc<AgentConn>,
    id: u64,
    rx: mpsc::Receiver<Frame<GuestMsg>>,
    ended: bool,
    _kind: PhantomData<E>,
}

impl<E: StreamEvent> AgentStream<E> {
    /// The request id the stream was opened with.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event; `None` once the stream has ended (after its last
    /// event, or an error).
    pub async fn next(&mut self) -> Result<Option<E>, AgentError> {
        if self.ended {
            return Ok(None);
        }
        let r = match tokio::time::timeout(STREAM_IDLE, self.rx.recv()).await {
            Err(_) => Err(AgentError::Timeout(STREAM_IDLE)),
            Ok(None) => Err(AgentError::Closed),
            Ok(Some(f)) => E::decode(f),
        };
        match &r {
            Ok(ev) if !ev.is_last() => {}
            _ => {
                // The agent sends nothing more after an end or an error.
                self.ended = true;
                self.conn.finish(self.id);
            }
        }
        r.map(Some)
    }

    /// The first event, which must come within `timeout` (the stream's
    /// opening: `proc_started`, `watch_started`, or an error).
    async fn first(&mut self, timeout: Duration) -> Result<E, AgentError> {
        match tokio::time::timeout(timeout, self.next()).await {
            Err(_) => Err(AgentError::Timeout(timeout)),
            Ok(Ok(Some(ev))) => Ok(ev),
            Ok(Ok(None)) => Err(AgentError::Closed),
            Ok(Err(e)) => Err(e),
        }
    }
}

impl<E: StreamEvent> Drop for AgentStream<E> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.conn.finish(self.id);
        if self.conn.is_closed() {
            return;
        }
        let (conn, stream) = (self.conn.clone(), self.id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = conn.stream_cancel(stream).await {
                    tracing::debug!("cancelling agent stream {stream}: {e}");
                }
            });
        }
    }
}

fn unexpected(what: &str, other: &GuestMsg) -> AgentError {
    AgentError::Protocol(format!("expected {what}, got {other:?}"))
}

impl AgentConn {
    async fn require_v3(&self, what: &str) -> Result<(), AgentError> {
        self.require_protocol(proto::PROTOCOL_V3, what).await
    }

    /// Open a stream and wait for its first event.
    async fn open_stream<E: StreamEvent>(
        self: &Arc<Self>,
        make: impl FnOnce(u64) -> HostMsg,
    ) -> Result<(E, AgentStream<E>), AgentError> {
        let (id, rx) = self.start(make, b"").await?;
        let mut s = AgentStream {
            conn: self.clone(),
            id,
            rx,
            ended: false,
            _kind: PhantomData,
        };
        let first = s.first(OP_TIMEOUT).await?;
        Ok((first, s))
    }

    /// Start a background process; the stream follows it from its start.
    /// Returns its pid and the stream (whose `Started` was consumed).
    pub async fn proc_start(
        self: &Arc<Self>,
        spec: ProcSpec,
    ) -> Result<(u32, AgentStream<ProcEvent>), AgentError> {
        self.require_v3("run background processes").await?;
        let ProcSpec {
            cmd,
            args,
            envs,
            cwd,
            user,
            tag,
            pty,
            stdin,
        } = spec;
        let (first, s) = self
            .open_stream(|id| {
                HostMsg::ProcStart(ProcStart {
                    id,
                    cmd,
                    args,
                    envs,
                    cwd,
                    user,
                    tag,
                    pty,
                    stdin,
                })
            })
            .await?;
        match first {
            ProcEvent::Started { pid } => Ok((pid, s)),
            other => Err(AgentError::Protocol(format!(
                "expected proc_started, got {other:?}"
            ))),
        }
    }

    /// Attach to a process: the stream replays its buffered output, then
    /// follows it live until it ends.
    pub async fn proc_connect(
        self: &Arc<Self>,
        target: &ProcTarget,
    ) -> Result<(u32, AgentStream<ProcEvent>), AgentError> {
        self.require_v3("attach to background processes").await?;
        let (first, s) = self
            .open_stream(|id| HostMsg::ProcConnect(target.proc_ref(id)))
            .await?;
        match first {
            ProcEvent::Started { pid } => Ok((pid, s)),
            other => Err(AgentError::Protocol(format!(
                "expected proc_started, got {other:?}"
            ))),
        }
    }

    /// The running background processes.
    pub async fn proc_list(&self) -> Result<Vec<ProcInfo>, AgentError> {
        let what = "list background processes";
        self.require_v3(what).await?;
        match self
            .one_reply(|id| HostMsg::ProcList { id }, b"", OP_TIMEOUT, what)
            .await?
            .msg
        {
            GuestMsg::Processes { processes, .. } => Ok(processes),
            other => Err(unexpected("processes", &other)),
        }
    }

    /// Send a request answered by `ack`.
    async fn acked(
        &self,
        make: impl FnOnce(u64) -> HostMsg,
        payload: &[u8],
        what: &str,
    ) -> Result<(), AgentError> {
        self.require_v3(what).await?;
        match self.one_reply(make, payload, OP_TIMEOUT, what).await?.msg {
            GuestMsg::Ack { .. } => Ok(()),
            other => Err(unexpected("ack", &other)),
        }
    }

    /// Queue bytes for a process's stdin (or its PTY).
    pub async fn proc_input(&self, target: &ProcTarget, data: &[u8]) -> Result<(), AgentError> {
        self.acked(
            |id| HostMsg::ProcInput(target.proc_ref(id)),
            data,
            "write to background processes",
        )
        .await
    }

    /// Close a process's stdin once the queued input is written.
    pub async fn proc_close_stdin(&self, target: &ProcTarget) -> Result<(), AgentError> {
        self.acked(
            |id| HostMsg::ProcCloseStdin(target.proc_ref(id)),
            b"",
            "close the stdin of background processes",
        )
        .await
    }

    /// Send a signal to a process's group.
    pub async fn proc_signal(&self, target: &ProcTarget, signal: i32) -> Result<(), AgentError> {
        let (pid, tag) = target.parts();
        self.acked(
            |id| {
                HostMsg::ProcSignal(ProcSignal {
                    id,
                    pid,
                    tag,
                    signal,
                })
            },
            b"",
            "signal background processes",
        )
        .await
    }

    /// Resize a process's PTY.
    pub async fn proc_resize(&self, target: &ProcTarget, size: PtySize) -> Result<(), AgentError> {
        let (pid, tag) = target.parts();
        self.acked(
            |id| HostMsg::ProcResize(ProcResize { id, pid, tag, size }),
            b"",
            "resize terminals",
        )
        .await
    }

    /// End the stream opened by request `stream` (also fine when it ended).
    pub async fn stream_cancel(&self, stream: u64) -> Result<(), AgentError> {
        self.acked(
            |id| HostMsg::StreamCancel { id, stream },
            b"",
            "cancel streams",
        )
        .await
    }

    /// Send a request answered by `fs_entry`.
    async fn entry(&self, make: impl FnOnce(u64) -> HostMsg) -> Result<EntryInfo, AgentError> {
        let what = "inspect files";
        self.require_v3(what).await?;
        match self.one_reply(make, b"", OP_TIMEOUT, what).await?.msg {
            GuestMsg::FsEntry { entry, .. } => Ok(entry),
            other => Err(unexpected("fs_entry", &other)),
        }
    }

    /// `lstat` one path.
    pub async fn fs_stat(&self, path: &str) -> Result<EntryInfo, AgentError> {
        let path = path.to_string();
        self.entry(|id| HostMsg::FsStat { id, path }).await
    }

    /// Whether a path exists (a dangling symlink does).
    pub async fn fs_exists(&self, path: &str) -> Result<bool, AgentError> {
        let what = "inspect files";
        self.require_v3(what).await?;
        let path = path.to_string();
        match self
            .one_reply(|id| HostMsg::FsExists { id, path }, b"", OP_TIMEOUT, what)
            .await?
            .msg
        {
            GuestMsg::Exists { exists, .. } => Ok(exists),
            other => Err(unexpected("exists", &other)),
        }
    }

    /// The entries of a directory, `depth` levels down (0 counts as 1).
    pub async fn fs_list(&self, path: &str, depth: u32) -> Result<Vec<EntryInfo>, AgentError> {
        let what = "list directories";
        self.require_v3(what).await?;
        let path = path.to_string();
        let f = self
            .one_reply(
                |id| HostMsg::FsList { id, path, depth },
                b"",
                BULK_TIMEOUT,
                what,
            )
            .await?;
        match f.msg {
            GuestMsg::FsEntries { .. } => serde_json::from_slice(&f.payload)
                .map_err(|e| AgentError::Protocol(format!("bad fs_entries payload: {e}"))),
            other => Err(unexpected("fs_entries", &other)),
        }
    }

    /// `mkdir -p`.
    pub async fn fs_mkdir(&self, path: &str) -> Result<DirMade, AgentError> {
        let what = "make directories";
        self.require_v3(what).await?;
        let path = path.to_string();
        match self
            .one_reply(|id| HostMsg::FsMkdir { id, path }, b"", OP_TIMEOUT, what)
            .await?
            .msg
        {
            GuestMsg::DirMade { entry, existed, .. } => Ok(DirMade { entry, existed }),
            other => Err(unexpected("dir_made", &other)),
        }
    }

    /// rename(2); returns the entry at its new path.
    pub async fn fs_move(&self, source: &str, destination: &str) -> Result<EntryInfo, AgentError> {
        let (source, destination) = (source.to_string(), destination.to_string());
        self.entry(|id| HostMsg::FsMove {
            id,
            source,
            destination,
        })
        .await
    }

    /// `rm -r` (never following a symlink).
    pub async fn fs_remove(&self, path: &str) -> Result<(), AgentError> {
        let path = path.to_string();
        self.acked(|id| HostMsg::FsRemove { id, path }, b"", "remove files")
            .await
    }

    /// Watch a directory; the stream's `Started` was consumed.
    pub async fn fs_watch(
        self: &Arc<Self>,
        path: &str,
        recursive: bool,
    ) -> Result<AgentStream<WatchEvent>, AgentError> {
        self.require_v3("watch directories").await?;
        let path = path.to_string();
        let (first, s) = self
            .open_stream(|id| HostMsg::FsWatch {
                id,
                path,
                recursive,
            })
            .await?;
        match first {
            WatchEvent::Started => Ok(s),
            other => Err(AgentError::Protocol(format!(
                "expected watch_started, got {other:?}"
            ))),
        }
    }

    /// Create a polled watcher; returns its id.
    pub async fn watcher_create(&self, path: &str, recursive: bool) -> Result<String, AgentError> {
        let what = "watch directories";
        self.require_v3(what).await?;
        let path = path.to_string();
        match self
            .one_reply(
                |id| HostMsg::WatcherCreate {
                    id,
                    path,
                    recursive,
                },
                b"",
                OP_TIMEOUT,
                what,
            )
            .await?
            .msg
        {
            GuestMsg::Watcher { watcher_id, .. } => Ok(watcher_id),
            other => Err(unexpected("watcher", &other)),
        }
    }

    /// The events of a polled watcher since its last poll, and how many
    /// were dropped.
    pub async fn watcher_poll(&self, watcher: &str) -> Result<(Vec<FsEvent>, u64), AgentError> {
        let what = "watch directories";
        self.require_v3(what).await?;
        let watcher_id = watcher.to_string();
        match self
            .one_reply(
                |id| HostMsg::WatcherPoll { id, watcher_id },
                b"",
                OP_TIMEOUT,
                what,
            )
            .await?
            .msg
        {
            GuestMsg::FsEvents {
                events, dropped, ..
            } => Ok((events, dropped)),
            other => Err(unexpected("fs_events", &other)),
        }
    }

    /// Remove a polled watcher.
    pub async fn watcher_remove(&self, watcher: &str) -> Result<(), AgentError> {
        let watcher_id = watcher.to_string();
        self.acked(
            |id| HostMsg::WatcherRemove { id, watcher_id },
            b"",
            "watch directories",
        )
        .await
    }

    /// A tar of `paths` (directories recursively), at most `max_bytes`.
    pub async fn get_archive(
        &self,
        paths: Vec<String>,
        max_bytes: Option<u64>,
    ) -> Result<Archive, AgentError> {
        let what = "download archives";
        self.require_v3(what).await?;
        let f = self
            .one_reply(
                |id| HostMsg::GetArchive {
                    id,
                    paths,
                    max_bytes,
                },
                b"",
                BULK_TIMEOUT,
                what,
            )
            .await?;
        match f.msg {
            GuestMsg::ArchiveData { entries, bytes, .. } => Ok(Archive {
                tar: f.payload,
                entries,
                bytes,
            }),
            other => Err(unexpected("archive_data", &other)),
        }
    }
}
