//! Pulling: resolve a reference to its index, manifests and configs (small,
//! every one digest-checked), so the caller can decide compatibility and
//! what it already has; then fetch files chunk by chunk into place.
//!
//! Nothing here publishes: [`fetch_file`] writes one file where it is told
//! (a staging directory) and checks it whole before returning. The caller
//! renames a snapshot into place only when every file of it checked.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::{StreamExt as _, TryStreamExt as _};
use oci_client::RegistryOperation;

use forkvm_image::progress::{Progress, ProgressEvent};
use forkvm_image::pull::{PullError, PullOptions, Session};

use crate::chunk::{unpack, Assembler, ChunkError};
use crate::format::{self, DiskBacking, FileEntry, FormatError, ImageConfig, LinkConfig, Manifest};

/// Chunks fetched at once.
const PARALLEL: usize = 4;

/// A pull failure.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Registry(#[from] PullError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{0}; nothing was kept")]
    Chunk(#[from] ChunkError),
    #[error("fetch task failed: {0}")]
    Task(String),
}

/// One chain link as the registry holds it.
pub struct RemoteLink {
    pub digest: String,
    pub manifest: Manifest,
    pub config: LinkConfig,
}

/// A resolved snapshot artifact.
pub struct Remote {
    pub session: Session,
    pub index_digest: String,
    pub image_digest: String,
    pub image: ImageConfig,
    /// Base first; the pulled snapshot last.
    pub links: Vec<RemoteLink>,
}

impl Remote {
    /// The snapshot the reference names.
    pub fn top(&self) -> &RemoteLink {
        self.links.last().expect("a resolved index has a link")
    }
}

/// Fetch a manifest by reference and check its bytes against the digest
/// asked for (when the reference is a digest) and the one the registry
/// reported.
async fn manifest_bytes(
    s: &Session,
    r: &oci_client::Reference,
    accept: &str,
    what: &str,
) -> Result<(Vec<u8>, String), FetchError> {
    let (bytes, digest) = s
        .client
        .pull_manifest_raw(r, &s.auth, &[accept])
        .await
        .map_err(|e| s.error(e, what, false))?;
    let actual = format::sha256_digest(&bytes);
    let want = r.digest().unwrap_or(&digest);
    if actual != want || actual != digest {
        return Err(PullError::DigestMismatch {
            host: s.host.clone(),
            what: what.to_string(),
            expected: want.to_string(),
            actual,
        }
        .into());
    }
    Ok((bytes.to_vec(), actual))
}

/// A whole (small) blob, size-bounded and digest-checked.
async fn small_blob(
    s: &Session,
    d: &format::Descriptor,
    what: &str,
) -> Result<Vec<u8>, FetchError> {
    let mut stream = s
        .client
        .pull_blob_stream(&s.reference, d.digest.as_str())
        .await
        .map_err(|e| s.error(e, what, true))?;
    let mut out = Vec::with_capacity(d.size.min(1 << 24) as usize);
    while let Some(b) = stream.next().await {
        let b = b.map_err(|e| s.io_error(e, what))?;
        out.extend_from_slice(&b);
        if out.len() as u64 > d.size {
            break;
        }
    }
    let actual = format::sha256_digest(&out);
    if actual != d.digest || out.len() as u64 != d.size {
        return Err(PullError::DigestMismatch {
            host: s.host.clone(),
            what: what.to_string(),
            expected: d.digest.clone(),
            actual,
        }
        .into());
    }
    Ok(out)
}

