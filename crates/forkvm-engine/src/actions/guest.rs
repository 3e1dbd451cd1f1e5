//! Actions inside a running sandbox's guest: commands, files, directory
//! watches and long-running processes, all through its agent.

use forkvm_api::{
    ArchiveWritten, DirMade, EntryInfo, EntryList, ExecEvent, ExecRequest, ExecResult, FileWritten,
    ProcessList, ProcessRef, PtySize, StartProcess, WatcherEvents,
};
use tokio::sync::mpsc;

use super::{AgentStream, Engine, ExecDefaults, ProcessStream, WatchEvent};
use crate::error::EngineError;

impl Engine {
    /// Run a command in a sandbox to its end and return its exit code and
    /// output.
    pub async fn exec(&self, id: &str, req: ExecRequest) -> Result<ExecResult, EngineError> {
        self.m.exec(id, req).await
    }

    /// Run a command in a sandbox, streaming its output and exit as events.
    pub async fn exec_events(
        &self,
        id: &str,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>, EngineError> {
        self.m.exec_events(id, req).await
    }

    /// The command, environment, user and directory a sandbox's image gives
    /// commands that name none.
    pub fn exec_defaults(&self, id: &str) -> Result<ExecDefaults, EngineError> {
        self.m.exec_defaults_of(id)
    }

    /// Read a whole file from a sandbox's guest, up to the daemon's file
    /// limit.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, EngineError> {
        self.m.read_file(id, path).await
    }

    /// Write a whole file into a sandbox's guest, atomically; `mode`
    /// defaults to 0644.
    pub async fn write_file(
        &self,
        id: &str,
        path: String,
        mode: Option<u32>,
        data: &[u8],
    ) -> Result<FileWritten, EngineError> {
        self.m.write_file(id, path, mode, data).await
    }

    /// Write a whole file into a sandbox's guest owned by `user` (root when
    /// none), mode 0644, replacing what was there.
    pub async fn write_file_as(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        user: Option<&str>,
    ) -> Result<(), EngineError> {
        self.m.write_file_as(id, path, data, user).await
    }

    /// Make a directory and its parents in a sandbox's guest.
    pub async fn make_dir(&self, id: &str, path: &str) -> Result<DirMade, EngineError> {
        self.m.make_dir(id, path).await
    }

    /// Make a directory and its parents in a sandbox's guest as `user`
    /// (root when none).
    pub async fn make_dir_as(
        &self,
        id: &str,
        path: &str,
        user: Option<&str>,
    ) -> Result<DirMade, EngineError> {
        self.m.make_dir_as(id, path, user).await
    }

    /// Describe one path in a sandbox's guest (kind, size, mode, owner).
    pub async fn stat_file(&self, id: &str, path: &str) -> Result<EntryInfo, EngineError> {
        self.m.stat_file(id, path).await
    }

    /// Whether a path exists in a sandbox's guest.
    pub async fn file_exists(&self, id: &str, path: &str) -> Result<bool, EngineError> {
        self.m.file_exists(id, path).await
    }

    /// List a directory of a sandbox's guest, `depth` levels down.
    pub async fn list_dir(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<EntryList, EngineError> {
        self.m.list_dir(id, path, depth).await
    }

    /// Move or rename a path in a sandbox's guest.
    pub async fn move_file(
        &self,
        id: &str,
        source: &str,
        destination: &str,
    ) -> Result<EntryInfo, EngineError> {
        self.m.move_file(id, source, destination).await
    }

    /// Remove a file or directory tree from a sandbox's guest.
    pub async fn remove_file(&self, id: &str, path: &str) -> Result<(), EngineError> {
        self.m.remove_file(id, path).await
    }

    /// Pack paths of a sandbox's guest into a tar archive.
    pub async fn download_archive(
        &self,
        id: &str,
        paths: Vec<String>,
    ) -> Result<Vec<u8>, EngineError> {
        self.m.download_archive(id, paths).await
    }

    /// Unpack a tar archive into a directory of a sandbox's guest.
    pub async fn upload_archive(
        &self,
        id: &str,
        dest: &str,
        tar: &[u8],
    ) -> Result<ArchiveWritten, EngineError> {
        self.m.upload_archive(id, dest, tar).await
    }

    /// Watch a directory of a sandbox's guest, as a stream of changes.
    pub async fn watch_dir(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<AgentStream<WatchEvent>, EngineError> {
        self.m.watch_dir(id, path, recursive).await
    }

    /// Start a watcher on a directory of a sandbox's guest whose changes
    /// are collected until polled; returns its id.
    pub async fn create_watcher(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<String, EngineError> {
        self.m.create_watcher(id, path, recursive).await
    }

    /// The changes a watcher collected since it was last polled.
    pub async fn poll_watcher(
        &self,
        id: &str,
        watcher: &str,
    ) -> Result<WatcherEvents, EngineError> {
        self.m.poll_watcher(id, watcher).await
    }

    /// Stop a watcher and forget its changes.
    pub async fn remove_watcher(&self, id: &str, watcher: &str) -> Result<(), EngineError> {
        self.m.remove_watcher(id, watcher).await
    }

    /// Start a long-running process (optionally on a terminal) in a
    /// sandbox, with the stream of its output.
    pub async fn start_process(
        &self,
        id: &str,
        req: StartProcess,
    ) -> Result<ProcessStream, EngineError> {
        self.m.start_process(id, req).await
    }

    /// Attach to a running process's output again.
    pub async fn attach_process(
        &self,
        id: &str,
        r: &ProcessRef,
    ) -> Result<ProcessStream, EngineError> {
        self.m.attach_process(id, r).await
    }

    /// The processes started in a sandbox that still run.
    pub async fn list_processes(&self, id: &str) -> Result<ProcessList, EngineError> {
        self.m.list_processes(id).await
    }

    /// Send bytes to a process's standard input.
    pub async fn write_stdin(
        &self,
        id: &str,
        r: &ProcessRef,
        data: &[u8],
    ) -> Result<(), EngineError> {
        self.m.write_stdin(id, r, data).await
    }

    /// Close a process's standard input.
    pub async fn close_stdin(&self, id: &str, r: &ProcessRef) -> Result<(), EngineError> {
        self.m.close_stdin(id, r).await
    }

    /// Send a signal to a process.
    pub async fn signal_process(
        &self,
        id: &str,
        r: &ProcessRef,
        signal: i32,
    ) -> Result<(), EngineError> {
        self.m.signal_process(id, r, signal).await
    }

    /// Kill a process.
    pub async fn kill_process(&self, id: &str, r: &ProcessRef) -> Result<(), EngineError> {
        self.m.kill_process(id, r).await
    }

    /// Resize a process's terminal.
    pub async fn resize_pty(
        &self,
        id: &str,
        r: &ProcessRef,
        size: PtySize,
    ) -> Result<(), EngineError> {
        self.m.resize_pty(id, r, size).await
    }
}
