//! The server threads of one volume port: a reader, a worker pool and a
//! shared writer.
//!
//! ```text
//!  port ──reader──► queue ──► worker × 16 ──► (write mutex) ──► port
//!            └─ QUIESCED ──► quiesce() waiter
//! ```
//!
//! Requests are handled concurrently and each reply is written as soon as
//! it is ready (FUSE matches replies by `unique`, so order does not matter):
//! a slow fsync does not hold up the reads behind it.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::volume::{read_frame, write_frame, FrameKind};

use crate::fs::Volume;
use crate::{ops, VolumeConfig, VolumeError};

const WORKERS: usize = 16;

/// How many recent (volume, unique) pairs the reader remembers to drop
/// duplicate requests. A request can reach one server twice: the relay may
/// have been writing it when the previous host went away (a virtio-serial
/// write waits for the host to come back) and then re-sends it on our
/// RESUME(resend=1). The kernel never reuses a unique, and duplicates only
/// come in the burst after connecting (at most the requests outstanding at
/// that time), so a bounded window suffices.
const DEDUP_WINDOW: usize = 65536;

/// The request queue shared by the workers: (volume index, raw request).
type Queue = Arc<Mutex<Receiver<(u8, Vec<u8>)>>>;

#[derive(Default)]
struct Flags {
    quiesced: bool,
    closed: bool,
}

struct Shared {
    writer: Mutex<UnixStream>,
    flags: Mutex<Flags>,
    cond: Condvar,
    vols: HashMap<u8, Arc<Volume>>,
    log_id: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn send(&self, kind: FrameKind, volume: u8, payload: &[u8]) -> io::Result<()> {
        write_frame(&mut *lock(&self.writer), kind, volume, payload)
    }
}

/// A running server; see the crate docs.
pub struct ServerHandle {
    shared: Arc<Shared>,
    stream: UnixStream,
    threads: Vec<JoinHandle<()>>,
}

/// Starts serving `volumes` on `stream` (the volume port's host end).
/// Sends RESUME(resend=1) first: this instance knows nothing of requests a
/// predecessor was sent, so the relay must send its unanswered ones again.
pub fn serve(
    stream: UnixStream,
    volumes: Vec<VolumeConfig>,
    log_id: String,
) -> io::Result<ServerHandle> {
    let mut vols = HashMap::new();
    for cfg in volumes {
        let index = cfg.index;
        let v = Volume::open(cfg, log_id.clone()).map_err(io::Error::other)?;
        if let Some(p) = v.init_params() {
            // A restored guest will not send INIT; these stay in force.
            tracing::debug!(sandbox = %log_id, index, ?p, "volume: restored FUSE parameters");
        }
        vols.insert(index, Arc::new(v));
    }
    let shared = Arc::new(Shared {
        writer: Mutex::new(stream.try_clone()?),
        flags: Mutex::new(Flags::default()),
        cond: Condvar::new(),
        vols,
        log_id,
    });
    shared.send(FrameKind::Resume, 0, &[1])?;
    let (tx, rx) = channel::<(u8, Vec<u8>)>();
    let rx = Arc::new(Mutex::new(rx));
    let mut threads = Vec::new();
    for i in 0..WORKERS {
        let (s, rx) = (shared.clone(), rx.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("vol-worker-{i}"))
                .spawn(move || worker(s, rx))?,
        );
    }
    let s = shared.clone();
    let mut reader = stream.try_clone()?;
    threads.push(
        std::thread::Builder::new()
            .name("vol-reader".into())
            .spawn(move || {
                let mut seen = std::collections::HashSet::new();
                let mut order = std::collections::VecDeque::new();
                loop {
                    match read_frame(&mut reader) {
                        Ok(Some(f)) => match f.kind {
                            FrameKind::Request => {
                                if let Some((h, _)) = crate::abi::InHeader::parse(&f.payload) {
                                    let key = (f.volume, h.unique);
                                    if !seen.insert(key) {
                                        continue;
                                    }
                                    order.push_back(key);
                                    if order.len() > DEDUP_WINDOW {
                                        if let Some(old) = order.pop_front() {
                                            seen.remove(&old);
                                        }
                                    }
                                }
                                if tx.send((f.volume, f.payload)).is_err() {
                                    break;
                                }
                            }
                            FrameKind::Quiesced => {
                                lock(&s.flags).quiesced = true;
                                s.cond.notify_all();
                            }
                            k => tracing::warn!(sandbox = %s.log_id, ?k, "volume: unexpected frame from the guest"),
                        },
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(sandbox = %s.log_id, error = %e, "volume: bad frame from the guest, closing");
                            break;
                        }
                    }
                }
                lock(&s.flags).closed = true;
                s.cond.notify_all();
                // Dropping `tx` ends the workers once the queue is drained.
            })?,
    );
    Ok(ServerHandle {
        shared,
        stream,
        threads,
    })
}

fn worker(s: Arc<Shared>, rx: Queue) {
    loop {
        let msg = lock(&rx).recv();
        let Ok((index, req)) = msg else { return };
        let reply = match s.vols.get(&index) {
            Some(v) => ops::handle(v, &req),
            None => {
                tracing::warn!(sandbox = %s.log_id, index, "volume: request for an unknown volume");
                crate::abi::InHeader::parse(&req)
                    .map(|(h, _)| crate::abi::reply_err(h.unique, libc::ENODEV))
            }
        };
        if let Some(r) = reply {
            if s.send(FrameKind::Reply, index, &r).is_err() {
                return;
            }
        }
    }
}

