//! The guest-side FUSE relay: `/dev/fuse` ⇄ the volume port.
//!
//! Threads (the agent is a static binary with no async runtime):
//!
//! ```text
//!  /dev/fuse (vol 0) --reader thread--+                 +--> /dev/fuse (vol i)
//!  /dev/fuse (vol 1) --reader thread--+--> port (mutex) |
//!                                     |                 |
//!                         port reader thread: REPLY ----+
//!                                             QUIESCE / RESUME -> state
//! ```
//!
//! State (all in guest memory, so a snapshot copies it and a fork child
//! simply continues with it):
//!
//! * `outstanding`: requests forwarded and not yet answered, keyed by
//!   (volume, FUSE `unique`), kept with their bytes and in send order so that
//!   RESUME(resend=1) can re-send them to a new server.
//! * `held`: requests read while forwarding is off (not yet resumed, quiesced,
//!   or no host connected), forwarded in order on RESUME.
//!
//! FORGET, BATCH_FORGET and INTERRUPT get no reply from FUSE, so they are
//! forwarded but never tracked (tracking them would block QUIESCED forever).
//!
//! The state lock is held while a request is written to the port. That makes
//! "is it outstanding?" and "was it sent?" one fact, so a RESUME(resend=1)
//! racing with a reader thread can never send a request twice.
//!
//! Host disconnect: a virtio-serial port reads 0 (and polls POLLHUP) while the
//! host side is closed. The relay then stops forwarding, polls every 20 ms
//! until the host is back (or [`Relay::reconnect`] gives it a new port), and
//! forwards again only after the new server's RESUME.
//!
//! Known edge: a virtio-serial write blocks while the host is away, so a
//! request being written at the moment the host disconnects reaches the
//! next server and is then re-sent by RESUME(resend=1); the host server
//! drops the second copy by its `unique`. A frame larger than one port
//! write (32 KiB) cut by a disconnect would leave its tail for the next
//! server, which then fails to decode it and closes; the daemon reconnects.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use super::{read_frame, write_frame, FrameKind};

/// FUSE opcodes that never get a reply.
const FUSE_FORGET: u32 = 2;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_BATCH_FORGET: u32 = 42;

/// A `/dev/fuse` read buffer must hold the largest write (max_write 1 MiB)
/// plus its headers, or the kernel refuses the read with EINVAL.
const FUSE_READ_BUF: usize = 1024 * 1024 + 4096;

/// How often a disconnected relay looks for its host again.
const RECONNECT_POLL: Duration = Duration::from_millis(20);

/// Mounts a FUSE filesystem at `target` (created if missing) and returns the
/// `/dev/fuse` file that carries its requests.
pub fn mount_fuse(target: &Path, read_only: bool) -> io::Result<File> {
    std::fs::create_dir_all(target)?;
    let fuse = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?;
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fuse.as_raw_fd()
    );
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    let cstr = |b: &[u8]| {
        std::ffi::CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    };
    let src = cstr(b"forkvm")?;
    let fstype = cstr(b"fuse.forkvm")?;
    let tgt = cstr(target.as_os_str().as_bytes())?;
    let data = cstr(data.as_bytes())?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fuse)
}

struct Outstanding {
    volume: u8,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// The current port; replaced by [`Relay::reconnect`].
    port: Option<Arc<File>>,
    /// Bumped on every reconnect so the port reader notices.
    generation: u64,
    /// A RESUME arrived since the last connect and no QUIESCE since.
    resumed: bool,
    quiesced: bool,
    /// QUIESCED still owed to the host.
    quiesce_pending: bool,
    held: VecDeque<(u8, Vec<u8>)>,
    next_seq: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    seq_of: HashMap<(u8, u64), u64>,
    fuse: HashMap<u8, Arc<File>>,
    stopped: bool,
}

