//! From a Dockerfile, a context and a base image to a [`Plan`].
//!
//! # Instructions
//!
//! | instruction | what forkvm does |
//! | --- | --- |
//! | `ARG` before `FROM` | global build argument, usable in `FROM` only (redeclare it after `FROM` to use it there) |
//! | `FROM image [AS name]` | the base; `FROM scratch` starts empty. A second `FROM` (multi-stage) is an error; `--platform` is ignored with a warning |
//! | `RUN cmd` / `RUN ["exe", …]` | a [`StepKind::Run`]; shell form runs as `SHELL` + `cmd` (default `/bin/sh -c`). `RUN --mount`/`--network`/… are errors |
//! | `COPY`/`ADD src… dest` | a [`StepKind::Copy`]; flags `--chown=`, `--chmod=` (octal), `--link` (accepted, no effect); `ADD` of a local tar (plain, gzip, bzip2, xz: judged by content) unpacks it; `ADD` of a URL and `--from=` are errors |
//! | `WORKDIR path` | sets the working directory (relative to the previous one); a [`StepKind::Mkdir`] unless the directory is known to exist |
//! | `ENV`, `ARG`, `USER`, `LABEL`, `EXPOSE`, `CMD`, `ENTRYPOINT`, `SHELL` | change the config only: no step, but they are part of the next steps' cache keys |
//! | `MAINTAINER`, `STOPSIGNAL`, `HEALTHCHECK`, `VOLUME`, `ONBUILD` | ignored with a warning: they do not change what is built (a VOLUME path stays part of the root disk; use `# forkvm:ready` for a health check) |
//! | anything else | an error naming the line |
//!
//! Docker's scoping is kept: `ARG` values are visible from their line on,
//! `--build-arg` values replace `ARG` defaults, `ENV` wins over an `ARG` of
//! the same name, and `RUN` gets the declared `ARG`s in its environment
//! (plus a default `PATH` when the image has none). `ENTRYPOINT` clears a
//! `CMD` inherited from the base image. Substitution ([`crate::words`])
//! applies to `FROM`, `COPY`/`ADD`, `ENV`, `ARG` defaults, `LABEL`,
//! `EXPOSE`, `USER` and `WORKDIR`.
//!
//! # forkvm extensions
//!
//! Comments, so the Dockerfile still builds with Docker:
//!
//! * `# forkvm:start ["exe", "arg", …]` or `# forkvm:start cmd args` (shell
//!   form) or a bare `# forkvm:start` (the image's `ENTRYPOINT` + `CMD`):
//!   the process the image's boot template starts ([`StartSpec`]).
//! * `# forkvm:ready port=8080`, `# forkvm:ready ["pg_isready"]` (or
//!   shell form), each optionally preceded by `timeout=SECS` (default 60):
//!   when the started process is ready. Without `# forkvm:start` the start
//!   command is the image's `ENTRYPOINT` + `CMD`.
//!
//! Each may appear once, anywhere; any other `# forkvm:` comment is an
//! error (a typo would otherwise be silently ignored).
//!
//! # Destinations
//!
//! A relative destination is relative to `WORKDIR`. A destination ending
//! in `/` (or `.`, `..`) is a directory; so is one that is known to exist:
//! a standard directory such as `/usr/local/bin` (not after `FROM
//! scratch`), a `WORKDIR`, or a directory an earlier `COPY` made. Copying
//! one file to any other destination names the file. Unlike Docker, forkvm
//! cannot look into the base image at plan time, so `COPY a.txt /some/dir`
//! where `/some/dir` exists only in the base image writes a file named
//! `dir`; write `/some/dir/` to be sure. Several sources need a
//! destination ending in `/`.
//!
//! # Cache keys
//!
//! `key(-1) = sha256(v1, base digest)`, `key(n) = sha256(v1, key(n-1),
//! step n's canonical form, config after step n)`, where the canonical
//! form is what the step does after substitution: argv, environment, cwd
//! and user for `RUN`; destination, owner and for every entry its path,
//! type, mode, size and content sha256 (or symlink target) for `COPY`;
//! path and owner for `WORKDIR`. Host paths and mtimes are not part of
//! it, nor is the Dockerfile's layout (comments, line breaks).

mod copy_from;
mod instr;
#[cfg(test)]
mod stage_tests;
mod stages;
#[cfg(test)]
mod tests;

pub use copy_from::reshape_from;
pub use stages::{outline, plan_build, BuildPlan, Outline, StageFrom, StagePlan};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use forkvm_image::meta::{ImageConfig, StartSpec};
use sha2::{Digest, Sha256};

