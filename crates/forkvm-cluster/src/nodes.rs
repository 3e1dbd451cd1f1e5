//! The node table: which nodes exist, which are alive, what they hold.
//!
//! # `nodes.json`
//!
//! The supervisor (the Ray actor in `forkvm.ray`, or a person) writes
//! `DIR/nodes.json`, atomically (a temporary file in DIR, then `rename`):
//!
//! ```json
//! {"nodes": [{"name": "n1", "url": "http://127.0.0.1:7101", "alive": true},
//!            {"name": "n2", "url": "http://127.0.0.1:7102", "alive": false,
//!             "reason": "Ray reports node 5c1e… dead"}]}
//! ```
//!
//! `name` is the daemon's `--node` (1–16 of `[a-z0-9]`, a letter first);
//! `url` is `http://HOST:PORT`; `alive` (default true) is the cluster's
//! verdict: `false` declares the node dead, and its sandboxes lost. A node
//! that is alive by the file but does not answer is `unreachable`, not dead:
//! only the cluster engine, which sees the machine, can say it is gone.
//! A file that does not parse is logged and ignored (the last good table
//! stays), so a half-edited file never empties the cluster.
//!
//! # Polling
//!
//! Every second the gateway re-reads the file when it changed and asks each
//! node for `GET /v1/info` and `GET /v1/sandboxes`, with a short timeout.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime};

use forkvm_api::{ClusterNode, Info, NodeState, Sandbox, SandboxState};
use serde::{Deserialize, Serialize};

use crate::place::Candidate;