impl State {
    fn forwarding(&self) -> bool {
        self.resumed && !self.quiesced && self.port.is_some()
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking thread must not take the whole relay with it: the
        // state stays consistent between statements that mutate it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The relay between the guest's FUSE mounts and the volume port.
pub struct Relay {
    shared: Arc<Shared>,
}

/// Parses (len, opcode, unique) from a fuse_in_header.
fn fuse_in_header(buf: &[u8]) -> Option<(u32, u32, u64)> {
    if buf.len() < 40 {
        return None;
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().ok()?);
    let opcode = u32::from_le_bytes(buf[4..8].try_into().ok()?);
    let unique = u64::from_le_bytes(buf[8..16].try_into().ok()?);
    Some((len, opcode, unique))
}

/// Writes one frame to the current port; errors mean the host is gone and
/// are left to the port reader to notice (it sees EOF).
fn send(st: &State, kind: FrameKind, volume: u8, payload: &[u8]) -> bool {
    match &st.port {
        Some(port) => write_frame(&mut &**port, kind, volume, payload).is_ok(),
        None => false,
    }
}

/// Forwards one request (state lock held): tracked unless it gets no reply.
fn forward(st: &mut State, volume: u8, bytes: Vec<u8>) {
    let Some((_, opcode, unique)) = fuse_in_header(&bytes) else {
        return;
    };
    send(st, FrameKind::Request, volume, &bytes);
    if !matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT) {
        let seq = st.next_seq;
        st.next_seq += 1;
        if let Some(old) = st.seq_of.insert((volume, unique), seq) {
            st.outstanding.remove(&old);
        }
        st.outstanding.insert(seq, Outstanding { volume, bytes });
    }
}

fn maybe_quiesced(st: &mut State) {
    if st.quiesce_pending && st.outstanding.is_empty() && send(st, FrameKind::Quiesced, 0, &[]) {
        st.quiesce_pending = false;
    }
}

impl Relay {
    /// Starts the relay on `port` (the guest's `/dev/vportNpM`, read-write).
    /// Nothing is forwarded until the host's first RESUME.
    pub fn start(port: File) -> io::Result<Relay> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                port: Some(Arc::new(port)),
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let s = shared.clone();
        thread::Builder::new()
            .name("vol-port".into())
            .spawn(move || port_reader(s))?;
        Ok(Relay { shared })
    }

    /// Adds a mount: its `/dev/fuse` file (from [`mount_fuse`]) and the
    /// volume index the host knows it by.
    pub fn add_mount(&self, index: u8, fuse: File) -> io::Result<()> {
        let fuse = Arc::new(fuse);
        self.shared.lock().fuse.insert(index, fuse.clone());
        let s = self.shared.clone();
        thread::Builder::new()
            .name(format!("vol-fuse-{index}"))
            .spawn(move || fuse_reader(s, index, fuse))?;
        Ok(())
    }

    /// Replaces the port with a new one, for hosts where the old port file
    /// cannot come back (tests over a socketpair). Forwarding waits for the
    /// new server's RESUME.
    pub fn reconnect(&self, port: File) {
        let mut st = self.shared.lock();
        st.port = Some(Arc::new(port));
        st.generation += 1;
        st.resumed = false;
        self.shared.changed.notify_all();
    }

    /// Number of requests forwarded and not answered yet.
    pub fn outstanding(&self) -> usize {
        self.shared.lock().outstanding.len()
    }

    /// Number of requests held back (quiesced or disconnected).
    pub fn held(&self) -> usize {
        self.shared.lock().held.len()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Threads blocked in read(2) end when their fd reports EOF/ENODEV;
        // this only stops the reconnect poll.
        self.shared.lock().stopped = true;
    }
}

