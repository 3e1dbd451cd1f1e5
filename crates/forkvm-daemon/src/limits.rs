//! Per-sandbox resource limits (docs/limits.md), applied to a running QEMU:
//!
//! | limit | how |
//! |---|---|
//! | `cpu_percent` | cgroup `cpu.max` (v2) or `cpu.cfs_quota_us` (v1) |
//! | `memory_overhead_mib` | cgroup `memory.max` / `memory.limit_in_bytes` = guest RAM + overhead |
//! | `pids` | cgroup `pids.max` |
//! | `disk_iops`, `disk_bps` | QEMU block throttling on the disk's device (`block_set_io_throttle`) |
//! | `net_kbps` | a `tbf` qdisc on both ends of the guest's path in its namespace: the tap (to the guest) and the uplink (from it) |
//!
//! Block throttling is set on the device, not as a node in the block graph,
//! so snapshots and disk streaming see the same graph as without limits.
//! Neither it nor the qdiscs travel in a snapshot: a restore (a child, a
//! resume) applies its limits again.

use std::time::Duration;

use forkvm_api::SandboxLimits;

use crate::error::ApiError;
use crate::sandbox::Manager;

/// Check limits before anything is created.
pub fn check(l: &SandboxLimits, max_cpus: u32) -> Result<(), ApiError> {
    let bad = |what: &str, range: String| {
        Err(ApiError::invalid(format!("limits.{what} must be {range}")))
    };
    if let Some(c) = l.cpu_percent {
        if c == 0 || c > 100 * max_cpus {
            return bad(
                "cpu_percent",
                format!("between 1 and {} (percent of one core)", 100 * max_cpus),
            );
        }
    }
    if let Some(m) = l.memory_overhead_mib {
        if !(64..=65_536).contains(&m) {
            return bad(
                "memory_overhead_mib",
                "between 64 and 65536 (QEMU needs some)".into(),
            );
        }
    }
    if l.disk_iops == Some(0) {
        return bad("disk_iops", "at least 1".into());
    }
    if l.disk_bps.is_some_and(|b| b < 4096) {
        return bad("disk_bps", "at least 4096".into());
    }
    if l.net_kbps.is_some_and(|k| k < 8) {
        return bad("net_kbps", "at least 8".into());
    }
    if l.pids.is_some_and(|p| p < 32) {
        return bad("pids", "at least 32 (QEMU's own threads count)".into());
    }
    Ok(())
}

/// The `tbf` qdisc for a rate: a burst of a tenth of a second (at least
/// 16 KiB, so a full-size packet always fits) and 50 ms of queue.
fn tbf_args(kbps: u64) -> Vec<String> {
    let burst = (kbps * 1000 / 8 / 10).max(16 * 1024);
    vec![
        "tbf".into(),
        "rate".into(),
        format!("{kbps}kbit"),
        "burst".into(),
        format!("{burst}b"),
        "latency".into(),
        "50ms".into(),
    ]
}

impl Manager {
    /// Apply `l` to the running sandbox `id`.
    pub(crate) async fn apply_limits(&self, id: &str, l: &SandboxLimits) -> Result<(), ApiError> {
        if l.is_empty() {
            return Ok(());
        }
        let live = self.running(id)?;
        if l.disk_iops.is_some() || l.disk_bps.is_some() {
            self.throttle_disk(&live.paths.qmp, l).await?;
        }
        if let Some(k) = l.net_kbps {
            self.shape_net(id, k).await?;
        }
        self.apply_cgroup_limits(id, live.pid, l)?;
        tracing::info!(sandbox = %id, limits = ?l, "limits of sandbox {id} applied");
        Ok(())
    }

