//! The REST API: the HTTP layer only parses requests into typed calls on the
//! [`Manager`] and renders results; every decision lives in the manager.
//!
//! The router is built from `forkvm_api::routes::ROUTES`, and the OpenAPI
//! document is generated from the `#[utoipa::path]` annotations below. A test
//! compares both with the checked-in `docs/openapi.json`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Json, Router};
use base64::Engine;
use forkvm_api::routes::{Op, ROUTES};
use forkvm_api::*;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use utoipa::OpenApi;

use crate::agent::{AgentError, ExecSpec};
use crate::error::ApiError;
use crate::manager::Manager;
use crate::spawn::Created;

type AppState = Arc<Manager>;

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
        crate::gc::http::pin_snapshot,
        crate::gc::http::unpin_snapshot,
        crate::gc::http::prune_snapshots,
        crate::lifetime::http::set_timeout,
        crate::lifetime::http::pause,
        crate::lifetime::http::resume,
        crate::lifetime::http::metrics,
        crate::images::http::list_images,
        crate::images::http::get_image,
        crate::images::http::delete_image,
        crate::images::http::pull_image,
        crate::images::http::import_image,
        crate::images::http::build_image
    ),
    components(schemas(ErrorBody, ErrorDetail, Sandbox, SandboxBatch, ImageEvent)),
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
                    if code == "400" && item_is_health(op) {
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

/// A JSON body parsed with our error format: malformed JSON and unknown
/// fields are 400 `invalid_request` with serde's explanation.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| body_error(e.status(), e.body_text()))?;
        if bytes.is_empty() {
            return Err(ApiError::invalid("the request needs a JSON body"));
        }
        parse_object(&bytes).map(JsonBody)
    }
}

/// An optional JSON body: empty means `T::default()`. Errors as [`JsonBody`].
pub struct OptJsonBody<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptJsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| body_error(e.status(), e.body_text()))?;
        if bytes.is_empty() {
            return Ok(OptJsonBody(T::default()));
        }
        parse_object(&bytes).map(OptJsonBody)
    }
}

/// Parse a request body that must be a JSON object. serde would otherwise
/// fill a struct from an array (`[null, null]` is a positional struct), so
/// anything but an object is refused before it is parsed.
fn parse_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    let kind = match first {
        Some(b'{') => None,
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b'-' | b'0'..=b'9') => Some("a number"),
        Some(b't' | b'f') => Some("a boolean"),
        Some(b'n') => Some("null"),
        _ => Some("not JSON"),
    };
    if let Some(kind) = kind {
        return Err(ApiError::invalid(format!(
            "the request body must be a JSON object ({{\"field\": value, ...}}); this one is {kind}"
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

fn body_error(status: StatusCode, text: String) -> ApiError {
    if text.contains("timed out") || text.contains("timeout") {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            codes::REQUEST_TIMEOUT,
            "the request body did not arrive in time (request_body_timeout_ms in GET /v1/info)",
        )
    } else if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            status,
            codes::PAYLOAD_TOO_LARGE,
            format!("request body too large: {text}"),
        )
    } else {
        ApiError::invalid(format!("cannot read the request body: {text}"))
    }
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
        Op::PinSnapshot => put(crate::gc::http::pin_snapshot),
        Op::UnpinSnapshot => delete(crate::gc::http::unpin_snapshot),
        Op::PruneSnapshots => post(crate::gc::http::prune_snapshots),
        Op::ListImages => get(crate::images::http::list_images),
        Op::GetImage => get(crate::images::http::get_image),
        Op::DeleteImage => delete(crate::images::http::delete_image),
        Op::PullImage => post(crate::images::http::pull_image),
        Op::ImportImage => post(crate::images::http::import_image),
        Op::BuildImage => post(crate::images::http::build_image),
        Op::SetTimeout => put(crate::lifetime::http::set_timeout),
        Op::Pause => post(crate::lifetime::http::pause),
        Op::Resume => post(crate::lifetime::http::resume),
        Op::Metrics => get(crate::lifetime::http::metrics),
    }
}

