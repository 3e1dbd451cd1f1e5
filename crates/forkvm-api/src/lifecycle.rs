//! Bodies of the lifetime operations: timeouts, pause and resume.
//!
//! A sandbox may carry a timeout (seconds). When it runs out the daemon
//! removes the sandbox, or pauses it when `on_timeout` is `pause` (or
//! `pause_filesystem`). A paused sandbox is saved to disk (a snapshot of
//! origin `pause`) and holds no RAM and no QEMU; `resume` brings it back with
//! the same id, network and published ports. A filesystem-only pause keeps
//! the disk and not the memory, and its resume cold-boots from that disk.
//! Time spent paused does not count against the timeout.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What happens when a sandbox's timeout runs out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Remove the sandbox and everything it had (the default).
    #[default]
    Kill,
    /// Pause it: it can be resumed later with its memory and disk.
    Pause,
    /// Pause it keeping only its disk (a pause with `memory: false`): the
    /// resume cold-boots from that disk, without the running processes.
    PauseFilesystem,
}

impl OnTimeout {
    /// Does this action pause (with or without the memory)?
    pub fn pauses(self) -> bool {
        matches!(self, OnTimeout::Pause | OnTimeout::PauseFilesystem)
    }
}

/// `POST /v1/sandboxes/{id}/pause` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// `false`: keep only the disk. The guest's page cache is written out
    /// (`sync`) and QEMU stopped; no memory is saved, and the resume
    /// cold-boots from the disk with the same id, metadata, environment,
    /// network and published ports, but none of the processes that ran.
    /// Default `true`: memory and disk, and the resume goes on where the
    /// guest stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// `PUT /v1/sandboxes/{id}/timeout`: a new timeout, counted from now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now (1 to 2,592,000, 30 days); `null` removes the
    /// timeout. On a paused sandbox it is the time it will have once resumed.
    pub timeout: Option<u64>,
    /// Also change what happens on expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

/// `POST /v1/sandboxes/{id}/resume`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// A new timeout in seconds from the resume. Omitted: the time the
    /// sandbox had left when it was paused, or, when it was paused because
    /// its timeout ran out, its whole timeout again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// `false`: cold-boot from the saved disk even when memory was saved
    /// (the memory stays stored, unused). A filesystem-only pause always
    /// resumes this way. Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// A sandbox's timeout as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Lifetime {
    /// The timeout last set, in seconds.
    pub timeout: u64,
    pub on_timeout: OnTimeout,
    /// RFC 3339 time the timeout runs out; absent while paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Seconds left: counts down while the sandbox runs, frozen while it is
    /// paused.
    pub remaining_s: f64,
}

/// A paused sandbox's saved state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PauseInfo {
    /// The snapshot holding it (origin `pause`; removed with the sandbox).
    /// Absent for a filesystem-only pause, whose disk stays in the
    /// sandbox's own files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// `false`: a filesystem-only pause, which saved no memory; the resume
    /// cold-boots from the disk.
    #[serde(default = "yes")]
    pub memory: bool,
    /// RFC 3339 time of the pause.
    pub paused_at: String,
    /// Why: `request` or `timeout`.
    pub reason: String,
    /// Memory bytes the pause stored: for a clone only the pages it changed
    /// since its snapshot.
    pub memory_bytes: u64,
    /// Disk bytes the pause stored (its frozen top layer).
    pub disk_bytes: u64,
    /// How long the vCPUs were stopped before QEMU went away.
    pub pause_ms: f64,
}

fn yes() -> bool {
    true
}

/// Resource limits of one sandbox, set at spawn and inherited by a branch's
/// children unless the branch overrides them (field by field). Omitted
/// fields are unlimited. See docs/limits.md for how each is enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxLimits {
    /// CPU time its QEMU may use, in percent of one host core (50: half a
    /// core; 200: two cores), whatever its vCPU count (cgroup `cpu.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<u32>,
    /// Memory QEMU may use beyond the guest's RAM, MiB (cgroup
    /// `memory.max` = RAM + this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_overhead_mib: Option<u32>,
    /// Disk operations per second, reads and writes together (QEMU block
    /// throttling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_iops: Option<u64>,
    /// Disk bytes per second, reads and writes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bps: Option<u64>,
    /// Network rate in each direction, kbit/s (tc on its link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_kbps: Option<u64>,
    /// Processes and threads its QEMU may have (cgroup `pids.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

