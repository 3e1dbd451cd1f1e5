//! `/v1/sandboxes`: spawn, list, get, remove, logs and ports.

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::*;

use super::body::JsonBody;
use super::AppState;
use crate::actions::Created;
use crate::api::error::{detached, ApiError};

/// Start a sandbox: from a snapshot, from the image's boot template, or by a
/// cold boot. Returns once every guest agent answers. With `count`, the
/// response is a `SandboxBatch`.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body = CreateSandbox,
    responses(
        (status = 201, description = "a Sandbox, or a SandboxBatch when `count` was given",
            body = inline(CreatedSandbox)),
        (status = 400, body = ErrorBody, description = "bad memory/cpus/count, malformed JSON or unknown fields"),
        (status = 403, body = ErrorBody, description = "a volume source is forkvm's home (or holds or lies in it) or a kernel filesystem"),
        (status = 404, body = ErrorBody, description = "unknown image, snapshot or named volume"),
        (status = 422, body = ErrorBody, description = "the snapshot's files are corrupted"),
        (status = 409, body = ErrorBody, description = "a requested host port is taken"),
        (status = 429, body = ErrorBody, description = "sandbox limit reached, or the address pool is exhausted"),
        (status = 500, body = ErrorBody, description = "QEMU failed, or the network could not be set up"),
        (status = 502, body = ErrorBody, description = "the guest agent failed, or the guest's network did not come up"),
        (status = 503, body = ErrorBody, description = "`capacity_exceeded`: the host's memory commitment would be passed; or `network: nat` asked for on a host that cannot give sandboxes a network"),
        (status = 504, body = ErrorBody, description = "the guest did not boot in time"),
        (status = 507, body = ErrorBody, description = "the daemon's filesystem is under its free-space reserve")))]
pub(crate) async fn create_sandbox(
    State(m): State<AppState>,
    JsonBody(req): JsonBody<CreateSandbox>,
) -> Result<Response, ApiError> {
    // Run the spawn on its own task: if the client disconnects, the spawn
    // still completes or cleans up, instead of being dropped half-way.
    let created = detached("spawn", async move { m.create(req).await }).await?;
    Ok(match created {
        Created::One(sb) => (StatusCode::CREATED, Json(*sb)).into_response(),
        Created::Batch(b) => (StatusCode::CREATED, Json(b)).into_response(),
    })
}

/// The body of a 201 from `POST /v1/sandboxes`.
#[derive(utoipa::ToSchema, serde::Serialize)]
#[allow(dead_code)]
#[serde(untagged)]
pub(crate) enum CreatedSandbox {
    One(Box<Sandbox>),
    Batch(SandboxBatch),
}

/// All sandboxes, in any state; `?metadata.KEY=VALUE` (repeatable) lists
/// only those with every given pair.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(("metadata.KEY" = Option<String>, Query,
        description = "only sandboxes whose metadata KEY is this value (repeatable, e.g. `metadata.team=a`)")),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_sandboxes(
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
pub(crate) async fn get_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Sandbox>, ApiError> {
    m.get(&id).map(Json).map_err(ApiError::from)
}

/// The serial console of the sandbox (the last 1 MiB).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/logs", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, content_type = "text/plain", body = String), (status = 404, body = ErrorBody)))]
pub(crate) async fn logs(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    m.get(&id)?;
    let text = m.console_log(&id);
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

/// The sandbox's published ports: guest port and the host loopback port
/// that reaches it (empty without a `nat` network).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Vec<forkvm_api::PortForward>), (status = 404, body = ErrorBody)))]
pub(crate) async fn ports(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<forkvm_api::PortForward>>, ApiError> {
    let sb = m.get(&id)?;
    Ok(Json(sb.network.map(|n| n.ports).unwrap_or_default()))
}

/// Replace a running sandbox's egress allow-list without restarting it. New
/// connections follow the new list at once; established ones are kept
/// until they close.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = SetNetwork,
    responses((status = 200, body = NetworkInfo, description = "the sandbox's network with the new allow-list"),
        (status = 400, body = ErrorBody, description = "a bad allow-list entry, `allow_host` without `egress`, or a sandbox with network: none"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the sandbox is not running (paused, starting, failed) or is being snapshotted or paused"),
        (status = 500, body = ErrorBody, description = "the rules could not be applied; the sandbox keeps its old ones")))]
pub(crate) async fn set_network(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SetNetwork>,
) -> Result<Json<NetworkInfo>, ApiError> {
    // On its own task, so that a client going away cannot stop it between
    // the namespace's rules and the host's.
    detached("network", async move {
        m.set_network(&id, req.egress, req.allow_host).await
    })
    .await
    .map(Json)
}
