//! The event stream: change notices (crate::changes) rendered as the API
//! shows the objects, numbered, kept for replay, and served as Server-Sent
//! Events at `GET /v1/events` by the REST front-end (`api::events`; the wire
//! format is in `forkvm_api::events`).
//!
//! One task turns notices into events, in the order they were noticed, so
//! that a client applying them to its lists ends where a fresh list would.
//! Each subscriber gets its own forwarding task and a bounded queue: a slow
//! reader falls behind the broadcast, is told `reset`, and re-reads the
//! lists instead of stalling anyone else.

use std::sync::{Arc, Weak};

use forkvm_api::events::kinds;
use forkvm_api::Event;

use crate::changes::{Action, Change};
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
