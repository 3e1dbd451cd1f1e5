//! `/v1/sandboxes/{id}/processes`: background processes and PTYs. Each
//! handler parses its request, calls one action of the [`Engine`](crate::actions::Engine) and
//! renders the result; streams become NDJSON [`ProcessEvent`] lines.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use forkvm_api::*;

use super::body::{body_error, JsonBody};
use super::{ndjson, AppState};
use crate::actions::ProcessStream;
use crate::actions::{ProcEvent, ProcStream};
use crate::api::error::ApiError;
use crate::error::agent_error;

fn process_ref(s: &str) -> Result<ProcessRef, ApiError> {
    ProcessRef::parse(s).map_err(|e| ApiError::invalid(format!("bad process: {e}")))
}

/// Stream a process's events as NDJSON until it ends, the client goes
/// away (which cancels the stream in the guest, not the process) or the
/// guest fails.
fn render(id: String, ps: ProcessStream) -> Response {
    let (lines, resp) = ndjson::response();
    tokio::spawn(async move {
        let ProcessStream { pid, mut events } = ps;
        if !lines.send(&ProcessEvent::Start { pid }).await {
            return;
        }
        let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
        loop {
            let line = match events.next().await {
                Ok(Some(ProcEvent::Started { pid })) => ProcessEvent::Start { pid },
                Ok(Some(ProcEvent::Data { stream, lost, data })) => {
                    let data = b64(&data);
                    match stream {
                        ProcStream::Stdout => ProcessEvent::Stdout { data, lost },
                        ProcStream::Stderr => ProcessEvent::Stderr { data, lost },
                        ProcStream::Pty => ProcessEvent::Pty { data, lost },
                    }
                }
                Ok(Some(ProcEvent::Keepalive)) => ProcessEvent::Keepalive,
                Ok(Some(ProcEvent::End(e))) => ProcessEvent::End {
                    exit_code: e.exit_code,
                    exited: e.exited,
                    signal: e.signal,
                    status: e.status,
                    error: e.error,
                },
                Ok(None) => return,
                Err(e) => {
                    let e = agent_error(&id, e);
                    let error = e.to_wire();
                    let _ = lines.send(&ProcessEvent::Error { error }).await;
                    return;
                }
            };
            let last = matches!(line, ProcessEvent::End { .. });
            if !lines.send(&line).await || last {
                return;
            }
        }
    });
    resp
}

/// Start a background process (optionally on a PTY). It belongs to the
/// sandbox, not to this request: by default the answer is its pid at once;
/// with `stream: true` its events follow as NDJSON until it ends.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = StartProcess,
    responses(
        (status = 201, body = ProcessStarted, description = "started; it runs in the background"),
        (status = 200, description = "with `stream: true`: one `ProcessEvent` per line, `start` first, then output, ending with `end` or `error`",
            content((ProcessEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody, description = "bad argv, tag, pty size or cwd; the program could not start; the tag is in use"),
        (status = 404, body = ErrorBody, description = "no such sandbox or executable"),
        (status = 409, body = ErrorBody, description = "the sandbox is not running, or its guest agent is too old for processes (rebuild its template)"),
        (status = 502, body = ErrorBody, description = "the guest went away"),
        (status = 504, body = ErrorBody, description = "the guest did not answer")))]
pub(crate) async fn start_process(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<StartProcess>,
) -> Result<Response, ApiError> {
    let (stream, tag) = (req.stream, req.tag.clone());
    let ps = m.start_process(&id, req).await?;
    if stream {
        return Ok(render(id, ps));
    }
    let pid = ps.pid;
    // Dropping the stream cancels it; the process runs on.
    drop(ps);
    Ok((StatusCode::CREATED, Json(ProcessStarted { pid, tag })).into_response())
}

/// The running background processes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = ProcessList),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn list_processes(
    State(m): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ProcessList>, ApiError> {
    m.list_processes(&id)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Attach to a process's output: what the sandbox kept of it (its last
/// 1 MiB) first, then live, ending with `end` when it exits. A process a
/// branch child inherited can be attached to in the child.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{process}/output", tag = "processes",
    params(("id" = String, Path, description = "sandbox id"),
        ("process" = String, Path, description = "the process's pid, or the tag it was started with")),
    responses(
        (status = 200, description = "one `ProcessEvent` per line: `start`, the kept output, live output, then `end` (or `error`)",
            content((ProcessEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody, description = "not a pid or a tag"),
        (status = 404, body = ErrorBody, description = "no such sandbox or process"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn attach_process(
    State(m): State<AppState>,
    Path((id, process)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let r = process_ref(&process)?;
    let ps = m.attach_process(&id, &r).await?;
    Ok(render(id, ps))
}

/// Write the body to a process's stdin (or type it into its PTY).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{process}/stdin", tag = "processes",
    params(("id" = String, Path, description = "sandbox id"),
        ("process" = String, Path, description = "pid or tag")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "queued for the process"),
        (status = 400, body = ErrorBody, description = "it has no stdin, or its stdin is closed"),
        (status = 404, body = ErrorBody, description = "no such sandbox or process"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn write_stdin(
    State(m): State<AppState>,
    Path((id, process)): Path<(String, String)>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let r = process_ref(&process)?;
    let body = body.map_err(|e| body_error(e.status(), e.body_text()))?;
    m.write_stdin(&id, &r, &body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Close a process's stdin (after what was written before): a `cat` then
/// sees end-of-file.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{process}/stdin", tag = "processes",
    params(("id" = String, Path, description = "sandbox id"),
        ("process" = String, Path, description = "pid or tag")),
    responses((status = 204),
        (status = 400, body = ErrorBody, description = "it has no stdin pipe (a PTY: write Ctrl-D instead)"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn close_stdin(
    State(m): State<AppState>,
    Path((id, process)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let r = process_ref(&process)?;
    m.close_stdin(&id, &r).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal to a process's group.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{process}/signal", tag = "processes",
    params(("id" = String, Path, description = "sandbox id"),
        ("process" = String, Path, description = "pid or tag")),
    request_body = SignalProcess,
    responses((status = 204),
        (status = 400, body = ErrorBody, description = "not a signal number"),
        (status = 404, body = ErrorBody, description = "no such sandbox or running process"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn signal_process(
    State(m): State<AppState>,
    Path((id, process)): Path<(String, String)>,
    JsonBody(req): JsonBody<SignalProcess>,
) -> Result<StatusCode, ApiError> {
    let r = process_ref(&process)?;
    m.signal_process(&id, &r, req.signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kill a process (SIGKILL to its group).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{process}", tag = "processes",
    params(("id" = String, Path, description = "sandbox id"),
        ("process" = String, Path, description = "pid or tag")),
    responses((status = 204),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such sandbox or running process"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn kill_process(
    State(m): State<AppState>,
    Path((id, process)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let r = process_ref(&process)?;
    m.kill_process(&id, &r).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resize a process's PTY.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/processes/{process}/pty", tag = "processes",
    params(("id" = String, Path, description = "sandbox id"),
        ("process" = String, Path, description = "pid or tag")),
    request_body = PtySize,
    responses((status = 204),
        (status = 400, body = ErrorBody, description = "a size out of range, or the process has no PTY"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn resize_pty(
    State(m): State<AppState>,
    Path((id, process)): Path<(String, String)>,
    JsonBody(size): JsonBody<PtySize>,
) -> Result<StatusCode, ApiError> {
    let r = process_ref(&process)?;
    m.resize_pty(&id, &r, size).await?;
    Ok(StatusCode::NO_CONTENT)
}
