//! `forkvm mcp`: MCP over stdio, for Claude Desktop and other MCP clients
//! that start a server as a subprocess.
//!
//! The tools are `forkvm_mcp`'s, the same the daemon serves at `/mcp`; this
//! module only supplies their backend: the daemon's REST API through
//! [`forkvm_api::Client`], reached like every other command
//! (`FORKVM_URL`/`FORKVM_TOKEN`, or the local socket). Stdout carries MCP
//! messages only; anything else goes to stderr.

use std::sync::Arc;

use forkvm_api::Client;
use forkvm_mcp::rest::Rest;

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
