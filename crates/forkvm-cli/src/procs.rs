//! `forkvm proc`: background processes and PTYs in a sandbox.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use clap::Subcommand;
use forkvm_api::{Client, ProcessEvent, PtySize, StartProcess};

#[derive(Subcommand)]
pub enum ProcCmd {
    /// Start a background process and print its pid (it keeps running
    /// after this command; its last 1 MiB of output is kept for `attach`).
    Start {
        id: String,
        /// A name to address it by instead of its pid.
        #[arg(long)]
        tag: Option<String>,
        /// Run it on a PTY of this size (COLSxROWS, e.g. 80x24).
        #[arg(long, value_name = "COLSxROWS", value_parser = parse_size)]
        pty: Option<PtySize>,
        /// Give it a stdin pipe (write with `forkvm proc stdin`).
        #[arg(short = 'i', long = "stdin")]
        stdin: bool,
        /// Set an environment variable (repeatable).
        #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = crate::lifetime::parse_pair)]
        env: Vec<(String, String)>,
        /// Working directory in the guest.
        #[arg(short = 'w', long = "workdir")]
        cwd: Option<String>,
        /// Run as this user (`name`, `uid`, `name:group`, `uid:gid`).
        #[arg(short = 'u', long = "user")]
        user: Option<String>,
        /// Follow its output until it ends, and exit with its exit code.
        #[arg(long)]
        attach: bool,
        /// The command and its arguments (default: the image's).
        #[arg(last = true, value_name = "CMD")]
        argv: Vec<String>,
    },
    /// List the running background processes.
    Ls { id: String },
    /// Print a process's output: what was kept, then live until it ends;
    /// exit with its exit code.
    Attach {
        id: String,
        /// Its pid or tag.
        process: String,
    },
    /// Write to a process's stdin (or type into its PTY): TEXT, or else
    /// this command's stdin.
    Stdin {
        id: String,
        process: String,
        text: Option<String>,
        /// Close its stdin afterwards (alone: only close it).
        #[arg(long)]
        close: bool,
    },
    /// Send a signal (a name such as TERM or INT, or a number) to a
    /// process's group.
    Signal {
        id: String,
        process: String,
        signal: String,
    },
    /// Kill a process (SIGKILL to its group).
    Kill { id: String, process: String },
    /// Resize a process's PTY.
    Resize {
        id: String,
        process: String,
        #[arg(value_name = "COLSxROWS", value_parser = parse_size)]
        size: PtySize,
    },
}

fn parse_size(s: &str) -> Result<PtySize, String> {
    let bad = || format!("{s:?} is not a terminal size COLSxROWS, e.g. 80x24");
    let (c, r) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    Ok(PtySize {
        cols: c.parse().map_err(|_| bad())?,
        rows: r.parse().map_err(|_| bad())?,
    })
}

/// Print one event's output; the exit code once it ends.
fn show(ev: &ProcessEvent, err: &mut Option<anyhow::Error>) {
    let dec = |s: &str| base64::engine::general_purpose::STANDARD.decode(s);
    let (data, to_err, lost) = match ev {
        ProcessEvent::Stdout { data, lost } | ProcessEvent::Pty { data, lost } => {
            (data, false, *lost)
        }
        ProcessEvent::Stderr { data, lost } => (data, true, *lost),
        _ => return,
    };
    if lost > 0 {
        eprintln!("forkvm: [{lost} bytes of output lost here]");
    }
    let r = match dec(data) {
        Ok(b) if to_err => {
            let mut o = std::io::stderr().lock();
            o.write_all(&b).and_then(|_| o.flush())
        }
        Ok(b) => {
            let mut o = std::io::stdout().lock();
            o.write_all(&b).and_then(|_| o.flush())
        }
        Err(e) => {
            err.get_or_insert_with(|| anyhow!("bad output chunk from the daemon: {e}"));
            return;
        }
    };
    if let Err(e) = r {
        err.get_or_insert_with(|| anyhow!("writing the output: {e}"));
    }
}

