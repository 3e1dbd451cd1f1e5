//! Forwarding a request to a node, bodies streamed both ways.
//!
//! The request body goes to the node as it arrives and the node's response
//! body comes back as the node writes it, so exec output, NDJSON progress,
//! Server-Sent Events, PTY output and Connect-RPC streams keep their timing
//! through the gateway. The client's credentials never reach a node: they
//! are removed and the cluster token put in their place.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri};
use axum::response::IntoResponse;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The credential the gateway presents to a node.
#[derive(Debug, Clone, Copy)]
pub enum Auth<'a> {
    /// `Authorization: Bearer` (REST, MCP, metrics).
    Bearer(&'a str),
    /// `X-API-Key` (E2B's control plane).
    ApiKey(&'a str),
    /// Nothing added: E2B envd requests carry their sandbox's own
    /// `X-Access-Token`, which the node checks.
    None,
}

/// Connection-level headers (RFC 9110 section 7.6.1) are not forwarded.
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Client credentials the gateway checked and a node must not see.
const CREDENTIALS: &[&str] = &["authorization", "x-api-key", "cookie"];

pub struct Http {
    client: Client<HttpConnector, Body>,
}

impl Http {
    pub fn new() -> Http {
        let mut c = HttpConnector::new();
        c.set_connect_timeout(Some(std::time::Duration::from_secs(3)));
        c.set_nodelay(true);
        Http {
            client: Client::builder(TokioExecutor::new()).build(c),
        }
    }

    /// Send `req` to the node at `addr` (`HOST:PORT`), with `path_and_query`
    /// in place of the request's own when given.
    pub async fn forward(
        &self,
        addr: &str,
        req: Request<Body>,
        path_and_query: Option<&str>,
        auth: Auth<'_>,
    ) -> Result<Response<Body>, String> {
        let (mut parts, body) = req.into_parts();
        let pq = path_and_query
            .map(str::to_owned)
            .or_else(|| parts.uri.path_and_query().map(|p| p.as_str().to_owned()))
            .unwrap_or_else(|| "/".into());
        parts.uri = format!("http://{addr}{pq}")
            .parse::<Uri>()
            .map_err(|e| format!("bad upstream uri: {e}"))?;
        clean(&mut parts.headers);
        if let Ok(v) = HeaderValue::from_str(addr) {
            parts.headers.insert(header::HOST, v);
        }
        match auth {
            Auth::Bearer(t) => {
                if let Ok(v) = HeaderValue::from_str(&format!("Bearer {t}")) {
                    parts.headers.insert(header::AUTHORIZATION, v);
                }
            }
            Auth::ApiKey(t) => {
                if let Ok(v) = HeaderValue::from_str(t) {
                    parts
                        .headers
                        .insert(HeaderName::from_static("x-api-key"), v);
                }
            }
            Auth::None => {}
        }
        let resp = self
            .client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(|e| describe(&e))?;
        let (mut parts, body) = resp.into_parts();
        for h in HOP {
            parts.headers.remove(*h);
        }
        Ok(Response::from_parts(parts, Body::new(body)))
    }
}

fn clean(h: &mut HeaderMap) {
    for name in HOP.iter().chain(CREDENTIALS) {
        h.remove(*name);
    }
}

/// A connection error with its cause (hyper's own text is only "client
/// error (Connect)").
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// An error in the API's shape.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response<Body> {
    let body = serde_json::json!({"error": {"code": code, "message": message.into()}});
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_credentials_and_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer client"),
            ("x-api-key", "client"),
            ("cookie", "forkvm_session=x"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("content-type", "application/json"),
            ("e2b-sandbox-id", "sb-n1-000000000000"),
            ("x-access-token", "t"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        clean(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            left,
            vec!["content-type", "e2b-sandbox-id", "x-access-token"]
        );
    }
}
