//! The image builder (`POST /v1/images/build`): a Dockerfile built inside a sandbox.
//!
//! ```text
//! context tar ──unpack──▶ uploads/build-N.ctx/        (host: files only, never run)
//! outline (forkvm-build): the stages the target needs, the images they name
//! each image ──▶ local image, or pulled
//! plan: per stage, steps with chained cache keys
//! for each stage, in order (steps.rs):
//!      │  longest cached prefix: snapshots whose template key is build-<key>
//!      ▼
//! sandbox of its base (an image, or an earlier stage's last snapshot),
//! or a clone of its last cached step
//!   RUN   → agent exec (argv, env, cwd, user), output streamed as log lines
//!   COPY  → agent PutArchive (a tar of the planned files)
//!   COPY --from → a sandbox of the source, GetArchive, PutArchive here
//!   WORKDIR → PutArchive of an empty tar (creates the directory)
//!   after each step: sync(2) in the guest, then a snapshot (build-<key>)
//!      ▼
//! target stage's last snapshot disk ──qemu-img convert──▶ images/<tag>/rootfs.ext4
//! ```
//!
//! Untrusted steps only ever run in the guest. The cache is forkvm's own
//! snapshots: a rebuild after editing step N clones the snapshot of step
//! N-1 (RAM, processes and disk as they were) and runs from N on. Cache
//! snapshots are boot-template snapshots of the base image (no warm pool,
//! never collected by the branch-point GC, removed with the base image);
//! `forkvm snapshot ls` shows them with template key `build-…`.
//!
//! The guest `sync`s before every snapshot, so each snapshot's disk holds
//! every write of its step: the exported root disk is that disk, read
//! through its qcow2 chain.

pub mod steps;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use forkvm_api::{BuildQuery, Image, ImageEvent};
use forkvm_build::{BaseImage, StageFrom};
use forkvm_image::meta::{ImageMeta, ImageSource};
use tokio::sync::mpsc;

use self::steps::{Sources, Start};
use crate::error::EngineError;
use crate::images::install::Upload;
use crate::images::stream::Emitter;
use crate::manager::Manager;

use self::steps::build_failed;
pub use self::steps::CACHE_PREFIX;

/// A stable identity of a local image for cache keys: its manifest digest
/// when it has one, else the size and mtime of its files.
fn image_identity(m: &Manager, meta: &ImageMeta) -> String {
    use std::os::unix::fs::MetadataExt;
    if let Some(d) = &meta.digest {
        return d.clone();
    }
    let mut s = format!("local:{}", meta.name);
    for p in [
        m.cfg.image_rootfs(&meta.name),
        m.cfg.images_dir().join(&meta.name).join("image.json"),
    ] {
        if let Ok(md) = std::fs::metadata(&p) {
            s.push_str(&format!(":{}:{}.{}", md.len(), md.mtime(), md.mtime_nsec()));
        }
    }
    forkvm_image::blobs::sha256_digest(s.as_bytes())
}

/// Unpack the uploaded context (plain files; the tar crate refuses entries
/// that would land outside the directory).
fn unpack_context(upload: &Path, dir: &Path) -> Result<(), EngineError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| EngineError::internal(format!("creating {}: {e}", dir.display())))?;
    let f = std::fs::File::open(upload)
        .map_err(|e| EngineError::internal(format!("opening the upload: {e}")))?;
    let mut a = tar::Archive::new(std::io::BufReader::new(f));
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(false);
    a.set_unpack_xattrs(false);
    a.set_overwrite(true);
    a.unpack(dir).map_err(|e| {
        EngineError::invalid(format!(
            "the build context is not a readable tar ({e}); send the context directory as a tar"
        ))
    })
}

/// Removes the unpacked context when the build ends.
struct ContextDir(PathBuf);
impl Drop for ContextDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Manager {
    /// `POST /v1/images/build`.
    pub async fn build_image(
        self: &Arc<Self>,
        q: BuildQuery,
        upload: Upload,
        tx: mpsc::UnboundedSender<ImageEvent>,
    ) -> Result<Image, EngineError> {
        let tag = q.tag.clone();
        let emit = Arc::new(Emitter::new(tx, format!("build {tag}")));
        let r = self.build_inner(q, upload, emit).await;
        if let Err(e) = &r {
            tracing::warn!("image {tag}: build failed: {}", e.message);
        }
        r
    }

