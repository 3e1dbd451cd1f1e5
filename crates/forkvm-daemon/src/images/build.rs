//! `POST /v1/images/build`: a Dockerfile built inside a sandbox.
//!
//! ```text
//! context tar ──unpack──▶ uploads/build-N.ctx/        (host: files only, never run)
//! FROM ──▶ local image, or pulled
//! plan (forkvm-build): steps with chained cache keys
//!      │  longest cached prefix: snapshots whose template key is build-<key>
//!      ▼
//! sandbox of the base image (or clone of the last cached step)
//!   RUN   → agent exec (argv, env, cwd, user), output streamed as log lines
//!   COPY  → agent PutArchive (a tar of the planned files)
//!   WORKDIR → PutArchive of an empty tar (creates the directory)
//!   after each step: sync(2) in the guest, then a snapshot (build-<key>)
//!      ▼
//! last step's snapshot disk ──qemu-img convert──▶ images/<tag>/rootfs.ext4
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use forkvm_api::{codes, BuildQuery, CreateSandbox, Image, ImageEvent};
use forkvm_build::{BaseImage, Plan, StepKind};
use forkvm_image::meta::{ImageMeta, ImageSource};
use tokio::sync::mpsc;

use super::install::Upload;
use super::stream::Emitter;
use crate::agent::ExecSpec;
use crate::error::ApiError;
use crate::manager::Manager;
use crate::spawn::Created;

/// The template-key prefix of build cache snapshots.
pub const CACHE_PREFIX: &str = "build-";

/// How long one RUN step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);

