//! Streamed responses: newline-delimited JSON written by a task as events
//! happen (`application/x-ndjson`, the style of exec's and image pulls'
//! streams).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;

/// How long one line may wait for a client that does not read. Past it the
/// stream ends: a stream shares its sandbox's agent connection, and a
/// reader that never reads would hold up every other request to it.
const SLOW_CLIENT: Duration = Duration::from_secs(60);

/// The sending end of a streamed response.
pub(crate) struct Lines {
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
}

impl Lines {
    /// Send one line; false once the client is gone (or too slow), when
    /// the producer should stop.
    pub(crate) async fn send<T: Serialize>(&self, ev: &T) -> bool {
        let mut v = match serde_json::to_vec(ev) {
            Ok(v) => v,
            Err(_) => return false,
        };
        v.push(b'\n');
        matches!(
            tokio::time::timeout(SLOW_CLIENT, self.tx.send(Ok(Bytes::from(v)))).await,
            Ok(Ok(()))
        )
    }
}

/// A 200 `application/x-ndjson` response and the [`Lines`] that feed it.
pub(crate) fn response() -> (Lines, Response) {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let resp = (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response();
    (Lines { tx }, resp)
}

/// Answer with a stream of events, one per line, as they arrive. A client
/// that hangs up (or stops reading) ends the response, not what produces
/// the events.
pub(crate) fn events<T: Serialize + Send + Sync + 'static>(mut rx: mpsc::Receiver<T>) -> Response {
    let (lines, response) = response();
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            if !lines.send(&ev).await {
                break;
            }
        }
    });
    response
}

/// Answer with an engine operation's progress
/// ([`Engine::run_detached`](crate::actions::Engine::run_detached)), one
/// event per line. A client that hangs up stops the stream, not the
/// operation.
pub(crate) fn progress<E, F, Fut>(work: F) -> Response
where
    E: crate::actions::StreamEvent,
    F: FnOnce(mpsc::UnboundedSender<E>) -> Fut,
    Fut: std::future::Future<Output = Result<E::Done, crate::error::EngineError>> + Send + 'static,
{
    events(crate::actions::Engine::run_detached(work))
}
