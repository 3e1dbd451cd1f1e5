//! MCP over streamable HTTP at `/mcp`: the tools of `forkvm_mcp`, run on
//! the engine's typed actions.
//!
//! The tools (names, schemas, argument checks, rendering) live in the
//! `forkvm-mcp` crate, which `forkvm mcp` (stdio, in the CLI) serves too.
//! This front-end only supplies its [`forkvm_mcp::Backend`]: each method
//! calls one action, as a REST handler would. The route sits in the REST
//! router (`crate::api::router`), so on TCP it is behind the same bearer
//! token as `/v1`, and on the unix socket it is open like `/v1`. The
//! endpoint ([`forkvm_mcp::http::Endpoint`]) checks `Host` (on listeners
//! only this machine reaches) and `Origin` itself, and answers JSON-RPC
//! faults as JSON-RPC.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{self};
use axum::response::IntoResponse;
use forkvm_api::{
    BranchRequest, BranchResult, Checkpoint, CheckpointRequest, CreateSandbox, CreateSnapshot,
    Diff, DiffRequest, EntryList, ExecRequest, ExecResult, FileWritten, MergeRequest, Merged,
    Retention, RewindRequest, Rewound, Sandbox, Snapshot, Timeline,
};
use forkvm_mcp::http::Endpoint;
pub use forkvm_mcp::http::Guard;
use forkvm_mcp::{Backend, BackendError};

use crate::actions::Created;
use crate::actions::Engine;
use crate::error::{EngineError, ErrorKind};

/// The daemon's backend: the engine itself.
pub struct Actions(pub Engine);

fn err(e: EngineError) -> BackendError {
    BackendError::new(
        forkvm_api::codes::status_of(e.code()),
        e.code(),
        e.to_string(),
    )
}

/// Run an action on its own task, as the REST handlers do for the long
/// ones: a client that hangs up does not drop a spawn, branch or removal
/// half-way.
async fn detached<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::spawn(f)
        .await
        .map_err(|e| BackendError::new(500, "internal", format!("task failed: {e}")))?
        .map_err(err)
}

impl Backend for Actions {
    async fn create(&self, req: CreateSandbox) -> Result<Sandbox, BackendError> {
        let m = self.0.clone();
        match detached(async move { m.create(req).await }).await? {
            Created::One(sb) => Ok(*sb),
            Created::Batch(mut b) => b
                .sandboxes
                .pop()
                .ok_or_else(|| BackendError::new(500, "internal", "the daemon spawned no sandbox")),
        }
    }

    async fn exec(&self, id: String, req: ExecRequest) -> Result<ExecResult, BackendError> {
        self.0.exec(&id, req).await.map_err(err)
    }

    async fn read_file(&self, id: String, path: String) -> Result<Vec<u8>, BackendError> {
        self.0.read_file(&id, &path).await.map_err(err)
    }

    async fn write_file(
        &self,
        id: String,
        path: String,
        mode: Option<u32>,
        data: Vec<u8>,
    ) -> Result<FileWritten, BackendError> {
        self.0.write_file(&id, path, mode, &data).await.map_err(err)
    }

    async fn list_dir(
        &self,
        id: String,
        path: String,
        depth: u32,
    ) -> Result<EntryList, BackendError> {
        self.0.list_dir(&id, &path, depth).await.map_err(err)
    }

    async fn branch(&self, id: String, req: BranchRequest) -> Result<BranchResult, BackendError> {
        let m = self.0.clone();
        detached(async move { m.branch(&id, req).await }).await
    }

    async fn snapshot(&self, id: String, req: CreateSnapshot) -> Result<Snapshot, BackendError> {
        let m = self.0.clone();
        detached(async move { m.snapshot(&id, req.tag).await }).await
    }

    async fn list(&self) -> Result<Vec<Sandbox>, BackendError> {
        self.0.list(&Default::default()).map_err(err)
    }

    async fn remove(&self, id: String) -> Result<(), BackendError> {
        let m = self.0.clone();
        detached(async move { m.remove(&id).await }).await
    }

    async fn logs(&self, id: String) -> Result<String, BackendError> {
        self.0.get(&id).map_err(err)?;
        Ok(self.0.console_log(&id))
    }

    async fn checkpoint(
        &self,
        id: String,
        req: CheckpointRequest,
    ) -> Result<Checkpoint, BackendError> {
        let m = self.0.clone();
        detached(async move { m.checkpoint(&id, req.tag).await }).await
    }

    async fn timeline(&self, id: String) -> Result<Timeline, BackendError> {
        self.0.timeline(&id).map_err(err)
    }

    async fn set_retention(&self, id: String, r: Retention) -> Result<Timeline, BackendError> {
        let m = self.0.clone();
        detached(async move { m.set_retention(&id, r).await }).await
    }

    async fn rewind(&self, id: String, req: RewindRequest) -> Result<Rewound, BackendError> {
        let m = self.0.clone();
        detached(async move { m.rewind(&id, req).await }).await
    }

    async fn diff(&self, a: String, req: DiffRequest) -> Result<Diff, BackendError> {
        let m = self.0.clone();
        detached(async move { m.diff(&a, req).await }).await
    }

    async fn merge(&self, child: String, req: MergeRequest) -> Result<Merged, BackendError> {
        let m = self.0.clone();
        detached(async move { m.merge(&child, req).await }).await
    }
}

/// The `/mcp` service. `guard` says which `Host` headers it takes: only
/// loopback names on the unix socket and on a loopback TCP listener, any on
/// a listener others reach.
pub fn service(mgr: Engine, guard: Guard) -> axum::routing::MethodRouter<Engine> {
    let endpoint = Endpoint::new(Arc::new(Actions(mgr.clone())), guard);
    let limit = mgr.limits().max_request_bytes as usize;
    axum::routing::any(move |req: Request| {
        let endpoint = endpoint.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = match axum::body::to_bytes(body, limit).await {
                Ok(b) => b,
                Err(e) => {
                    return crate::api::error::ApiError::new(
                        ErrorKind::TooLarge,
                        format!("the MCP message could not be read: {e}"),
                    )
                    .into_response()
                }
            };
            endpoint
                .handle(http::Request::from_parts(parts, body))
                .await
                .map(axum::body::Body::new)
        }
    })
}
