//! The disk's block graph in a running QEMU, and `block-stream`: pulling
//! the data of a chain's middle layers up into its top so that QEMU drops
//! them.
//!
//! A running sandbox's root disk is a chain of format nodes, each (but the
//! bottom) backed by the next:
//!
//! ```text
//! top (the guest writes here) ─▶ layer ─▶ … ─▶ base image (raw, read-only)
//! ```
//!
//! `block-stream` with `base-node` = the bottom copies into the top every
//! cluster the top does not hold yet and a middle layer does, while the guest
//! runs; when it finishes QEMU rewrites the top's header to name the base and
//! detaches the middle layers. The jobs are started with `auto-dismiss:
//! false` so that their outcome (and any error) can still be read after they
//! end, by whichever caller looks first; [`jobs`] lists them and [`dismiss`]
//! clears one.

use serde_json::{json, Value};

use crate::qmp::{Qmp, QmpError};

/// Every block job id forkvm starts begins with this.
pub const JOB_PREFIX: &str = "forkvm-stream-";

/// One format node of the root disk's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainNode {
    pub node_name: String,
    /// The image file the node reads.
    pub file: String,
}

/// The chain of format nodes below the disk attached to the VM, top first,
/// found by following each node's backing file name through
/// `query-named-block-nodes`.
pub async fn disk_chain(qmp: &Qmp) -> Result<Vec<ChainNode>, QmpError> {
    let (top, _, _) = crate::migrate::top_disk(qmp).await?;
    let nodes = qmp
        .execute("query-named-block-nodes", Some(json!({"flat": true})))
        .await?;
    Ok(chain_from_nodes(&nodes, &top))
}

/// Walk `nodes` (the answer to `query-named-block-nodes`) from `top` down.
/// Protocol nodes (`drv: file`) share their format node's filename and are
/// skipped; a backing file no node reads ends the walk.
pub fn chain_from_nodes(nodes: &Value, top: &str) -> Vec<ChainNode> {
    let all: Vec<&Value> = nodes.as_array().into_iter().flatten().collect();
    let format_node = |pred: &dyn Fn(&Value) -> bool| {
        all.iter()
            .find(|n| n["drv"].as_str().is_some_and(|d| d != "file") && pred(n))
            .copied()
    };
    let mut out: Vec<ChainNode> = Vec::new();
    let mut cur = format_node(&|n| n["node-name"] == top);
    while let Some(n) = cur {
        let (Some(name), Some(file)) = (n["node-name"].as_str(), n["file"].as_str()) else {
            break;
        };
        if out.iter().any(|c| c.node_name == name) {
            break;
        }
        out.push(ChainNode {
            node_name: name.to_string(),
            file: file.to_string(),
        });
        cur = match n["backing_file"].as_str() {
            Some(b) => format_node(&|m| m["file"].as_str() == Some(b)),
            None => None,
        };
    }
    out
}

/// Start streaming every layer between `top` and `base` into `top`.
pub async fn start_stream(qmp: &Qmp, job: &str, top: &str, base: &str) -> Result<(), QmpError> {
    qmp.execute(
        "block-stream",
        Some(json!({
            "job-id": job,
            "device": top,
            "base-node": base,
            "auto-dismiss": false,
        })),
    )
    .await
    .map(drop)
}

/// A block job as `query-jobs` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: String,
    /// `running`, `paused`, `waiting`, `pending`, `concluded`, …
    pub status: String,
    /// Set on a concluded job that failed or was cancelled.
    pub error: Option<String>,
    pub done: u64,
    pub total: u64,
}

impl Job {
    pub fn concluded(&self) -> bool {
        self.status == "concluded" || self.status == "null"
    }
}

/// forkvm's stream jobs in the VM.
pub async fn jobs(qmp: &Qmp) -> Result<Vec<Job>, QmpError> {
    Ok(jobs_from(&qmp.execute("query-jobs", None).await?))
}

