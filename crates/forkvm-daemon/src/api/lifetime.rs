//! The REST handlers of timeouts, pause and resume: each parses its request
//! and calls one typed action of the [`Engine`](crate::actions::Engine)
//! (see the parent module).

use axum::extract::{Path, State};
use axum::Json;
use forkvm_api::{ErrorBody, PauseRequest, ResumeRequest, Sandbox, SetTimeout};

use crate::actions::Engine;
use crate::api::body::{JsonBody, OptJsonBody};
use crate::api::error::{detached, ApiError};

/// Prometheus metrics: spawns, branches, pauses, resumes, timeouts, errors
/// by code, sandboxes by state, per-sandbox memory and CPU, warm pools and
/// capacity (docs/lifetimes.md lists them).
#[utoipa::path(get, path = "/metrics", tag = "daemon",
    responses((status = 200, content_type = "text/plain", body = String,
        description = "the Prometheus text exposition format")))]
pub async fn metrics(State(m): State<Engine>) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.metrics_text(),
    )
        .into_response()
}

/// Set, change or clear a sandbox's timeout, counted from now (on a paused
/// sandbox: from its resume).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = SetTimeout,
    responses((status = 200, body = Sandbox),
        (status = 400, body = ErrorBody, description = "a timeout out of range"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the sandbox is still starting")))]
pub async fn set_timeout(
    State(m): State<Engine>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SetTimeout>,
) -> Result<Json<Sandbox>, ApiError> {
    m.set_timeout(&id, req).map(Json).map_err(ApiError::from)
}

/// Save a running sandbox to disk and free its RAM and QEMU. A clone stores
/// only the pages it changed since its snapshot. With `{"memory": false}`
/// only the disk is kept, and the resume cold-boots from it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = PauseRequest,
    responses((status = 200, body = Sandbox, description = "the sandbox, `paused`"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "not running, busy with a snapshot, or (`memory: false`) it has volumes"),
        (status = 502, body = ErrorBody, description = "`memory: false`: the guest did not write out its disk; the sandbox runs on"),
        (status = 500, body = ErrorBody, description = "saving failed; the sandbox runs on"),
        (status = 503, body = ErrorBody, description = "its volumes are not being served yet; the sandbox runs on"),
        (status = 504, body = ErrorBody, description = "its volumes did not come to rest; the sandbox runs on"),
        (status = 507, body = ErrorBody, description = "no space for the saved state; the sandbox runs on")))]
pub async fn pause(
    State(m): State<Engine>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<PauseRequest>,
) -> Result<Json<Sandbox>, ApiError> {
    let memory = req.memory != Some(false);
    detached(
        "pause",
        async move { m.pause(&id, "request", memory).await },
    )
    .await
    .map(Json)
}

/// Bring a paused sandbox back with the same id, memory, disk, network and
/// published ports; a filesystem-only pause (or `{"memory": false}`)
/// cold-boots from its disk instead.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = ResumeRequest,
    responses((status = 200, body = Sandbox, description = "the sandbox, `running`"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "not paused, or a published host port is taken now"),
        (status = 422, body = ErrorBody, description = "its saved state is corrupted"),
        (status = 500, body = ErrorBody, description = "QEMU failed; the sandbox stays paused"),
        (status = 502, body = ErrorBody, description = "the guest did not come back; it stays paused"),
        (status = 503, body = ErrorBody, description = "`capacity_exceeded`: the host's memory commitment would be passed"),
        (status = 507, body = ErrorBody, description = "the daemon's filesystem is under its free-space reserve")))]
pub async fn resume(
    State(m): State<Engine>,
    Path(id): Path<String>,
    OptJsonBody(req): OptJsonBody<ResumeRequest>,
) -> Result<Json<Sandbox>, ApiError> {
    detached("resume", async move { m.resume(&id, req).await })
        .await
        .map(Json)
}
