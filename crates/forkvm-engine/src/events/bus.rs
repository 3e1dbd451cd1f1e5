//! The event bus: numbered events, the last [`REPLAY`] kept for clients
//! that reconnect, sent to every subscriber in one order. A leaf, so that
//! the manager can own one while `crate::events` (which needs the manager
//! to render objects) feeds and serves it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use forkvm_api::events::REPLAY;
use forkvm_api::Event;
use tokio::sync::broadcast;

/// Most streams open at once: each holds a task and a queue, and streams
/// are exempt from the request limit since they never end by themselves.
pub const MAX_STREAMS: usize = 64;

/// Numbered events, the last [`REPLAY`] of them kept.
pub struct Bus {
    tx: broadcast::Sender<Arc<Event>>,
    /// (the last seq given out, the kept events, oldest first).
    recent: Mutex<(u64, VecDeque<Arc<Event>>)>,
    streams: Arc<AtomicUsize>,
}

impl Default for Bus {
    fn default() -> Self {
        Bus {
            tx: broadcast::channel(REPLAY).0,
            recent: Mutex::new((0, VecDeque::new())),
            streams: Arc::default(),
        }
    }
}

/// One open stream, counted until dropped.
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Bus {
    pub fn open_stream(&self) -> Option<StreamSlot> {
        let n = self.streams.fetch_add(1, Ordering::SeqCst);
        let slot = StreamSlot(self.streams.clone());
        (n < MAX_STREAMS).then_some(slot)
    }
}

/// What a new subscriber gets: the events it missed, whether it missed
/// more than are kept, the last seq, and the live feed from there.
pub struct Subscription {
    pub replay: Vec<Arc<Event>>,
    pub reset: bool,
    pub seq: u64,
    pub rx: broadcast::Receiver<Arc<Event>>,
}

impl Bus {
    /// Number `e` (its `seq` and `at_unix_ms` are set here), keep it and
    /// send it. Numbering and sending happen under one lock, so every
    /// subscriber sees the same order.
    pub fn publish(&self, mut e: Event) {
        let mut g = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        e.seq = g.0;
        e.at_unix_ms = now_ms();
        let e = Arc::new(e);
        if g.1.len() == REPLAY {
            g.1.pop_front();
        }
        g.1.push_back(e.clone());
        let _ = self.tx.send(e);
    }

    /// Subscribe; with `after`, first replay what came after that seq.
    pub fn subscribe(&self, after: Option<u64>) -> Subscription {
        let g = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        // Taken under the lock: nothing published can fall between the
        // replay and the live feed.
        let rx = self.tx.subscribe();
        let seq = g.0;
        let (replay, reset) = match after {
            None => (Vec::new(), false),
            Some(a) if a >= seq => (Vec::new(), a > seq),
            Some(a) => {
                let oldest = g.1.front().map_or(seq + 1, |e| e.seq);
                let kept: Vec<_> = g.1.iter().filter(|e| e.seq > a).cloned().collect();
                (kept, a + 1 < oldest)
            }
        };
        Subscription {
            replay,
            reset,
            seq,
            rx,
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An event with only its kind and id (the rest is filled by the caller).
pub fn event(kind: &str, id: &str) -> Event {
    Event {
        seq: 0,
        at_unix_ms: 0,
        kind: kind.into(),
        id: id.into(),
        sandbox: None,
        snapshot: None,
        image: None,
        branch: None,
        pool: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(b: &Bus, n: usize) {
        for i in 0..n {
            b.publish(event(
                forkvm_api::events::kinds::SANDBOX_CREATED,
                &format!("sb-{i}"),
            ));
        }
    }

    #[test]
    fn events_are_numbered_in_order_from_one() {
        let b = Bus::default();
        let mut s = b.subscribe(None);
        assert_eq!(s.seq, 0);
        publish(&b, 3);
        for want in 1..=3 {
            let e = s.rx.try_recv().unwrap();
            assert_eq!(e.seq, want);
            assert_eq!(e.id, format!("sb-{}", want - 1));
            assert!(e.at_unix_ms > 0);
        }
    }

    #[test]
    fn a_reconnect_replays_what_it_missed_without_gaps_or_doubles() {
        let b = Bus::default();
        publish(&b, 5);
        let s = b.subscribe(Some(2));
        assert_eq!(s.seq, 5);
        assert!(!s.reset);
        assert_eq!(
            s.replay.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        // Up to date: nothing to replay.
        let s = b.subscribe(Some(5));
        assert!(s.replay.is_empty() && !s.reset);
        // A seq from the future (another daemon process): start over.
        assert!(b.subscribe(Some(99)).reset);
    }

    #[test]
    fn a_reconnect_from_before_what_is_kept_is_told_to_reset() {
        let b = Bus::default();
        publish(&b, REPLAY + 10);
        let s = b.subscribe(Some(3));
        assert!(s.reset, "events 4..=10 are gone");
        assert_eq!(s.replay.len(), REPLAY);
        assert_eq!(s.replay[0].seq, 11);
        // Exactly at the edge: the next event is still kept.
        let s = b.subscribe(Some(10));
        assert!(!s.reset);
        assert_eq!(s.replay.len(), REPLAY);
    }

    #[test]
    fn streams_are_limited_and_freed_when_they_end() {
        let b = Bus::default();
        let slots: Vec<_> = (0..MAX_STREAMS).map(|_| b.open_stream().unwrap()).collect();
        assert!(b.open_stream().is_none());
        drop(slots);
        assert!(b.open_stream().is_some());
    }

    #[test]
    fn a_missing_object_is_left_out_of_the_json() {
        let mut e = event(forkvm_api::events::kinds::SNAPSHOT_DELETED, "sn-1");
        e.seq = 7;
        let j = serde_json::to_value(&e).unwrap();
        assert_eq!(j["kind"], "snapshot.deleted");
        assert!(j.get("sandbox").is_none(), "absent objects are left out");
    }
}