fn fuse_reader(shared: Arc<Shared>, volume: u8, fuse: Arc<File>) {
    let mut buf = vec![0u8; FUSE_READ_BUF];
    loop {
        let n = match (&*fuse).read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // Interrupted, or a request interrupted before we read it.
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                // Unmounted: this mount is done.
                _ => break,
            },
        };
        if n == 0 {
            break;
        }
        let bytes = buf[..n].to_vec();
        let mut st = shared.lock();
        if st.forwarding() {
            forward(&mut st, volume, bytes);
        } else {
            st.held.push_back((volume, bytes));
        }
    }
    shared.lock().fuse.remove(&volume);
}

/// Writes one reply to `/dev/fuse`. ENOENT means the request was interrupted
/// and the kernel has forgotten it: nothing to do.
fn write_reply(fuse: &File, reply: &[u8]) {
    let _ = (&*fuse).write(reply);
}

fn handle_resume(shared: &Shared, resend: bool) {
    let mut st = shared.lock();
    st.resumed = true;
    st.quiesced = false;
    st.quiesce_pending = false;
    if resend {
        // In first-sent order: the BTreeMap is keyed by send sequence.
        let again: Vec<(u8, Vec<u8>)> = st
            .outstanding
            .values()
            .map(|o| (o.volume, o.bytes.clone()))
            .collect();
        for (v, b) in again {
            send(&st, FrameKind::Request, v, &b);
        }
    }
    while let Some((v, b)) = st.held.pop_front() {
        forward(&mut st, v, b);
    }
}

fn handle_reply(shared: &Shared, volume: u8, reply: &[u8]) {
    if reply.len() < 16 {
        return;
    }
    let unique = u64::from_le_bytes(reply[8..16].try_into().unwrap_or_default());
    let fuse = {
        let mut st = shared.lock();
        let Some(seq) = st.seq_of.remove(&(volume, unique)) else {
            // Not outstanding: a duplicate answer after a resend.
            return;
        };
        st.outstanding.remove(&seq);
        let f = st.fuse.get(&volume).cloned();
        maybe_quiesced(&mut st);
        f
    };
    if let Some(f) = fuse {
        write_reply(&f, reply);
    }
}

/// Waits until the port polls readable without HUP (host connected) or a new
/// port is given. Returns false when the relay is dropped.
fn wait_for_host(shared: &Shared, generation: u64) -> bool {
    loop {
        let port = {
            let st = shared.lock();
            if st.stopped {
                return false;
            }
            if st.generation != generation {
                return true;
            }
            st.port.clone()
        };
        if let Some(port) = port {
            let mut pfd = libc::pollfd {
                fd: port.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout.
            let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
            if rc == 1 && pfd.revents & libc::POLLHUP == 0 && pfd.revents & libc::POLLIN != 0 {
                return true;
            }
        }
        let st = shared.lock();
        let _ = shared.changed.wait_timeout(st, RECONNECT_POLL);
    }
}

fn port_reader(shared: Arc<Shared>) {
    loop {
        let (port, generation) = {
            let st = shared.lock();
            if st.stopped {
                return;
            }
            (st.port.clone(), st.generation)
        };
        let Some(port) = port else { return };
        let mut reader = &*port;
        // EOF, a broken frame or an I/O error ends the loop: the host is
        // gone (or the stream is desynchronised); any partial frame is
        // dropped and the relay waits for a new connection and its RESUME.
        while let Ok(Some(f)) = read_frame(&mut reader) {
            match f.kind {
                FrameKind::Reply => handle_reply(&shared, f.volume, &f.payload),
                FrameKind::Resume => handle_resume(&shared, f.resend()),
                FrameKind::Quiesce => {
                    let mut st = shared.lock();
                    st.quiesced = true;
                    st.quiesce_pending = true;
                    maybe_quiesced(&mut st);
                }
                // Guest→host kinds coming back are a confused host.
                FrameKind::Request | FrameKind::Quiesced => {}
            }
        }
        {
            let mut st = shared.lock();
            if st.generation == generation {
                st.resumed = false;
            }
        }
        if !wait_for_host(&shared, generation) {
            return;
        }
    }
}
