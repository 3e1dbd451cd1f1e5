//! `forkvm mcp`: MCP over stdio, for Claude Desktop and other MCP clients
//! that start a server as a subprocess.
//!
//! The tools are `forkvm_mcp`'s, the same the daemon serves at `/mcp`; this
//! module only supplies their backend: the daemon's REST API through
//! [`forkvm_api::Client`], reached like every other command
//! (`FORKVM_URL`/`FORKVM_TOKEN`, or the local socket). Stdout carries MCP
//! messages only; anything else goes to stderr.

use std::sync::Arc;

use forkvm_api::{
    BranchRequest, BranchResult, Client, ClientError, CreateSandbox, CreateSnapshot, EntryList,
    ExecRequest, ExecResult, FileWritten, Sandbox, Snapshot,
};
use forkvm_mcp::{Backend, BackendError};

/// The CLI's backend: the REST client.
pub(crate) struct Rest(pub Client);

fn err(e: ClientError) -> BackendError {
    match e {
        ClientError::Api {
            status,
            code,
            message,
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
}

/// Serve MCP on stdin/stdout until the client closes stdin.
///
/// A daemon that cannot be reached (or started) does not stop the server:
/// it starts anyway, and each tool call says that the daemon is not
/// reachable and what to do, which an MCP client shows, where an exit would
/// only show "server disconnected". A call made once the daemon is up works.
pub(crate) async fn run() -> anyhow::Result<()> {
    let client = match crate::daemon::client().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("forkvm mcp: {e:#}; serving anyway, each tool call will retry");
            Client::from_env().map_err(anyhow::Error::msg)?
        }
    };
    forkvm_mcp::serve_stdio(Arc::new(Rest(client)))
        .await
        .map_err(anyhow::Error::msg)
}
