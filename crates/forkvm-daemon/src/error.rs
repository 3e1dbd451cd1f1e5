//! The daemon's error type and its mapping to HTTP statuses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use forkvm_api::codes;
use forkvm_api::{ErrorBody, ErrorDetail};

/// An error with the status and code the API reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, codes::CONFLICT, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL, m)
    }
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::not_found(format!(
            "no sandbox with id {id:?}; list sandboxes with `forkvm ps`"
        ))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        crate::metrics::METRICS.error(self.code);
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}
