//! Detached `exec` (`detach: true`): start a long-running process, such as
//! an image's start command (a dev server, a Jupyter kernel), and answer at
//! once with its pid.
//!
//! The process gets its own session and process group (setsid), stdin from
//! /dev/null, and stdout and stderr appended to a log file. Nothing ties it
//! to the request or to the host connection: the host later snapshots the
//! VM with it running, and every clone resumes it with the same pid.
//!
//! The log is `log_path` when the request names one (created if missing,
//! appended to otherwise; its directory must exist), else
//! `/run/forkvm/start-<pid>.log` (a tmpfs). The agent opens it before the
//! fork, under a temporary name when the pid is not known yet, and renames
//! it once it is. A log the agent creates is owned by the user the process
//! runs as.
//!
//! The reaper (see [`crate::reaper`]) reaps the process when it exits; a
//! small watcher thread then appends `forkvm-agent: pid <pid> exited with
//! code <n>` (or `killed by signal <n>`) to the log and the console, so a
//! start command that died can be diagnosed from its log.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc::Receiver;
use std::thread;

use forkvm_agent_protocol::{ERR_INVALID, ERR_IO, ERR_NOT_FOUND, ERR_SPAWN};

use crate::command::{self, err, spawn_error, Program};
use crate::reaper::{self, WaitStatus};
use crate::serve::ReqError;

/// Stack of a watcher thread: it only waits and writes one line.
const WATCHER_STACK: usize = 64 << 10;

/// A decoded detached `exec` request.
pub struct StartRequest {
    pub id: u64,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub user: Option<String>,
    pub log_path: Option<String>,
}

/// What `Started` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub pid: u32,
    pub log_path: String,
}

/// Open (or create) a log for appending. Returns whether it was created.
fn open_log(path: &Path) -> io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.append(true).mode(0o644);
    match o.clone().create_new(true).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok((o.open(path)?, false)),
        Err(e) => Err(e),
    }
}

fn log_error(path: &Path, e: &io::Error) -> ReqError {
    let p = path.display();
    match e.kind() {
        io::ErrorKind::NotFound => err(
            ERR_NOT_FOUND,
            format!("cannot create the log {p}: its directory does not exist"),
        ),
        _ => err(ERR_IO, format!("cannot open the log {p}: {e}")),
    }
}

/// Start the process. `etc` holds passwd/group, `log_dir` the default logs.
pub fn start(req: StartRequest, etc: &Path, log_dir: &Path) -> Result<Started, ReqError> {
    let command::Prepared {
        mut cmd,
        program,
        creds,
    } = command::prepare(
        &Program {
            argv: &req.argv,
            env: &req.env,
            cwd: req.cwd.as_deref(),
            user: req.user.as_deref(),
        },
        etc,
        true,
    )?;

    let (log_path, temporary) = match &req.log_path {
        Some(p) => {
            if !Path::new(p).is_absolute() || p.contains('\0') {
                return Err(err(
                    ERR_INVALID,
                    format!("log_path must be an absolute path: {p:?}"),
                ));
            }
            (PathBuf::from(p), false)
        }
        None => {
            std::fs::create_dir_all(log_dir).map_err(|e| log_error(log_dir, &e))?;
            (log_dir.join(format!(".start-req-{}.log", req.id)), true)
        }
    };
    let (log, created) = open_log(&log_path).map_err(|e| log_error(&log_path, &e))?;
    if let (true, Some(c)) = (created, &creds) {
        // Best effort: the process writes through the fd either way.
        let _ = std::os::unix::fs::fchown(&log, Some(c.uid), Some(c.gid));
    }
    let dup = |f: &File| f.try_clone().map_err(|e| log_error(&log_path, &e));
    cmd.stdin(Stdio::null())
        .stdout(dup(&log)?)
        .stderr(dup(&log)?);

    let reaper = reaper::global().map_err(|e| err(ERR_SPAWN, e.to_string()))?;
    let spawned = reaper.spawn(&mut cmd);
    // The command holds the log's other fds: close them now.
    drop(cmd);
    let (child, status) = match spawned {
        Ok(s) => s,
        Err(e) => {
            if temporary {
                let _ = std::fs::remove_file(&log_path);
            }
            return Err(spawn_error(&program, &e));
        }
    };
    let pid = child.id();
    drop(child);
    let log_path = if temporary {
        let final_path = log_dir.join(format!("start-{pid}.log"));
        match std::fs::rename(&log_path, &final_path) {
            Ok(()) => final_path,
            Err(e) => {
                crate::log(&format!(
                    "cannot rename {} to {}: {e}",
                    log_path.display(),
                    final_path.display()
                ));
                log_path
            }
        }
    } else {
        log_path
    };
    watch(pid, status, log);
    Ok(Started {
        pid,
        log_path: log_path.display().to_string(),
    })
}

