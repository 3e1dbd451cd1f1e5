//! Progress of long image work (pulls, imports, builds), reported as events.
//!
//! The library only emits events; front-ends render them: the daemon turns
//! them into NDJSON lines on the API, the CLI into a progress display on a
//! terminal. Events are cheap and may be dropped by a slow consumer.

use serde::{Deserialize, Serialize};

/// One progress event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ProgressEvent {
    /// A phase starts, e.g. "resolving", "fetching", "unpacking", "mkfs".
    Phase { phase: String },
    /// Bytes of one item (a blob, a layer) done so far; `total` when known.
    Bytes {
        item: String,
        done: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
    /// An item needed no work (a cached blob, a cached build step).
    Cached { item: String },
    /// A line of free text (a build step's output, a note).
    Log { line: String },
}

/// Receives progress events. Implementations must not block for long.
pub trait Progress: Send + Sync {
    fn event(&self, e: ProgressEvent);
}

/// Discards every event.
pub struct NoProgress;

impl Progress for NoProgress {
    fn event(&self, _: ProgressEvent) {}
}

impl<F: Fn(ProgressEvent) + Send + Sync> Progress for F {
    fn event(&self, e: ProgressEvent) {
        self(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_json() {
        let e = ProgressEvent::Bytes {
            item: "sha256:ab".into(),
            done: 5,
            total: None,
        };
        let j = serde_json::to_string(&e).unwrap();
        assert_eq!(j, r#"{"event":"bytes","item":"sha256:ab","done":5}"#);
        let back: ProgressEvent = serde_json::from_str(&j).unwrap();
        assert_eq!(back, e);
        let seen = std::sync::Mutex::new(Vec::new());
        let f = |e: ProgressEvent| seen.lock().unwrap().push(e);
        f.event(ProgressEvent::Cached { item: "x".into() });
        assert_eq!(seen.lock().unwrap().len(), 1);
    }
}