use crate::archive::{ArchiveSpec, EntryKind};
use crate::context::Context;
use crate::parse::{self, Instruction};
use crate::{hex, BuildError};

/// `PATH` for `RUN` when the image's environment has none (Docker's).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The resolved base image.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BaseImage {
    /// Its digest (`sha256:…`): the root of the cache key chain.
    pub digest: String,
    /// Its config: environment, working directory, user, … that the
    /// Dockerfile starts from.
    pub config: ImageConfig,
}

impl BaseImage {
    /// The base for `FROM scratch`.
    pub fn scratch() -> BaseImage {
        BaseImage {
            digest: "scratch".into(),
            config: ImageConfig::default(),
        }
    }
}

/// What to do, step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The `FROM` reference after substitution, or `scratch`.
    pub base: String,
    pub steps: Vec<Step>,
    /// The new image's config.
    pub final_config: ImageConfig,
    /// From `# forkvm:start` / `# forkvm:ready`.
    pub start: Option<StartSpec>,
    /// Things ignored, each naming its line.
    pub warnings: Vec<String>,
    /// Hex sha256 of the Dockerfile text (for `ImageSource::Build`).
    pub dockerfile_digest: String,
}

/// One unit of VM work; after it the daemon snapshots the sandbox under
/// `cache_key`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// 0-based position in [`Plan::steps`].
    pub index: usize,
    /// Dockerfile line the instruction starts on.
    pub line: usize,
    /// The instruction as written, whitespace collapsed: `RUN pip install x`.
    pub text: String,
    pub kind: StepKind,
    /// Hex sha256, chained from the base digest through every step.
    pub cache_key: String,
    /// The image config once this step is done.
    pub config_after: ImageConfig,
}

/// The VM work of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// Exec `argv` in the guest with exactly this environment, in `cwd`,
    /// as `user` (`None`: root).
    Run {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        user: Option<String>,
    },
    /// Extract the tar stream of `archive` at the absolute guest directory
    /// `dest` (created with its parents if missing); `owner` (`user`,
    /// `user:group`, ids) owns every extracted entry, else root.
    Copy {
        dest: String,
        owner: Option<String>,
        archive: ArchiveSpec,
    },
    /// `mkdir -p path` (the new directories owned by `owner`, else root).
    Mkdir { path: String, owner: Option<String> },
    /// `COPY --from=SOURCE`: each of `srcs` (absolute paths in the source's
    /// root filesystem) is fetched from a sandbox of the source and put at
    /// `dest` ([`reshape_from`] says where each entry goes). `source_key`
    /// is the source stage's last cache key, or the source image's digest.
    CopyFrom {
        source: CopySource,
        source_key: String,
        srcs: Vec<String>,
        dest: String,
        /// `dest` is a directory the sources go into (else the one source
        /// is named `dest`).
        into_dir: bool,
        owner: Option<String>,
        chmod: Option<u32>,
    },
}

/// Where `COPY --from` copies from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopySource {
    /// An earlier stage, by its 0-based index in the Dockerfile.
    Stage(usize),
    /// An image, by the reference as written (the daemon resolves it).
    Image(String),
}

/// The `FROM` reference (after global `ARG`s and `--build-arg`s), so the
/// daemon can resolve the base image before calling [`plan`].
pub fn base_reference(
    dockerfile: &str,
    build_args: &BTreeMap<String, String>,
) -> Result<String, BuildError> {
    let df = parse::parse(dockerfile)?;
    let mut p = Planner::new(df.escape, build_args);
    for ins in &df.instructions {
        if p.base.is_some() {
            break;
        }
        p.global(ins)?;
    }
    p.base.ok_or_else(no_from)
}

/// Plan a single-stage build of `dockerfile` with the context directory
/// `context` on top of `base` (which the daemon resolved from
/// [`base_reference`]; use [`BaseImage::scratch`] for `FROM scratch`).
/// A multi-stage Dockerfile needs [`outline`] and [`plan_build`].
pub fn plan(
    dockerfile: &str,
    context: &Path,
    build_args: &BTreeMap<String, String>,
    base: &BaseImage,
) -> Result<Plan, BuildError> {
    let o = outline(dockerfile, build_args, None)?;
    if o.stages > 1 {
        let line = parse::parse(dockerfile)?
            .instructions
            .iter()
            .filter(|i| i.keyword == "FROM")
            .nth(1)
            .map_or(1, |i| i.line);
        return Err(BuildError::at(
            line,
            "a second FROM (multi-stage build): plan it with plan_build",
        ));
    }
    // The FROM image only: a COPY --from image is plan_build's.
    let images = o
        .images
        .iter()
        .take(1)
        .map(|r| (r.clone(), base.clone()))
        .collect();
    let b = plan_build(dockerfile, context, build_args, None, &images)?;
    let base_ref = b.root_image().to_string();
    let t = b.stages.into_iter().next_back().ok_or_else(no_from)?;
    Ok(Plan {
        base: base_ref,
        steps: t.steps,
        final_config: t.config,
        start: b.start,
        warnings: b.warnings,
        dockerfile_digest: b.dockerfile_digest,
    })
}

