//! Progress of a long operation (an image pull, import or build; a snapshot
//! push or pull) as a stream of events ([`ImageEvent`] or [`TransferEvent`],
//! see [`StreamEvent`]), the last one the result or `error`. The REST
//! front-end writes it as NDJSON, one event per line (`api::ndjson`).
//!
//! The work runs on a task of its own, so a client that hangs up stops the
//! stream, not the operation (which then finishes or cleans up as usual).
//! Byte counts are thinned to a few lines per second per item: a terminal
//! redraws at that rate anyway, and a 1 GiB layer would otherwise produce
//! tens of thousands of lines.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use forkvm_api::{ErrorDetail, Image, ImageEvent, TransferEvent};
use forkvm_image::progress::{Progress, ProgressEvent};
use tokio::sync::mpsc;

use crate::error::EngineError;

/// Minimum interval between two byte-count lines of one item.
const BYTES_EVERY: Duration = Duration::from_millis(250);

/// The line type of a progress stream.
pub trait StreamEvent: serde::Serialize + Send + Sync + 'static {
    /// What the operation returns.
    type Done: Send + 'static;
    fn phase(phase: String) -> Self;
    fn progress(item: String, done: u64, total: Option<u64>) -> Self;
    fn cached(item: String) -> Self;
    fn log(line: String) -> Self;
    fn done(d: Self::Done) -> Self;
    fn error(e: ErrorDetail) -> Self;
}

impl StreamEvent for ImageEvent {
    type Done = Image;
    fn phase(phase: String) -> Self {
        ImageEvent::Phase { phase }
    }
    fn progress(item: String, done: u64, total: Option<u64>) -> Self {
        ImageEvent::Progress { item, done, total }
    }
    fn cached(item: String) -> Self {
        ImageEvent::Cached { item }
    }
    fn log(line: String) -> Self {
        ImageEvent::Log { line }
    }
    fn done(image: Image) -> Self {
        ImageEvent::Done {
            image: Box::new(image),
        }
    }
    fn error(error: ErrorDetail) -> Self {
        ImageEvent::Error { error }
    }
}

/// A transfer ends in `pushed` or `pulled`: the operation returns that
/// event itself.
impl StreamEvent for TransferEvent {
    type Done = TransferEvent;
    fn phase(phase: String) -> Self {
        TransferEvent::Phase { phase }
    }
    fn progress(item: String, done: u64, total: Option<u64>) -> Self {
        TransferEvent::Progress { item, done, total }
    }
    fn cached(item: String) -> Self {
        TransferEvent::Cached { item }
    }
    fn log(line: String) -> Self {
        TransferEvent::Log { line }
    }
    fn done(d: TransferEvent) -> Self {
        d
    }
    fn error(error: ErrorDetail) -> Self {
        TransferEvent::Error { error }
    }
}

/// A [`Progress`] sink that forwards events to a stream (and to the log).
pub struct Emitter<E = ImageEvent> {
    tx: mpsc::UnboundedSender<E>,
    last: Mutex<HashMap<String, Instant>>,
    /// What the operation is about, for log lines (e.g. `image py`).
    what: String,
}

impl<E: StreamEvent> Emitter<E> {
    pub fn new(tx: mpsc::UnboundedSender<E>, what: impl Into<String>) -> Self {
        Emitter {
            tx,
            last: Mutex::new(HashMap::new()),
            what: what.into(),
        }
    }

    /// Send an event as is.
    pub fn send(&self, e: E) {
        let _ = self.tx.send(e);
    }
}

impl<E: StreamEvent> Progress for Emitter<E> {
    fn event(&self, e: ProgressEvent) {
        let ev = match e {
            ProgressEvent::Phase { phase } => {
                tracing::info!("{}: {phase}", self.what);
                E::phase(phase)
            }
            ProgressEvent::Bytes { item, done, total } => {
                let finished = total == Some(done);
                let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
                let now = Instant::now();
                match last.get(&item) {
                    Some(t) if !finished && now.duration_since(*t) < BYTES_EVERY => return,
                    _ => {
                        last.insert(item.clone(), now);
                    }
                }
                E::progress(item, done, total)
            }
            ProgressEvent::Cached { item } => E::cached(item),
            ProgressEvent::Log { line } => E::log(line),
        };
        self.send(ev);
    }
}

/// The last event of a finished operation.
pub fn last_event<E: StreamEvent>(r: Result<E::Done, EngineError>) -> E {
    match r {
        Ok(d) => E::done(d),
        Err(e) => E::error(e.to_wire()),
    }
}

/// Run `work` on its own task and hand back its progress: every event it
/// sends, then its result or error as the last event. The engine owns the
/// operation: when the receiver is dropped (its client went away) the work
/// still runs to its end, and cleans up as usual. `work` gets the sender
/// its [`Emitter`] is made from.
pub fn run_detached<E, F, Fut>(work: F) -> mpsc::Receiver<E>
where
    E: StreamEvent,
    F: FnOnce(mpsc::UnboundedSender<E>) -> Fut,
    Fut: Future<Output = Result<E::Done, EngineError>> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (out_tx, out_rx) = mpsc::channel::<E>(64);
    let fut = work(tx.clone());
    tokio::spawn(async move {
        let task = tokio::spawn(fut);
        tokio::pin!(task);
        let result = loop {
            tokio::select! {
                Some(ev) = rx.recv() => { let _ = out_tx.send(ev).await; }
                r = &mut task => break r,
            }
        };
        drop(tx);
        while let Ok(ev) = rx.try_recv() {
            let _ = out_tx.send(ev).await;
        }
        let r = result.unwrap_or_else(|e| Err(EngineError::internal(format!("task failed: {e}"))));
        let _ = out_tx.send(last_event::<E>(r)).await;
    });
    out_rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_are_thinned_but_the_last_always_goes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let e = Emitter::<ImageEvent>::new(tx, "test");
        for done in 0..1000u64 {
            e.event(ProgressEvent::Bytes {
                item: "a".into(),
                done,
                total: Some(1000),
            });
        }
        e.event(ProgressEvent::Bytes {
            item: "a".into(),
            done: 1000,
            total: Some(1000),
        });
        let mut got = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            got.push(ev);
        }
        assert!(got.len() <= 3, "{} lines", got.len());
        assert_eq!(
            got.last(),
            Some(&ImageEvent::Progress {
                item: "a".into(),
                done: 1000,
                total: Some(1000)
            })
        );
    }

    #[test]
    fn errors_end_the_stream_with_their_code() {
        let ev = last_event::<ImageEvent>(Err(EngineError::conflict("in use")));
        let j = serde_json::to_string(&ev).unwrap();
        assert!(
            j.contains(r#""type":"error""#) && j.contains("in use"),
            "{j}"
        );
    }
}