/// The line written when a detached process ends.
fn exit_line(pid: u32, status: WaitStatus) -> String {
    match reaper::decode_status(status) {
        (Some(code), _) => format!("forkvm-agent: pid {pid} exited with code {code}"),
        (_, Some(sig)) => format!("forkvm-agent: pid {pid} was killed by signal {sig}"),
        _ => format!("forkvm-agent: pid {pid} ended (wait status {status:#x})"),
    }
}

/// Wait for the process in a small thread and record how it ended.
fn watch(pid: u32, status: Receiver<WaitStatus>, mut log: File) {
    let spawned = thread::Builder::new()
        .name(format!("start-{pid}"))
        .stack_size(WATCHER_STACK)
        .spawn(move || {
            // A disconnected channel means the reaper is gone: nothing to say.
            if let Ok(st) = status.recv() {
                let line = exit_line(pid, st);
                let _ = writeln!(log, "{line}");
                crate::log(&line);
            }
        });
    if let Err(e) = spawned {
        // The reaper still reaps it; only the exit line is lost.
        crate::log(&format!("cannot watch pid {pid}: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;
    use std::time::{Duration, Instant};

    fn req(argv: &[&str], log_path: Option<String>) -> StartRequest {
        StartRequest {
            id: 77,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            log_path,
        }
    }

    fn wait_for(path: &Path, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = std::fs::read_to_string(path).unwrap_or_default();
            if s.contains(needle) || Instant::now() > deadline {
                return s;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn default_log_is_named_after_the_pid_and_gets_the_exit_line() {
        let d = temp_dir("start-default");
        let logs = d.join("run/forkvm");
        let s = start(
            req(
                &[
                    "sh",
                    "-c",
                    "echo out; echo err >&2; read x || echo stdin-closed; exit 3",
                ],
                None,
            ),
            Path::new("/etc"),
            &logs,
        )
        .unwrap();
        assert_eq!(
            s.log_path,
            logs.join(format!("start-{}.log", s.pid))
                .display()
                .to_string()
        );
        let text = wait_for(Path::new(&s.log_path), "exited");
        assert_eq!(
            text,
            format!(
                "out\nerr\nstdin-closed\nforkvm-agent: pid {} exited with code 3\n",
                s.pid
            )
        );
        assert_eq!(
            std::fs::read_dir(&logs).unwrap().count(),
            1,
            "no temporary log left"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn runs_in_its_own_session_and_appends_to_a_given_log() {
        let d = temp_dir("start-session");
        let log = d.join("app.log");
        std::fs::write(&log, "previous run\n").unwrap();
        let s = start(
            req(
                &[
                    "sh",
                    "-c",
                    "read -r _ _ _ _ pgid sid _ < /proc/$$/stat; echo pgid=$pgid sid=$sid pid=$$",
                ],
                Some(log.display().to_string()),
            ),
            Path::new("/etc"),
            &d.join("unused"),
        )
        .unwrap();
        let text = wait_for(&log, "exited");
        assert!(text.starts_with("previous run\n"), "{text}");
        // setsid made it a session and group leader.
        assert!(
            text.contains(&format!("pgid={0} sid={0} pid={0}\n", s.pid)),
            "{text}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn errors_come_before_anything_runs() {
        let d = temp_dir("start-errors");
        let logs = d.join("logs");
        let e = start(
            req(&["forkvm-no-such-program"], None),
            Path::new("/etc"),
            &logs,
        )
        .unwrap_err();
        assert_eq!(e.code, forkvm_agent_protocol::ERR_NOT_FOUND);
        assert_eq!(
            std::fs::read_dir(&logs).unwrap().count(),
            0,
            "temporary log removed"
        );
        let e = start(
            req(&["true"], Some("relative.log".into())),
            Path::new("/etc"),
            &logs,
        )
        .unwrap_err();
        assert_eq!(e.code, ERR_INVALID);
        let e = start(
            req(
                &["true"],
                Some(d.join("no/such/dir/x.log").display().to_string()),
            ),
            Path::new("/etc"),
            &logs,
        )
        .unwrap_err();
        assert!(
            e.message.contains("directory does not exist"),
            "{}",
            e.message
        );
        let mut r = req(&["true"], None);
        r.cwd = Some("/forkvm/no/such/dir".into());
        let e = start(r, Path::new("/etc"), &logs).unwrap_err();
        assert_eq!(
            e.message,
            "working directory /forkvm/no/such/dir does not exist in the image"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn exit_lines() {
        assert_eq!(
            exit_line(5, 3 << 8),
            "forkvm-agent: pid 5 exited with code 3"
        );
        assert_eq!(
            exit_line(5, 9),
            "forkvm-agent: pid 5 was killed by signal 9"
        );
    }
}
