//! E2B's snapshot management over forkvm's snapshots: `GET /snapshots`
//! (`Sandbox.list_snapshots()`) and `DELETE /templates/{id}`
//! (`Sandbox.delete_snapshot()`).
//!
//! A snapshot E2B knows is one a user made (`create_snapshot`, or forkvm's
//! own `snapshot` action): branch points, boot templates and the saved
//! states of paused sandboxes are forkvm's bookkeeping and are neither
//! listed nor deleted here. Its `snapshotID` is forkvm's snapshot id and its
//! `names` its tag, as `POST /sandboxes/{id}/snapshots` answers.
//!
//! `DELETE /templates/{id}` deletes only such snapshots: E2B templates built
//! with its template API do not exist here, and images are removed with
//! `forkvm image rm`. An unknown id is 404, which the SDK turns into
//! `False`.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};

use super::model::SnapshotInfo;
use super::paging::{decode_token, encode_token};
use crate::actions::Engine;
use crate::actions::{Origin, SnapshotRow};

pub(crate) fn router() -> Router<Engine> {
    Router::new()
        .route("/snapshots", get(list))
        .route("/templates/{id}", delete(remove))
}

/// What `POST /sandboxes/{id}/snapshots` cannot do, refused with 400 (the
/// status E2B gives where the feature is off) rather than done otherwise:
/// a filesystem-only snapshot (`memory: false`, the SDK's
/// `mode="filesystem"`), whose sandboxes would cold-boot; forkvm's
/// snapshots always hold memory and disk.
pub(crate) fn unsupported(req: &super::model::SnapshotRequest) -> Option<Response> {
    (req.memory == Some(false)).then(|| {
        super::error(
            StatusCode::BAD_REQUEST,
            "filesystem-only snapshots (mode=\"filesystem\") are not offered by forkvm: its \
             snapshots hold memory and disk; omit mode for a full one (docs/e2b.md)"
                .into(),
        )
    })
}

/// A snapshot the user made, which E2B calls a snapshot template.
fn is_users(row: &SnapshotRow) -> bool {
    row.template_key.is_none() && matches!(row.origin, Origin::Snapshot | Origin::Pull)
}

fn info(row: &SnapshotRow) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: row.id.clone(),
        names: row.tag.clone().into_iter().collect(),
    }
}

/// The page key of a row: newest first, then by id.
fn key(row: &SnapshotRow) -> (String, String) {
    (row.created_at.clone(), row.id.clone())
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: the user's
/// snapshots, newest first, paged with the `x-next-token` header.
/// `sandboxID` keeps those taken of that sandbox, `name` those tagged so.
async fn list(State(m): State<Engine>, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let limit = match super::paging::page_limit(&q) {
        Ok(n) => n,
        Err(m) => return super::error(StatusCode::BAD_REQUEST, m),
    };
    let after = match q.get("nextToken").map(|t| decode_token(t)) {
        None => None,
        Some(Some(k)) => Some(k),
        Some(None) => {
            return super::error(
                StatusCode::BAD_REQUEST,
                "nextToken is not one this server gave; start again without it".into(),
            )
        }
    };
    let rows = match m.snapshot_records() {
        Ok(r) => r,
        Err(e) => return super::error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let sandbox = q.get("sandboxID");
    let name = q.get("name");
    let mut v: Vec<SnapshotRow> = rows
        .into_iter()
        .filter(is_users)
        .filter(|r| sandbox.is_none_or(|s| *s == r.source))
        .filter(|r| name.is_none_or(|n| r.tag.as_ref() == Some(n) || *n == r.id))
        .filter(|r| after.as_ref().is_none_or(|a| key(r) < *a))
        .collect();
    v.sort_by_key(|r| std::cmp::Reverse(key(r)));
    let more = v.len() > limit;
    v.truncate(limit);
    let out: Vec<SnapshotInfo> = v.iter().map(info).collect();
    let mut r = Json(out).into_response();
    if more {
        if let Some(h) = v
            .last()
            .and_then(|last| HeaderValue::from_str(&encode_token(&key(last).0, &key(last).1)).ok())
        {
            r.headers_mut().insert("x-next-token", h);
        }
    }
    r
}

/// `DELETE /templates/{id}`: delete a snapshot the user made (204), 404 when
/// there is none by that id or tag. One that sandboxes still run from is
/// refused (409) with their ids: forkvm's snapshot is their disk's base.
async fn remove(State(m): State<Engine>, Path(id): Path<String>) -> Response {
    let row = match m.snapshot_record(&id) {
        Ok(Some(r)) => r,
        Ok(None) => {
            let what = if m.image_exists(&id) {
                format!(
                    "{id} is an image, not a snapshot; E2B's template API is not served \
                     (docs/e2b.md): remove images with `forkvm image rm {id}`"
                )
            } else {
                format!("snapshot {id} not found")
            };
            return super::error(StatusCode::NOT_FOUND, what);
        }
        Err(e) => return super::error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if !is_users(&row) {
        return super::error(
            StatusCode::NOT_FOUND,
            format!(
                "snapshot {id} is forkvm's own (a branch point, boot template or paused state), \
                 not one made with create_snapshot"
            ),
        );
    }
    let mm = m.clone();
    let sid = row.id.clone();
    let r = tokio::spawn(async move { mm.remove_snapshot(&sid, false).await }).await;
    match r {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => super::error(crate::api::error::status(&e), e.to_string()),
        Err(e) => super::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("task failed: {e}"),
        ),
    }
}
