//! `/v1/sandboxes/{id}/fs/...`, `DELETE /v1/sandboxes/{id}/files` and
//! `/v1/sandboxes/{id}/archive`: filesystem operations, watches and
//! several files at once. Each handler parses its request, calls one action
//! of the [`Engine`](crate::actions::Engine) and renders the result.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::*;
use serde::Deserialize;

use super::body::{body_error, JsonBody};
use super::{ndjson, AppState};
use crate::actions::WatchEvent as AgentWatchEvent;
use crate::api::error::ApiError;
use crate::error::agent_error;

/// `?path=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Absolute path in the guest.
    path: String,
}

/// `?path=&depth=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Absolute path of a directory in the guest.
    path: String,
    /// Levels to descend (1-64, default 1: the directory's own entries).
    #[serde(default)]
    depth: Option<u32>,
}

/// `?path=&recursive=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// Absolute path of a directory in the guest.
    path: String,
    /// Watch its subdirectories too (default false).
    #[serde(default)]
    recursive: Option<bool>,
}

fn query<T>(q: Result<Query<T>, QueryRejection>, hint: &str) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::invalid(format!("bad query: {}; use {hint}", e.body_text())))
}

/// Describe one guest path, as `lstat` sees it.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/stat", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    responses((status = 200, body = EntryInfo),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "no such sandbox or path"),
        (status = 409, body = ErrorBody, description = "not running, or its guest agent is too old (rebuild its template)"),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn stat_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> Result<Json<EntryInfo>, ApiError> {
    let q = query(q, "?path=/absolute/path")?;
    m.stat_file(&id, &q.path)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Whether a guest path exists (a dangling symlink does).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/exists", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    responses((status = 200, body = Exists),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "no such sandbox"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn file_exists(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> Result<Json<Exists>, ApiError> {
    let q = query(q, "?path=/absolute/path")?;
    let exists = m.file_exists(&id, &q.path).await?;
    Ok(Json(Exists { exists }))
}

