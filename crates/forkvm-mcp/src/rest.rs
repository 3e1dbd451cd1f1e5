//! The REST backend: the tools run on a daemon's (or a cluster gateway's)
//! REST API through [`forkvm_api::Client`]. `forkvm mcp` (stdio) serves the
//! tools with it, and so does the cluster gateway at `/mcp`, pointed at its
//! own listener so every tool call is routed like any other request.

use crate::{Backend, BackendError};
use forkvm_api::{
    BranchRequest, BranchResult, Checkpoint, CheckpointRequest, Client, ClientError, CreateSandbox,
    CreateSnapshot, Diff, DiffRequest, EntryList, ExecRequest, ExecResult, FileWritten,
    MergeRequest, Merged, Retention, RewindRequest, Rewound, Sandbox, Snapshot, Timeline,
};

/// The CLI's backend: the REST client.
pub struct Rest(pub Client);

fn err(e: ClientError) -> BackendError {
    match e {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => BackendError::new(status, code, message),
        // Status 0: the daemon was not reached or answered nonsense.
        other => BackendError::new(0, "", other.to_string()),
    }
}

impl Backend for Rest {
    async fn create(&self, req: CreateSandbox) -> Result<Sandbox, BackendError> {
        self.0.create_sandbox(&req).await.map_err(err)
    }

    async fn exec(&self, id: String, req: ExecRequest) -> Result<ExecResult, BackendError> {
        self.0.exec(&id, &req).await.map_err(err)
    }

    async fn read_file(&self, id: String, path: String) -> Result<Vec<u8>, BackendError> {
        self.0
            .read_file(&id, &path)
            .await
            .map(|b| b.to_vec())
            .map_err(err)
    }

    async fn write_file(
        &self,
        id: String,
        path: String,
        mode: Option<u32>,
        data: Vec<u8>,
    ) -> Result<FileWritten, BackendError> {
        self.0
            .write_file(&id, &path, mode, data.into())
            .await
            .map_err(err)
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
        self.0.branch(&id, &req).await.map_err(err)
    }

    async fn snapshot(&self, id: String, req: CreateSnapshot) -> Result<Snapshot, BackendError> {
        self.0.snapshot(&id, &req).await.map_err(err)
    }

    async fn list(&self) -> Result<Vec<Sandbox>, BackendError> {
        self.0
            .list_sandboxes()
            .await
            .map(|l| l.sandboxes)
            .map_err(err)
    }

    async fn remove(&self, id: String) -> Result<(), BackendError> {
        self.0.delete_sandbox(&id).await.map_err(err)
    }

    async fn logs(&self, id: String) -> Result<String, BackendError> {
        self.0
            .logs(&id)
            .await
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(err)
    }

    async fn checkpoint(
        &self,
        id: String,
        req: CheckpointRequest,
    ) -> Result<Checkpoint, BackendError> {
        self.0.checkpoint(&id, &req).await.map_err(err)
    }

    async fn timeline(&self, id: String) -> Result<Timeline, BackendError> {
        self.0.timeline(&id).await.map_err(err)
    }

    async fn set_retention(&self, id: String, r: Retention) -> Result<Timeline, BackendError> {
        self.0.set_retention(&id, &r).await.map_err(err)
    }

    async fn rewind(&self, id: String, req: RewindRequest) -> Result<Rewound, BackendError> {
        self.0.rewind(&id, &req).await.map_err(err)
    }

    async fn diff(&self, a: String, req: DiffRequest) -> Result<Diff, BackendError> {
        self.0.diff(&a, &req).await.map_err(err)
    }

    async fn merge(&self, child: String, req: MergeRequest) -> Result<Merged, BackendError> {
        self.0.merge(&child, &req).await.map_err(err)
    }
}