fn no_from() -> BuildError {
    BuildError::at(1, "the Dockerfile has no FROM instruction")
}

/// Directories every Linux base image has: copying a single file to one
/// of them copies it into it (see the module docs).
const STANDARD_DIRS: &[&str] = &[
    "/bin",
    "/etc",
    "/home",
    "/lib",
    "/opt",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/tmp",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/local",
    "/usr/local/bin",
    "/usr/local/lib",
    "/usr/local/sbin",
    "/usr/local/share",
    "/usr/sbin",
    "/usr/share",
    "/var",
    "/var/lib",
    "/var/log",
    "/var/tmp",
];

pub(crate) struct Planner<'a> {
    escape: char,
    build_args: &'a BTreeMap<String, String>,
    used_args: BTreeSet<String>,
    /// `ARG`s before `FROM`.
    global_args: BTreeMap<String, Option<String>>,
    /// `ARG`s of the stage: `None` is declared without a value.
    args: BTreeMap<String, Option<String>>,
    base: Option<String>,
    config: ImageConfig,
    shell: Vec<String>,
    /// `CMD` appeared after `FROM` (so `ENTRYPOINT` keeps it).
    cmd_set: bool,
    known_dirs: BTreeSet<String>,
    prev_key: String,
    steps: Vec<Step>,
    warnings: Vec<String>,
    /// `FROM … AS name`, lower-cased as Docker does.
    stage_name: Option<String>,
    /// What `COPY --from` may name: the stages planned before this one and
    /// the images the daemon resolved.
    sources: stages::Sources,
}

impl<'a> Planner<'a> {
    fn new(escape: char, build_args: &'a BTreeMap<String, String>) -> Self {
        Planner {
            escape,
            build_args,
            used_args: BTreeSet::new(),
            global_args: BTreeMap::new(),
            args: BTreeMap::new(),
            base: None,
            config: ImageConfig::default(),
            shell: vec!["/bin/sh".into(), "-c".into()],
            cmd_set: false,
            known_dirs: BTreeSet::from(["/".to_string()]),
            prev_key: String::new(),
            steps: Vec::new(),
            warnings: Vec::new(),
            stage_name: None,
            sources: stages::Sources::default(),
        }
    }

    /// Variables for substitution: stage `ARG`s, overridden by `ENV`.
    fn vars(&self) -> BTreeMap<String, String> {
        let mut v: BTreeMap<String, String> = self
            .args
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect();
        v.extend(self.config.env_map());
        v
    }

    fn expand(&self, line: usize, word: &str) -> Result<String, BuildError> {
        let vars = self.vars();
        crate::words::expand(word, self.escape, &|n: &str| vars.get(n).cloned())
            .map_err(|e| BuildError::at(line, e))
    }

    /// Split into words and expand each.
    fn expand_words(&self, line: usize, args: &str) -> Result<Vec<String>, BuildError> {
        crate::words::split_words(args, self.escape)
            .map_err(|e| BuildError::at(line, e))?
            .iter()
            .map(|w| self.expand(line, w))
            .collect()
    }

    /// Substitute the global `ARG`s only (what `FROM` sees).
    fn expand_global(&self, line: usize, word: &str) -> Result<String, BuildError> {
        let globals: BTreeMap<String, String> = self
            .global_args
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect();
        crate::words::expand(word, self.escape, &|n: &str| globals.get(n).cloned())
            .map_err(|e| BuildError::at(line, e))
    }

    /// An instruction before (or being) `FROM`.
    fn global(&mut self, ins: &Instruction) -> Result<(), BuildError> {
        match ins.keyword.as_str() {
            "ARG" => {
                for (name, value) in self.arg_values(ins, false)? {
                    self.global_args.insert(name, value);
                }
                Ok(())
            }
            "FROM" => self.from(ins),
            _ => Err(BuildError::at(
                ins.line,
                format!(
                    "{} before FROM: a Dockerfile must start with FROM (only ARG may come before it)",
                    ins.keyword
                ),
            )),
        }
    }

