//! Sandboxes lost with a dead node.
//!
//! When the cluster declares a node dead, the sandboxes it last listed are
//! recorded here, with state `lost` and the reason in `failure`. The record
//! is what the gateway answers for them from then on: `GET` shows it, other
//! calls get 410 `node_lost`, `DELETE` forgets it. It is kept in
//! `DIR/gateway/lost.json` (written to a temporary file, then renamed), so a
//! restarted gateway still knows them.
//!
//! When the node comes back, the gateway reconciles: each lost sandbox the
//! node still has is deleted there (its QEMU stopped), once, and stays
//! `lost` here; nothing is reported lost twice and no QEMU is left running
//! for a sandbox its user was told is gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use forkvm_api::{Sandbox, SandboxState};
use serde::{Deserialize, Serialize};

/// One lost sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    pub sandbox: Sandbox,
    /// Its QEMU was stopped on the node after the node came back.
    #[serde(default)]
    pub reaped: bool,
}

pub struct Lost {
    path: PathBuf,
    map: Mutex<BTreeMap<String, Record>>,
}

impl Lost {
    /// Load `DIR/gateway/lost.json` (an unreadable file starts empty, and
    /// says so).
    pub fn load(state_dir: &Path) -> Lost {
        let path = state_dir.join("gateway").join("lost.json");
        let map = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::error!("{} does not parse ({e}); starting empty", path.display());
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Lost {
            path,
            map: Mutex::new(map),
        }
    }

    fn save(&self, map: &BTreeMap<String, Record>) {
        let r = (|| -> std::io::Result<()> {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            let tmp = dir.join(".lost.json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(map)?)?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = r {
            tracing::error!("cannot write {}: {e}", self.path.display());
        }
    }

    /// Record `sandboxes` of `node` as lost, for `reason`. Ones already
    /// recorded keep their first record. Returns how many are new.
    pub fn record(&self, node: &str, sandboxes: &[Sandbox], reason: &str) -> usize {
        let mut map = self.map.lock().unwrap();
        let mut new = 0;
        for s in sandboxes {
            if map.contains_key(&s.id) {
                continue;
            }
            let mut sb = s.clone();
            sb.state = SandboxState::Lost;
            sb.failure = Some(format!("node {node} was declared dead: {reason}"));
            sb.pid = None;
            sb.memory = None;
            sb.disk = None;
            map.insert(
                s.id.clone(),
                Record {
                    node: node.to_string(),
                    sandbox: sb,
                    reaped: false,
                },
            );
            new += 1;
        }
        if new > 0 {
            self.save(&map);
        }
        new
    }

    pub fn get(&self, id: &str) -> Option<Record> {
        self.map.lock().unwrap().get(id).cloned()
    }

    /// Forget `id` (its user deleted it).
    pub fn forget(&self, id: &str) -> bool {
        let mut map = self.map.lock().unwrap();
        let had = map.remove(id).is_some();
        if had {
            self.save(&map);
        }
        had
    }

    /// The lost sandboxes of `node` whose QEMU may still run there.
    pub fn unreaped(&self, node: &str) -> Vec<String> {
        self.map
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, r)| r.node == node && !r.reaped)
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub fn mark_reaped(&self, id: &str) {
        let mut map = self.map.lock().unwrap();
        if let Some(r) = map.get_mut(id) {
            r.reaped = true;
            self.save(&map);
        }
    }

    /// Every lost sandbox.
    pub fn all(&self) -> Vec<Sandbox> {
        self.map
            .lock()
            .unwrap()
            .values()
            .map(|r| r.sandbox.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(id: &str) -> Sandbox {
        serde_json::from_value(serde_json::json!({
            "id": id, "state": "running", "image": "default", "memory_mib": 512,
            "cpus": 1, "accel": "tcg", "created_at": "2026-01-01T00:00:00Z",
            "metadata": {}, "env": {}
        }))
        .unwrap()
    }

    #[test]
    fn lost_sandboxes_survive_a_restart_and_are_lost_once() {
        let dir = tempfile::tempdir().unwrap();
        let l = Lost::load(dir.path());
        assert_eq!(
            l.record(
                "n2",
                &[sb("sb-n2-000000000001"), sb("sb-n2-000000000002")],
                "r"
            ),
            2
        );
        // Declared dead again: nothing new.
        assert_eq!(l.record("n2", &[sb("sb-n2-000000000001")], "other"), 0);
        let l = Lost::load(dir.path());
        let r = l.get("sb-n2-000000000001").unwrap();
        assert_eq!(r.sandbox.state, SandboxState::Lost);
        assert_eq!(
            r.sandbox.failure.as_deref(),
            Some("node n2 was declared dead: r")
        );
        assert_eq!(l.unreaped("n2").len(), 2);
        l.mark_reaped("sb-n2-000000000001");
        assert_eq!(
            Lost::load(dir.path()).unreaped("n2"),
            vec!["sb-n2-000000000002"]
        );
        assert!(l.forget("sb-n2-000000000002"));
        assert!(!l.forget("sb-n2-000000000002"));
        assert_eq!(Lost::load(dir.path()).all().len(), 1);
    }

    #[test]
    fn a_corrupt_record_file_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("gateway")).unwrap();
        std::fs::write(dir.path().join("gateway/lost.json"), b"{nope").unwrap();
        assert!(Lost::load(dir.path()).all().is_empty());
    }
}
