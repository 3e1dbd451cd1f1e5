//! The `exec` request: run a program, stream its output, report its exit.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::{GuestMsg, Stream, ERR_IO, ERR_SPAWN, OUTPUT_CHUNK};

use crate::command::{self, err, spawn_error, Program};
use crate::reaper;
use crate::serve::{Outbox, ReqError};
use crate::sys;

/// After the main process exits, how long its output pipes may stay open
/// (held by a background grandchild) before the process group is killed.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// After that kill, how long to wait for the pipes to close before the
/// readers are told to stop (a grandchild that left the group via setsid can
/// hold them forever).
const KILL_GRACE: Duration = Duration::from_secs(1);
/// How often a reader re-checks its stop flag while the pipe is idle.
const POLL_MS: libc::c_int = 100;
/// Once stopping, a reader still forwards what is already buffered in the
/// pipe, but at most this much, so a runaway writer cannot keep it alive.
const STOP_DRAIN_LIMIT: usize = 4 << 20;

/// A decoded `exec` request.
pub struct ExecRequest {
    pub id: u64,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub timeout_ms: Option<u64>,
    pub stdin: Vec<u8>,
    /// Run as this user (see [`crate::users`]).
    pub user: Option<String>,
}

/// How the process ended (the fields of `GuestMsg::Exited`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReport {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

/// Kills the process group on drop unless disarmed, so an early return or a
/// panic between spawn and exit never leaves the command running unwatched.
struct GroupGuard {
    pgid: libc::pid_t,
    armed: bool,
}

