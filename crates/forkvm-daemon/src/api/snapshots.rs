//! `/v1/snapshots`, and snapshotting and branching a sandbox.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::*;
use serde::Deserialize;

use super::body::{JsonBody, OptJsonBody};
use super::AppState;
use crate::api::error::{detached, ApiError};

/// Snapshot a running sandbox; it keeps running.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = CreateSnapshot,
    responses((status = 201, body = Snapshot), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "not running, tag taken, or a snapshot is already in progress"),
        (status = 500, body = ErrorBody),
        (status = 503, body = ErrorBody, description = "its volumes are not being served (a moment after a daemon restart)"),
        (status = 504, body = ErrorBody, description = "its volumes did not come to rest: the guest did not answer")))]
pub(crate) async fn snapshot_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<CreateSnapshot>,
) -> Result<(StatusCode, Json<Snapshot>), ApiError> {
    let s = detached("snapshot", async move { m.snapshot(&id, req.tag).await }).await?;
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
pub(crate) async fn branch_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<BranchRequest>,
) -> Result<(StatusCode, Json<BranchResult>), ApiError> {
    let r = detached("branch", async move { m.branch(&id, req).await }).await?;
    Ok((StatusCode::CREATED, Json(r)))
}

/// All snapshots.
#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList)))]
pub(crate) async fn list_snapshots(
    State(m): State<AppState>,
) -> Result<Json<SnapshotList>, ApiError> {
    Ok(Json(m.list_snapshots()?))
}

/// One snapshot, by id or tag.
#[utoipa::path(get, path = "/v1/snapshots/{id}", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn get_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Snapshot>, ApiError> {
    m.snapshot_by_ref(&id).map(Json).map_err(ApiError::from)
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
pub(crate) async fn delete_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<DeleteSnapshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::invalid(format!("bad query: {}", e.body_text())))?;
    detached(
        "remove",
        async move { m.remove_snapshot(&id, q.force).await },
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set the warm-pool size of a snapshot (QEMU processes started ahead of time).
#[utoipa::path(put, path = "/v1/snapshots/{id}/pool", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    request_body = PoolConfig,
    responses((status = 200, body = Snapshot), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn set_pool(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PoolConfig>,
) -> Result<Json<Snapshot>, ApiError> {
    m.set_pool(&id, req.size)
        .await
        .map(Json)
        .map_err(ApiError::from)
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
pub(crate) async fn flatten_snapshot(
    State(m): State<AppState>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<FlattenRequest>,
) -> Result<(StatusCode, Json<Snapshot>), ApiError> {
    let s = detached("flatten", async move { m.flatten(&id, req.tag).await }).await?;
    Ok((StatusCode::CREATED, Json(s)))
}
