//! The E2B-compatible API: what the unmodified `e2b` SDKs (Python and npm,
//! major version 2) call when `E2B_API_URL` and `E2B_SANDBOX_URL` both point
//! at forkvm's TCP listener and `E2B_API_KEY` is the forkvm token.
//!
//! One listener serves two APIs, told apart per request:
//!
//! * a request with an `E2b-Sandbox-Id` header is for a sandbox, the way the
//!   SDK reaches a sandbox when `E2B_SANDBOX_URL` is set: port
//!   [`ENVD_PORT`] (`E2b-Sandbox-Port`) is E2B's in-sandbox daemon, which
//!   forkvm serves itself on the host ([`envd`]) with the guest agent
//!   underneath; it needs the sandbox's `X-Access-Token`;
//! * any other request is for the control plane ([`control`]): sandboxes
//!   created, listed, paused, forked. It needs `X-API-Key` (the daemon's token,
//!   as for `/v1`).
//!
//! Both only parse, call the engine's actions and render, as `/v1` does.
//!
//! Access tokens are derived, not stored: [`access_token`] is a keyed hash of
//! the sandbox id under the daemon's token, so each sandbox has its own, a
//! restarted daemon still knows it, and a branch child gets a fresh one with
//! its fresh id.

pub(crate) mod control;
pub(crate) mod envd;
pub(crate) mod model;
pub(crate) mod network;
pub(crate) mod paging;
pub(crate) mod ports;
pub(crate) mod snapshots;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use sha2::{Digest, Sha256};

use crate::actions::Engine;
use crate::api::constant_time_eq;

/// The port E2B's SDK names for envd, the in-sandbox daemon.
pub const ENVD_PORT: u16 = 49983;

/// Which sandbox a request routed by `E2b-Sandbox-Id` is for. Inserted as a
/// request extension once its access token has been checked.
#[derive(Clone, Debug)]
pub struct EnvdTarget {
    /// The forkvm sandbox id.
    pub sandbox_id: String,
}

/// The E2B API, for the TCP listener: `api_key` is the daemon's token.
pub fn router(mgr: Engine, api_key: String) -> Router {
    let control = snapshots::router()
        .merge(network::router())
        .merge(control::router(api_key.clone()))
        .with_state(mgr.clone());
    let envd = envd::router().with_state(mgr.clone());
    let key = Arc::new(api_key);
    Router::new().fallback(move |req: Request| {
        let mgr = mgr.clone();
        let key = key.clone();
        let control = control.clone();
        let envd = envd.clone();
        async move {
            use tower::ServiceExt;
            let sandbox = header(req.headers(), "e2b-sandbox-id").map(str::to_owned);
            match sandbox {
                Some(id) => {
                    let port: Option<u16> =
                        header(req.headers(), "e2b-sandbox-port").and_then(|p| p.parse().ok());
                    let given = header(req.headers(), "x-access-token").unwrap_or("");
                    let want = access_token(&key, &id);
                    if !constant_time_eq(given.as_bytes(), want.as_bytes()) {
                        return error(
                            StatusCode::UNAUTHORIZED,
                            format!("missing or wrong X-Access-Token for sandbox {id}"),
                        );
                    }
                    crate::listen::mark_authenticated(&req);
                    // As E2B's edge proxy does, a sandbox that is not
                    // running answers 502 with "was not found" in the
                    // message: the SDK matches those words to tell a gone
                    // sandbox (`is_running()` false, SandboxNotRunning) from
                    // an unreachable one.
                    let sb = match mgr.get(&id) {
                        Ok(sb)
                            if sb.state == forkvm_api::SandboxState::Running
                                && going_away(&mgr, &id) =>
                        {
                            return error(
                                StatusCode::BAD_GATEWAY,
                                format!("sandbox {id} was not found running: it is being removed"),
                            )
                        }
                        Ok(sb) if sb.state == forkvm_api::SandboxState::Running => sb,
                        Ok(sb) => {
                            return error(
                                StatusCode::BAD_GATEWAY,
                                format!(
                                    "sandbox {id} was not found running: it is {}; connect to it to resume it",
                                    serde_json::to_value(sb.state)
                                        .ok()
                                        .and_then(|v| v.as_str().map(str::to_owned))
                                        .unwrap_or_default()
                                ),
                            )
                        }
                        Err(_) => {
                            return error(
                                StatusCode::BAD_GATEWAY,
                                format!("sandbox {id} was not found"),
                            )
                        }
                    };
                    match port {
                        Some(ENVD_PORT) => {}
                        Some(p) => return ports::relay(&sb, p, req).await,
                        None => {
                            return error(
                                StatusCode::BAD_REQUEST,
                                "E2b-Sandbox-Port must be a port number".into(),
                            )
                        }
                    }
                    let mut req = req;
                    req.extensions_mut().insert(EnvdTarget { sandbox_id: id });
                    envd.oneshot(req).await.into_response()
                }
                None => {
                    let given = header(req.headers(), "x-api-key").unwrap_or("");
                    if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
                        return error(
                            StatusCode::UNAUTHORIZED,
                            "missing or wrong X-API-Key; set E2B_API_KEY to the forkvm token"
                                .to_string(),
                        );
                    }
                    crate::listen::mark_authenticated(&req);
                    control.oneshot(req).await.into_response()
                }
            }
        }
    })
}

