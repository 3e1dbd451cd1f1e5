//! Filesystem operations in a sandbox: the typed actions behind
//! `/v1/sandboxes/{id}/fs/...`, `DELETE .../files` and `.../archive` (and,
//! later, the E2B-compatible filesystem service and MCP).
//!
//! Each is one request to the guest agent (protocol 3, see
//! `forkvm_agent_protocol::caps`); this module checks the input, maps the
//! agent's types to the API's and its errors to statuses.

use forkvm_api::{
    ArchiveWritten, DirMade, EntryInfo, EntryList, FileKind, FsEvent, FsOp, WatcherEvents,
};

/// What a directory watch carries, for the front-ends that render it.
pub use crate::agent::{AgentStream, WatchEvent};
use crate::error::{agent_error, logged, EngineError, ErrorKind};
use crate::manager::Manager;

pub mod archive;

/// Deepest `list_dir`.
pub const MAX_DEPTH: u32 = 64;
/// Most paths one archive download names.
pub const MAX_ARCHIVE_PATHS: usize = 1000;

/// A guest path must be absolute and free of NUL.
pub fn check_guest_path(p: &str) -> Result<(), EngineError> {
    if !p.starts_with('/') {
        return Err(EngineError::invalid(format!(
            "path must be absolute (got {p:?})"
        )));
    }
    if p.contains('\0') {
        return Err(EngineError::invalid("path must not contain NUL"));
    }
    Ok(())
}

fn entry(e: forkvm_agent_protocol::EntryInfo) -> EntryInfo {
    use forkvm_agent_protocol::FileKind as K;
    EntryInfo {
        name: e.name,
        kind: match e.kind {
            K::File => FileKind::File,
            K::Dir => FileKind::Dir,
            K::Symlink => FileKind::Symlink,
            K::Other => FileKind::Other,
        },
        path: e.path,
        size: e.size,
        mode: e.mode,
        permissions: e.permissions,
        owner: e.owner,
        group: e.group,
        modified_ns: e.modified_ns,
        symlink_target: e.symlink_target,
    }
}

/// The API's form of watch events.
pub fn fs_events(events: Vec<forkvm_agent_protocol::FsEvent>) -> Vec<FsEvent> {
    use forkvm_agent_protocol::FsOp as O;
    events
        .into_iter()
        .map(|e| FsEvent {
            name: e.name,
            op: match e.op {
                O::Create => FsOp::Create,
                O::Write => FsOp::Write,
                O::Remove => FsOp::Remove,
                O::Rename => FsOp::Rename,
                O::Chmod => FsOp::Chmod,
            },
        })
        .collect()
}

impl Manager {
    /// Describe one path (`lstat`).
    pub async fn stat_file(&self, id: &str, path: &str) -> Result<EntryInfo, EngineError> {
        check_guest_path(path)?;
        let agent = self.guest_agent(id).await?;
        agent
            .fs_stat(path)
            .await
            .map(entry)
            .map_err(|e| logged(id, "stat", agent_error(id, e)))
    }

    /// Whether a path exists.
    pub async fn file_exists(&self, id: &str, path: &str) -> Result<bool, EngineError> {
        check_guest_path(path)?;
        let agent = self.guest_agent(id).await?;
        agent
            .fs_exists(path)
            .await
            .map_err(|e| logged(id, "exists", agent_error(id, e)))
    }

    /// The entries of a directory, `depth` levels down (1: its own).
    pub async fn list_dir(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<EntryList, EngineError> {
        check_guest_path(path)?;
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(EngineError::invalid(format!(
                "depth must be between 1 and {MAX_DEPTH} (got {depth})"
            )));
        }
        let agent = self.guest_agent(id).await?;
        let entries = agent
            .fs_list(path, depth)
            .await
            .map_err(|e| logged(id, "listing a directory", agent_error(id, e)))?;
        Ok(EntryList {
            entries: entries.into_iter().map(entry).collect(),
        })
    }

    /// `mkdir -p`.
    pub async fn make_dir(&self, id: &str, path: &str) -> Result<DirMade, EngineError> {
        check_guest_path(path)?;
        let agent = self.guest_agent(id).await?;
        let made = agent
            .fs_mkdir(path)
            .await
            .map_err(|e| logged(id, "making a directory", agent_error(id, e)))?;
        Ok(DirMade {
            entry: entry(made.entry),
            existed: made.existed,
        })
    }

    /// Rename a file or directory; returns it at its new path.
    pub async fn move_file(
        &self,
        id: &str,
        source: &str,
        destination: &str,
    ) -> Result<EntryInfo, EngineError> {
        check_guest_path(source)?;
        check_guest_path(destination)?;
        let agent = self.guest_agent(id).await?;
        agent
            .fs_move(source, destination)
            .await
            .map(entry)
            .map_err(|e| logged(id, "moving a file", agent_error(id, e)))
    }

