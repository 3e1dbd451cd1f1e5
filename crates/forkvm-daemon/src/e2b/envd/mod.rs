//! E2B's envd, served by the daemon for each sandbox.
//!
//! (Filled in by the envd work: the Connect-RPC `process` and `filesystem`
//! services, `/files`, `/health`.)

use std::sync::Arc;

use axum::routing::get;
use axum::Router;

use crate::manager::Manager;

/// The envd version reported to the SDK, which gates features on it.
pub const ENVD_VERSION: &str = "0.5.0";

/// The envd routes. Handlers find their sandbox in the
/// [`super::EnvdTarget`] request extension.
pub(crate) fn router() -> Router<Arc<Manager>> {
    Router::new().route(
        "/health",
        get(|| async { axum::http::StatusCode::NO_CONTENT }),
    )
}
