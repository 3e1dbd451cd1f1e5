//! The steps of one build stage, run in a sandbox: each not cached step
//! in turn, with a snapshot after each (see [`super`]). `COPY
//! --from` boots a sandbox of its source (an earlier stage's last step,
//! or an image), fetches the paths as a tar through the agent, and puts
//! them into the build sandbox.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use std::sync::Arc;

use forkvm_api::{BuildQuery, CreateSandbox, ImageEvent};
use forkvm_build::{CopySource, Step, StepKind};
use tokio::sync::mpsc;

use crate::agent::{AgentConn, ExecSpec};
use crate::error::{EngineError, ErrorKind};
use crate::images::stream::Emitter;
use crate::manager::Manager;
use crate::spawn::Created;

/// The template-key prefix of build cache snapshots.
pub const CACHE_PREFIX: &str = "build-";

/// How long one RUN step may take.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(3600);

/// A build that cannot go on: 422 `build_failed` with what went wrong.
pub(super) fn build_failed(m: impl Into<String>) -> EngineError {
    EngineError::new(ErrorKind::BuildFailed, m)
}

/// What a stage (or a `COPY --from`) starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// A local image, by name.
    Image(String),
    /// A snapshot: an earlier stage's last step.
    Snapshot(String),
}

/// The stages built so far (by Dockerfile index) and the local names of
/// the images the Dockerfile names.
#[derive(Debug, Default)]
pub struct Sources {
    pub stages: BTreeMap<usize, Start>,
    pub images: BTreeMap<String, String>,
}

impl Sources {
    fn of(&self, s: &CopySource) -> Result<Start, EngineError> {
        match s {
            CopySource::Stage(i) => self.stages.get(i).cloned(),
            CopySource::Image(r) => self.images.get(r).cloned().map(Start::Image),
        }
        .ok_or_else(|| EngineError::internal(format!("COPY --from source {s:?} was not built")))
    }
}

impl Manager {
    /// A sandbox request for `start`.
    fn start_request(&self, start: &Start, q: &BuildQuery) -> CreateSandbox {
        match start {
            Start::Snapshot(id) => CreateSandbox {
                snapshot: Some(id.clone()),
                ..Default::default()
            },
            Start::Image(name) => CreateSandbox {
                image: Some(name.clone()),
                memory_mib: q.memory_mib,
                disk_size: q.disk_size,
                // A base with a start command would have it running in the
                // build; boot it plainly instead.
                use_template: self
                    .image_meta(name)
                    .ok()
                    .and_then(|m| m.start)
                    .map(|_| false),
                ..Default::default()
            },
        }
    }

    async fn create_one(self: &Arc<Self>, req: CreateSandbox) -> Result<String, EngineError> {
        match self.create(req).await? {
            Created::One(s) => Ok(s.id),
            Created::Batch(_) => Err(EngineError::internal("a batch where one was asked")),
        }
    }

    /// Run the steps not cached; returns the id of the last step's snapshot
    /// (`None` for a Dockerfile with no steps).
    pub(super) async fn run_steps(
        self: &Arc<Self>,
        steps: &[Step],
        start: &Start,
        q: &BuildQuery,
        no_cache: bool,
        emit: &Arc<Emitter>,
        srcs: &Sources,
    ) -> Result<Option<String>, EngineError> {
        let total = steps.len() as u32;
        // The longest cached prefix.
        let mut resume: Option<(usize, String)> = None;
        if !no_cache {
            for (i, s) in steps.iter().enumerate().rev() {
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
        for s in &steps[..first] {
            emit.send(ImageEvent::Step {
                index: s.index as u32 + 1,
                total,
                text: s.text.clone(),
                cached: true,
            });
        }
        if first == steps.len() {
            return Ok(resume.map(|(_, id)| id));
        }
        let req = match &resume {
            Some((_, snap)) => self.start_request(&Start::Snapshot(snap.clone()), q),
            None => self.start_request(start, q),
        };
        emit.send(ImageEvent::Phase {
            phase: "starting the build sandbox".into(),
        });
        let sb = self.create_one(req).await?;
        let r = self.run_in(&sb, steps, first, q, emit, srcs).await;
        if let Err(e) = self.remove(&sb).await {
            tracing::warn!("build sandbox {sb}: removal failed: {}", e.message);
        }
        r.map(Some)
    }

    /// Run steps `first..` in sandbox `sb`, snapshotting after each.
    async fn run_in(
        self: &Arc<Self>,
        sb: &str,
        steps: &[Step],
        first: usize,
        q: &BuildQuery,
        emit: &Arc<Emitter>,
        srcs: &Sources,
    ) -> Result<String, EngineError> {
        let total = steps.len() as u32;
        let mut last = String::new();
        for s in &steps[first..] {
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
                        .map_err(|e| EngineError::internal(format!("archive task failed: {e}")))?
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
                StepKind::CopyFrom {
                    source,
                    srcs: paths,
                    dest,
                    into_dir,
                    owner,
                    chmod,
                    ..
                } => {
                    let from = srcs.of(source)?;
                    let c = CopyFrom {
                        paths,
                        dest,
                        into_dir: *into_dir,
                        owner: owner.as_deref(),
                        chmod: *chmod,
                    };
                    self.copy_from(&conn, &from, &c, q, emit)
                        .await
                        .map_err(|e| {
                            build_failed(format!("step {n} `{}`: {}", s.text, e.message))
                        })?;
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
                    crate::snapshot::Onto::Origin,
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

    /// `COPY --from`: fetch each path from a sandbox of `from` and put it
    /// into the build sandbox (`conn`).
    async fn copy_from(
        self: &Arc<Self>,
        conn: &AgentConn,
        from: &Start,
        c: &CopyFrom<'_>,
        q: &BuildQuery,
        emit: &Arc<Emitter>,
    ) -> Result<(), EngineError> {
        emit.send(ImageEvent::Log {
            line: format!(
                "starting a sandbox of {} to copy from",
                match from {
                    Start::Image(n) => format!("image {n}"),
                    Start::Snapshot(s) => format!("stage snapshot {s}"),
                }
            ),
        });
        let sb = self.create_one(self.start_request(from, q)).await?;
        let r = async {
            let live = self.running(&sb)?;
            let src = live
                .agent()
                .await
                .map_err(|e| build_failed(format!("the source sandbox's agent: {e}")))?;
            for p in c.paths {
                let a = src
                    .get_archive(vec![p.clone()], None)
                    .await
                    .map_err(|e| build_failed(format!("{p} in the source: {e}")))?;
                let (p2, d, into, chmod) = (p.clone(), c.dest.clone(), c.into_dir, c.chmod);
                let (at, tar) = tokio::task::spawn_blocking(move || {
                    forkvm_build::reshape_from(&a.tar, &p2, &d, into, chmod)
                })
                .await
                .map_err(|e| EngineError::internal(format!("archive task failed: {e}")))?
                .map_err(|e| build_failed(e.to_string()))?;
                conn.put_archive(&at, c.owner, &tar, Duration::from_secs(600))
                    .await
                    .map_err(|e| build_failed(format!("putting {p} at {at}: {e}")))?;
            }
            Ok(())
        }
        .await;
        if let Err(e) = self.remove(&sb).await {
            tracing::warn!("copy source sandbox {sb}: removal failed: {}", e.message);
        }
        r
    }
}

/// What a `COPY --from` step puts where.
struct CopyFrom<'a> {
    paths: &'a [String],
    dest: &'a String,
    into_dir: bool,
    owner: Option<&'a str>,
    chmod: Option<u32>,
}
