//! The gateway's listener, router and per-operation dispatch.
//!
//! The `/v1` router is built from the same route table as the daemon's
//! ([`forkvm_api::routes::ROUTES`]), each route dispatched by
//! [`crate::route::route`]. `/mcp` serves the MCP tools on a REST client
//! pointed back at this listener, so a tool call is routed like any request.
//! Everything else is E2B's API (`crate::e2b`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Response, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use forkvm_api::routes::{Op, ROUTES};
use forkvm_api::{codes, ClusterStatus, Health, NodeState};
use tokio::sync::watch;

use crate::proxy::{error, Auth};
use crate::route::{route, Route};
use crate::state::{unreachable, Gateway};
use crate::{fanout, Config};

pub async fn run(cfg: Config) -> Result<(), String> {
    if cfg.client_token.is_empty() || cfg.cluster_token.is_empty() {
        return Err(
            "the gateway needs FORKVM_TOKEN (for its clients) and FORKVM_CLUSTER_TOKEN (for its \
             nodes)"
                .into(),
        );
    }
    std::fs::create_dir_all(cfg.state_dir.join("gateway"))
        .map_err(|e| format!("cannot create {}/gateway: {e}", cfg.state_dir.display()))?;
    let gw = Arc::new(Gateway::new(cfg.clone()));
    gw.poll().await;
    let poller = gw.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            poller.poll().await;
        }
    });
    let app = router(gw.clone());
    let (nofile, _) = forkvm_listen::raise_nofile();
    let (limits, _) = forkvm_listen::budgets(nofile);
    let listener = forkvm_listen::bind_tcp(cfg.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        let _ = stop_tx.send(true);
    });
    let nodes = gw.nodes.all().len();
    println!(
        "forkvm cluster gateway listening on http://{} ({nodes} node(s) in {})",
        cfg.listen,
        cfg.state_dir.join("nodes.json").display()
    );
    forkvm_listen::serve(listener, app, limits, false, "gateway", stop_rx).await;
    Ok(())
}

fn router(gw: Arc<Gateway>) -> Router {
    let mut by_path: BTreeMap<&'static str, MethodRouter> = BTreeMap::new();
    for &(op, method, path) in ROUTES {
        let g = gw.clone();
        let filter = match method {
            "GET" => MethodFilter::GET,
            "POST" => MethodFilter::POST,
            "PUT" => MethodFilter::PUT,
            "DELETE" => MethodFilter::DELETE,
            other => panic!("route table: unknown method {other}"),
        };
        let h = on(filter, move |req: Request| {
            let g = g.clone();
            async move {
                let params = params(path, req.uri().path());
                handle(g, op, params, req).await
            }
        });
        let mr = match by_path.remove(path) {
            Some(m) => m.merge(h),
            None => h,
        };
        by_path.insert(path, mr);
    }
    let mut r = Router::new();
    for (path, mr) in by_path {
        r = r.route(path, mr);
    }
    let g = gw.clone();
    r = r.route(
        "/v1/cluster",
        axum::routing::get(move || {
            let g = g.clone();
            async move { Json(status(&g)) }
        }),
    );
    r = r.route("/mcp", crate::e2b::mcp_service(&gw));
    r = r.merge(crate::ui::routes(gw.clone()));
    let token = gw.cfg.client_token.clone();
    let r = r.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let token = token.clone();
            async move { bearer_auth(&token, req, next).await }
        },
    ));
    let g = gw.clone();
    r.fallback(move |req: Request| {
        let g = g.clone();
        async move { crate::e2b::handle(g, req).await }
    })
}

/// `/v1`, `/metrics`, `/mcp` and `/ui` take the gateway's bearer token, or
/// the dashboard's session cookie for it.
async fn bearer_auth(token: &str, req: Request, next: Next) -> Response<Body> {
    let path = req.uri().path();
    if crate::ui::is_public(path) {
        return next.run(req).await;
    }
    let session = forkvm_listen::session::has_session(req.headers(), token);
    if crate::ui::is_ui(path) && !session {
        return crate::ui::to_login();
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .unwrap_or("");
    if !constant_time_eq(given.as_bytes(), token.as_bytes()) && !session {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            "missing or wrong bearer token; set FORKVM_TOKEN to the cluster endpoint's token \
             (`forkvm cluster status` on the head node prints where it is)",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"forkvm\""),
        );
        return r;
    }
    forkvm_listen::mark_authenticated(&req);
    next.run(req).await
}

pub use forkvm_listen::constant_time_eq;

/// The `{name}` segments of `template` as found in `path`.
fn params(template: &str, path: &str) -> HashMap<String, String> {
    template
        .split('/')
        .zip(path.split('/'))
        .filter_map(|(t, p)| {
            let name = t.strip_prefix('{')?.strip_suffix('}')?;
            Some((name.to_string(), p.to_string()))
        })
        .collect()
}

