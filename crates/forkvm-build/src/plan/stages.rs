//! Multi-stage builds: `FROM image AS name`, `FROM name`, `COPY
//! --from=name|index|image` and the `--target` stage.
//!
//! The Dockerfile is cut at each `FROM` into stages. Only the target stage
//! (the last one, or the one `--target` names) and the stages it needs,
//! through `FROM` or `COPY --from`, are planned and built, as BuildKit
//! does; the others are skipped unread. A stage `FROM` an earlier stage
//! starts from that stage's last step: its config, shell, cache key and
//! known directories. Stage names are compared lower-cased; a name that is
//! no earlier stage's is an image reference.
//!
//! [`outline`] reads the stages without the context, so the daemon can
//! resolve or pull every image they name first; [`plan_build`] then plans
//! the stages in Dockerfile order. The image is the target stage's last
//! step; the others are only sources.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use forkvm_image::meta::{ImageConfig, StartSpec};
use sha2::{Digest, Sha256};

use super::{copy_from, instr, BaseImage, KeyHasher, Planner, Step, STANDARD_DIRS};
use crate::context::Context;
use crate::parse::{self, Instruction};
use crate::{hex, BuildError};

/// A stage planned before the current one, as later stages see it.
#[derive(Debug, Clone, Default)]
pub(crate) struct DoneStage {
    pub name: Option<String>,
    pub final_key: String,
    pub config: ImageConfig,
    pub shell: Vec<String>,
    pub known_dirs: BTreeSet<String>,
}

/// What `FROM` and `COPY --from` may name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sources {
    /// Every stage before the current one, by index (`None`: skipped, not
    /// needed by the target).
    pub stages: Vec<Option<DoneStage>>,
    pub images: BTreeMap<String, BaseImage>,
}

impl Sources {
    /// The earlier stage a `FROM` or `--from` value names: its index or
    /// its name.
    pub fn stage(&self, r: &str) -> Option<usize> {
        let lower = r.to_ascii_lowercase();
        if let Ok(i) = r.parse::<usize>() {
            return (i < self.stages.len()).then_some(i);
        }
        self.stages
            .iter()
            .position(|s| s.as_ref().and_then(|s| s.name.as_deref()) == Some(lower.as_str()))
    }
}

/// Docker's rule for stage names: a letter, then letters, digits, `-`,
/// `_` and `.`.
pub(crate) fn check_stage_name(line: usize, name: &str) -> Result<(), BuildError> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(BuildError::at(
            line,
            format!("invalid stage name {name:?}: start with a letter; then letters, digits, '-', '_' or '.'"),
        ))
    }
}

/// What a stage starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageFrom {
    /// An image reference (after substitution), resolved by the daemon.
    Image(String),
    /// An earlier stage, by index.
    Stage(usize),
}

/// The stages of a Dockerfile, read without the context.
#[derive(Debug, Clone, PartialEq)]
pub struct Outline {
    /// Every image the needed stages name (in `FROM` or `COPY --from`), in
    /// order of appearance, without repeats; `scratch` included if named.
    pub images: Vec<String>,
    /// The number of stages in the file.
    pub stages: usize,
    /// The target stage's index.
    pub target: usize,
}

/// One planned stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlan {
    /// 0-based position among the Dockerfile's stages.
    pub index: usize,
    pub name: Option<String>,
    pub from: StageFrom,
    pub steps: Vec<Step>,
    /// The config after the stage's last instruction.
    pub config: ImageConfig,
    /// The last step's cache key (the base's when there is no step).
    pub final_key: String,
}

/// A whole build: the needed stages in order, the target last.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildPlan {
    pub stages: Vec<StagePlan>,
    /// From `# forkvm:start` / `# forkvm:ready`, against the target's
    /// config.
    pub start: Option<StartSpec>,
    pub warnings: Vec<String>,
    /// Hex sha256 of the Dockerfile text.
    pub dockerfile_digest: String,
}

impl BuildPlan {
    /// The target stage.
    pub fn target(&self) -> &StagePlan {
        self.stages.last().expect("a plan has its target stage")
    }

    /// The image the target stage builds on, through `FROM` stages.
    pub fn root_image(&self) -> &str {
        let mut s = self.target();
        loop {
            match &s.from {
                StageFrom::Image(r) => return r,
                StageFrom::Stage(i) => match self.stages.iter().find(|x| x.index == *i) {
                    Some(x) => s = x,
                    None => return "",
                },
            }
        }
    }
}

