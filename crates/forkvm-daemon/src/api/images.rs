//! The REST handlers of `/v1/images…`: each parses its request and calls one
//! typed action of the [`Engine`](crate::actions::Engine) (see the parent
//! module).

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkvm_api::{BuildQuery, ErrorBody, Image, ImageEvent, ImageList, ImportQuery, PullImage};

use crate::actions::Engine;
use crate::api::body::JsonBody;
use crate::api::error::{detached, ApiError};

type Q<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn query<T>(q: Q<T>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::invalid(format!("bad query: {}", e.body_text())))
}

/// Installed images.
#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, body = ImageList)))]
pub async fn list_images(State(m): State<Engine>) -> Json<ImageList> {
    Json(ImageList {
        images: m.list_images(),
    })
}

/// One image, with the sandboxes and snapshots that use it.
#[utoipa::path(get, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path, description = "image name")),
    responses((status = 200, body = Image), (status = 404, body = ErrorBody)))]
pub async fn get_image(
    State(m): State<Engine>,
    Path(name): Path<String>,
) -> Result<Json<Image>, ApiError> {
    m.get_image(&name).map(Json).map_err(ApiError::from)
}

/// Remove an image. Refused with 409 (naming them) while sandboxes or
/// snapshots use it; its boot templates are removed with it.
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path, description = "image name")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete_image(
    State(m): State<Engine>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    detached("remove", async move { m.remove_image(&name).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pull an image from an OCI Distribution registry (manifest lists choose
/// linux/amd64; every blob is verified; layers already present are not
/// fetched again). With `stream`, progress as NDJSON [`ImageEvent`]s.
#[utoipa::path(post, path = "/v1/images", tag = "images",
    request_body = PullImage,
    responses((status = 201, body = Image),
        (status = 200, description = "with `stream`: NDJSON ImageEvent lines", content_type = "application/x-ndjson", body = ImageEvent),
        (status = 403, body = ErrorBody, description = "the registry refused the credentials"),
        (status = 404, body = ErrorBody, description = "no such repository, tag or digest"),
        (status = 409, body = ErrorBody, description = "an image of that name exists (use `replace`)"),
        (status = 422, body = ErrorBody, description = "a blob failed verification, or no linux/amd64 image"),
        (status = 502, body = ErrorBody, description = "the registry could not be reached")))]
pub async fn pull_image(
    State(m): State<Engine>,
    JsonBody(req): JsonBody<PullImage>,
) -> Result<Response, ApiError> {
    let plan = m.check_pull(&req)?;
    if req.stream {
        return Ok(super::ndjson::progress(move |tx| async move {
            m.pull_image(plan, tx).await
        }));
    }
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let image = detached("pull", async move { m.pull_image(plan, tx).await }).await?;
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

/// Import an image from the request body: a `docker save` tarball, an OCI
/// image layout as a tar, or a plain root filesystem tarball (plain, gzip
/// or zstd). Progress as NDJSON [`ImageEvent`]s, the last `done` or `error`.
#[utoipa::path(post, path = "/v1/images/import", tag = "images",
    params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the archive (a tar, plain, gzip or zstd)"),
    responses((status = 200, description = "NDJSON ImageEvent lines", content_type = "application/x-ndjson", body = ImageEvent),
        (status = 409, body = ErrorBody, description = "an image of that name exists (use `replace`)"),
        (status = 507, body = ErrorBody, description = "no room for the upload")))]
pub async fn import_image(
    State(m): State<Engine>,
    q: Q<ImportQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let q = match query(q).and_then(|q| {
        m.check_new_image_name(&q.name, q.replace.unwrap_or(false))?;
        m.check_disk(&format!("import of image {}", q.name))?;
        Ok(q)
    }) {
        Ok(q) => q,
        Err(e) => return Err(refuse_upload(body, e).await),
    };
    let upload = m.receive_upload(body.into_data_stream(), "import").await?;
    Ok(super::ndjson::progress(move |tx| async move {
        m.import_image(q, upload, tx).await
    }))
}

/// Build an image from a Dockerfile. The body is the build context as a tar;
/// the steps run inside a sandbox of the base image, never on the host.
/// Each step is cached by its input. Progress as NDJSON [`ImageEvent`]s.
#[utoipa::path(post, path = "/v1/images/build", tag = "images",
    params(BuildQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the build context as a tar"),
    responses((status = 200, description = "NDJSON ImageEvent lines", content_type = "application/x-ndjson", body = ImageEvent),
        (status = 409, body = ErrorBody, description = "an image of that name is in use by sandboxes or snapshots"),
        (status = 507, body = ErrorBody, description = "no room for the upload")))]
pub async fn build_image(
    State(m): State<Engine>,
    q: Q<BuildQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let q = match query(q).and_then(|q| {
        m.check_new_image_name(&q.tag, true)?;
        m.check_disk(&format!("build of image {}", q.tag))?;
        Ok(q)
    }) {
        Ok(q) => q,
        Err(e) => return Err(refuse_upload(body, e).await),
    };
    let upload = m.receive_upload(body.into_data_stream(), "build").await?;
    Ok(super::ndjson::progress(move |tx| async move {
        m.build_image(q, upload, tx).await
    }))
}

/// Refuse an upload before reading it: what is left of `body` is read and
/// dropped first (see
/// [`Engine::discard_upload`](crate::actions::Engine::discard_upload)), so
/// that the client gets `err` rather than a reset connection.
async fn refuse_upload(body: Body, err: ApiError) -> ApiError {
    crate::actions::Engine::discard_upload(body.into_data_stream()).await;
    err
}
