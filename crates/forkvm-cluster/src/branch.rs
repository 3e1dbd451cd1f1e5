//! Spawns and branches across nodes.
//!
//! A spawn goes to the node [`crate::place::choose`] picks. A spawn from a
//! snapshot prefers a node that holds it; when none of those has room, the
//! chosen node first copies the snapshot from a holder.
//!
//! A branch of `count` children puts as many as fit on the source's node
//! (one branch there, which takes the branch point), and the rest on other
//! nodes by the policy's order: each copies the branch point from the
//! source's node and spawns its share from it. Every child therefore starts
//! from the same instant, whichever node it is on.
//!
//! A copy is the nodes' own snapshot pull from the holder's read-only OCI
//! endpoint (`/v2/forkvm/snapshots`, docs/registry.md) with the cluster
//! token, or, with a cluster registry configured, a push by the holder and a
//! pull by the other: every chunk is verified, and links the puller already
//! has (a template copied before) are not fetched again.
//!
//! All or nothing: if any share fails, the children made so far are removed
//! and the error is the answer; the source keeps running.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Response, StatusCode};
use axum::response::IntoResponse;
use forkvm_api::{
    codes, BranchRequest, BranchResult, Client, ClientError, CreateSandbox, PullSnapshot,
    PushSnapshot, Sandbox,
};

use crate::nodes::Node;
use crate::proxy::{error, Auth};
use crate::server::no_node;
use crate::state::{unreachable, Gateway};

/// What a spawn is assumed to need when it names no memory (the daemon's
/// default).
const DEFAULT_MEMORY_MIB: u64 = 512;
/// Largest spawn or branch body the gateway reads.
const MAX_BODY: usize = 1 << 20;

/// The live node with the most memory left (for work placed nowhere in
/// particular).
pub fn emptiest(gw: &Gateway) -> Option<Node> {
    let alive = gw.nodes.alive();
    let cands: Vec<_> = alive
        .iter()
        .filter_map(|n| n.candidate(true, false))
        .collect();
    let c = crate::place::choose(&cands, 1, 0).ok()?;
    alive.into_iter().find(|n| n.entry.name == c.name)
}

async fn read(body: Body) -> Result<Bytes, Response<Body>> {
    match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => Ok(b),
        Err(e) => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::PAYLOAD_TOO_LARGE,
            format!("the request body could not be read: {e}"),
        )),
    }
}

fn api_error(node: &Node, e: ClientError) -> Response<Body> {
    match e {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            &code,
            format!("node {}: {message}", node.entry.name),
        ),
        other => {
            let mut n = node.clone();
            n.error = Some(other.to_string());
            unreachable(&n)
        }
    }
}

/// `POST /v1/sandboxes`.
pub async fn create(gw: Arc<Gateway>, req: Request) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match read(body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let forward = |node: Node, bytes: Bytes| {
        let gw = gw.clone();
        let parts = parts.clone();
        async move {
            let r = Request::from_parts(parts, Body::from(bytes));
            match gw
                .http
                .forward(&node.addr, r, None, Auth::Bearer(&gw.cfg.cluster_token))
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    let mut n = node;
                    n.error = Some(e);
                    unreachable(&n)
                }
            }
        }
    };
    // A body the daemon would refuse: let a node say why, in its words.
    let Ok(spec) = serde_json::from_slice::<CreateSandbox>(&bytes) else {
        return match emptiest(&gw) {
            Some(n) => forward(n, bytes).await,
            None => no_node(),
        };
    };
    let memory = spec.memory_mib.map_or(DEFAULT_MEMORY_MIB, u64::from);
    let count = spec.count.unwrap_or(1);
    let node = match node_for(&gw, &spec).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let name = node.entry.name.clone();
    let placed = gw.nodes.note_placed(&name, memory, count.max(1));
    let r = forward(node, bytes).await;
    gw.placed_done(&name, placed).await;
    r
}

