//! The client's image operations: plain JSON calls for list/inspect/remove,
//! and NDJSON progress streams for pull, import and build, whose archives
//! are streamed from disk (never read into memory whole).

use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use tokio_stream::StreamExt;

use crate::client::{enc, read_ndjson, Client, ClientError};
use crate::images::*;

impl Client {
    pub async fn list_images(&self) -> Result<ImageList, ClientError> {
        let b = self.call(Method::GET, "/v1/images", None).await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn get_image(&self, name: &str) -> Result<Image, ClientError> {
        let b = self
            .call(Method::GET, &format!("/v1/images/{}", enc(name)), None)
            .await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn delete_image(&self, name: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/v1/images/{}", enc(name)), None)
            .await
            .map(|_| ())
    }

    /// Pull with progress: `on_event` sees every event; the image is returned.
    pub async fn pull_image(
        &self,
        req: &PullImage,
        on_event: impl FnMut(&ImageEvent),
    ) -> Result<Image, ClientError> {
        let mut req = req.clone();
        req.stream = true;
        let body =
            Bytes::from(serde_json::to_vec(&req).map_err(|e| ClientError::Decode(e.to_string()))?);
        let resp = self
            .open(Method::POST, "/v1/images", Some((body, "application/json")))
            .await?;
        read_events(resp, on_event).await
    }

    /// Import an archive file (a `docker save` tar, an OCI layout tar, or a
    /// rootfs tarball), streamed from disk.
    pub async fn import_image(
        &self,
        file: &Path,
        q: &ImportQuery,
        on_event: impl FnMut(&ImageEvent),
    ) -> Result<Image, ClientError> {
        let mut path = format!("/v1/images/import?name={}", enc(&q.name));
        if let Some(f) = &q.file {
            path.push_str(&format!("&file={}", enc(f)));
        }
        if let Some(s) = q.disk_size {
            path.push_str(&format!("&disk_size={s}"));
        }
        if q.replace == Some(true) {
            path.push_str("&replace=true");
        }
        self.upload(&path, file, on_event).await
    }

    /// Build from a context tar file, streamed from disk.
    pub async fn build_image(
        &self,
        context_tar: &Path,
        q: &BuildQuery,
        on_event: impl FnMut(&ImageEvent),
    ) -> Result<Image, ClientError> {
        let mut path = format!("/v1/images/build?tag={}", enc(&q.tag));
        if let Some(d) = &q.dockerfile {
            path.push_str(&format!("&dockerfile={}", enc(d)));
        }
        if let Some(a) = &q.build_args {
            path.push_str(&format!("&build_args={}", enc(a)));
        }
        if q.no_cache == Some(true) {
            path.push_str("&no_cache=true");
        }
        if let Some(t) = &q.target {
            path.push_str(&format!("&target={}", enc(t)));
        }
        if let Some(s) = q.disk_size {
            path.push_str(&format!("&disk_size={s}"));
        }
        if let Some(m) = q.memory_mib {
            path.push_str(&format!("&memory_mib={m}"));
        }
        self.upload(&path, context_tar, on_event).await
    }

    async fn upload(
        &self,
        path: &str,
        file: &Path,
        on_event: impl FnMut(&ImageEvent),
    ) -> Result<Image, ClientError> {
        let f = tokio::fs::File::open(file)
            .await
            .map_err(|e| ClientError::Http(format!("cannot open {}: {e}", file.display())))?;
        let stream =
            tokio_util::io::ReaderStream::with_capacity(f, 1 << 20).map(|r| r.map(Frame::data));
        let body = BodyExt::boxed(StreamBody::new(stream));
        let resp = self
            .open_body(Method::POST, path, body, Some("application/octet-stream"))
            .await?;
        read_events(resp, on_event).await
    }
}

/// Read an NDJSON [`ImageEvent`] stream to its `done` (the image) or
/// `error` (a [`ClientError::Api`]) line.
async fn read_events(
    resp: hyper::Response<hyper::body::Incoming>,
    mut on_event: impl FnMut(&ImageEvent),
) -> Result<Image, ClientError> {
    read_ndjson(resp, "progress", |ev: ImageEvent| {
        on_event(&ev);
        match ev {
            ImageEvent::Done { image } => Some(Ok(*image)),
            ImageEvent::Error { error } => Some(Err(ClientError::from_detail(error))),
            _ => None,
        }
    })
    .await
}
