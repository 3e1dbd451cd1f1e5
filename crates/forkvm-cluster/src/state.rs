//! The gateway's shared state and the questions every route asks of it:
//! which node holds a sandbox, which nodes hold a snapshot, and the poll
//! that keeps the node table current.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, StatusCode};
use forkvm_api::{codes, Client, NodeState, Target};

use crate::lost::Lost;
use crate::nodes::{Node, Table};
use crate::proxy::{error, Http};
use crate::Config;

pub struct Gateway {
    pub cfg: Config,
    pub nodes: Table,
    pub http: Http,
    pub lost: Lost,
    /// One snapshot copy into each node at a time, so two spawns placed on
    /// a node do not pull the same snapshot at once.
    copies: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// How long a poll or an internal call may take before a node counts as
/// not answering.
const POLL_TIMEOUT: Duration = Duration::from_secs(3);

impl Gateway {
    pub fn new(cfg: Config) -> Gateway {
        let lost = Lost::load(&cfg.state_dir);
        Gateway {
            cfg,
            nodes: Table::default(),
            http: Http::new(),
            lost,
            copies: Default::default(),
        }
    }

    /// The lock of copies into node `name`.
    pub fn copy_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.copies
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// A typed client for a node's daemon.
    pub fn client(&self, node: &Node) -> Client {
        Client::new(
            Target::Tcp(node.addr.clone()),
            Some(self.cfg.cluster_token.clone()),
        )
    }

    /// The live node holding sandbox `id`, or the answer to give instead:
    /// 410 for a lost sandbox, 503 for an unreachable node, 404 otherwise.
    pub async fn sandbox_node(&self, id: &str) -> Result<Node, Response<Body>> {
        if let Some(r) = self.lost.get(id) {
            return Err(error(
                StatusCode::GONE,
                codes::NODE_LOST,
                format!(
                    "sandbox {id} is lost: {}; delete it with `forkvm rm {id}`",
                    r.sandbox.failure.unwrap_or_default()
                ),
            ));
        }
        let name = match crate::route::node_of(id) {
            Some(n) => n.to_string(),
            // An id without a node (a daemon run without `--node`):
            // whichever node has it, from the last poll or by asking.
            None => match self.find_unnamed(id).await {
                Some(n) => n.entry.name,
                None => {
                    return Err(error(
                        StatusCode::NOT_FOUND,
                        codes::NOT_FOUND,
                        format!("no sandbox {id} in the cluster"),
                    ))
                }
            },
        };
        let Some(node) = self.nodes.get(&name) else {
            return Err(error(
                StatusCode::NOT_FOUND,
                codes::NOT_FOUND,
                format!("no sandbox {id}: the cluster has no node {name}"),
            ));
        };
        match node.state() {
            NodeState::Alive => Ok(node),
            NodeState::Dead => Err(error(
                StatusCode::GONE,
                codes::NODE_LOST,
                format!(
                    "sandbox {id} was on node {name}, which the cluster declared dead ({}); \
                     its state is gone",
                    node.why()
                ),
            )),
            NodeState::Unreachable => Err(unreachable(&node)),
        }
    }

    async fn find_unnamed(&self, id: &str) -> Option<Node> {
        let alive = self.nodes.alive();
        if let Some(n) = alive
            .iter()
            .find(|n| n.sandboxes.iter().any(|s| s.id == id))
        {
            return Some(n.clone());
        }
        let asks = alive.iter().map(|n| {
            let c = self.client(n);
            async move {
                matches!(
                    tokio::time::timeout(POLL_TIMEOUT, c.get_sandbox(id)).await,
                    Ok(Ok(_))
                )
            }
        });
        let found = futures_util::future::join_all(asks).await;
        alive
            .into_iter()
            .zip(found)
            .find_map(|(n, f)| f.then_some(n))
    }

    /// The live nodes that hold snapshot `r` (an id or a tag), the node its
    /// id names first.
    pub async fn snapshot_holders(&self, r: &str) -> Vec<Node> {
        let mut alive = self.nodes.alive();
        if let Some(origin) = crate::route::node_of(r) {
            alive.sort_by_key(|n| n.entry.name != origin);
        }
        let asks = alive.iter().map(|n| {
            let c = self.client(n);
            async move {
                matches!(
                    tokio::time::timeout(POLL_TIMEOUT, c.get_snapshot(r)).await,
                    Ok(Ok(_))
                )
            }
        });
        let found = futures_util::future::join_all(asks).await;
        alive
            .into_iter()
            .zip(found)
            .filter_map(|(n, f)| f.then_some(n))
            .collect()
    }

    /// Poll every node once: re-read the nodes file, ask each node for its
    /// info and sandboxes, and act on nodes that died or came back.
    pub async fn poll(self: &Arc<Self>) {
        let (died, back) = self.nodes.reload(&self.cfg.state_dir.join("nodes.json"));
        for n in died {
            let reason = n.why();
            let new = self.lost.record(&n.entry.name, &n.sandboxes, &reason);
            tracing::warn!(
                "node {} declared dead ({reason}): {new} sandbox(es) lost",
                n.entry.name
            );
        }
        for name in back {
            tracing::info!("node {name} is back; reconciling its lost sandboxes");
        }
        let nodes = self.nodes.all();
        let polls = nodes
            .iter()
            .filter(|n| n.entry.alive)
            .map(|n| self.poll_one(n.clone()));
        futures_util::future::join_all(polls).await;
        self.reconcile().await;
    }

    /// Ask one node for its info and sandboxes, and store the answer.
    pub async fn poll_one(&self, n: Node) {
        let c = self.client(&n);
        let r = tokio::time::timeout(POLL_TIMEOUT, async {
            let info = c.info().await.map_err(|e| e.to_string())?;
            let list = c.list_sandboxes().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((info, list.sandboxes))
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {}s", POLL_TIMEOUT.as_secs())));
        self.nodes.update(&n.entry.name, r);
    }

    /// A spawn placed on `name` was answered: see the node as it is now,
    /// then stop counting the placement as on its way.
    pub async fn placed_done(&self, name: &str, placed: u64) {
        if let Some(n) = self.nodes.get(name) {
            self.poll_one(n).await;
        }
        self.nodes.placed_done(name, placed);
    }

    /// Stop, on nodes that answer again, the sandboxes reported lost while
    /// they were dead (once each).
    async fn reconcile(&self) {
        for n in self.nodes.alive() {
            for id in self.lost.unreaped(&n.entry.name) {
                if !n.sandboxes.iter().any(|s| s.id == id) {
                    // Gone with the node's restart already.
                    self.lost.mark_reaped(&id);
                    continue;
                }
                match self.client(&n).delete_sandbox(&id).await {
                    Ok(()) => {
                        tracing::info!(
                            "sandbox {id} was reported lost; its node {} is back, so it was removed there",
                            n.entry.name
                        );
                        self.lost.mark_reaped(&id);
                    }
                    Err(e) => tracing::warn!(
                        "sandbox {id}: removing it on returning node {} failed: {e}",
                        n.entry.name
                    ),
                }
            }
        }
    }
}

/// The answer for a node that does not answer.
pub fn unreachable(node: &Node) -> Response<Body> {
    let why = node.error.clone().unwrap_or_else(|| node.why());
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::NODE_UNREACHABLE,
        format!(
            "node {} ({}) does not answer: {}; retry shortly (its sandboxes become lost if the \
             cluster declares it dead)",
            node.entry.name, node.addr, why
        ),
    )
}
