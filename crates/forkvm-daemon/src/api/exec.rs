//! Commands and files in a sandbox's guest, through its agent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use forkvm_api::*;
use serde::Deserialize;

use super::body::{body_error, JsonBody};
use super::AppState;
use crate::agent::ExecSpec;
use crate::error::{agent_error, EngineError};

/// Stop a sandbox and delete everything it had.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete_sandbox(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, EngineError> {
    tokio::spawn(async move { m.remove(&id).await })
        .await
        .map_err(|e| EngineError::internal(format!("remove task failed: {e}")))??;
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
) -> Result<Response, EngineError> {
    let stream = req.stream;
    let encoding = req.encoding.unwrap_or_default();
    let (agent, spec, deadline) = m.prepare_exec(&id, req).await?;
    if stream {
        return Ok(exec_stream(id, agent, spec, deadline));
    }
    let out = agent
        .exec(spec, deadline)
        .await
        .map_err(|e| agent_error(&id, e))?;
    Ok(Json(crate::exec::render_exec(out, encoding)).into_response())
}

/// The streamed form of exec: output chunks become NDJSON lines as the agent
/// delivers them. The status is 200 once the command is under way; a later
/// failure is the stream's last line (`error`), since the status is gone.
pub(crate) fn exec_stream(
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
                ExecEvent::Error { error: e.to_wire() }
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

pub(crate) fn file_query(
    q: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<FileQuery, EngineError> {
    q.map(|Query(q)| q).map_err(|e| {
        EngineError::invalid(format!(
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
) -> Result<Json<FileWritten>, EngineError> {
    let q = file_query(q)?;
    let body = body.map_err(|e| body_error(e.status(), e.body_text()))?;
    let mode = match &q.mode {
        Some(s) => Some(u32::from_str_radix(s, 8).map_err(|_| {
            EngineError::invalid(format!("mode {s:?} is not an octal mode like 644"))
        })?),
        None => None,
    };
    m.write_file(&id, q.path, mode, &body).await.map(Json)
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
) -> Result<Response, EngineError> {
    let q = file_query(q)?;
    let data = m.read_file(&id, &q.path).await?;
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        "application/octet-stream".parse().expect("static header"),
    );
    Ok((h, data).into_response())
}
