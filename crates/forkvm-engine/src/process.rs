//! Background processes and PTYs in a sandbox: the typed actions behind
//! `/v1/sandboxes/{id}/processes` (and, later, the E2B-compatible process
//! service and MCP).
//!
//! The processes belong to the guest agent (protocol 3, see
//! `forkvm_agent_protocol::caps`): they outlive the request that started
//! them, keep their last 1 MiB of output for every attach to replay, and
//! are part of the VM's memory, so a branch's children have them too. The
//! daemon keeps no state of its own about them; every action is one agent
//! request, and a front-end renders the [`ProcEvent`] stream it gets back.

use std::sync::Arc;

use forkvm_agent_protocol::caps::INPUT_QUEUE;
use forkvm_api::{
    check_tag, Process, ProcessList, ProcessRef, PtySize, StartProcess, MAX_PTY_SIDE,
};

use crate::agent::{AgentConn, ProcSpec, ProcTarget};
/// What a process stream carries, for the front-ends that render it.
pub use crate::agent::{AgentStream, ProcEvent};
use crate::error::{agent_error, logged, EngineError, ErrorKind, HintAction};
use crate::fs::check_guest_path;
use crate::manager::Manager;
pub use forkvm_agent_protocol::ProcStream;

/// A stream of one process's events, its `Started` already taken.
pub struct ProcessStream {
    pub pid: u32,
    pub events: AgentStream<ProcEvent>,
}

fn target(r: &ProcessRef) -> ProcTarget {
    match r {
        ProcessRef::Pid(p) => ProcTarget::Pid(*p),
        ProcessRef::Tag(t) => ProcTarget::Tag(t.clone()),
    }
}

fn check_pty(size: PtySize) -> Result<forkvm_agent_protocol::PtySize, EngineError> {
    let ok = |n: u16| (1..=MAX_PTY_SIDE).contains(&n);
    if !ok(size.cols) || !ok(size.rows) {
        return Err(EngineError::invalid(format!(
            "a terminal has 1 to {MAX_PTY_SIDE} columns and rows (got {}x{})",
            size.cols, size.rows
        )));
    }
    Ok(forkvm_agent_protocol::PtySize {
        cols: size.cols,
        rows: size.rows,
    })
}

impl Manager {
    /// The agent connection of a running sandbox.
    pub async fn guest_agent(&self, id: &str) -> Result<Arc<AgentConn>, EngineError> {
        let live = self.running(id)?;
        live.agent().await.map_err(|e| agent_error(id, e))
    }

    /// An error about process `r` of sandbox `id`, logged; a process that
    /// is not there says how to list those that are.
    fn proc_error(&self, id: &str, what: &str, e: crate::agent::AgentError) -> EngineError {
        let mut e = agent_error(id, e);
        if e.kind == crate::error::ErrorKind::NotFound {
            e.message = format!("{} in sandbox {id}", e.message);
            e = e.hint_on(HintAction::ListProcesses, id);
        }
        logged(id, what, e)
    }

    /// Start a background process (the image's defaults apply as for an
    /// exec) and return the stream following it. Dropping the stream
    /// leaves the process running.
    pub async fn start_process(
        &self,
        id: &str,
        req: StartProcess,
    ) -> Result<ProcessStream, EngineError> {
        let defaults = self.exec_defaults_of(id)?;
        let mut argv = req.argv;
        if argv.is_empty() {
            argv = defaults.default_argv();
            if argv.is_empty() {
                return Err(EngineError::invalid(
                    "argv must name a program, e.g. [\"python3\", \"-m\", \"http.server\"] \
                     (this sandbox's image has no default command: no Entrypoint or Cmd)",
                ));
            }
        }
        if argv[0].is_empty() {
            return Err(EngineError::invalid(
                "argv must name a program, e.g. [\"python3\", \"-m\", \"http.server\"]",
            ));
        }
        if let Some(t) = &req.tag {
            check_tag(t).map_err(EngineError::invalid)?;
        }
        let pty = req.pty.map(check_pty).transpose()?;
        // The image's Env, then the sandbox's own, then the request's.
        let mut env = defaults.env_map();
        env.append(&mut self.get(id)?.env);
        env.append(&mut req.env.clone());
        let cwd = req.cwd.or(defaults.working_dir);
        if let Some(c) = &cwd {
            check_guest_path(c)?;
        }
        let agent = self.guest_agent(id).await?;
        let mut args = argv;
        let cmd = args.remove(0);
        let spec = ProcSpec {
            cmd,
            args,
            envs: env,
            cwd,
            user: req.user.or(defaults.user),
            tag: req.tag,
            pty,
            stdin: req.stdin,
        };
        let (pid, events) = agent
            .proc_start(spec)
            .await
            .map_err(|e| logged(id, "starting a process", agent_error(id, e)))?;
        tracing::debug!(sandbox = %id, "sandbox {id}: started background process {pid}");
        Ok(ProcessStream { pid, events })
    }

