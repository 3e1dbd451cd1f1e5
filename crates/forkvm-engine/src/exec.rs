//! Running a command in a sandbox and reading or writing a whole file: the
//! typed actions behind `POST /v1/sandboxes/{id}/exec` and
//! `/v1/sandboxes/{id}/files`, which MCP's tools call too.
//!
//! Each checks its input against the daemon's limits, fills in the image's
//! defaults, and makes one request to the guest agent.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use forkvm_api::{ExecRequest, ExecResult, FileWritten, OutputEncoding};

use crate::agent::{AgentConn, ExecOutcome, ExecSpec};
use crate::error::{agent_error, EngineError, ErrorKind};
use crate::fs::check_guest_path;
use crate::manager::Manager;

/// How long a whole-file read or write may take.
const FILE_DEADLINE: Duration = Duration::from_secs(120);

impl Manager {
    /// Check an exec request and fill in the image's defaults (argv, env,
    /// cwd, user): the agent to run it on, what to run, and how long to wait
    /// for it on the host.
    pub async fn prepare_exec(
        &self,
        id: &str,
        req: ExecRequest,
    ) -> Result<(Arc<AgentConn>, ExecSpec, Duration), EngineError> {
        let l = &self.cfg.limits;
        // The image's config gives the defaults (docs/images.md).
        let mut req = req;
        let defaults = self.exec_defaults_of(id)?;
        let docker = req.cmd.is_some() || req.entrypoint.is_some();
        if docker && !req.argv.is_empty() {
            return Err(EngineError::invalid(
                "give argv (a command run as it is) or cmd/entrypoint (Docker's rules: cmd \
                 replaces the image's Cmd after its Entrypoint), not both",
            ));
        }
        if req.argv.is_empty() {
            let cmd = req.cmd.take().unwrap_or_default();
            req.argv = defaults.docker_argv(req.entrypoint.take().as_deref(), &cmd);
            if req.argv.is_empty() {
                return Err(EngineError::invalid(if docker {
                    "nothing to run: the entrypoint is empty and no cmd was given"
                } else {
                    "argv must name a program, e.g. [\"python3\", \"-c\", \"print(1)\"] \
                     (this sandbox's image has no default command: no Entrypoint or Cmd)"
                }));
            }
        }
        if req.argv[0].is_empty() {
            return Err(EngineError::invalid(
                "argv must name a program, e.g. [\"python3\", \"-c\", \"print(1)\"]",
            ));
        }
        // The image's Env, then the sandbox's own, then the request's.
        let mut env = defaults.env_map();
        env.append(&mut self.get(id)?.env);
        env.append(&mut req.env);
        req.env = env;
        req.cwd = req.cwd.or(defaults.working_dir);
        req.user = req.user.or(defaults.user);
        let stdin = match (req.stdin, req.stdin_base64) {
            (Some(_), Some(_)) => {
                return Err(EngineError::invalid("give stdin or stdin_base64, not both"))
            }
            (Some(s), None) => s.into_bytes(),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .map_err(|e| {
                    EngineError::invalid(format!("stdin_base64 is not valid base64: {e}"))
                })?,
            (None, None) => Vec::new(),
        };
        if stdin.len() as u64 > l.max_file_bytes {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!(
                    "stdin is {} bytes, over the limit of {}",
                    stdin.len(),
                    l.max_file_bytes
                ),
            ));
        }
        let timeout_ms = req.timeout_ms.unwrap_or(l.max_exec_timeout_ms);
        if timeout_ms == 0 || timeout_ms > l.max_exec_timeout_ms {
            return Err(EngineError::invalid(format!(
                "timeout_ms must be between 1 and {}",
                l.max_exec_timeout_ms
            )));
        }
        let max_output = req.max_output_bytes.unwrap_or(l.max_exec_output_bytes);
        if max_output > l.max_exec_output_bytes {
            return Err(EngineError::invalid(format!(
                "max_output_bytes may be at most {}",
                l.max_exec_output_bytes
            )));
        }
        let live = self.running(id)?;
        let agent = live.agent().await.map_err(|e| agent_error(id, e))?;
        let spec = ExecSpec {
            argv: req.argv,
            env: req.env,
            cwd: req.cwd,
            user: req.user,
            stdin,
            timeout_ms: Some(timeout_ms),
            max_output,
        };
        let deadline = Duration::from_millis(timeout_ms) + Manager::HOST_GRACE;
        Ok((agent, spec, deadline))
    }

    /// Run a command and wait for it (`stream` is ignored: the streamed form
    /// is [`Manager::exec_events`]).
    pub async fn exec(&self, id: &str, req: ExecRequest) -> Result<ExecResult, EngineError> {
        let encoding = req.encoding.unwrap_or_default();
        let (agent, spec, deadline) = self.prepare_exec(id, req).await?;
        // A guest that disk pressure stops meanwhile cannot answer: the
        // call ends then, with 507, rather than at its timeout. (The
        // command runs on when the guest resumes; its output is lost.)
        let out = tokio::select! {
            r = agent.exec(spec, deadline) => r.map_err(|e| agent_error(id, e))?,
            reason = self.suspended.wait(id) => return Err(self.suspended_error(id, &reason)),
        };
        Ok(render_exec(out, encoding))
    }

    /// Write a whole file in the guest (atomically: temp file, fsync,
    /// rename); `mode` defaults to 0644.
    pub async fn write_file(
        &self,
        id: &str,
        path: String,
        mode: Option<u32>,
        data: &[u8],
    ) -> Result<FileWritten, EngineError> {
        check_guest_path(&path)?;
        let mode = match mode {
            Some(m) if m > 0o7777 => {
                return Err(EngineError::invalid(format!(
                    "mode {m:o} is not an octal mode like 644"
                )))
            }
            Some(m) => m,
            None => 0o644,
        };
        let max = self.cfg.limits.max_file_bytes;
        if data.len() as u64 > max {
            return Err(EngineError::new(
                ErrorKind::TooLarge,
                format!("file is {} bytes, over the limit of {max}", data.len()),
            ));
        }
        let live = self.running(id)?;
        let agent = live.agent().await.map_err(|e| agent_error(id, e))?;
        let size = agent
            .write_file(&path, mode, data, FILE_DEADLINE)
            .await
            .map_err(|e| agent_error(id, e))?;
        Ok(FileWritten { path, size })
    }

    /// Read a whole file from the guest, up to the daemon's file limit.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, EngineError> {
        check_guest_path(path)?;
        let live = self.running(id)?;
        let agent = live.agent().await.map_err(|e| agent_error(id, e))?;
        agent
            .read_file(path, self.cfg.limits.max_file_bytes, FILE_DEADLINE)
            .await
            .map_err(|e| agent_error(id, e))
    }
}

/// An agent's exec output as the API's result.
pub fn render_exec(out: ExecOutcome, encoding: OutputEncoding) -> ExecResult {
    let render = |b: &[u8]| match encoding {
        OutputEncoding::Utf8 => String::from_utf8_lossy(b).into_owned(),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(b),
    };
    ExecResult {
        exit_code: out.exit_code,
        signal: out.signal,
        timed_out: out.timed_out,
        stdout: render(&out.stdout),
        stderr: render(&out.stderr),
        encoding,
        stdout_truncated: out.stdout_bytes > out.stdout.len() as u64,
        stderr_truncated: out.stderr_bytes > out.stderr.len() as u64,
        stdout_bytes: out.stdout_bytes,
        stderr_bytes: out.stderr_bytes,
        duration_ms: out.duration_ms,
    }
}
