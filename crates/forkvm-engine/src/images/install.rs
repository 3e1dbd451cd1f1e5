//! The actions that install an image: pull from a registry and import from
//! an uploaded archive. Both end in `forkvm_image::install::install_image`,
//! which publishes the image atomically; on any failure nothing is left but
//! blobs that verified (they are reused by the next attempt).

use std::path::PathBuf;

use forkvm_api::{Image, ImageEvent, ImportQuery, PullImage};
use forkvm_image::blobs::BlobStore;
use forkvm_image::meta::{ImageSource, StartSpec};
use forkvm_image::progress::Progress;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::stream::Emitter;
use crate::error::{EngineError, ErrorKind, HintAction};
use crate::manager::Manager;

/// A checked pull request.
pub struct PullPlan {
    pub name: String,
    pub req: PullImage,
    pub start: Option<StartSpec>,
}

/// An uploaded file, removed when dropped.
pub struct Upload {
    pub path: PathBuf,
    pub bytes: u64,
}

impl Drop for Upload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The local name a reference gets by default: the repository's last part,
/// plus the tag unless it is `latest`, plus the digest's first 12 digits for
/// a digest reference (`127.0.0.1:5000/team/py:3.12` → `py-3.12`).
pub fn default_name(reference: &str) -> String {
    let (rest, digest) = match reference.split_once('@') {
        Some((r, d)) => (r, Some(d.rsplit(':').next().unwrap_or(d))),
        None => (reference, None),
    };
    let last = rest.rsplit('/').next().unwrap_or(rest);
    let (repo, tag) = match last.split_once(':') {
        Some((r, t)) => (r, Some(t)),
        None => (last, None),
    };
    let mut n = repo.to_string();
    if let Some(t) = tag.filter(|t| *t != "latest") {
        n.push('-');
        n.push_str(t);
    }
    if let Some(d) = digest {
        n.push('-');
        n.push_str(&d[..d.len().min(12)]);
    }
    let n: String = n
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    n.trim_start_matches(['.', '-', '_']).to_string()
}

/// Map an image-library error to the API's codes.
pub fn image_error(e: &forkvm_image::ImageError) -> EngineError {
    use forkvm_image::ImageError as E;
    let nospace = |s: &std::io::Error| s.raw_os_error() == Some(libc::ENOSPC);
    let kind = match e {
        E::Blob(b) | E::BlobContext { source: b, .. } => return blob_error(b),
        E::Io { source, .. } | E::Entry { source, .. } if nospace(source) => ErrorKind::NoSpace,
        E::Malformed { .. }
        | E::Unsupported { .. }
        | E::NoPlatform { .. }
        | E::UnknownFormat { .. }
        | E::MissingBlob { .. }
        | E::UnsafePath { .. }
        | E::Ambiguous { .. }
        | E::NoSuchImage { .. } => ErrorKind::InvalidImage,
        E::DiskTooSmall { .. } | E::BadName(_) => ErrorKind::Invalid,
        E::Exists(_) => ErrorKind::Conflict,
        E::NotFound(_) => ErrorKind::ImageNotFound,
        E::ToolFailed { stderr, .. } if stderr.contains("No space left") => ErrorKind::NoSpace,
        E::Io { .. }
        | E::Entry { .. }
        | E::MissingTool { .. }
        | E::ToolFailed { .. }
        | E::Broken { .. } => ErrorKind::Internal,
    };
    EngineError::new(kind, e.to_string())
}

/// Map a pull error to the API's codes.
pub fn pull_error(e: &forkvm_image::pull::PullError) -> EngineError {
    use forkvm_image::pull::PullError as P;
    let kind = match e {
        P::BadReference { .. } | P::DockerConfig { .. } | P::CaCert { .. } => ErrorKind::Invalid,
        P::Auth { .. } | P::AuthRequired { .. } => ErrorKind::RegistryAuthFailed,
        P::NotFound { .. } => ErrorKind::ImageNotFound,
        P::DigestMismatch { .. } | P::NoPlatform { .. } | P::Unsupported { .. } => {
            ErrorKind::InvalidImage
        }
        P::Unreachable { .. } | P::Tls { .. } | P::Network { .. } | P::Registry { .. } => {
            ErrorKind::RegistryUnreachable
        }
        P::Store(b) => return blob_error(b),
    };
    EngineError::new(kind, e.to_string())
}

