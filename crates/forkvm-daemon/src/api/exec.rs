//! Commands and files in a sandbox's guest, through its agent.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::*;
use serde::Deserialize;

use super::body::{body_error, JsonBody};
use super::AppState;
use crate::api::error::{detached, ApiError};

/// Stop a sandbox and delete everything it had.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    detached("remove", async move { m.remove(&id).await }).await?;
    Ok(StatusCode::NO_CONTENT)
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
pub(crate) async fn exec(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    if req.stream {
        return Ok(super::ndjson::events(m.exec_events(&id, req).await?));
    }
    Ok(Json(m.exec(&id, req).await?).into_response())
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

pub(crate) fn file_query(
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
pub(crate) async fn write_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<FileWritten>, ApiError> {
    let q = file_query(q)?;
    let body = body.map_err(|e| body_error(e.status(), e.body_text()))?;
    let mode =
        match &q.mode {
            Some(s) => Some(u32::from_str_radix(s, 8).map_err(|_| {
                ApiError::invalid(format!("mode {s:?} is not an octal mode like 644"))
            })?),
            None => None,
        };
    m.write_file(&id, q.path, mode, &body)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Read a file from the guest.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), FileQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub(crate) async fn read_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = file_query(q)?;
    let data = m.read_file(&id, &q.path).await?;
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        "application/octet-stream".parse().expect("static header"),
    );
    Ok((h, data).into_response())
}