    fn from(&mut self, ins: &Instruction) -> Result<(), BuildError> {
        let (flags, rest) = parse::take_flags(&ins.args);
        for f in flags {
            if f.name == "platform" {
                self.warnings.push(format!(
                    "line {}: FROM --platform ignored: forkvm builds for the host's architecture",
                    ins.line
                ));
            } else {
                return Err(BuildError::at(
                    ins.line,
                    format!("unknown FROM flag --{}", f.name),
                ));
            }
        }
        let globals: BTreeMap<String, String> = self
            .global_args
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect();
        let words = crate::words::split_words(rest, self.escape)
            .map_err(|e| BuildError::at(ins.line, e))?;
        let words: Vec<String> = words
            .iter()
            .map(|w| {
                crate::words::expand(w, self.escape, &|n: &str| globals.get(n).cloned())
                    .map_err(|e| BuildError::at(ins.line, e))
            })
            .collect::<Result<_, _>>()?;
        let image = match words.as_slice() {
            [image] => image,
            [image, as_, name] if as_.eq_ignore_ascii_case("as") => {
                stages::check_stage_name(ins.line, name)?;
                self.stage_name = Some(name.to_ascii_lowercase());
                image
            }
            _ => {
                return Err(BuildError::at(
                    ins.line,
                    "FROM takes an image reference and optionally AS name",
                ))
            }
        };
        if image.is_empty() {
            return Err(BuildError::at(
                ins.line,
                "FROM names an empty image reference",
            ));
        }
        self.base = Some(image.clone());
        Ok(())
    }

    /// `ARG a=1 b …` → (name, value in effect).
    fn arg_values(
        &mut self,
        ins: &Instruction,
        in_stage: bool,
    ) -> Result<Vec<(String, Option<String>)>, BuildError> {
        let words = crate::words::split_words(&ins.args, self.escape)
            .map_err(|e| BuildError::at(ins.line, e))?;
        if words.is_empty() {
            return Err(BuildError::at(ins.line, "ARG needs a name"));
        }
        let mut out = Vec::new();
        for w in words {
            let (name, default) = match w.split_once('=') {
                Some((n, d)) => (n.to_string(), Some(self.expand(ins.line, d)?)),
                None => (w.clone(), None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(BuildError::at(
                    ins.line,
                    format!("invalid ARG name {name:?}"),
                ));
            }
            let value = if let Some(v) = self.build_args.get(&name) {
                self.used_args.insert(name.clone());
                Some(v.clone())
            } else if default.is_some() {
                default
            } else if in_stage {
                self.global_args.get(&name).cloned().flatten()
            } else {
                None
            };
            out.push((name, value));
        }
        Ok(out)
    }

    /// An instruction after `FROM`.
    fn instruction(&mut self, ins: &Instruction, ctx: &Context) -> Result<(), BuildError> {
        let line = ins.line;
        match ins.keyword.as_str() {
            // Stages are split before planning (see `stages`).
            "FROM" => Err(BuildError::at(line, "FROM inside a stage")),
            "ARG" => {
                for (name, value) in self.arg_values(ins, true)? {
                    self.args.insert(name, value);
                }
                Ok(())
            }
            "RUN" => self.run(ins),
            "COPY" if copy_from::from_flag(ins).is_some() => {
                let kind = copy_from::plan(self, ins)?;
                self.push_step(ins, kind);
                Ok(())
            }
            "COPY" | "ADD" => self.copy(ins, ctx),
            "WORKDIR" => self.workdir(ins),
            "ENV" => {
                let pairs = instr::pairs(self, ins)?;
                for (k, v) in pairs {
                    instr::set_env(&mut self.config.env, &k, &v);
                }
                Ok(())
            }
            "LABEL" => {
                for (k, v) in instr::pairs(self, ins)? {
                    self.config.labels.insert(k, v);
                }
                Ok(())
            }
            "USER" => {
                let user = self.expand(line, &ins.args)?;
                if user.trim().is_empty() {
                    return Err(BuildError::at(line, "USER needs a user name or uid"));
                }
                self.config.user = Some(user.trim().to_string());
                Ok(())
            }
            "EXPOSE" => {
                let words = self.expand_words(line, &ins.args)?;
                instr::expose(line, &words, &mut self.config.exposed_ports)
            }
            "CMD" => {
                self.config.cmd = instr::command(self, ins, true)?;
                self.cmd_set = true;
                Ok(())
            }
            "ENTRYPOINT" => {
                self.config.entrypoint = instr::command(self, ins, true)?;
                if !self.cmd_set {
                    self.config.cmd.clear();
                }
                Ok(())
            }
            "SHELL" => match parse::json_form(&ins.args) {
                Some(v) if !v.is_empty() => {
                    self.shell = v;
                    Ok(())
                }
                _ => Err(BuildError::at(
                    line,
                    "SHELL needs a JSON array such as [\"/bin/bash\", \"-c\"]",
                )),
            },
            "MAINTAINER" | "STOPSIGNAL" | "HEALTHCHECK" | "VOLUME" | "ONBUILD" => {
                let why = match ins.keyword.as_str() {
                    "HEALTHCHECK" => "use `# forkvm:ready` for a readiness check",
                    "VOLUME" => "forkvm has no volumes; the path stays part of the root disk",
                    "ONBUILD" => "forkvm images do not carry ONBUILD triggers",
                    "STOPSIGNAL" => "sandboxes are stopped with their VM",
                    _ => "it is deprecated metadata",
                };
                self.warnings
                    .push(format!("line {line}: {} ignored: {why}", ins.keyword));
                Ok(())
            }
            other => Err(BuildError::at(line, format!("unknown instruction {other}"))),
        }
    }

    fn run(&mut self, ins: &Instruction) -> Result<(), BuildError> {
        let (flags, _) = parse::take_flags(&ins.args);
        if let Some(f) = flags.first() {
            return Err(BuildError::unsupported(
                ins.line,
                format!("RUN --{}", f.name),
                "remove the flag: RUN runs in the build sandbox with its network and disk",
            ));
        }
        let argv = instr::command(self, ins, false)?;
        let mut env: BTreeMap<String, String> = self
            .args
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect();
        env.extend(self.config.env_map());
        env.entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.to_string());
        let kind = StepKind::Run {
            argv,
            env,
            cwd: self.cwd(),
            user: self.config.user.clone(),
        };
        self.push_step(ins, kind);
        Ok(())
    }

