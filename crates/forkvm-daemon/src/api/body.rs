//! Request bodies parsed with the API's error format.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::api::error::ApiError;
use crate::error::ErrorKind;

/// A JSON body parsed with our error format: malformed JSON and unknown
/// fields are 400 `invalid_request` with serde's explanation.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| body_error(e.status(), e.body_text()))?;
        if bytes.is_empty() {
            return Err(ApiError::invalid("the request needs a JSON body"));
        }
        parse_object(&bytes).map(JsonBody)
    }
}

/// An optional JSON body: empty means `T::default()`. Errors as [`JsonBody`].
pub struct OptJsonBody<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptJsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| body_error(e.status(), e.body_text()))?;
        if bytes.is_empty() {
            return Ok(OptJsonBody(T::default()));
        }
        parse_object(&bytes).map(OptJsonBody)
    }
}

/// Parse a request body that must be a JSON object. serde would otherwise
/// fill a struct from an array (`[null, null]` is a positional struct), so
/// anything but an object is refused before it is parsed.
pub(crate) fn parse_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    let kind = match first {
        Some(b'{') => None,
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b'-' | b'0'..=b'9') => Some("a number"),
        Some(b't' | b'f') => Some("a boolean"),
        Some(b'n') => Some("null"),
        _ => Some("not JSON"),
    };
    if let Some(kind) = kind {
        return Err(ApiError::invalid(format!(
            "the request body must be a JSON object ({{\"field\": value, ...}}); this one is {kind}"
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

pub(crate) fn body_error(status: StatusCode, text: String) -> ApiError {
    if text.contains("timed out") || text.contains("timeout") {
        ApiError::new(
            ErrorKind::RequestTimeout,
            "the request body did not arrive in time (request_body_timeout_ms in GET /v1/info)",
        )
    } else if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            ErrorKind::TooLarge,
            format!("request body too large: {text}"),
        )
    } else {
        ApiError::invalid(format!("cannot read the request body: {text}"))
    }
}