/// Parse `query-jobs`, keeping forkvm's own jobs.
pub fn jobs_from(v: &Value) -> Vec<Job> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| {
            let id = j["id"].as_str()?;
            id.starts_with(JOB_PREFIX).then(|| Job {
                id: id.to_string(),
                status: j["status"].as_str().unwrap_or("unknown").to_string(),
                error: j["error"].as_str().map(str::to_string),
                done: j["current-progress"].as_u64().unwrap_or(0),
                total: j["total-progress"].as_u64().unwrap_or(0),
            })
        })
        .collect()
}

/// Remove a concluded job from QEMU's list.
pub async fn dismiss(qmp: &Qmp, job: &str) -> Result<(), QmpError> {
    qmp.execute("job-dismiss", Some(json!({"id": job})))
        .await
        .map(drop)
}

/// Cancel a running job (its partial copy stays in the top: harmless, the
/// chain below is unchanged).
pub async fn cancel(qmp: &Qmp, job: &str) -> Result<(), QmpError> {
    qmp.execute("job-cancel", Some(json!({"id": job})))
        .await
        .map(drop)
}

/// Delete a node nothing uses any more (QEMU refuses while it is in use).
pub async fn delete_node(qmp: &Qmp, node: &str) -> Result<(), QmpError> {
    qmp.execute("blockdev-del", Some(json!({"node-name": node})))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, drv: &str, file: &str, backing: Option<&str>) -> Value {
        let mut v = json!({"node-name": name, "drv": drv, "file": file});
        if let Some(b) = backing {
            v["backing_file"] = json!(b);
        }
        v
    }

    #[test]
    fn the_chain_follows_backing_files_and_skips_protocol_nodes() {
        // The shape QEMU 10 answers after two blockdev-snapshot-sync calls.
        let nodes = json!([
            node("root-b", "qcow2", "/s/b.qcow2", Some("/store/a/disk.qcow2")),
            node("#block350", "file", "/s/b.qcow2", None),
            node(
                "root-a",
                "qcow2",
                "/store/a/disk.qcow2",
                Some("/s/disk.qcow2")
            ),
            node("#block250", "file", "/store/a/disk.qcow2", None),
            node("#block189", "raw", "/img/rootfs.img", None),
            node("#block040", "file", "/img/rootfs.img", None),
            node("root", "qcow2", "/s/disk.qcow2", Some("/img/rootfs.img")),
            node("root-file", "file", "/s/disk.qcow2", None),
        ]);
        let c = chain_from_nodes(&nodes, "root-b");
        let names: Vec<_> = c.iter().map(|n| n.node_name.as_str()).collect();
        assert_eq!(names, ["root-b", "root-a", "root", "#block189"]);
        assert_eq!(c[3].file, "/img/rootfs.img");
        // An unknown top gives an empty chain; a dangling backing ends it.
        assert!(chain_from_nodes(&nodes, "nope").is_empty());
        let dangling = json!([node("t", "qcow2", "/t", Some("/gone"))]);
        assert_eq!(chain_from_nodes(&dangling, "t").len(), 1);
        // A loop ends instead of spinning.
        let looped = json!([
            node("x", "qcow2", "/x", Some("/y")),
            node("y", "qcow2", "/y", Some("/x")),
        ]);
        assert_eq!(chain_from_nodes(&looped, "x").len(), 2);
    }

    #[test]
    fn only_forkvm_jobs_are_listed() {
        let v = json!([
            {"id": "forkvm-stream-l1", "status": "running", "type": "stream",
             "current-progress": 5, "total-progress": 10},
            {"id": "forkvm-stream-l2", "status": "concluded", "type": "stream",
             "error": "No space left on device", "current-progress": 1, "total-progress": 10},
            {"id": "someone-else", "status": "running", "type": "mirror"},
        ]);
        let j = jobs_from(&v);
        assert_eq!(j.len(), 2);
        assert!(!j[0].concluded());
        assert_eq!((j[0].done, j[0].total), (5, 10));
        assert!(j[1].concluded());
        assert_eq!(j[1].error.as_deref(), Some("No space left on device"));
        assert!(jobs_from(&json!({})).is_empty());
    }
}