impl SandboxLimits {
    /// These limits with every field `over` sets replacing this one's.
    pub fn merged(&self, over: &SandboxLimits) -> SandboxLimits {
        SandboxLimits {
            cpu_percent: over.cpu_percent.or(self.cpu_percent),
            memory_overhead_mib: over.memory_overhead_mib.or(self.memory_overhead_mib),
            disk_iops: over.disk_iops.or(self.disk_iops),
            disk_bps: over.disk_bps.or(self.disk_bps),
            net_kbps: over.net_kbps.or(self.net_kbps),
            pids: over.pids.or(self.pids),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == SandboxLimits::default()
    }
}

/// What a running sandbox has used (`GET /v1/sandboxes/{id}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// CPU time its QEMU has used (user + system), since it started.
    pub cpu_ms: u64,
    /// Host disk its own files take (allocated bytes of its disk overlays,
    /// logs and sockets; shared snapshot layers not included).
    pub disk_bytes: u64,
    /// Bytes the guest received and sent on its NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_rx_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_tx_bytes: Option<u64>,
}

/// Memory and disk capacity (`GET /v1/info`), as admission control counts
/// them (docs/lifetimes.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Capacity {
    /// The memory sandboxes may use in all (`serve --memory-commit-mib`).
    pub memory_commit_mib: u64,
    /// What running sandboxes use now: the sum of their QEMUs' PSS.
    pub memory_used_mib: u64,
    /// Held for spawns, branches and resumes still starting.
    pub memory_reserved_mib: u64,
    pub memory_left_mib: u64,
    /// Sandboxes whose memory was counted.
    pub counted_sandboxes: u32,
    /// Free space on the filesystem holding the daemon's home.
    pub disk_free_mib: u64,
    /// Below this much free space, new work is refused (`--disk-reserve-mib`).
    pub disk_reserve_mib: u64,
}

/// Metadata filters are query parameters `metadata.KEY=VALUE`
/// (`GET /v1/sandboxes?metadata.team=a&metadata.run=7`); a sandbox is listed
/// when it has every pair.
pub const METADATA_QUERY_PREFIX: &str = "metadata.";

/// Longest timeout a sandbox may have, in seconds (30 days).
pub const MAX_TIMEOUT_S: u64 = 30 * 24 * 3600;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_timeout_null_clears_and_unknown_fields_fail() {
        let s: SetTimeout = serde_json::from_str(r#"{"timeout":null}"#).unwrap();
        assert_eq!(s.timeout, None);
        let s: SetTimeout = serde_json::from_str(r#"{"timeout":5,"on_timeout":"pause"}"#).unwrap();
        assert_eq!((s.timeout, s.on_timeout), (Some(5), Some(OnTimeout::Pause)));
        assert!(serde_json::from_str::<SetTimeout>(r#"{"timeout":5,"x":1}"#).is_err());
        assert!(
            serde_json::from_str::<SetTimeout>(r#"{"timeout":5,"on_timeout":"stop"}"#).is_err()
        );
        let r: ResumeRequest = serde_json::from_str("{}").unwrap();
        let base = SandboxLimits {
            cpu_percent: Some(50),
            disk_iops: Some(100),
            ..Default::default()
        };
        let over = SandboxLimits {
            disk_iops: Some(10),
            pids: Some(64),
            ..Default::default()
        };
        let m = base.merged(&over);
        assert_eq!(
            (m.cpu_percent, m.disk_iops, m.pids, m.net_kbps),
            (Some(50), Some(10), Some(64), None)
        );
        assert!(SandboxLimits::default().is_empty() && !m.is_empty());
        assert!(serde_json::from_str::<SandboxLimits>(r#"{"cpu":1}"#).is_err());
        assert_eq!(r, ResumeRequest::default());
    }
}