fn end_code(end: Option<ProcessEvent>) -> Result<ExitCode> {
    match end {
        Some(ProcessEvent::End {
            exited,
            exit_code,
            signal,
            ..
        }) => Ok(if exited {
            ExitCode::from((exit_code & 0xff) as u8)
        } else {
            ExitCode::from((128 + signal.unwrap_or(0)).clamp(0, 255) as u8)
        }),
        _ => bail!("the process stream ended without the process's end"),
    }
}

pub async fn run(c: &Client, cmd: ProcCmd, json: bool) -> Result<ExitCode> {
    let done = |v: serde_json::Value| -> Result<ExitCode> {
        if json {
            crate::print_json(&v)?;
        }
        Ok(ExitCode::SUCCESS)
    };
    match cmd {
        ProcCmd::Start {
            id,
            tag,
            pty,
            stdin,
            env,
            cwd,
            user,
            attach,
            argv,
        } => {
            let req = StartProcess {
                argv,
                env: env.into_iter().collect::<BTreeMap<_, _>>(),
                cwd,
                user,
                tag,
                pty,
                stdin,
                stream: false,
            };
            if attach {
                let mut err = None;
                let end = c
                    .start_process_stream(&id, &req, |ev| {
                        if json {
                            println!("{}", serde_json::to_string(ev).unwrap_or_default());
                        } else {
                            show(ev, &mut err);
                        }
                        true
                    })
                    .await?;
                if let Some(e) = err {
                    return Err(e);
                }
                return end_code(end);
            }
            let p = c.start_process(&id, &req).await?;
            if json {
                crate::print_json(&p)?;
            } else {
                println!("{}", p.pid);
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcCmd::Ls { id } => {
            let l = c.list_processes(&id).await?;
            if json {
                crate::print_json(&l)?;
            } else {
                println!("{:>7} {:<16} {:<9} COMMAND", "PID", "TAG", "PTY");
                for p in l.processes {
                    println!(
                        "{:>7} {:<16} {:<9} {}",
                        p.pid,
                        p.tag.unwrap_or_else(|| "-".into()),
                        p.pty
                            .map(|s| format!("{}x{}", s.cols, s.rows))
                            .unwrap_or_else(|| "-".into()),
                        p.argv.join(" ")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcCmd::Attach { id, process } => {
            let mut err = None;
            let end = c
                .attach_process(&id, &process, |ev| {
                    if json {
                        println!("{}", serde_json::to_string(ev).unwrap_or_default());
                    } else {
                        show(ev, &mut err);
                    }
                    true
                })
                .await?;
            if let Some(e) = err {
                return Err(e);
            }
            end_code(end)
        }
        ProcCmd::Stdin {
            id,
            process,
            text,
            close,
        } => {
            let data = match text {
                Some(t) => Some(t.into_bytes()),
                None if close => None,
                None => {
                    let mut b = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut b)
                        .context("reading stdin")?;
                    Some(b)
                }
            };
            let mut sent = 0;
            if let Some(d) = data {
                sent = d.len();
                c.write_stdin(&id, &process, d.into()).await?;
            }
            if close {
                c.close_stdin(&id, &process).await?;
            }
            done(serde_json::json!({ "written": sent, "closed": close }))
        }
        ProcCmd::Signal {
            id,
            process,
            signal,
        } => {
            let n = forkvm_api::signal_number(&signal).ok_or_else(|| {
                anyhow!("{signal:?} is not a signal: give a name (TERM, INT, KILL, HUP...) or a number 1-64")
            })?;
            c.signal_process(&id, &process, n).await?;
            done(serde_json::json!({ "signal": n }))
        }
        ProcCmd::Kill { id, process } => {
            c.kill_process(&id, &process).await?;
            done(serde_json::json!({ "killed": process }))
        }
        ProcCmd::Resize { id, process, size } => {
            c.resize_pty(&id, &process, size).await?;
            done(serde_json::json!({ "cols": size.cols, "rows": size.rows }))
        }
    }
}
