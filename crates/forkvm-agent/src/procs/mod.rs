//! Background processes (`proc_*` requests): the agent's process table.
//!
//! Each process started by `proc_start` gets its own session and process
//! group, and a few small threads:
//!
//! * one reader per output (stdout and stderr, or the PTY master) that
//!   copies what it reads into the process's [`Ring`] and wakes the
//!   streams following it; it never waits for the host, so a process is
//!   never slowed by a slow or absent host;
//! * a waiter that takes the exit status from the [`reaper`], waits up to
//!   [`DRAIN_GRACE`] for the outputs to close (a background grandchild may
//!   hold them open), records the end, and moves the process to the short
//!   list of ended ones;
//! * with stdin or a PTY, a writer that drains the input queue into it.
//!
//! Streams ([`follow`]) read the ring with their own cursor. All of this is
//! plain memory of the agent, so it is carried into every branch of the VM
//! along with the processes themselves.

mod follow;
mod ring;

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::caps::{EXITED_KEPT, INPUT_QUEUE};
use forkvm_agent_protocol::{
    ProcInfo, ProcStart, ProcStream, PtySize, ERR_INVALID, ERR_IO, ERR_NOT_FOUND, ERR_SPAWN,
    ERR_TOO_LARGE, OUTPUT_CHUNK,
};

pub use follow::{follow, KEEPALIVE};
use ring::Ring;

use crate::command::{self, err, spawn_error, Program};
use crate::reaper::{self, WaitStatus};
use crate::serve::ReqError;
use crate::{pty, sys};

/// After the process exits, how long its outputs may stay open before its
/// end is reported anyway.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Stack of the per-process threads (their buffers are on the heap).
const THREAD_STACK: usize = 128 << 10;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The process table.
#[derive(Default)]
pub struct Procs {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    running: BTreeMap<u32, Arc<Proc>>,
    /// The most recently ended, newest last.
    exited: VecDeque<Arc<Proc>>,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub exit_code: i32,
    pub exited: bool,
    pub signal: Option<i32>,
    pub status: String,
    pub error: Option<String>,
}

impl End {
    fn from_status(status: WaitStatus) -> End {
        match reaper::decode_status(status) {
            (Some(code), _) => End {
                exit_code: code,
                exited: true,
                signal: None,
                status: format!("exit status {code}"),
                error: None,
            },
            (_, Some(sig)) => End {
                exit_code: -1,
                exited: false,
                signal: Some(sig),
                status: format!("signal: {}", signal_name(sig)),
                error: None,
            },
            _ => End::lost(format!("unexpected wait status {status:#x}")),
        }
    }

    fn lost(error: String) -> End {
        End {
            exit_code: -1,
            exited: false,
            signal: None,
            status: "unknown".into(),
            error: Some(error),
        }
    }
}

/// Go's names for the common signals (envd reports Go's wording).
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGABRT => "aborted",
        libc::SIGKILL => "killed",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGUSR2 => "user defined signal 2",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// One process.
pub struct Proc {
    pub pid: u32,
    pub tag: Option<String>,
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
    state: Mutex<State>,
    cond: Condvar,
    input: Option<Arc<Input>>,
    /// The PTY master, for resizing.
    pty: Option<File>,
}

#[derive(Default)]
struct State {
    ring: Ring,
    end: Option<End>,
    open_outputs: usize,
    pty_size: Option<PtySize>,
}

/// Input waiting to be written to a process's stdin or PTY.
struct Input {
    q: Mutex<InputQ>,
    cond: Condvar,
}

#[derive(Default)]
struct InputQ {
    chunks: VecDeque<Vec<u8>>,
    queued: usize,
    /// Close after the queued chunks (stdin closed, or the process ended).
    close: bool,
    /// Why writing failed (the process stopped reading for good).
    broken: Option<String>,
}

impl Input {
    fn push(&self, data: Vec<u8>) -> Result<(), ReqError> {
        let mut q = lock(&self.q);
        if let Some(e) = &q.broken {
            return Err(err(ERR_IO, format!("cannot write to the process: {e}")));
        }
        if q.close {
            return Err(err(ERR_INVALID, "stdin is closed"));
        }
        if q.queued + data.len() > INPUT_QUEUE {
            return Err(err(
                ERR_TOO_LARGE,
                format!(
                    "{} bytes are already waiting to be written (limit {INPUT_QUEUE}); \
                     the process is not reading its input",
                    q.queued
                ),
            ));
        }
        q.queued += data.len();
        q.chunks.push_back(data);
        drop(q);
        self.cond.notify_all();
        Ok(())
    }

