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

use crate::error::{EngineError, HintAction};
use crate::manager::Manager;

/// Check limits before anything is created.
pub fn check(l: &SandboxLimits, max_cpus: u32) -> Result<(), EngineError> {
    let bad = |what: &str, range: String| {
        Err(EngineError::invalid(format!(
            "limits.{what} must be {range}"
        )))
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
    pub async fn apply_limits(&self, id: &str, l: &SandboxLimits) -> Result<(), EngineError> {
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
        let ram = self.db.get(id)?.map_or(0, |r| u64::from(r.memory_mib));
        self.apply_cgroup_limits(id, ram, l)?;
        tracing::info!(sandbox = %id, limits = ?l, "limits of sandbox {id} applied");
        Ok(())
    }

    async fn throttle_disk(
        &self,
        qmp: &std::path::Path,
        l: &SandboxLimits,
    ) -> Result<(), EngineError> {
        let q = forkvm_qemu::Qmp::connect(qmp, Duration::from_secs(10))
            .await
            .map_err(|e| {
                EngineError::internal(format!("cannot reach QMP to throttle the disk: {e}"))
            })?;
        let blocks = q
            .execute("query-block", None)
            .await
            .map_err(|e| EngineError::internal(format!("query-block: {e}")))?;
        // The virtio-blk device's QOM path: the device has no id of its own
        // (an id would change the device's migration path, and old
        // snapshots would no longer restore).
        let qdev = blocks
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|b| b.get("inserted").and(b["qdev"].as_str()))
            .ok_or_else(|| EngineError::internal("the sandbox's disk device was not found"))?
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
        .map_err(|e| EngineError::internal(format!("cannot throttle the disk: {e}")))?;
        Ok(())
    }

    async fn shape_net(&self, id: &str, kbps: u64) -> Result<(), EngineError> {
        let ns = forkvm_net::ns_name(id);
        for dev in [forkvm_net::TAP_NAME, forkvm_net::UPLINK_NAME] {
            if !std::path::Path::new("/run/netns").join(&ns).exists() {
                return Err(EngineError::invalid(
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
                .map_err(|e| EngineError::internal(format!("cannot run tc (iproute2): {e}")))?;
            // A sandbox with `network: none` has a tap but no uplink.
            let no_uplink = dev == forkvm_net::UPLINK_NAME
                && String::from_utf8_lossy(&out.stderr).contains("Cannot find device");
            if !out.status.success() && !no_uplink {
                return Err(EngineError::internal(format!(
                    "tc {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        Ok(())
    }

    /// CPU, memory and pids limits: written into the sandbox's own cgroup,
    /// which the jail gives every QEMU (crate::jail).
    fn apply_cgroup_limits(
        &self,
        id: &str,
        ram_mib: u64,
        l: &SandboxLimits,
    ) -> Result<(), EngineError> {
        if l.cpu_percent.is_none() && l.memory_overhead_mib.is_none() && l.pids.is_none() {
            return Ok(());
        }
        let cg = match self.jail.cgroup(id) {
            Some(cg) if self.jail.enabled => cg,
            _ => {
                return Err(EngineError::invalid(
                    "limits.cpu_percent, memory_overhead_mib and pids need the sandbox's own \
                     cgroup, which only a jailed QEMU has: run the daemon without --no-jail, on a \
                     host with cgroups",
                )
                .hint(HintAction::CheckHost))
            }
        };
        for (controller, file, value) in cgroup_settings(cg.is_v2(), ram_mib, l) {
            cg.set(controller, file, &value).map_err(|e| {
                EngineError::internal(format!(
                    "cannot set {file} of sandbox {id}'s cgroup to {value}: {e}"
                ))
            })?;
        }
        Ok(())
    }
}

/// CFS period of a CPU quota: 100 ms, the kernel's default.
const CPU_PERIOD_US: u64 = 100_000;

/// The (controller, file, value) writes for the cgroup limits of `l`.
fn cgroup_settings(
    v2: bool,
    ram_mib: u64,
    l: &SandboxLimits,
) -> Vec<(&'static str, &'static str, String)> {
    let mut w = Vec::new();
    if let Some(p) = l.cpu_percent {
        let quota = u64::from(p) * CPU_PERIOD_US / 100;
        if v2 {
            w.push(("cpu", "cpu.max", format!("{quota} {CPU_PERIOD_US}")));
        } else {
            w.push(("cpu", "cpu.cfs_period_us", CPU_PERIOD_US.to_string()));
            w.push(("cpu", "cpu.cfs_quota_us", quota.to_string()));
        }
    }
    if let Some(o) = l.memory_overhead_mib {
        let bytes = ((ram_mib + u64::from(o)) << 20).to_string();
        w.push((
            "memory",
            if v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            },
            bytes,
        ));
    }
    if let Some(n) = l.pids {
        w.push(("pids", "pids.max", n.to_string()));
    }
    w
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
    fn cgroup_files_for_each_layout() {
        let l = SandboxLimits {
            cpu_percent: Some(50),
            memory_overhead_mib: Some(256),
            pids: Some(128),
            ..Default::default()
        };
        let v2 = cgroup_settings(true, 512, &l);
        assert_eq!(
            v2,
            vec![
                ("cpu", "cpu.max", "50000 100000".to_string()),
                ("memory", "memory.max", (768u64 << 20).to_string()),
                ("pids", "pids.max", "128".to_string()),
            ]
        );
        let v1 = cgroup_settings(false, 512, &l);
        assert_eq!(v1[0], ("cpu", "cpu.cfs_period_us", "100000".to_string()));
        assert_eq!(v1[1], ("cpu", "cpu.cfs_quota_us", "50000".to_string()));
        assert_eq!(v1[2].1, "memory.limit_in_bytes");
        assert!(cgroup_settings(true, 512, &SandboxLimits::default()).is_empty());
    }

    #[test]
    fn tbf_bursts_fit_a_packet() {
        assert_eq!(tbf_args(8)[4], "16384b");
        assert_eq!(tbf_args(80_000)[4], "1000000b");
    }
}
