//! The REST handlers of time travel: checkpoints, timelines, retention,
//! rewind, diff and merge. Each parses its request and calls one typed action of the
//! [`Engine`](crate::actions::Engine) (see the parent module).

use axum::extract::{Path, State};
use axum::Json;
use forkvm_api::{
    Checkpoint, CheckpointRequest, Diff, DiffRequest, ErrorBody, MergeRequest, Merged, Retention,
    RewindRequest, Rewound, Timeline,
};

use crate::actions::Engine;
use crate::api::body::{JsonBody, OptJsonBody};
use crate::api::error::{detached, ApiError};

/// Checkpoint a running sandbox: a live save whose parent is its previous
/// checkpoint, so it stores only what changed since then. The guest stops
/// only for the final copy pass. Retention is applied afterwards.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = CheckpointRequest,
    responses((status = 200, body = Checkpoint),
        (status = 400, body = ErrorBody, description = "an invalid tag"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "not running, busy with a snapshot, the tag is taken, it owns its RAM, or its chain is full"),
        (status = 500, body = ErrorBody, description = "saving failed; the sandbox runs on"),
        (status = 507, body = ErrorBody, description = "no space; the sandbox runs on")))]
pub async fn checkpoint(
    State(m): State<Engine>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<CheckpointRequest>,
) -> Result<Json<Checkpoint>, ApiError> {
    // On its own task: a client that goes away does not cut a save short.
    detached(
        "checkpoint",
        async move { m.checkpoint(&id, req.tag).await },
    )
    .await
    .map(Json)
}

/// A sandbox's checkpoints, oldest first, with its retention policy and
/// what they store.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/timeline", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Timeline), (status = 404, body = ErrorBody)))]
pub async fn get_timeline(
    State(m): State<Engine>,
    Path(id): Path<String>,
) -> Result<Json<Timeline>, ApiError> {
    m.timeline(&id).map(Json).map_err(ApiError::from)
}

/// Set how many checkpoints a sandbox keeps, and prune by it now.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/timeline/retention", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = Retention,
    responses((status = 200, body = Timeline),
        (status = 400, body = ErrorBody, description = "a count of 0"),
        (status = 404, body = ErrorBody)))]
pub async fn set_retention(
    State(m): State<Engine>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<Retention>,
) -> Result<Json<Timeline>, ApiError> {
    detached("retention", async move { m.set_retention(&id, req).await })
        .await
        .map(Json)
}

/// Bring a running sandbox back to one of its checkpoints or snapshots as
/// the same sandbox: same id, metadata, network identity and ports; the
/// processes, memory and disk of the checkpoint. `checkpoint_first` saves
/// the present so the rewind can be undone.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/rewind", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = RewindRequest,
    responses((status = 200, body = Rewound),
        (status = 400, body = ErrorBody, description = "the target is not of the sandbox's lineage, or of another machine size"),
        (status = 404, body = ErrorBody, description = "no such sandbox or snapshot"),
        (status = 409, body = ErrorBody, description = "not running, or busy"),
        (status = 422, body = ErrorBody, description = "the target is corrupted; the sandbox runs on"),
        (status = 500, body = ErrorBody, description = "the restore failed; the sandbox is left paused at the target"),
        (status = 502, body = ErrorBody, description = "the guest did not come back; it is left paused at the target"),
        (status = 503, body = ErrorBody, description = "`capacity_exceeded`"),
        (status = 507, body = ErrorBody, description = "no space")))]
pub async fn rewind(
    State(m): State<Engine>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<RewindRequest>,
) -> Result<Json<Rewound>, ApiError> {
    detached("rewind", async move { m.rewind(&id, req).await })
        .await
        .map(Json)
}

/// The filesystem differences between `{id}` and `b` (sandboxes, snapshots
/// or checkpoints): added, deleted, modified paths with kinds, sizes and
/// modes, and with `text` a unified diff of text files. Read through the
/// guests; a snapshot is read through a temporary clone.
#[utoipa::path(post, path = "/v1/diff/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "a sandbox, snapshot or checkpoint (id or tag)")),
    request_body = DiffRequest,
    responses((status = 200, body = Diff),
        (status = 400, body = ErrorBody, description = "a relative path"),
        (status = 404, body = ErrorBody, description = "no such sandbox or snapshot"),
        (status = 409, body = ErrorBody, description = "a side cannot be read (starting, failed, paused without memory)"),
        (status = 502, body = ErrorBody, description = "a guest did not answer"),
        (status = 503, body = ErrorBody, description = "`capacity_exceeded`: no room for a snapshot's reader")))]
pub async fn diff(
    State(m): State<Engine>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<DiffRequest>,
) -> Result<Json<Diff>, ApiError> {
    // On its own task: its temporary readers are removed even if the
    // client goes away.
    detached("diff", async move { m.diff(&id, req).await })
        .await
        .map(Json)
}

/// Apply sandbox `{id}`'s filesystem changes since its branch point to the
/// running sandbox `into`, three-way against that branch point. Paths both
/// changed differently are conflicts: listed, and nothing is applied
/// unless a strategy settles them. All or nothing. Memory is not merged.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/merge", tag = "sandboxes",
    params(("id" = String, Path, description = "the child sandbox")),
    request_body = MergeRequest,
    responses((status = 200, body = Merged),
        (status = 400, body = ErrorBody, description = "no branch point, a relative path, or into itself"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "conflicts (listed; nothing changed), or the target is not running"),
        (status = 502, body = ErrorBody, description = "a guest failed; the merge was undone")))]
pub async fn merge(
    State(m): State<Engine>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<MergeRequest>,
) -> Result<Json<Merged>, ApiError> {
    detached("merge", async move { m.merge(&id, req).await })
        .await
        .map(Json)
}