/// One entry of `nodes.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
    pub url: String,
    #[serde(default = "yes")]
    pub alive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Anything the supervisor wants to keep beside (ignored here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_node_id: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodesFile {
    nodes: Vec<NodeEntry>,
}

/// True for a valid node name (the daemon's `--node`).
pub fn valid_name(n: &str) -> bool {
    (1..=16).contains(&n.len())
        && n.as_bytes()[0].is_ascii_lowercase()
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Parse and check `nodes.json`: names valid and unique, urls
/// `http://HOST:PORT`. Returns each entry with its `HOST:PORT`.
pub fn parse_nodes(bytes: &[u8]) -> Result<Vec<(NodeEntry, String)>, String> {
    let f: NodesFile =
        serde_json::from_slice(bytes).map_err(|e| format!("nodes.json does not parse: {e}"))?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for n in f.nodes {
        if !valid_name(&n.name) {
            return Err(format!(
                "nodes.json: bad node name {:?} (1-16 of a-z0-9, a letter first)",
                n.name
            ));
        }
        if !seen.insert(n.name.clone()) {
            return Err(format!("nodes.json: node {} is listed twice", n.name));
        }
        let addr = n
            .url
            .strip_prefix("http://")
            .map(|a| a.trim_end_matches('/'))
            .filter(|a| !a.is_empty() && !a.contains('/') && a.contains(':'))
            .ok_or_else(|| {
                format!(
                    "nodes.json: node {}: url {:?} is not http://HOST:PORT",
                    n.name, n.url
                )
            })?
            .to_string();
        out.push((n, addr));
    }
    Ok(out)
}

/// A node as the gateway knows it.
#[derive(Debug, Clone)]
pub struct Node {
    pub entry: NodeEntry,
    /// `HOST:PORT` of its daemon.
    pub addr: String,
    /// Its daemon answered the last poll.
    pub reachable: bool,
    /// Why the last poll failed.
    pub error: Option<String>,
    pub info: Option<Info>,
    /// Its sandboxes at the last poll that listed them.
    pub sandboxes: Vec<Sandbox>,
    /// Spawns placed here that its last poll may not show yet.
    pub placed: Vec<Placement>,
}

/// A spawn the gateway sent to a node and the node's figures do not show
/// yet.
#[derive(Debug, Clone)]
pub struct Placement {
    id: u64,
    at: Instant,
    mib: u64,
    count: u32,
}

/// A placement never answered counts this long at most.
const PLACED_FOR: Duration = Duration::from_secs(600);

impl Node {
    fn new(entry: NodeEntry, addr: String) -> Node {
        Node {
            entry,
            addr,
            reachable: false,
            error: Some("not polled yet".into()),
            info: None,
            sandboxes: Vec::new(),
            placed: Vec::new(),
        }
    }

    pub fn state(&self) -> NodeState {
        if !self.entry.alive {
            NodeState::Dead
        } else if self.reachable {
            NodeState::Alive
        } else {
            NodeState::Unreachable
        }
    }

    /// Why it is not alive, for error messages.
    pub fn why(&self) -> String {
        match self.state() {
            NodeState::Dead => self
                .entry
                .reason
                .clone()
                .unwrap_or_else(|| "the cluster declared it dead".into()),
            NodeState::Unreachable => self
                .error
                .clone()
                .unwrap_or_else(|| "its daemon does not answer".into()),
            NodeState::Alive => "alive".into(),
        }
    }

    /// What placement knows of it; `has` says whether it holds what the
    /// spawn needs.
    pub fn candidate(&self, has: bool, can_fetch: bool) -> Option<Candidate> {
        let info = self.info.as_ref()?;
        let (placed_n, placed_mib) = self.placed.iter().fold((0u32, 0u64), |(n, m), p| {
            (n + p.count, m + p.mib * u64::from(p.count))
        });
        let sandboxes = info.sandboxes.saturating_add(placed_n);
        // Committed: what its running and starting sandboxes were given,
        // and what is on its way.
        let committed: u64 = self
            .sandboxes
            .iter()
            .filter(|s| matches!(s.state, SandboxState::Running | SandboxState::Starting))
            .map(|s| u64::from(s.memory_mib))
            .sum::<u64>()
            + placed_mib;
        Some(Candidate {
            name: self.entry.name.clone(),
            memory_left_mib: info.capacity.memory_left_mib.saturating_sub(placed_mib),
            slots_left: info.limits.max_sandboxes.saturating_sub(sandboxes),
            sandboxes,
            committed_permille: committed * 1000 / info.capacity.memory_commit_mib.max(1),
            has,
            can_fetch,
        })
    }

    pub fn status(&self) -> ClusterNode {
        ClusterNode {
            name: self.entry.name.clone(),
            url: self.entry.url.clone(),
            state: self.state(),
            reason: (self.state() != NodeState::Alive).then(|| self.why()),
            sandboxes: self.sandboxes.len() as u32,
            capacity: self.info.as_ref().map(|i| i.capacity.clone()),
            max_sandboxes: self.info.as_ref().map(|i| i.limits.max_sandboxes),
            images: self
                .info
                .as_ref()
                .map(|i| i.images.clone())
                .unwrap_or_default(),
        }
    }
}

/// The table.
#[derive(Default)]
pub struct Table {
    nodes: RwLock<BTreeMap<String, Node>>,
    loaded: RwLock<Option<SystemTime>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Table {
    /// Every node, by name.
    pub fn all(&self) -> Vec<Node> {
        self.nodes.read().unwrap().values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Option<Node> {
        self.nodes.read().unwrap().get(name).cloned()
    }

    /// The nodes that answer.
    pub fn alive(&self) -> Vec<Node> {
        self.all()
            .into_iter()
            .filter(|n| n.state() == NodeState::Alive)
            .collect()
    }

    /// Count a placement of `count` × `mib` against `name` until
    /// [`Table::placed_done`] (called once a poll after its answer ran).
    pub fn note_placed(&self, name: &str, mib: u64, count: u32) -> u64 {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(n) = self.nodes.write().unwrap().get_mut(name) {
            n.placed.push(Placement {
                id,
                at: Instant::now(),
                mib,
                count,
            });
        }
        id
    }

    /// Placement `id` shows in the node's own figures now.
    pub fn placed_done(&self, name: &str, id: u64) {
        if let Some(n) = self.nodes.write().unwrap().get_mut(name) {
            n.placed.retain(|p| p.id != id);
        }
    }

    /// Re-read `path` if it changed. Returns the entries whose `alive` turned
    /// false (newly dead) and those that turned true again (back).
    pub fn reload(&self, path: &Path) -> (Vec<Node>, Vec<String>) {
        let Ok(meta) = std::fs::metadata(path) else {
            return (Vec::new(), Vec::new());
        };
        let mtime = meta.modified().ok();
        if *self.loaded.read().unwrap() == mtime && mtime.is_some() {
            return (Vec::new(), Vec::new());
        }
        let parsed = std::fs::read(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|b| parse_nodes(&b));
        let entries = match parsed {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("{e}; keeping the node table as it was");
                *self.loaded.write().unwrap() = mtime;
                return (Vec::new(), Vec::new());
            }
        };
        *self.loaded.write().unwrap() = mtime;
        let mut died = Vec::new();
        let mut back = Vec::new();
        let mut nodes = self.nodes.write().unwrap();
        let names: std::collections::BTreeSet<String> =
            entries.iter().map(|(e, _)| e.name.clone()).collect();
        for (entry, addr) in entries {
            match nodes.get_mut(&entry.name) {
                Some(n) => {
                    if n.entry.alive && !entry.alive {
                        let mut d = n.clone();
                        d.entry = entry.clone();
                        died.push(d);
                    }
                    if !n.entry.alive && entry.alive {
                        back.push(entry.name.clone());
                    }
                    if n.addr != addr {
                        n.reachable = false;
                    }
                    n.entry = entry;
                    n.addr = addr;
                }
                None => {
                    tracing::info!("node {} joins at {}", entry.name, entry.url);
                    if !entry.alive {
                        died.push(Node::new(entry.clone(), addr.clone()));
                    }
                    nodes.insert(entry.name.clone(), Node::new(entry, addr));
                }
            }
        }
        // A node dropped from the file is gone as if declared dead.
        let dropped: Vec<String> = nodes
            .keys()
            .filter(|k| !names.contains(*k))
            .cloned()
            .collect();
        for k in dropped {
            if let Some(mut n) = nodes.remove(&k) {
                if n.entry.alive {
                    n.entry.alive = false;
                    n.entry.reason = Some("removed from the cluster's node list".into());
                    died.push(n);
                }
            }
        }
        (died, back)
    }

    /// Store what a poll of `name` found.
    pub fn update(&self, name: &str, r: Result<(Info, Vec<Sandbox>), String>) {
        let mut nodes = self.nodes.write().unwrap();
        let Some(n) = nodes.get_mut(name) else {
            return;
        };
        match r {
            Ok((info, sandboxes)) => {
                if !n.reachable {
                    tracing::info!("node {name} answers at {}", n.addr);
                }
                n.reachable = true;
                n.error = None;
                n.info = Some(info);
                n.sandboxes = sandboxes;
                // A placement whose answer never came stops counting.
                n.placed.retain(|p| p.at.elapsed() < PLACED_FOR);
            }
            Err(e) => {
                if n.reachable {
                    tracing::warn!("node {name} stopped answering: {e}");
                }
                n.reachable = false;
                n.error = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_file_is_checked() {
        let ok = br#"{"nodes":[{"name":"n1","url":"http://127.0.0.1:7101"},
            {"name":"n2","url":"http://127.0.0.1:7102/","alive":false,"reason":"gone"}]}"#;
        let n = parse_nodes(ok).unwrap();
        assert_eq!(n.len(), 2);
        assert!(n[0].0.alive);
        assert_eq!(n[1].1, "127.0.0.1:7102");
        assert_eq!(n[1].0.reason.as_deref(), Some("gone"));
        for (bad, why) in [
            (
                &br#"{"nodes":[{"name":"N1","url":"http://h:1"}]}"#[..],
                "bad node name",
            ),
            (
                br#"{"nodes":[{"name":"1n","url":"http://h:1"}]}"#,
                "bad node name",
            ),
            (
                br#"{"nodes":[{"name":"n1","url":"http://h:1"},{"name":"n1","url":"http://h:2"}]}"#,
                "twice",
            ),
            (
                br#"{"nodes":[{"name":"n1","url":"https://h:1"}]}"#,
                "not http",
            ),
            (br#"{"nodes":[{"name":"n1","url":"http://h"}]}"#, "not http"),
            (
                br#"{"nodes":[{"name":"n1","url":"http://h:1/x"}]}"#,
                "not http",
            ),
            (
                br#"{"nodes":[{"name":"n1","url":"http://h:1","x":1}]}"#,
                "parse",
            ),
            (br#"{"nodes":"#, "parse"),
        ] {
            let e = parse_nodes(bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn reload_reports_deaths_and_returns() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nodes.json");
        let t = Table::default();
        let write = |s: &str| {
            let tmp = dir.path().join("tmp");
            std::fs::write(&tmp, s).unwrap();
            std::fs::rename(&tmp, &p).unwrap();
            // mtime granularity: make each write look new.
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(SystemTime::now() + Duration::from_secs(t.all().len() as u64 + 1))
                .unwrap();
        };
        write(
            r#"{"nodes":[{"name":"n1","url":"http://127.0.0.1:1"},{"name":"n2","url":"http://127.0.0.1:2"}]}"#,
        );
        let (died, back) = t.reload(&p);
        assert!(died.is_empty() && back.is_empty());
        assert_eq!(t.all().len(), 2);
        assert_eq!(t.get("n1").unwrap().state(), NodeState::Unreachable);
        write(
            r#"{"nodes":[{"name":"n1","url":"http://127.0.0.1:1"},{"name":"n2","url":"http://127.0.0.1:2","alive":false,"reason":"r"}]}"#,
        );
        let (died, _) = t.reload(&p);
        assert_eq!(died.len(), 1);
        assert_eq!(died[0].entry.name, "n2");
        assert_eq!(t.get("n2").unwrap().state(), NodeState::Dead);
        assert_eq!(t.get("n2").unwrap().why(), "r");
        // A broken file keeps the table.
        write("{");
        t.reload(&p);
        assert_eq!(t.all().len(), 2);
        write(
            r#"{"nodes":[{"name":"n1","url":"http://127.0.0.1:1"},{"name":"n2","url":"http://127.0.0.1:2"}]}"#,
        );
        let (_, back) = t.reload(&p);
        assert_eq!(back, vec!["n2".to_string()]);
        // Dropped from the file: dead.
        write(r#"{"nodes":[{"name":"n2","url":"http://127.0.0.1:2"}]}"#);
        let (died, _) = t.reload(&p);
        assert_eq!(died[0].entry.name, "n1");
        assert!(t.get("n1").is_none());
    }
}