/// The router for every route in the table.
pub fn router(state: AppState, token: Option<String>) -> Router {
    let mut r: Router<AppState> = Router::new();
    for (op, _, path) in ROUTES {
        r = r.route(path, handler(*op));
    }
    let limit = state.cfg.limits.max_request_bytes as usize;
    let body_timeout = Duration::from_millis(state.cfg.limits.request_body_timeout_ms);
    let slots = Arc::new(tokio::sync::Semaphore::new(
        state.cfg.limits.max_concurrent_requests as usize,
    ));
    let r = r
        .fallback(|req: Request| async move {
            ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
        })
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                codes::INVALID_REQUEST,
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

/// The concurrency limit: a request beyond it is refused at once with 429
/// rather than queued, so a client sees back-pressure instead of a hang.
/// Health checks always pass.
async fn admit(slots: &Arc<tokio::sync::Semaphore>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/v1/health" {
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
                StatusCode::TOO_MANY_REQUESTS,
                codes::LIMIT_EXCEEDED,
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

/// Bearer-token check for the TCP listener, in constant time.
async fn auth(token: &str, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            codes::UNAUTHORIZED,
            "missing or wrong bearer token; set FORKVM_TOKEN to the daemon's token",
        )
        .into_response();
    }
    next.run(req).await
}

/// Compare without an early exit, so timing does not reveal a prefix match.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

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
    Ok(Json(Info {
        network: m.net.info(),
        version: env!("CARGO_PKG_VERSION").into(),
        accel: AccelInfo {
            kind: m.accel.accel.to_string(),
            reason: m.accel.reason.clone(),
        },
        qemu: QemuInfo {
            path: m.cfg.qemu.display().to_string(),
            version: m.qemu_version.clone(),
        },
        limits: m.cfg.limits.clone(),
        home: m.cfg.home.display().to_string(),
        images: m.cfg.images(),
        sandboxes: m.db.count()?,
        snapshots: m.db.snapshots()?.len() as u32,
        default_pool_size: m.default_pool_size,
        pools: m.pool_infos(),
        gc: m.gc_info(),
        capacity: m.capacity(),
    }))
}

/// Start a sandbox: from a snapshot, from the image's boot template, or by a
/// cold boot. Returns once every guest agent answers. With `count`, the
/// response is a `SandboxBatch`.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    responses(
        (status = 201, description = "a Sandbox, or a SandboxBatch when `count` was given",
            body = inline(CreatedSandbox)),
        (status = 400, body = ErrorBody, description = "bad memory/cpus/count, malformed JSON or unknown fields"),
        (status = 404, body = ErrorBody, description = "unknown image or snapshot"),
        (status = 422, body = ErrorBody, description = "the snapshot's files are corrupted"),
        (status = 409, body = ErrorBody, description = "a requested host port is taken"),
        (status = 429, body = ErrorBody, description = "sandbox limit reached, or the address pool is exhausted"),
        (status = 500, body = ErrorBody, description = "QEMU failed, or the network could not be set up"),
        (status = 502, body = ErrorBody, description = "the guest agent failed, or the guest's network did not come up"),
        (status = 503, body = ErrorBody, description = "`capacity_exceeded`: the host's memory commitment would be passed; or `network: nat` asked for on a host that cannot give sandboxes a network"),
        (status = 504, body = ErrorBody, description = "the guest did not boot in time"),
        (status = 507, body = ErrorBody, description = "the daemon's filesystem is under its free-space reserve")))]
async fn create_sandbox(
    State(m): State<AppState>,
    JsonBody(req): JsonBody<CreateSandbox>,
) -> Result<Response, ApiError> {
    // Run the spawn on its own task: if the client disconnects, the spawn
    // still completes or cleans up, instead of being dropped half-way.
    let created = tokio::spawn(async move { m.create(req).await })
        .await
        .map_err(|e| ApiError::internal(format!("spawn task failed: {e}")))??;
    Ok(match created {
        Created::One(sb) => (StatusCode::CREATED, Json(*sb)).into_response(),
        Created::Batch(b) => (StatusCode::CREATED, Json(b)).into_response(),
    })
}

/// The body of a 201 from `POST /v1/sandboxes`.
#[derive(utoipa::ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
enum CreatedSandbox {
    One(Box<Sandbox>),
    Batch(SandboxBatch),
}

