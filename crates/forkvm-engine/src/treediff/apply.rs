//! `forkvm merge CHILD --into TARGET`: plan (super::merge), then apply to
//! the target all or nothing.
//!
//! Applying, in the target's guest:
//! 1. **Stage.** Everything the plan puts is unpacked from one archive
//!    under staging names beside its destination
//!    (`<dir>/.forkvm-merge-<token>-<n>`), so each later rename stays within
//!    its directory and filesystem. A new directory is staged whole, with
//!    what it holds. A failure here removes the staged names: the target
//!    saw nothing.
//! 2. **Commit.** What is replaced or deleted is first renamed aside
//!    (`…-b<n>`), then each staged entry is renamed into place. Every step
//!    is one rename(2). A failure undoes the renames done so far, in
//!    reverse, and the target is as it was.
//! 3. **Clean up.** The entries set aside are removed.
//!
//! A process in the target that reads during the commit can see some paths
//! already merged and others not (renames are atomic one by one, not as a
//! set); one that holds a replaced file open keeps reading the old one.
//! Memory is not merged: the target's processes keep running with what
//! they had, and see the new files only when they read them again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::tar::{Meta, Writer};
use forkvm_api::{MergeRequest, Merged};

use super::compare::{under, Tree};
use super::merge::{self, Action, Contents};
use super::{root_of, Side};
use crate::agent::AgentConn;
use crate::error::{agent_error, EngineError, ErrorKind};
use crate::manager::Manager;
use crate::util::ms;

/// How long one archive or rename may take.
const STEP: Duration = Duration::from_secs(120);

fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &p[..i],
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// One rename done in the commit, to undo.
struct Moved {
    from: String,
    to: String,
}

impl Manager {
    /// Merge `child`'s changes since its branch point into `req.into`.
    pub async fn merge(
        self: &Arc<Self>,
        child: &str,
        req: MergeRequest,
    ) -> Result<Merged, EngineError> {
        let r = self.merge_unlogged(child, req).await;
        if let Err(e) = &r {
            tracing::warn!(sandbox = %child, code = e.code(), "merge of sandbox {child} failed: {}", e.message);
        }
        r
    }

    async fn merge_unlogged(
        self: &Arc<Self>,
        child: &str,
        req: MergeRequest,
    ) -> Result<Merged, EngineError> {
        let t0 = Instant::now();
        let root = root_of(req.path.as_deref())?;
        let crow = self
            .db
            .get(child)?
            .ok_or_else(|| EngineError::sandbox_not_found(child))?;
        let base_id = self.branch_point_of(&crow).ok_or_else(|| {
            EngineError::invalid(format!(
                "sandbox {child} was booted, not branched from a snapshot: it has no branch \
                 point to merge from"
            ))
        })?;
        if req.into == child {
            return Err(EngineError::invalid(
                "a sandbox cannot be merged into itself",
            ));
        }
        let mut ours = self.side(&req.into)?;
        let Some(target) = ours.running.clone() else {
            return Err(EngineError::conflict(format!(
                "sandbox {} is not running; a merge changes a running sandbox (resume it first)",
                req.into
            )));
        };
        let mut theirs = self.side(child)?;
        let mut base = self.side(&base_id)?;
        let r = self
            .merge_sides(&mut base, &mut ours, &mut theirs, &target, &root, &req)
            .await;
        self.drop_readers(&mut [&mut base, &mut theirs]).await;
        let (applied, settled, conflicts) = r?;
        if !req.dry_run {
            tracing::info!(sandbox = %target, child = %child, paths = applied.len(), "merged {} path(s) of sandbox {child} into {target}", applied.len());
        }
        Ok(Merged {
            child: child.to_string(),
            into: req.into,
            base: base_id,
            applied,
            settled,
            conflicts,
            dry_run: req.dry_run,
            merge_ms: ms(t0.elapsed()),
        })
    }

