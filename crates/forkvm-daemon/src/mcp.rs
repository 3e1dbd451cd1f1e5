//! MCP over streamable HTTP at `/mcp`: the tools of `forkvm_mcp`, run on
//! the manager's typed actions.
//!
//! The tools (names, schemas, argument checks, rendering) live in the
//! `forkvm-mcp` crate, which `forkvm mcp` (stdio, in the CLI) serves too.
//! This front-end only supplies its [`forkvm_mcp::Backend`]: each method
//! calls one action, as a REST handler would. The route sits in the REST
//! router (`crate::api::router`), so on TCP it is behind the same bearer
//! token as `/v1`, and on the unix socket it is open like `/v1`.

use std::sync::Arc;

use forkvm_api::{
    BranchRequest, BranchResult, CreateSandbox, CreateSnapshot, EntryList, ExecRequest, ExecResult,
    FileWritten, Sandbox, Snapshot,
};
use forkvm_mcp::{Backend, BackendError};

use crate::error::ApiError;
use crate::manager::Manager;
use crate::spawn::Created;

/// The daemon's backend: the manager itself.
pub struct Actions(pub Arc<Manager>);

fn err(e: ApiError) -> BackendError {
    BackendError::new(e.status.as_u16(), e.code, e.message)
}

/// Run an action on its own task, as the REST handlers do for the long
/// ones: a client that hangs up does not drop a spawn, branch or removal
/// half-way.
async fn detached<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
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
        detached(async move {
            m.snapshot(&id, req.tag, None, crate::snapshot::Save::Diff)
                .await
        })
        .await
    }

    async fn list(&self) -> Result<Vec<Sandbox>, BackendError> {
        self.0.list(&Default::default()).map_err(err)
    }

    async fn remove(&self, id: String) -> Result<(), BackendError> {
        let m = self.0.clone();
        detached(async move { m.remove(&id).await }).await
    }
}

/// The `/mcp` service.
pub fn service(
    mgr: Arc<Manager>,
) -> forkvm_mcp::rmcp::transport::streamable_http_server::StreamableHttpService<
    forkvm_mcp::Server<Actions>,
    forkvm_mcp::rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    forkvm_mcp::http_service(Arc::new(Actions(mgr)))
}
