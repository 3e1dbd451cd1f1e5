//! E2B's control plane: sandboxes created, listed, paused, forked.

use std::sync::Arc;

use axum::Router;

use crate::manager::Manager;

pub(crate) fn router() -> Router<Arc<Manager>> {
    Router::new()
}