    fn close(&self) {
        lock(&self.q).close = true;
        self.cond.notify_all();
    }

    /// The writer thread: drain the queue into `fd`, then close it.
    fn run(&self, mut fd: File) {
        loop {
            let next = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(c) = q.chunks.pop_front() {
                        q.queued -= c.len();
                        break Some(c);
                    }
                    if q.close {
                        break None;
                    }
                    q = self.cond.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let Some(chunk) = next else { return };
            if let Err(e) = fd.write_all(&chunk) {
                let mut q = lock(&self.q);
                q.broken = Some(e.to_string());
                q.chunks.clear();
                q.queued = 0;
                return;
            }
        }
    }
}

fn spawn_thread(name: String, f: impl FnOnce() + Send + 'static) -> Result<(), ReqError> {
    thread::Builder::new()
        .name(name)
        .stack_size(THREAD_STACK)
        .spawn(f)
        .map(drop)
        .map_err(|e| err(ERR_IO, format!("cannot start a thread: {e}")))
}

fn file_of(fd: impl Into<OwnedFd>) -> File {
    File::from(fd.into())
}

impl Procs {
    /// Start a process and register it.
    pub fn start(self: &Arc<Self>, req: &ProcStart, etc: &Path) -> Result<Arc<Proc>, ReqError> {
        let mut argv = vec![req.cmd.clone()];
        argv.extend(req.args.iter().cloned());
        let mut env = req.envs.clone();
        if req.pty.is_some() {
            env.entry("TERM".into())
                .or_insert_with(|| "xterm-256color".into());
        }
        let command::Prepared {
            mut cmd, program, ..
        } = command::prepare(
            &Program {
                argv: &argv,
                env: &env,
                cwd: req.cwd.as_deref(),
                user: req.user.as_deref(),
            },
            etc,
            true,
        )?;
        let io_err = |what: &str, e: io::Error| err(ERR_IO, format!("cannot {what}: {e}"));
        let pty = req
            .pty
            .map(pty::open)
            .transpose()
            .map_err(|e| io_err("open a pty", e))?;
        match &pty {
            Some(p) => {
                let dup = || p.slave.try_clone().map_err(|e| io_err("open a pty", e));
                cmd.stdin(dup()?).stdout(dup()?).stderr(dup()?);
                pty::make_controlling(&mut cmd);
            }
            None => {
                let stdin = if req.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                };
                cmd.stdin(stdin)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
            }
        }

        let mut table = lock(&self.table);
        if let Some(tag) = &req.tag {
            if let Some(p) = table.running.values().find(|p| p.tag.as_ref() == Some(tag)) {
                return Err(err(
                    ERR_INVALID,
                    format!("tag {tag:?} is already used by running process {}", p.pid),
                ));
            }
        }
        let reaper = reaper::global().map_err(|e| err(ERR_SPAWN, e.to_string()))?;
        let spawned = reaper.spawn(&mut cmd);
        // The command holds our copies of the PTY slave: close them, or the
        // master never reads EOF.
        drop(cmd);
        let (mut child, status) = spawned.map_err(|e| spawn_error(&program, &e))?;
        let pid = child.id();

        let mut outputs = Vec::new();
        let (input_fd, pty_fd) = match pty {
            Some(p) => {
                drop(p.slave);
                let dup = || p.master.try_clone().map_err(|e| io_err("open a pty", e));
                outputs.push((ProcStream::Pty, dup()?));
                (Some(dup()?), Some(p.master))
            }
            None => {
                outputs.extend(
                    child
                        .stdout
                        .take()
                        .map(|o| (ProcStream::Stdout, file_of(o))),
                );
                outputs.extend(
                    child
                        .stderr
                        .take()
                        .map(|o| (ProcStream::Stderr, file_of(o))),
                );
                (child.stdin.take().map(file_of), None)
            }
        };
        let proc = Arc::new(Proc {
            pid,
            tag: req.tag.clone(),
            cmd: req.cmd.clone(),
            args: req.args.clone(),
            envs: req.envs.clone(),
            cwd: req.cwd.clone(),
            state: Mutex::new(State {
                open_outputs: outputs.len(),
                pty_size: req.pty,
                ..State::default()
            }),
            cond: Condvar::new(),
            input: input_fd.as_ref().map(|_| {
                Arc::new(Input {
                    q: Mutex::new(InputQ::default()),
                    cond: Condvar::new(),
                })
            }),
            pty: pty_fd,
        });
        table.running.insert(pid, Arc::clone(&proc));
        drop(table);