impl GroupGuard {
    fn kill(&self) {
        // ESRCH (group already gone) is expected and harmless.
        let _ = sys::kill_group(self.pgid, libc::SIGKILL);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}

/// Run the command. Output frames are sent on `out` as data arrives; the
/// caller sends the final `Exited` (from the `Ok`) or `Error` message. When
/// this returns `Ok`, every output byte has been handed to `out`.
pub fn run(req: ExecRequest, out: &Arc<Outbox>) -> Result<ExitReport, ReqError> {
    let ExecRequest {
        id,
        argv,
        env,
        cwd,
        timeout_ms,
        stdin,
        user,
    } = req;
    let command::Prepared {
        mut cmd, program, ..
    } = command::prepare(
        &Program {
            argv: &argv,
            env: &env,
            cwd: cwd.as_deref(),
            user: user.as_deref(),
        },
        Path::new(command::ETC),
        false,
    )?;
    // Its own group, so a timeout kills the whole tree it started.
    cmd.process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    let reaper = reaper::global().map_err(|e| err(ERR_SPAWN, e.to_string()))?;
    let started = Instant::now();
    let (mut child, status_rx) = reaper
        .spawn(&mut cmd)
        .map_err(|e| spawn_error(&program, &e))?;
    let pgid = libc::pid_t::try_from(child.id()).unwrap_or(0);
    let mut group = GroupGuard { pgid, armed: true };

    // Stdin: written from its own thread so a child that does not read it
    // (or reads it slowly) cannot block us; dropping the pipe sends EOF.
    if let Some(mut pipe) = child.stdin.take() {
        if !stdin.is_empty() {
            let spawned = thread::Builder::new()
                .name(format!("exec-{id}-stdin"))
                .spawn(move || {
                    // EPIPE just means the command did not read it all.
                    let _ = pipe.write_all(&stdin);
                });
            if let Err(e) = spawned {
                return Err(err(ERR_IO, format!("cannot start a thread: {e}")));
            }
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let mut readers = Vec::with_capacity(2);
    let pipes = [
        child
            .stdout
            .take()
            .map(|p| (Stream::Stdout, Box::new(p) as Box<dyn ReadFd>)),
        child
            .stderr
            .take()
            .map(|p| (Stream::Stderr, Box::new(p) as Box<dyn ReadFd>)),
    ];
    for (stream, pipe) in pipes.into_iter().flatten() {
        let (out, reader_stop, done) = (Arc::clone(out), Arc::clone(&stop), done_tx.clone());
        let spawned = thread::Builder::new()
            .name(format!("exec-{id}-{stream:?}"))
            .spawn(move || pump(pipe, id, stream, &out, &reader_stop, done));
        match spawned {
            Ok(h) => readers.push(h),
            Err(e) => {
                stop.store(true, Ordering::Release);
                // The guard kills the group; the readers stop by themselves.
                return Err(err(ERR_IO, format!("cannot start a thread: {e}")));
            }
        }
    }
    // Only the readers hold senders now: "disconnected" means all are done.
    drop(done_tx);

    let (status, timed_out) = wait_exit(
        &status_rx,
        &group,
        timeout_ms.map(|t| started + Duration::from_millis(t)),
    );
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    // Make sure all output went out before `Exited` is sent.
    let mut finished = 0;
    if !wait_readers(
        &done_rx,
        &mut finished,
        readers.len(),
        Instant::now() + DRAIN_GRACE,
    ) {
        // Something in the group (a background job) still holds the pipes.
        group.kill();
        if !wait_readers(
            &done_rx,
            &mut finished,
            readers.len(),
            Instant::now() + KILL_GRACE,
        ) {
            stop.store(true, Ordering::Release);
        }
    }
    for h in readers {
        let _ = h.join();
    }
    // The main process is gone; leave any remaining background processes
    // alone unless they were killed above.
    group.armed = false;

    let Some(status) = status else {
        return Err(err(ERR_IO, "lost track of the process (reaper gone)"));
    };
    let (exit_code, signal) = reaper::decode_status(status);
    Ok(ExitReport {
        exit_code,
        signal,
        timed_out,
        duration_ms,
    })
}

/// Wait for the main process's status, killing its group at the deadline.
/// Returns the status (None if the reaper vanished) and whether it timed out.
fn wait_exit(
    rx: &Receiver<reaper::WaitStatus>,
    group: &GroupGuard,
    mut deadline: Option<Instant>,
) -> (Option<reaper::WaitStatus>, bool) {
    let mut timed_out = false;
    loop {
        let r = match deadline {
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match r {
            Ok(status) => return (Some(status), timed_out),
            Err(RecvTimeoutError::Timeout) => {
                group.kill();
                timed_out = true;
                // SIGKILL cannot be ignored: now just wait for the status.
                deadline = None;
            }
            Err(RecvTimeoutError::Disconnected) => return (None, timed_out),
        }
    }
}

/// Wait until `expected` readers have finished or `deadline` passes.
fn wait_readers(
    rx: &Receiver<()>,
    finished: &mut usize,
    expected: usize,
    deadline: Instant,
) -> bool {
    while *finished < expected {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => *finished += 1,
            Err(RecvTimeoutError::Timeout) => return false,
            // Every reader dropped its sender, so all are done (even one
            // that panicked without reporting).
            Err(RecvTimeoutError::Disconnected) => *finished = expected,
        }
    }
    true
}

/// A pipe we can both read and poll.
trait ReadFd: Read + AsRawFd + Send {}
impl<T: Read + AsRawFd + Send> ReadFd for T {}

/// Forward one output pipe as `Output` frames of at most OUTPUT_CHUNK bytes,
/// as data arrives, until EOF or until told to stop.
fn pump(
    mut pipe: Box<dyn ReadFd>,
    id: u64,
    stream: Stream,
    out: &Outbox,
    stop: &AtomicBool,
    done: Sender<()>,
) {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    let mut budget = STOP_DRAIN_LIMIT;
    loop {
        let stopping = stop.load(Ordering::Acquire);
        match sys::poll_readable(pipe.as_raw_fd(), if stopping { 0 } else { POLL_MS }) {
            Ok(true) => {}
            Ok(false) if stopping => break,
            Ok(false) => continue,
            Err(_) => break,
        }
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // A failed send (host gone) drops this chunk but keeps draining the
        // pipe, so the command never blocks on a full pipe.
        let _ = out.send(&GuestMsg::Output { id, stream }, &buf[..n]);
        if stopping {
            budget = budget.saturating_sub(n);
            if budget == 0 {
                break;
            }
        }
    }
    let _ = done.send(());
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkvm_agent_protocol::{decode, Frame, ERR_INVALID, ERR_NOT_FOUND};
    use std::sync::Mutex;

    /// A writer that records everything, shared with the test.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn exec(
        argv: &[&str],
        stdin: &[u8],
        timeout_ms: Option<u64>,
    ) -> (Result<ExitReport, ReqError>, Vec<u8>, Vec<u8>) {
        let cap = Capture::default();
        let out = Arc::new(Outbox::new(Box::new(cap.clone())));
        let r = run(
            ExecRequest {
                id: 1,
                argv: argv.iter().map(|s| s.to_string()).collect(),
                env: BTreeMap::new(),
                cwd: None,
                timeout_ms,
                stdin: stdin.to_vec(),
                user: None,
            },
            &out,
        );
        let mut bytes = cap.0.lock().unwrap().clone();
        let (mut so, mut se) = (Vec::new(), Vec::new());
        while let Some(Frame { msg, payload }) = decode::<GuestMsg>(&mut bytes).unwrap() {
            assert!(payload.len() <= OUTPUT_CHUNK);
            match msg {
                GuestMsg::Output {
                    stream: Stream::Stdout,
                    ..
                } => so.extend(payload),
                GuestMsg::Output {
                    stream: Stream::Stderr,
                    ..
                } => se.extend(payload),
                m => panic!("unexpected {m:?}"),
            }
        }
        (r, so, se)
    }

    #[test]
    fn exit_code_and_streams() {
        let (r, so, se) = exec(&["sh", "-c", "echo out; echo err >&2; exit 5"], b"", None);
        let r = r.unwrap();
        assert_eq!((r.exit_code, r.signal, r.timed_out), (Some(5), None, false));
        assert_eq!(so, b"out\n");
        assert_eq!(se, b"err\n");
    }

    #[test]
    fn stdin_is_delivered_then_closed() {
        let (r, so, _) = exec(&["cat"], b"hello\nworld", None);
        assert_eq!(r.unwrap().exit_code, Some(0));
        assert_eq!(so, b"hello\nworld");
    }

    #[test]
    fn unread_large_stdin_does_not_hang() {
        let big = vec![b'x'; 1 << 20];
        let (r, _, _) = exec(&["true"], &big, Some(10_000));
        let r = r.unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert!(!r.timed_out);
    }

    #[test]
    fn signal_is_reported() {
        let (r, _, _) = exec(&["sh", "-c", "kill -TERM $$"], b"", None);
        let r = r.unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(libc::SIGTERM)));
    }

