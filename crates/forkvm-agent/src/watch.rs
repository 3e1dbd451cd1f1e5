//! Directory watches with inotify: `fs_watch` (a stream) and the polled
//! watchers (`watcher_create`, `watcher_poll`, `watcher_remove`).
//!
//! One inotify instance per watch, with a watch on the directory and, when
//! recursive, on every subdirectory (symlinks are not followed). Event
//! names are relative to the watched directory. inotify events map onto
//! envd's types:
//!
//! | inotify                 | event    |
//! |-------------------------|----------|
//! | IN_CREATE, IN_MOVED_TO  | `create` |
//! | IN_MODIFY               | `write`  |
//! | IN_DELETE               | `remove` |
//! | IN_MOVED_FROM           | `rename` |
//! | IN_ATTRIB               | `chmod`  |
//!
//! A directory created inside a recursive watch is watched from when its
//! creation is read (for a polled watcher, at the next poll); what appeared
//! in it before then is reported as `create` events, and a file that already
//! holds data as a `write` too, since the writes that put it there happened
//! before the directory was watched. So nothing is missed in that window (a
//! write seen both ways is reported twice, as inotify may do anyway). The kernel's
//! queue bounds what waits between two reads (a polled watcher reads only
//! when polled); an overflow is reported as `dropped`. A polled watcher
//! thus needs no thread of its own.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use forkvm_agent_protocol::caps::{MAX_WATCHERS, WATCH_QUEUE};
use forkvm_agent_protocol::{FsEvent, FsOp, GuestMsg, ERR_INVALID, ERR_NOT_FOUND, ERR_TOO_LARGE};

use crate::files::{absolute, io_err};
use crate::serve::{Agent, ReqError};
use crate::streams::StreamHandle;
use crate::sys;

const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;
/// How often a streamed watch checks that it is still wanted.
const POLL_MS: libc::c_int = 250;

fn err(code: &'static str, message: impl Into<String>) -> ReqError {
    ReqError {
        code,
        message: message.into(),
    }
}

/// One inotify instance watching a directory (tree).
pub struct Inotify {
    fd: File,
    recursive: bool,
    root: PathBuf,
    /// Watch descriptor -> directory, relative to the root.
    dirs: HashMap<i32, PathBuf>,
    root_wd: i32,
    /// The watched directory is gone.
    pub gone: bool,
}