        let started = self.start_threads(&proc, outputs, input_fd, status);
        if let Err(e) = started {
            let _ = sys::kill_group(pid as libc::pid_t, libc::SIGKILL);
            return Err(e);
        }
        Ok(proc)
    }

    fn start_threads(
        self: &Arc<Self>,
        proc: &Arc<Proc>,
        outputs: Vec<(ProcStream, File)>,
        input_fd: Option<File>,
        status: Receiver<WaitStatus>,
    ) -> Result<(), ReqError> {
        let pid = proc.pid;
        for (stream, f) in outputs {
            let p = Arc::clone(proc);
            spawn_thread(format!("proc-{pid}-{stream:?}"), move || {
                p.read_output(stream, f)
            })?;
        }
        if let (Some(input), Some(fd)) = (&proc.input, input_fd) {
            let input = Arc::clone(input);
            spawn_thread(format!("proc-{pid}-in"), move || input.run(fd))?;
        }
        let (p, procs) = (Arc::clone(proc), Arc::clone(self));
        spawn_thread(format!("proc-{pid}-wait"), move || {
            let end = match status.recv() {
                Ok(st) => End::from_status(st),
                Err(_) => End::lost("lost track of the process (reaper gone)".into()),
            };
            // Off the running list before its end is told to any stream,
            // so a host that lists right after `proc_end` no longer sees it.
            p.drain();
            procs.retire(&p);
            p.finish(end);
        })
    }

    /// Move an ended process to the ended list, dropping the oldest.
    fn retire(&self, proc: &Arc<Proc>) {
        let mut t = lock(&self.table);
        if t.running
            .get(&proc.pid)
            .is_some_and(|p| Arc::ptr_eq(p, proc))
        {
            t.running.remove(&proc.pid);
        }
        t.exited.push_back(Arc::clone(proc));
        while t.exited.len() > EXITED_KEPT {
            t.exited.pop_front();
        }
    }

    /// The process named by exactly one of `pid` and `tag`: a running one,
    /// else the newest ended one.
    pub fn find(&self, pid: Option<u32>, tag: Option<&str>) -> Result<Arc<Proc>, ReqError> {
        let t = lock(&self.table);
        let hit = |p: &&Arc<Proc>| match (pid, tag) {
            (Some(pid), None) => p.pid == pid,
            (None, Some(tag)) => p.tag.as_deref() == Some(tag),
            _ => false,
        };
        if pid.is_some() == tag.is_some() {
            return Err(err(
                ERR_INVALID,
                "name the process by exactly one of pid and tag",
            ));
        }
        t.running
            .values()
            .find(hit)
            .or_else(|| t.exited.iter().rev().find(hit))
            .cloned()
            .ok_or_else(|| match (pid, tag) {
                (Some(pid), _) => err(ERR_NOT_FOUND, format!("no process with pid {pid}")),
                (_, tag) => err(
                    ERR_NOT_FOUND,
                    format!("no process with tag {:?}", tag.unwrap_or_default()),
                ),
            })
    }

    /// The running processes, by pid.
    pub fn list(&self) -> Vec<ProcInfo> {
        lock(&self.table)
            .running
            .values()
            .map(|p| p.info())
            .collect()
    }

    /// Wake every stream, so each re-checks whether it is still live.
    pub fn wake_all(&self) {
        let t = lock(&self.table);
        for p in t.running.values().chain(t.exited.iter()) {
            // Taking the lock orders this after a stream's check.
            drop(lock(&p.state));
            p.cond.notify_all();
        }
    }
}

impl Proc {
    pub fn info(&self) -> ProcInfo {
        ProcInfo {
            pid: self.pid,
            tag: self.tag.clone(),
            cmd: self.cmd.clone(),
            args: self.args.clone(),
            envs: self.envs.clone(),
            cwd: self.cwd.clone(),
            pty: lock(&self.state).pty_size,
        }
    }