    #[allow(clippy::type_complexity)]
    async fn merge_sides(
        self: &Arc<Self>,
        base: &mut Side,
        ours: &mut Side,
        theirs: &mut Side,
        target: &str,
        root: &str,
        req: &MergeRequest,
    ) -> Result<
        (
            Vec<forkvm_api::PathChange>,
            Vec<forkvm_api::Conflict>,
            Vec<forkvm_api::Conflict>,
        ),
        EngineError,
    > {
        let tb = self.tree_of(base, root).await?;
        let to = self.tree_of(ours, root).await?;
        let tt = self.tree_of(theirs, root).await?;
        let text = req.strategy == Some(forkvm_api::MergeStrategy::Text);
        let need = merge::needed(&tb, &to, &tt, text);
        let cb = self.read_files(base, &tb, &need).await?;
        let co = self.read_files(ours, &to, &need).await?;
        let ct = self.read_files(theirs, &tt, &need).await?;
        let plan = merge::plan(&tb, &to, &tt, &cb, &co, &ct, req.strategy);
        if !plan.conflicts.is_empty() && !req.dry_run {
            let list: Vec<String> = plan
                .conflicts
                .iter()
                .take(20)
                .map(|c| format!("{} ({})", c.path, c.reason))
                .collect();
            return Err(EngineError::conflict(format!(
                "{} conflict(s), nothing was changed: {}{}; settle them with a strategy \
                 (ours, theirs or text), or list them all with a dry run",
                plan.conflicts.len(),
                list.join("; "),
                if plan.conflicts.len() > 20 {
                    "; …"
                } else {
                    ""
                }
            )));
        }
        if !req.dry_run && !plan.actions.is_empty() {
            // The child's bytes of every file put.
            let files: Vec<String> = plan
                .actions
                .iter()
                .filter(|(_, a)| matches!(a, Action::Put(n) if n.kind == "file"))
                .map(|(p, _)| p.clone())
                .filter(|p| !ct.contains_key(p))
                .collect();
            let mut contents = self.read_files(theirs, &tt, &files).await?;
            contents.extend(ct);
            let live = self.running(target)?;
            let agent = live.agent().await.map_err(|e| agent_error(target, e))?;
            apply(&agent, &plan.actions, &to, &contents)
                .await
                .map_err(|e| {
                    EngineError::new(
                        e.kind,
                        format!("merge into sandbox {target}: {}", e.message),
                    )
                })?;
        }
        Ok((plan.applied, plan.settled, plan.conflicts))
    }

    /// The snapshot a sandbox was spawned from, its branch point: the one it
    /// runs from, or (after a pause and resume, or a rewind, which leave it
    /// running from a snapshot of itself) the first ancestor of that not
    /// taken of the sandbox.
    fn branch_point_of(&self, row: &crate::db::SandboxRow) -> Option<String> {
        self.ancestry(row)
            .into_iter()
            .find(|s| s.source != row.id)
            .map(|s| s.id)
    }

    /// The contents of those of `paths` that are regular files in `tree`.
    async fn read_files(
        self: &Arc<Self>,
        s: &mut Side,
        tree: &Tree,
        paths: &[String],
    ) -> Result<Contents, EngineError> {
        let sizes: BTreeMap<String, u64> = paths
            .iter()
            .filter_map(|p| {
                tree.get(p)
                    .filter(|n| n.kind == "file")
                    .map(|n| (p.clone(), n.size))
            })
            .collect();
        let list: Vec<String> = sizes.keys().cloned().collect();
        self.read_side(s, &list, &sizes).await
    }
}

fn step_err(what: &str, e: crate::agent::AgentError) -> EngineError {
    EngineError::new(ErrorKind::Guest, format!("{what}: {e}"))
}