    /// Remove a file, or a directory with everything in it.
    pub async fn remove_file(&self, id: &str, path: &str) -> Result<(), EngineError> {
        check_guest_path(path)?;
        if path.trim_matches('/').is_empty() {
            return Err(EngineError::invalid(
                "refusing to remove the guest's root directory",
            ));
        }
        let agent = self.guest_agent(id).await?;
        agent
            .fs_remove(path)
            .await
            .map_err(|e| logged(id, "removing a file", agent_error(id, e)))
    }

    /// Watch a directory (and with `recursive` its subdirectories); the
    /// stream's `Started` was taken. Dropping the stream ends the watch.
    pub async fn watch_dir(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<AgentStream<WatchEvent>, EngineError> {
        check_guest_path(path)?;
        let agent = self.guest_agent(id).await?;
        agent
            .fs_watch(path, recursive)
            .await
            .map_err(|e| logged(id, "watching a directory", agent_error(id, e)))
    }

    /// Create a watcher to poll; returns its id.
    pub async fn create_watcher(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<String, EngineError> {
        check_guest_path(path)?;
        let agent = self.guest_agent(id).await?;
        agent
            .watcher_create(path, recursive)
            .await
            .map_err(|e| logged(id, "creating a watcher", agent_error(id, e)))
    }

    /// The changes a watcher saw since its last poll.
    pub async fn poll_watcher(
        &self,
        id: &str,
        watcher: &str,
    ) -> Result<WatcherEvents, EngineError> {
        let agent = self.guest_agent(id).await?;
        let (events, dropped) = agent
            .watcher_poll(watcher)
            .await
            .map_err(|e| logged(id, "polling a watcher", agent_error(id, e)))?;
        Ok(WatcherEvents {
            events: fs_events(events),
            dropped,
        })
    }

    /// Remove a watcher.
    pub async fn remove_watcher(&self, id: &str, watcher: &str) -> Result<(), EngineError> {
        let agent = self.guest_agent(id).await?;
        agent
            .watcher_remove(watcher)
            .await
            .map_err(|e| logged(id, "removing a watcher", agent_error(id, e)))
    }

    /// A tar of several guest paths (directories with all they hold), each
    /// named by its absolute path without the leading `/`; at most
    /// `max_file_bytes`. The guest's tar is rewritten by
    /// [`archive::normalise`] (the agent is in the guest: its member names
    /// are not trusted), and what it leaves out is logged.
    pub async fn download_archive(
        &self,
        id: &str,
        paths: Vec<String>,
    ) -> Result<Vec<u8>, EngineError> {
        if paths.is_empty() {
            return Err(EngineError::invalid(
                "name at least one path to download: ?path=/a&path=/b",
            ));
        }
        if paths.len() > MAX_ARCHIVE_PATHS {
            return Err(EngineError::invalid(format!(
                "at most {MAX_ARCHIVE_PATHS} paths at once (got {})",
                paths.len()
            )));
        }
        for p in &paths {
            check_guest_path(p)?;
            // Members are named by the path asked for: `/tmp/../etc` would
            // name them `tmp/../etc/...`.
            if p.split('/').any(|c| c == "..") {
                return Err(EngineError::invalid(format!(
                    "path {p:?} has a `..` component: name the directory itself, e.g. /etc"
                )));
            }
        }
        let agent = self.guest_agent(id).await?;
        let a = agent
            .get_archive(paths, Some(self.cfg.limits.max_file_bytes))
            .await
            .map_err(|e| logged(id, "downloading an archive", agent_error(id, e)))?;
        let n = archive::normalise(&a.tar).map_err(|e| {
            logged(
                id,
                "downloading an archive",
                EngineError::new(
                    ErrorKind::Guest,
                    format!("the guest sent an archive that cannot be read: {e}"),
                ),
            )
        })?;
        if !n.dropped.is_empty() {
            tracing::warn!(
                sandbox = id,
                dropped = n.dropped.len(),
                first = ?n.dropped.first(),
                "archive download: left out members the guest named unsafely"
            );
        }
        Ok(n.tar)
    }

    /// Unpack a tar under the guest directory `dest` (created if missing;
    /// entries cannot leave it).
    pub async fn upload_archive(
        &self,
        id: &str,
        dest: &str,
        tar: &[u8],
    ) -> Result<ArchiveWritten, EngineError> {
        check_guest_path(dest)?;
        if tar.len() as u64 > self.cfg.limits.max_request_bytes {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!(
                    "the archive is {} bytes, over the limit of {}",
                    tar.len(),
                    self.cfg.limits.max_request_bytes
                ),
            ));
        }
        let agent = self.guest_agent(id).await?;
        let sum = agent
            .put_archive(dest, None, tar, std::time::Duration::from_secs(300))
            .await
            .map_err(|e| logged(id, "uploading an archive", agent_error(id, e)))?;
        Ok(ArchiveWritten {
            entries: sum.entries,
            bytes: sum.bytes,
        })
    }
}
