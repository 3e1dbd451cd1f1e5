//! The client's filesystem operations: stat, exists, list, mkdir, move,
//! remove, watches (streamed and polled) and archives.

use bytes::Bytes;
use hyper::Method;

use crate::client::{enc, read_ndjson, Client, ClientError};
use crate::fs::*;

impl Client {
    fn fs_path(id: &str, op: &str, path: &str) -> String {
        format!("/v1/sandboxes/{}/fs/{op}?path={}", enc(id), enc(path))
    }

    async fn decoded<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
    ) -> Result<T, ClientError> {
        let b = self.call(method, uri, None).await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Describe a guest path (`lstat`).
    pub async fn stat_file(&self, id: &str, path: &str) -> Result<EntryInfo, ClientError> {
        self.decoded(Method::GET, &Self::fs_path(id, "stat", path))
            .await
    }

    /// Whether a guest path exists.
    pub async fn file_exists(&self, id: &str, path: &str) -> Result<bool, ClientError> {
        let e: Exists = self
            .decoded(Method::GET, &Self::fs_path(id, "exists", path))
            .await?;
        Ok(e.exists)
    }

    /// List a directory `depth` levels down (1: its own entries).
    pub async fn list_dir(
        &self,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<EntryList, ClientError> {
        let uri = format!("{}&depth={depth}", Self::fs_path(id, "list", path));
        self.decoded(Method::GET, &uri).await
    }

    /// `mkdir -p`.
    pub async fn make_dir(&self, id: &str, path: &str) -> Result<DirMade, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/fs/mkdir", enc(id)),
            Some(&MakeDir {
                path: path.to_string(),
            }),
        )
        .await
    }

    /// Move (rename) a guest file or directory.
    pub async fn move_file(
        &self,
        id: &str,
        source: &str,
        destination: &str,
    ) -> Result<EntryInfo, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/fs/move", enc(id)),
            Some(&MoveFile {
                source: source.to_string(),
                destination: destination.to_string(),
            }),
        )
        .await
    }

    /// Remove a guest file, or a directory with all it holds.
    pub async fn remove_file(&self, id: &str, path: &str) -> Result<(), ClientError> {
        self.call(
            Method::DELETE,
            &format!("/v1/sandboxes/{}/files?path={}", enc(id), enc(path)),
            None,
        )
        .await
        .map(drop)
    }

    /// Watch a directory: `on_event` sees every line (`start` first) and
    /// returns false to stop watching. An `error` line is
    /// [`ClientError::Api`].
    pub async fn watch_dir(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        mut on_event: impl FnMut(&WatchEvent) -> bool,
    ) -> Result<(), ClientError> {
        let uri = format!("{}&recursive={recursive}", Self::fs_path(id, "watch", path));
        let resp = self.open_timed(Method::GET, &uri, None).await?;
        read_ndjson(resp, "watch", |ev: WatchEvent| {
            if let WatchEvent::Error { error } = &ev {
                return Some(Err(ClientError::from_detail(error.clone())));
            }
            (!on_event(&ev)).then_some(Ok(()))
        })
        .await
    }

    /// Create a polled watcher.
    pub async fn create_watcher(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<Watcher, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/fs/watchers", enc(id)),
            Some(&CreateWatcher {
                path: path.to_string(),
                recursive,
            }),
        )
        .await
    }

    /// The changes a watcher saw since its last poll.
    pub async fn poll_watcher(
        &self,
        id: &str,
        watcher: &str,
    ) -> Result<WatcherEvents, ClientError> {
        let uri = format!("/v1/sandboxes/{}/fs/watchers/{}", enc(id), enc(watcher));
        self.decoded(Method::GET, &uri).await
    }

    /// Remove a watcher.
    pub async fn remove_watcher(&self, id: &str, watcher: &str) -> Result<(), ClientError> {
        let uri = format!("/v1/sandboxes/{}/fs/watchers/{}", enc(id), enc(watcher));
        self.call(Method::DELETE, &uri, None).await.map(drop)
    }

    /// A tar of several guest paths.
    pub async fn download_archive(&self, id: &str, paths: &[&str]) -> Result<Bytes, ClientError> {
        let q: Vec<String> = paths.iter().map(|p| format!("path={}", enc(p))).collect();
        self.call(
            Method::GET,
            &format!("/v1/sandboxes/{}/archive?{}", enc(id), q.join("&")),
            None,
        )
        .await
    }

    /// Unpack a tar under the guest directory `dest`.
    pub async fn upload_archive(
        &self,
        id: &str,
        dest: &str,
        tar: Bytes,
    ) -> Result<ArchiveWritten, ClientError> {
        let b = self
            .call(
                Method::PUT,
                &format!("/v1/sandboxes/{}/archive?path={}", enc(id), enc(dest)),
                Some((tar, "application/x-tar")),
            )
            .await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }
}
