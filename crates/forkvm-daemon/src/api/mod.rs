//! The REST API: the HTTP layer only parses requests into typed calls on the
//! [`Engine`](crate::actions::Engine) and renders results; every decision
//! lives in the engine.
//!
//! The router is built from `forkvm_api::routes::ROUTES`, and the OpenAPI
//! document is generated from the `#[utoipa::path]` annotations below. A test
//! compares both with the checked-in `docs/openapi.json`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Json, Router};
use forkvm_api::routes::{Op, ROUTES};
use forkvm_api::*;
use utoipa::OpenApi;

use crate::actions::Engine;
use crate::api::error::ApiError;
use crate::error::ErrorKind;

pub mod body;
pub mod error;
mod events;
mod exec;
mod fs;
mod gc;
mod images;
mod lifetime;
mod ndjson;
mod processes;
mod registry;
mod sandboxes;
mod snapshots;
mod timeline;
pub mod ui;
mod volumes;

pub use body::{JsonBody, OptJsonBody};
use exec::*;
use fs::*;
use processes::*;
use sandboxes::*;
use snapshots::*;

type AppState = Engine;

/// The OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "forkvm",
        description = "Run AI-agent sandboxes as microVMs and fork them while they run.",
        license(name = "Apache-2.0")
    ),
    paths(
        health,
        info,
        create_sandbox,
        list_sandboxes,
        get_sandbox,
        delete_sandbox,
        exec,
        write_file,
        read_file,
        logs,
        ports,
        snapshot_sandbox,
        branch_sandbox,
        list_snapshots,
        get_snapshot,
        delete_snapshot,
        set_pool,
        flatten_snapshot,
        gc::pin_snapshot,
        gc::unpin_snapshot,
        gc::prune_snapshots,
        registry::push_snapshot,
        registry::pull_snapshot,
        lifetime::set_timeout,
        set_network,
        lifetime::pause,
        lifetime::resume,
        timeline::checkpoint,
        timeline::get_timeline,
        timeline::set_retention,
        timeline::rewind,
        timeline::diff,
        timeline::merge,
        lifetime::metrics,
        images::list_images,
        images::get_image,
        images::delete_image,
        images::pull_image,
        images::import_image,
        images::build_image,
        start_process,
        list_processes,
        attach_process,
        write_stdin,
        close_stdin,
        signal_process,
        kill_process,
        resize_pty,
        stat_file,
        file_exists,
        list_dir,
        make_dir,
        move_file,
        remove_file,
        watch_dir,
        create_watcher,
        poll_watcher,
        remove_watcher,
        download_archive,
        upload_archive,
        volumes::list_volumes,
        volumes::create_volume,
        volumes::delete_volume,
        events::events
    ),
    components(schemas(ErrorBody, ErrorDetail, ErrorHint, HintAction, Sandbox, SandboxBatch, ImageEvent, TransferEvent, ProcessEvent, WatchEvent, Event, BranchEvent, PoolEvent, EventsReady)),
    modifiers(&CommonErrors)
)]
pub struct ApiDoc;

/// The errors any operation can answer, whatever it does: a bad or slow
/// body, the bearer token on TCP, the concurrency limit, a host failure.
/// Added to every operation so the document lists every status the server
/// can send (the API fuzzer holds the server to that).
struct CommonErrors;

impl utoipa::Modify for CommonErrors {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let common = [
            (
                "400",
                "malformed request: bad JSON, unknown fields, values out of range",
            ),
            ("401", "TCP only: missing or wrong bearer token"),
            (
                "408",
                "the request body did not arrive within request_body_timeout_ms",
            ),
            ("413", "request body over max_request_bytes"),
            ("429", "limit reached: concurrent requests or sandboxes"),
            ("500", "host or QEMU failure; the message says what to do"),
            (
                "507",
                "the disk holding the daemon's home is full (or under its reserve), or the sandbox is suspended by it",
            ),
        ];
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                for (code, why) in common {
                    if (code == "400" || code == "507") && item_is_health(op) {
                        continue;
                    }
                    op.responses
                        .responses
                        .entry(code.to_string())
                        .or_insert_with(|| {
                            ResponseBuilder::new()
                                .description(why)
                                .content(
                                    "application/json",
                                    ContentBuilder::new()
                                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                                        .build(),
                                )
                                .build()
                                .into()
                        });
                }
            }
        }
    }
}