/// All sandboxes, in any state; `?metadata.KEY=VALUE` (repeatable) lists
/// only those with every given pair.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("metadata.KEY" = Option<String>, Query,
        description = "only sandboxes whose metadata KEY is this value (repeatable, e.g. `metadata.team=a`)")),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
async fn list_sandboxes(
    State(m): State<AppState>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Json<SandboxList>, ApiError> {
    let mut filters = std::collections::BTreeMap::new();
    for (k, v) in q {
        match k.strip_prefix(METADATA_QUERY_PREFIX) {
            Some(key) if !key.is_empty() => {
                filters.insert(key.to_string(), v);
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {k:?}: filter with metadata.KEY=VALUE"
                )))
            }
        }
    }
    Ok(Json(SandboxList {
        sandboxes: m.list(&filters)?,
    }))
}

/// One sandbox, with the memory use of its QEMU.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)))]
async fn get_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Sandbox>, ApiError> {
    m.get(&id).map(Json)
}

/// Stop a sandbox and delete everything it had.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    tokio::spawn(async move { m.remove(&id).await })
        .await
        .map_err(|e| ApiError::internal(format!("remove task failed: {e}")))??;
    Ok(StatusCode::NO_CONTENT)
}

fn agent_error(id: &str, e: AgentError) -> ApiError {
    match e {
        AgentError::Timeout(d) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            codes::GUEST_TIMEOUT,
            format!(
                "the guest agent of {id} did not answer within {d:?}; the guest may be hung — see `forkvm logs {id}`"
            ),
        ),
        AgentError::Guest { code, message } => {
            let status = match code.as_str() {
                forkvm_agent_protocol::ERR_NOT_FOUND => StatusCode::NOT_FOUND,
                forkvm_agent_protocol::ERR_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
                forkvm_agent_protocol::ERR_INVALID | forkvm_agent_protocol::ERR_SPAWN => {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::BAD_GATEWAY,
            };
            let c = match status {
                StatusCode::NOT_FOUND => codes::NOT_FOUND,
                StatusCode::PAYLOAD_TOO_LARGE => codes::PAYLOAD_TOO_LARGE,
                StatusCode::BAD_REQUEST => codes::INVALID_REQUEST,
                _ => codes::GUEST_ERROR,
            };
            ApiError::new(status, c, message)
        }
        other => ApiError::new(
            StatusCode::BAD_GATEWAY,
            codes::GUEST_ERROR,
            format!("{other}; check `forkvm ps` and `forkvm logs {id}`"),
        ),
    }
}

/// Run a command in the sandbox and wait for it to finish; or, with
/// `stream: true`, stream its output as NDJSON [`ExecEvent`] lines.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "the command ran (whatever its exit code): one `ExecResult`; or, with `stream: true`, one `ExecEvent` per line as output happens, ending with `exit` or `error`",
            content((ExecResult = "application/json"), (ExecEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody, description = "bad request or the command could not start"),
        (status = 404, body = ErrorBody, description = "no such sandbox or executable"),
        (status = 409, body = ErrorBody, description = "the sandbox is not running"),
        (status = 502, body = ErrorBody, description = "the guest went away"),
        (status = 504, body = ErrorBody, description = "the guest did not answer")))]
