//! What the tools return: the result types (whose JSON schemas are the
//! tools' output schemas) and the rendering of the REST API's answers into
//! them, with a text for the model beside each.

use base64::Engine;
use forkvm_api::{BranchResult, EntryList, ExecResult, FileWritten, Sandbox, Snapshot};
use schemars::JsonSchema;
use serde::Serialize;

use crate::tools::Encoding;

// ------------------------------------------------------------------ results

/// A sandbox, as tools return it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct SandboxOut {
    /// Its id: pass it as `sandbox_id` to the other tools.
    pub id: String,
    /// running, paused, stopped or failed.
    pub state: String,
    /// The image it booted from.
    pub image: String,
    /// The snapshot it started from, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub memory_mib: u32,
    pub cpus: u32,
    pub created_at: String,
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ExecOut {
    /// Exit code; absent if a signal ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether it was killed for running past its timeout.
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    /// Whether output was cut at the daemon's limit.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

/// A file's content.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct FileOut {
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// How `content` is encoded: text or base64.
    pub encoding: Encoding,
    pub content: String,
}

/// A file written.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct WrittenOut {
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct EntryOut {
    pub name: String,
    pub path: String,
    /// file, dir, symlink or other.
    pub kind: String,
    pub size: u64,
}

/// A directory listing.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ListOut {
    pub path: String,
    pub entries: Vec<EntryOut>,
}

/// A branch.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct BranchOut {
    /// The snapshot of the branch point.
    pub snapshot_id: String,
    /// The children's sandbox ids, each running from the branch point.
    pub children: Vec<String>,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct SnapshotOut {
    /// Pass it as `snapshot` to create_sandbox.
    pub snapshot_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The sandbox it was taken of.
    pub source: String,
}

/// Every sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct SandboxesOut {
    pub sandboxes: Vec<SandboxOut>,
}

/// A sandbox removed.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct RemovedOut {
    pub removed: String,
}

// --------------------------------------------------------------- rendering

/// A sandbox as tools show it.
pub fn sandbox_out(s: &Sandbox) -> SandboxOut {
    let state = serde_json::to_value(s.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", s.state).to_lowercase());
    SandboxOut {
        id: s.id.clone(),
        state,
        image: s.image.clone(),
        snapshot: s.snapshot.clone(),
        memory_mib: s.memory_mib,
        cpus: s.cpus,
        created_at: s.created_at.clone(),
    }
}

/// A command's result, and its text for the model.
pub fn exec_out(r: ExecResult) -> (ExecOut, String) {
    let out = ExecOut {
        exit_code: r.exit_code,
        signal: r.signal,
        timed_out: r.timed_out,
        stdout: r.stdout,
        stderr: r.stderr,
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        duration_ms: r.duration_ms,
    };
    let mut text = match (out.exit_code, out.signal) {
        _ if out.timed_out => "timed out: killed after its timeout".to_string(),
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "ended".to_string(),
    };
    for (name, body, cut) in [
        ("stdout", &out.stdout, out.stdout_truncated),
        ("stderr", &out.stderr, out.stderr_truncated),
    ] {
        if !body.is_empty() {
            text.push_str(&format!("\n--- {name} ---\n{body}"));
            if !body.ends_with('\n') {
                text.push('\n');
            }
            if cut {
                text.push_str(&format!(
                    "[{name} truncated at the daemon's output limit]\n"
                ));
            }
        }
    }
    (out, text)
}

/// A file's content: as text if it is UTF-8 and text was asked for,
/// otherwise base64.
pub fn file_out(path: String, data: Vec<u8>, want: Encoding) -> FileOut {
    let size = data.len() as u64;
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    match want {
        Encoding::Base64 => FileOut {
            path,
            size,
            encoding: Encoding::Base64,
            content: b64(&data),
        },
        Encoding::Text => match String::from_utf8(data) {
            Ok(s) => FileOut {
                path,
                size,
                encoding: Encoding::Text,
                content: s,
            },
            Err(e) => FileOut {
                path,
                size,
                encoding: Encoding::Base64,
                content: b64(e.as_bytes()),
            },
        },
    }
}

/// A write's result.
pub fn written_out(w: FileWritten) -> WrittenOut {
    WrittenOut {
        path: w.path,
        size: w.size,
    }
}

/// A listing, and its text (one entry a line, directories with a slash).
pub fn list_out(path: String, l: EntryList) -> (ListOut, String) {
    let entries: Vec<EntryOut> = l
        .entries
        .into_iter()
        .map(|e| EntryOut {
            kind: serde_json::to_value(e.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "other".into()),
            name: e.name,
            path: e.path,
            size: e.size,
        })
        .collect();
    let mut text = format!("{} ({} entries)\n", path, entries.len());
    for e in &entries {
        let slash = if e.kind == "dir" { "/" } else { "" };
        text.push_str(&format!("{}{slash}\t{}\t{}\n", e.path, e.kind, e.size));
    }
    (ListOut { path, entries }, text)
}

/// A branch's result.
pub fn branch_out(r: &BranchResult) -> BranchOut {
    BranchOut {
        snapshot_id: r.snapshot.id.clone(),
        children: r.children.iter().map(|c| c.id.clone()).collect(),
    }
}

/// A snapshot's result.
pub fn snapshot_out(s: &Snapshot) -> SnapshotOut {
    SnapshotOut {
        snapshot_id: s.id.clone(),
        tag: s.tag.clone(),
        source: s.source.clone(),
    }
}
