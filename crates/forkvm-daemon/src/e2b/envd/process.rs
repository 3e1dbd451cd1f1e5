//! envd's `process.Process` service over the daemon's background processes
//! ([`Engine`](crate::actions::Engine)): each method parses its Connect
//! request, calls one engine action and renders the answer.
//!
//! A Start or Connect stream is the agent's process stream turned into
//! `ProcessEvent`s: `start` first, then `data` (stdout, stderr or pty),
//! `keepalive` when the agent sends one, and `end` last. A client that goes
//! away drops the agent stream, which cancels it in the guest; the process
//! runs on, as in E2B, where `disconnect()` leaves the command running.

use axum::body::Body;
use axum::response::Response;

use forkvm_api::{ProcessRef, PtySize, StartProcess};
use tokio_stream::StreamExt;

use super::connect::{self, Code, ConnectError};
use super::wire::*;
use super::Call;
use crate::actions::ProcessStream;
use crate::actions::{ProcEvent, ProcStream};
use crate::error::agent_error;

fn selector(s: Option<ProcessSelector>) -> Result<ProcessRef, ConnectError> {
    match s {
        Some(ProcessSelector { pid: Some(p), .. }) => Ok(ProcessRef::Pid(p)),
        Some(ProcessSelector { tag: Some(t), .. }) => Ok(ProcessRef::Tag(t)),
        _ => Err(ConnectError::invalid(
            "name the process: {\"process\": {\"pid\": N}} or {\"tag\": \"name\"}",
        )),
    }
}

fn pty_size(p: Option<Pty>) -> Result<Option<PtySize>, ConnectError> {
    let Some(size) = p.and_then(|p| p.size) else {
        return Ok(None);
    };
    let side = |n: u32| {
        u16::try_from(n)
            .map_err(|_| ConnectError::invalid(format!("a terminal side of {n} is out of range")))
    };
    Ok(Some(PtySize {
        cols: side(size.cols)?,
        rows: side(size.rows)?,
    }))
}

/// `Start`: run a process and stream its events.
pub(crate) async fn start(call: Call) -> Response {
    let req: StartRequest = match connect::stream_request(call.content_type(), &call.body) {
        Ok(r) => r,
        Err(e) => return connect::stream_error(e),
    };
    let r = async {
        let cfg = req
            .process
            .ok_or_else(|| ConnectError::invalid("StartRequest.process is required"))?;
        if cfg.cmd.is_empty() {
            return Err(ConnectError::invalid("process.cmd must name a program"));
        }
        let cwd = match cfg.cwd.filter(|c| !c.is_empty()) {
            Some(c) => Some(call.resolve(&c)?),
            None => None,
        };
        let pty = pty_size(req.pty)?;
        let spec = StartProcess {
            argv: std::iter::once(cfg.cmd).chain(cfg.args).collect(),
            env: cfg.envs,
            cwd,
            user: call.user.clone(),
            tag: req.tag,
            stdin: req.stdin.unwrap_or(false) || pty.is_some(),
            pty,
            stream: false,
        };
        Ok::<_, ConnectError>(call.mgr.start_process(&call.id, spec).await?)
    }
    .await;
    match r {
        Ok(ps) => render(call, ps, true),
        Err(e) => connect::stream_error(e),
    }
}

/// `Connect`: attach to a running process (its kept output, then live).
pub(crate) async fn connect(call: Call) -> Response {
    let r = async {
        let req: SelectRequest = connect::stream_request(call.content_type(), &call.body)?;
        let r = selector(req.process)?;
        Ok::<_, ConnectError>(call.mgr.attach_process(&call.id, &r).await?)
    }
    .await;
    match r {
        Ok(ps) => render(call, ps, false),
        Err(e) => connect::stream_error(e),
    }
}

/// Stream a process's events until it ends, the client goes away or the
/// call's deadline passes. At the deadline of a `Start` (`kill`), the
/// process is killed, as envd runs it under the call's deadline: also when
/// the client has gone away by then (a background command, `disconnect()`),
/// which is why E2B's background commands end after their `timeout` (60 s
/// unless the SDK is told otherwise, 0 for none). A `Connect` that times out
/// only stops watching.
fn render(call: Call, ps: ProcessStream, kill: bool) -> Response {
    let (tx, resp) = connect::stream_response();
    let Call {
        mgr, id, deadline, ..
    } = call;
    tokio::spawn(async move {
        let ProcessStream { pid, mut events } = ps;
        let start = ProcessEvent::Start(StartEvent { pid });
        // Once the client is gone, a Start with a deadline still watches
        // for the process's end, to kill it at the deadline if it runs on.
        let watch_on = kill && deadline.is_some();
        let mut gone = !tx.send(&EventResponse { event: start }).await;
        if gone && !watch_on {
            return;
        }
        loop {
            let next = tokio::select! {
                n = events.next() => n,
                () = super::deadline::reached(deadline) => {
                    if kill {
                        // Gone already is fine: it ended at the deadline.
                        let _ = mgr
                            .signal_process(&id, &ProcessRef::Pid(pid), libc::SIGKILL)
                            .await;
                    }
                    return tx.end(Some(super::deadline::exceeded())).await;
                }
            };
            let ev = match next {
                Ok(Some(ProcEvent::Started { .. })) => continue,
                // `lost` has no place in envd's events: the bytes are gone
                // either way, and the SDK would not show the count.
                Ok(Some(ProcEvent::Data { stream, data, .. })) => {
                    ProcessEvent::Data(match stream {
                        ProcStream::Stdout => Output::Stdout(data),
                        ProcStream::Stderr => Output::Stderr(data),
                        ProcStream::Pty => Output::Pty(data),
                    })
                }
                Ok(Some(ProcEvent::Keepalive)) => ProcessEvent::Keepalive(Empty {}),
                Ok(Some(ProcEvent::End(e))) => ProcessEvent::End(EndEvent {
                    exit_code: e.exit_code,
                    exited: e.exited,
                    status: e.status,
                    error: e.error,
                }),
                Ok(None) => return tx.end(None).await,
                Err(e) => {
                    let e = agent_error(&id, e);
                    // The process may still be running; the stream is what
                    // broke (the guest went away or stopped answering).
                    return tx
                        .end(Some(ConnectError::new(Code::Unavailable, e.message)))
                        .await;
                }
            };
            let last = matches!(ev, ProcessEvent::End(_));
            if !gone && !tx.send(&EventResponse { event: ev }).await {
                gone = true;
                if !watch_on {
                    return;
                }
            }
            if last {
                return tx.end(None).await;
            }
        }
    });
    resp
}

