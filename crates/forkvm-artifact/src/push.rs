//! Pushing a snapshot's chain: the image, every link base first, then the
//! index under the tag.
//!
//! A manifest is looked up by digest before anything of it is sent: a link
//! (or image) the registry already has costs one `HEAD`. For the rest, each
//! chunk blob is looked up (`HEAD`) and sent only when missing, so chunks
//! shared with anything already pushed travel once. Blobs go before the
//! config, the config before its manifest, and manifests before the index,
//! so a registry never holds a manifest that names a missing blob, and the
//! tag moves only when everything it names is there.

use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::TryStreamExt as _;
use oci_client::RegistryOperation;

use forkvm_image::progress::{Progress, ProgressEvent};
use forkvm_image::pull::{PullError, PullOptions, Session};

use crate::chunk::{read_chunk, ChunkError};
use crate::format;
use crate::plan::{self, Doc, Plan};

/// Blobs sent at once.
const PARALLEL: usize = 4;

/// A push failure.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Registry(#[from] PullError),
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    #[error("push task failed: {0}")]
    Task(String),
}

pub use crate::plan::{ImagePart, LinkPart};

/// What went over the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pushed {
    pub reference: String,
    pub index_digest: String,
    pub links_skipped: u32,
    pub image_sent: bool,
    pub blobs_sent: u32,
    pub bytes_sent: u64,
    pub blobs_skipped: u32,
    pub bytes_skipped: u64,
    pub manifests_sent: u32,
}

/// Open a session for pushing to `reference`: a dead registry or refused
/// credentials fail here, before any file is read.
pub async fn connect(reference: &str, opts: &PullOptions) -> Result<Session, PushError> {
    Ok(Session::open(reference, opts, RegistryOperation::Push).await?)
}

/// Push `image` and `links` (base first; each link's parent is the one
/// before it) through `s` (from [`connect`]).
pub async fn push(
    s: &Session,
    image: ImagePart,
    links: Vec<LinkPart>,
    progress: &dyn Progress,
) -> Result<Pushed, PushError> {
    push_plan(s, &plan::plan(image, links), progress).await
}

/// Push the documents of `p` through `s`.
pub async fn push_plan(
    s: &Session,
    p: &Plan,
    progress: &dyn Progress,
) -> Result<Pushed, PushError> {
    progress.event(ProgressEvent::Phase {
        phase: format!("pushing to {}", s.canonical),
    });
    let mut out = Pushed {
        reference: s.canonical.clone(),
        ..Default::default()
    };
    for d in &p.docs {
        send_doc(s, d, &mut out, progress).await?;
    }
    s.client
        .push_manifest_raw(
            &s.reference,
            p.index.clone(),
            format::MT_INDEX.parse().expect("a valid header value"),
        )
        .await
        .map_err(|e| s.error(e, &format!("the index of {}", s.canonical), false))?;
    out.manifests_sent += 1;
    out.bytes_sent += p.index.len() as u64;
    out.index_digest = p.index_digest.clone();
    Ok(out)
}

async fn manifest_exists(s: &Session, digest: &str) -> Result<bool, PullError> {
    match s.client.fetch_manifest_digest(&s.at(digest), &s.auth).await {
        Ok(_) => Ok(true),
        Err(e) => match s.error(e, &format!("manifest {digest}"), false) {
            PullError::NotFound { .. } => Ok(false),
            other => Err(other),
        },
    }
}

async fn blob_exists(s: &Session, digest: &str) -> Result<bool, PullError> {
    s.client
        .blob_exists(&s.reference, digest)
        .await
        .map_err(|e| s.error(e, &format!("blob {digest}"), true))
}

async fn send_doc(
    s: &Session,
    d: &Doc,
    out: &mut Pushed,
    progress: &dyn Progress,
) -> Result<(), PushError> {
    let item = format!("{} {}", d.role, d.name);
    if manifest_exists(s, &d.digest).await? {
        progress.event(ProgressEvent::Cached { item });
        if d.role == "link" {
            out.links_skipped += 1;
        }
        return Ok(());
    }
    if d.role == "image" {
        out.image_sent = true;
    }
    let total: u64 = d.layers.iter().map(|l| l.size).sum();
    let done = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let sent_n = AtomicU64::new(0);
    let skipped = AtomicU64::new(0);
    let skipped_n = AtomicU64::new(0);
    futures_util::stream::iter(d.layers.iter().map(Ok::<_, PushError>))
        .try_for_each_concurrent(PARALLEL, |l| {
            let (done, sent, sent_n, skipped, skipped_n, item) =
                (&done, &sent, &sent_n, &skipped, &skipped_n, &item);
            async move {
                if blob_exists(s, &l.digest).await? {
                    skipped.fetch_add(l.size, Ordering::Relaxed);
                    skipped_n.fetch_add(1, Ordering::Relaxed);
                } else {
                    let (path, c) = d.sources[&l.digest].clone();
                    let data = tokio::task::spawn_blocking(move || read_chunk(&path, &c))
                        .await
                        .map_err(|e| PushError::Task(e.to_string()))??;
                    s.client
                        .push_blob(&s.reference, data, &l.digest)
                        .await
                        .map_err(|e| s.error(e, &format!("chunk {}", l.digest), true))?;
                    sent.fetch_add(l.size, Ordering::Relaxed);
                    sent_n.fetch_add(1, Ordering::Relaxed);
                }
                let n = done.fetch_add(l.size, Ordering::Relaxed) + l.size;
                progress.event(ProgressEvent::Bytes {
                    item: item.clone(),
                    done: n,
                    total: Some(total),
                });
                Ok(())
            }
        })
        .await?;
    out.bytes_sent += sent.into_inner();
    out.blobs_sent += sent_n.into_inner() as u32;
    out.bytes_skipped += skipped.into_inner();
    out.blobs_skipped += skipped_n.into_inner() as u32;
    if blob_exists(s, &d.config_desc.digest).await? {
        out.blobs_skipped += 1;
        out.bytes_skipped += d.config.len() as u64;
    } else {
        s.client
            .push_blob(&s.reference, d.config.clone(), &d.config_desc.digest)
            .await
            .map_err(|e| s.error(e, &format!("the config of {item}"), true))?;
        out.blobs_sent += 1;
        out.bytes_sent += d.config.len() as u64;
    }
    s.client
        .push_manifest_raw(
            &s.at(&d.digest),
            d.manifest.clone(),
            format::MT_MANIFEST.parse().expect("a valid header value"),
        )
        .await
        .map_err(|e| s.error(e, &format!("the manifest of {item}"), false))?;
    out.manifests_sent += 1;
    out.bytes_sent += d.manifest.len() as u64;
    Ok(())
}