/// A Dockerfile cut into its global part and its stages.
struct Split<'d> {
    globals: Vec<&'d Instruction>,
    stages: Vec<(&'d Instruction, Vec<&'d Instruction>)>,
}

fn split(df: &parse::Dockerfile) -> Result<Split<'_>, BuildError> {
    let mut out = Split {
        globals: Vec::new(),
        stages: Vec::new(),
    };
    for ins in &df.instructions {
        if ins.keyword == "FROM" {
            out.stages.push((ins, Vec::new()));
        } else if let Some((_, body)) = out.stages.last_mut() {
            body.push(ins);
        } else {
            out.globals.push(ins);
        }
    }
    if out.stages.is_empty() {
        return Err(super::no_from());
    }
    Ok(out)
}

/// The global `ARG`s, as a planner that has read them.
fn globals<'a>(
    df: &parse::Dockerfile,
    sp: &Split<'_>,
    build_args: &'a BTreeMap<String, String>,
) -> Result<Planner<'a>, BuildError> {
    let mut g = Planner::new(df.escape, build_args);
    for ins in &sp.globals {
        g.global(ins)?;
    }
    Ok(g)
}

/// Each stage's (name, FROM reference) after global substitution.
fn headers(g: &Planner<'_>, sp: &Split<'_>) -> Result<Vec<(Option<String>, String)>, BuildError> {
    let mut out = Vec::new();
    for (from, _) in &sp.stages {
        let mut p = Planner::new(g.escape, g.build_args);
        p.global_args = g.global_args.clone();
        p.from(from)?;
        out.push((p.stage_name.clone(), p.base.clone().unwrap_or_default()));
    }
    Ok(out)
}