    fn cwd(&self) -> String {
        self.config
            .working_dir
            .clone()
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "/".into())
    }

    fn workdir(&mut self, ins: &Instruction) -> Result<(), BuildError> {
        let raw = self.expand(ins.line, &ins.args)?;
        if raw.trim().is_empty() {
            return Err(BuildError::at(ins.line, "WORKDIR needs a path"));
        }
        let path = instr::absolute(&self.cwd(), raw.trim());
        self.config.working_dir = Some(path.clone());
        if !self.known_dirs.contains(&path) {
            self.know_dir(&path);
            let kind = StepKind::Mkdir {
                path,
                owner: self.config.user.clone(),
            };
            self.push_step(ins, kind);
        }
        Ok(())
    }

    /// Remember a directory (and its parents) as existing in the guest.
    fn know_dir(&mut self, path: &str) {
        let mut p = path.to_string();
        while p != "/" && !p.is_empty() {
            self.known_dirs.insert(p.clone());
            p = instr::parent(&p);
        }
    }

    fn copy(&mut self, ins: &Instruction, ctx: &Context) -> Result<(), BuildError> {
        let c = instr::copy_plan(self, ins, ctx)?;
        self.know_dir(&c.dest);
        for e in &c.archive.entries {
            if matches!(e.kind, EntryKind::Dir { .. }) {
                let d = instr::absolute(&c.dest, &e.path);
                self.know_dir(&d);
            }
        }
        let kind = StepKind::Copy {
            dest: c.dest,
            owner: c.owner,
            archive: c.archive,
        };
        self.push_step(ins, kind);
        Ok(())
    }

    fn push_step(&mut self, ins: &Instruction, kind: StepKind) {
        let mut k = KeyHasher::new("forkvm-build/step/v1");
        k.put(&self.prev_key);
        instr::canonical(&kind, &mut k);
        // ImageConfig serializes deterministically (fields in order,
        // BTreeMap labels).
        k.put(&serde_json::to_string(&self.config).unwrap_or_default());
        let cache_key = k.finish();
        self.prev_key = cache_key.clone();
        self.steps.push(Step {
            index: self.steps.len(),
            line: ins.line,
            text: ins.display(),
            kind,
            cache_key,
            config_after: self.config.clone(),
        });
    }
}

/// sha256 over length-prefixed fields, so no two field lists hash alike.
pub(crate) struct KeyHasher(Sha256);

impl KeyHasher {
    fn new(domain: &str) -> Self {
        let mut k = KeyHasher(Sha256::new());
        k.put(domain);
        k
    }

    pub(crate) fn put(&mut self, s: &str) {
        self.0.update((s.len() as u64).to_le_bytes());
        self.0.update(s.as_bytes());
    }

    fn finish(self) -> String {
        hex(&self.0.finalize())
    }
}