fn build_failed(m: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, codes::BUILD_FAILED, m)
}

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
fn unpack_context(upload: &Path, dir: &Path) -> Result<(), ApiError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ApiError::internal(format!("creating {}: {e}", dir.display())))?;
    let f = std::fs::File::open(upload)
        .map_err(|e| ApiError::internal(format!("opening the upload: {e}")))?;
    let mut a = tar::Archive::new(std::io::BufReader::new(f));
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(false);
    a.set_unpack_xattrs(false);
    a.set_overwrite(true);
    a.unpack(dir).map_err(|e| {
        ApiError::invalid(format!(
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
    ) -> Result<Image, ApiError> {
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
    ) -> Result<Image, ApiError> {
        let ctx = ContextDir(upload.path.with_extension("ctx"));
        {
            let (u, c) = (upload.path.clone(), ctx.0.clone());
            tokio::task::spawn_blocking(move || unpack_context(&u, &c))
                .await
                .map_err(|e| ApiError::internal(format!("unpack task failed: {e}")))??;
        }
        drop(upload);
        let df_name = q.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into());
        if df_name.split('/').any(|c| c == "..") || df_name.starts_with('/') {
            return Err(ApiError::invalid(
                "dockerfile must be a path inside the build context",
            ));
        }
        let df_path = ctx.0.join(&df_name);
        let text = std::fs::read_to_string(&df_path).map_err(|e| {
            ApiError::invalid(format!(
                "cannot read the Dockerfile {df_name:?} from the build context: {e}"
            ))
        })?;
        if df_name == crate::images::DOCKERFILE_IN_CONTEXT {
            // It travelled with the context; it is not part of it.
            let _ = std::fs::remove_file(&df_path);
        }
        let args: BTreeMap<String, String> = match &q.build_args {
            Some(j) => serde_json::from_str(j).map_err(|e| {
                ApiError::invalid(format!(
                    "build_args must be a JSON object of strings, e.g. {{\"V\":\"1\"}}: {e}"
                ))
            })?,
            None => BTreeMap::new(),
        };
        let base_ref =
            forkvm_build::base_reference(&text, &args).map_err(|e| build_failed(e.to_string()))?;
        if base_ref == "scratch" {
            return Err(build_failed(
                "FROM scratch is not supported: build steps run in a sandbox of the base image, \
                 so start from an image (import a rootfs tarball with `forkvm image import` and \
                 use FROM <its name>)",
            ));
        }
        let base = self.build_base(&base_ref, &emit).await?;
        let base_img = BaseImage {
            digest: image_identity(self, &base),
            config: base.config.clone(),
        };
        let plan = {
            let (t, c) = (text.clone(), ctx.0.clone());
            let (a, b) = (args.clone(), base_img.clone());
            tokio::task::spawn_blocking(move || forkvm_build::plan(&t, &c, &a, &b))
                .await
                .map_err(|e| ApiError::internal(format!("plan task failed: {e}")))?
                .map_err(|e| build_failed(e.to_string()))?
        };
        for w in &plan.warnings {
            emit.send(ImageEvent::Log {
                line: format!("warning: {w}"),
            });
        }
        let last = self
            .run_steps(&plan, &base.name, &q, no_cache(&q), &emit)
            .await?;
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
            config: plan.final_config.clone(),
            start: plan.start.clone(),
            description: None,
        };
        emit.send(ImageEvent::Phase {
            phase: "exporting the root disk".into(),
        });
        let disk_file = match &last {
            Some(snap) => self.store().dir(snap).join(forkvm_store::DISK),
            None => self.cfg.image_rootfs(&base.name),
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
        .map_err(|e| ApiError::internal(format!("export task failed: {e}")))?
        .map_err(|e| super::install::image_error(&e))?;
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
            plan.steps.len()
        );
        Ok(super::view(&meta))
    }

    /// The base image: a local image of that name (or of the name a pull
    /// would give it), else pulled now.
    async fn build_base(
        self: &Arc<Self>,
        base_ref: &str,
        emit: &Arc<Emitter>,
    ) -> Result<ImageMeta, ApiError> {
        for n in [base_ref.to_string(), super::install::default_name(base_ref)] {
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

    /// Run the steps not cached; returns the id of the last step's snapshot
    /// (`None` for a Dockerfile with no steps).
    async fn run_steps(
        self: &Arc<Self>,
        plan: &Plan,
        base: &str,
        q: &BuildQuery,
        no_cache: bool,
        emit: &Arc<Emitter>,
    ) -> Result<Option<String>, ApiError> {
        let total = plan.steps.len() as u32;
        // The longest cached prefix.
        let mut resume: Option<(usize, String)> = None;
        if !no_cache {
            for (i, s) in plan.steps.iter().enumerate().rev() {
                let key = format!("{CACHE_PREFIX}{}", s.cache_key);
                if let Some(r) = self.db.snapshot_by_template(&key)? {
                    if self.open_verified(&r.id).await.is_ok() {
                        resume = Some((i, r.id));
                        break;
                    }
                }
            }
        }
        let first = resume.as_ref().map_or(0, |(i, _)| i + 1);
        for s in &plan.steps[..first] {
            emit.send(ImageEvent::Step {
                index: s.index as u32 + 1,
                total,
                text: s.text.clone(),
                cached: true,
            });
        }
        if first == plan.steps.len() {
            return Ok(resume.map(|(_, id)| id));
        }
        let req = match &resume {
            Some((_, snap)) => CreateSandbox {
                snapshot: Some(snap.clone()),
                ..Default::default()
            },
            None => CreateSandbox {
                image: Some(base.to_string()),
                memory_mib: q.memory_mib,
                disk_size: q.disk_size,
                // A base with a start command would have it running in the
                // build; boot it plainly instead.
                use_template: self
                    .image_meta(base)
                    .ok()
                    .and_then(|m| m.start)
                    .map(|_| false),
                ..Default::default()
            },
        };
        emit.send(ImageEvent::Phase {
            phase: "starting the build sandbox".into(),
        });
        let sb = match self.create(req).await? {
            Created::One(s) => s.id,
            Created::Batch(_) => return Err(ApiError::internal("a batch where one was asked")),
        };
        let r = self.run_in(&sb, plan, first, emit).await;
        if let Err(e) = self.remove(&sb).await {
            tracing::warn!("build sandbox {sb}: removal failed: {}", e.message);
        }
        r.map(Some)
    }

    /// Run steps `first..` in sandbox `sb`, snapshotting after each.
    async fn run_in(
        self: &Arc<Self>,
        sb: &str,
        plan: &Plan,
        first: usize,
        emit: &Arc<Emitter>,
    ) -> Result<String, ApiError> {
        let total = plan.steps.len() as u32;
        let mut last = String::new();
        for s in &plan.steps[first..] {
            let n = s.index as u32 + 1;
            emit.send(ImageEvent::Step {
                index: n,
                total,
                text: s.text.clone(),
                cached: false,
            });
            let t = Instant::now();
            let live = self.running(sb)?;
            let conn = live
                .agent()
                .await
                .map_err(|e| build_failed(format!("step {n}: the build sandbox's agent: {e}")))?;
            match &s.kind {
                StepKind::Run {
                    argv,
                    env,
                    cwd,
                    user,
                } => {
                    let spec = ExecSpec {
                        argv: argv.clone(),
                        env: env.clone(),
                        cwd: Some(cwd.clone()),
                        user: user.clone(),
                        timeout_ms: Some(STEP_TIMEOUT.as_millis() as u64),
                        max_output: 0,
                        ..Default::default()
                    };
                    let (tap, mut rx) =
                        mpsc::unbounded_channel::<(forkvm_agent_protocol::Stream, Vec<u8>)>();
                    let e2 = emit.clone();
                    let lines = tokio::spawn(async move {
                        let mut tail: Vec<String> = Vec::new();
                        let mut pending = Vec::new();
                        while let Some((_, chunk)) = rx.recv().await {
                            pending.extend_from_slice(&chunk);
                            while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                                let l: Vec<u8> = pending.drain(..=nl).collect();
                                let line = String::from_utf8_lossy(&l[..l.len() - 1]).into_owned();
                                e2.send(ImageEvent::Log { line: line.clone() });
                                tail.push(line);
                                if tail.len() > 20 {
                                    tail.remove(0);
                                }
                            }
                        }
                        if !pending.is_empty() {
                            let line = String::from_utf8_lossy(&pending).into_owned();
                            e2.send(ImageEvent::Log { line: line.clone() });
                            tail.push(line);
                        }
                        tail
                    });
                    let out = conn
                        .exec_tapped(spec, STEP_TIMEOUT + Duration::from_secs(30), Some(tap))
                        .await;
                    let tail = lines.await.unwrap_or_default();
                    let out =
                        out.map_err(|e| build_failed(format!("step {n} `{}`: {e}", s.text)))?;
                    if out.exit_code != Some(0) {
                        return Err(build_failed(format!(
                            "step {n}/{total} `{}` (Dockerfile line {}) failed: {}. Last output:\n{}",
                            s.text,
                            s.line,
                            match (out.exit_code, out.signal, out.timed_out) {
                                (_, _, true) => "it timed out".to_string(),
                                (Some(c), _, _) => format!("exit code {c}"),
                                (None, Some(sig), _) => format!("killed by signal {sig}"),
                                _ => "no exit status".to_string(),
                            },
                            tail.join("\n")
                        )));
                    }
                }
                StepKind::Copy {
                    dest,
                    owner,
                    archive,
                } => {
                    let a = archive.clone();
                    let tar = tokio::task::spawn_blocking(move || a.write_tar(Vec::new()))
                        .await
                        .map_err(|e| ApiError::internal(format!("archive task failed: {e}")))?
                        .map_err(|e| build_failed(format!("step {n}: {e}")))?;
                    conn.put_archive(dest, owner.as_deref(), &tar, Duration::from_secs(600))
                        .await
                        .map_err(|e| build_failed(format!("step {n} `{}`: {e}", s.text)))?;
                }
                StepKind::Mkdir { path, owner } => {
                    // An empty archive: the agent creates the destination.
                    let empty = forkvm_build::ArchiveSpec {
                        entries: Vec::new(),
                    }
                    .write_tar(Vec::new())
                    .map_err(|e| build_failed(format!("step {n}: {e}")))?;
                    conn.put_archive(path, owner.as_deref(), &empty, Duration::from_secs(60))
                        .await
                        .map_err(|e| build_failed(format!("step {n} `{}`: {e}", s.text)))?;
                }
            }
            conn.sync(Duration::from_secs(120))
                .await
                .map_err(|e| build_failed(format!("step {n}: sync in the guest: {e}")))?;
            let f = self
                .freeze(
                    sb,
                    None,
                    Some(format!("{CACHE_PREFIX}{}", s.cache_key)),
                    Some(0),
                    crate::snapshot::Save::Stopped,
                )
                .await?;
            let snap = self.publish_frozen(f).await?;
            emit.send(ImageEvent::Log {
                line: format!(
                    "step {n} done in {:.1} s (cached as snapshot {})",
                    t.elapsed().as_secs_f64(),
                    snap.id
                ),
            });
            last = snap.id;
        }
        Ok(last)
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
