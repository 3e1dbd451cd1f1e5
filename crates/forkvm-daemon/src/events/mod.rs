//! The event stream: change notices (crate::changes) rendered as the API
//! shows the objects, numbered, kept for replay, and served as Server-Sent
//! Events at `GET /v1/events` (the wire format is in `forkvm_api::events`).
//!
//! One task turns notices into events, in the order they were noticed, so
//! that a client applying them to its lists ends where a fresh list would.
//! Each subscriber gets its own forwarding task and a bounded queue: a slow
//! reader falls behind the broadcast, is told `reset`, and re-reads the
//! lists instead of stalling anyone else.

use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use forkvm_api::events::kinds;
use forkvm_api::{Event, EventsReady};
use tokio::sync::{broadcast, mpsc};

use crate::changes::{Action, Change};
use crate::error::{EngineError, ErrorKind};
use crate::manager::Manager;

pub mod bus;
pub use bus::{event, Bus, Subscription, MAX_STREAMS};

impl Manager {
    /// Start turning the database's, pools' and images' notices into
    /// events (once, at daemon start).
    pub fn start_events(self: &Arc<Self>) {
        let mut rx = self.db.changes.receiver();
        let weak: Weak<Manager> = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(c) = rx.recv().await {
                let Some(m) = weak.upgrade() else { break };
                if let Some(e) = m.render(c) {
                    m.events.publish(e);
                }
            }
        });
    }

    /// The event for a notice; None when the object is gone by now (its
    /// `deleted` notice follows).
    fn render(&self, c: Change) -> Option<Event> {
        let kind = |base: &str, a: Action| match a {
            Action::Created => format!("{base}.created"),
            Action::Updated => format!("{base}.updated"),
            Action::Deleted => format!("{base}.deleted"),
        };
        Some(match c {
            Change::Sandbox(id, a) => {
                let mut e = event(&kind("sandbox", a), &id);
                if a != Action::Deleted {
                    // As the list shows it: without the memory, usage and
                    // disk figures, which read /proc, the cgroup and the
                    // disk chain, at every step of every spawn.
                    e.sandbox = Some(self.view(self.row(&id).ok()?, false));
                }
                e
            }
            Change::Snapshot(id, a) => {
                let mut e = event(&kind("snapshot", a), &id);
                if a != Action::Deleted {
                    e.snapshot = Some(self.snapshot_by_ref(&id).ok()?);
                }
                e
            }
            Change::Image(name, a) => {
                let mut e = event(&kind("image", a), &name);
                if a != Action::Deleted {
                    e.image = Some(self.get_image(&name).ok()?);
                }
                e
            }
            Change::Branch(b) => {
                let mut e = event(kinds::BRANCH, &b.source);
                e.branch = Some(*b);
                e
            }
            Change::Pool(snap) => {
                let row = self.db.snapshot(&snap).ok()??;
                let mut e = event(kinds::POOL, &snap);
                e.pool = Some(forkvm_api::PoolEvent {
                    size: self.pool_size_of(&row),
                    ready: self.pools.ready_count(&snap),
                    snapshot: snap,
                });
                e
            }
        })
    }
}

/// Every change, as Server-Sent Events (see `forkvm_api::events`).
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(("Last-Event-ID" = Option<u64>, Header,
        description = "resume after this event's seq: the missed events still kept are sent first")),
    responses((status = 200, description = "an endless `text/event-stream`: `ready` first, \
        then one message per change (`id:` its seq, `event:` its kind, `data:` the Event as \
        JSON), a keep-alive comment every 15 s, and `reset` when events were lost",
        content_type = "text/event-stream", body = Event)))]
pub async fn events(State(m): State<Arc<Manager>>, headers: HeaderMap) -> Response {
    let Some(slot) = m.events.open_stream() else {
        return EngineError::new(
            ErrorKind::LimitExceeded,
            format!("{MAX_STREAMS} event streams are open already; close one and retry"),
        )
        .into_response();
    };
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let sub = m.events.subscribe(after);
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
