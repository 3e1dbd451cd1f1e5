//! The engine's error: what kind of failure (a [`ErrorKind`]), what happened
//! (a message), what the caller can do next (a [`Hint`], named as an action
//! rather than as one client's command) and, when there is one, the lower
//! error that caused it.
//!
//! Nothing here knows about HTTP. Each front-end maps a kind to its own
//! protocol in one place: the REST API in `api::error` (by the wire code's
//! status, [`forkvm_api::codes::status_of`]), the E2B API in `e2b`, and MCP in
//! `mcp` (as a tool error carrying the code).

use std::sync::Arc;

use forkvm_api::codes;
pub use forkvm_api::types::HintAction;

use crate::agent::AgentError;

/// What kind of failure an [`EngineError`] is. Each kind has one wire code
/// ([`ErrorKind::code`]); front-ends derive their statuses from the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The caller's request is malformed or names impossible values.
    Invalid,
    /// The caller did not prove who it is.
    Unauthorized,
    /// The request is understood and refused for what it names (a volume
    /// source inside forkvm's home). Its wire code is `invalid_request`.
    Forbidden,
    NotFound,
    ImageNotFound,
    /// The target is not in a state that allows the operation.
    Conflict,
    SnapshotCorrupt,
    TooLarge,
    /// The caller was too slow sending its request.
    RequestTimeout,
    /// A count limit (sandboxes, requests, subscribers) is reached.
    LimitExceeded,
    /// The guest agent reported an error or went away.
    Guest,
    GuestTimeout,
    QemuFailed,
    NetworkFailed,
    /// This host cannot give sandboxes a network.
    NetworkUnavailable,
    RegistryAuthFailed,
    InvalidImage,
    IncompatibleSnapshot,
    BuildFailed,
    RegistryUnreachable,
    /// The disk holding the daemon's home is full (or under its reserve).
    NoSpace,
    /// The host's memory commitment or jail uids would be passed.
    CapacityExceeded,
    /// A bug, or a host failure with no better kind.
    Internal,
}

impl ErrorKind {
    /// Every kind, for tables and tests.
    pub const ALL: [ErrorKind; 23] = [
        ErrorKind::Invalid,
        ErrorKind::Unauthorized,
        ErrorKind::Forbidden,
        ErrorKind::NotFound,
        ErrorKind::ImageNotFound,
        ErrorKind::Conflict,
        ErrorKind::SnapshotCorrupt,
        ErrorKind::TooLarge,
        ErrorKind::RequestTimeout,
        ErrorKind::LimitExceeded,
        ErrorKind::Guest,
        ErrorKind::GuestTimeout,
        ErrorKind::QemuFailed,
        ErrorKind::NetworkFailed,
        ErrorKind::NetworkUnavailable,
        ErrorKind::RegistryAuthFailed,
        ErrorKind::InvalidImage,
        ErrorKind::IncompatibleSnapshot,
        ErrorKind::BuildFailed,
        ErrorKind::RegistryUnreachable,
        ErrorKind::NoSpace,
        ErrorKind::CapacityExceeded,
        ErrorKind::Internal,
    ];

    /// The machine-readable code sent to clients ([`forkvm_api::codes`]).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::Invalid => codes::INVALID_REQUEST,
            ErrorKind::Unauthorized => codes::UNAUTHORIZED,
            ErrorKind::Forbidden => codes::INVALID_REQUEST,
            ErrorKind::NotFound => codes::NOT_FOUND,
            ErrorKind::ImageNotFound => codes::IMAGE_NOT_FOUND,
            ErrorKind::Conflict => codes::CONFLICT,
            ErrorKind::SnapshotCorrupt => codes::SNAPSHOT_CORRUPT,
            ErrorKind::TooLarge => codes::PAYLOAD_TOO_LARGE,
            ErrorKind::RequestTimeout => codes::REQUEST_TIMEOUT,
            ErrorKind::LimitExceeded => codes::LIMIT_EXCEEDED,
            ErrorKind::Guest => codes::GUEST_ERROR,
            ErrorKind::GuestTimeout => codes::GUEST_TIMEOUT,
            ErrorKind::QemuFailed => codes::QEMU_FAILED,
            ErrorKind::NetworkFailed => codes::NETWORK_FAILED,
            ErrorKind::NetworkUnavailable => codes::NETWORK_UNAVAILABLE,
            ErrorKind::RegistryAuthFailed => codes::REGISTRY_AUTH_FAILED,
            ErrorKind::InvalidImage => codes::INVALID_IMAGE,
            ErrorKind::IncompatibleSnapshot => codes::INCOMPATIBLE_SNAPSHOT,
            ErrorKind::BuildFailed => codes::BUILD_FAILED,
            ErrorKind::RegistryUnreachable => codes::REGISTRY_UNREACHABLE,
            ErrorKind::NoSpace => codes::NO_SPACE,
            ErrorKind::CapacityExceeded => codes::CAPACITY_EXCEEDED,
            ErrorKind::Internal => codes::INTERNAL,
        }
    }

    /// True when the fault is the host's or the guest's rather than the
    /// caller's: what is logged as a warning and counted as a failure.
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            ErrorKind::Guest
                | ErrorKind::GuestTimeout
                | ErrorKind::QemuFailed
                | ErrorKind::NetworkFailed
                | ErrorKind::NetworkUnavailable
                | ErrorKind::RegistryUnreachable
                | ErrorKind::NoSpace
                | ErrorKind::CapacityExceeded
                | ErrorKind::Internal
        )
    }
}