fn item_is_health(op: &utoipa::openapi::path::Operation) -> bool {
    op.operation_id.as_deref() == Some("health")
}

/// The OpenAPI document as pretty JSON (what `docs/openapi.json` holds).
pub fn openapi_json() -> String {
    let mut s = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

fn handler(op: Op) -> MethodRouter<AppState> {
    use axum::routing::{delete, get, post, put};
    match op {
        Op::Health => get(health),
        Op::Info => get(info),
        Op::CreateSandbox => post(create_sandbox),
        Op::ListSandboxes => get(list_sandboxes),
        Op::GetSandbox => get(get_sandbox),
        Op::DeleteSandbox => delete(delete_sandbox),
        Op::Exec => post(exec),
        Op::WriteFile => put(write_file),
        Op::ReadFile => get(read_file),
        Op::Logs => get(logs),
        Op::Ports => get(ports),
        Op::Snapshot => post(snapshot_sandbox),
        Op::Branch => post(branch_sandbox),
        Op::ListSnapshots => get(list_snapshots),
        Op::GetSnapshot => get(get_snapshot),
        Op::DeleteSnapshot => delete(delete_snapshot),
        Op::SetPool => put(set_pool),
        Op::FlattenSnapshot => post(flatten_snapshot),
        Op::PinSnapshot => put(gc::pin_snapshot),
        Op::UnpinSnapshot => delete(gc::unpin_snapshot),
        Op::PruneSnapshots => post(gc::prune_snapshots),
        Op::PushSnapshot => post(registry::push_snapshot),
        Op::PullSnapshot => post(registry::pull_snapshot),
        Op::ListImages => get(images::list_images),
        Op::GetImage => get(images::get_image),
        Op::DeleteImage => delete(images::delete_image),
        Op::PullImage => post(images::pull_image),
        Op::ImportImage => post(images::import_image),
        Op::BuildImage => post(images::build_image),
        Op::SetTimeout => put(lifetime::set_timeout),
        Op::SetNetwork => put(set_network),
        Op::Pause => post(lifetime::pause),
        Op::Resume => post(lifetime::resume),
        Op::Checkpoint => post(timeline::checkpoint),
        Op::GetTimeline => get(timeline::get_timeline),
        Op::SetRetention => put(timeline::set_retention),
        Op::Rewind => post(timeline::rewind),
        Op::Diff => post(timeline::diff),
        Op::Merge => post(timeline::merge),
        Op::Metrics => get(lifetime::metrics),
        Op::StartProcess => post(start_process),
        Op::ListProcesses => get(list_processes),
        Op::AttachProcess => get(attach_process),
        Op::WriteStdin => post(write_stdin),
        Op::CloseStdin => delete(close_stdin),
        Op::SignalProcess => post(signal_process),
        Op::KillProcess => delete(kill_process),
        Op::ResizePty => put(resize_pty),
        Op::StatFile => get(stat_file),
        Op::FileExists => get(file_exists),
        Op::ListDir => get(list_dir),
        Op::MakeDir => post(make_dir),
        Op::MoveFile => post(move_file),
        Op::RemoveFile => delete(remove_file),
        Op::WatchDir => get(watch_dir),
        Op::CreateWatcher => post(create_watcher),
        Op::PollWatcher => get(poll_watcher),
        Op::RemoveWatcher => delete(remove_watcher),
        Op::DownloadArchive => get(download_archive),
        Op::UploadArchive => put(upload_archive),
        Op::ListVolumes => get(volumes::list_volumes),
        Op::CreateVolume => post(volumes::create_volume),
        Op::DeleteVolume => delete(volumes::delete_volume),
        Op::Events => get(events::events),
    }
}

/// The router for every route in the table.
pub fn router(state: AppState, token: Option<String>) -> Router {
    let mut r: Router<AppState> = Router::new();
    for (op, _, path) in ROUTES {
        r = r.route(path, handler(*op));
    }
    // MCP over streamable HTTP (crate::mcp): behind the same layers, and so
    // the same bearer token on TCP, as /v1.
    // The unix socket and a loopback listener take only loopback `Host`
    // names (DNS rebinding); a listener others reach takes any.
    let guard = match (&token, state.tcp_addr()) {
        (Some(_), Some(addr)) if !addr.ip().is_loopback() => crate::mcp::Guard::Any,
        _ => crate::mcp::Guard::Loopback,
    };
    let mcp = crate::mcp::service(state.clone(), guard);
    r = r.route("/mcp", mcp.clone()).route("/mcp/", mcp);
    // OAuth discovery (RFC 9728, RFC 8414, and the MCP spec's paths under
    // /mcp): forkvm has no authorization server, so these are plain 404s,
    // open like the login page, so a client probing them learns that at once.
    for p in OAUTH_DISCOVERY {
        r = r.route(p, axum::routing::any(no_oauth));
    }
    // The dashboard, behind the same layers (crate::api::ui).
    r = r.merge(ui::routes(token.clone()));
    let limits = state.limits();
    let limit = limits.max_request_bytes as usize;
    let body_timeout = Duration::from_millis(limits.request_body_timeout_ms);
    let slots = Arc::new(tokio::sync::Semaphore::new(
        limits.max_concurrent_requests as usize,
    ));
    let r = r
        .fallback(|req: Request| async move {
            ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
        })
        .method_not_allowed_fallback(|req: Request| async move {
            error::http_failure(
                StatusCode::METHOD_NOT_ALLOWED,
                forkvm_api::codes::INVALID_REQUEST,
                format!("{} is not allowed on {}", req.method(), req.uri().path()),
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            body_timeout,
        ))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let slots = slots.clone();
                async move { admit(&slots, req, next).await }
            },
        ))
        .with_state(state);
    match token {
        Some(t) => r.layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let t = t.clone();
                async move { auth(&t, req, next).await }
            },
        )),
        None => r,
    }
}