    fn read_output(&self, stream: ProcStream, mut f: File) {
        let mut buf = vec![0u8; OUTPUT_CHUNK];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    lock(&self.state).ring.push(stream, &buf[..n]);
                    self.cond.notify_all();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EIO: a PTY whose last slave was closed.
                Err(_) => break,
            }
        }
        lock(&self.state).open_outputs -= 1;
        self.cond.notify_all();
    }

    /// Wait up to [`DRAIN_GRACE`] for the outputs to close.
    fn drain(&self) {
        let deadline = Instant::now() + DRAIN_GRACE;
        let mut st = lock(&self.state);
        while st.open_outputs > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .cond
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Record the end and wake the streams following the process.
    fn finish(&self, end: End) {
        lock(&self.state).end = Some(end);
        self.cond.notify_all();
        if let Some(i) = &self.input {
            i.close();
        }
    }

    fn running(&self) -> Result<(), ReqError> {
        match lock(&self.state).end {
            Some(_) => Err(err(
                ERR_NOT_FOUND,
                format!("process {} has ended", self.pid),
            )),
            None => Ok(()),
        }
    }

    fn input(&self) -> Result<&Input, ReqError> {
        self.running()?;
        self.input.as_deref().ok_or_else(|| {
            err(
                ERR_INVALID,
                format!("process {} was started without stdin", self.pid),
            )
        })
    }

    /// Queue bytes for its stdin (or its terminal).
    pub fn write_input(&self, data: Vec<u8>) -> Result<(), ReqError> {
        self.input()?.push(data)
    }

    /// Close stdin once the queued input is written.
    pub fn close_stdin(&self) -> Result<(), ReqError> {
        if self.pty.is_some() {
            return Err(err(
                ERR_INVALID,
                "a PTY has no stdin to close: write Ctrl-D (0x04) to it instead",
            ));
        }
        self.input()?.close();
        Ok(())
    }

    /// Send `sig` to its process group.
    pub fn signal(&self, sig: i32) -> Result<(), ReqError> {
        if !(1..=64).contains(&sig) {
            return Err(err(ERR_INVALID, format!("invalid signal number {sig}")));
        }
        self.running()?;
        let pid = libc::pid_t::try_from(self.pid).unwrap_or(0);
        // The group is the process's own (setsid at start), unless it has
        // moved itself out of it since: then the process alone.
        let r = sys::kill_group(pid, sig).or_else(|e| match e.raw_os_error() {
            // (Its end is not recorded yet, so the pid is still its, or
            // was reaped less than DRAIN_GRACE ago: too soon for reuse.)
            // SAFETY: kill(2) takes no pointers.
            Some(libc::ESRCH) if unsafe { libc::kill(pid, sig) } == 0 => Ok(()),
            _ => Err(e),
        });
        r.map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => err(ERR_NOT_FOUND, format!("process {} has ended", self.pid)),
            _ => err(ERR_IO, format!("cannot signal process {}: {e}", self.pid)),
        })
    }

    /// Resize its PTY.
    pub fn resize(&self, size: PtySize) -> Result<(), ReqError> {
        let Some(master) = &self.pty else {
            return Err(err(ERR_INVALID, format!("process {} has no PTY", self.pid)));
        };
        self.running()?;
        pty::set_size(master, size)
            .map_err(|e| err(ERR_IO, format!("cannot resize the PTY: {e}")))?;
        lock(&self.state).pty_size = Some(size);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_wording_follows_go() {
        let e = End::from_status(3 << 8);
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (3, true, "exit status 3")
        );
        let e = End::from_status(libc::SIGTERM);
        assert_eq!(
            (e.exit_code, e.exited, e.signal, e.status.as_str()),
            (-1, false, Some(15), "signal: terminated")
        );
        assert_eq!(End::from_status(libc::SIGKILL).status, "signal: killed");
        assert_eq!(End::from_status(40).status, "signal: signal 40");
    }

    #[test]
    fn input_queue_is_bounded_and_closable() {
        let i = Input {
            q: Mutex::new(InputQ::default()),
            cond: Condvar::new(),
        };
        i.push(vec![0; INPUT_QUEUE]).unwrap();
        assert_eq!(i.push(vec![1]).unwrap_err().code, ERR_TOO_LARGE);
        i.close();
        assert_eq!(i.push(vec![]).unwrap_err().code, ERR_INVALID);
    }
}
