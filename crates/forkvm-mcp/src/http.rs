//! The streamable-HTTP endpoint: rmcp's [`StreamableHttpService`] with
//! JSON-RPC faults answered as JSON-RPC and 2025-03-26 batches taken apart.
//!
//! rmcp does the transport: `Host` and `Origin` validation (its allow-lists,
//! set by [`Guard`]), the `Accept` and `Content-Type` checks, and the
//! stateless request handling. In front of it, [`Endpoint::handle`] reads
//! a POST body and sorts it with [`crate::jsonrpc::check`]: a fault gets
//! its JSON-RPC error here (`400` for what is not JSON or not JSON-RPC,
//! `200` for invalid params of a request), and a batch is sent to rmcp one member at a time, the
//! answers gathered into one array. Before answering anything itself it
//! asks rmcp whether the request's `Host` and `Origin` are allowed (by a
//! bodiless `GET`, which a stateless rmcp endpoint refuses after those
//! checks and before anything else), so a forbidden origin gets `403`
//! whatever its body.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;

use crate::jsonrpc::{self, Checked};
use crate::{Backend, Server};

pub type Body = BoxBody<Bytes, Infallible>;

/// Which `Host` and `Origin` headers the endpoint takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// A listener only this machine reaches (loopback TCP, the unix
    /// socket): `Host` must name the loopback (`localhost`, `127.0.0.1`,
    /// `[::1]`, any port) and an `Origin`, when sent, too. This is what
    /// stops DNS rebinding: a page from elsewhere resolving its own name to
    /// 127.0.0.1 sends its own name as `Host` and `Origin`.
    Loopback,
    /// A listener others reach by whatever name (e.g. `0.0.0.0:7070`):
    /// any `Host`; an `Origin`, when sent, must still be a loopback one.
    Any,
}

/// Loopback origins, any port, either scheme.
const LOOPBACK_ORIGINS: &[&str] = &[
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

/// The `/mcp` endpoint.
pub struct Endpoint<B: Backend> {
    inner: StreamableHttpService<Server<B>, LocalSessionManager>,
}

impl<B: Backend> Clone for Endpoint<B> {
    fn clone(&self) -> Self {
        Endpoint {
            inner: self.inner.clone(),
        }
    }
}

/// rmcp's configuration: stateless (every request answered on its own, so
/// nothing outlives a client that goes away), JSON answers unless a call
/// sends progress first, and the allow-lists of `guard`.
pub fn config(guard: Guard) -> StreamableHttpServerConfig {
    let c = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_origins(LOOPBACK_ORIGINS.iter().copied())
        .enforce_origin_validation();
    match guard {
        Guard::Loopback => c.with_allowed_hosts(["localhost", "127.0.0.1", "::1"]),
        Guard::Any => c.disable_allowed_hosts(),
    }
}

impl<B: Backend> Endpoint<B> {
    pub fn new(backend: Arc<B>, guard: Guard) -> Self {
        Endpoint {
            inner: StreamableHttpService::new(
                move || Ok(Server::new(backend.clone())),
                Default::default(),
                config(guard),
            ),
        }
    }

    /// Answer one request whose body has been read.
    pub async fn handle(&self, req: Request<Bytes>) -> Response<Body> {
        if req.method() != Method::POST || !is_json(&req) {
            return self.inner.handle(req.map(Full::new)).await;
        }
        let (parts, body) = req.into_parts();
        let checked = jsonrpc::check(&body);
        if let Checked::Pass(_) = checked {
            return self
                .inner
                .handle(Request::from_parts(parts, Full::new(body)))
                .await;
        }
        if let Some(refused) = self.refused(&parts).await {
            return refused;
        }
        match checked {
            Checked::Pass(_) => unreachable!("handled above"),
            Checked::Reject(None) => accepted(),
            Checked::Reject(Some(e)) => json(status_of(&e), &e),
            Checked::Batch(items) => self.batch(parts, items).await,
        }
    }

    /// rmcp's answer to this request's `Host` and `Origin`, if it refuses
    /// them.
    async fn refused(&self, parts: &http::request::Parts) -> Option<Response<Body>> {
        let mut probe = Request::new(Full::new(Bytes::new()));
        *probe.method_mut() = Method::GET;
        *probe.uri_mut() = parts.uri.clone();
        for name in [header::HOST, header::ORIGIN] {
            if let Some(v) = parts.headers.get(&name) {
                probe.headers_mut().insert(name, v.clone());
            }
        }
        let r = self.inner.handle(probe).await;
        (r.status() == StatusCode::FORBIDDEN || r.status() == StatusCode::BAD_REQUEST).then_some(r)
    }

    async fn batch(&self, parts: http::request::Parts, items: Vec<Checked>) -> Response<Body> {
        let version = parts
            .headers
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok());
        if !jsonrpc::batches_allowed(version) {
            let e = jsonrpc::error(
                Value::Null,
                jsonrpc::INVALID_REQUEST,
                format!(
                    "invalid request: JSON-RPC batches are part of MCP 2025-03-26 only, not {}; \
                     send one message per request",
                    version.unwrap_or_default()
                ),
            );
            return json(StatusCode::BAD_REQUEST, &e);
        }
        let mut answers = Vec::new();
        for item in items {
            match item {
                Checked::Reject(e) => answers.extend(e),
                Checked::Batch(_) => answers.push(jsonrpc::error(
                    Value::Null,
                    jsonrpc::INVALID_REQUEST,
                    "invalid request: a batch cannot hold a batch",
                )),
                Checked::Pass(m) => {
                    let mut req = Request::new(Full::new(Bytes::from(m.to_string())));
                    *req.method_mut() = Method::POST;
                    *req.uri_mut() = parts.uri.clone();
                    *req.headers_mut() = parts.headers.clone();
                    req.headers_mut().remove(header::CONTENT_LENGTH);
                    let r = self.inner.handle(req).await;
                    answers.extend(responses_in(r).await);
                }
            }
        }
        if answers.is_empty() {
            return accepted();
        }
        json(StatusCode::OK, &Value::Array(answers))
    }
}

fn is_json(req: &Request<Bytes>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// `400` for what is not JSON or not JSON-RPC; `200` for invalid params of
/// a well-formed request, like any other answer to a request (a client
/// reads the error from the body only on a success status).
fn status_of(e: &Value) -> StatusCode {
    if e["error"]["code"].as_i64() == Some(jsonrpc::INVALID_PARAMS) {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

fn json(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn accepted() -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}

/// The JSON-RPC responses in one of rmcp's answers: a JSON body, or the
/// `data:` lines of an event stream (notifications such as progress are
/// left out: a batch's answer holds responses only).
async fn responses_in(r: Response<Body>) -> Vec<Value> {
    let sse = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let status = r.status();
    let body = r
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let messages: Vec<Value> = if sse {
        String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else if status.is_success() {
        serde_json::from_slice(&body).into_iter().collect()
    } else {
        vec![jsonrpc::error(
            Value::Null,
            jsonrpc::INVALID_REQUEST,
            format!("invalid request: {}", String::from_utf8_lossy(&body).trim()),
        )]
    };
    messages
        .into_iter()
        .filter(|m| {
            m.get("id").is_some() && (m.get("result").is_some() || m.get("error").is_some())
        })
        .collect()
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