impl Inotify {
    pub fn new(path: &str, recursive: bool) -> Result<Inotify, ReqError> {
        let root = absolute(path)?.to_path_buf();
        let meta = fs::metadata(&root).map_err(|e| io_err("watch", &root, &e))?;
        if !meta.is_dir() {
            return Err(err(ERR_INVALID, format!("{path} is not a directory")));
        }
        // SAFETY: inotify_init1 takes flags only; the fd it returns is ours.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd == -1 {
            let e = io::Error::last_os_error();
            return Err(err(ERR_TOO_LARGE, format!("cannot create a watch: {e}")));
        }
        let mut w = Inotify {
            // SAFETY: fd is a fresh descriptor owned by nobody else.
            fd: unsafe { File::from_raw_fd(fd) },
            recursive,
            root: root.clone(),
            dirs: HashMap::new(),
            root_wd: -1,
            gone: false,
        };
        w.root_wd = w
            .add(PathBuf::new())
            .map_err(|e| io_err("watch", &root, &e))?;
        if recursive {
            w.add_tree(Path::new(""), &mut Vec::new());
        }
        Ok(w)
    }

    fn add(&mut self, rel: PathBuf) -> io::Result<i32> {
        let path = self.root.join(&rel);
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd == -1 {
            return Err(io::Error::last_os_error());
        }
        self.dirs.insert(wd, rel);
        Ok(wd)
    }

    /// Watch every directory under `rel`, pushing a `create` event to
    /// `found` for each entry (used for directories that appeared since).
    fn add_tree(&mut self, rel: &Path, found: &mut Vec<FsEvent>) {
        let Ok(rd) = fs::read_dir(self.root.join(rel)) else {
            return;
        };
        for e in rd.flatten() {
            let child = rel.join(e.file_name());
            let name = child.to_string_lossy().into_owned();
            found.push(FsEvent {
                name: name.clone(),
                op: FsOp::Create,
            });
            let kind = e.file_type();
            if kind.as_ref().is_ok_and(|t| t.is_file()) && e.metadata().is_ok_and(|m| m.len() > 0) {
                found.push(FsEvent {
                    name,
                    op: FsOp::Write,
                });
            }
            if kind.is_ok_and(|t| t.is_dir()) && self.add(child.clone()).is_ok() {
                self.add_tree(&child, found);
            }
        }
    }

    /// Wait up to `timeout_ms` for events and return those read, and how
    /// many were dropped by the kernel.
    pub fn read(&mut self, timeout_ms: libc::c_int) -> io::Result<(Vec<FsEvent>, u64)> {
        let mut events = Vec::new();
        let mut dropped = 0;
        if !sys::poll_readable(self.fd.as_raw_fd(), timeout_ms)? {
            return Ok((events, dropped));
        }
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match self.fd.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            dropped += self.parse(&buf[..n], &mut events);
        }
        Ok((events, dropped))
    }

    fn parse(&mut self, mut b: &[u8], events: &mut Vec<FsEvent>) -> u64 {
        const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
        let mut dropped = 0;
        while b.len() >= HEAD {
            let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            let (wd, mask, len) = (word(0) as i32, word(4), word(12) as usize);
            let raw = &b[HEAD..(HEAD + len).min(b.len())];
            let name = &raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())];
            b = &b[(HEAD + len).min(b.len())..];
            if mask & libc::IN_Q_OVERFLOW != 0 {
                dropped += 1;
                continue;
            }
            if mask & libc::IN_IGNORED != 0 {
                self.dirs.remove(&wd);
            }
            if wd == self.root_wd
                && mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0
            {
                self.gone = true;
            }
            let (Some(dir), false) = (self.dirs.get(&wd), name.is_empty()) else {
                continue;
            };
            let rel = dir.join(std::ffi::OsStr::from_bytes(name));
            let op = if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
                FsOp::Create
            } else if mask & libc::IN_MODIFY != 0 {
                FsOp::Write
            } else if mask & libc::IN_DELETE != 0 {
                FsOp::Remove
            } else if mask & libc::IN_MOVED_FROM != 0 {
                FsOp::Rename
            } else if mask & libc::IN_ATTRIB != 0 {
                FsOp::Chmod
            } else {
                continue;
            };
            events.push(FsEvent {
                name: rel.to_string_lossy().into_owned(),
                op,
            });
            if op == FsOp::Create
                && mask & libc::IN_ISDIR != 0
                && self.recursive
                && self.add(rel.clone()).is_ok()
            {
                self.add_tree(&rel, events);
            }
        }
        dropped
    }
}

/// The `fs_watch` stream of request `id`.
pub fn stream(agent: &Agent, id: u64, path: &str, recursive: bool, handle: &StreamHandle) {
    let mut w = match Inotify::new(path, recursive) {
        Ok(w) => w,
        Err(e) => return agent.reply(&e.into_msg(id), &[]),
    };
    agent.reply(&GuestMsg::WatchStarted { id }, &[]);
    let mut last_sent = Instant::now();
    while handle.live() {
        let (events, dropped) = match w.read(POLL_MS) {
            Ok(r) => r,
            Err(e) => {
                let e = err(forkvm_agent_protocol::ERR_IO, format!("watch failed: {e}"));
                return agent.reply(&e.into_msg(id), &[]);
            }
        };
        if !events.is_empty() || dropped > 0 {
            agent.reply(
                &GuestMsg::FsEvents {
                    id,
                    events,
                    dropped,
                },
                &[],
            );
            last_sent = Instant::now();
        } else if last_sent.elapsed() >= agent.keepalive {
            agent.reply(&GuestMsg::Keepalive { id }, &[]);
            last_sent = Instant::now();
        }
        if w.gone {
            let e = err(
                ERR_NOT_FOUND,
                format!("the watched directory {path} is gone"),
            );
            return agent.reply(&e.into_msg(id), &[]);
        }
    }
}

/// The polled watchers.
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Arc<Mutex<Inotify>>>>,
    next: AtomicU64,
}

impl Watchers {
    pub fn create(&self, path: &str, recursive: bool) -> Result<String, ReqError> {
        let w = Inotify::new(path, recursive)?;
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_WATCHERS {
            return Err(err(
                ERR_TOO_LARGE,
                format!("{MAX_WATCHERS} watchers exist already: remove one first"),
            ));
        }
        let id = format!("w{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        map.insert(id.clone(), Arc::new(Mutex::new(w)));
        Ok(id)
    }

    fn get(&self, id: &str) -> Result<Arc<Mutex<Inotify>>, ReqError> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(id)
            .cloned()
            .ok_or_else(|| err(ERR_NOT_FOUND, format!("no watcher {id:?}")))
    }

