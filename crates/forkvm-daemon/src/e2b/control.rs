//! E2B's control plane over the engine's actions: each handler parses E2B's
//! body, calls the same typed action `/v1` calls, and renders E2B's answer.
//!
//! | E2B | forkvm action |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | `create` (image or snapshot) |
//! | `GET /sandboxes/{id}` | `get` |
//! | `GET /sandboxes`, `GET /v2/sandboxes` (paged) | `list` |
//! | `DELETE /sandboxes/{id}` | `remove` |
//! | `POST /sandboxes/{id}/pause` | `pause` |
//! | `POST /sandboxes/{id}/resume`, `…/connect`, `/v2/…/connect` | `resume` or `set_timeout` |
//! | `POST /sandboxes/{id}/timeout`, `…/refreshes` | `set_timeout` |
//! | `GET /sandboxes/{id}/metrics` | `get` (its usage) |
//! | `POST /sandboxes/{id}/fork` | `branch` (live) |
//! | `POST /sandboxes/{id}/snapshots` | `snapshot` |
//!
//! Only `running` and `paused` sandboxes exist for E2B (its two states): one
//! still starting is listed as running once it runs; a failed one is left
//! out, and `GET` of it answers 404 with its failure.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use forkvm_api::{
    BranchRequest, CreateSandbox, NetworkMode, OnTimeout, Sandbox, SandboxState, SetTimeout,
};
use serde::de::DeserializeOwned;

use super::model::*;
use super::paging::{decode_token, encode_token};
use super::{access_token, envd::ENVD_VERSION};
use crate::actions::Connected;
use crate::actions::Engine;
use crate::error::EngineError;

/// The daemon's token, which signs each sandbox's access token.
#[derive(Clone)]
pub(crate) struct ApiKey(pub Arc<String>);

/// What `clientID` says: E2B names the cluster node; forkvm has one host.
const CLIENT_ID: &str = "forkvm";
/// E2B's default timeout, when a body names none.
const DEFAULT_TIMEOUT_S: u64 = 15;
/// The most children one fork makes (forkvm's branch limit).
const MAX_FORK: u32 = 1000;

pub(crate) fn router(key: String) -> Router<Engine> {
    Router::new()
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", post(create).get(list_v2))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/timeout", post(timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/snapshots", post(snapshot))
        .fallback(|req: axum::extract::Request| async move {
            super::error(
                StatusCode::NOT_FOUND,
                format!(
                    "{} {} is not part of the E2B API forkvm serves (docs/e2b.md lists it)",
                    req.method(),
                    req.uri().path()
                ),
            )
        })
        .layer(Extension(ApiKey(Arc::new(key))))
}

/// An action's error as E2B's body, with the same status.
fn fail(e: EngineError) -> Response {
    super::error(crate::api::error::status(&e), e.to_string())
}

/// A refusal in E2B's shape; small, unlike a `Response`, so it can travel
/// in a `Result`.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        super::error(self.0, self.1)
    }
}

impl From<EngineError> for Refusal {
    fn from(e: EngineError) -> Self {
        Refusal(crate::api::error::status(&e), e.to_string())
    }
}

/// Parse a JSON body, or answer 400 saying what is wrong. An empty body is
/// the type's default where E2B allows one.
fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Refusal> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}" as &[u8]
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        Refusal(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

/// Run an action on a task of its own, so a client that goes away does not
/// cancel it half-way (as `/v1` does).
async fn detached<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::spawn(f)
        .await
        .map_err(|e| EngineError::internal(format!("task failed: {e}")))?
}

fn created(m: &Engine, key: &ApiKey, sb: &Sandbox) -> CreatedSandbox {
    CreatedSandbox {
        template_id: template_of(m, sb),
        sandbox_id: sb.id.clone(),
        client_id: CLIENT_ID.into(),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: access_token(&key.0, &sb.id),
        traffic_access_token: None,
        domain: None,
    }
}

/// E2B's template of a sandbox: the snapshot it was spawned from when that
/// is a snapshot of the user's (by tag when it has one), else its image.
fn template_of(m: &Engine, sb: &Sandbox) -> String {
    if let Some(s) = sb.snapshot.as_deref() {
        if let Ok(Some(row)) = m.snapshot_record(s) {
            if row.template_key.is_none() {
                return row.tag.unwrap_or(row.id);
            }
        }
    }
    sb.image.clone()
}

