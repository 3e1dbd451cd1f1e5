//! Actions on the engine as a whole: its start and stop, the settings the
//! front-ends serve by, the event stream, metrics and progress streams.

use std::net::SocketAddr;
use std::path::PathBuf;

use forkvm_api::{Info, Limits};
use tokio::sync::mpsc;

use super::{Engine, StreamEvent, StreamSlot, Subscription};
use crate::error::EngineError;

impl Engine {
    /// Start the engine: re-attach the sandboxes an earlier daemon left
    /// running, tidy the snapshot store, then start the background work
    /// (lifetimes, disk pressure, warm pools, GC, events).
    pub async fn start(&self) -> Result<(), EngineError> {
        let m = &self.m;
        m.recover().await?;
        // Again, now that the old daemon's QEMUs are re-attached: one of
        // them may have still been writing into a staging directory at the
        // first sweep (Store::open).
        for name in m.store.sweep() {
            tracing::warn!("cannot remove the unfinished snapshot directory {name}");
        }
        m.tidy_snapshot_leftovers();
        m.reconcile_snapshots();
        m.collect_layers().await;
        // Timeouts that ran out while no daemon ran are acted on at the
        // first sweep (crate::lifetime).
        m.start_sweeper();
        m.start_pressure_watch();
        m.refill_all_pools();
        m.start_gc();
        m.start_events();
        Ok(())
    }

    /// Undo what a start set up on the host (its nftables table and cgroup
    /// parent) when the daemon cannot serve after all and no sandbox runs.
    pub async fn abandon(&self) {
        if self.m.live_map().is_empty() {
            self.m.net.remove_host_table().await;
            self.m.jail.remove_group();
        }
    }

    /// Stop the engine, leaving running sandboxes for the next daemon:
    /// pooled QEMUs go, and so do the host table (when no sandbox runs) and
    /// the cgroup parent (when empty).
    pub async fn stop(&self) {
        // Pooled QEMUs belong to no sandbox: they go with the daemon.
        self.m.drain_pools().await;
        // Running sandboxes keep their host rules for the next daemon;
        // with none, the table would only be left behind.
        if self.m.live_map().is_empty() {
            self.m.net.remove_host_table().await;
        }
        // The cgroup parent goes too when no sandbox is left in it.
        self.m.jail.remove_group();
    }

    /// The daemon's version, host, accelerator and capacity.
    pub fn info(&self) -> Result<Info, EngineError> {
        self.m.info()
    }

    /// The daemon's metrics in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        self.m.metrics_text()
    }

    /// Count a failed request by its error code in the daemon's metrics.
    pub fn count_error(code: &str) {
        crate::metrics::METRICS.error(code);
    }

    /// The request limits the front-ends enforce (body size and time,
    /// concurrent requests).
    pub fn limits(&self) -> Limits {
        self.m.cfg.limits.clone()
    }

    /// The TCP address the daemon was asked to serve on, if any.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.m.cfg.tcp
    }

    /// The directory of the built dashboard's files.
    pub fn ui_dir(&self) -> PathBuf {
        self.m.cfg.ui_dir()
    }

    /// Whether sandboxes can have a network on this host.
    pub fn network_available(&self) -> bool {
        self.m.net.available()
    }

    /// Open a stream of events after `after` (a seq; the missed events
    /// still kept come first), or `None` when the stream limit is reached.
    /// The stream counts against the limit while its slot is held.
    pub fn open_events(&self, after: Option<u64>) -> Option<(StreamSlot, Subscription)> {
        let slot = self.m.events.open_stream()?;
        Some((slot, self.m.events.subscribe(after)))
    }

    /// Run a long operation on its own task and hand back its progress
    /// events, then its result; it runs to its end even when the receiver
    /// (its client) goes away.
    pub fn run_detached<E, F, Fut>(work: F) -> mpsc::Receiver<E>
    where
        E: StreamEvent,
        F: FnOnce(mpsc::UnboundedSender<E>) -> Fut,
        Fut: std::future::Future<Output = Result<E::Done, EngineError>> + Send + 'static,
    {
        crate::images::stream::run_detached(work)
    }
}
