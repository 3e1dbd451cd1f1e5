//! The `diff` and `merge` tools (docs/mcp.md): their arguments, checks,
//! results and the calls they make, kept apart from [`crate::tools`] so each
//! file stays readable.
//!
//! A model pays for every token of a result, and a diff of a whole tree can
//! list thousands of paths. So a result always has the counts; it lists at
//! most `limit` changes (default [`DEFAULT_LIMIT`]), and when there are more
//! it counts them by directory, so the model can call again with a narrower
//! `path`. Unified diffs come only when asked for (`patches`), and all of
//! them together are held to [`PATCH_BUDGET`] bytes. A merge lists its
//! changes and conflicts the same way.

use forkvm_api::{
    ChangeKind, Conflict, Diff, DiffRequest, MergeRequest, MergeStrategy, Merged, PathChange,
    PathState,
};
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::{invalid, names, need_id};
use crate::{failed, structured, Backend, BackendError};

/// Changes a result lists when `limit` is not given.
pub const DEFAULT_LIMIT: u32 = 50;
/// The most `limit` may ask for.
pub const MAX_LIMIT: u32 = 1000;
/// Bytes of unified diff one result carries at most, all patches together.
pub const PATCH_BUDGET: usize = 24 * 1024;
/// Directories a summary of the unlisted changes names at most.
const DIRS: usize = 20;

// ---------------------------------------------------------------- arguments

/// Arguments of `diff`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffArgs {
    /// One side: a sandbox id, or a snapshot or checkpoint (id or tag).
    pub a: String,
    /// The other side, as `a`; changes say what `b` has compared to `a`.
    pub b: String,
    /// Only paths under this absolute directory, e.g. /root/project
    /// (default /, without /proc, /sys, /dev and /run).
    #[serde(default)]
    pub path: Option<String>,
    /// Also return a unified diff of each changed text file (default
    /// false). Ask for it with a narrow `path`: patches are cut at 24 KiB
    /// in all.
    #[serde(default)]
    pub patches: bool,
    /// List at most this many changes (default 50, at most 1000); the rest
    /// are counted by directory.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// How `merge` settles conflicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Keep the version of the sandbox merged into.
    Ours,
    /// Take the version of the sandbox merged from.
    Theirs,
    /// Merge text files line by line; overlapping edits stay conflicts.
    Text,
}

/// Arguments of `merge`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeArgs {
    /// The sandbox whose file changes to apply: a branch child (it must
    /// have been branched or created from a snapshot).
    pub sandbox_id: String,
    /// The running sandbox to change, usually the one it was branched from.
    pub into: String,
    /// Only paths under this absolute directory (default /).
    #[serde(default)]
    pub path: Option<String>,
    /// How to settle paths both changed differently. Without one, any such
    /// conflict refuses the whole merge and nothing changes.
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// Only report what would be applied and every conflict; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

// ------------------------------------------------------------------ results

/// One changed path.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ChangeOut {
    pub path: String,
    /// added, deleted, modified, mode (permission bits only) or type (e.g.
    /// a file became a directory).
    pub change: String,
    /// What the first side has there, e.g. "file 120 B mode 644".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// What the second side has there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// A unified diff (with `patches`, text files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

/// How many of the changes not listed are under a directory.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct DirCountOut {
    pub dir: String,
    pub changes: u64,
}

/// A diff.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct DiffOut {
    pub a: String,
    pub b: String,
    pub path: String,
    /// Every change, listed or not.
    pub total: u64,
    pub added: u64,
    pub deleted: u64,
    pub modified: u64,
    /// Mode and type changes.
    pub other: u64,
    /// The first `limit` changes, sorted by path.
    pub changes: Vec<ChangeOut>,
    /// Changes not listed (call again with a narrower path).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_listed: u64,
    /// Where the changes not listed are, most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_listed_by_dir: Vec<DirCountOut>,
    /// Patches left out or cut to keep the result small.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub patches_cut: u64,
    pub diff_ms: f64,
}

/// A merge conflict.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ConflictOut {
    pub path: String,
    /// Why it is one.
    pub reason: String,
}