fn state_of(sb: &Sandbox) -> Option<&'static str> {
    match sb.state {
        SandboxState::Running | SandboxState::Starting => Some("running"),
        SandboxState::Paused => Some("paused"),
        SandboxState::Failed | SandboxState::Lost => None,
    }
}

fn listed(m: &Engine, sb: &Sandbox) -> Option<ListedSandbox> {
    let state = state_of(sb)?;
    let now = std::time::SystemTime::now();
    // endAt: when its timeout runs out; frozen time counts from now while
    // paused; a sandbox with no timeout (made by /v1) says so by a far date.
    let end_at = match &sb.lifetime {
        Some(l) => l.expires_at.clone().unwrap_or_else(|| {
            crate::actions::rfc3339(now + std::time::Duration::from_secs_f64(l.remaining_s))
        }),
        None => "9999-12-31T23:59:59Z".to_string(),
    };
    let disk = m.image_disk_bytes(&sb.image) >> 20;
    Some(ListedSandbox {
        template_id: template_of(m, sb),
        sandbox_id: sb.id.clone(),
        client_id: CLIENT_ID.into(),
        started_at: sb.created_at.clone(),
        end_at,
        cpu_count: sb.cpus,
        memory_mb: sb.memory_mib,
        disk_size_mb: disk,
        state,
        envd_version: ENVD_VERSION.into(),
        metadata: sb.metadata.clone(),
    })
}

/// Look a sandbox up as E2B sees it: a failed one is gone, with its failure.
fn lookup(m: &Engine, id: &str) -> Result<Sandbox, Refusal> {
    let sb = m.get(id)?;
    if sb.state == SandboxState::Failed {
        return Err(Refusal(
            StatusCode::NOT_FOUND,
            format!(
                "sandbox {id} failed ({}); remove it with DELETE /sandboxes/{id}",
                sb.failure.as_deref().unwrap_or("no reason recorded")
            ),
        ));
    }
    Ok(sb)
}

async fn create(
    State(m): State<Engine>,
    Extension(key): Extension<ApiKey>,
    bytes: axum::body::Bytes,
) -> Response {
    let req: NewSandbox = match body(&bytes) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    if req.mcp.as_ref().is_some_and(|v| !v.is_null()) {
        return super::error(
            StatusCode::BAD_REQUEST,
            "MCP gateways inside sandboxes are not offered by forkvm; forkvm itself serves MCP \
             (docs/mcp.md)"
                .into(),
        );
    }
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return super::error(
            StatusCode::BAD_REQUEST,
            "volume mounts are not offered through the E2B API".into(),
        );
    }
    let networked = req.allow_internet_access != Some(false) && m.network_available();
    let egress = match super::network::egress_of(req.network.as_ref()) {
        Ok(e) => e.filter(|_| networked),
        Err(why) => return super::error(StatusCode::BAD_REQUEST, why),
    };
    // templateID names a snapshot (id or tag) when one exists, else an image.
    let from_snapshot = matches!(m.snapshot_record(&req.template_id), Ok(Some(_)));
    let on_timeout = req.on_timeout();
    let spec = CreateSandbox {
        image: (!from_snapshot).then(|| req.template_id.clone()),
        snapshot: from_snapshot.then(|| req.template_id.clone()),
        metadata: req.metadata,
        env: req.env_vars,
        timeout: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT_S)),
        on_timeout,
        network: (!networked).then_some(NetworkMode::None),
        // Port 49999 (a code interpreter, when the image serves one) is
        // reachable through E2b-Sandbox-Port (super::ports).
        ports: networked.then(super::ports::published),
        egress,
        ..Default::default()
    };
    let mm = m.clone();
    match detached(async move { mm.create(spec).await }).await {
        Ok(crate::actions::Created::One(sb)) => {
            (StatusCode::CREATED, Json(created(&m, &key, &sb))).into_response()
        }
        Ok(crate::actions::Created::Batch(_)) => fail(EngineError::internal(
            "one sandbox was asked for and a batch came back",
        )),
        Err(e) if e.kind == crate::error::ErrorKind::NotFound => super::error(
            StatusCode::NOT_FOUND,
            format!(
                "{}; templateID names an image or a snapshot of this forkvm \
                 daemon. E2B's default template `base` is the image built from \
                 examples/e2b-base (docs/e2b.md)",
                e.message
            ),
        ),
        Err(e) => fail(e),
    }
}