/// Stage, commit and clean up `actions` in the target (see the module doc).
async fn apply(
    agent: &AgentConn,
    actions: &BTreeMap<String, Action>,
    ours: &Tree,
    contents: &Contents,
) -> Result<(), EngineError> {
    let token = crate::util::new_id("m");
    let mut n = 0usize;
    let mut name = |dir: &str, suffix: &str| {
        n += 1;
        join(dir, &format!(".forkvm-merge-{token}-{suffix}{n}"))
    };
    // Top-level puts (not inside a new directory the plan also puts), with
    // their staging names; deletions not inside another deletion.
    let new_dir = |p: &str| {
        matches!(actions.get(p), Some(Action::Put(n)) if n.kind == "dir")
            && ours.get(p).is_none_or(|n| n.kind != "dir")
    };
    let mut staged: Vec<(String, String)> = Vec::new();
    let mut w = Writer::new();
    let mut modes: Vec<(String, u32)> = Vec::new();
    for (p, a) in actions {
        let inside: Option<&(String, String)> = staged
            .iter()
            .rev()
            .find(|(top, _)| new_dir(top) && p != top && under(p, top));
        let at = match (inside, a) {
            (_, Action::Delete) => continue,
            (Some((top, st)), _) => format!("{st}{}", &p[top.len()..]),
            // An existing directory that stays one: only its mode changes.
            (None, Action::Put(node)) if node.kind == "dir" && !new_dir(p) => {
                modes.push((p.clone(), node.mode));
                continue;
            }
            (None, _) => {
                let st = name(parent(p), "s");
                staged.push((p.clone(), st.clone()));
                st
            }
        };
        let rel = at.trim_start_matches('/');
        let meta = |mode| Meta {
            mode,
            ..Meta::default()
        };
        match a {
            Action::PutMerged(node, bytes) => w.file(rel, &meta(node.mode), bytes),
            Action::Put(node) => match node.kind {
                "dir" => w.dir(rel, &meta(node.mode)),
                "symlink" => w.symlink(rel, node.target.as_deref().unwrap_or(""), &meta(0o777)),
                "file" => {
                    let data = contents.get(p).ok_or_else(|| {
                        EngineError::internal(format!("the child's {p} was not read"))
                    })?;
                    w.file(rel, &meta(node.mode), data)
                }
                k => {
                    return Err(EngineError::invalid(format!(
                    "{p} is a {k} entry (a device, socket or FIFO), which a merge does not carry"
                )))
                }
            },
            Action::Delete => {}
        }
    }
    for (p, mode) in &modes {
        w.dir(
            p.trim_start_matches('/'),
            &Meta {
                mode: *mode,
                ..Meta::default()
            },
        );
    }
    let tar = w.finish();
    // 1. Stage.
    if !staged.is_empty() || !modes.is_empty() {
        // Directory modes are set in place by the same unpacking; they are
        // metadata only, and a failure below restores nothing of them.
        if let Err(e) = agent
            .put_archive_in_parts(
                "/",
                None,
                &tar,
                forkvm_agent_protocol::MAX_PAYLOAD as usize / 2,
                STEP,
            )
            .await
        {
            for (_, st) in &staged {
                let _ = agent.fs_remove(st).await;
            }
            return Err(step_err(
                "staging the merged files failed; nothing was changed",
                e,
            ));
        }
    }
    // 2. Commit.
    let deletes: Vec<&String> = actions
        .iter()
        .filter(|(_, a)| **a == Action::Delete)
        .map(|(p, _)| p)
        .filter(|p| ours.contains_key(*p))
        .collect();
    let mut done: Vec<Moved> = Vec::new();
    let mut aside: Vec<String> = Vec::new();
    let mut r: Result<(), crate::agent::AgentError> = Ok(());
    for p in deletes
        .iter()
        .filter(|p| !deletes.iter().any(|d| d != *p && under(p, d)))
    {
        let b = name(parent(p), "b");
        match agent.fs_move(p, &b).await {
            Ok(_) => {
                done.push(Moved {
                    from: (*p).clone(),
                    to: b.clone(),
                });
                aside.push(b);
            }
            Err(e) => {
                r = Err(e);
                break;
            }
        }
    }
    if r.is_ok() {
        for (p, st) in &staged {
            if ours.contains_key(p) && !deletes.contains(&p) {
                let b = name(parent(p), "b");
                if let Err(e) = agent.fs_move(p, &b).await {
                    r = Err(e);
                    break;
                }
                done.push(Moved {
                    from: p.clone(),
                    to: b.clone(),
                });
                aside.push(b);
            }
            if let Err(e) = agent.fs_move(st, p).await {
                r = Err(e);
                break;
            }
            done.push(Moved {
                from: st.clone(),
                to: p.clone(),
            });
        }
    }
    if let Err(e) = r {
        for m in done.iter().rev() {
            if let Err(u) = agent.fs_move(&m.to, &m.from).await {
                tracing::error!(
                    "undoing a merge step ({} back to {}) failed: {u}",
                    m.to,
                    m.from
                );
            }
        }
        for (_, st) in &staged {
            let _ = agent.fs_remove(st).await;
        }
        return Err(step_err("the merge failed and was undone", e));
    }
    // 3. Clean up.
    for b in aside {
        if let Err(e) = agent.fs_remove(&b).await {
            tracing::warn!("cannot remove {b}, set aside by a merge: {e}");
        }
    }
    Ok(())
}