    async fn throttle_disk(
        &self,
        qmp: &std::path::Path,
        l: &SandboxLimits,
    ) -> Result<(), ApiError> {
        let q = forkvm_qemu::Qmp::connect(qmp, Duration::from_secs(10))
            .await
            .map_err(|e| {
                ApiError::internal(format!("cannot reach QMP to throttle the disk: {e}"))
            })?;
        let blocks = q
            .execute("query-block", None)
            .await
            .map_err(|e| ApiError::internal(format!("query-block: {e}")))?;
        // The virtio-blk device's QOM path: the device has no id of its own
        // (an id would change the device's migration path, and old
        // snapshots would no longer restore).
        let qdev = blocks
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|b| b.get("inserted").and(b["qdev"].as_str()))
            .ok_or_else(|| ApiError::internal("the sandbox's disk device was not found"))?
            .to_string();
        q.execute(
            "block_set_io_throttle",
            Some(serde_json::json!({
                "id": qdev,
                "iops": l.disk_iops.unwrap_or(0),
                "iops_rd": 0,
                "iops_wr": 0,
                "bps": l.disk_bps.unwrap_or(0),
                "bps_rd": 0,
                "bps_wr": 0,
            })),
        )
        .await
        .map_err(|e| ApiError::internal(format!("cannot throttle the disk: {e}")))?;
        Ok(())
    }

    async fn shape_net(&self, id: &str, kbps: u64) -> Result<(), ApiError> {
        let ns = forkvm_net::ns_name(id);
        for dev in [forkvm_net::TAP_NAME, forkvm_net::UPLINK_NAME] {
            if !std::path::Path::new("/run/netns").join(&ns).exists() {
                return Err(ApiError::invalid(
                    "limits.net_kbps needs a network: the sandbox has none",
                ));
            }
            let mut args: Vec<String> = ["-n", &ns, "qdisc", "replace", "dev", dev, "root"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend(tbf_args(kbps));
            let out = tokio::process::Command::new("tc")
                .args(&args)
                .output()
                .await
                .map_err(|e| ApiError::internal(format!("cannot run tc (iproute2): {e}")))?;
            // A sandbox with `network: none` has a tap but no uplink.
            let no_uplink = dev == forkvm_net::UPLINK_NAME
                && String::from_utf8_lossy(&out.stderr).contains("Cannot find device");
            if !out.status.success() && !no_uplink {
                return Err(ApiError::internal(format!(
                    "tc {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        Ok(())
    }

    /// CPU, memory and pids limits need a cgroup (the jail's).
    fn apply_cgroup_limits(&self, _id: &str, _pid: u32, l: &SandboxLimits) -> Result<(), ApiError> {
        if l.cpu_percent.is_some() || l.memory_overhead_mib.is_some() || l.pids.is_some() {
            return Err(ApiError::invalid(
                "limits.cpu_percent, memory_overhead_mib and pids need the sandbox's cgroup, which this daemon does not make",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        let ok = SandboxLimits {
            cpu_percent: Some(50),
            memory_overhead_mib: Some(256),
            disk_iops: Some(100),
            disk_bps: Some(1 << 20),
            net_kbps: Some(1000),
            pids: Some(128),
        };
        assert!(check(&ok, 4).is_ok());
        for bad in [
            SandboxLimits {
                cpu_percent: Some(0),
                ..ok.clone()
            },
            SandboxLimits {
                cpu_percent: Some(401),
                ..ok.clone()
            },
            SandboxLimits {
                memory_overhead_mib: Some(1),
                ..ok.clone()
            },
            SandboxLimits {
                disk_iops: Some(0),
                ..ok.clone()
            },
            SandboxLimits {
                disk_bps: Some(10),
                ..ok.clone()
            },
            SandboxLimits {
                net_kbps: Some(1),
                ..ok.clone()
            },
            SandboxLimits {
                pids: Some(2),
                ..ok.clone()
            },
        ] {
            assert!(check(&bad, 4).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tbf_bursts_fit_a_packet() {
        assert_eq!(tbf_args(8)[4], "16384b");
        assert_eq!(tbf_args(80_000)[4], "1000000b");
    }
}
