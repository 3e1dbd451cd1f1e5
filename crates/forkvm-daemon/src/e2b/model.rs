//! The JSON bodies of E2B's control plane, as the `e2b` SDKs (major version 2)
//! send and parse them. Field names are E2B's (camelCase, with its `ID`/`MB`
//! spellings); requests ignore fields forkvm has no use for, so a newer SDK
//! that adds one still works.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// An image name or a snapshot id or tag.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox ends (E2B's default: 15).
    pub timeout: Option<u64>,
    /// Pause instead of kill when the timeout runs out.
    pub auto_pause: Option<bool>,
    /// With `autoPause`: `false` keeps only the disk at that pause.
    pub auto_pause_memory: Option<bool>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    /// `false`: no network at all.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// MCP gateways inside the sandbox: not offered.
    pub mcp: Option<serde_json::Value>,
    /// Volumes: not offered.
    pub volume_mounts: Option<Vec<serde_json::Value>>,
    /// Egress rules (`allowOut`, `denyOut`), mapped onto the allow-list
    /// (super::network).
    pub network: Option<serde_json::Value>,
}

impl NewSandbox {
    /// `autoPause` (with `autoPauseMemory: false`, a filesystem-only pause).
    pub fn on_timeout(&self) -> Option<forkvm_api::OnTimeout> {
        match (self.auto_pause, self.auto_pause_memory) {
            (Some(true), Some(false)) => Some(forkvm_api::OnTimeout::PauseFilesystem),
            (Some(true), _) => Some(forkvm_api::OnTimeout::Pause),
            _ => None,
        }
    }
}

/// A created, connected or forked sandbox (E2B's `Sandbox`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    pub envd_access_token: String,
    /// No per-port traffic token: published ports are forkvm's own.
    pub traffic_access_token: Option<String>,
    /// No domain: the SDK reaches the sandbox through `E2B_SANDBOX_URL`.
    pub domain: Option<String>,
}

/// `GET /sandboxes` and `GET /v2/sandboxes` items (E2B's `ListedSandbox`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: String,
    pub end_at: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: &'static str,
    pub envd_version: String,
    pub metadata: BTreeMap<String, String>,
}

/// `GET /sandboxes/{id}` (E2B's `SandboxDetail`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    pub envd_access_token: String,
    pub domain: Option<String>,
    pub lifecycle: Lifecycle,
    pub allow_internet_access: bool,
}

/// What happens at the end of a sandbox's timeout.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: &'static str,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub struct TimeoutRequest {
    pub timeout: u64,
}

/// `POST /sandboxes/{id}/refreshes`.
#[derive(Debug, Default, Deserialize)]
pub struct RefreshRequest {
    pub duration: Option<u64>,
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect` and
/// `POST /sandboxes/{id}/resume`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    pub timeout: Option<u64>,
    /// Resume: pause instead of kill at the end of the new timeout.
    pub auto_pause: Option<bool>,
    /// `false`: a paused sandbox cold-boots from its disk (`on_resume:
    /// "reboot"`).
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause` (the body is optional).
#[derive(Debug, Default, Deserialize)]
pub struct PauseRequest {
    /// `false`: keep only the disk (`keep_memory=False`, `mode="filesystem"`).
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Default, Deserialize)]
pub struct ForkRequest {
    /// The children's timeout in seconds (E2B's default: 15).
    pub timeout: Option<u64>,
    /// How many children (E2B's default: 1).
    pub count: Option<u32>,
}

/// One entry of a fork's answer: a child, or why it could not start.
#[derive(Debug, Serialize)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<CreatedSandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// E2B's error body.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
pub struct SnapshotRequest {
    pub name: Option<String>,
    /// `false`: a filesystem-only snapshot (`mode="filesystem"`), refused
    /// (super::snapshots::unsupported).
    pub memory: Option<bool>,
}

/// A snapshot made by `POST /sandboxes/{id}/snapshots` (E2B's `SnapshotInfo`).
#[derive(Debug, Serialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// One sample of `GET /sandboxes/{id}/metrics` (E2B's `SandboxMetric`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    pub timestamp: String,
    pub timestamp_unix: u64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sandbox_takes_the_sdk_body_and_ignores_unknown_fields() {
        let b: NewSandbox = serde_json::from_value(serde_json::json!({
            "templateID": "base", "timeout": 300, "autoPause": false,
            "autoPauseMemory": true, "secure": true, "metadata": {"a": "b"},
            "envVars": {"X": "1"}, "allow_internet_access": true, "someday": 1
        }))
        .unwrap();
        assert_eq!(b.template_id, "base");
        assert_eq!(b.timeout, Some(300));
        assert_eq!(b.env_vars.unwrap()["X"], "1");
        assert_eq!(b.auto_pause_memory, Some(true));
        assert!(
            serde_json::from_str::<NewSandbox>("{}").is_err(),
            "templateID is required"
        );
    }

    #[test]
    fn created_sandbox_uses_e2b_names() {
        let v = serde_json::to_value(CreatedSandbox {
            template_id: "base".into(),
            sandbox_id: "sb-1".into(),
            client_id: "forkvm".into(),
            envd_version: "0.1.0".into(),
            envd_access_token: "t".into(),
            traffic_access_token: None,
            domain: None,
        })
        .unwrap();
        for k in [
            "templateID",
            "sandboxID",
            "clientID",
            "envdVersion",
            "envdAccessToken",
        ] {
            assert!(v.get(k).is_some(), "{k} missing from {v}");
        }
    }
}
