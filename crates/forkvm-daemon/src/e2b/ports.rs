//! Other ports of a sandbox through the E2B listener: a request with
//! `E2b-Sandbox-Port: P` (P not envd's) is relayed over HTTP/1.1 to guest
//! port P, the way E2B's edge proxy reaches `https://P-<id>.<domain>`.
//!
//! The host cannot route to a guest (every guest has the same address, each
//! in its own namespace: docs/networking.md), so only a *published* port can
//! be reached: the relay connects to the loopback port that forkvm's port
//! forwarding keeps for it. Sandboxes created through the E2B API publish
//! [`CODE_INTERPRETER_PORT`] for this; any other port must be published at
//! spawn (`/v1`'s `ports`).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use forkvm_api::{PortForward, Sandbox};

/// The port E2B's code interpreter (a Jupyter server) listens on.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// The ports an E2B-created sandbox publishes.
pub fn published() -> Vec<PortForward> {
    vec![PortForward {
        guest: CODE_INTERPRETER_PORT,
        host: 0,
    }]
}

/// Relay `req` to guest port `port` of `sb`.
pub async fn relay(sb: &Sandbox, port: u16, mut req: Request) -> Response {
    let Some(host) = sb
        .network
        .as_ref()
        .and_then(|n| n.ports.iter().find(|p| p.guest == port))
        .map(|p| p.host)
    else {
        return super::error(
            StatusCode::BAD_GATEWAY,
            format!(
                "port {port} of sandbox {} is not published; publish it at spawn (ports) or use \
                 envd's port {}",
                sb.id,
                super::ENVD_PORT
            ),
        );
    };
    let stream = match tokio::net::TcpStream::connect(("127.0.0.1", host)).await {
        Ok(s) => s,
        Err(e) => {
            return super::error(
                StatusCode::BAD_GATEWAY,
                format!("cannot reach port {port} of sandbox {}: {e}", sb.id),
            )
        }
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await {
            Ok(x) => x,
            Err(e) => return super::error(StatusCode::BAD_GATEWAY, format!("port {port}: {e}")),
        };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // The E2B routing headers and the access token are ours, not the guest
    // server's.
    for h in ["e2b-sandbox-id", "e2b-sandbox-port", "x-access-token"] {
        req.headers_mut().remove(h);
    }
    match sender.send_request(req).await {
        Ok(r) => r.map(axum::body::Body::new).into_response(),
        Err(e) => super::error(
            StatusCode::BAD_GATEWAY,
            format!(
                "port {port} of sandbox {} did not answer: {e} (is a server listening there?)",
                sb.id
            ),
        ),
    }
}