/// A next step for the caller: an action and what it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub action: HintAction,
    pub target: Option<String>,
}

impl Hint {
    /// The hint in plain words, for clients with no wording of their own.
    pub fn words(&self) -> String {
        self.action.words(self.target.as_deref())
    }
}

/// The engine's error. `Display` gives the message followed by the hint's
/// plain words, which is what a client without its own wording shows.
#[derive(Debug, Clone)]
pub struct EngineError {
    pub kind: ErrorKind,
    pub message: String,
    pub hint: Option<Hint>,
    /// The lower error, kept for logs and `std::error::Error::source`.
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl PartialEq for EngineError {
    fn eq(&self, o: &Self) -> bool {
        self.kind == o.kind && self.message == o.message && self.hint == o.hint
    }
}
impl Eq for EngineError {}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.hint {
            Some(h) => write!(f, "{}; {}", self.message, h.words()),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl EngineError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            message: message.into(),
            hint: None,
            source: None,
        }
    }
    /// The error as clients receive it: the message with the hint in
    /// words, and the hint as an action for clients that word it themselves.
    pub fn to_wire(&self) -> forkvm_api::ErrorDetail {
        forkvm_api::ErrorDetail {
            code: self.code().to_string(),
            message: self.to_string(),
            hint: self.hint.as_ref().map(|h| forkvm_api::types::ErrorHint {
                action: h.action,
                target: h.target.clone(),
            }),
        }
    }
    /// The wire code of this error's kind.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
    /// Add what the caller can do next.
    pub fn hint(mut self, action: HintAction) -> Self {
        self.hint = Some(Hint {
            action,
            target: None,
        });
        self
    }
    /// Add what the caller can do next, to `target`.
    pub fn hint_on(mut self, action: HintAction, target: impl Into<String>) -> Self {
        self.hint = Some(Hint {
            action,
            target: Some(target.into()),
        });
        self
    }
    /// Keep the lower error that caused this one.
    pub fn caused_by(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(e));
        self
    }
    pub fn invalid(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, m)
    }
    /// A host-side failure; a full disk among its causes makes it
    /// [`ErrorKind::NoSpace`] ([`classify`]).
    pub fn internal(m: impl Into<String>) -> Self {
        classify(Self::new(ErrorKind::Internal, m))
    }
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::not_found(format!("no sandbox with id {id:?}")).hint(HintAction::ListSandboxes)
    }
}

/// True for an error text that is a full disk, from whichever layer wrote
/// it: the kernel's `ENOSPC` ("No space left on device", os error 28), or
/// SQLite's `SQLITE_FULL` ("database or disk is full").
pub fn is_no_space(message: &str) -> bool {
    message.contains("No space left on device")
        || message.contains("os error 28")
        || message.contains("database or disk is full")
        || message.contains("Disk quota exceeded")
}

/// An internal error whose cause is a full disk becomes
/// [`ErrorKind::NoSpace`], with what to do. Errors reach the engine as text
/// from many layers (I/O, SQLite, QEMU and qemu-img over QMP), so the text is
/// what can be classified.
pub fn classify(e: EngineError) -> EngineError {
    if e.kind == ErrorKind::Internal && is_no_space(&e.message) {
        let message = format!("{}; the disk holding FORKVM_HOME is full", e.message);
        return EngineError {
            kind: ErrorKind::NoSpace,
            message,
            hint: Some(Hint {
                action: HintAction::FreeSpace,
                target: None,
            }),
            source: e.source,
        };
    }
    e
}

/// The engine error for a failed request to the guest agent of sandbox `id`.
pub fn agent_error(id: &str, e: AgentError) -> EngineError {
    match e {
        AgentError::Timeout(d) => EngineError::new(
            ErrorKind::GuestTimeout,
            format!("the guest agent of {id} did not answer within {d:?}; the guest may be hung"),
        )
        .hint_on(HintAction::ReadLogs, id),
        AgentError::Guest { code, message } => {
            let kind = match code.as_str() {
                forkvm_agent_protocol::ERR_NOT_FOUND => ErrorKind::NotFound,
                forkvm_agent_protocol::ERR_TOO_LARGE => ErrorKind::TooLarge,
                forkvm_agent_protocol::ERR_INVALID | forkvm_agent_protocol::ERR_SPAWN => {
                    ErrorKind::Invalid
                }
                _ => ErrorKind::Guest,
            };
            EngineError::new(kind, message)
        }
        // The sandbox runs an agent from an older snapshot or template: a
        // state of the sandbox, which a rebuilt template fixes.
        e @ AgentError::Unsupported { .. } => EngineError::conflict(format!("sandbox {id}: {e}")),
        AgentError::InvalidArchive(m) => EngineError::invalid(format!(
            "the archive is not a tar this daemon can send: {m}"
        )),
        other => {
            EngineError::new(ErrorKind::Guest, other.to_string()).hint_on(HintAction::ReadLogs, id)
        }
    }
}