async fn exec(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    let l = &m.cfg.limits;
    // The image's config gives the defaults (docs/images.md).
    let mut req = req;
    let defaults = m.exec_defaults_of(&id)?;
    if req.argv.is_empty() {
        req.argv = defaults.default_argv();
        if req.argv.is_empty() {
            return Err(ApiError::invalid(
                "argv must name a program, e.g. [\"python3\", \"-c\", \"print(1)\"] \
                 (this sandbox's image has no default command: no Entrypoint or Cmd)",
            ));
        }
    }
    if req.argv[0].is_empty() {
        return Err(ApiError::invalid(
            "argv must name a program, e.g. [\"python3\", \"-c\", \"print(1)\"]",
        ));
    }
    // The image's Env, then the sandbox's own, then the request's.
    let mut env = defaults.env_map();
    env.append(&mut m.get(&id)?.env);
    env.append(&mut req.env);
    req.env = env;
    req.cwd = req.cwd.or(defaults.working_dir);
    req.user = req.user.or(defaults.user);
    let stdin = match (req.stdin, req.stdin_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("give stdin or stdin_base64, not both"))
        }
        (Some(s), None) => s.into_bytes(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.as_bytes())
            .map_err(|e| ApiError::invalid(format!("stdin_base64 is not valid base64: {e}")))?,
        (None, None) => Vec::new(),
    };
    if stdin.len() as u64 > l.max_file_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::PAYLOAD_TOO_LARGE,
            format!(
                "stdin is {} bytes, over the limit of {}",
                stdin.len(),
                l.max_file_bytes
            ),
        ));
    }
    let timeout_ms = req.timeout_ms.unwrap_or(l.max_exec_timeout_ms);
    if timeout_ms == 0 || timeout_ms > l.max_exec_timeout_ms {
        return Err(ApiError::invalid(format!(
            "timeout_ms must be between 1 and {}",
            l.max_exec_timeout_ms
        )));
    }
    let max_output = req.max_output_bytes.unwrap_or(l.max_exec_output_bytes);
    if max_output > l.max_exec_output_bytes {
        return Err(ApiError::invalid(format!(
            "max_output_bytes may be at most {}",
            l.max_exec_output_bytes
        )));
    }
    let live = m.running(&id)?;
    let agent = live.agent().await.map_err(|e| agent_error(&id, e))?;
    let spec = ExecSpec {
        argv: req.argv,
        env: req.env,
        cwd: req.cwd,
        user: req.user,
        stdin,
        timeout_ms: Some(timeout_ms),
        max_output,
    };
    let deadline = Duration::from_millis(timeout_ms) + Manager::HOST_GRACE;
    if req.stream {
        return Ok(exec_stream(id, agent, spec, deadline));
    }
    let out = agent
        .exec(spec, deadline)
        .await
        .map_err(|e| agent_error(&id, e))?;
    let encoding = req.encoding.unwrap_or_default();
    let render = |b: &[u8]| match encoding {
        OutputEncoding::Utf8 => String::from_utf8_lossy(b).into_owned(),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(b),
    };
    Ok(Json(ExecResult {
        exit_code: out.exit_code,
        signal: out.signal,
        timed_out: out.timed_out,
        stdout: render(&out.stdout),
        stderr: render(&out.stderr),
        encoding,
        stdout_truncated: out.stdout_bytes > out.stdout.len() as u64,
        stderr_truncated: out.stderr_bytes > out.stderr.len() as u64,
        stdout_bytes: out.stdout_bytes,
        stderr_bytes: out.stderr_bytes,
        duration_ms: out.duration_ms,
    })
    .into_response())
}

/// The streamed form of exec: output chunks become NDJSON lines as the agent
/// delivers them. The status is 200 once the command is under way; a later
/// failure is the stream's last line (`error`), since the status is gone.
fn exec_stream(
    id: String,
    agent: Arc<crate::agent::AgentConn>,
    spec: ExecSpec,
    deadline: Duration,
) -> Response {
    let (tap_tx, mut tap_rx) = tokio::sync::mpsc::unbounded_channel();
    let (line_tx, line_rx) =
        tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
    let line = |ev: &ExecEvent| {
        let mut v = serde_json::to_vec(ev).unwrap_or_default();
        v.push(b'\n');
        Ok(Bytes::from(v))
    };
    tokio::spawn(async move {
        let run = agent.exec_tapped(spec, deadline, Some(tap_tx));
        tokio::pin!(run);
        let chunk = |(s, data): (forkvm_agent_protocol::Stream, Vec<u8>)| {
            let data = base64::engine::general_purpose::STANDARD.encode(data);
            match s {
                forkvm_agent_protocol::Stream::Stdout => ExecEvent::Stdout { data },
                forkvm_agent_protocol::Stream::Stderr => ExecEvent::Stderr { data },
            }
        };
        let result = loop {
            tokio::select! {
                Some(c) = tap_rx.recv() => {
                    // A client that hung up ends the stream, not the command.
                    let _ = line_tx.send(line(&chunk(c))).await;
                }
                r = &mut run => break r,
            }
        };
        while let Some(c) = tap_rx.recv().await {
            let _ = line_tx.send(line(&chunk(c))).await;
        }
        let last = match result {
            Ok(out) => ExecEvent::Exit {
                exit_code: out.exit_code,
                signal: out.signal,
                timed_out: out.timed_out,
                duration_ms: out.duration_ms,
                stdout_bytes: out.stdout_bytes,
                stderr_bytes: out.stderr_bytes,
            },
            Err(e) => {
                let e = agent_error(&id, e);
                ExecEvent::Error {
                    error: ErrorDetail {
                        code: e.code.to_string(),
                        message: e.message,
                    },
                }
            }
        };
        let _ = line_tx.send(line(&last)).await;
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(line_rx)),
    )
        .into_response()
}

