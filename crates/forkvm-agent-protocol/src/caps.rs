//! Protocol 3: background processes, PTYs, filesystem operations and
//! directory watches. These back the E2B-compatible `process` and
//! `filesystem` services and the MCP server, so each operation maps onto
//! one envd RPC; the structs here are the bodies of the matching
//! [`HostMsg`](crate::HostMsg) and [`GuestMsg`](crate::GuestMsg) variants.
//!
//! # Processes
//!
//! A process started with `proc_start` is owned by the agent, not by the
//! request or the connection: it keeps running when the host goes away, and
//! since the agent's process table and output buffers are ordinary guest
//! memory, a VM branched from a snapshot has the same processes, each with
//! the output it had buffered. A child's host lists them with `proc_list`
//! and attaches with `proc_connect`, exactly as the parent's could.
//!
//! A process is named by its pid or by the `tag` given at start (unique
//! among running processes). Its stdout and stderr (or, with a PTY, the
//! terminal's output) go into a ring of the last [`OUTPUT_RING`] bytes.
//! Every stream of a process reads that ring from its beginning:
//!
//! ```text
//!  host                                  agent
//!  proc_start{id:5} ------------------>  spawn, ring, reader threads
//!                   <------------------  proc_started{id:5,pid}
//!                   <------------------  proc_data{id:5,stream,lost} + bytes  (*)
//!                   <------------------  keepalive{id:5}      (idle, every 30 s)
//!  proc_connect{id:9,pid} ------------>  replay the ring, then follow it
//!                   <------------------  proc_started{id:9,pid}
//!                   <------------------  proc_data{id:9,...}  (*)
//!  proc_input{id:6,pid} + bytes ------>  queued for stdin / the PTY
//!                   <------------------  ack{id:6}
//!                   <------------------  proc_end{id:5,...}, proc_end{id:9,...}
//! ```
//!
//! * A stream (the one of `proc_start`, or a `proc_connect`) is `proc_started`,
//!   any number of `proc_data` and `keepalive`, then exactly one `proc_end`;
//!   or one `error` instead of all of it.
//! * `proc_data.lost` counts bytes the ring dropped before this stream read
//!   them (output faster than the host reads it, or older than the ring): a
//!   gap right before this chunk. A busy process never waits for the host.
//! * A stream ends early, with no `proc_end`, when the host sends
//!   `stream_cancel` naming its id, or when the connection it was opened on
//!   is gone: the agent counts connections (an end-of-file on the channel, a
//!   reconnect, or an `identity` request, which a restored clone always gets
//!   first, starts a new one). At most one frame already being written may
//!   still arrive; hosts drop frames with ids they do not know, and should
//!   not reuse ids across connections.
//! * `proc_input`, `proc_close_stdin`, `proc_signal` and `proc_resize` are
//!   applied on the agent's reader thread, in the order they arrive, and
//!   answered with `ack` once queued; stdin is written by a per-process
//!   thread, so a process that does not read cannot stall the agent. At
//!   most [`INPUT_QUEUE`] bytes may wait; more is `too_large`.
//! * `proc_signal` signals the process group (every process is started in
//!   its own session), so a shell's children get it too.
//! * The last [`EXITED_KEPT`] processes that ended stay known, so a
//!   `proc_connect` that comes late still gets their output and `proc_end`;
//!   `proc_list` shows running processes only.
//!
//! # Filesystem
//!
//! Paths are absolute. An entry is described by [`EntryInfo`], from
//! `lstat`: a symlink is reported as a symlink, with its target. `fs_list`
//! returns its entries as a JSON array of [`EntryInfo`] in the frame
//! payload (a listing can exceed [`MAX_HEADER`](crate::MAX_HEADER)), at most
//! [`MAX_LIST_ENTRIES`]; it descends `depth` levels (0 counts as 1) without
//! following symlinks. `fs_mkdir` creates missing parents and says whether
//! the directory already existed. `fs_remove` removes directories
//! recursively and never follows a symlink.
//!
//! A watch (`fs_watch`, streamed, or a watcher polled with `watcher_poll`)
//! reports [`FsEvent`]s named relative to the watched directory, in batches
//! (`fs_events`). A streamed watch is `watch_started`, then `fs_events` and
//! `keepalive` until it is cancelled (`stream_cancel`), its connection ends,
//! or the watched directory goes away (then one `error` with `not_found`).
//! A polled watcher keeps at most [`WATCH_QUEUE`] events between polls and
//! counts those it dropped; at most [`MAX_WATCHERS`] exist at once.
//!
//! # Several files at once
//!
//! Uploads are `put_archive` (a tar, see [`crate::tar`]). `get_archive`
//! is its inverse: a tar of the named paths, directories recursively,
//! symlinks as symlinks (devices, sockets and FIFOs are left out), each
//! named by its absolute path without the leading `/`, so that
//! `put_archive` to `/` puts everything back where it was. Mode, owner
//! ids and mtime are kept.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Bytes of output kept per process for replay.
pub const OUTPUT_RING: usize = 1 << 20;
/// Bytes of input that may wait to be written to one process.
pub const INPUT_QUEUE: usize = 4 << 20;
/// Ended processes kept for a late `proc_connect`.
pub const EXITED_KEPT: usize = 8;
/// Entries one `fs_list` may return.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Events a polled watcher keeps between two polls.
pub const WATCH_QUEUE: usize = 4096;
/// Polled watchers that may exist at once.
pub const MAX_WATCHERS: usize = 64;
/// Seconds of silence after which a stream sends `keepalive`.
pub const KEEPALIVE_SECS: u64 = 30;

