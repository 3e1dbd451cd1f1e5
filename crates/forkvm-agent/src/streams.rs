//! Which streams are live: a stream (a process's events, a directory
//! watch) belongs to the request that opened it and to the host connection
//! it came on. It stops when the host cancels it (`stream_cancel`) or when
//! that connection is over.
//!
//! The agent cannot see a connection end directly on a virtio port, so it
//! counts *connection epochs*: end-of-file on the channel (no host), a
//! reopened port, and `identity` (the first request a restored clone gets)
//! each start a new epoch, and a stream from an older epoch stops at its
//! next check. Without this a branched VM would keep feeding its parent's
//! streams, with the parent's request ids, to the child's host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Default)]
pub struct Streams {
    epoch: AtomicU64,
    live: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

/// One open stream; unregisters itself when dropped.
pub struct StreamHandle {
    streams: Arc<Streams>,
    id: u64,
    epoch: u64,
    cancelled: Arc<AtomicBool>,
}

impl Streams {
    /// Register the stream of request `id` in the current epoch.
    pub fn open(self: &Arc<Self>, id: u64) -> StreamHandle {
        let cancelled = Arc::new(AtomicBool::new(false));
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        // A reused id replaces (and stops) the older stream.
        if let Some(old) = live.insert(id, Arc::clone(&cancelled)) {
            old.store(true, Ordering::Release);
        }
        StreamHandle {
            streams: Arc::clone(self),
            id,
            epoch: self.epoch.load(Ordering::Acquire),
            cancelled,
        }
    }

    /// Stop the stream of request `id`; false if there is none.
    pub fn cancel(&self, id: u64) -> bool {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        match live.get(&id) {
            Some(c) => {
                c.store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// A new connection: every stream opened before stops.
    pub fn new_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

impl StreamHandle {
    /// Whether the stream should go on.
    pub fn live(&self) -> bool {
        !self.cancelled.load(Ordering::Acquire)
            && self.streams.epoch.load(Ordering::Acquire) == self.epoch
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        let mut live = self
            .streams
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Only our own entry: a newer stream may have reused the id.
        if live
            .get(&self.id)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cancelled))
        {
            live.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_epoch_and_reuse() {
        let s = Arc::new(Streams::default());
        let a = s.open(1);
        let b = s.open(2);
        assert!(a.live() && b.live());
        assert!(s.cancel(1));
        assert!(!a.live() && b.live());
        drop(a);
        assert!(!s.cancel(1), "a dropped stream is gone");
        s.new_epoch();
        assert!(!b.live());
        let c = s.open(2);
        assert!(c.live(), "opened in the new epoch");
        drop(b); // must not unregister c
        assert!(s.cancel(2));
        assert!(!c.live());
        let d = s.open(3);
        let e = s.open(3);
        assert!(!d.live() && e.live(), "a reused id stops the older stream");
    }
}
