//! A command's output as it happens: the engine runs the command on a task
//! of its own and hands back its events (`stdout`/`stderr` chunks, then
//! `exit` or `error`), which a front-end renders (REST as NDJSON lines).
//!
//! The command runs to its end whether or not anyone still reads: a client
//! that hangs up ends its stream, not the command.

use base64::Engine;
use forkvm_api::{ExecEvent, ExecRequest};
use tokio::sync::mpsc;

use crate::error::{agent_error, EngineError};
use crate::manager::Manager;

impl Manager {
    /// Start a command and return its events. Errors before the command is
    /// under way (no sandbox, a bad request) are returned; later ones are
    /// the stream's last event.
    pub async fn exec_events(
        &self,
        id: &str,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>, EngineError> {
        let (agent, spec, deadline) = self.prepare_exec(id, req).await?;
        let (tap_tx, mut tap_rx) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel::<ExecEvent>(64);
        let id = id.to_string();
        // A guest that disk pressure stops meanwhile ends the stream with
        // 507 at once (crate::pressure), not at the command's timeout.
        let suspended = self.suspended.clone();
        let on_suspend = {
            let e = self.suspended_error(&id, "{reason}");
            move |reason: &str| {
                let mut e = e.clone();
                e.message = e.message.replace("{reason}", reason);
                e
            }
        };
        tokio::spawn(async move {
            let mut run = Box::pin(agent.exec_tapped(spec, deadline, Some(tap_tx)));
            let chunk = |(s, data): (forkvm_agent_protocol::Stream, Vec<u8>)| {
                let data = base64::engine::general_purpose::STANDARD.encode(data);
                match s {
                    forkvm_agent_protocol::Stream::Stdout => ExecEvent::Stdout { data },
                    forkvm_agent_protocol::Stream::Stderr => ExecEvent::Stderr { data },
                }
            };
            let result = loop {
                tokio::select! {
                    Some(c) = tap_rx.recv() => {
                        // A reader that went away ends the stream, not the command.
                        let _ = tx.send(chunk(c)).await;
                    }
                    r = &mut run => break r.map_err(|e| agent_error(&id, e)),
                    reason = suspended.wait(&id) => break Err(on_suspend(&reason)),
                }
            };
            // The tap's sender goes with the call, which ends the drain below.
            drop(run);
            while let Some(c) = tap_rx.recv().await {
                let _ = tx.send(chunk(c)).await;
            }
            let last = match result {
                Ok(out) => ExecEvent::Exit {
                    exit_code: out.exit_code,
                    signal: out.signal,
                    timed_out: out.timed_out,
                    duration_ms: out.duration_ms,
                    stdout_bytes: out.stdout_bytes,
                    stderr_bytes: out.stderr_bytes,
                },
                Err(e) => ExecEvent::Error { error: e.to_wire() },
            };
            let _ = tx.send(last).await;
        });
        Ok(rx)
    }
}