/// Log a failed operation `what` on sandbox `id` (failures of the guest or
/// the host as warnings, the caller's mistakes at debug level) and hand the
/// error on.
pub fn logged(id: &str, what: &str, e: EngineError) -> EngineError {
    if e.kind.is_fault() {
        tracing::warn!(sandbox = %id, code = e.code(), "{what} in sandbox {id} failed: {e}");
    } else {
        tracing::debug!(sandbox = %id, code = e.code(), "{what} in sandbox {id} refused: {e}");
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_disks_are_recognised_from_every_layer() {
        assert!(is_no_space("write: No space left on device (os error 28)"));
        assert!(is_no_space("database or disk is full"));
        assert!(is_no_space("qemu-img: Could not write: os error 28"));
        assert!(!is_no_space("Could not open backing file"));
        assert!(!is_no_space(""));
    }

    #[test]
    fn only_internal_errors_become_507() {
        let e = classify(EngineError::internal(
            "cannot write memory.img: No space left on device",
        ));
        assert_eq!(e.kind, ErrorKind::NoSpace);
        assert_eq!(e.code(), codes::NO_SPACE);
        assert_eq!(
            e.hint.as_ref().map(|h| h.action),
            Some(HintAction::FreeSpace)
        );
        let e = classify(EngineError::internal("QEMU crashed"));
        assert_eq!(e.kind, ErrorKind::Internal);
        // A client's own mistake stays what it is.
        let e = classify(EngineError::invalid("No space left on device"));
        assert_eq!(e.kind, ErrorKind::Invalid);
    }

    #[test]
    fn agent_errors_map_to_statuses_that_say_what_to_do() {
        let old = agent_error(
            "sb-1",
            AgentError::Unsupported {
                what: "run background processes".into(),
            },
        );
        assert_eq!(old.kind, ErrorKind::Conflict);
        assert!(
            old.message.contains("sb-1") && old.message.contains("rebuild the template"),
            "{}",
            old.message
        );
        let gone = |code: &str| {
            agent_error(
                "sb-1",
                AgentError::Guest {
                    code: code.into(),
                    message: "m".into(),
                },
            )
            .kind
        };
        assert_eq!(
            gone(forkvm_agent_protocol::ERR_NOT_FOUND),
            ErrorKind::NotFound
        );
        assert_eq!(gone(forkvm_agent_protocol::ERR_INVALID), ErrorKind::Invalid);
        assert_eq!(gone(forkvm_agent_protocol::ERR_IO), ErrorKind::Guest);
        let bad = agent_error("sb-1", AgentError::InvalidArchive("x".into()));
        assert_eq!(bad.kind, ErrorKind::Invalid);
    }
    #[test]
    fn every_kind_has_a_code_in_the_wire_table() {
        use ErrorKind::*;
        for k in ErrorKind::ALL {
            let status = codes::status_of(k.code());
            // Only `internal` may fall to the table's default of 500.
            assert!(k == Internal || k.code() != codes::INTERNAL, "{k:?}");
            // A fault of the host or guest is never reported as the caller's.
            assert_eq!(k.is_fault(), status >= 500, "{k:?} is {status}");
        }
    }

    #[test]
    fn the_hint_is_kept_apart_and_shown_in_words() {
        let e = EngineError::conflict("sandbox sb-1 is paused")
            .hint_on(HintAction::ResumeSandbox, "sb-1");
        assert_eq!(e.message, "sandbox sb-1 is paused");
        assert_eq!(
            e.to_string(),
            "sandbox sb-1 is paused; resume sandbox sb-1 first"
        );
        let w = e.to_wire();
        assert_eq!(
            (w.code.as_str(), w.message.as_str()),
            ("conflict", e.to_string().as_str())
        );
        assert_eq!(w.hint.unwrap().target.as_deref(), Some("sb-1"));
        let io = std::io::Error::other("disk gone");
        let e = EngineError::internal("cannot write").caused_by(io);
        assert_eq!(
            std::error::Error::source(&e).unwrap().to_string(),
            "disk gone"
        );
    }

    /// Engine messages reach E2B and MCP clients verbatim, so they name
    /// actions (hints), never one client's commands. Front-end modules may.
    #[test]
    fn engine_messages_name_no_cli_command() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut bad = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let p = e.path();
                let rel = p
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if rel.starts_with("api") || rel.starts_with("e2b") || rel == "mcp.rs" {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.trim_start();
                    if code.starts_with("//") || rel == "error.rs" {
                        continue;
                    }
                    if code.contains("`forkvm ") {
                        bad.push(format!("{rel}:{}: {code}", n + 1));
                    }
                }
            }
        }
        assert!(
            bad.is_empty(),
            "CLI commands in engine messages:\n{}",
            bad.join("\n")
        );
    }
}