/// The OAuth discovery paths MCP clients probe: forkvm uses a bearer token
/// and has no authorization server.
pub const OAUTH_DISCOVERY: &[&str] = &[
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server",
    "/.well-known/oauth-authorization-server/mcp",
    "/.well-known/openid-configuration",
    "/.well-known/openid-configuration/mcp",
    "/mcp/.well-known/oauth-protected-resource",
    "/mcp/.well-known/oauth-authorization-server",
    "/mcp/.well-known/openid-configuration",
];

async fn no_oauth(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no OAuth metadata at {}: forkvm has no authorization server; send the daemon's \
         token as Authorization: Bearer <token>",
        req.uri().path()
    ))
}

/// The concurrency limit: a request beyond it is refused at once with 429
/// rather than queued, so a client sees back-pressure instead of a hang.
/// Health checks always pass, and so do event streams, which last as long
/// as their client and have their own limit (`Engine::open_events`).
async fn admit(slots: &Arc<tokio::sync::Semaphore>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/v1/health" || req.uri().path() == "/v1/events" {
        return next.run(req).await;
    }
    match slots.clone().try_acquire_owned() {
        Ok(_permit) => next.run(req).await,
        Err(_) => {
            // Take in a small body first, so a client that sends its body
            // after the headers reads this 429 instead of a broken pipe.
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                axum::body::to_bytes(req.into_body(), 1 << 20),
            )
            .await;
            let mut r = ApiError::new(
                ErrorKind::LimitExceeded,
                "the daemon is already handling its maximum of concurrent requests \
                 (max_concurrent_requests in GET /v1/info); retry shortly",
            )
            .into_response();
            // A larger body is left unread, so the connection cannot carry
            // another request: say so.
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
    }
}