/// The node a spawn of `spec` goes to (with its snapshot copied there when
/// it comes from one), or the answer to give instead.
pub async fn node_for(gw: &Gateway, spec: &CreateSandbox) -> Result<Node, Response<Body>> {
    let memory = spec.memory_mib.map_or(DEFAULT_MEMORY_MIB, u64::from);
    let count = spec.count.unwrap_or(1);
    if let Some(snap) = &spec.snapshot {
        return place_snapshot(gw, snap, memory, count).await;
    }
    let image = spec.image.clone().unwrap_or_else(|| "default".into());
    let alive = gw.nodes.alive();
    let cands: Vec<_> = alive
        .iter()
        .filter_map(|n| {
            let has = n.info.as_ref().is_some_and(|i| i.images.contains(&image));
            n.candidate(has, false)
        })
        .collect();
    if cands.is_empty() {
        return Err(no_node());
    }
    if !cands.iter().any(|c| c.has) {
        return Err(error(
            StatusCode::NOT_FOUND,
            codes::IMAGE_NOT_FOUND,
            format!(
                "no live node has image {image}; pull or build it (`forkvm image pull`), or see \
                 `forkvm image ls`"
            ),
        ));
    }
    let c = crate::place::choose(&cands, memory, count).map_err(capacity)?;
    tracing::info!(
        "spawn of {count} × {memory} MiB ({image}) placed on {}: {}",
        c.name,
        cands
            .iter()
            .map(|c| format!(
                "{} {}‰ committed, {} sandboxes, room {}",
                c.name,
                c.committed_permille,
                c.sandboxes,
                c.room(memory)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    alive
        .into_iter()
        .find(|n| n.entry.name == c.name)
        .ok_or_else(no_node)
}

fn capacity(e: String) -> Response<Body> {
    error(StatusCode::SERVICE_UNAVAILABLE, codes::CAPACITY_EXCEEDED, e)
}

/// The node for a spawn from snapshot `snap`, with the snapshot on it.
async fn place_snapshot(
    gw: &Gateway,
    snap: &str,
    memory: u64,
    count: u32,
) -> Result<Node, Response<Body>> {
    let holders = gw.snapshot_holders(snap).await;
    let Some(from) = holders.first().cloned() else {
        return Err(error(
            StatusCode::NOT_FOUND,
            codes::NOT_FOUND,
            format!("no snapshot {snap} on any live node"),
        ));
    };
    let alive = gw.nodes.alive();
    let cands: Vec<_> = alive
        .iter()
        .filter_map(|n| {
            let has = holders.iter().any(|h| h.entry.name == n.entry.name);
            n.candidate(has, true)
        })
        .collect();
    let chosen = crate::place::choose(&cands, memory, count).map_err(capacity)?;
    let node = alive
        .into_iter()
        .find(|n| n.entry.name == chosen.name)
        .ok_or_else(no_node)?;
    if !chosen.has {
        let id = gw
            .client(&from)
            .get_snapshot(snap)
            .await
            .map_err(|e| api_error(&from, e))?
            .id;
        copy(gw, &from, &node, &id).await?;
    }
    Ok(node)
}

/// Copy snapshot `id` from `from` to `to` (a no-op when `to` has it).
async fn copy(gw: &Gateway, from: &Node, to: &Node, id: &str) -> Result<(), Response<Body>> {
    let lock = gw.copy_lock(&to.entry.name);
    let _one = lock.lock().await;
    let c = gw.client(to);
    if c.get_snapshot(id).await.is_ok() {
        return Ok(());
    }
    let req = match &gw.cfg.registry {
        // Through the cluster registry: the holder pushes (only what the
        // registry lacks), the other pulls.
        Some(reg) => {
            let push = PushSnapshot {
                reference: format!("{}:{id}", reg.repository),
                username: reg.username.clone(),
                password: reg.password.clone(),
                insecure: reg.insecure,
                stream: false,
            };
            gw.client(from)
                .push_snapshot(id, &push, |_| {})
                .await
                .map_err(|e| api_error(from, e))?;
            PullSnapshot {
                reference: push.reference,
                tag: None,
                username: push.username,
                password: push.password,
                insecure: push.insecure,
                stream: false,
            }
        }
        // From the holder's own read-only OCI endpoint.
        None => PullSnapshot {
            reference: format!("{}/forkvm/snapshots:{id}", from.addr),
            tag: None,
            username: Some("forkvm".into()),
            password: Some(gw.cfg.cluster_token.clone()),
            insecure: true,
            stream: false,
        },
    };
    let t = Instant::now();
    let r = c
        .pull_snapshot(&req, |_| {})
        .await
        .map_err(|e| api_error(to, e))?;
    tracing::info!(
        "snapshot {id} copied from node {} to node {}: {} link(s), {} already there, {} bytes in {} ms",
        from.entry.name,
        to.entry.name,
        r.links,
        r.links_cached,
        r.bytes_fetched,
        t.elapsed().as_millis()
    );
    Ok(())
}

/// `POST /v1/sandboxes/{id}/branch`.
pub async fn branch(gw: Arc<Gateway>, id: String, req: Request) -> Response<Body> {
    let src = match gw.sandbox_node(&id).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let (parts, body) = req.into_parts();
    let bytes = match read(body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let to_source = |bytes: Bytes| {
        let gw = gw.clone();
        let src = src.clone();
        let parts = parts.clone();
        async move {
            crate::server::to_node(&gw, &src, Request::from_parts(parts, Body::from(bytes))).await
        }
    };
    let Ok(spec) = serde_json::from_slice::<BranchRequest>(&bytes) else {
        return to_source(bytes).await;
    };
    let count = spec.count.unwrap_or(1);
    let source: Sandbox = match gw.client(&src).get_sandbox(&id).await {
        Ok(s) => s,
        Err(e) => return api_error(&src, e),
    };
    let memory = u64::from(source.memory_mib);
    // The source's own figures, fresh: it decides how many stay there.
    gw.poll_one(src.clone()).await;
    let cands: Vec<_> = gw
        .nodes
        .alive()
        .iter()
        .filter_map(|n| n.candidate(n.entry.name == src.entry.name, true))
        .collect();
    let plan = match crate::place::spread(&cands, &src.entry.name, memory, count) {
        Ok(p) => p,
        Err(e) => return capacity(e),
    };
    let local = plan
        .iter()
        .find(|(n, _)| *n == src.entry.name)
        .map_or(0, |(_, k)| *k);
    if local == count {
        return to_source(bytes).await;
    }
    if spec.wait == Some(false) {
        return error(
            StatusCode::BAD_REQUEST,
            codes::INVALID_REQUEST,
            format!(
                "{count} children do not fit on node {} ({local} do); a branch spread over nodes \
                 answers when every child runs, so it cannot take `wait: false`",
                src.entry.name
            ),
        );
    }
    match spread_branch(&gw, &src, &id, &spec, &source, local, &plan).await {
        Ok(r) => (StatusCode::CREATED, axum::Json(r)).into_response(),
        Err(r) => r,
    }
}

async fn spread_branch(
    gw: &Gateway,
    src: &Node,
    id: &str,
    spec: &BranchRequest,
    source: &Sandbox,
    local: u32,
    plan: &[(String, u32)],
) -> Result<BranchResult, Response<Body>> {
    let t = Instant::now();
    let mut here = spec.clone();
    here.count = Some(local);
    here.wait = Some(true);
    let mut result = gw
        .client(src)
        .branch(id, &here)
        .await
        .map_err(|e| api_error(src, e))?;
    let point = result.snapshot.id.clone();
    let shares = plan
        .iter()
        .filter(|(n, _)| *n != src.entry.name)
        .map(|(name, k)| {
            let node = gw.nodes.get(name);
            let point = point.clone();
            let want = CreateSandbox {
                snapshot: Some(point.clone()),
                // With `count` a daemon answers a batch, without it one sandbox.
                count: (*k > 1).then_some(*k),
                ports: spec.ports.clone(),
                wait_for_network: spec.wait_for_network,
                metadata: Some(source.metadata.clone()).filter(|m| !m.is_empty()),
                ..Default::default()
            };
            async move {
                let node = node.ok_or_else(no_node)?;
                copy(gw, src, &node, &point).await?;
                let placed =
                    gw.nodes
                        .note_placed(&node.entry.name, u64::from(source.memory_mib), *k);
                let c: Client = gw.client(&node);
                let made = if *k == 1 {
                    c.create_sandbox(&want).await.map(|s| vec![s])
                } else {
                    c.create_batch(&want).await.map(|b| b.sandboxes)
                };
                gw.placed_done(&node.entry.name, placed).await;
                made.map_err(|e| api_error(&node, e))
            }
        });
    let mut failed = None;
    for r in futures_util::future::join_all(shares).await {
        match r {
            Ok(children) => result.children.extend(children),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        // All or nothing: remove every child made, wherever it is.
        for c in &result.children {
            if let Ok(n) = gw.sandbox_node(&c.id).await {
                let _ = gw.client(&n).delete_sandbox(&c.id).await;
            }
        }
        tracing::error!("branch of sandbox {id} across nodes failed; its children were removed");
        return Err(e);
    }
    let total = t.elapsed().as_secs_f64() * 1000.0;
    result.spawn_ms = total - result.snapshot_ms;
    result.total_ms = total;
    Ok(result)
}
