//! Where each operation goes.
//!
//! [`route`] is an exhaustive match on [`Op`]: adding an operation to the
//! API fails to compile here until someone decides how a cluster serves it.

use forkvm_api::routes::Op;

/// How the gateway serves an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Answered by the gateway itself.
    Gateway,
    /// `{id}` is a sandbox: to the node its id names.
    Sandbox,
    /// `{id}` is a snapshot id or tag: to a node that holds it (the node its
    /// id names first).
    Snapshot,
    /// Sent to every node that holds the snapshot (a copy pulled by another
    /// node is its own; deleting a snapshot deletes every copy).
    SnapshotEverywhere,
    /// A spawn: placed by [`crate::place`].
    Place,
    /// A branch: children on the source's node first, the rest elsewhere.
    Branch,
    /// Asked of every live node and merged.
    Merge,
    /// Sent to every live node (the first failure is the answer).
    Broadcast,
    /// Sent to one node, chosen as for a spawn of nothing in particular.
    AnyNode,
}

/// The route of `op`.
pub fn route(op: Op) -> Route {
    use Route::*;
    match op {
        Op::Health | Op::Info => Gateway,
        Op::CreateSandbox => Place,
        Op::Branch => Branch,
        Op::ListSandboxes
        | Op::ListSnapshots
        | Op::ListImages
        | Op::ListVolumes
        | Op::Metrics
        | Op::Events => Merge,
        Op::GetSandbox
        | Op::DeleteSandbox
        | Op::Exec
        | Op::WriteFile
        | Op::ReadFile
        | Op::Logs
        | Op::Ports
        | Op::Snapshot
        | Op::SetTimeout
        | Op::SetNetwork
        | Op::Pause
        | Op::Resume
        // A sandbox's checkpoints live on its node, as its snapshots do.
        | Op::Checkpoint
        | Op::GetTimeline
        | Op::SetRetention
        | Op::Rewind
        | Op::Merge
        | Op::StartProcess
        | Op::ListProcesses
        | Op::AttachProcess
        | Op::WriteStdin
        | Op::CloseStdin
        | Op::SignalProcess
        | Op::KillProcess
        | Op::ResizePty
        | Op::StatFile
        | Op::FileExists
        | Op::ListDir
        | Op::MakeDir
        | Op::MoveFile
        | Op::RemoveFile
        | Op::WatchDir
        | Op::CreateWatcher
        | Op::PollWatcher
        | Op::RemoveWatcher
        | Op::DownloadArchive
        | Op::UploadArchive => Sandbox,
        Op::GetSnapshot
        | Op::SetPool
        | Op::FlattenSnapshot
        | Op::PinSnapshot
        | Op::UnpinSnapshot
        | Op::PushSnapshot
        // Either side names its node; both must be on it.
        | Op::Diff => Snapshot,
        Op::DeleteSnapshot => SnapshotEverywhere,
        // Each node collects its own branch points; a named volume is a
        // directory on each node (not shared storage), made or removed on
        // all of them so a sandbox finds it wherever it is placed.
        Op::PruneSnapshots | Op::CreateVolume | Op::DeleteVolume | Op::DeleteImage => Broadcast,
        // An image is pulled, imported or built on one node; spawns of it are
        // placed where it is, and snapshots carry it to other nodes.
        Op::GetImage | Op::PullImage | Op::ImportImage | Op::BuildImage | Op::PullSnapshot => {
            AnyNode
        }
    }
}

/// The node a sandbox or snapshot id names: `sb-NODE-HEX` or `sn-NODE-HEX`.
/// Ids made by a daemon without a node name (`sb-HEX`) name none.
pub fn node_of(id: &str) -> Option<&str> {
    let mut parts = id.split('-');
    let kind = parts.next()?;
    let node = parts.next()?;
    let hex = parts.next()?;
    if parts.next().is_some() || !matches!(kind, "sb" | "sn") || node.is_empty() {
        return None;
    }
    let node_ok = node
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let hex_ok = !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit());
    (node_ok && hex_ok).then_some(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkvm_api::routes::ROUTES;

    #[test]
    fn ids_name_their_node() {
        assert_eq!(node_of("sb-n1-0123456789ab"), Some("n1"));
        assert_eq!(node_of("sn-gpu7-abcdef012345"), Some("gpu7"));
        assert_eq!(node_of("sb-0123456789ab"), None);
        assert_eq!(node_of("sb-N1-0123456789ab"), None);
        assert_eq!(node_of("xx-n1-0123456789ab"), None);
        assert_eq!(node_of("sb-n1-zz"), None);
        assert_eq!(node_of("sb-n1-01-02"), None);
        assert_eq!(node_of("warm"), None);
        assert_eq!(node_of(""), None);
    }

    #[test]
    fn every_route_with_a_sandbox_id_goes_to_its_node() {
        for (op, _, path) in ROUTES {
            if path.starts_with("/v1/sandboxes/{id}") && route(*op) != Route::Branch {
                assert_eq!(route(*op), Route::Sandbox, "{op:?} {path}");
            }
            if path.starts_with("/v1/snapshots/{id}") {
                assert!(
                    matches!(route(*op), Route::Snapshot | Route::SnapshotEverywhere),
                    "{op:?} {path}"
                );
            }
        }
    }
}
