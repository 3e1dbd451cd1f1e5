//! The output ring of one process: the last [`OUTPUT_RING`] bytes of its
//! stdout, stderr or terminal, in the order they were read, each byte
//! tagged with its stream.
//!
//! Bytes are addressed by their absolute offset in everything the process
//! ever wrote, so a reader keeps a cursor and learns exactly how many bytes
//! it missed when the ring dropped them (`lost`). The ring holds the bytes
//! in one deque and the stream changes as *runs* (start offset, stream);
//! runs are capped too ([`MAX_RUNS`]), so output that alternates streams a
//! byte at a time cannot grow the bookkeeping past the bytes it describes.
//!
//! ```text
//!   dropped         start                                   end
//!  ....... |=========|==========|=========|...............|
//!          | run 0   | run 1    | run 2                     |
//!          | stdout  | stderr   | stdout                    |
//! ```

use std::collections::VecDeque;

use forkvm_agent_protocol::caps::OUTPUT_RING;
use forkvm_agent_protocol::ProcStream;

/// Most stream runs kept; past this the oldest run is dropped whole.
pub const MAX_RUNS: usize = 1 << 14;

/// What a reader gets from [`Ring::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Bytes dropped between the reader's cursor and this chunk.
    pub lost: u64,
    pub stream: ProcStream,
    pub data: Vec<u8>,
    /// The cursor after this chunk.
    pub next: u64,
}

#[derive(Debug)]
pub struct Ring {
    bytes: VecDeque<u8>,
    /// (absolute offset where the run starts, its stream), ascending; the
    /// first run may start before `start` (its head was dropped).
    runs: VecDeque<(u64, ProcStream)>,
    /// Absolute offset of `bytes[0]`.
    start: u64,
    cap: usize,
}

impl Default for Ring {
    fn default() -> Self {
        Ring::with_capacity(OUTPUT_RING)
    }
}

impl Ring {
    pub fn with_capacity(cap: usize) -> Self {
        Ring {
            bytes: VecDeque::new(),
            runs: VecDeque::new(),
            start: 0,
            cap: cap.max(1),
        }
    }

    /// Absolute offset just past the newest byte.
    pub fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// Append output, dropping the oldest bytes beyond the capacity.
    pub fn push(&mut self, stream: ProcStream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.runs.back().map(|r| r.1) != Some(stream) {
            self.runs.push_back((self.end(), stream));
        }
        // Bytes that would be dropped at once are counted, not copied.
        let skip = data.len().saturating_sub(self.cap);
        if skip > 0 {
            self.start += (self.bytes.len() + skip) as u64;
            self.bytes.clear();
        }
        self.bytes.extend(&data[skip..]);
        let excess = self.bytes.len().saturating_sub(self.cap);
        self.drop_front(excess);
        while self.runs.len() > MAX_RUNS {
            let next = self.runs[1].0;
            let n = usize::try_from(next.saturating_sub(self.start)).unwrap_or(usize::MAX);
            // Prunes the run, which now ends at `start`.
            self.drop_front(n.min(self.bytes.len()));
        }
    }

    fn drop_front(&mut self, n: usize) {
        self.bytes.drain(..n);
        self.start += n as u64;
        while self.runs.len() >= 2 && self.runs[1].0 <= self.start {
            self.runs.pop_front();
        }
    }

    /// The bytes at `cursor` (or the oldest kept, if those were dropped),
    /// at most `max` and all of one stream; `None` when there is nothing
    /// new.
    pub fn read(&self, cursor: u64, max: usize) -> Option<Chunk> {
        let pos = cursor.max(self.start);
        if pos >= self.end() {
            return None;
        }
        let idx = self.runs.partition_point(|r| r.0 <= pos).checked_sub(1)?;
        let run_end = self.runs.get(idx + 1).map_or(self.end(), |r| r.0);
        let n = usize::try_from(run_end - pos)
            .unwrap_or(usize::MAX)
            .min(max);
        let from = usize::try_from(pos - self.start).ok()?;
        Some(Chunk {
            lost: pos - cursor,
            stream: self.runs[idx].1,
            data: self.bytes.range(from..from + n).copied().collect(),
            next: pos + n as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProcStream::{Stderr, Stdout};

    fn drain(r: &Ring, mut cursor: u64, max: usize) -> (u64, Vec<(ProcStream, Vec<u8>)>) {
        let mut lost = 0;
        let mut out: Vec<(ProcStream, Vec<u8>)> = Vec::new();
        while let Some(c) = r.read(cursor, max) {
            lost += c.lost;
            cursor = c.next;
            assert!(c.data.len() <= max && !c.data.is_empty());
            match out.last_mut() {
                Some((s, d)) if *s == c.stream => d.extend(c.data),
                _ => out.push((c.stream, c.data)),
            }
        }
        assert_eq!(cursor, r.end());
        (lost, out)
    }

    #[test]
    fn replays_streams_in_order() {
        let mut r = Ring::with_capacity(100);
        r.push(Stdout, b"ab");
        r.push(Stdout, b"c");
        r.push(Stderr, b"E");
        r.push(Stdout, b"d");
        let (lost, out) = drain(&r, 0, 2);
        assert_eq!(lost, 0);
        assert_eq!(
            out,
            vec![
                (Stdout, b"abc".to_vec()),
                (Stderr, b"E".to_vec()),
                (Stdout, b"d".to_vec())
            ]
        );
        // A cursor in the middle; a cursor at the end.
        assert_eq!(r.read(1, 10).unwrap().data, b"bc");
        assert!(r.read(r.end(), 10).is_none());
    }

    #[test]
    fn overflow_drops_the_oldest_and_reports_the_gap() {
        let mut r = Ring::with_capacity(10);
        r.push(Stdout, b"0123456789");
        r.push(Stderr, b"abcd");
        assert_eq!(r.end(), 14);
        let (lost, out) = drain(&r, 0, 100);
        assert_eq!(lost, 4);
        assert_eq!(
            out,
            vec![(Stdout, b"456789".to_vec()), (Stderr, b"abcd".to_vec())]
        );
        // A reader already past the gap loses nothing.
        assert_eq!(r.read(5, 100).unwrap().lost, 0);
        // One push bigger than the ring keeps its tail.
        r.push(Stdout, &[b'x'; 25]);
        let (lost, out) = drain(&r, 0, 100);
        assert_eq!((lost, out), (29, vec![(Stdout, vec![b'x'; 10])]));
        assert_eq!(r.end(), 39);
    }

    #[test]
    fn alternating_streams_cannot_grow_the_runs_without_bound() {
        let mut r = Ring::with_capacity(1 << 20);
        for i in 0..(MAX_RUNS * 3) {
            r.push(if i % 2 == 0 { Stdout } else { Stderr }, b"x");
        }
        assert!(r.runs.len() <= MAX_RUNS);
        assert_eq!(r.bytes.len(), MAX_RUNS);
        let (lost, out) = drain(&r, 0, 1 << 16);
        assert_eq!(lost, (MAX_RUNS * 2) as u64);
        assert_eq!(out.len(), MAX_RUNS);
        assert_eq!(out[0].0, Stdout);
    }
}