/// E2B's `metadata` query: `key=value&key2=value2`, URL-encoded as a whole.
fn metadata_filter(q: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(m) = q.get("metadata") {
        for pair in m.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.insert(pct_decode(k), pct_decode(v));
        }
    }
    out
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(x) => {
                    out.push(x);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An RFC 3339 time with `Z` or a numeric offset (the SDK sends its local
/// time with one).
fn parse_time(s: &str) -> Option<std::time::SystemTime> {
    if s.ends_with('Z') || s.ends_with('z') {
        return crate::actions::parse_rfc3339(&s.replace('z', "Z"));
    }
    let (base, sign, off) = match s.len().checked_sub(6).map(|i| s.split_at(i)) {
        Some((b, o)) if o.starts_with('+') => (b, 1i64, &o[1..]),
        Some((b, o)) if o.starts_with('-') => (b, -1i64, &o[1..]),
        _ => return None,
    };
    let (h, mi) = off.split_once(':')?;
    let off_s = sign * (h.parse::<i64>().ok()? * 3600 + mi.parse::<i64>().ok()? * 60);
    let t = crate::actions::parse_rfc3339(&format!("{base}Z"))?;
    // Local time minus its offset is UTC.
    if off_s >= 0 {
        t.checked_sub(std::time::Duration::from_secs(off_s as u64))
    } else {
        t.checked_add(std::time::Duration::from_secs((-off_s) as u64))
    }
}

fn all_listed(m: &Engine, q: &BTreeMap<String, String>) -> Result<Vec<ListedSandbox>, Refusal> {
    let filter = metadata_filter(q);
    let states: Option<Vec<String>> = q
        .get("state")
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let after = match q.get("startedAfter") {
        None => None,
        Some(t) => Some(parse_time(t).ok_or_else(|| {
            Refusal(
                StatusCode::BAD_REQUEST,
                format!("startedAfter {t:?} is not an RFC 3339 time"),
            )
        })?),
    };
    let template = q.get("template");
    let mut v: Vec<ListedSandbox> = m
        .list(&filter)?
        .iter()
        .filter_map(|sb| listed(m, sb))
        .filter(|l| {
            states
                .as_ref()
                .is_none_or(|s| s.iter().any(|x| x == l.state))
        })
        .filter(|l| template.is_none_or(|t| *t == l.template_id))
        .filter(|l| {
            after.is_none_or(|a| {
                crate::actions::parse_rfc3339(&l.started_at).is_some_and(|s| s >= a)
            })
        })
        .collect();
    v.sort_by(|a, b| (&a.started_at, &a.sandbox_id).cmp(&(&b.started_at, &b.sandbox_id)));
    Ok(v)
}

/// `GET /sandboxes`: the running sandboxes, unpaged.
async fn list_v1(
    State(m): State<Engine>,
    Query(mut q): Query<BTreeMap<String, String>>,
) -> Response {
    q.entry("state".into()).or_insert_with(|| "running".into());
    match all_listed(&m, &q) {
        Ok(v) => Json(v).into_response(),
        Err(r) => r.into_response(),
    }
}

/// `GET /v2/sandboxes`: paged by `limit` and `nextToken`; the next page's
/// token comes in the `x-next-token` header. A token is the position after
/// the last sandbox of a page (its start time and id), so sandboxes created
/// or removed between pages neither repeat nor push others off.
async fn list_v2(State(m): State<Engine>, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let limit = match super::paging::page_limit(&q) {
        Ok(n) => n,
        Err(m) => return super::error(StatusCode::BAD_REQUEST, m),
    };
    // E2B lists the newest first unless asked otherwise.
    let desc = match q.get("order").map(String::as_str) {
        Some("asc") => false,
        None | Some("desc") => true,
        Some(o) => {
            return super::error(StatusCode::BAD_REQUEST, format!("order {o:?}: asc or desc"))
        }
    };
    let after = match q.get("nextToken").map(|t| decode_token(t)) {
        None => None,
        Some(Some(k)) => Some(k),
        Some(None) => {
            return super::error(
                StatusCode::BAD_REQUEST,
                "nextToken is not one this server gave; start again without it".into(),
            )
        }
    };
    let mut v = match all_listed(&m, &q) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if desc {
        v.reverse();
    }
    if let Some((t, id)) = after {
        v.retain(|l| {
            let k = (l.started_at.as_str(), l.sandbox_id.as_str());
            if desc {
                k < (t.as_str(), id.as_str())
            } else {
                k > (t.as_str(), id.as_str())
            }
        });
    }
    let more = v.len() > limit;
    v.truncate(limit);
    let mut r = Json(&v).into_response();
    if more {
        if let Some(last) = v.last() {
            let tok = encode_token(&last.started_at, &last.sandbox_id);
            if let Ok(h) = HeaderValue::from_str(&tok) {
                r.headers_mut().insert("x-next-token", h);
            }
        }
    }
    r
}

async fn detail(
    State(m): State<Engine>,
    Extension(key): Extension<ApiKey>,
    Path(id): Path<String>,
) -> Response {
    let sb = match lookup(&m, &id) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let Some(l) = listed(&m, &sb) else {
        return super::error(StatusCode::NOT_FOUND, format!("sandbox {id} not found"));
    };
    let on_timeout = match sb.lifetime.as_ref().map(|l| l.on_timeout) {
        Some(o) if o.pauses() => "pause",
        _ => "kill",
    };
    Json(SandboxDetail {
        listed: l,
        envd_access_token: access_token(&key.0, &sb.id),
        domain: None,
        lifecycle: Lifecycle {
            auto_resume: false,
            on_timeout,
        },
        allow_internet_access: sb.network.is_some(),
    })
    .into_response()
}

async fn kill(State(m): State<Engine>, Path(id): Path<String>) -> Response {
    let mm = m.clone();
    match detached(async move { mm.remove(&id).await }).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(e),
    }
}

async fn pause(
    State(m): State<Engine>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    let memory = match body::<PauseRequest>(&bytes) {
        Ok(r) => r.memory != Some(false),
        Err(r) => return r.into_response(),
    };
    match lookup(&m, &id) {
        Ok(sb) if sb.state == SandboxState::Paused => {
            return super::error(
                StatusCode::CONFLICT,
                format!("sandbox {id} is already paused"),
            )
        }
        Ok(_) => {}
        Err(r) => return r.into_response(),
    }
    let mm = m.clone();
    match detached(async move { mm.pause(&id, "e2b pause", memory).await }).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(e),
    }
}

