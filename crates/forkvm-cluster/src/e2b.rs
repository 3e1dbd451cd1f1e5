//! E2B's API and MCP through the gateway.
//!
//! E2B: a request with an `E2b-Sandbox-Id` header is for that sandbox's
//! envd and goes to its node as it is (the node checks its
//! `X-Access-Token`, which it derived from the cluster token when it made
//! the sandbox). Control-plane requests need the gateway's token as
//! `X-API-Key`; the node gets the cluster token instead. They are routed by
//! path: a sandbox id in the path names its node; a create is placed (its
//! `templateID` is a snapshot when some node holds one by that name, else an
//! image); the lists are merged.
//!
//! MCP: the tools of `forkvm_mcp` on a REST client aimed at this gateway, so
//! each tool call is placed and routed like a REST request.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::MethodRouter;
use forkvm_api::{codes, Client, CreateSandbox, Target};
use forkvm_mcp::http::{Endpoint, Guard};
use forkvm_mcp::rest::Rest;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::proxy::{error, Auth};
use crate::server::{constant_time_eq, no_node};
use crate::state::{unreachable, Gateway};

/// `/mcp`.
pub fn mcp_service(gw: &Arc<Gateway>) -> MethodRouter {
    let url = format!("http://{}", gw.cfg.listen);
    let client = Client::new(
        Target::parse(&url).unwrap_or(Target::Tcp(gw.cfg.listen.to_string())),
        Some(gw.cfg.client_token.clone()),
    );
    let guard = if gw.cfg.listen.ip().is_loopback() {
        Guard::Loopback
    } else {
        Guard::Any
    };
    let endpoint = Endpoint::new(Arc::new(Rest(client)), guard);
    axum::routing::any(move |req: Request| {
        let endpoint = endpoint.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = match axum::body::to_bytes(body, 64 << 20).await {
                Ok(b) => b,
                Err(e) => {
                    return error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        codes::PAYLOAD_TOO_LARGE,
                        format!("the MCP message could not be read: {e}"),
                    )
                }
            };
            endpoint
                .handle(axum::http::Request::from_parts(parts, body))
                .await
                .map(Body::new)
        }
    })
}

fn header_str<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Any request that is not `/v1`, `/metrics` or `/mcp`.
pub async fn handle(gw: Arc<Gateway>, req: Request) -> Response<Body> {
    if let Some(id) = header_str(&req, "e2b-sandbox-id").map(str::to_owned) {
        return match gw.sandbox_node(&id).await {
            Ok(n) => match gw.http.forward(&n.addr, req, None, Auth::None).await {
                Ok(r) => r,
                Err(e) => {
                    let mut n = n;
                    n.error = Some(e);
                    unreachable(&n)
                }
            },
            Err(r) => r,
        };
    }
    let key = header_str(&req, "x-api-key").unwrap_or("");
    if !constant_time_eq(key.as_bytes(), gw.cfg.client_token.as_bytes()) {
        return error(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            "missing or wrong X-API-Key; E2B_API_KEY must be the cluster endpoint's token",
        );
    }
    forkvm_listen::mark_authenticated(&req);
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    match (method, segs.as_slice()) {
        (Method::POST, ["sandboxes"] | ["v2", "sandboxes"]) => create(&gw, req).await,
        (Method::GET, ["sandboxes"] | ["v2", "sandboxes"] | ["snapshots"]) => list(&gw, req).await,
        (_, ["sandboxes", id, ..] | ["v2", "sandboxes", id, ..]) => {
            let id = id.to_string();
            match gw.sandbox_node(&id).await {
                Ok(n) => control(&gw, &n, req).await,
                Err(r) => r,
            }
        }
        (_, ["templates", id]) => {
            let id = id.to_string();
            let holders = gw.snapshot_holders(&id).await;
            if holders.is_empty() {
                return error(
                    StatusCode::NOT_FOUND,
                    codes::NOT_FOUND,
                    format!("no template {id} on any live node"),
                );
            }
            crate::fanout::to_each_with(&gw, &holders, req, Auth::ApiKey(&gw.cfg.cluster_token))
                .await
        }
        _ => match gw.nodes.alive().first() {
            Some(n) => control(&gw, n, req).await,
            None => no_node(),
        },
    }
}

async fn control(gw: &Gateway, n: &crate::nodes::Node, req: Request) -> Response<Body> {
    match gw
        .http
        .forward(&n.addr, req, None, Auth::ApiKey(&gw.cfg.cluster_token))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            let mut n = n.clone();
            n.error = Some(e);
            unreachable(&n)
        }
    }
}

/// An E2B create: placed like `POST /v1/sandboxes`, from a snapshot when
/// some node holds one named by `templateID`.
async fn create(gw: &Arc<Gateway>, req: Request) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::PAYLOAD_TOO_LARGE,
                format!("the request body could not be read: {e}"),
            )
        }
    };
    let template = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| {
        v.get("templateID")
            .and_then(|t| t.as_str())
            .map(str::to_owned)
    });
    let node = match template {
        Some(t) if !gw.snapshot_holders(&t).await.is_empty() => {
            // Placed as a spawn from that snapshot would be.
            let spec = CreateSandbox {
                snapshot: Some(t),
                ..Default::default()
            };
            crate::branch::node_for(gw, &spec).await
        }
        t => {
            let spec = CreateSandbox {
                image: Some(t.unwrap_or_else(|| "base".into())),
                ..Default::default()
            };
            crate::branch::node_for(gw, &spec).await
        }
    };
    match node {
        Ok(n) => {
            let placed = gw.nodes.note_placed(&n.entry.name, 512, 1);
            let r = control(gw, &n, Request::from_parts(parts, Body::from(bytes))).await;
            gw.placed_done(&n.entry.name, placed).await;
            r
        }
        Err(r) => r,
    }
}

/// E2B's lists are JSON arrays: concatenated over live nodes.
async fn list(gw: &Gateway, req: Request) -> Response<Body> {
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let mut all = Vec::new();
    for n in gw.nodes.alive() {
        let mut r = Request::get(&pq).body(Body::empty()).unwrap();
        *r.headers_mut() = req.headers().clone();
        let resp = match gw
            .http
            .forward(&n.addr, r, None, Auth::ApiKey(&gw.cfg.cluster_token))
            .await
        {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => return r,
            Err(e) => {
                let mut n = n.clone();
                n.error = Some(e);
                return unreachable(&n);
            }
        };
        let Ok(b) = resp.into_body().collect().await.map(|b| b.to_bytes()) else {
            return unreachable(&n);
        };
        if let Ok(Value::Array(a)) = serde_json::from_slice::<Value>(&b) {
            all.extend(a);
        }
    }
    let mut r = axum::Json(Value::Array(all)).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
