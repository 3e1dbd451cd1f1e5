//! Filesystem diff and merge between sandboxes, snapshots and checkpoints
//! (docs/timetravel.md).
//!
//! How a diff is computed: **through the guest**. Each side's tree is
//! listed by its guest agent (`fs_list`: `lstat` of every entry, without
//! following symlinks), the two trees are compared on metadata
//! ([`compare`]), and only the files whose metadata cannot decide are read
//! (`get_archive`) and compared byte for byte. A running sandbox is read
//! directly; a snapshot or checkpoint (or a paused sandbox, through its
//! saved state) is read through a temporary clone of it, without a network,
//! removed afterwards. Snapshots do not change, so their trees are cached.
//!
//! Why not from the disk layers on the host: a running sandbox's recent
//! writes are in its guest's page cache, not yet in any layer, so a host
//! reading of the layers would be wrong for exactly the side users diff
//! most; and it would mean parsing ext4 from qcow2 chains in the daemon,
//! which untrusted guests write. The guest's own view is exact, and within
//! one lineage cheap: a branch's child inherits every file's mtime, so an
//! unchanged file matches on metadata and is never read.

pub mod apply;
pub mod cache;
pub mod compare;
pub mod merge;
mod text;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use forkvm_api::{
    ChangeKind, CreateSandbox, Diff, DiffRequest, DiffStats, NetworkMode, PathChange, SandboxState,
};

use crate::error::{agent_error, EngineError};
use crate::manager::Manager;
use crate::util::ms;
use compare::{Node, Tree, Verdict};

/// Trees left out of a diff of `/`: the kernel's, the devices, and the
/// agent's runtime files.
pub const SKIPPED: &[&str] = &["/proc", "/sys", "/dev", "/run"];
/// How deep a listing goes.
const DEPTH: u32 = 256;
/// Most bytes read from a side per `get_archive`.
const BATCH_BYTES: u64 = 32 << 20;
/// Metadata the daemon adds to the temporary clones it reads through.
pub const READER_LABEL: &str = "forkvm.reader";

/// One side of a diff or merge.
pub struct Side {
    /// As asked (an id or a tag).
    pub name: String,
    /// The running sandbox it is, if it is one.
    running: Option<String>,
    /// The snapshot it is (or a paused sandbox's saved state).
    snapshot: Option<String>,
    /// A temporary clone of `snapshot`, made when something must be read.
    reader: Option<String>,
}

impl Side {
    pub fn snapshot(&self) -> Option<&str> {
        self.snapshot.as_deref()
    }
}

/// A checked absolute directory (default `/`).
pub fn root_of(path: Option<&str>) -> Result<String, EngineError> {
    let p = path.unwrap_or("/");
    if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
        return Err(EngineError::invalid(format!(
            "path {p:?} must be absolute, without `..`"
        )));
    }
    let t = p.trim_end_matches('/');
    Ok(if t.is_empty() { "/".into() } else { t.into() })
}

impl Manager {
    /// Resolve `r`: a sandbox (running, or paused with its memory saved),
    /// or a snapshot or checkpoint by id or tag.
    pub fn side(&self, r: &str) -> Result<Side, EngineError> {
        if let Some(row) = self.db.get(r)? {
            return match row.state {
                SandboxState::Running => Ok(Side {
                    name: r.into(),
                    running: Some(r.into()),
                    snapshot: None,
                    reader: None,
                }),
                SandboxState::Paused => {
                    let l = self.db.lifecycle(r)?;
                    let snap = l.pause.and_then(|p| p.snapshot).ok_or_else(|| {
                        EngineError::conflict(format!(
                            "sandbox {r} was paused without its memory; resume it to read it"
                        ))
                    })?;
                    Ok(Side {
                        name: r.into(),
                        running: None,
                        snapshot: Some(snap),
                        reader: None,
                    })
                }
                s => Err(EngineError::conflict(format!(
                    "sandbox {r} is {}; it cannot be read",
                    crate::db::state_str(s)
                ))),
            };
        }
        let row = self.snapshot_row(r)?;
        Ok(Side {
            name: r.into(),
            running: None,
            snapshot: Some(row.id),
            reader: None,
        })
    }