    #[test]
    fn timeout_kills_the_whole_group() {
        let t = Instant::now();
        // The grandchild `sleep` keeps the pipes open; it must die too.
        let (r, _, _) = exec(
            &["sh", "-c", "sleep 30 & sleep 30; echo never"],
            b"",
            Some(200),
        );
        let r = r.unwrap();
        assert!(r.timed_out);
        assert_eq!(r.signal, Some(libc::SIGKILL));
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn background_job_holding_pipes_does_not_hang() {
        let t = Instant::now();
        let (r, so, _) = exec(&["sh", "-c", "sleep 30 & echo started"], b"", None);
        let r = r.unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert!(!r.timed_out);
        assert_eq!(so, b"started\n");
        let e = t.elapsed();
        assert!(
            e >= DRAIN_GRACE && e < DRAIN_GRACE + Duration::from_secs(2),
            "took {e:?}"
        );
    }

    #[test]
    fn request_errors() {
        let (r, _, _) = exec(&[], b"", None);
        assert_eq!(r.unwrap_err().code, ERR_INVALID);
        let (r, _, _) = exec(&["forkvm-no-such-command-xyz"], b"", None);
        let e = r.unwrap_err();
        assert_eq!(e.code, ERR_NOT_FOUND);
        assert_eq!(
            e.message,
            "executable not found: forkvm-no-such-command-xyz"
        );
        let (r, _, _) = exec(&["/etc"], b"", None);
        assert_eq!(r.unwrap_err().code, ERR_SPAWN);
    }
}
