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
//! parses and checks each call's arguments (a bad one is an MCP
//! invalid-params error), runs it through a [`Backend`], and renders the
//! answer (a failed action is a tool result with `isError` and a message
//! saying what to do). The backend is the only thing a front-end supplies:
//! the daemon implements it on its manager's typed actions, the CLI on the
//! REST client. So both serve the same tools with the same checks.

pub mod tools;

use std::future::Future;
use std::sync::Arc;

use forkvm_api::{
    BranchRequest, BranchResult, CreateSandbox, CreateSnapshot, EntryList, ExecRequest, ExecResult,
    FileWritten, Sandbox, Snapshot,
};
pub use rmcp;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Serialize;

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
     from the same instant.";

impl<B: Backend> Server<B> {
    pub fn new(backend: Arc<B>) -> Self {
        Server { backend }
    }

    /// Run one tool call. `Err` is an MCP error (unknown tool, bad
    /// arguments); a failed action is `Ok` with `isError`.
    pub async fn call(
        &self,
        name: &str,
        args: Option<serde_json::Map<String, serde_json::Value>>,
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
                exec_result(name, b.exec(id, req).await)
            }
            names::RUN_PYTHON => {
                let (id, req) = python_request(parse(name, args)?)?;
                exec_result(name, b.exec(id, req).await)
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
        (404, _) => "check the id with list_sandboxes (or the image/snapshot name)",
        (409, _) => "the sandbox is not in a state for this; check it with list_sandboxes",
        (413, _) => "the data is over the daemon's limit; use smaller pieces",
        (429, _) | (503, _) => {
            "the host is at a limit; remove sandboxes you no longer need, or retry shortly"
        }
        (504, _) => "the sandbox did not answer in time; retry, or remove it and create a new one",
        (502, _) => "the sandbox's guest failed; remove it and create a new one",
        (0, _) => "the forkvm daemon could not be reached; is `forkvm serve` running?",
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
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(&request.name, request.arguments)
            .await
            .map(Into::into)
    }
}

/// Serve MCP on this process's stdin and stdout until the client closes
/// them.
pub async fn serve_stdio<B: Backend>(backend: Arc<B>) -> Result<(), String> {
    use rmcp::ServiceExt;
    let running = Server::new(backend)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP initialization failed: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP server stopped: {e}"))?;
    Ok(())
}

/// The streamable-HTTP service for `/mcp`, stateless (every request is
/// answered on its own, so no session outlives its client). Authentication
/// is the caller's: the daemon puts it behind the same bearer-token layer as
/// `/v1`, and the unix socket is guarded by its file permissions, so the
/// `Host` allow-list (a defence against DNS rebinding for unauthenticated
/// local servers) is off.
pub fn http_service<B: Backend>(
    backend: Arc<B>,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    Server<B>,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(Server::new(backend.clone())),
        Default::default(),
        config,
    )
}

#[cfg(test)]
mod tests;
