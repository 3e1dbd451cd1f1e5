//! The table of API operations: one typed action per route.
//!
//! The daemon's router is built by matching on [`Op`], so a route cannot exist
//! without an entry here, and the OpenAPI drift test compares this table with
//! the checked-in document.

/// One API operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Health,
    Info,
    CreateSandbox,
    ListSandboxes,
    GetSandbox,
    DeleteSandbox,
    Exec,
    WriteFile,
    ReadFile,
    Logs,
    Ports,
    Snapshot,
    Branch,
    ListSnapshots,
    GetSnapshot,
    DeleteSnapshot,
    SetPool,
    FlattenSnapshot,
    PinSnapshot,
    UnpinSnapshot,
    PruneSnapshots,
    ListImages,
    GetImage,
    DeleteImage,
    PullImage,
    ImportImage,
    BuildImage,
    SetTimeout,
    Pause,
    Resume,
    Metrics,
}

/// Every operation with its method and path (axum/OpenAPI `{param}` syntax).
pub const ROUTES: &[(Op, &str, &str)] = &[
    (Op::Health, "GET", "/v1/health"),
    (Op::Info, "GET", "/v1/info"),
    (Op::CreateSandbox, "POST", "/v1/sandboxes"),
    (Op::ListSandboxes, "GET", "/v1/sandboxes"),
    (Op::GetSandbox, "GET", "/v1/sandboxes/{id}"),
    (Op::DeleteSandbox, "DELETE", "/v1/sandboxes/{id}"),
    (Op::Exec, "POST", "/v1/sandboxes/{id}/exec"),
    (Op::WriteFile, "PUT", "/v1/sandboxes/{id}/files"),
    (Op::ReadFile, "GET", "/v1/sandboxes/{id}/files"),
    (Op::Logs, "GET", "/v1/sandboxes/{id}/logs"),
    (Op::Ports, "GET", "/v1/sandboxes/{id}/ports"),
    (Op::Snapshot, "POST", "/v1/sandboxes/{id}/snapshot"),
    (Op::Branch, "POST", "/v1/sandboxes/{id}/branch"),
    (Op::ListSnapshots, "GET", "/v1/snapshots"),
    (Op::GetSnapshot, "GET", "/v1/snapshots/{id}"),
    (Op::DeleteSnapshot, "DELETE", "/v1/snapshots/{id}"),
    (Op::SetPool, "PUT", "/v1/snapshots/{id}/pool"),
    (Op::FlattenSnapshot, "POST", "/v1/snapshots/{id}/flatten"),
    (Op::PinSnapshot, "PUT", "/v1/snapshots/{id}/pin"),
    (Op::UnpinSnapshot, "DELETE", "/v1/snapshots/{id}/pin"),
    // A static segment: it shadows the snapshot tag `prune`, which is
    // therefore refused (see Manager::check_tag).
    (Op::PruneSnapshots, "POST", "/v1/snapshots/prune"),
    (Op::ListImages, "GET", "/v1/images"),
    (Op::GetImage, "GET", "/v1/images/{name}"),
    (Op::DeleteImage, "DELETE", "/v1/images/{name}"),
    (Op::PullImage, "POST", "/v1/images"),
    // Static segments: image names `import` and `build` are refused.
    (Op::ImportImage, "POST", "/v1/images/import"),
    (Op::BuildImage, "POST", "/v1/images/build"),
    (Op::SetTimeout, "PUT", "/v1/sandboxes/{id}/timeout"),
    (Op::Pause, "POST", "/v1/sandboxes/{id}/pause"),
    (Op::Resume, "POST", "/v1/sandboxes/{id}/resume"),
    // Where Prometheus looks by default; behind the same auth as the API.
    (Op::Metrics, "GET", "/metrics"),
];