/// The stage `--target` names, or the last.
fn target_index(
    heads: &[(Option<String>, String)],
    target: Option<&str>,
) -> Result<usize, BuildError> {
    let Some(t) = target else {
        return Ok(heads.len() - 1);
    };
    let lower = t.to_ascii_lowercase();
    heads
        .iter()
        .position(|(n, _)| n.as_deref() == Some(lower.as_str()))
        .ok_or_else(|| {
            let names: Vec<&str> = heads.iter().filter_map(|(n, _)| n.as_deref()).collect();
            BuildError::at(
                1,
                format!(
                    "target stage {t:?} is not in the Dockerfile (its named stages: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            )
        })
}

/// The earlier stage `r` names, by the names of `heads[..before]`.
fn stage_ref(heads: &[(Option<String>, String)], before: usize, r: &str) -> Option<usize> {
    if let Ok(i) = r.parse::<usize>() {
        return (i < before).then_some(i);
    }
    let lower = r.to_ascii_lowercase();
    heads[..before]
        .iter()
        .position(|(n, _)| n.as_deref() == Some(lower.as_str()))
}

/// Which stages the target needs (itself included), and the images they
/// name, in order.
fn needed(
    g: &Planner<'_>,
    sp: &Split<'_>,
    heads: &[(Option<String>, String)],
    target: usize,
) -> Result<(BTreeSet<usize>, Vec<String>), BuildError> {
    let mut need = BTreeSet::from([target]);
    // Later stages only name earlier ones: one pass from the target down.
    for i in (0..=target).rev() {
        if !need.contains(&i) {
            continue;
        }
        if let Some(j) = stage_ref(heads, i, &heads[i].1) {
            need.insert(j);
        }
        for ins in &sp.stages[i].1 {
            if let Some(v) = copy_from::from_flag(ins) {
                let v = g.expand_global(ins.line, &v)?;
                if let Some(j) = stage_ref(heads, i, &v) {
                    need.insert(j);
                }
            }
        }
    }
    let mut images = Vec::new();
    let mut add = |r: String| {
        if !images.contains(&r) {
            images.push(r);
        }
    };
    for &i in &need {
        if stage_ref(heads, i, &heads[i].1).is_none() {
            add(heads[i].1.clone());
        }
        for ins in &sp.stages[i].1 {
            if let Some(v) = copy_from::from_flag(ins) {
                let v = g.expand_global(ins.line, &v)?;
                if stage_ref(heads, i, &v).is_none() {
                    add(v);
                }
            }
        }
    }
    Ok((need, images))
}

/// Read the stages: the images to resolve before [`plan_build`].
pub fn outline(
    dockerfile: &str,
    build_args: &BTreeMap<String, String>,
    target: Option<&str>,
) -> Result<Outline, BuildError> {
    let df = parse::parse(dockerfile)?;
    let sp = split(&df)?;
    let g = globals(&df, &sp, build_args)?;
    let heads = headers(&g, &sp)?;
    let t = target_index(&heads, target)?;
    let (_, images) = needed(&g, &sp, &heads, t)?;
    Ok(Outline {
        images,
        stages: heads.len(),
        target: t,
    })
}

/// The key a stage built on `image` starts from.
pub(crate) fn base_key(digest: &str) -> String {
    let mut k = KeyHasher::new("forkvm-build/base/v1");
    k.put(digest);
    k.finish()
}

/// Plan the stages the target needs, on the images the daemon resolved
/// (every reference of [`Outline::images`]).
pub fn plan_build(
    dockerfile: &str,
    context: &Path,
    build_args: &BTreeMap<String, String>,
    target: Option<&str>,
    images: &BTreeMap<String, BaseImage>,
) -> Result<BuildPlan, BuildError> {
    let df = parse::parse(dockerfile)?;
    let sp = split(&df)?;
    let g = globals(&df, &sp, build_args)?;
    let heads = headers(&g, &sp)?;
    let t = target_index(&heads, target)?;
    let (need, _) = needed(&g, &sp, &heads, t)?;
    let ctx = Context::open(context)?;
    let mut warnings = df.warnings.clone();
    let mut used_args = g.used_args.clone();
    let mut sources = Sources {
        stages: Vec::new(),
        images: images.clone(),
    };
    let mut plans = Vec::new();
    let mut start = None;
    for (i, (from_ins, body)) in sp.stages.iter().enumerate() {
        if !need.contains(&i) {
            sources.stages.push(None);
            continue;
        }
        let mut p = Planner::new(df.escape, build_args);
        p.global_args = g.global_args.clone();
        p.from(from_ins)?;
        let base_ref = p.base.clone().unwrap_or_default();
        let from = match stage_ref(&heads, i, &base_ref) {
            Some(j) => {
                let d = sources.stages[j].clone().ok_or_else(|| {
                    BuildError::at(from_ins.line, format!("stage {j} was not planned"))
                })?;
                p.config = d.config;
                p.shell = d.shell;
                p.known_dirs = d.known_dirs;
                p.prev_key = d.final_key;
                StageFrom::Stage(j)
            }
            None => {
                let b = images.get(&base_ref).ok_or_else(|| {
                    BuildError::at(
                        from_ins.line,
                        format!("the image {base_ref:?} was not resolved"),
                    )
                })?;
                p.config = b.config.clone();
                p.prev_key = base_key(&b.digest);
                if base_ref != "scratch" {
                    p.known_dirs
                        .extend(STANDARD_DIRS.iter().map(|d| d.to_string()));
                }
                StageFrom::Image(base_ref)
            }
        };
        p.sources = sources.clone();
        for ins in body {
            p.instruction(ins, &ctx)?;
        }
        if i == t {
            start = instr::start_spec(&df.forkvm, &p.config, &p.shell)?;
        }
        used_args.extend(p.used_args.iter().cloned());
        warnings.append(&mut p.warnings);
        sources.stages.push(Some(DoneStage {
            name: p.stage_name.clone(),
            final_key: p.prev_key.clone(),
            config: p.config.clone(),
            shell: p.shell.clone(),
            known_dirs: p.known_dirs.clone(),
        }));
        plans.push(StagePlan {
            index: i,
            name: p.stage_name.clone(),
            from,
            steps: p.steps,
            config: p.config,
            final_key: p.prev_key,
        });
    }
    let unused: Vec<&str> = build_args
        .keys()
        .filter(|k| !used_args.contains(*k))
        .map(String::as_str)
        .collect();
    if !unused.is_empty() {
        warnings.push(format!(
            "build arguments not declared by any ARG were not used: {}",
            unused.join(", ")
        ));
    }
    let skipped = heads.len() - plans.len();
    if skipped > 0 {
        warnings.push(format!(
            "{skipped} stage(s) not needed by the target were skipped"
        ));
    }
    Ok(BuildPlan {
        stages: plans,
        start,
        warnings,
        dockerfile_digest: hex(&Sha256::digest(dockerfile.as_bytes())),
    })
}