/// Bearer-token check for the TCP listener, in constant time. Every route
/// needs it, `/v1/health` too: a client learns at its first call whether its
/// token is right. The dashboard's session cookie (crate::api::ui) counts
/// as the token; a browser without either is sent to the login page.
async fn auth(token: &str, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if ui::is_public(path) || OAUTH_DISCOVERY.contains(&path) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .unwrap_or("");
    if !constant_time_eq(given.as_bytes(), token.as_bytes())
        && !ui::has_session(req.headers(), token)
    {
        if ui::is_ui(path) {
            return ui::to_login();
        }
        let mut r = ApiError::new(
            ErrorKind::Unauthorized,
            "missing or wrong bearer token; set FORKVM_TOKEN to the daemon's token",
        )
        .into_response();
        // RFC 6750: a 401 names the scheme (MCP clients read it to decide
        // how to authenticate).
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"forkvm\""),
        );
        return r;
    }
    crate::listen::mark_authenticated(&req);
    next.run(req).await
}

/// The token of an `Authorization: Bearer <token>` header; the scheme's
/// name is case-insensitive (RFC 9110 section 11.1).
pub fn bearer(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Compare without an early exit (shared with the cluster gateway).
pub use forkvm_listen::constant_time_eq;

/// Liveness.
#[utoipa::path(get, path = "/v1/health", tag = "daemon",
    responses((status = 200, body = Health)))]
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// Version, accelerator and why, QEMU, limits.
#[utoipa::path(get, path = "/v1/info", tag = "daemon",
    responses((status = 200, body = Info)))]
async fn info(State(m): State<AppState>) -> Result<Json<Info>, ApiError> {
    Ok(Json(m.info()?))
}

#[cfg(test)]
mod tests {
    use super::body::parse_object;
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for h in [
            "Bearer t0k",
            "bearer t0k",
            "BEARER t0k",
            "Bearer  t0k ",
            " bEaReR t0k",
        ] {
            assert_eq!(bearer(h), Some("t0k"), "{h:?}");
        }
        for h in ["Basic t0k", "Bearert0k", "t0k", ""] {
            assert_ne!(bearer(h), Some("t0k"), "{h:?}");
        }
    }

    #[test]
    fn constant_time_eq_is_correct() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn bodies_must_be_json_objects() {
        #[derive(Debug, Default, serde::Deserialize)]
        #[allow(dead_code)]
        struct Req {
            a: Option<u32>,
            b: Option<String>,
        }
        for (body, kind) in [
            (&b"[null, null]"[..], "an array"),
            (b" \n[]", "an array"),
            (b"\"x\"", "a string"),
            (b"42", "a number"),
            (b"-1", "a number"),
            (b"true", "a boolean"),
            (b"null", "null"),
            (b"<xml/>", "not JSON"),
            (b"   ", "not JSON"),
        ] {
            let e = parse_object::<Req>(body).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Invalid);
            assert!(e.message.contains("must be a JSON object"), "{}", e.message);
            assert!(e.message.ends_with(kind), "{body:?}: {}", e.message);
        }
        let r: Req = parse_object(b" \r\n\t{\"a\": 1}").unwrap();
        assert_eq!(r.a, Some(1));
        let e = parse_object::<Req>(b"{\"a\": ").unwrap_err();
        assert!(e.message.starts_with("invalid JSON body"), "{}", e.message);
    }

    /// The checked-in OpenAPI document must equal what the server generates,
    /// and every route the server has must be in it (and nothing else).
    #[test]
    fn openapi_document_matches_the_server() {
        let checked_in_path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
        let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
        let generated = openapi_json();
        assert!(
            checked_in == generated,
            "docs/openapi.json is out of date; regenerate it with\n  cargo run -q -p forkvm-cli -- openapi > docs/openapi.json"
        );
        let doc: serde_json::Value = serde_json::from_str(&checked_in).unwrap();
        let mut in_doc = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                in_doc.insert((method.to_uppercase(), path.clone()));
            }
        }
        let in_server: std::collections::BTreeSet<_> = ROUTES
            .iter()
            .map(|(_, m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(
            in_doc, in_server,
            "routes in docs/openapi.json differ from the server's"
        );
        for (_, m, _) in ROUTES {
            assert!(["GET", "POST", "PUT", "DELETE"].contains(m));
        }
    }
}
