//! Progress of a long image operation (pull, import, build) as an NDJSON
//! response: one [`ImageEvent`] per line, the last one `done` or `error`.
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

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use forkvm_api::{ErrorDetail, Image, ImageEvent};
use forkvm_image::progress::{Progress, ProgressEvent};
use tokio::sync::mpsc;

use crate::error::ApiError;

/// Minimum interval between two byte-count lines of one item.
const BYTES_EVERY: Duration = Duration::from_millis(250);

/// A [`Progress`] sink that forwards events to a stream (and to the log).
pub struct Emitter {
    tx: mpsc::UnboundedSender<ImageEvent>,
    last: Mutex<HashMap<String, Instant>>,
    /// What the operation is about, for log lines (e.g. `image py`).
    what: String,
}

impl Emitter {
    pub fn new(tx: mpsc::UnboundedSender<ImageEvent>, what: impl Into<String>) -> Self {
        Emitter {
            tx,
            last: Mutex::new(HashMap::new()),
            what: what.into(),
        }
    }

    /// Send an event as is.
    pub fn send(&self, e: ImageEvent) {
        let _ = self.tx.send(e);
    }
}

impl Progress for Emitter {
    fn event(&self, e: ProgressEvent) {
        let ev = match e {
            ProgressEvent::Phase { phase } => {
                tracing::info!("{}: {phase}", self.what);
                ImageEvent::Phase { phase }
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
                ImageEvent::Progress { item, done, total }
            }
            ProgressEvent::Cached { item } => ImageEvent::Cached { item },
            ProgressEvent::Log { line } => ImageEvent::Log { line },
        };
        self.send(ev);
    }
}

fn line(ev: &ImageEvent) -> Result<Bytes, std::convert::Infallible> {
    let mut v = serde_json::to_vec(ev).unwrap_or_default();
    v.push(b'\n');
    Ok(Bytes::from(v))
}

/// The last event of a finished operation.
pub fn last_event(r: Result<Image, ApiError>) -> ImageEvent {
    match r {
        Ok(image) => ImageEvent::Done {
            image: Box::new(image),
        },
        Err(e) => ImageEvent::Error {
            error: ErrorDetail {
                code: e.code.to_string(),
                message: e.message,
            },
        },
    }
}

/// Run `work` on its own task and answer with its progress as NDJSON.
/// `work` gets the sender its [`Emitter`] is made from.
pub fn ndjson<F, Fut>(work: F) -> Response
where
    F: FnOnce(mpsc::UnboundedSender<ImageEvent>) -> Fut,
    Fut: Future<Output = Result<Image, ApiError>> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (line_tx, line_rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
    let fut = work(tx.clone());
    tokio::spawn(async move {
        let task = tokio::spawn(fut);
        tokio::pin!(task);
        let result = loop {
            tokio::select! {
                Some(ev) = rx.recv() => { let _ = line_tx.send(line(&ev)).await; }
                r = &mut task => break r,
            }
        };
        drop(tx);
        while let Ok(ev) = rx.try_recv() {
            let _ = line_tx.send(line(&ev)).await;
        }
        let r = result.unwrap_or_else(|e| Err(ApiError::internal(format!("task failed: {e}"))));
        let _ = line_tx.send(line(&last_event(r))).await;
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(line_rx)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_are_thinned_but_the_last_always_goes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let e = Emitter::new(tx, "test");
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
        let ev = last_event(Err(ApiError::conflict("in use")));
        let j = serde_json::to_string(&ev).unwrap();
        assert!(
            j.contains(r#""type":"error""#) && j.contains("in use"),
            "{j}"
        );
    }
}