/// Resolve `reference`: the index, every manifest and config, checked, and
/// the chain's links checked against each other (each names the one before
/// as its parent, by id and manifest digest; disk layers back onto earlier
/// links or the image).
pub async fn resolve(
    reference: &str,
    opts: &PullOptions,
    progress: &dyn Progress,
) -> Result<Remote, FetchError> {
    let s = Session::open(reference, opts, RegistryOperation::Pull).await?;
    progress.event(ProgressEvent::Phase {
        phase: format!("resolving {}", s.canonical),
    });
    let what = format!("the index of {}", s.canonical);
    let (ib, index_digest) = manifest_bytes(&s, &s.reference, format::MT_INDEX, &what).await?;
    let index = format::parse_index(&ib, &what)?;
    let mut image = None;
    let mut links: Vec<RemoteLink> = Vec::new();
    for e in &index.manifests {
        let role = e
            .annotations
            .get(format::ANN_ROLE)
            .cloned()
            .unwrap_or_default();
        let what = format!("{role} manifest {}", e.digest);
        let (mb, digest) = manifest_bytes(&s, &s.at(&e.digest), format::MT_MANIFEST, &what).await?;
        let artifact = if role == "image" {
            format::ARTIFACT_IMAGE
        } else {
            format::ARTIFACT_LINK
        };
        let m = format::parse_manifest(&mb, artifact, &what)?;
        let cw = format!("the config of {what}");
        let cb = small_blob(&s, &m.config, &cw).await?;
        if role == "image" {
            image = Some((digest, format::parse_image(&cb, &m, &cw)?));
            continue;
        }
        let config = format::parse_link(&cb, &m, &cw)?;
        let invalid = |why: String| FormatError::Invalid {
            what: format!("link {} of {}", config.id, s.canonical),
            why,
        };
        match (&config.parent, links.last()) {
            (None, None) => {}
            (Some(p), Some(prev)) if p.id == prev.config.id && p.manifest == prev.digest => {}
            (p, prev) => {
                return Err(invalid(format!(
                    "its parent {:?} is not the link before it ({:?})",
                    p.as_ref().map(|p| &p.id),
                    prev.map(|l| &l.config.id)
                ))
                .into())
            }
        }
        if let DiskBacking::Snapshot(id) = &config.disk_backing {
            if !links.iter().any(|l| &l.config.id == id) {
                return Err(invalid(format!("its disk backs onto {id}, not in the chain")).into());
            }
        }
        links.push(RemoteLink {
            digest,
            manifest: m,
            config,
        });
    }
    let (image_digest, image) = image.ok_or_else(|| FormatError::Foreign {
        what: what.clone(),
        why: "it has no image".into(),
    })?;
    Ok(Remote {
        session: s,
        index_digest,
        image_digest,
        image,
        links,
    })
}

/// Fetch `entry` into `dest` (created; it must not exist), checking each
/// chunk and then the whole file. Returns the bytes fetched. On error the
/// caller removes `dest` with the rest of its staging.
pub async fn fetch_file(
    s: &Session,
    entry: &FileEntry,
    dest: &Path,
    item: &str,
    progress: &dyn Progress,
) -> Result<u64, FetchError> {
    let asm = std::sync::Arc::new(Assembler::create(dest, entry)?);
    let total: u64 = entry.chunks.iter().map(|c| c.size).sum();
    let done = AtomicU64::new(0);
    futures_util::stream::iter(entry.chunks.iter().map(Ok::<_, FetchError>))
        .try_for_each_concurrent(PARALLEL, |c| {
            let (asm, done) = (asm.clone(), &done);
            async move {
                let what = format!("chunk {} of {item}", c.digest);
                let blob = small_blob(s, &format::blob(format::MT_CHUNK, &c.digest, c.size), &what)
                    .await?;
                let c2 = c.clone();
                tokio::task::spawn_blocking(move || -> Result<(), ChunkError> {
                    let data = unpack(&blob, &c2)?;
                    asm.write(&c2, &data)
                })
                .await
                .map_err(|e| FetchError::Task(e.to_string()))??;
                let n = done.fetch_add(c.size, Ordering::Relaxed) + c.size;
                progress.event(ProgressEvent::Bytes {
                    item: item.to_string(),
                    done: n,
                    total: Some(total),
                });
                Ok(())
            }
        })
        .await?;
    let asm = std::sync::Arc::into_inner(asm)
        .ok_or_else(|| FetchError::Task("a chunk writer outlived the fetch".into()))?;
    tokio::task::spawn_blocking(move || asm.finish())
        .await
        .map_err(|e| FetchError::Task(e.to_string()))??;
    Ok(total)
}