    /// The running sandbox to read `s` through, made if needed.
    async fn reader_of(self: &Arc<Self>, s: &mut Side) -> Result<String, EngineError> {
        if let Some(r) = s.running.clone().or_else(|| s.reader.clone()) {
            return Ok(r);
        }
        let snap = s
            .snapshot
            .clone()
            .expect("a side is a sandbox or a snapshot");
        let req = CreateSandbox {
            snapshot: Some(snap.clone()),
            network: Some(NetworkMode::None),
            metadata: Some(BTreeMap::from([(READER_LABEL.to_string(), s.name.clone())])),
            // A safety net should the daemon die before removing it.
            timeout: Some(900),
            ..Default::default()
        };
        let id = match self.create(req).await? {
            crate::spawn::Created::One(sb) => sb.id,
            crate::spawn::Created::Batch(b) => b
                .sandboxes
                .first()
                .map(|sb| sb.id.clone())
                .ok_or_else(|| EngineError::internal("a reader spawn made no sandbox"))?,
        };
        tracing::debug!(snapshot = %snap, reader = %id, "reading snapshot {snap} through sandbox {id}");
        s.reader = Some(id.clone());
        Ok(id)
    }

    /// Remove the temporary clones `sides` made.
    pub async fn drop_readers(self: &Arc<Self>, sides: &mut [&mut Side]) {
        for s in sides.iter_mut() {
            if let Some(r) = s.reader.take() {
                if let Err(e) = self.remove(&r).await {
                    tracing::warn!(sandbox = %r, "cannot remove reader {r}: {}", e.message);
                }
            }
        }
    }

    /// The tree under `root` of side `s`.
    pub async fn tree_of(
        self: &Arc<Self>,
        s: &mut Side,
        root: &str,
    ) -> Result<Arc<Tree>, EngineError> {
        if let Some(snap) = s.snapshot.clone() {
            if let Some(t) = self.trees.get(&snap, root) {
                return Ok(t);
            }
            let r = self.reader_of(s).await?;
            let t = Arc::new(self.list_tree(&r, root).await?);
            self.trees.put(&snap, root, t.clone());
            return Ok(t);
        }
        let r = self.reader_of(s).await?;
        Ok(Arc::new(self.list_tree(&r, root).await?))
    }

    /// List every entry under `root` in running sandbox `id`.
    async fn list_tree(&self, id: &str, root: &str) -> Result<Tree, EngineError> {
        let live = self.running(id)?;
        let agent = live.agent().await.map_err(|e| agent_error(id, e))?;
        let mut tree = Tree::new();
        let tops: Vec<String> = if root == "/" {
            let top = agent
                .fs_list("/", 1)
                .await
                .map_err(|e| agent_error(id, e))?;
            let mut v = Vec::new();
            for e in top {
                if SKIPPED.contains(&e.path.as_str()) {
                    continue;
                }
                let n = Node::from_entry(&e);
                if n.kind == "dir" {
                    v.push(e.path.clone());
                }
                tree.insert(e.path.clone(), n);
            }
            v
        } else {
            // A path that is a file is compared alone; one a side lacks is
            // an empty tree there (all added, or all deleted).
            match agent.fs_stat(root).await {
                // The directory itself is an entry too (its mode, or its
                // absence on the other side).
                Ok(e) if Node::from_entry(&e).kind == "dir" => {
                    tree.insert(root.to_string(), Node::from_entry(&e));
                    vec![root.to_string()]
                }
                Ok(e) => {
                    tree.insert(e.path.clone(), Node::from_entry(&e));
                    return Ok(tree);
                }
                Err(crate::agent::AgentError::Guest { code, .. })
                    if code == forkvm_agent_protocol::ERR_NOT_FOUND =>
                {
                    return Ok(tree)
                }
                Err(e) => return Err(agent_error(id, e)),
            }
        };
        for t in tops {
            match agent.fs_list(&t, DEPTH).await {
                Ok(entries) => {
                    for e in entries {
                        tree.insert(e.path.clone(), Node::from_entry(&e));
                    }
                }
                Err(e) => return Err(agent_error(id, e)),
            }
        }
        Ok(tree)
    }

