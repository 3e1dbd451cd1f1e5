//! `forkvm exec` and `forkvm run`: the request, the streamed output and the exit code.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use forkvm_api::{Client, ExecEvent, ExecRequest, OutputEncoding};

use crate::args::*;
use crate::print_json;

pub(crate) fn exec_req(a: &ExecArgs) -> Result<ExecRequest> {
    let mut env = BTreeMap::new();
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {kv:?} must look like KEY=VALUE"))?;
        if k.is_empty() {
            bail!("--env {kv:?} has an empty name");
        }
        env.insert(k.to_string(), v.to_string());
    }
    let timeout_ms = match a.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => {
            bail!("--timeout must be a positive number of seconds")
        }
        Some(t) => Some((t * 1000.0).ceil() as u64),
        None => None,
    };
    // Docker's rules, applied by the daemon to the sandbox's image: the
    // arguments replace Cmd, never Entrypoint.
    let entrypoint = a.entrypoint.as_ref().map(|e| {
        if e.is_empty() {
            vec![]
        } else {
            vec![e.clone()]
        }
    });
    Ok(ExecRequest {
        cmd: (!a.argv.is_empty()).then(|| a.argv.clone()),
        entrypoint,
        env,
        cwd: a.cwd.clone(),
        user: a.user.clone(),
        timeout_ms,
        encoding: Some(OutputEncoding::Base64),
        ..Default::default()
    })
}

pub(crate) async fn do_exec(c: &Client, id: &str, a: &ExecArgs, json: bool) -> Result<ExitCode> {
    let mut req = exec_req(a)?;
    if a.stdin {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        req.stdin_base64 = Some(base64::engine::general_purpose::STANDARD.encode(buf));
    }
    if json {
        req.encoding = Some(OutputEncoding::Utf8);
    }
    if json {
        let r = c.exec(id, &req).await?;
        print_json(&r)?;
        return Ok(exit_code(
            r.timed_out,
            r.exit_code,
            r.signal,
            r.duration_ms,
            true,
        ));
    }
    // On a terminal the output is streamed: a long command shows it live.
    let dec = |s: &str| base64::engine::general_purpose::STANDARD.decode(s);
    let mut write_err = None;
    let last = c
        .exec_stream(id, &req, |ev| {
            let r = match ev {
                ExecEvent::Stdout { data } => dec(data).map(|b| {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&b).and_then(|_| o.flush())
                }),
                ExecEvent::Stderr { data } => dec(data).map(|b| {
                    let mut o = std::io::stderr().lock();
                    o.write_all(&b).and_then(|_| o.flush())
                }),
                _ => Ok(Ok(())),
            };
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    write_err.get_or_insert_with(|| anyhow!("writing the output: {e}"));
                }
                Err(e) => {
                    write_err.get_or_insert_with(|| anyhow!("bad output chunk from daemon: {e}"));
                }
            }
        })
        .await?;
    if let Some(e) = write_err {
        return Err(e);
    }
    let ExecEvent::Exit {
        exit_code: code,
        signal,
        timed_out,
        duration_ms,
        ..
    } = last
    else {
        bail!("the exec stream ended without an exit status");
    };
    Ok(exit_code(timed_out, code, signal, duration_ms, false))
}

/// The CLI's exit status for a finished command: its own, 128+signal, or 124
/// when it timed out (as `timeout(1)` does).
pub(crate) fn exit_code(
    timed_out: bool,
    code: Option<i32>,
    signal: Option<i32>,
    duration_ms: u64,
    quiet: bool,
) -> ExitCode {
    if timed_out {
        if !quiet {
            eprintln!("forkvm: the command timed out after {duration_ms} ms and was killed");
        }
        return ExitCode::from(124);
    }
    match (code, signal) {
        (Some(c), _) => ExitCode::from((c & 0xff) as u8),
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        _ => ExitCode::from(1),
    }
}