/// Query of the file endpoints.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// Absolute path in the guest.
    path: String,
    /// Octal mode for writes (default 644).
    #[serde(default)]
    mode: Option<String>,
}

fn check_guest_path(p: &str) -> Result<(), ApiError> {
    if !p.starts_with('/') {
        return Err(ApiError::invalid(format!(
            "path must be absolute (got {p:?})"
        )));
    }
    if p.contains('\0') {
        return Err(ApiError::invalid("path must not contain NUL"));
    }
    Ok(())
}

fn file_query(
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<FileQuery, ApiError> {
    q.map(|Query(q)| q).map_err(|e| {
        ApiError::invalid(format!(
            "bad query: {}; use ?path=/absolute/path",
            e.body_text()
        ))
    })
}

/// Write a file in the guest (atomically: temp file, fsync, rename).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), FileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = FileWritten), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
async fn write_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<FileWritten>, ApiError> {
    let q = file_query(q)?;
    check_guest_path(&q.path)?;
    let body = body.map_err(|e| body_error(e.status(), e.body_text()))?;
    let mode = match &q.mode {
        Some(s) => u32::from_str_radix(s, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| {
                ApiError::invalid(format!("mode {s:?} is not an octal mode like 644"))
            })?,
        None => 0o644,
    };
    if body.len() as u64 > m.cfg.limits.max_file_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::PAYLOAD_TOO_LARGE,
            format!(
                "file is {} bytes, over the limit of {}",
                body.len(),
                m.cfg.limits.max_file_bytes
            ),
        ));
    }
    let live = m.running(&id)?;
    let agent = live.agent().await.map_err(|e| agent_error(&id, e))?;
    let size = agent
        .write_file(&q.path, mode, &body, Duration::from_secs(120))
        .await
        .map_err(|e| agent_error(&id, e))?;
    Ok(Json(FileWritten { path: q.path, size }))
}

/// Read a file from the guest.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), FileQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
async fn read_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = file_query(q)?;
    check_guest_path(&q.path)?;
    let live = m.running(&id)?;
    let agent = live.agent().await.map_err(|e| agent_error(&id, e))?;
    let data = agent
        .read_file(
            &q.path,
            m.cfg.limits.max_file_bytes,
            Duration::from_secs(120),
        )
        .await
        .map_err(|e| agent_error(&id, e))?;
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        "application/octet-stream".parse().expect("static header"),
    );
    Ok((h, data).into_response())
}

/// The serial console of the sandbox (the last 1 MiB).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/logs", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, content_type = "text/plain", body = String), (status = 404, body = ErrorBody)))]
async fn logs(State(m): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    m.get(&id)?;
    let text = crate::util::tail_file(&m.cfg.sandbox_paths(&id).console, 1 << 20);
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

/// The sandbox's published ports: guest port and the host loopback port
/// that reaches it (empty without a `nat` network).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Vec<forkvm_api::PortForward>), (status = 404, body = ErrorBody)))]
async fn ports(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<forkvm_api::PortForward>>, ApiError> {
    let sb = m.get(&id)?;
    Ok(Json(sb.network.map(|n| n.ports).unwrap_or_default()))
}

/// Snapshot a running sandbox; it keeps running.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = CreateSnapshot,
    responses((status = 201, body = Snapshot), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "not running, tag taken, or a snapshot is already in progress"),
        (status = 500, body = ErrorBody)))]