/// List a directory, `depth` levels down (symlinks are not followed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/list", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), ListQuery),
    responses((status = 200, body = EntryList),
        (status = 400, body = ErrorBody, description = "a relative path, a depth out of range, or not a directory"),
        (status = 404, body = ErrorBody, description = "no such sandbox or directory"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody, description = "more than 100,000 entries"),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn list_dir(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<EntryList>, ApiError> {
    let q = query(q, "?path=/absolute/dir&depth=1")?;
    m.list_dir(&id, &q.path, q.depth.unwrap_or(1))
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Make a directory and its missing parents (`mkdir -p`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fs/mkdir", tag = "files",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = MakeDir,
    responses((status = 200, body = DirMade, description = "made, or it was a directory already (`existed`)"),
        (status = 400, body = ErrorBody, description = "a relative path, or a file is in the way"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn make_dir(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<MakeDir>,
) -> Result<Json<DirMade>, ApiError> {
    m.make_dir(&id, &req.path)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Move (rename) a file or directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fs/move", tag = "files",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = MoveFile,
    responses((status = 200, body = EntryInfo, description = "the entry at its new path"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "no such sandbox or source"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn move_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<MoveFile>,
) -> Result<Json<EntryInfo>, ApiError> {
    m.move_file(&id, &req.source, &req.destination)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Remove a file, or a directory with everything in it (a symlink is
/// removed, not followed).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    responses((status = 204),
        (status = 400, body = ErrorBody, description = "a relative path, or `/`"),
        (status = 404, body = ErrorBody, description = "no such sandbox or path"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn remove_file(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let q = query(q, "?path=/absolute/path")?;
    m.remove_file(&id, &q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Watch a directory: NDJSON `WatchEvent` lines, `start` once the watch is
/// in place, then batches of changes, until the client disconnects.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/watch", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), WatchQuery),
    responses(
        (status = 200, description = "one `WatchEvent` per line: `start`, then `events` and `keepalive`; `error` if the watch ends (the directory went away)",
            content((WatchEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody, description = "a relative path, or not a directory"),
        (status = 404, body = ErrorBody, description = "no such sandbox or directory"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody, description = "the guest's inotify limits are reached"),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn watch_dir(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q, "?path=/absolute/dir&recursive=true")?;
    let mut w = m
        .watch_dir(&id, &q.path, q.recursive.unwrap_or(false))
        .await?;
    let (lines, resp) = ndjson::response();
    tokio::spawn(async move {
        if !lines.send(&WatchEvent::Start).await {
            return;
        }
        loop {
            let line = match w.next().await {
                Ok(Some(AgentWatchEvent::Started)) => continue,
                Ok(Some(AgentWatchEvent::Events { events, dropped })) => WatchEvent::Events {
                    events: crate::actions::fs_events(events),
                    dropped,
                },
                Ok(Some(AgentWatchEvent::Keepalive)) => WatchEvent::Keepalive,
                Ok(None) => return,
                Err(e) => {
                    let e = agent_error(&id, e);
                    let error = e.to_wire();
                    let _ = lines.send(&WatchEvent::Error { error }).await;
                    return;
                }
            };
            // A client that went away ends the watch (dropping `w`
            // cancels it in the guest).
            if !lines.send(&line).await {
                return;
            }
        }
    });
    Ok(resp)
}

/// Create a watcher to poll (the form for clients that cannot hold a
/// stream open).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fs/watchers", tag = "files",
    params(("id" = String, Path, description = "sandbox id")),
    request_body = CreateWatcher,
    responses((status = 201, body = Watcher),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "no such sandbox or directory"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody, description = "the sandbox has its maximum of 64 watchers, or the guest's inotify limits are reached"),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn create_watcher(
    State(m): State<AppState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<CreateWatcher>,
) -> Result<Response, ApiError> {
    let watcher_id = m.create_watcher(&id, &req.path, req.recursive).await?;
    Ok((StatusCode::CREATED, Json(Watcher { watcher_id })).into_response())
}

/// The changes a watcher saw since it was last polled.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/watchers/{watcher}", tag = "files",
    params(("id" = String, Path, description = "sandbox id"),
        ("watcher" = String, Path, description = "watcher id")),
    responses((status = 200, body = WatcherEvents),
        (status = 404, body = ErrorBody, description = "no such sandbox or watcher"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn poll_watcher(
    State(m): State<AppState>,
    Path((id, watcher)): Path<(String, String)>,
) -> Result<Json<WatcherEvents>, ApiError> {
    m.poll_watcher(&id, &watcher)
        .await
        .map(Json)
        .map_err(ApiError::from)
}

/// Remove a watcher.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/fs/watchers/{watcher}", tag = "files",
    params(("id" = String, Path, description = "sandbox id"),
        ("watcher" = String, Path, description = "watcher id")),
    responses((status = 204),
        (status = 404, body = ErrorBody, description = "no such sandbox or watcher"),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn remove_watcher(
    State(m): State<AppState>,
    Path((id, watcher)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    m.remove_watcher(&id, &watcher).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Download several files and directories as one tar (uncompressed),
/// each entry named by its absolute path without the leading `/`, so that
/// `PUT .../archive?path=/` puts them back where they were.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(("id" = String, Path, description = "sandbox id"),
        ("path" = Vec<String>, Query, description = "an absolute guest path (repeatable: `?path=/a&path=/b`)")),
    responses((status = 200, content_type = "application/x-tar", body = Vec<u8>),
        (status = 400, body = ErrorBody, description = "no path, a relative one, or an unknown parameter"),
        (status = 404, body = ErrorBody, description = "no such sandbox or path"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody, description = "the archive would pass max_file_bytes"),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn download_archive(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let pairs = query(q, "?path=/a&path=/b")?;
    let mut paths = Vec::new();
    for (k, v) in pairs {
        if k != "path" {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {k:?}; use ?path=/a&path=/b"
            )));
        }
        paths.push(v);
    }
    let tar = m.download_archive(&id, paths).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], tar).into_response())
}

/// Upload several files at once: the body is a tar (uncompressed),
/// unpacked under `path` (created if missing; entries cannot leave it),
/// with the owners and modes it records.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/archive", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "an uncompressed tar"),
    responses((status = 200, body = ArchiveWritten),
        (status = 400, body = ErrorBody, description = "a relative path, or the body is not a tar"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub(crate) async fn upload_archive(
    State(m): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ArchiveWritten>, ApiError> {
    let q = query(q, "?path=/absolute/dir")?;
    let body = body.map_err(|e| body_error(e.status(), e.body_text()))?;
    m.upload_archive(&id, &q.path, &body)
        .await
        .map(Json)
        .map_err(ApiError::from)
}
