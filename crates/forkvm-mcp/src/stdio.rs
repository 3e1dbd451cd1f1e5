//! MCP over stdio, with JSON-RPC faults answered.
//!
//! rmcp reads stdin line by line and drops a line that is not JSON
//! without a word (to avoid error storms between two peers that echo each
//! other; a client does not echo an error response, so that risk is not
//! ours). JSON-RPC wants `-32700` for it, so stdin goes through
//! [`crate::jsonrpc::check`] first: a good line is passed to rmcp, a fault is
//! answered here. Both answers reach stdout through one writer, a whole line
//! at a time, so they never interleave.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::jsonrpc::{self, Checked};
use crate::{Backend, Server};

/// Serve MCP on this process's stdin and stdout until the client closes
/// stdin.
pub async fn serve_stdio<B: Backend>(backend: Arc<B>) -> Result<(), String> {
    serve(backend, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Serve MCP on `input` and `output` until `input` ends.
pub async fn serve<B: Backend>(
    backend: Arc<B>,
    input: impl AsyncRead + Unpin + Send + 'static,
    mut output: impl AsyncWrite + Unpin + Send + 'static,
) -> Result<(), String> {
    use rmcp::ServiceExt;
    let (mut to_rmcp, rmcp_in) = tokio::io::duplex(1 << 16);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(1 << 16);
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel::<String>();

    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let reply = match jsonrpc::check(text) {
                Checked::Pass(_) => {
                    let ok = to_rmcp.write_all(text).await.is_ok()
                        && to_rmcp.write_all(b"\n").await.is_ok();
                    if !ok {
                        break;
                    }
                    None
                }
                Checked::Reject(e) => e,
                Checked::Batch(_) => Some(jsonrpc::error(
                    serde_json::Value::Null,
                    jsonrpc::INVALID_REQUEST,
                    "invalid request: JSON-RPC batches are not taken on stdio; \
                     send one message per line",
                )),
            };
            if let Some(e) = reply {
                let _ = errors_tx.send(e.to_string());
            }
        }
        // rmcp sees the end of its input and stops.
        let _ = to_rmcp.shutdown().await;
    });

    let writer = tokio::spawn(async move {
        let mut from_rmcp = BufReader::new(from_rmcp);
        let mut line = Vec::new();
        let mut rmcp_open = true;
        loop {
            tokio::select! {
                n = from_rmcp.read_until(b'\n', &mut line), if rmcp_open => {
                    match n {
                        Ok(0) | Err(_) => rmcp_open = false,
                        Ok(_) => {
                            if output.write_all(&line).await.is_err() { break; }
                            line.clear();
                        }
                    }
                }
                e = errors.recv() => match e {
                    Some(e) => {
                        if output.write_all(format!("{e}\n").as_bytes()).await.is_err() { break; }
                    }
                    None if !rmcp_open => break,
                    None => {
                        // The reader is done; drain rmcp's last answers.
                        match from_rmcp.read_until(b'\n', &mut line).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {
                                if output.write_all(&line).await.is_err() { break; }
                                line.clear();
                            }
                        }
                    }
                },
            }
            let _ = output.flush().await;
        }
        let _ = output.flush().await;
    });

    let running = Server::new(backend)
        .serve((rmcp_in, rmcp_out))
        .await
        .map_err(|e| format!("MCP initialization failed: {e}"));
    let result = match running {
        Ok(r) => r
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| format!("MCP server stopped: {e}")),
        Err(e) => Err(e),
    };
    reader.abort();
    let _ = writer.await;
    result
}