/// `List`: the running processes.
pub(crate) async fn list(call: Call) -> Response {
    connect::unary(
        async {
            let _: EmptyRequest = connect::unary_request(call.content_type(), &call.body)?;
            let list = call.mgr.list_processes(&call.id).await?;
            Ok(ListResponse {
                processes: list
                    .processes
                    .into_iter()
                    .map(|p| {
                        let mut argv = p.argv.into_iter();
                        ProcessInfo {
                            config: ProcessConfig {
                                cmd: argv.next().unwrap_or_default(),
                                args: argv.collect(),
                                envs: p.env,
                                cwd: p.cwd,
                            },
                            pid: p.pid,
                            tag: p.tag,
                        }
                    })
                    .collect(),
            })
        }
        .await,
    )
}

/// An empty request message; whatever it holds is ignored.
#[derive(serde::Deserialize)]
struct EmptyRequest {}

/// `SendInput`: bytes for a process's stdin or its PTY.
pub(crate) async fn send_input(call: Call) -> Response {
    connect::unary(
        async {
            let req: SendInputRequest = connect::unary_request(call.content_type(), &call.body)?;
            let r = selector(req.process)?;
            let data = req.input.map(ProcessInput::bytes).unwrap_or_default();
            call.mgr.write_stdin(&call.id, &r, &data).await?;
            Ok(Empty {})
        }
        .await,
    )
}

/// `SendSignal`: SIGTERM or SIGKILL to the process's group.
pub(crate) async fn send_signal(call: Call) -> Response {
    connect::unary(
        async {
            let req: SendSignalRequest = connect::unary_request(call.content_type(), &call.body)?;
            let r = selector(req.process)?;
            let sig = req
                .signal
                .as_ref()
                .and_then(SignalValue::number)
                .ok_or_else(|| {
                    ConnectError::invalid("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL")
                })?;
            call.mgr.signal_process(&call.id, &r, sig).await?;
            Ok(Empty {})
        }
        .await,
    )
}

/// `Update`: resize a process's PTY (the only update envd has).
pub(crate) async fn update(call: Call) -> Response {
    connect::unary(
        async {
            let req: UpdateRequest = connect::unary_request(call.content_type(), &call.body)?;
            let r = selector(req.process)?;
            if let Some(size) = pty_size(req.pty)? {
                call.mgr.resize_pty(&call.id, &r, size).await?;
            }
            Ok(Empty {})
        }
        .await,
    )
}

/// `CloseStdin`: end-of-file for the process once queued input is written.
pub(crate) async fn close_stdin(call: Call) -> Response {
    connect::unary(
        async {
            let req: SelectRequest = connect::unary_request(call.content_type(), &call.body)?;
            let r = selector(req.process)?;
            call.mgr.close_stdin(&call.id, &r).await?;
            Ok(Empty {})
        }
        .await,
    )
}

/// `StreamInput` (client streaming): a `start` naming the process, then
/// `data` events, each written as it arrives, so a long input reaches the
/// process while the client is still sending it.
pub(crate) async fn stream_input(call: Call, body: Body) -> Response {
    if let Err(e) = connect::check_stream_type(call.content_type()) {
        return connect::stream_error(e);
    }
    let mut chunks = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut target: Option<ProcessRef> = None;
    let r = async {
        loop {
            while let Some((env, used)) = connect::split_envelope(&buf)? {
                buf.drain(..used);
                let ev: StreamInputRequest = serde_json::from_slice(&env.data).map_err(|e| {
                    ConnectError::invalid(format!("a StreamInputRequest is not valid: {e}"))
                })?;
                if let Some(s) = ev.start {
                    target = Some(selector(s.process)?);
                } else if let Some(d) = ev.data {
                    let r = target.as_ref().ok_or_else(|| {
                        ConnectError::invalid("the input stream must begin with a start event")
                    })?;
                    let data = d.input.map(ProcessInput::bytes).unwrap_or_default();
                    call.mgr.write_stdin(&call.id, r, &data).await?;
                }
            }
            match chunks.next().await {
                Some(Ok(b)) => buf.extend_from_slice(&b),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("the input stream broke off: {e}"),
                    ))
                }
                None if buf.is_empty() => return Ok(Empty {}),
                None => {
                    return Err(ConnectError::invalid(
                        "the input stream ends inside an envelope",
                    ))
                }
            }
        }
    }
    .await;
    connect::client_stream_answer(r)
}
