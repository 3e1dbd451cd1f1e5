//! The gauges of `GET /metrics`, read from the daemon's state at scrape time.

use prometheus_client::encoding::text::{encode, encode_registry};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{labels, Labels, METRICS};
use crate::manager::Manager;

impl Manager {
    /// The exposition text: the event counters, then gauges read now.
    pub fn metrics_text(&self) -> String {
        let now = Registry::with_prefix("forkvm");
        let mut now = now;
        let sandboxes = Family::<Labels, Gauge>::default();
        let pss = Family::<Labels, Gauge>::default();
        let cpu = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for state in ["starting", "running", "paused", "failed"] {
            sandboxes.get_or_create(&labels(&[("state", state)])).set(0);
        }
        for r in self.db.list().unwrap_or_default() {
            let state = crate::db::state_str(r.state);
            sandboxes.get_or_create(&labels(&[("state", state)])).inc();
            if let Some(pid) = r.pid {
                let l = labels(&[("sandbox", &r.id)]);
                if let Some(m) = crate::util::memory_usage(pid) {
                    pss.get_or_create(&l).set((m.pss_kib * 1024) as i64);
                }
                if let Some(ms) = crate::usage::cpu_ms(pid) {
                    cpu.get_or_create(&l).set(ms as f64 / 1000.0);
                }
            }
        }
        now.register("sandboxes", "Sandboxes, by state", sandboxes);
        now.register(
            "sandbox_memory_pss_bytes",
            "PSS of each running sandbox's QEMU",
            pss,
        );
        now.register(
            "sandbox_cpu_seconds",
            "CPU time each running sandbox's QEMU has used",
            cpu,
        );
        let pools = Family::<Labels, Gauge>::default();
        for p in self.pool_infos() {
            pools
                .get_or_create(&labels(&[("snapshot", &p.snapshot)]))
                .set(i64::from(p.ready));
        }
        now.register("pool_ready", "Warm QEMUs ready, by snapshot", pools);
        let c = self.capacity();
        let g = |v: u64| {
            let g = Gauge::<i64>::default();
            g.set(v as i64);
            g
        };
        now.register(
            "memory_commit_mib",
            "The memory commitment",
            g(c.memory_commit_mib),
        );
        now.register(
            "memory_used_mib",
            "Memory running sandboxes use (sum of PSS)",
            g(c.memory_used_mib),
        );
        now.register(
            "disk_free_mib",
            "Free space where the daemon keeps its data",
            g(c.disk_free_mib),
        );
        let mut out = String::new();
        // Written with plain string formatting: cannot fail.
        let _ = encode_registry(&mut out, &METRICS.registry);
        let _ = encode(&mut out, &now);
        out
    }
}
