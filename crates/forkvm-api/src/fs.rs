//! Bodies of the filesystem operations (`/v1/sandboxes/{id}/fs/...`,
//! `DELETE /v1/sandboxes/{id}/files` and `/v1/sandboxes/{id}/archive`).
//!
//! Paths are absolute guest paths. Entries are described as `lstat` sees
//! them: a symlink is reported as a symlink, with its target.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ErrorDetail;

/// The type of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A device, socket or FIFO.
    Other,
}

/// A filesystem entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EntryInfo {
    /// The last path component.
    pub name: String,
    pub kind: FileKind,
    /// The absolute path.
    pub path: String,
    pub size: u64,
    /// Permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    /// As `ls -l` shows them: `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`...
    pub permissions: String,
    /// User and group names (else the numeric ids).
    pub owner: String,
    pub group: String,
    /// Modification time, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// `GET /v1/sandboxes/{id}/fs/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EntryList {
    pub entries: Vec<EntryInfo>,
}

/// `GET /v1/sandboxes/{id}/fs/exists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Exists {
    /// A dangling symlink exists.
    pub exists: bool,
}

/// `POST /v1/sandboxes/{id}/fs/mkdir`: make a directory and its missing
/// parents (`mkdir -p`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    pub path: String,
}

/// The answer to `POST /v1/sandboxes/{id}/fs/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DirMade {
    pub entry: EntryInfo,
    /// It was a directory already.
    pub existed: bool,
}

/// `POST /v1/sandboxes/{id}/fs/move`: rename(2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveFile {
    pub source: String,
    pub destination: String,
}

/// What happened to a watched entry (a move within the watched tree is
/// `rename` for the old name and `create` for the new).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One change in a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FsEvent {
    /// The path relative to the watched directory.
    pub name: String,
    pub op: FsOp,
}

/// One line of a watch stream (`GET /v1/sandboxes/{id}/fs/watch`),
/// newline-delimited JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchEvent {
    /// The first line: the watch is in place; changes from now on are
    /// reported.
    Start,
    /// Changes; `dropped` were lost before them (the guest's queue
    /// overflowed).
    Events {
        events: Vec<FsEvent>,
        #[serde(default)]
        dropped: u64,
    },
    /// Nothing changed for a while; the stream is alive.
    Keepalive,
    /// The watch ended (the directory went away, the guest stopped...); the
    /// last line.
    Error { error: ErrorDetail },
}

/// `POST /v1/sandboxes/{id}/fs/watchers`: a watcher to poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWatcher {
    pub path: String,
    /// Watch the subdirectories too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recursive: bool,
}

/// A polled watcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Watcher {
    pub watcher_id: String,
}

/// `GET /v1/sandboxes/{id}/fs/watchers/{watcher}`: the changes since the
/// last poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WatcherEvents {
    pub events: Vec<FsEvent>,
    /// Changes lost since the last poll (at most 4096 are kept).
    pub dropped: u64,
}

/// `PUT /v1/sandboxes/{id}/archive`: what the tar held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArchiveWritten {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Bytes of file data written.
    pub bytes: u64,
}