/// Map a blob store error: a full disk is 507, corruption 422.
pub fn blob_error(e: &forkvm_image::blobs::BlobError) -> EngineError {
    use forkvm_image::blobs::BlobError as B;
    match e {
        B::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => EngineError::new(
            ErrorKind::NoSpace,
            format!("{e}: the disk holding FORKVM_HOME is full; free space and try again"),
        ),
        B::Mismatch { .. } | B::SizeMismatch { .. } => {
            EngineError::new(ErrorKind::InvalidImage, e.to_string())
        }
        _ => EngineError::internal(e.to_string()),
    }
}

/// CA certificates for a registry host, the way Docker looks for them:
/// `$FORKVM_HOME/certs.d/HOST[:PORT]/*.crt`, then
/// `/etc/docker/certs.d/HOST[:PORT]/*.crt`.
pub fn registry_cas(home: &std::path::Path, host: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for base in [home.join("certs.d"), PathBuf::from("/etc/docker/certs.d")] {
        let dir = base.join(host);
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let mut files: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "crt"))
                .collect();
            files.sort();
            v.extend(files);
        }
    }
    v
}

impl Manager {
    /// The shared blob store.
    pub fn blobs(&self) -> Result<BlobStore, EngineError> {
        BlobStore::open(self.cfg.home.join("blobs"))
            .map_err(|e| EngineError::internal(format!("the blob store: {e}")))
    }

    /// Refuse a bad name, or an existing image unless it may be replaced.
    pub fn check_new_image_name(&self, name: &str, replace: bool) -> Result<(), EngineError> {
        if !forkvm_image::valid_image_name(name) || name == "import" || name == "build" {
            return Err(EngineError::invalid(format!(
                "image name {name:?} is not valid: use letters, digits, '.', '-' and '_' \
                 (at most 64, starting with a letter or digit; not `import` or `build`)"
            )));
        }
        if !self.cfg.image_rootfs(name).exists() {
            return Ok(());
        }
        if !replace {
            return Err(EngineError::conflict(format!(
                "an image named {name:?} exists; choose another name"
            ))
            .hint_on(HintAction::RemoveImage, name));
        }
        // Overlays and snapshots name the image's disk by path: it cannot
        // change under them.
        self.check_unused(name, "replace")
    }