impl ServerHandle {
    /// Sends QUIESCE and waits for QUIESCED: afterwards no request is being
    /// served, and new ones wait in the guest's relay.
    pub fn quiesce(&self, timeout: Duration) -> Result<(), VolumeError> {
        lock(&self.shared.flags).quiesced = false;
        self.shared
            .send(FrameKind::Quiesce, 0, &[])
            .map_err(|e| VolumeError::Io {
                what: "sending QUIESCE".into(),
                source: e,
            })?;
        let deadline = Instant::now() + timeout;
        let mut f = lock(&self.shared.flags);
        while !f.quiesced {
            if f.closed {
                return Err(VolumeError::Closed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(VolumeError::QuiesceTimeout(timeout));
            }
            f = self
                .shared
                .cond
                .wait_timeout(f, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Sends RESUME(resend=0): the relay forwards what it held.
    pub fn resume(&self) {
        lock(&self.shared.flags).quiesced = false;
        let _ = self.shared.send(FrameKind::Resume, 0, &[0]);
    }

    /// Writes a compacted journal per volume as `dir/<index>.journal`,
    /// atomically. Only meaningful while quiesced (no table change races).
    pub fn save_journals(&self, dir: &Path) -> Result<(), VolumeError> {
        for (index, v) in &self.shared.vols {
            crate::journal::write_all(&dir.join(format!("{index}.journal")), &v.snapshot())?;
        }
        Ok(())
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.shared.flags).closed
    }

    /// Stops the threads and closes the stream (the relay sees EOF).
    pub fn shutdown(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn getattr_root(unique: u64) -> Vec<u8> {
        let mut r = vec![0u8; 56];
        r[0..4].copy_from_slice(&56u32.to_le_bytes());
        r[4..8].copy_from_slice(&crate::abi::op::GETATTR.to_le_bytes());
        r[8..16].copy_from_slice(&unique.to_le_bytes());
        r[16..24].copy_from_slice(&1u64.to_le_bytes());
        r
    }

    #[test]
    fn protocol_resume_dedup_quiesce_save_close() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("vol");
        std::fs::create_dir(&root).unwrap();
        let (mut relay, host) = UnixStream::pair().unwrap();
        relay
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let cfg = VolumeConfig {
            index: 3,
            root,
            read_only: false,
            journal: tmp.path().join("j"),
            host_owner: (0, 0),
            guest_owner: (0, 0),
        };
        let h = serve(host, vec![cfg], "proto".into()).unwrap();
        // A fresh server asks for a resend first.
        let f = read_frame(&mut relay).unwrap().unwrap();
        assert_eq!(
            (f.kind, f.payload.as_slice()),
            (FrameKind::Resume, &[1u8][..])
        );

        // The same unique twice (a resend racing a late write): one reply.
        write_frame(&mut relay, FrameKind::Request, 3, &getattr_root(7)).unwrap();
        write_frame(&mut relay, FrameKind::Request, 3, &getattr_root(7)).unwrap();
        write_frame(&mut relay, FrameKind::Request, 3, &getattr_root(8)).unwrap();
        let mut got = Vec::new();
        for _ in 0..2 {
            let f = read_frame(&mut relay).unwrap().unwrap();
            assert_eq!((f.kind, f.volume), (FrameKind::Reply, 3));
            got.push(u64::from_le_bytes(f.payload[8..16].try_into().unwrap()));
        }
        got.sort();
        assert_eq!(got, [7, 8]);
        // Unknown volume: ENODEV.
        write_frame(&mut relay, FrameKind::Request, 9, &getattr_root(9)).unwrap();
        let f = read_frame(&mut relay).unwrap().unwrap();
        assert_eq!(
            i32::from_le_bytes(f.payload[4..8].try_into().unwrap()),
            -libc::ENODEV
        );

        // QUIESCE with a guest that never answers: a clear timeout error.
        let e = h.quiesce(Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("did not answer"), "{e}");
        assert_eq!(
            read_frame(&mut relay).unwrap().unwrap().kind,
            FrameKind::Quiesce
        );
        // And with one that does.
        let r2 = relay.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            let mut r2 = r2;
            let f = read_frame(&mut r2).unwrap().unwrap();
            assert_eq!(f.kind, FrameKind::Quiesce);
            write_frame(&mut r2, FrameKind::Quiesced, 0, &[]).unwrap();
        });
        h.quiesce(Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        h.save_journals(tmp.path()).unwrap();
        assert!(tmp.path().join("3.journal").exists());
        h.resume();
        let f = read_frame(&mut relay).unwrap().unwrap();
        assert_eq!(
            (f.kind, f.payload.as_slice()),
            (FrameKind::Resume, &[0u8][..])
        );

        // The guest side closing ends the server.
        relay.shutdown(std::net::Shutdown::Both).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !h.is_closed() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(h.is_closed());
        h.shutdown();
        let mut rest = Vec::new();
        let _ = relay.read_to_end(&mut rest);
    }
}
