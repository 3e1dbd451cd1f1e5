//! The REST handlers of pins and prune: each parses its request and calls
//! one typed action of the [`Engine`](crate::actions::Engine) (see the
//! parent module).

use axum::extract::{Path, State};
use axum::Json;
use forkvm_api::{ErrorBody, PruneRequest, PruneResult, Snapshot};

use crate::actions::Engine;
use crate::api::body::OptJsonBody;
use crate::api::error::{detached, ApiError};

/// Pin a snapshot: garbage collection never removes it, nor any snapshot
/// it builds on.
#[utoipa::path(put, path = "/v1/snapshots/{id}/pin", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the snapshot is still being written, failed, or is being collected right now"),
        (status = 422, body = ErrorBody, description = "the snapshot's files are corrupted")))]
pub async fn pin_snapshot(
    State(m): State<Engine>,
    Path(id): Path<String>,
) -> Result<Json<Snapshot>, ApiError> {
    m.set_pinned(&id, true).map(Json).map_err(ApiError::from)
}

/// Unpin a snapshot: garbage collection may remove it again once nothing
/// else keeps it (a tag, a sandbox, a snapshot built on it) and it is past
/// the grace period.
#[utoipa::path(delete, path = "/v1/snapshots/{id}/pin", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    responses((status = 200, body = Snapshot), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the snapshot is still being written, failed, or is being collected right now"),
        (status = 422, body = ErrorBody, description = "the snapshot's files are corrupted")))]
pub async fn unpin_snapshot(
    State(m): State<Engine>,
    Path(id): Path<String>,
) -> Result<Json<Snapshot>, ApiError> {
    m.set_pinned(&id, false).map(Json).map_err(ApiError::from)
}

/// Collect now the branch points nothing needs (untagged, unpinned, no
/// sandbox, no snapshot built on them) that are past the grace period, or
/// however young with `all`. `dry_run` only lists them.
#[utoipa::path(post, path = "/v1/snapshots/prune", tag = "snapshots",
    request_body = PruneRequest,
    responses((status = 200, body = PruneResult)))]
pub async fn prune_snapshots(
    State(m): State<Engine>,
    OptJsonBody(req): OptJsonBody<PruneRequest>,
) -> Result<Json<PruneResult>, ApiError> {
    // On its own task: a client that hangs up does not stop a removal
    // half-way.
    detached("prune", async move { m.prune(req).await })
        .await
        .map(Json)
}