    /// The events since the last poll (at most [`WATCH_QUEUE`]; the rest
    /// are counted as dropped), and how many were dropped.
    pub fn poll(&self, id: &str) -> Result<(Vec<FsEvent>, u64), ReqError> {
        let w = self.get(id)?;
        let mut w = w.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut events, mut dropped) = w
            .read(0)
            .map_err(|e| err(forkvm_agent_protocol::ERR_IO, format!("watch failed: {e}")))?;
        if events.len() > WATCH_QUEUE {
            dropped += (events.len() - WATCH_QUEUE) as u64;
            events.drain(..events.len() - WATCH_QUEUE);
        }
        if w.gone && events.is_empty() {
            drop(w);
            self.remove(id)?;
            return Err(err(ERR_NOT_FOUND, "the watched directory is gone"));
        }
        Ok((events, dropped))
    }

    pub fn remove(&self, id: &str) -> Result<(), ReqError> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(id)
            .map(drop)
            .ok_or_else(|| err(ERR_NOT_FOUND, format!("no watcher {id:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;

    fn all(w: &mut Inotify) -> Vec<(String, FsOp)> {
        let (events, dropped) = w.read(1000).unwrap();
        assert_eq!(dropped, 0);
        events.into_iter().map(|e| (e.name, e.op)).collect()
    }

    #[test]
    fn maps_inotify_events_and_follows_new_directories() {
        let d = temp_dir("watch-map");
        let mut w = Inotify::new(d.to_str().unwrap(), true).unwrap();
        fs::write(d.join("a"), b"1").unwrap();
        fs::rename(d.join("a"), d.join("b")).unwrap();
        let ev = all(&mut w);
        assert!(ev.contains(&("a".into(), FsOp::Create)), "{ev:?}");
        assert!(ev.contains(&("a".into(), FsOp::Write)), "{ev:?}");
        assert!(ev.contains(&("a".into(), FsOp::Rename)), "{ev:?}");
        assert!(ev.contains(&("b".into(), FsOp::Create)), "{ev:?}");
        fs::create_dir_all(d.join("sub/deeper")).unwrap();
        let ev = all(&mut w);
        assert!(ev.contains(&("sub".into(), FsOp::Create)), "{ev:?}");
        assert!(ev.contains(&("sub/deeper".into(), FsOp::Create)), "{ev:?}");
        fs::write(d.join("sub/deeper/x"), b"").unwrap();
        let ev = all(&mut w);
        assert!(
            ev.contains(&("sub/deeper/x".into(), FsOp::Create)),
            "{ev:?}"
        );
        fs::remove_dir_all(&d).unwrap();
        let _ = w.read(1000).unwrap();
        assert!(w.gone);
    }

    #[test]
    fn a_file_written_in_a_new_directory_before_it_is_watched_is_a_write() {
        // The polled watcher's case: nothing is read between the mkdir and
        // the write, so the directory is watched only after the file has
        // its data.
        let d = temp_dir("watch-late-dir");
        let mut w = Inotify::new(d.to_str().unwrap(), true).unwrap();
        for i in 0..20 {
            let sub = d.join(format!("new{i}"));
            fs::create_dir(&sub).unwrap();
            fs::write(sub.join("f.txt"), b"data").unwrap();
            fs::write(sub.join("empty"), b"").unwrap();
            let ev = all(&mut w);
            let f = format!("new{i}/f.txt");
            assert!(ev.contains(&(f.clone(), FsOp::Create)), "{ev:?}");
            assert!(ev.contains(&(f, FsOp::Write)), "{ev:?}");
            let e = format!("new{i}/empty");
            assert!(ev.contains(&(e.clone(), FsOp::Create)), "{ev:?}");
            assert!(!ev.contains(&(e, FsOp::Write)), "{ev:?}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn not_a_directory() {
        assert_eq!(
            Inotify::new("/dev/null", false).err().unwrap().code,
            ERR_INVALID
        );
        assert_eq!(
            Inotify::new("/forkvm/none", false).err().unwrap().code,
            ERR_NOT_FOUND
        );
    }
}
