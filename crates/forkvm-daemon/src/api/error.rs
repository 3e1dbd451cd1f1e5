//! The REST front-end's rendering of engine errors: the one place an
//! [`EngineError`] becomes an HTTP status and an `{"error": {...}}` body.
//! The status is the wire code's ([`forkvm_api::codes::status_of`], the table
//! clients use too), except for [`ErrorKind::Forbidden`], a 403 whose code
//! is `invalid_request`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use forkvm_api::{ErrorBody, ErrorDetail};

use crate::error::{classify, EngineError, ErrorKind};

/// The HTTP status an engine error is answered with.
pub fn status(e: &EngineError) -> StatusCode {
    if e.kind == ErrorKind::Forbidden {
        return StatusCode::FORBIDDEN;
    }
    StatusCode::from_u16(forkvm_api::codes::status_of(e.code()))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// An engine error on its way to a REST client. Handlers return it; the
/// engine's errors convert into it with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError(pub EngineError);

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError(e)
    }
}

impl std::ops::Deref for ApiError {
    type Target = EngineError;
    fn deref(&self) -> &EngineError {
        &self.0
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The engine error's constructors, for the errors the front-end finds
/// itself (a bad query, a bad body).
impl ApiError {
    pub fn new(kind: ErrorKind, m: impl Into<String>) -> Self {
        ApiError(EngineError::new(kind, m))
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        ApiError(EngineError::invalid(m))
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        ApiError(EngineError::not_found(m))
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        ApiError(EngineError::conflict(m))
    }
    pub fn internal(m: impl Into<String>) -> Self {
        ApiError(EngineError::internal(m))
    }
    pub fn sandbox_not_found(id: &str) -> Self {
        ApiError(EngineError::sandbox_not_found(id))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Internal errors built without `EngineError::internal` are
        // classified here too.
        let e = classify(self.0);
        crate::actions::Engine::count_error(e.code());
        let body = ErrorBody { error: e.to_wire() };
        (status(&e), axum::Json(body)).into_response()
    }
}

/// A response for a failure of the HTTP exchange itself (a wrong method, a
/// missing token, a body too slow or too large), which has no engine error.
pub fn http_failure(
    status: StatusCode,
    code: &'static str,
    message: impl Into<String>,
) -> Response {
    crate::actions::Engine::count_error(code);
    let body = ErrorBody {
        error: ErrorDetail {
            code: code.to_string(),
            message: message.into(),
            hint: None,
        },
    };
    (status, axum::Json(body)).into_response()
}

/// Run an operation on a task of its own and wait for it: a client that
/// goes away (which drops the handler) then does not cut the operation
/// short, so a spawn, snapshot or merge completes or cleans up. `what`
/// names it if the task itself fails.
pub async fn detached<T, E>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    tokio::spawn(work)
        .await
        .map_err(|e| ApiError::internal(format!("{what} task failed: {e}")))?
        .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::HintAction;

    #[test]
    fn statuses_follow_the_code_table() {
        let s = |k| status(&EngineError::new(k, "m")).as_u16();
        assert_eq!(s(ErrorKind::Invalid), 400);
        assert_eq!(s(ErrorKind::Forbidden), 403);
        assert_eq!(s(ErrorKind::NotFound), 404);
        assert_eq!(s(ErrorKind::Conflict), 409);
        assert_eq!(s(ErrorKind::Guest), 502);
        assert_eq!(s(ErrorKind::GuestTimeout), 504);
        assert_eq!(s(ErrorKind::NoSpace), 507);
        assert_eq!(s(ErrorKind::CapacityExceeded), 503);
        assert_eq!(s(ErrorKind::Internal), 500);
    }

    #[test]
    fn the_body_carries_the_hint_as_words_and_as_an_action() {
        let e = EngineError::sandbox_not_found("sb-x");
        let d = EngineError::to_wire(&e);
        assert_eq!(d.code, "not_found");
        assert_eq!(d.message, "no sandbox with id \"sb-x\"; list the sandboxes");
        assert_eq!(d.hint.unwrap().action, HintAction::ListSandboxes);
        let json =
            serde_json::to_value(EngineError::to_wire(&EngineError::invalid("bad"))).unwrap();
        assert!(json.get("hint").is_none(), "{json}");
    }
}
