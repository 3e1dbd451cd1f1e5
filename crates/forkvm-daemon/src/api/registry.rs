//! REST handlers of snapshot push and pull: each one typed call on the
//! [`Engine`](crate::actions::Engine), answered with the result or, with
//! `stream`, NDJSON [`TransferEvent`]s.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{ErrorBody, PullResult, PullSnapshot, PushResult, PushSnapshot, TransferEvent};

use super::ndjson::progress as ndjson;
use crate::actions::Engine;
use crate::api::body::JsonBody;
use crate::api::error::ApiError;

async fn run<F, Fut>(stream: bool, work: F) -> Result<Response, ApiError>
where
    F: FnOnce(tokio::sync::mpsc::UnboundedSender<TransferEvent>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<TransferEvent, crate::error::EngineError>>
        + Send
        + 'static,
{
    if stream {
        return Ok(ndjson(work));
    }
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let ev = crate::api::error::detached("transfer", work(tx)).await?;
    Ok(match ev {
        TransferEvent::Pushed { result } => (StatusCode::OK, Json(result)).into_response(),
        TransferEvent::Pulled { result } => (StatusCode::CREATED, Json(*result)).into_response(),
        other => (StatusCode::OK, Json(other)).into_response(),
    })
}

/// Push a snapshot, with its chain and base image, to an OCI registry
/// (docs/registry.md). Blobs and links the registry has are not sent.
#[utoipa::path(post, path = "/v1/snapshots/{id}/push", tag = "snapshots",
    params(("id" = String, Path, description = "snapshot id or tag")),
    request_body = PushSnapshot,
    responses((status = 200, description = "what was sent; with `stream`, NDJSON TransferEvent lines ending in `pushed`",
            content((PushResult = "application/json"), (TransferEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody, description = "a bad reference, or a snapshot that cannot be pushed (volumes)"),
        (status = 403, body = ErrorBody, description = "the registry refused the credentials"),
        (status = 404, body = ErrorBody, description = "no such snapshot"),
        (status = 409, body = ErrorBody, description = "the snapshot is still being written"),
        (status = 502, body = ErrorBody, description = "the registry could not be reached")))]
pub async fn push_snapshot(
    State(m): State<Engine>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PushSnapshot>,
) -> Result<Response, ApiError> {
    let id = m.check_push(&id, &req)?;
    run(req.stream, move |tx| async move {
        m.push_snapshot(id, req, tx).await
    })
    .await
}

/// Pull a snapshot pushed by `push` (on any host) and publish it here, with
/// the links of its chain and the image this host lacks. Every blob is
/// verified; the compatibility rule is checked before anything is written.
#[utoipa::path(post, path = "/v1/snapshots/pull", tag = "snapshots",
    request_body = PullSnapshot,
    responses((status = 201, body = PullResult),
        (status = 200, description = "with `stream`: NDJSON TransferEvent lines", content_type = "application/x-ndjson", body = TransferEvent),
        (status = 403, body = ErrorBody, description = "the registry refused the credentials"),
        (status = 404, body = ErrorBody, description = "no such repository, tag or digest"),
        (status = 409, body = ErrorBody, description = "the tag is taken, or another snapshot has the pulled one's id"),
        (status = 422, body = ErrorBody, description = "`incompatible_snapshot`: this host cannot restore it; `invalid_image`: a blob failed verification or the artifact is malformed"),
        (status = 502, body = ErrorBody, description = "the registry could not be reached"),
        (status = 507, body = ErrorBody, description = "no room")))]
pub async fn pull_snapshot(
    State(m): State<Engine>,
    JsonBody(req): JsonBody<PullSnapshot>,
) -> Result<Response, ApiError> {
    m.check_pull_snapshot(&req)?;
    run(req.stream, move |tx| async move {
        m.pull_snapshot(req, tx).await
    })
    .await
}