async fn snapshot_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<CreateSnapshot>,
) -> Result<(StatusCode, Json<Snapshot>), ApiError> {
    let s = tokio::spawn(async move {
        m.snapshot(&id, req.tag, None, crate::snapshot::Save::Diff)
            .await
    })
    .await
    .map_err(|e| ApiError::internal(format!("snapshot task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(s)))
}

/// Branch a running sandbox: snapshot it at this instant (it keeps running)
/// and spawn `count` children from that instant.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/branch", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = BranchRequest,
    responses((status = 201, body = BranchResult), (status = 400, body = ErrorBody, description = "bad count, or a mode or option not available yet"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "not running, another snapshot of it is in progress, or a requested host port is taken"),
        (status = 422, body = ErrorBody, description = "a snapshot of its chain is corrupted"),
        (status = 500, body = ErrorBody), (status = 502, body = ErrorBody, description = "a child's guest agent failed, or its network did not come up"),
        (status = 503, body = ErrorBody, description = "`capacity_exceeded`: the children would pass the host's memory commitment; or networking became unavailable"),
        (status = 504, body = ErrorBody, description = "a child did not resume in time"),
        (status = 507, body = ErrorBody, description = "the daemon's filesystem is under its free-space reserve")))]
async fn branch_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<BranchRequest>,
) -> Result<(StatusCode, Json<BranchResult>), ApiError> {
    let r = tokio::spawn(async move { m.branch(&id, req).await })
        .await
        .map_err(|e| ApiError::internal(format!("branch task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(r)))
}

/// All snapshots.
#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList)))]
async fn list_snapshots(State(m): State<AppState>) -> Result<Json<SnapshotList>, ApiError> {
    let mut v = m.pending.all();
    for r in m.db.snapshots()? {
        match m.snapshot_view(&r) {
            Ok(s) => v.push(s),
            Err(e) => tracing::warn!("snapshot {} unreadable: {}", r.id, e.message),
        }
    }
    Ok(Json(SnapshotList { snapshots: v }))
}

/// One snapshot, by id or tag.
#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn get_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Snapshot>, ApiError> {
    m.snapshot_by_ref(&id).map(Json)
}

/// Query of `DELETE /v1/snapshots/{id}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeleteSnapshotQuery {
    /// Also remove the sandboxes and snapshots that depend on it.
    #[serde(default)]
    force: bool,
}

/// Remove a snapshot. Refused with 409 while sandboxes or snapshots depend on it, unless `force`.
#[utoipa::path(delete, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag"), DeleteSnapshotQuery),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<DeleteSnapshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::invalid(format!("bad query: {}", e.body_text())))?;
    tokio::spawn(async move { m.remove_snapshot(&id, q.force).await })
        .await
        .map_err(|e| ApiError::internal(format!("remove task failed: {e}")))??;
    Ok(StatusCode::NO_CONTENT)
}

/// Set the warm-pool size of a snapshot (QEMU processes started ahead of time).
#[utoipa::path(put, path = "/v1/snapshots/{id}/pool", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    request_body = PoolConfig,
    responses((status = 200, body = Snapshot), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn set_pool(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PoolConfig>,
) -> Result<Json<Snapshot>, ApiError> {
    m.set_pool(&id, req.size).await.map(Json)
}

/// Merge a diff snapshot's chain into one standalone snapshot (kind `shared`,
/// no parent), from which the chain's links can then be removed.
#[utoipa::path(post, path = "/v1/snapshots/{id}/flatten", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    request_body = FlattenRequest,
    responses((status = 201, body = Snapshot), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "tag taken"),
        (status = 422, body = ErrorBody, description = "the chain is corrupted"),
        (status = 500, body = ErrorBody)))]
async fn flatten_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<FlattenRequest>,
) -> Result<(StatusCode, Json<Snapshot>), ApiError> {
    let s = tokio::spawn(async move { m.flatten(&id, req.tag).await })
        .await
        .map_err(|e| ApiError::internal(format!("flatten task failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
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
