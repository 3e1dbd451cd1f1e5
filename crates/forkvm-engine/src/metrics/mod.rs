//! Prometheus metrics at `GET /metrics` (text exposition format, written by
//! the `prometheus-client` crate).
//!
//! Counters and histograms are process-wide and count events as they
//! happen: spawns, branches, pauses, resumes, timeouts and API errors by
//! code. Gauges are read at scrape time from the daemon's state: sandboxes
//! by state, per-sandbox memory and CPU, warm pools, and capacity.

use std::sync::LazyLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub mod gauges;

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Event counters of the daemon process.
pub struct Metrics {
    registry: Registry,
    spawns: Family<Labels, Counter>,
    spawn_seconds: Histogram,
    branches: Family<Labels, Counter>,
    branch_pause_seconds: Histogram,
    pauses: Family<Labels, Counter>,
    resumes: Family<Labels, Counter>,
    timeouts: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
}

/// The daemon's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

fn result(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "error"
    }
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("forkvm");
        let m = Metrics {
            spawns: Family::default(),
            // 10 ms to ~5 min.
            spawn_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            branches: Family::default(),
            // 0.5 ms to ~8 s.
            branch_pause_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 15)),
            pauses: Family::default(),
            resumes: Family::default(),
            timeouts: Family::default(),
            errors: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "spawns",
            "Sandboxes spawned (POST /v1/sandboxes), by result",
            m.spawns.clone(),
        );
        registry.register(
            "spawn_seconds",
            "Wall time of spawn requests",
            m.spawn_seconds.clone(),
        );
        registry.register(
            "branches",
            "Branches, by mode and result",
            m.branches.clone(),
        );
        registry.register(
            "branch_pause_seconds",
            "How long a branch's source was stopped",
            m.branch_pause_seconds.clone(),
        );
        registry.register("pauses", "Pauses, by reason and result", m.pauses.clone());
        registry.register("resumes", "Resumes, by result", m.resumes.clone());
        registry.register(
            "timeouts",
            "Timeouts that ran out, by action",
            m.timeouts.clone(),
        );
        registry.register(
            "errors",
            "API error responses, by error code",
            m.errors.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn spawned(&self, n: u64, ok: bool, seconds: f64) {
        self.spawns
            .get_or_create(&labels(&[("result", result(ok))]))
            .inc_by(n);
        self.spawn_seconds.observe(seconds);
    }

    pub fn branched(&self, mode: &str, ok: bool, pause_ms: Option<f64>) {
        self.branches
            .get_or_create(&labels(&[("mode", mode), ("result", result(ok))]))
            .inc();
        if let Some(p) = pause_ms {
            self.branch_pause_seconds.observe(p / 1000.0);
        }
    }

    pub fn paused(&self, reason: &str, ok: bool) {
        self.pauses
            .get_or_create(&labels(&[("reason", reason), ("result", result(ok))]))
            .inc();
    }

    pub fn resumed(&self, ok: bool) {
        self.resumes
            .get_or_create(&labels(&[("result", result(ok))]))
            .inc();
    }

    pub fn timed_out(&self, action: &str) {
        self.timeouts
            .get_or_create(&labels(&[("action", action)]))
            .inc();
    }

    pub fn error(&self, code: &str) {
        self.errors.get_or_create(&labels(&[("code", code)])).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode_registry;

    #[test]
    fn counters_render_in_the_exposition_format() {
        METRICS.spawned(2, true, 0.4);
        METRICS.branched("diff", false, Some(9.5));
        METRICS.error("conflict");
        let mut out = String::new();
        encode_registry(&mut out, &METRICS.registry).unwrap();
        assert!(out.contains("forkvm_spawns_total{result=\"ok\"}"), "{out}");
        assert!(
            out.contains("forkvm_branches_total{mode=\"diff\",result=\"error\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("forkvm_errors_total{code=\"conflict\"}"),
            "{out}"
        );
        assert!(out.contains("forkvm_spawn_seconds_bucket"), "{out}");
    }
}