/// A merge done (or, with dry_run, planned).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct MergedOut {
    /// The sandbox merged from.
    pub sandbox_id: String,
    pub into: String,
    /// The branch point both descend from.
    pub base: String,
    pub dry_run: bool,
    /// How many changes were applied (with dry_run: would be).
    pub applied: u64,
    /// The first of them.
    pub changes: Vec<ChangeOut>,
    /// Conflicts the strategy settled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settled: Vec<ConflictOut>,
    /// With dry_run: the conflicts a merge without a strategy would stop at.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<ConflictOut>,
    /// Entries of `changes`, `settled` and `conflicts` left out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_listed: u64,
    pub merge_ms: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// ---------------------------------------------------------------- checking

fn absolute(tool: &str, path: &Option<String>) -> Result<(), ErrorData> {
    match path.as_deref() {
        Some(p) if !p.starts_with('/') => Err(invalid(
            tool,
            format!("path {p:?} is not absolute; give a directory such as /root/project"),
        )),
        _ => Ok(()),
    }
}

/// `diff`'s request and how many changes to list.
pub fn diff_request(a: &DiffArgs) -> Result<(DiffRequest, usize), ErrorData> {
    let t = names::DIFF;
    for (what, v) in [("a", &a.a), ("b", &a.b)] {
        if v.trim().is_empty() {
            return Err(invalid(
                t,
                format!(
                    "{what} is empty; give a sandbox id, or a snapshot or checkpoint id or tag"
                ),
            ));
        }
    }
    absolute(t, &a.path)?;
    let limit = a.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(invalid(
            t,
            format!("limit must be 1 to {MAX_LIMIT}; narrow path to see fewer changes"),
        ));
    }
    let req = DiffRequest {
        b: a.b.clone(),
        path: a.path.clone(),
        text: a.patches,
    };
    Ok((req, limit as usize))
}

/// `merge`'s request.
pub fn merge_request(a: &MergeArgs) -> Result<MergeRequest, ErrorData> {
    let t = names::MERGE;
    need_id(t, &a.sandbox_id)?;
    if a.into.trim().is_empty() {
        return Err(invalid(
            t,
            "into is empty; give the id of the running sandbox to change",
        ));
    }
    if a.into == a.sandbox_id {
        return Err(invalid(
            t,
            "into is sandbox_id itself; merge a branch child into the sandbox it was branched from",
        ));
    }
    absolute(t, &a.path)?;
    Ok(MergeRequest {
        into: a.into.clone(),
        path: a.path.clone(),
        strategy: a.strategy.map(|s| match s {
            Strategy::Ours => MergeStrategy::Ours,
            Strategy::Theirs => MergeStrategy::Theirs,
            Strategy::Text => MergeStrategy::Text,
        }),
        dry_run: a.dry_run,
    })
}

// --------------------------------------------------------------- rendering

fn kind_word(k: ChangeKind) -> &'static str {
    match k {
        ChangeKind::Added => "added",
        ChangeKind::Deleted => "deleted",
        ChangeKind::Modified => "modified",
        ChangeKind::Mode => "mode",
        ChangeKind::Type => "type",
    }
}

/// `docker diff`'s letters, as `forkvm diff` prints them.
fn letter(k: ChangeKind) -> char {
    match k {
        ChangeKind::Added => 'A',
        ChangeKind::Deleted => 'D',
        ChangeKind::Modified => 'C',
        ChangeKind::Mode => 'M',
        ChangeKind::Type => 'T',
    }
}

/// What a side has at a path, in a few words: `file 120 B mode 644`.
pub fn state_words(s: &PathState) -> String {
    match (&s.symlink_target, s.kind.as_str()) {
        (Some(t), _) => format!("symlink -> {t}"),
        (None, "dir") => format!("dir mode {:o}", s.mode),
        (None, k) => format!("{k} {} B mode {:o}", s.size, s.mode),
    }
}

fn change_out(c: &PathChange) -> ChangeOut {
    ChangeOut {
        path: c.path.clone(),
        change: kind_word(c.change).into(),
        before: c.a.as_ref().map(state_words),
        after: c.b.as_ref().map(state_words),
        patch: None,
    }
}

fn change_line(c: &PathChange) -> String {
    let what = match (&c.a, &c.b) {
        (Some(a), Some(b)) => format!("{} -> {}", state_words(a), state_words(b)),
        (Some(s), None) | (None, Some(s)) => state_words(s),
        (None, None) => String::new(),
    };
    format!("{} {}  ({what})", letter(c.change), c.path)
}

/// The directory one level below `root` that holds `path` (`root` itself
/// for an entry directly in it).
fn dir_under(root: &str, path: &str) -> String {
    let base = root.trim_end_matches('/');
    let rest = path
        .strip_prefix(base)
        .unwrap_or(path)
        .trim_start_matches('/');
    match rest.split_once('/') {
        Some((first, _)) => format!("{base}/{first}"),
        None if base.is_empty() => "/".into(),
        None => base.into(),
    }
}

