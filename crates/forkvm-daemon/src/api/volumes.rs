//! The REST handlers of `/v1/volumes…`: each parses its request and calls one
//! typed action of the [`Engine`](crate::actions::Engine).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use forkvm_api::{CreateVolume, ErrorBody, Volume, VolumeList};

use crate::actions::Engine;
use crate::api::body::JsonBody;
use crate::api::error::{detached, ApiError};

/// Named volumes.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList)))]
pub async fn list_volumes(State(m): State<Engine>) -> Json<VolumeList> {
    Json(VolumeList {
        volumes: m.list_volumes(),
    })
}

/// Create a named volume: an empty directory under the daemon's home that
/// sandboxes mount by name (`"source": "NAME"`).
#[utoipa::path(post, path = "/v1/volumes", tag = "volumes",
    request_body = CreateVolume,
    responses((status = 201, body = Volume),
        (status = 409, body = ErrorBody, description = "a volume of that name exists")))]
pub async fn create_volume(
    State(m): State<Engine>,
    JsonBody(req): JsonBody<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), ApiError> {
    Ok((StatusCode::CREATED, Json(m.create_volume(&req.name)?)))
}

/// Remove a named volume and its files. Refused with 409 while a sandbox
/// mounts it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "volume name")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete_volume(
    State(m): State<Engine>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    detached("remove", async move { m.remove_volume(&name).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