fn status(gw: &Gateway) -> ClusterStatus {
    let nodes: Vec<_> = gw.nodes.all().iter().map(|n| n.status()).collect();
    let sandboxes = nodes
        .iter()
        .filter(|n| n.state != NodeState::Dead)
        .map(|n| n.sandboxes)
        .sum();
    ClusterStatus {
        nodes,
        sandboxes,
        lost: gw.lost.all().len() as u32,
    }
}

async fn handle(
    gw: Arc<Gateway>,
    op: Op,
    params: HashMap<String, String>,
    req: Request,
) -> Response<Body> {
    let id = params.get("id").cloned().unwrap_or_default();
    match route(op) {
        Route::Gateway => match op {
            Op::Health => Json(Health {
                status: "ok".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .into_response(),
            _ => fanout::info(&gw).await,
        },
        Route::Sandbox => {
            if let Some(r) = gw.lost.get(&id) {
                match op {
                    Op::GetSandbox => return Json(r.sandbox).into_response(),
                    Op::DeleteSandbox => {
                        gw.lost.forget(&id);
                        return StatusCode::NO_CONTENT.into_response();
                    }
                    _ => {}
                }
            }
            match gw.sandbox_node(&id).await {
                Ok(node) => to_node(&gw, &node, req).await,
                Err(r) => r,
            }
        }
        Route::Snapshot => {
            let holders = gw.snapshot_holders(&id).await;
            match holders.first() {
                Some(n) => to_node(&gw, n, req).await,
                None => no_snapshot(&gw, &id),
            }
        }
        Route::SnapshotEverywhere => {
            let holders = gw.snapshot_holders(&id).await;
            if holders.is_empty() {
                return no_snapshot(&gw, &id);
            }
            fanout::to_each(&gw, &holders, req).await
        }
        Route::Place => crate::branch::create(gw, req).await,
        Route::Branch => crate::branch::branch(gw, id, req).await,
        Route::Merge => fanout::merge(&gw, op, req).await,
        Route::Broadcast => {
            let alive = gw.nodes.alive();
            if alive.is_empty() {
                return no_node();
            }
            fanout::to_each(&gw, &alive, req).await
        }
        Route::AnyNode => {
            let name = params.get("name").cloned();
            let node = match name {
                // GET /v1/images/{name}: a node that has it.
                Some(n) => gw
                    .nodes
                    .alive()
                    .into_iter()
                    .find(|x| x.info.as_ref().is_some_and(|i| i.images.contains(&n))),
                None => crate::branch::emptiest(&gw),
            };
            match node {
                Some(n) => to_node(&gw, &n, req).await,
                None if op == Op::GetImage => error(
                    StatusCode::NOT_FOUND,
                    codes::IMAGE_NOT_FOUND,
                    "no live node has this image; `forkvm image ls` lists what the cluster has",
                ),
                None => no_node(),
            }
        }
    }
}

/// Forward `req` to `node` with the cluster token.
pub async fn to_node(gw: &Gateway, node: &crate::nodes::Node, req: Request) -> Response<Body> {
    match gw
        .http
        .forward(&node.addr, req, None, Auth::Bearer(&gw.cfg.cluster_token))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("node {}: {e}", node.entry.name);
            let mut n = node.clone();
            n.error = Some(e);
            unreachable(&n)
        }
    }
}

fn no_snapshot(gw: &Gateway, id: &str) -> Response<Body> {
    if let Some(origin) = crate::route::node_of(id).and_then(|n| gw.nodes.get(n)) {
        if origin.state() != NodeState::Alive {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::NODE_UNREACHABLE,
                format!(
                    "snapshot {id} was taken on node {}, which is {} ({}), and no live node has a \
                     copy",
                    origin.entry.name,
                    if origin.state() == NodeState::Dead {
                        "dead"
                    } else {
                        "unreachable"
                    },
                    origin.why()
                ),
            );
        }
    }
    error(
        StatusCode::NOT_FOUND,
        codes::NOT_FOUND,
        format!("no snapshot {id} on any live node"),
    )
}

pub fn no_node() -> Response<Body> {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::NODE_UNREACHABLE,
        "no live node in the cluster; check `forkvm cluster status`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_come_from_the_template() {
        let p = params(
            "/v1/sandboxes/{id}/processes/{process}/output",
            "/v1/sandboxes/sb-n1-0a/processes/42/output",
        );
        assert_eq!(p["id"], "sb-n1-0a");
        assert_eq!(p["process"], "42");
        assert!(params("/metrics", "/metrics").is_empty());
    }
}