/// Counts of `paths` by [`dir_under`], most first, at most [`DIRS`].
fn by_dir<'a>(root: &str, paths: impl Iterator<Item = &'a str>) -> Vec<DirCountOut> {
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for p in paths {
        *counts.entry(dir_under(root, p)).or_default() += 1;
    }
    let mut v: Vec<_> = counts
        .into_iter()
        .map(|(dir, changes)| DirCountOut { dir, changes })
        .collect();
    v.sort_by(|x, y| y.changes.cmp(&x.changes).then(x.dir.cmp(&y.dir)));
    v.truncate(DIRS);
    v
}

/// `p` cut to at most `n` bytes, at a line end where there is one.
fn cut(p: &str, n: usize) -> &str {
    let mut end = n.min(p.len());
    while !p.is_char_boundary(end) {
        end -= 1;
    }
    match p[..end].rfind('\n') {
        Some(i) => &p[..=i],
        None => &p[..end],
    }
}

/// A diff as the tool shows it: its structure, and its text (a summary
/// line, one line a listed change, the unlisted ones by directory, then the
/// patches).
pub fn diff_out(d: &Diff, limit: usize) -> (DiffOut, String) {
    let listed = &d.changes[..d.changes.len().min(limit)];
    let mut changes: Vec<ChangeOut> = listed.iter().map(change_out).collect();
    let mut budget = PATCH_BUDGET;
    let mut patches_cut = 0u64;
    let mut patch_text = String::new();
    for (out, c) in changes.iter_mut().zip(listed) {
        let Some(p) = c.patch.as_deref() else {
            continue;
        };
        if budget == 0 {
            patches_cut += 1;
            continue;
        }
        let kept = if p.len() <= budget {
            p.to_string()
        } else {
            patches_cut += 1;
            let head = cut(p, budget);
            format!(
                "{head}… cut: {} more bytes (diff this file's directory alone to see it whole)\n",
                p.len() - head.len()
            )
        };
        budget = budget.saturating_sub(p.len());
        patch_text.push_str(&format!("--- {}\n{kept}", c.path));
        if !kept.ends_with('\n') {
            patch_text.push('\n');
        }
        out.patch = Some(kept);
    }
    // Patches of changes not listed were read but are not shown.
    patches_cut += d.changes[listed.len()..]
        .iter()
        .filter(|c| c.patch.is_some())
        .count() as u64;
    let rest = &d.changes[listed.len()..];
    let out = DiffOut {
        a: d.a.clone(),
        b: d.b.clone(),
        path: d.path.clone(),
        total: d.changes.len() as u64,
        added: d.stats.added,
        deleted: d.stats.deleted,
        modified: d.stats.modified,
        other: d.stats.other,
        changes,
        not_listed: rest.len() as u64,
        not_listed_by_dir: by_dir(&d.path, rest.iter().map(|c| c.path.as_str())),
        patches_cut,
        diff_ms: d.diff_ms,
    };
    let mut text = if out.total == 0 {
        format!(
            "no differences between {} and {} under {} ({} entries compared, {} ms)\n",
            out.a, out.b, out.path, d.entries, out.diff_ms as u64
        )
    } else {
        format!(
            "{} -> {} under {}: {} changes ({} added, {} deleted, {} modified, {} mode or type); \
             {} entries compared, {} ms\n",
            out.a,
            out.b,
            out.path,
            out.total,
            out.added,
            out.deleted,
            out.modified,
            out.other,
            d.entries,
            out.diff_ms as u64
        )
    };
    for c in listed {
        text.push_str(&change_line(c));
        text.push('\n');
    }
    if out.not_listed > 0 {
        let dirs: Vec<String> = out
            .not_listed_by_dir
            .iter()
            .map(|x| format!("{} {}", x.dir, x.changes))
            .collect();
        text.push_str(&format!(
            "… {} more changes not listed, by directory: {}; call diff with one of them as path \
             (or a larger limit) to list them\n",
            out.not_listed,
            dirs.join(", ")
        ));
    }
    if !patch_text.is_empty() {
        text.push('\n');
        text.push_str(&patch_text);
    }
    if out.patches_cut > 0 {
        text.push_str(&format!(
            "({} patches left out or cut to keep this short; diff a narrower path for them)\n",
            out.patches_cut
        ));
    }
    (out, text)
}

