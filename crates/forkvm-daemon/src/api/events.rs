//! `GET /v1/events`: the engine's event stream
//! ([`Engine::open_events`](crate::actions::Engine::open_events)) rendered as
//! Server-Sent Events. Each subscriber gets its own forwarding task and a
//! bounded queue; a reader that falls behind is told `reset`.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use forkvm_api::events::kinds;
use forkvm_api::{Event, EventsReady};
use tokio::sync::{broadcast, mpsc};

use crate::actions::Engine;
use crate::actions::{Subscription, MAX_STREAMS};
use crate::api::error::ApiError;
use crate::error::ErrorKind;

/// Every change, as Server-Sent Events (see `forkvm_api::events`).
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(("Last-Event-ID" = Option<u64>, Header,
        description = "resume after this event's seq: the missed events still kept are sent first")),
    responses((status = 200, description = "an endless `text/event-stream`: `ready` first, \
        then one message per change (`id:` its seq, `event:` its kind, `data:` the Event as \
        JSON), a keep-alive comment every 15 s, and `reset` when events were lost",
        content_type = "text/event-stream", body = Event)))]
pub async fn events(State(m): State<Engine>, headers: HeaderMap) -> Response {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some((slot, sub)) = m.open_events(after) else {
        return ApiError::new(
            ErrorKind::LimitExceeded,
            format!("{MAX_STREAMS} event streams are open already; close one and retry"),
        )
        .into_response();
    };
    let (tx, rx) = mpsc::channel::<Result<Sse, Infallible>>(256);
    tokio::spawn(async move {
        let _slot = slot;
        forward(sub, tx).await
    });
    axum::response::sse::Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(15))
                .text("keep-alive"),
        )
        .into_response()
}

fn sse(e: &Event) -> Sse {
    Sse::default()
        .id(e.seq.to_string())
        .event(e.kind.clone())
        .data(serde_json::to_string(e).unwrap_or_default())
}

fn control(kind: &str, seq: u64) -> Sse {
    Sse::default()
        .event(kind)
        .data(serde_json::to_string(&EventsReady { seq }).unwrap_or_default())
}

/// Feed one subscriber until it goes away.
async fn forward(sub: Subscription, tx: mpsc::Sender<Result<Sse, Infallible>>) {
    let Subscription {
        replay,
        reset,
        seq,
        mut rx,
    } = sub;
    let mut first = vec![control(kinds::READY, seq)];
    if reset {
        first.push(control(kinds::RESET, seq));
    }
    first.extend(replay.iter().map(|e| sse(e)));
    for m in first {
        if tx.send(Ok(m)).await.is_err() {
            return;
        }
    }
    loop {
        let m = match rx.recv().await {
            Ok(e) => sse(&e),
            // Too slow: the events in between are gone. Say so, and go on
            // from the newest; the client re-reads its lists.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                rx = rx.resubscribe();
                control(kinds::RESET, 0)
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(Ok(m)).await.is_err() {
            return;
        }
    }
}