    /// The contents of regular files `paths` of side `s`.
    pub async fn read_side(
        self: &Arc<Self>,
        s: &mut Side,
        paths: &[String],
        sizes: &BTreeMap<String, u64>,
    ) -> Result<BTreeMap<String, Vec<u8>>, EngineError> {
        let mut out = BTreeMap::new();
        if paths.is_empty() {
            return Ok(out);
        }
        let id = self.reader_of(s).await?;
        let live = self.running(&id)?;
        let agent = live.agent().await.map_err(|e| agent_error(&id, e))?;
        let mut batch: Vec<String> = Vec::new();
        let mut bytes = 0u64;
        let flush = |batch: Vec<String>| {
            let agent = agent.clone();
            async move {
                let a = agent
                    .get_archive(batch, Some(u64::from(forkvm_agent_protocol::MAX_PAYLOAD)))
                    .await?;
                let mut got = Vec::new();
                for e in forkvm_agent_protocol::tar::entries(&a.tar) {
                    let e = e.map_err(|e| {
                        crate::agent::AgentError::Protocol(format!("bad archive: {e}"))
                    })?;
                    if e.kind == forkvm_agent_protocol::tar::Kind::File {
                        let p = format!("/{}", String::from_utf8_lossy(&e.path));
                        got.push((p, e.data(&a.tar).to_vec()));
                    }
                }
                Ok::<_, crate::agent::AgentError>(got)
            }
        };
        for p in paths {
            let size = sizes.get(p).copied().unwrap_or(0);
            if !batch.is_empty() && bytes + size > BATCH_BYTES {
                out.extend(
                    flush(std::mem::take(&mut batch))
                        .await
                        .map_err(|e| agent_error(&id, e))?,
                );
                bytes = 0;
            }
            bytes += size;
            batch.push(p.clone());
        }
        out.extend(flush(batch).await.map_err(|e| agent_error(&id, e))?);
        Ok(out)
    }

    /// `forkvm diff A B`.
    pub async fn diff(self: &Arc<Self>, a: &str, req: DiffRequest) -> Result<Diff, EngineError> {
        let t0 = Instant::now();
        let root = root_of(req.path.as_deref())?;
        let (mut sa, mut sb) = (self.side(a)?, self.side(&req.b)?);
        let r = self.diff_sides(&mut sa, &mut sb, &root, req.text).await;
        self.drop_readers(&mut [&mut sa, &mut sb]).await;
        let (changes, entries, contents_read) = r?;
        let mut stats = DiffStats::default();
        for c in &changes {
            match c.change {
                ChangeKind::Added => stats.added += 1,
                ChangeKind::Deleted => stats.deleted += 1,
                ChangeKind::Modified => stats.modified += 1,
                _ => stats.other += 1,
            }
        }
        Ok(Diff {
            a: a.to_string(),
            b: req.b,
            path: root,
            changes,
            stats,
            entries,
            contents_read,
            diff_ms: ms(t0.elapsed()),
        })
    }

    async fn diff_sides(
        self: &Arc<Self>,
        sa: &mut Side,
        sb: &mut Side,
        root: &str,
        text: bool,
    ) -> Result<(Vec<PathChange>, u64, u64), EngineError> {
        let (ta, tb) = (self.tree_of(sa, root).await?, self.tree_of(sb, root).await?);
        let cands = compare::candidates(&ta, &tb);
        // Files metadata cannot decide, and (with `text`) the text to show.
        let mut read: Vec<String> = cands
            .iter()
            .filter(|(p, v)| {
                *v == Verdict::Contents
                    || (text && (text::worth_reading(ta.get(p)) || text::worth_reading(tb.get(p))))
            })
            .map(|(p, _)| p.clone())
            .collect();
        read.dedup();
        let of = |t: &Tree| -> BTreeMap<String, u64> {
            read.iter()
                .filter_map(|p| {
                    t.get(p)
                        .filter(|n| n.kind == "file")
                        .map(|n| (p.clone(), n.size))
                })
                .collect()
        };
        let (sza, szb) = (of(&ta), of(&tb));
        let pa: Vec<String> = sza.keys().cloned().collect();
        let pb: Vec<String> = szb.keys().cloned().collect();
        let ca = self.read_side(sa, &pa, &sza).await?;
        let cb = self.read_side(sb, &pb, &szb).await?;
        let mut changes = Vec::new();
        for (p, v) in cands {
            let (x, y) = (ta.get(&p), tb.get(&p));
            let change = match v {
                Verdict::Differs(k) => k,
                Verdict::Contents if ca.get(&p) != cb.get(&p) => ChangeKind::Modified,
                Verdict::Contents if x.map(|n| n.mode) != y.map(|n| n.mode) => ChangeKind::Mode,
                Verdict::Contents | Verdict::Same => continue,
            };
            let patch = text
                .then(|| text::patch(&p, ca.get(&p), cb.get(&p)))
                .flatten();
            changes.push(PathChange {
                path: p,
                change,
                a: x.map(Node::state),
                b: y.map(Node::state),
                patch,
            });
        }
        Ok((
            changes,
            (ta.len() + tb.len()) as u64,
            (ca.len() + cb.len()) as u64,
        ))
    }
}