/// Whether a sandbox still recorded as running is being torn down: a
/// `DELETE` has begun (its phase is `Removing`) or has already ended its
/// QEMU (no live VM is left while the row waits for its files to go). For
/// E2B it is gone from that instant, as its proxy forgets a sandbox when the
/// kill begins; the SDK's health probe must say so, or a command cut off by
/// the kill would surface as "unreachable, state unknown".
fn going_away(mgr: &Engine, id: &str) -> bool {
    mgr.going_away(id)
}

/// A sandbox's envd access token: hex SHA-256 over the daemon's token and the
/// sandbox id.
pub fn access_token(api_key: &str, sandbox_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"forkvm-e2b-envd\0");
    h.update(api_key.as_bytes());
    h.update(b"\0");
    h.update(sandbox_id.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// E2B's control-plane error body: `{"code": <HTTP status>, "message"}`.
pub(crate) fn error(status: StatusCode, message: String) -> Response {
    (
        status,
        Json(serde_json::json!({"code": status.as_u16(), "message": message})),
    )
        .into_response()
}

/// Route a TCP request: paths of forkvm's own API (those under the first
/// segment of any route in `forkvm_api::routes::ROUTES`, so `/v1/…` and
/// `/metrics`, and `/mcp`) to it, anything else to the E2B API. E2B's
/// control plane has no path under those.
pub async fn dispatch(rest: Router, e2b: Router, req: Request) -> Response {
    use tower::ServiceExt;
    if is_forkvm_path(req.uri().path()) {
        rest.oneshot(req).await.into_response()
    } else {
        e2b.oneshot(req).await.into_response()
    }
}

fn first_segment(p: &str) -> &str {
    p.trim_start_matches('/').split('/').next().unwrap_or("")
}

fn is_forkvm_path(p: &str) -> bool {
    let seg = first_segment(p);
    seg == "mcp"
        || seg == "ui"
        || p.starts_with("/.well-known/oauth-")
        || p.starts_with("/.well-known/openid-configuration")
        || forkvm_api::routes::ROUTES
            .iter()
            .any(|(_, _, route)| first_segment(route) == seg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forkvm_paths_go_to_forkvm_and_the_rest_to_e2b() {
        for p in [
            "/v1/health",
            "/v1/sandboxes/x",
            "/metrics",
            "/mcp",
            "/mcp/x",
            "/ui",
            "/ui/login",
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-authorization-server/mcp",
        ] {
            assert!(is_forkvm_path(p), "{p}");
        }
        for p in [
            "/sandboxes",
            "/v2/sandboxes",
            "/health",
            "/files",
            "/process.Process/Start",
        ] {
            assert!(!is_forkvm_path(p), "{p}");
        }
    }

    #[test]
    fn access_tokens_differ_per_sandbox_and_key() {
        let a = access_token("k", "sb-1");
        assert_eq!(a.len(), 64);
        assert_eq!(a, access_token("k", "sb-1"));
        assert_ne!(a, access_token("k", "sb-2"));
        assert_ne!(a, access_token("k2", "sb-1"));
    }
}