    /// Take an uploaded body (a stream of chunks from any front-end) into a
    /// file under `$FORKVM_HOME/uploads`.
    pub async fn receive_upload<S, E>(&self, mut body: S, what: &str) -> Result<Upload, EngineError>
    where
        S: tokio_stream::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let dir = self.cfg.home.join("uploads");
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| EngineError::internal(format!("creating {}: {e}", dir.display())))?;
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = dir.join(format!(
            "{what}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut up = Upload { path, bytes: 0 };
        let mut f = tokio::fs::File::create(&up.path)
            .await
            .map_err(|e| EngineError::internal(format!("creating {}: {e}", up.path.display())))?;
        use tokio_stream::StreamExt;
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| EngineError::invalid(format!("the upload broke off: {e}")))?;
            if let Err(e) = f.write_all(&chunk).await {
                drain(body).await;
                return Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                    EngineError::new(
                        ErrorKind::NoSpace,
                        format!(
                            "the disk holding {} is full; free space and try again",
                            self.cfg.home.display()
                        ),
                    )
                } else {
                    EngineError::internal(format!("writing the upload: {e}"))
                });
            }
            up.bytes += chunk.len() as u64;
        }
        f.flush()
            .await
            .map_err(|e| EngineError::internal(format!("writing the upload: {e}")))?;
        if up.bytes == 0 {
            return Err(EngineError::invalid(
                "the request body is empty: send the archive (or build context) as the body",
            ));
        }
        Ok(up)
    }

    /// Check a pull request before anything is fetched.
    pub fn check_pull(&self, req: &PullImage) -> Result<PullPlan, EngineError> {
        if req.reference.trim().is_empty() {
            return Err(EngineError::invalid(
                "reference must name an image, e.g. 127.0.0.1:5000/team/py:3.12",
            ));
        }
        if req.username.is_some() != req.password.is_some() {
            return Err(EngineError::invalid("give username and password together"));
        }
        let name = req
            .name
            .clone()
            .unwrap_or_else(|| default_name(&req.reference));
        self.check_new_image_name(&name, req.replace)?;
        let start = req.start.as_ref().map(super::start_spec).transpose()?;
        Ok(PullPlan {
            name,
            req: req.clone(),
            start,
        })
    }

    /// How to reach the registry of `reference`: the allow-list
    /// (`--allowed-registries`), credentials (explicit, else the docker
    /// config), CA certificates and plain HTTP. Image pulls and snapshot
    /// pushes and pulls share it.
    pub fn registry_options(
        &self,
        reference: &str,
        explicit: Option<(String, String)>,
        insecure: bool,
    ) -> Result<forkvm_image::pull::PullOptions, EngineError> {
        let host = forkvm_image::pull::parse_reference(reference)
            .map_err(|e| pull_error(&e))?
            .registry()
            .to_string();
        let allowed = &self.cfg.allowed_registries;
        if !allowed.is_empty() && !allowed.iter().any(|a| a == &host) {
            return Err(EngineError::invalid(format!(
                "this daemon talks only to {} (--allowed-registries), not to {host}",
                allowed.join(", ")
            )));
        }
        let auth = forkvm_image::auth::credentials_for(
            &host,
            explicit,
            forkvm_image::auth::default_docker_config()
                .filter(|p| p.is_file())
                .as_deref(),
        )
        .map_err(|e| pull_error(&e))?;
        let ca_certs = registry_cas(&self.cfg.home, &host);
        let mut opts = forkvm_image::pull::PullOptions {
            auth,
            // A loopback registry is spoken to over plain HTTP, unless a CA
            // was set up for it: then it serves HTTPS.
            loopback_plain_http: ca_certs.is_empty(),
            ca_certs,
            ..Default::default()
        };
        if insecure {
            opts.insecure_http.push(host);
        }
        Ok(opts)
    }

    /// `POST /v1/images`: pull, then install.
    pub async fn pull_image(
        self: &std::sync::Arc<Self>,
        plan: PullPlan,
        tx: mpsc::UnboundedSender<ImageEvent>,
    ) -> Result<Image, EngineError> {
        let emit = std::sync::Arc::new(Emitter::new(tx, format!("image {}", plan.name)));
        self.pull_with(plan, emit).await
    }

    /// A pull reporting to `emit` (a build pulls its base this way).
    pub async fn pull_with(
        self: &std::sync::Arc<Self>,
        plan: PullPlan,
        emit: std::sync::Arc<Emitter>,
    ) -> Result<Image, EngineError> {
        let name = plan.name.clone();
        self.check_disk(&format!("pull of image {name}"))?;
        // Leased: every blob the pull touches is claimed until `store` and
        // its clones are dropped, so no collection removes it meanwhile.
        let store = self.blobs()?.leased();
        let watch = store.lease_watch();
        let r = self.pull_inner(plan, emit, store).await;
        if let Err(e) = &r {
            tracing::warn!("image {name}: pull failed: {}", e.message);
            // What it stored and no image uses goes now.
            self.give_back_blobs(watch, "after a failed pull").await;
        }
        r
    }

    async fn pull_inner(
        self: &std::sync::Arc<Self>,
        plan: PullPlan,
        emit: std::sync::Arc<Emitter>,
        store: BlobStore,
    ) -> Result<Image, EngineError> {
        let req = &plan.req;
        let opts = self.registry_options(
            &req.reference,
            req.username.clone().zip(req.password.clone()),
            req.insecure,
        )?;
        let pulled = forkvm_image::pull::pull(&req.reference, &opts, &store, emit.as_ref())
            .await
            .map_err(|e| pull_error(&e))?;
        let root = pulled
            .index_digest
            .clone()
            .unwrap_or_else(|| pulled.manifest_digest.clone());
        let s2 = store.clone();
        let resolved = tokio::task::spawn_blocking(move || forkvm_image::oci::resolve(&s2, &root))
            .await
            .map_err(|e| EngineError::internal(format!("resolve task failed: {e}")))?
            .map_err(|e| image_error(&e))?;
        let source = ImageSource::Registry {
            reference: req.reference.clone(),
        };
        let opts = forkvm_image::install::InstallOptions {
            disk_size: req.disk_size,
            replace: req.replace,
            start: plan.start.clone(),
        };
        self.install(plan.name, resolved, store, source, opts, emit)
            .await
    }

    /// Install a resolved image (blocking work on a blocking thread).
    async fn install(
        self: &std::sync::Arc<Self>,
        name: String,
        resolved: forkvm_image::oci::ResolvedImage,
        store: BlobStore,
        source: ImageSource,
        opts: forkvm_image::install::InstallOptions,
        emit: std::sync::Arc<Emitter>,
    ) -> Result<Image, EngineError> {
        // Checked again now that the work is done: a sandbox may have
        // started on the old image meanwhile.
        self.check_new_image_name(&name, opts.replace)?;
        let images = self.cfg.images_dir();
        let n = name.clone();
        let replaced = opts.replace && self.cfg.image_rootfs(&name).exists();
        let meta = tokio::task::spawn_blocking(move || {
            forkvm_image::install::install_image(
                &images,
                &n,
                &resolved,
                &store,
                source,
                &opts,
                emit.as_ref() as &dyn Progress,
            )
        })
        .await
        .map_err(|e| EngineError::internal(format!("install task failed: {e}")))?
        .map_err(|e| image_error(&e))?;
        if replaced {
            self.drop_stale_templates(&name).await;
        }
        self.db.changes.send(crate::changes::Change::Image(
            name.clone(),
            crate::changes::Action::Created,
        ));
        tracing::info!(
            "image {name}: installed ({} layer(s), {} bytes)",
            meta.layers.len(),
            meta.size_bytes
        );
        Ok(super::view(&meta))
    }

    /// `POST /v1/images/import`.
    pub async fn import_image(
        self: &std::sync::Arc<Self>,
        q: ImportQuery,
        upload: Upload,
        tx: mpsc::UnboundedSender<ImageEvent>,
    ) -> Result<Image, EngineError> {
        let name = q.name.clone();
        let store = self.blobs()?.leased();
        let watch = store.lease_watch();
        let r = self.import_inner(q, upload, tx, store).await;
        if let Err(e) = &r {
            tracing::warn!("image {name}: import failed: {}", e.message);
            self.give_back_blobs(watch, "after a failed import").await;
        }
        r
    }

    async fn import_inner(
        self: &std::sync::Arc<Self>,
        q: ImportQuery,
        upload: Upload,
        tx: mpsc::UnboundedSender<ImageEvent>,
        store: BlobStore,
    ) -> Result<Image, EngineError> {
        let emit = std::sync::Arc::new(Emitter::new(tx, format!("image {}", q.name)));
        let (s2, e2) = (store.clone(), emit.clone());
        let (resolved, format) = tokio::task::spawn_blocking(move || {
            let r = forkvm_image::archive::import_source_ref(&upload.path, None, &s2, e2.as_ref());
            drop(upload);
            r
        })
        .await
        .map_err(|e| EngineError::internal(format!("import task failed: {e}")))?
        .map_err(|e| image_error(&e))?;
        let source = ImageSource::Import {
            format: format.as_str().to_string(),
            file: q.file.clone().unwrap_or_else(|| "upload".into()),
        };
        let opts = forkvm_image::install::InstallOptions {
            disk_size: q.disk_size,
            replace: q.replace.unwrap_or(false),
            start: None,
        };
        self.install(q.name, resolved, store, source, opts, emit)
            .await
    }
}

/// How long an error answer to an upload waits for the rest of its body.
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Read and drop what a client is still sending, for [`DRAIN_FOR`] at most,
/// before an error is answered. A server that answers and closes while
/// request bytes are still unread makes the kernel reset the connection
/// (RFC 9112, section 9.6), and a client still writing its body then sees
/// "error writing a body" instead of the answer that says what is wrong
/// (tests/images.rs hit it when an import over an image in use was refused
/// before its 2 MB tar was sent).
pub async fn drain<S, E>(mut body: S)
where
    S: tokio_stream::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    use tokio_stream::StreamExt;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(Ok(_)) = body.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names() {
        assert_eq!(default_name("127.0.0.1:5000/team/py:3.12"), "py-3.12");
        assert_eq!(default_name("ubuntu"), "ubuntu");
        assert_eq!(default_name("ubuntu:latest"), "ubuntu");
        assert_eq!(
            default_name(&format!("ubuntu@sha256:{}", "ab".repeat(32))),
            "ubuntu-abababababab"
        );
        assert_eq!(default_name("localhost:5000/a/b:v1+x"), "b-v1-x");
    }
}
