//! The one place that waits for child processes.
//!
//! As pid 1 the agent inherits every orphan in the VM and must reap them, or
//! they pile up as zombies. But `waitpid(-1)` reaps *any* child, so it would
//! steal the exit status of a process an exec request is waiting for. Hence a
//! single reaper thread owns all waiting:
//!
//! * [`Reaper::spawn`] starts a child and registers `pid -> Sender<status>`
//!   while holding the registry lock;
//! * the reaper thread blocks in `waitid(P_ALL, WEXITED | WNOWAIT)`, which
//!   reports that *some* child is a zombie without reaping it, then takes the
//!   same lock and reaps every zombie with `waitpid(-1, WNOHANG)`, sending
//!   each status to its registered waiter (unregistered pids are orphans:
//!   their status is dropped).
//!
//! Reaping only under the lock closes two races at once: a child that exits
//! before it is registered cannot be reaped until `spawn` has registered it,
//! and the `waitpid` that std (and glibc's `posix_spawn`) does internally
//! when `exec` fails cannot have its child stolen from under it.
//!
//! When there are no children at all `waitid` fails with ECHILD; the thread
//! then sleeps on a condition variable until the next spawn. Orphans cannot
//! appear in between: an orphan is re-parented to us when its parent (our
//! descendant) exits, i.e. before that parent could be reaped. No signal
//! handling or signal masks are involved, so children start with a clean
//! signal state.
//!
//! Never call `std::process::Child::wait` on children started here.

use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::Duration;

/// A raw wait status as returned by `waitpid` (decode with `libc::WIF*`).
pub type WaitStatus = libc::c_int;

#[derive(Default)]
struct Registry {
    waiters: HashMap<libc::pid_t, Sender<WaitStatus>>,
    /// Bumped on every spawn; lets the reaper thread sleep through ECHILD
    /// without missing a spawn that happens while it decides to sleep.
    generation: u64,
}

pub struct Reaper {
    registry: Mutex<Registry>,
    spawned: Condvar,
}

fn lock(m: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // A panic while holding the lock cannot leave the map inconsistent in a
    // way that matters (worst case one status is lost), so keep going.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The process-wide reaper, started on first use.
pub fn global() -> io::Result<&'static Reaper> {
    static REAPER: OnceLock<Reaper> = OnceLock::new();
    static THREAD: OnceLock<Result<(), String>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| Reaper {
        registry: Mutex::new(Registry::default()),
        spawned: Condvar::new(),
    });
    let started = THREAD.get_or_init(|| {
        thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reaper.run())
            .map(drop)
            .map_err(|e| e.to_string())
    });
    match started {
        Ok(()) => Ok(reaper),
        Err(e) => Err(io::Error::other(format!(
            "cannot start the reaper thread: {e}"
        ))),
    }
}

impl Reaper {
    /// Spawn `cmd` and return the child (for its pipes) and a receiver that
    /// gets the raw wait status exactly once.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, Receiver<WaitStatus>)> {
        let mut reg = lock(&self.registry);
        let child = cmd.spawn()?;
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| io::Error::other("child pid out of range"))?;
        let (tx, rx) = channel();
        reg.waiters.insert(pid, tx);
        reg.generation = reg.generation.wrapping_add(1);
        drop(reg);
        self.spawned.notify_all();
        Ok((child, rx))
    }

    fn run(&self) {
        loop {
            let seen = lock(&self.registry).generation;
            // SAFETY: siginfo_t is a plain C struct; all-zero is a valid value.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `info` is a valid, writable siginfo_t for the call.
            // WNOWAIT leaves the zombie in place; it is reaped under the lock.
            let r = unsafe {
                libc::waitid(
                    libc::P_ALL,
                    0,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT | libc::__WALL,
                )
            };
            if r == 0 {
                self.reap_all();
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::ECHILD) => {
                    let mut reg = lock(&self.registry);
                    while reg.generation == seen {
                        reg = self
                            .spawned
                            .wait(reg)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                }
                _ => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn reap_all(&self) {
        let mut reg = lock(&self.registry);
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: `status` is a valid, writable int for the call.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid > 0 {
                if let Some(tx) = reg.waiters.remove(&pid) {
                    // The waiter may have given up (dropped its receiver).
                    let _ = tx.send(status);
                }
                continue;
            }
            if pid == -1 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
    }
}

/// Exit code and signal from a raw wait status; exactly one is `Some` for a
/// terminated process.
pub fn decode_status(status: WaitStatus) -> (Option<i32>, Option<i32>) {
    if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    fn run(cmd: &mut Command) -> WaitStatus {
        let (_child, rx) = global().unwrap().spawn(cmd.stdin(Stdio::null())).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn statuses_reach_their_waiters() {
        let st = run(Command::new("sh").args(["-c", "exit 7"]));
        assert_eq!(decode_status(st), (Some(7), None));
        let st = run(Command::new("sh").args(["-c", "kill -9 $$"]));
        assert_eq!(decode_status(st), (None, Some(9)));
    }

    #[test]
    fn many_concurrent_children_each_get_their_own_status() {
        let handles: Vec<_> = (0..40)
            .map(|i| {
                thread::spawn(move || {
                    let st = run(Command::new("sh").args(["-c", &format!("exit {i}")]));
                    assert_eq!(decode_status(st), (Some(i), None));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn orphans_are_reaped() {
        // Stand in for pid 1: orphans of our descendants are re-parented to
        // a child subreaper just as they would be to init.
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(r, 0);
        let (child, rx) = global()
            .unwrap()
            .spawn(
                Command::new("sh")
                    .args(["-c", "sleep 0.2 </dev/null >/dev/null 2>&1 & echo $!"])
                    .stdout(Stdio::piped()),
            )
            .unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.unwrap(), &mut out).unwrap();
        let orphan: libc::pid_t = out.trim().parse().unwrap();
        assert_eq!(
            decode_status(rx.recv_timeout(Duration::from_secs(10)).unwrap()),
            (Some(0), None)
        );
        // A zombie still "exists" for kill(pid, 0); a reaped process does not.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            // SAFETY: kill with signal 0 only checks for existence.
            let gone = unsafe { libc::kill(orphan, 0) } == -1;
            if gone {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "orphan {orphan} was never reaped"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn failed_exec_is_an_error_not_a_panic() {
        // std waits for the failed child itself; the reaper must not steal it.
        for _ in 0..20 {
            let e = global()
                .unwrap()
                .spawn(&mut Command::new("/nonexistent/forkvm-test-binary"))
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
        }
    }
}
