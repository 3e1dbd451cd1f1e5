//! forkvm's MCP server: one definition of the tools, two ways to reach the
//! daemon's actions.
//!
//! ```text
//!   MCP client ── stdio ──▶ forkvm mcp (CLI) ─┐            ┌─ RestBackend ── /v1 ──▶ daemon
//!                                              ├─ Server<B> ┤
//!   MCP client ── HTTP /mcp ──▶ daemon ────────┘            └─ the daemon's Backend: Manager actions
//! ```
//!
//! [`Server`] is the MCP handler: it lists the tools of [`tools::catalog`],
//! parses and checks each call's arguments, runs it through a [`Backend`],
//! and renders the answer. A bad argument and a failed action are both tool
//! results with `isError` and a message saying what to do, so the model can
//! correct itself; JSON-RPC errors are for protocol faults (an unknown tool,
//! a malformed message: [`jsonrpc`]). Long calls report progress to a
//! client that asks for it, and a cancelled command is killed in the guest.
//! It also offers each sandbox's console and files as resources
//! ([`resources`]). The backend is the only thing a front-end supplies:
//! the daemon implements it on its manager's typed actions, the CLI on the
//! REST client. So both serve the same tools with the same checks.

pub mod http;
pub mod jsonrpc;
pub mod render;
pub mod resources;
pub mod rest;
pub mod schema;
mod stdio;
pub mod timetravel;
pub mod tools;
pub mod treediff;

pub use stdio::{serve, serve_stdio};

use std::future::Future;
use std::sync::Arc;

use forkvm_api::{
    BranchRequest, BranchResult, Checkpoint, CheckpointRequest, CreateSandbox, CreateSnapshot,
    Diff, DiffRequest, EntryList, ExecRequest, ExecResult, FileWritten, MergeRequest, Merged,
    Retention, RewindRequest, Rewound, Sandbox, Snapshot, Timeline,
};
pub use rmcp;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// Why an action failed, as the REST API says it: the HTTP status, the
/// stable error code (`forkvm_api::codes`) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl BackendError {
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        BackendError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
}