    async fn build_inner(
        self: &Arc<Self>,
        q: BuildQuery,
        upload: Upload,
        emit: Arc<Emitter>,
    ) -> Result<Image, EngineError> {
        let ctx = ContextDir(upload.path.with_extension("ctx"));
        {
            let (u, c) = (upload.path.clone(), ctx.0.clone());
            tokio::task::spawn_blocking(move || unpack_context(&u, &c))
                .await
                .map_err(|e| EngineError::internal(format!("unpack task failed: {e}")))??;
        }
        drop(upload);
        let df_name = q.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into());
        if df_name.split('/').any(|c| c == "..") || df_name.starts_with('/') {
            return Err(EngineError::invalid(
                "dockerfile must be a path inside the build context",
            ));
        }
        let df_path = ctx.0.join(&df_name);
        let text = std::fs::read_to_string(&df_path).map_err(|e| {
            EngineError::invalid(format!(
                "cannot read the Dockerfile {df_name:?} from the build context: {e}"
            ))
        })?;
        if df_name == crate::images::DOCKERFILE_IN_CONTEXT {
            // It travelled with the context; it is not part of it.
            let _ = std::fs::remove_file(&df_path);
        }
        let args: BTreeMap<String, String> = match &q.build_args {
            Some(j) => serde_json::from_str(j).map_err(|e| {
                EngineError::invalid(format!(
                    "build_args must be a JSON object of strings, e.g. {{\"V\":\"1\"}}: {e}"
                ))
            })?,
            None => BTreeMap::new(),
        };
        let outline = forkvm_build::outline(&text, &args, q.target.as_deref())
            .map_err(|e| build_failed(e.to_string()))?;
        if outline.images.iter().any(|r| r == "scratch") {
            return Err(build_failed(
                "FROM scratch is not supported: build steps run in a sandbox of the base image, \
                 so start from an image (import a rootfs tarball as an image and use \
                 FROM <its name>)",
            ));
        }
        // Every image the needed stages name, local or pulled now.
        let mut srcs = Sources::default();
        let mut resolved = BTreeMap::new();
        for r in &outline.images {
            let m = self.build_base(r, &emit).await?;
            resolved.insert(
                r.clone(),
                BaseImage {
                    digest: image_identity(self, &m),
                    config: m.config.clone(),
                },
            );
            srcs.images.insert(r.clone(), m.name.to_string());
        }
        let plan = {
            let (t, c) = (text.clone(), ctx.0.clone());
            let (a, target, imgs) = (args.clone(), q.target.clone(), resolved);
            tokio::task::spawn_blocking(move || {
                forkvm_build::plan_build(&t, &c, &a, target.as_deref(), &imgs)
            })
            .await
            .map_err(|e| EngineError::internal(format!("plan task failed: {e}")))?
            .map_err(|e| build_failed(e.to_string()))?
        };
        for w in &plan.warnings {
            emit.send(ImageEvent::Log {
                line: format!("warning: {w}"),
            });
        }
        let base_ref = plan.root_image().to_string();
        let many = plan.stages.len() > 1;
        for st in &plan.stages {
            let start = match &st.from {
                StageFrom::Image(r) => Start::Image(
                    srcs.images
                        .get(r)
                        .cloned()
                        .ok_or_else(|| EngineError::internal(format!("image {r} not resolved")))?,
                ),
                StageFrom::Stage(i) => srcs
                    .stages
                    .get(i)
                    .cloned()
                    .ok_or_else(|| EngineError::internal(format!("stage {i} not built")))?,
            };
            if many {
                emit.send(ImageEvent::Phase {
                    phase: format!(
                        "stage {}{}",
                        st.index,
                        st.name
                            .as_ref()
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default()
                    ),
                });
            }
            let last = self
                .run_steps(&st.steps, &start, &q, no_cache(&q), &emit, &srcs)
                .await?;
            srcs.stages
                .insert(st.index, last.map(Start::Snapshot).unwrap_or(start));
        }
        let target = plan.target();
        let last = srcs.stages.get(&target.index).cloned();
        let meta = ImageMeta {
            name: q.tag.clone(),
            format: "ext4".into(),
            size_bytes: 0,
            created_at: crate::util::now_rfc3339(),
            source: Some(ImageSource::Build {
                base: base_ref.clone(),
                dockerfile_digest: plan.dockerfile_digest.clone(),
            }),
            digest: None,
            layers: Vec::new(),
            config: target.config.clone(),
            start: plan.start.clone(),
            description: None,
        };
        emit.send(ImageEvent::Phase {
            phase: "exporting the root disk".into(),
        });
        let disk_file = match &last {
            Some(Start::Snapshot(snap)) => self.store().dir(snap).join(forkvm_store::DISK),
            Some(Start::Image(name)) => self.cfg.image_rootfs(name),
            None => return Err(EngineError::internal("the target stage was not built")),
        };
        // A sandbox may have started on an image of that name meanwhile.
        self.check_new_image_name(&q.tag, true)?;
        let replaced = self.cfg.image_rootfs(&q.tag).exists();
        let images = self.cfg.images_dir();
        let meta = tokio::task::spawn_blocking(move || {
            forkvm_image::install::install_prepared(&images, meta, true, |dest| {
                export_disk(&disk_file, dest)
            })
        })
        .await
        .map_err(|e| EngineError::internal(format!("export task failed: {e}")))?
        .map_err(|e| crate::images::install::image_error(&e))?;
        if replaced {
            self.drop_stale_templates(&meta.name).await;
        }
        self.db.changes.send(crate::changes::Change::Image(
            meta.name.clone(),
            crate::changes::Action::Created,
        ));
        tracing::info!(
            "image {}: built from {} in {} step(s)",
            meta.name,
            base_ref,
            plan.stages.iter().map(|s| s.steps.len()).sum::<usize>()
        );
        Ok(crate::images::view(&meta))
    }

    /// The base image: a local image of that name (or of the name a pull
    /// would give it), else pulled now.
    async fn build_base(
        self: &Arc<Self>,
        base_ref: &str,
        emit: &Arc<Emitter>,
    ) -> Result<ImageMeta, EngineError> {
        for n in [
            base_ref.to_string(),
            crate::images::install::default_name(base_ref),
        ] {
            if forkvm_image::valid_image_name(&n) && self.cfg.image_rootfs(&n).is_file() {
                return self.image_meta(&n);
            }
        }
        emit.send(ImageEvent::Log {
            line: format!("base image {base_ref} is not here: pulling it"),
        });
        let plan = self.check_pull(&forkvm_api::PullImage {
            reference: base_ref.to_string(),
            ..Default::default()
        })?;
        let name = plan.name.clone();
        self.pull_with(plan, emit.clone()).await?;
        self.image_meta(&name)
    }
}

/// Write the whole disk a qcow2 chain (or a raw file) presents into a new
/// sparse raw file, and return its size.
fn export_disk(src: &Path, dest: &Path) -> Result<u64, forkvm_image::ImageError> {
    let img = forkvm_qemu::disk::qemu_img_binary();
    let out = std::process::Command::new(&img)
        .args(["convert", "-q", "-U", "-O", "raw"])
        .arg(src)
        .arg(dest)
        .output()
        .map_err(|_| forkvm_image::ImageError::MissingTool { tool: img.clone() })?;
    if !out.status.success() {
        return Err(forkvm_image::ImageError::ToolFailed {
            tool: format!("{img} convert"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    std::fs::metadata(dest)
        .map(|m| m.len())
        .map_err(|source| forkvm_image::ImageError::Io {
            what: format!("reading {}", dest.display()),
            source,
        })
}

fn no_cache(q: &BuildQuery) -> bool {
    q.no_cache == Some(true)
}