fn conflict_out(c: &Conflict) -> ConflictOut {
    ConflictOut {
        path: c.path.clone(),
        reason: c.reason.clone(),
    }
}

/// A merge as the tool shows it, each list held to `limit` entries.
pub fn merged_out(m: &Merged, limit: usize) -> (MergedOut, String) {
    let take = |n: usize| n.min(limit);
    let not_listed = (m.applied.len() - take(m.applied.len()))
        + (m.settled.len() - take(m.settled.len()))
        + (m.conflicts.len() - take(m.conflicts.len()));
    let out = MergedOut {
        sandbox_id: m.child.clone(),
        into: m.into.clone(),
        base: m.base.clone(),
        dry_run: m.dry_run,
        applied: m.applied.len() as u64,
        changes: m.applied.iter().take(limit).map(change_out).collect(),
        settled: m.settled.iter().take(limit).map(conflict_out).collect(),
        conflicts: m.conflicts.iter().take(limit).map(conflict_out).collect(),
        not_listed: not_listed as u64,
        merge_ms: m.merge_ms,
    };
    let mut text = if m.dry_run {
        format!(
            "dry run (nothing changed): merging {} into {} (branch point {}) would apply {} \
             changes; {} conflicts settled by the strategy, {} left\n",
            out.sandbox_id,
            out.into,
            out.base,
            out.applied,
            m.settled.len(),
            m.conflicts.len()
        )
    } else {
        format!(
            "merged {} into {} (branch point {}): {} changes applied, {} conflicts settled, \
             {} ms. Only files were merged: processes running in {} keep what they had read \
             (restart them to see the new files)\n",
            out.sandbox_id,
            out.into,
            out.base,
            out.applied,
            m.settled.len(),
            out.merge_ms as u64,
            out.into
        )
    };
    for c in m.applied.iter().take(limit) {
        text.push_str(&change_line(c));
        text.push('\n');
    }
    for (title, list) in [("settled", &out.settled), ("conflict", &out.conflicts)] {
        for c in list {
            text.push_str(&format!("{title}: {} ({})\n", c.path, c.reason));
        }
    }
    if not_listed > 0 {
        text.push_str(&format!(
            "… {not_listed} more not listed; narrow path to see them\n"
        ));
    }
    if m.dry_run && !m.conflicts.is_empty() {
        text.push_str(
            "to merge anyway, call merge with strategy \"ours\" (keep into's version), \
             \"theirs\" (take sandbox_id's) or \"text\" (merge text files line by line)\n",
        );
    }
    (out, text)
}

/// A merge the daemon refused for its conflicts (409), as a tool error that
/// says nothing changed and how to go on; other failures as usual.
fn merge_failed(e: BackendError) -> CallToolResult {
    if e.status == 409 && e.message.contains("conflict(s)") {
        return CallToolResult::error(vec![ContentBlock::text(format!(
            "merge refused, nothing was changed: {} [conflict]. What to do: call merge with \
             dry_run true to list every conflict, then with strategy \"ours\" (keep into's \
             version), \"theirs\" (take sandbox_id's) or \"text\" (merge text files line by \
             line), or narrow path.",
            e.message.trim_end_matches('.')
        ))]);
    }
    failed(names::MERGE, e)
}

// ------------------------------------------------------------------- calls

/// The `diff` tool.
pub async fn diff<B: Backend>(
    b: &B,
    args: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<CallToolResult, ErrorData> {
    let name = names::DIFF;
    let a: DiffArgs = crate::tools::parse(name, args)?;
    let (req, limit) = diff_request(&a)?;
    Ok(match b.diff(a.a, req).await {
        Ok(d) => {
            let (out, text) = diff_out(&d, limit);
            structured(&out, text)
        }
        Err(e) => failed(name, e),
    })
}

/// The `merge` tool.
pub async fn merge<B: Backend>(
    b: &B,
    args: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<CallToolResult, ErrorData> {
    let a: MergeArgs = crate::tools::parse(names::MERGE, args)?;
    let req = merge_request(&a)?;
    Ok(match b.merge(a.sandbox_id, req).await {
        Ok(m) => {
            let (out, text) = merged_out(&m, DEFAULT_LIMIT as usize);
            structured(&out, text)
        }
        Err(e) => merge_failed(e),
    })
}

#[cfg(test)]
#[path = "treediff_tests.rs"]
mod tests;