/// Bring a paused sandbox back (201), or, for one that runs, only set its
/// timeout (200): E2B's connect. `resume` (v1) refuses a running one.
async fn wake(
    m: Engine,
    key: ApiKey,
    id: String,
    req: ConnectRequest,
    running_ok: bool,
) -> Response {
    let sb = match lookup(&m, &id) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if sb.state != SandboxState::Paused && !running_ok {
        return super::error(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        );
    }
    if sb.state == SandboxState::Paused && req.auto_pause == Some(true) {
        let set = SetTimeout {
            timeout: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT_S)),
            on_timeout: Some(OnTimeout::Pause),
        };
        if let Err(e) = m.set_timeout(&id, set) {
            return fail(e);
        }
    }
    let mm = m.clone();
    let (timeout, memory) = (req.timeout, req.memory);
    match detached(async move { mm.resume_or_extend(&id, timeout, memory).await }).await {
        Ok((sb, Connected::Resumed)) => {
            (StatusCode::CREATED, Json(created(&m, &key, &sb))).into_response()
        }
        Ok((sb, Connected::Extended)) => {
            (StatusCode::OK, Json(created(&m, &key, &sb))).into_response()
        }
        Err(e) => fail(e),
    }
}

async fn connect(
    State(m): State<Engine>,
    Extension(key): Extension<ApiKey>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    match body::<ConnectRequest>(&bytes) {
        Ok(req) => wake(m, key, id, req, true).await,
        Err(r) => r.into_response(),
    }
}

async fn resume(
    State(m): State<Engine>,
    Extension(key): Extension<ApiKey>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    match body::<ConnectRequest>(&bytes) {
        Ok(req) => wake(m, key, id, req, false).await,
        Err(r) => r.into_response(),
    }
}

fn retime(m: &Engine, id: &str, seconds: u64) -> Response {
    if let Err(r) = lookup(m, id) {
        return r.into_response();
    }
    // E2B takes 0 as "now"; forkvm's shortest timeout is a second.
    let seconds = seconds.max(1);
    match m.set_timeout(
        id,
        SetTimeout {
            timeout: Some(seconds),
            on_timeout: None,
        },
    ) {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(e),
    }
}

async fn timeout(
    State(m): State<Engine>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    match body::<TimeoutRequest>(&bytes) {
        Ok(req) => retime(&m, &id, req.timeout),
        Err(r) => r.into_response(),
    }
}