    /// The running background processes.
    pub async fn list_processes(&self, id: &str) -> Result<ProcessList, EngineError> {
        let agent = self.guest_agent(id).await?;
        let procs = agent
            .proc_list()
            .await
            .map_err(|e| logged(id, "listing processes", agent_error(id, e)))?;
        Ok(ProcessList {
            processes: procs
                .into_iter()
                .map(|p| Process {
                    pid: p.pid,
                    tag: p.tag,
                    argv: std::iter::once(p.cmd).chain(p.args).collect(),
                    env: p.envs,
                    cwd: p.cwd,
                    pty: p.pty.map(|s| PtySize {
                        cols: s.cols,
                        rows: s.rows,
                    }),
                })
                .collect(),
        })
    }

    /// Attach to a process: its kept output first, then live, to its end.
    pub async fn attach_process(
        &self,
        id: &str,
        r: &ProcessRef,
    ) -> Result<ProcessStream, EngineError> {
        let agent = self.guest_agent(id).await?;
        let (pid, events) = agent
            .proc_connect(&target(r))
            .await
            .map_err(|e| self.proc_error(id, "attaching to a process", e))?;
        Ok(ProcessStream { pid, events })
    }

    /// Queue bytes for a process's stdin, or type them into its PTY.
    pub async fn write_stdin(
        &self,
        id: &str,
        r: &ProcessRef,
        data: &[u8],
    ) -> Result<(), EngineError> {
        if data.len() > INPUT_QUEUE {
            return Err(EngineError::new(ErrorKind::TooLarge, format!(
                    "{} bytes of input at once is over the limit of {INPUT_QUEUE}; send it in parts",
                    data.len()
                ),
            ));
        }
        let agent = self.guest_agent(id).await?;
        agent
            .proc_input(&target(r), data)
            .await
            .map_err(|e| self.proc_error(id, "writing to a process", e))
    }

    /// Close a process's stdin once what is queued has been written.
    pub async fn close_stdin(&self, id: &str, r: &ProcessRef) -> Result<(), EngineError> {
        let agent = self.guest_agent(id).await?;
        agent
            .proc_close_stdin(&target(r))
            .await
            .map_err(|e| self.proc_error(id, "closing a process's stdin", e))
    }

    /// Send a signal (1-64) to a process's group.
    pub async fn signal_process(
        &self,
        id: &str,
        r: &ProcessRef,
        signal: i32,
    ) -> Result<(), EngineError> {
        if !(1..=64).contains(&signal) {
            return Err(EngineError::invalid(format!(
                "signal {signal} is not a signal number (1-64; 15 is SIGTERM, 9 SIGKILL)"
            )));
        }
        let agent = self.guest_agent(id).await?;
        agent
            .proc_signal(&target(r), signal)
            .await
            .map_err(|e| self.proc_error(id, "signalling a process", e))
    }

    /// Kill a process (SIGKILL to its group).
    pub async fn kill_process(&self, id: &str, r: &ProcessRef) -> Result<(), EngineError> {
        self.signal_process(id, r, libc::SIGKILL).await
    }

    /// Set the size of a process's PTY.
    pub async fn resize_pty(
        &self,
        id: &str,
        r: &ProcessRef,
        size: PtySize,
    ) -> Result<(), EngineError> {
        let size = check_pty(size)?;
        let agent = self.guest_agent(id).await?;
        agent
            .proc_resize(&target(r), size)
            .await
            .map_err(|e| self.proc_error(id, "resizing a terminal", e))
    }
}
