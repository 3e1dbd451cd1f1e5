//! The daemon's error type and its mapping to HTTP statuses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use forkvm_api::codes;
use forkvm_api::{ErrorBody, ErrorDetail};

use crate::agent::AgentError;

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
    /// A host-side failure; a full disk among its causes makes it
    /// `507 no_space` ([`classify`]).
    pub fn internal(m: impl Into<String>) -> Self {
        classify(Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            codes::INTERNAL,
            m,
        ))
    }
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::not_found(format!(
            "no sandbox with id {id:?}; list sandboxes with `forkvm ps`"
        ))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Errors built with `new(500, …)` are classified here too.
        let e = classify(self);
        crate::metrics::METRICS.error(e.code);
        let body = ErrorBody {
            error: ErrorDetail {
                code: e.code.to_string(),
                message: e.message,
            },
        };
        (e.status, axum::Json(body)).into_response()
    }
}

/// True for an error text that is a full disk, from whichever layer wrote
/// it: the kernel's `ENOSPC` ("No space left on device", os error 28), or
/// SQLite's `SQLITE_FULL` ("database or disk is full").
pub fn is_no_space(message: &str) -> bool {
    message.contains("No space left on device")
        || message.contains("os error 28")
        || message.contains("database or disk is full")
        || message.contains("Disk quota exceeded")
}

/// A 500 whose cause is a full disk becomes `507 no_space`, with what to do.
/// Errors reach the API as text from many layers (I/O, SQLite, QEMU and
/// qemu-img over QMP), so the text is what can be classified.
pub fn classify(e: ApiError) -> ApiError {
    if e.status == StatusCode::INTERNAL_SERVER_ERROR && is_no_space(&e.message) {
        let message = format!(
            "{}; the disk holding FORKVM_HOME is full: free space by removing snapshots \
             (`forkvm snapshot prune`), images or sandboxes",
            e.message
        );
        return ApiError::new(StatusCode::INSUFFICIENT_STORAGE, codes::NO_SPACE, message);
    }
    e
}

/// The API error for a failed request to the guest agent of sandbox `id`.
pub(crate) fn agent_error(id: &str, e: AgentError) -> ApiError {
    match e {
        AgentError::Timeout(d) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            codes::GUEST_TIMEOUT,
            format!(
                "the guest agent of {id} did not answer within {d:?}; the guest may be hung — see `forkvm logs {id}`"
            ),
        ),
        AgentError::Guest { code, message } => {
            let status = match code.as_str() {
                forkvm_agent_protocol::ERR_NOT_FOUND => StatusCode::NOT_FOUND,
                forkvm_agent_protocol::ERR_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
                forkvm_agent_protocol::ERR_INVALID | forkvm_agent_protocol::ERR_SPAWN => {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::BAD_GATEWAY,
            };
            let c = match status {
                StatusCode::NOT_FOUND => codes::NOT_FOUND,
                StatusCode::PAYLOAD_TOO_LARGE => codes::PAYLOAD_TOO_LARGE,
                StatusCode::BAD_REQUEST => codes::INVALID_REQUEST,
                _ => codes::GUEST_ERROR,
            };
            ApiError::new(status, c, message)
        }
        // The sandbox runs an agent from an older snapshot or template: a
        // state of the sandbox, which a rebuilt template fixes.
        e @ AgentError::Unsupported { .. } => {
            ApiError::conflict(format!("sandbox {id}: {e}"))
        }
        AgentError::InvalidArchive(m) => {
            ApiError::invalid(format!("the archive is not a tar this daemon can send: {m}"))
        }
        other => ApiError::new(
            StatusCode::BAD_GATEWAY,
            codes::GUEST_ERROR,
            format!("{other}; check `forkvm ps` and `forkvm logs {id}`"),
        ),
    }
}

/// Log a failed operation `what` on sandbox `id` (failures of the guest or
/// the host as warnings, the caller's mistakes at debug level) and hand the
/// error on.
pub(crate) fn logged(id: &str, what: &str, e: ApiError) -> ApiError {
    if e.status.is_server_error() {
        tracing::warn!(sandbox = %id, code = e.code, "{what} in sandbox {id} failed: {}", e.message);
    } else {
        tracing::debug!(sandbox = %id, code = e.code, "{what} in sandbox {id} refused: {}", e.message);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_disks_are_recognised_from_every_layer() {
        assert!(is_no_space("write: No space left on device (os error 28)"));
        assert!(is_no_space("database or disk is full"));
        assert!(is_no_space("qemu-img: Could not write: os error 28"));
        assert!(!is_no_space("Could not open backing file"));
        assert!(!is_no_space(""));
    }

    #[test]
    fn only_internal_errors_become_507() {
        let e = classify(ApiError::internal(
            "cannot write memory.img: No space left on device",
        ));
        assert_eq!(e.status, StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(e.code, codes::NO_SPACE);
        assert!(e.message.contains("snapshot prune"));
        let e = classify(ApiError::internal("QEMU crashed"));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        // A client's own mistake stays what it is.
        let e = classify(ApiError::invalid("No space left on device"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn agent_errors_map_to_statuses_that_say_what_to_do() {
        let old = agent_error(
            "sb-1",
            AgentError::Unsupported {
                what: "run background processes".into(),
            },
        );
        assert_eq!(old.status, StatusCode::CONFLICT);
        assert!(
            old.message.contains("sb-1") && old.message.contains("rebuild the template"),
            "{}",
            old.message
        );
        let gone = |code: &str| {
            agent_error(
                "sb-1",
                AgentError::Guest {
                    code: code.into(),
                    message: "m".into(),
                },
            )
            .status
        };
        assert_eq!(
            gone(forkvm_agent_protocol::ERR_NOT_FOUND),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            gone(forkvm_agent_protocol::ERR_INVALID),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(gone(forkvm_agent_protocol::ERR_IO), StatusCode::BAD_GATEWAY);
        let bad = agent_error("sb-1", AgentError::InvalidArchive("x".into()));
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    }
}