/// Which output of a process a `proc_data` chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcStream {
    Stdout,
    Stderr,
    /// The terminal of a process started with a PTY.
    Pty,
}

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// `proc_start`: start a background process and stream its events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcStart {
    pub id: u64,
    /// The program (searched in PATH, as for `exec`).
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Added to the agent's environment, as for `exec`.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Working directory; `/` when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Run as this user (the forms of `exec.user`); root when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// A name to find the process by, unique among running processes.
    #[serde(default)]
    pub tag: Option<String>,
    /// Run it on a new PTY of this size (stdin, stdout and stderr are the
    /// terminal; output arrives as `stream: pty`). TERM defaults to
    /// `xterm-256color`.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Give it a stdin pipe for `proc_input`; otherwise stdin is /dev/null.
    /// Ignored with a PTY (the terminal is always writable).
    #[serde(default)]
    pub stdin: bool,
}

/// Names one process: exactly one of `pid` and `tag`. The body of
/// `proc_connect`, `proc_input` (the payload is the bytes to write) and
/// `proc_close_stdin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcRef {
    pub id: u64,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
}

/// `proc_signal`: send `signal` (a number, e.g. 15 for SIGTERM, 9 for
/// SIGKILL) to the process's group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcSignal {
    pub id: u64,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
    pub signal: i32,
}

/// `proc_resize`: set the size of the process's PTY.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcResize {
    pub id: u64,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
    pub size: PtySize,
}

/// How a process ended (`proc_end`), in envd's terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcEnd {
    pub id: u64,
    pub pid: u32,
    /// The exit code, or -1 when it was killed by a signal.
    pub exit_code: i32,
    /// Whether it exited by itself (false: killed by a signal).
    pub exited: bool,
    /// The signal that killed it.
    #[serde(default)]
    pub signal: Option<i32>,
    /// "exit status 3", "signal: terminated", ... (Go's wording).
    pub status: String,
    /// Why the agent lost track of it, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

/// One process, as `proc_list` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub pid: u32,
    #[serde(default)]
    pub tag: Option<String>,
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Its PTY's size, if it has one.
    #[serde(default)]
    pub pty: Option<PtySize>,
}

/// The type of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A device, socket or FIFO.
    Other,
}

/// A filesystem entry (from `lstat`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryInfo {
    /// The last path component.
    pub name: String,
    pub kind: FileKind,
    /// The absolute path.
    pub path: String,
    pub size: u64,
    /// Permission bits, with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    /// Go's `FileMode.String()`: `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`...
    pub permissions: String,
    /// User and group names from /etc/passwd and /etc/group, else the ids.
    pub owner: String,
    pub group: String,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i64,
    #[serde(default)]
    pub symlink_target: Option<String>,
}

/// What happened to a watched entry (envd's event types; a move within
/// the watch is `rename` for the old name and `create` for the new).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One watch event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// The path relative to the watched directory.
    pub name: String,
    pub op: FsOp,
}

#[cfg(test)]
mod tests;