/// The daemon's actions the tools need. Implemented once on the manager (in
/// the daemon) and once on the REST client (in the CLI).
pub trait Backend: Send + Sync + 'static {
    fn create(
        &self,
        req: CreateSandbox,
    ) -> impl Future<Output = Result<Sandbox, BackendError>> + Send;
    fn exec(
        &self,
        id: String,
        req: ExecRequest,
    ) -> impl Future<Output = Result<ExecResult, BackendError>> + Send;
    fn read_file(
        &self,
        id: String,
        path: String,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> + Send;
    fn write_file(
        &self,
        id: String,
        path: String,
        mode: Option<u32>,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<FileWritten, BackendError>> + Send;
    fn list_dir(
        &self,
        id: String,
        path: String,
        depth: u32,
    ) -> impl Future<Output = Result<EntryList, BackendError>> + Send;
    fn branch(
        &self,
        id: String,
        req: BranchRequest,
    ) -> impl Future<Output = Result<BranchResult, BackendError>> + Send;
    fn snapshot(
        &self,
        id: String,
        req: CreateSnapshot,
    ) -> impl Future<Output = Result<Snapshot, BackendError>> + Send;
    fn list(&self) -> impl Future<Output = Result<Vec<Sandbox>, BackendError>> + Send;
    fn remove(&self, id: String) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// The tail of the sandbox's serial console, as `GET /v1/sandboxes/{id}/logs`.
    fn logs(&self, id: String) -> impl Future<Output = Result<String, BackendError>> + Send;
    /// `POST /v1/sandboxes/{id}/checkpoints`.
    fn checkpoint(
        &self,
        id: String,
        req: CheckpointRequest,
    ) -> impl Future<Output = Result<Checkpoint, BackendError>> + Send;
    /// `GET /v1/sandboxes/{id}/timeline`.
    fn timeline(&self, id: String) -> impl Future<Output = Result<Timeline, BackendError>> + Send;
    /// `PUT /v1/sandboxes/{id}/timeline/retention`.
    fn set_retention(
        &self,
        id: String,
        r: Retention,
    ) -> impl Future<Output = Result<Timeline, BackendError>> + Send;
    /// `POST /v1/sandboxes/{id}/rewind`.
    fn rewind(
        &self,
        id: String,
        req: RewindRequest,
    ) -> impl Future<Output = Result<Rewound, BackendError>> + Send;
    /// `POST /v1/diff/{a}`.
    fn diff(
        &self,
        a: String,
        req: DiffRequest,
    ) -> impl Future<Output = Result<Diff, BackendError>> + Send;
    /// `POST /v1/sandboxes/{id}/merge`.
    fn merge(
        &self,
        child: String,
        req: MergeRequest,
    ) -> impl Future<Output = Result<Merged, BackendError>> + Send;
}

/// The MCP server over a backend.
pub struct Server<B> {
    backend: Arc<B>,
}

impl<B> Clone for Server<B> {
    fn clone(&self) -> Self {
        Server {
            backend: self.backend.clone(),
        }
    }
}

/// What the server tells a client at initialization.
pub const INSTRUCTIONS: &str = "forkvm runs sandboxes: Linux microVMs you can run commands and \
     Python in, read and write files in, and fork while they run. Start with create_sandbox \
     (image \"default\" has python3), pass its id as sandbox_id to the other tools, and \
     remove_sandbox when done. branch_sandbox forks a sandbox into children that each continue \
     from the same instant; checkpoint saves a sandbox's state as a step of its timeline, and \
     rewind brings it back to one. diff compares the files of two sandboxes or checkpoints, and \
     merge applies a branch child's file changes to the sandbox it was branched from.";

impl<B: Backend> Server<B> {
    pub fn new(backend: Arc<B>) -> Self {
        Server { backend }
    }

    /// Run one tool call. `Err` is an MCP error, for an unknown tool only;
    /// bad arguments and a failed action are `Ok` with `isError`, so the
    /// model reads what to fix.
    pub async fn call(
        &self,
        name: &str,
        args: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call_ct(name, args, CancellationToken::new()).await
    }

    /// [`Server::call`], stopped by `ct`: a command it cancels is killed in
    /// the guest ([`tools::kill_request`]).
    pub async fn call_ct(
        &self,
        name: &str,
        args: Option<serde_json::Map<String, serde_json::Value>>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let known = tools::catalog().iter().any(|t| t.name == name);
        match self.run(name, args, &ct).await {
            // An argument error of a known tool: a tool error, which the
            // model sees and can correct, not a protocol fault.
            Err(e) if known => Ok(CallToolResult::error(vec![ContentBlock::text(e.message)])),
            other => other,
        }
    }

    async fn run(
        &self,
        name: &str,
        args: Option<serde_json::Map<String, serde_json::Value>>,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        use tools::*;
        let b = &self.backend;
        Ok(match name {
            names::CREATE => {
                let req = create_request(parse(name, args)?)?;
                match b.create(req).await {
                    Ok(s) => {
                        let out = sandbox_out(&s);
                        let text = format!(
                            "sandbox {} is {} (image {}); pass sandbox_id \"{}\" to the other tools",
                            out.id, out.state, out.image, out.id
                        );
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::RUN_COMMAND => {
                let (id, req) = command_request(parse(name, args)?)?;
                exec_result(name, self.exec(id, req, ct).await)
            }
            names::RUN_PYTHON => {
                let (id, req) = python_request(parse(name, args)?)?;
                exec_result(name, self.exec(id, req, ct).await)
            }
            names::READ_FILE => {
                let a: ReadFileArgs = parse(name, args)?;
                check_read(&a)?;
                let want = a.encoding.unwrap_or_default();
                match b.read_file(a.sandbox_id, a.path.clone()).await {
                    Ok(data) => {
                        let out = file_out(a.path, data, want);
                        let text = match out.encoding {
                            Encoding::Text => out.content.clone(),
                            Encoding::Base64 => format!(
                                "{} is {} bytes, not UTF-8 text; base64:\n{}",
                                out.path, out.size, out.content
                            ),
                        };
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::WRITE_FILE => {
                let a: WriteFileArgs = parse(name, args)?;
                let (data, mode) = write_request(&a)?;
                match b.write_file(a.sandbox_id, a.path, mode, data).await {
                    Ok(w) => {
                        let out = written_out(w);
                        let text = format!("wrote {} bytes to {}", out.size, out.path);
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::LIST_FILES => {
                let a: ListFilesArgs = parse(name, args)?;
                let depth = list_depth(&a)?;
                match b.list_dir(a.sandbox_id, a.path.clone(), depth).await {
                    Ok(l) => {
                        let (out, text) = list_out(a.path, l);
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::BRANCH => {
                let a: BranchArgs = parse(name, args)?;
                let req = branch_request(&a)?;
                match b.branch(a.sandbox_id.clone(), req).await {
                    Ok(r) => {
                        let out = branch_out(&r);
                        let text = format!(
                            "branched {} at snapshot {} into {} children: {}",
                            a.sandbox_id,
                            out.snapshot_id,
                            out.children.len(),
                            out.children.join(", ")
                        );
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::SNAPSHOT => {
                let a: SnapshotArgs = parse(name, args)?;
                let req = snapshot_request(&a)?;
                match b.snapshot(a.sandbox_id, req).await {
                    Ok(s) => {
                        let out = snapshot_out(&s);
                        let text = format!(
                            "snapshot {} of {}; start sandboxes from it with create_sandbox \
                             {{\"snapshot\": \"{}\"}}",
                            out.snapshot_id, out.source, out.snapshot_id
                        );
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::LIST_SANDBOXES => {
                let _: ListSandboxesArgs = parse(name, args)?;
                match b.list().await {
                    Ok(v) => {
                        let out = SandboxesOut {
                            sandboxes: v.iter().map(sandbox_out).collect(),
                        };
                        let mut text = format!("{} sandboxes\n", out.sandboxes.len());
                        for s in &out.sandboxes {
                            text.push_str(&format!("{}\t{}\t{}\n", s.id, s.state, s.image));
                        }
                        structured(&out, text)
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::REMOVE => {
                let a: RemoveArgs = parse(name, args)?;
                check_remove(&a)?;
                match b.remove(a.sandbox_id.clone()).await {
                    Ok(()) => {
                        let text = format!("removed {}", a.sandbox_id);
                        structured(
                            &RemovedOut {
                                removed: a.sandbox_id,
                            },
                            text,
                        )
                    }
                    Err(e) => failed(name, e),
                }
            }
            names::CHECKPOINT => return timetravel::checkpoint(b.as_ref(), args).await,
            names::TIMELINE => return timetravel::timeline(b.as_ref(), args).await,
            names::REWIND => return timetravel::rewind(b.as_ref(), args).await,
            names::DIFF => return treediff::diff(b.as_ref(), args).await,
            names::MERGE => return treediff::merge(b.as_ref(), args).await,
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "unknown tool {other:?}; the tools are: {}",
                        tools::catalog()
                            .iter()
                            .map(|t| t.name.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None,
                ))
            }
        })
    }
}

impl<B: Backend> Server<B> {
    /// Run a command; if `ct` is cancelled first, kill it in the guest (by
    /// the marker in its environment) and wait a little for its end.
    async fn exec(
        &self,
        id: String,
        mut req: forkvm_api::ExecRequest,
        ct: &CancellationToken,
    ) -> Result<ExecResult, BackendError> {
        let cancelled = || {
            BackendError::new(
                499,
                "cancelled",
                "the call was cancelled and its command killed",
            )
        };
        if ct.is_cancelled() {
            return Err(cancelled());
        }
        let marker = tools::call_marker();
        req.env.insert(tools::MARKER_VAR.into(), marker.clone());
        let run = self.backend.exec(id.clone(), req);
        tokio::pin!(run);
        tokio::select! {
            biased;
            r = &mut run => r,
            _ = ct.cancelled() => {
                let killed = self.backend.exec(id, tools::kill_request(&marker)).await;
                let _ = tokio::time::timeout(std::time::Duration::from_secs(30), run).await;
                tracing::info!(?killed, "MCP call cancelled; its command was killed");
                Err(cancelled())
            }
        }
    }
}

/// How often a long call tells a client that asked for progress that it
/// is still running: well inside the 60 s a client waits by default.
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Run `fut`, sending a progress notification every [`PROGRESS_EVERY`]
/// until it ends. Progress counts the notifications (it must increase);
/// there is no total, as how long a command runs is not known.
pub async fn with_progress<T>(
    fut: impl Future<Output = T>,
    peer: &rmcp::Peer<RoleServer>,
    token: ProgressToken,
    tool: &str,
) -> T {
    tokio::pin!(fut);
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval_at(start + PROGRESS_EVERY, PROGRESS_EVERY);
    let mut n = 0u32;
    loop {
        tokio::select! {
            r = &mut fut => return r,
            _ = tick.tick() => {
                n += 1;
                let p = ProgressNotificationParam::new(token.clone(), f64::from(n)).with_message(
                    format!("{tool} still running after {} s", start.elapsed().as_secs()),
                );
                if let Err(e) = peer.notify_progress(p).await {
                    tracing::debug!("progress not sent: {e}");
                }
            }
        }
    }
}

fn exec_result(tool: &str, r: Result<ExecResult, BackendError>) -> CallToolResult {
    match r {
        Ok(r) => {
            let (out, text) = tools::exec_out(r);
            structured(&out, text)
        }
        Err(e) => failed(tool, e),
    }
}

/// A result with its structured content and a text rendering for the model.
pub fn structured(out: &impl Serialize, text: String) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(serde_json::to_value(out).unwrap_or_default());
    r
}

/// A failed action as a tool result: the daemon's message, and what to do.
pub fn failed(tool: &str, e: BackendError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(error_text(tool, &e))])
}

/// The text of a failed action: the daemon's message (which says what went
/// wrong and, mostly, what to do), its code, and a hint by kind.
pub fn error_text(tool: &str, e: &BackendError) -> String {
    let hint = match (e.status, e.code.as_str()) {
        (401, _) => "set FORKVM_TOKEN (or the Authorization header) to the daemon's token",
        (404, _) => "check the id with list_sandboxes (or the image/snapshot name)",
        (409, _) => "the sandbox is not in a state for this; check it with list_sandboxes",
        (413, _) => "the data is over the daemon's limit; use smaller pieces",
        (429, _) | (503, _) => {
            "the host is at a limit; remove sandboxes you no longer need, or retry shortly"
        }
        (504, _) => "the sandbox did not answer in time; retry, or remove it and create a new one",
        (502, _) => "the sandbox's guest failed; remove it and create a new one",
        (0, _) => "start the daemon (`forkvm serve`), or point FORKVM_URL at a running one",
        (s, _) if s >= 500 => "a host-side failure; retry, and see the daemon's log if it repeats",
        _ => "fix the arguments and call again",
    };
    let code = if e.code.is_empty() {
        String::new()
    } else {
        format!(" [{}]", e.code)
    };
    format!("{tool} failed: {}{code}. What to do: {hint}.", e.message)
}

impl<B: Backend> ServerHandler for Server<B> {
    fn get_info(&self) -> ServerConfig {
        let mut implementation = Implementation::default();
        implementation.name = "forkvm".into();
        implementation.version = env!("CARGO_PKG_VERSION").into();
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(implementation)
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::catalog()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let call = self.call_ct(&request.name, request.arguments, context.ct.clone());
        let r = match context.meta.get_progress_token() {
            Some(token) => with_progress(call, &context.peer, token, &request.name).await,
            None => call.await,
        };
        r.map(Into::into)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        resources::list(self.backend.as_ref()).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        resources::read(self.backend.as_ref(), &request.uri)
            .await
            .map(Into::into)
    }
}

#[cfg(test)]
mod tests;