async fn refresh(
    State(m): State<Engine>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    match body::<RefreshRequest>(&bytes) {
        Ok(req) => retime(&m, &id, req.duration.unwrap_or(DEFAULT_TIMEOUT_S)),
        Err(r) => r.into_response(),
    }
}

/// One sample, now: forkvm keeps no history of a sandbox's use. CPU is the
/// average since the sandbox started; memory is its QEMU's proportional
/// share on the host (what admission counts), disk its own files on the host.
async fn metrics(
    State(m): State<Engine>,
    Path(id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let sb = match lookup(&m, &id) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let now = std::time::SystemTime::now();
    let unix = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // `start`/`end` (unix seconds) bound the window; the one sample is now.
    let bound = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    if bound("start").is_some_and(|s| s > unix) || bound("end").is_some_and(|e| e < unix) {
        return Json(Vec::<Metric>::new()).into_response();
    }
    let Some(usage) = sb.usage.as_ref() else {
        return Json(Vec::<Metric>::new()).into_response(); // paused: no samples
    };
    let up_ms = crate::actions::parse_rfc3339(&sb.created_at)
        .and_then(|t| now.duration_since(t).ok())
        .map(|d| d.as_millis() as f64)
        .unwrap_or(0.0);
    let cpu_pct = if up_ms > 0.0 {
        (usage.cpu_ms as f64 / (up_ms * sb.cpus.max(1) as f64) * 100.0).min(100.0)
    } else {
        0.0
    };
    let disk_total = m.image_disk_bytes(&sb.image);
    Json(vec![Metric {
        timestamp: crate::actions::rfc3339(now),
        timestamp_unix: unix,
        cpu_count: sb.cpus,
        cpu_used_pct: (cpu_pct * 100.0).round() / 100.0,
        mem_used: sb.memory.as_ref().map(|mu| mu.pss_kib * 1024).unwrap_or(0),
        mem_total: u64::from(sb.memory_mib) << 20,
        mem_cache: 0,
        disk_used: usage.disk_bytes,
        disk_total,
    }])
    .into_response()
}

/// E2B's fork is forkvm's live branch: the source runs on and each child
/// continues from the same instant with its own id and access token. The
/// children get the requested timeout (E2B's default 15 s), not the source's.
async fn fork(
    State(m): State<Engine>,
    Extension(key): Extension<ApiKey>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    let req: ForkRequest = match body(&bytes) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORK).contains(&count) {
        return super::error(
            StatusCode::BAD_REQUEST,
            format!("count must be from 1 to {MAX_FORK}"),
        );
    }
    if let Err(r) = lookup(&m, &id) {
        return r.into_response();
    }
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    let mm = m.clone();
    let branch = BranchRequest {
        count: Some(count),
        timeout: Some(timeout),
        ..Default::default()
    };
    let r = match detached(async move { mm.branch(&id, branch).await }).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let results: Vec<ForkResult> = r
        .children
        .iter()
        .map(|c| ForkResult {
            sandbox: Some(created(&m, &key, c)),
            error: None,
        })
        .collect();
    (StatusCode::CREATED, Json(results)).into_response()
}

/// A snapshot of a running sandbox, usable as a `templateID`.
async fn snapshot(
    State(m): State<Engine>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    let req: SnapshotRequest = match body(&bytes) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    if let Some(r) = super::snapshots::unsupported(&req) {
        return r;
    }
    if let Err(r) = lookup(&m, &id) {
        return r.into_response();
    }
    let mm = m.clone();
    let tag = req.name.clone();
    match detached(async move { mm.snapshot(&id, tag).await }).await {
        Ok(s) => (
            StatusCode::CREATED,
            Json(SnapshotInfo {
                names: s.tag.clone().into_iter().collect(),
                snapshot_id: s.id,
            }),
        )
            .into_response(),
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_query_is_decoded() {
        let mut q = BTreeMap::new();
        q.insert("metadata".to_string(), "a=1&b=x%20y&c".to_string());
        let f = metadata_filter(&q);
        assert_eq!(f["a"], "1");
        assert_eq!(f["b"], "x y");
        assert_eq!(f["c"], "");
    }

    #[test]
    fn times_with_offsets_are_utc() {
        let z = parse_time("2026-11-25T10:00:00Z").unwrap();
        assert_eq!(parse_time("2026-11-25T12:00:00+02:00"), Some(z));
        assert_eq!(parse_time("2026-11-25T09:30:00.000000-00:30"), Some(z));
        assert_eq!(parse_time("yesterday"), None);
    }
}
