//! Dockerfile builds for `forkvm image build -f Dockerfile CONTEXT --tag NAME`.
//!
//! This crate is pure logic: it reads a Dockerfile and a build context on
//! the host and turns them into a [`Plan`], a list of [`Step`]s that the
//! daemon carries out inside a sandbox of the base image. Nothing here
//! boots a VM or talks to the daemon.
//!
//! How the daemon uses it:
//!
//! 1. [`base_reference`] reads the `FROM` line (after `ARG`s declared
//!    before it and `--build-arg`s) without touching the context, so the
//!    daemon can resolve or pull the base image first.
//! 2. [`plan()`] takes the resolved [`BaseImage`] (digest and config), walks
//!    the context and returns the steps, each with a chained cache key:
//!    `key(n) = sha256(key(n-1) + step n)` and `key(-1)` derived from the
//!    base digest. Editing a late instruction changes only the keys from
//!    that step on, so a rebuild resumes from the last cached snapshot.
//! 3. For each step the daemon looks up a snapshot stored under
//!    [`Step::cache_key`]; on a miss it runs the step ([`StepKind::Run`]
//!    through the agent's exec, [`StepKind::Copy`] by streaming
//!    [`ArchiveSpec::write_tar`] into the agent's `PutArchive`,
//!    [`StepKind::Mkdir`] as a `mkdir -p`) and snapshots the result.
//! 4. [`Plan::final_config`] and [`Plan::start`] go into the new image's
//!    `image.json`.
//!
//! Supported instructions and forkvm's extensions are described in
//! [`plan`](mod@plan); the lexical rules in [`parse`]; variable substitution
//! in [`words`]; `.dockerignore` in [`ignore`]; source resolution in
//! [`context`]; the tar stream in [`archive`].

pub mod archive;
pub mod context;
pub mod ignore;
pub mod parse;
pub mod plan;
pub mod words;

use std::path::PathBuf;

pub use archive::{ArchiveEntry, ArchiveSpec, Compression, EntryKind, ARCHIVE_MTIME};
pub use forkvm_image::meta::{ImageConfig, ReadyCheck, StartSpec};
pub use plan::{
    base_reference, outline, plan, plan_build, reshape_from, BaseImage, BuildPlan, CopySource,
    Outline, Plan, StageFrom, StagePlan, Step, StepKind,
};

/// Everything that can go wrong while planning a build or writing a
/// step's archive. Messages name the Dockerfile (or `.dockerignore`) line
/// and say what to change.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A Dockerfile line is malformed or uses something that cannot work.
    #[error("Dockerfile line {line}: {message}")]
    Dockerfile { line: usize, message: String },
    /// A Dockerfile feature forkvm does not implement (yet).
    #[error("Dockerfile line {line}: {what} is not supported by forkvm builds: {hint}")]
    Unsupported {
        line: usize,
        what: String,
        hint: String,
    },
    /// A bad `.dockerignore` pattern.
    #[error(".dockerignore line {line}: {message}")]
    Ignore { line: usize, message: String },
    /// Reading the build context failed.
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the tar stream failed (the receiver went away).
    #[error("writing the archive stream: {0}")]
    Stream(#[source] std::io::Error),
    /// A tar archive added with `ADD`, or the archive being written, is
    /// unusable.
    #[error("archive {}: {message}", path.display())]
    Archive { path: PathBuf, message: String },
    /// A context file differs from what the plan hashed: the cache key
    /// would not describe the snapshot any more.
    #[error("{} changed after the build was planned; run the build again", path.display())]
    Changed { path: PathBuf },
}

impl BuildError {
    /// The Dockerfile line the error is about, when there is one.
    pub fn line(&self) -> Option<usize> {
        match self {
            BuildError::Dockerfile { line, .. } | BuildError::Unsupported { line, .. } => {
                Some(*line)
            }
            _ => None,
        }
    }

    pub(crate) fn at(line: usize, message: impl Into<String>) -> Self {
        BuildError::Dockerfile {
            line,
            message: message.into(),
        }
    }

    pub(crate) fn unsupported(
        line: usize,
        what: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        BuildError::Unsupported {
            line,
            what: what.into(),
            hint: hint.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BuildError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
