//! The error body every endpoint answers with (`{"error": {...}}`): a code
//! from [`crate::codes`], a message, and an optional hint naming the next
//! step as an action (`HintAction`), which each client words its own way.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A machine-readable code and a message saying what to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// One of the codes in [`crate::codes`].
    pub code: String,
    /// What went wrong, ending with the hint in plain words when there is one.
    pub message: String,
    /// What the caller can do next, as an action each client words its own
    /// way (the CLI names its command; an SDK user reads `message`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<ErrorHint>,
}

/// A next step named as an action on the API, not as one client's command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorHint {
    pub action: HintAction,
    /// The sandbox, snapshot, image or volume the action applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The actions an error can point to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HintAction {
    ListSandboxes,
    ListSnapshots,
    ListImages,
    ListProcesses,
    /// Remove the target sandbox.
    RemoveSandbox,
    /// Remove some sandboxes (a limit was reached).
    RemoveSandboxes,
    ResumeSandbox,
    /// Read the target sandbox's console log.
    ReadLogs,
    /// Free disk space: prune snapshots, remove images or sandboxes.
    FreeSpace,
    RemoveSnapshot,
    /// Remove the target snapshot and everything made from it.
    ForceRemoveSnapshot,
    FlattenSnapshot,
    PushSnapshot,
    /// Check the host's setup (KVM, network, cgroups).
    CheckHost,
    CreateVolume,
    RemoveVolume,
    /// Pull, import or build the image.
    GetImage,
    RemoveImage,
    /// Import a rootfs tarball as an image.
    ImportImage,
}

impl HintAction {
    /// The action in plain words, for any client.
    pub fn words(self, target: Option<&str>) -> String {
        let t = |noun: &str| match target {
            Some(t) => format!("{noun} {t}"),
            None => noun.to_string(),
        };
        match self {
            HintAction::ListSandboxes => "list the sandboxes".into(),
            HintAction::ListSnapshots => "list the snapshots".into(),
            HintAction::ListImages => "list the images".into(),
            HintAction::ListProcesses => format!("list the running processes of {}", t("sandbox")),
            HintAction::RemoveSandbox => format!("remove {}", t("sandbox")),
            HintAction::RemoveSandboxes => "remove some sandboxes".into(),
            HintAction::ResumeSandbox => format!("resume {} first", t("sandbox")),
            HintAction::ReadLogs => format!("read the console log of {}", t("sandbox")),
            HintAction::FreeSpace => {
                "free space by pruning snapshots or removing images or sandboxes".into()
            }
            HintAction::RemoveSnapshot => format!("remove {} first", t("snapshot")),
            HintAction::ForceRemoveSnapshot => {
                format!(
                    "remove those first, or force the removal of {}",
                    t("snapshot")
                )
            }
            HintAction::FlattenSnapshot => format!("flatten {} first", t("snapshot")),
            HintAction::PushSnapshot => "push the snapshot to the registry first".into(),
            HintAction::CheckHost => "check the host's setup".into(),
            HintAction::CreateVolume => format!("create {} first", t("volume")),
            HintAction::RemoveVolume => format!("use it, or remove {}", t("volume")),
            HintAction::GetImage => "pull, import or build the image first".into(),
            HintAction::RemoveImage => format!("replace it, or remove {} first", t("image")),
            HintAction::ImportImage => "start from an image (import a rootfs tarball)".into(),
        }
    }
}
