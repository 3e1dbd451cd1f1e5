//! The tools: their names, argument types (whose JSON schemas the clients
//! see), descriptions and argument checks; their results are in
//! [`crate::render`].
//!
//! Everything here is pure: a tool call is parsed and checked into one of
//! the REST API's request types ([`forkvm_api`]), the [`Backend`] runs it,
//! and its answer is rendered into a tool result. So the daemon and the CLI
//! serve the same tools with the same checks and the same words.
//!
//! [`Backend`]: crate::Backend

use std::collections::BTreeMap;

use base64::Engine;
use forkvm_api::{BranchRequest, CreateSandbox, CreateSnapshot, ExecRequest};
use rmcp::model::{Tool, ToolAnnotations};
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::render::*;
pub use crate::timetravel::{
    checkpoint_request, rewind_request, CheckpointArgs, CheckpointTakenOut, RewindArgs, RewoundOut,
    TimelineArgs, TimelineOut,
};
pub use crate::treediff::{diff_request, merge_request, DiffArgs, DiffOut, MergeArgs, MergedOut};

// ---------------------------------------------------------------- arguments

/// Arguments of `create_sandbox`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// Image to boot (e.g. "default", which has python3). Leave out with
    /// `snapshot`; with neither, the daemon's default image is used.
    #[serde(default)]
    pub image: Option<String>,
    /// Snapshot id or tag to start from instead of an image: the new sandbox
    /// resumes exactly where the snapshotted one was.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Guest memory in MiB (default: the daemon's).
    #[serde(default)]
    pub memory_mib: Option<u32>,
    /// Virtual CPUs (default: the daemon's).
    #[serde(default)]
    pub cpus: Option<u32>,
    /// Environment variables for every command run in the sandbox.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Remove the sandbox by itself after this many seconds (default: never).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Arguments of `run_command`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// Id of the sandbox (from create_sandbox or list_sandboxes).
    pub sandbox_id: String,
    /// A shell command line, run with `sh -c` (pipes, redirections and `&&`
    /// work). Give this or `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// The program and its arguments, run without a shell. Give this or
    /// `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory (absolute; default: the image's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Text given to the command's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Kill the command after this many seconds (default: the daemon's
    /// maximum).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Arguments of `run_python`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPythonArgs {
    /// Id of the sandbox (from create_sandbox or list_sandboxes).
    pub sandbox_id: String,
    /// Python 3 source code; it runs as a script (`python3 -`), so print
    /// what you want to see.
    pub code: String,
    /// Working directory (absolute; default: the image's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Kill the program after this many seconds (default: the daemon's
    /// maximum).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// How file content is given or returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Text,
    /// Base64 of the raw bytes (for binary files).
    Base64,
}

/// Arguments of `read_file`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Id of the sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file in the sandbox, e.g. /root/notes.txt.
    pub path: String,
    /// "text" (default; a file that is not UTF-8 comes back as base64 anyway)
    /// or "base64".
    #[serde(default)]
    pub encoding: Option<Encoding>,
}

/// Arguments of `write_file`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Id of the sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file in the sandbox; missing parent directories
    /// are created, an existing file is replaced.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// "text" (default) or "base64" (content is base64 of the bytes).
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Octal permission bits, e.g. "755" (default "644").
    #[serde(default)]
    pub mode: Option<String>,
}

/// Arguments of `list_files`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Id of the sandbox.
    pub sandbox_id: String,
    /// Absolute path of the directory, e.g. /root.
    pub path: String,
    /// How many levels down to list (1 to 10, default 1: the directory's own
    /// entries).
    #[serde(default)]
    pub depth: Option<u32>,
}

/// Arguments of `branch_sandbox`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchArgs {
    /// Id of the running sandbox to branch; it keeps running.
    pub sandbox_id: String,
    /// How many children (1 to 16, default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// A tag for the branch point's snapshot, to start more sandboxes from
    /// it later with create_sandbox.
    #[serde(default)]
    pub tag: Option<String>,
}

/// Arguments of `snapshot_sandbox`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// Id of the running sandbox; it keeps running.
    pub sandbox_id: String,
    /// A unique tag to name the snapshot by.
    #[serde(default)]
    pub tag: Option<String>,
}

/// Arguments of `list_sandboxes`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxesArgs {}

/// Arguments of `remove_sandbox`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveArgs {
    /// Id of the sandbox to stop and delete with everything in it.
    pub sandbox_id: String,
}

// -------------------------------------------------------------- the catalog

/// A tool's name, as clients call it.
pub mod names {
    pub const CREATE: &str = "create_sandbox";
    pub const RUN_COMMAND: &str = "run_command";
    pub const RUN_PYTHON: &str = "run_python";
    pub const READ_FILE: &str = "read_file";
    pub const WRITE_FILE: &str = "write_file";
    pub const LIST_FILES: &str = "list_files";
    pub const BRANCH: &str = "branch_sandbox";
    pub const SNAPSHOT: &str = "snapshot_sandbox";
    pub const LIST_SANDBOXES: &str = "list_sandboxes";
    pub const REMOVE: &str = "remove_sandbox";
    pub const CHECKPOINT: &str = "checkpoint";
    pub const TIMELINE: &str = "timeline";
    pub const REWIND: &str = "rewind";
    pub const DIFF: &str = "diff";
    pub const MERGE: &str = "merge";
}

fn tool<A: JsonSchema + 'static, O: JsonSchema + 'static>(
    name: &'static str,
    title: &str,
    description: &'static str,
    annotations: ToolAnnotations,
) -> Tool {
    let mut t = Tool::new(name, description, tidied::<A>())
        .with_title(title)
        .with_annotations(annotations.with_title(title));
    t.output_schema = Some(tidied::<O>());
    t
}

/// A type's JSON schema as rmcp derives it, tidied ([`crate::schema`]).
fn tidied<T: JsonSchema + 'static>() -> std::sync::Arc<serde_json::Map<String, serde_json::Value>> {
    let mut s = (*rmcp::handler::server::common::schema_for_type::<T>()).clone();
    crate::schema::tidy(&mut s);
    std::sync::Arc::new(s)
}

trait WithTitle {
    fn with_title(self, title: &str) -> Self;
}

impl WithTitle for ToolAnnotations {
    fn with_title(mut self, title: &str) -> Self {
        self.title = Some(title.to_string());
        self
    }
}

/// Every tool, in the order clients list them.
pub fn catalog() -> Vec<Tool> {
    use names::*;
    let ro = || ToolAnnotations::default().read_only(true).open_world(false);
    let rw = |destructive: bool| {
        ToolAnnotations::default()
            .read_only(false)
            .destructive(destructive)
            .open_world(false)
    };
    vec![
        tool::<CreateArgs, SandboxOut>(
            CREATE,
            "Create a sandbox",
            "Start a new sandbox: a Linux microVM with its own disk, processes and network. \
             Boot it from an image (`image`, e.g. \"default\", which has python3) or resume it \
             from a snapshot (`snapshot`, from snapshot_sandbox or branch_sandbox). Returns its \
             id, which every other tool takes as `sandbox_id`. Remove it with remove_sandbox \
             when done.",
            rw(false),
        ),
        tool::<RunCommandArgs, ExecOut>(
            RUN_COMMAND,
            "Run a command",
            "Run a command in a sandbox and wait for it to finish. Give `command` (a shell \
             line, run with sh -c) or `argv` (a program and its arguments, no shell). Returns \
             the exit code, stdout and stderr; a non-zero exit code is a normal result, not an \
             error.",
            rw(true),
        ),
        tool::<RunPythonArgs, ExecOut>(
            RUN_PYTHON,
            "Run Python code",
            "Run Python 3 code in a sandbox (as a script fed to `python3 -`) and wait for it to \
             finish. Print what you want to see. Returns the exit code, stdout and stderr (a \
             traceback is in stderr). State does not persist between calls except through \
             files.",
            rw(true),
        ),
        tool::<ReadFileArgs, FileOut>(
            READ_FILE,
            "Read a file",
            "Read a whole file from a sandbox by its absolute path. Text comes back as is; a \
             file that is not UTF-8 comes back base64-encoded (see `encoding` in the result).",
            ro(),
        ),
        tool::<WriteFileArgs, WrittenOut>(
            WRITE_FILE,
            "Write a file",
            "Write a whole file in a sandbox (atomically; an existing file is replaced, missing \
             parent directories are created). Content is text, or base64 with encoding \
             \"base64\".",
            rw(true),
        ),
        tool::<ListFilesArgs, ListOut>(
            LIST_FILES,
            "List a directory",
            "List the entries of a directory in a sandbox: name, path, kind (file, dir, \
             symlink) and size. `depth` lists subdirectories too.",
            ro(),
        ),
        tool::<BranchArgs, BranchOut>(
            BRANCH,
            "Branch a sandbox",
            "Fork a running sandbox: snapshot it at this instant (it keeps running) and start \
             `count` children that each continue from that instant with a copy of its memory, \
             processes and files. Returns the children's ids. Use it to try several approaches \
             from the same state.",
            rw(false),
        ),
        tool::<SnapshotArgs, SnapshotOut>(
            SNAPSHOT,
            "Snapshot a sandbox",
            "Save a running sandbox's whole state (memory and disk) as a snapshot; the sandbox \
             keeps running. Start new sandboxes from it with create_sandbox's `snapshot`.",
            rw(false),
        ),
        tool::<ListSandboxesArgs, SandboxesOut>(
            LIST_SANDBOXES,
            "List sandboxes",
            "List every sandbox with its id, state and image.",
            ro(),
        ),
        tool::<RemoveArgs, RemovedOut>(
            REMOVE,
            "Remove a sandbox",
            "Stop a sandbox and delete it with everything in it. Its snapshots stay.",
            rw(true),
        ),
        tool::<CheckpointArgs, CheckpointTakenOut>(
            CHECKPOINT,
            "Checkpoint a sandbox",
            "Save a running sandbox's whole state (memory, processes, files) as the next step \
             of its timeline; it keeps running, stopped only briefly. Each checkpoint stores \
             only what changed since the previous one. Take one before a risky step; go back \
             with rewind. `keep_last` (and `keep_every`) set how many to keep: older untagged \
             ones are pruned.",
            rw(true),
        ),
        tool::<TimelineArgs, TimelineOut>(
            TIMELINE,
            "List a sandbox's checkpoints",
            "List a sandbox's kept checkpoints, oldest first: step, id, tag, time and size, \
             with its retention policy.",
            ro(),
        ),
        tool::<RewindArgs, RewoundOut>(
            REWIND,
            "Rewind a sandbox",
            "Bring a running sandbox back to one of its checkpoints (`to`: id or tag): same \
             sandbox id, network and ports, with the memory, processes and files of that \
             checkpoint. What happened since is lost unless `checkpoint_first` saves it first \
             (the result's `undo` is then the checkpoint to rewind to to undo this).",
            rw(true),
        ),
        tool::<DiffArgs, DiffOut>(
            DIFF,
            "Diff the files of two sandboxes",
            "Compare the files of two sandboxes, snapshots or checkpoints (`a` and `b`, e.g. a \
             sandbox and a branch child of it, or a sandbox and one of its checkpoints): added, \
             deleted, modified paths and mode changes, with counts. Lists the first `limit` \
             changes and counts the rest by directory; give `path` to look at one directory. \
             `patches` adds unified diffs of text files (use it with a narrow path).",
            ro(),
        ),
        tool::<MergeArgs, MergedOut>(
            MERGE,
            "Merge a branch child's files",
            "Apply the file changes a sandbox made since it was branched (`sandbox_id`, a \
             branch child) to a running sandbox (`into`, usually the one it was branched from). \
             Three-way: a path both changed differently is a conflict, and then nothing is \
             changed unless `strategy` settles it (ours, theirs or text). `dry_run` lists what \
             would be applied and every conflict. Memory is not merged.",
            rw(true),
        ),
    ]
}

// ---------------------------------------------------------------- checking

/// An argument error: the call is refused as invalid params, before the
/// backend sees it.
pub fn invalid(tool: &str, msg: impl std::fmt::Display) -> ErrorData {
    ErrorData::invalid_params(
        format!("{tool}: {msg} (see the tool's inputSchema in tools/list)"),
        None,
    )
}

/// Parse a call's arguments (absent arguments are an empty object).
pub fn parse<A: serde::de::DeserializeOwned>(
    tool: &str,
    args: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<A, ErrorData> {
    let v = serde_json::Value::Object(args.unwrap_or_default());
    serde_path_to_error::deserialize(v).map_err(|e| {
        let at = e.path().to_string();
        let e = e.into_inner();
        if at == "." {
            invalid(tool, format!("bad arguments: {e}"))
        } else {
            invalid(tool, format!("bad argument {at}: {e}"))
        }
    })
}

pub(crate) fn need_id(tool: &str, id: &str) -> Result<(), ErrorData> {
    if id.trim().is_empty() {
        return Err(invalid(
            tool,
            "sandbox_id is empty; get one from create_sandbox or list_sandboxes",
        ));
    }
    Ok(())
}

fn need_abs(tool: &str, what: &str, path: &str) -> Result<(), ErrorData> {
    if !path.starts_with('/') {
        return Err(invalid(
            tool,
            format!("{what} {path:?} is not absolute; give a path like /root/file.txt"),
        ));
    }
    Ok(())
}

fn timeout_ms(tool: &str, secs: Option<u64>) -> Result<Option<u64>, ErrorData> {
    match secs {
        Some(0) => Err(invalid(tool, "timeout_secs must be at least 1")),
        Some(s) => Ok(Some(s.saturating_mul(1000))),
        None => Ok(None),
    }
}

/// `create_sandbox`'s request.
pub fn create_request(a: CreateArgs) -> Result<CreateSandbox, ErrorData> {
    let t = names::CREATE;
    if a.image.is_some() && a.snapshot.is_some() {
        return Err(invalid(
            t,
            "give `image` or `snapshot`, not both (a snapshot already has its image)",
        ));
    }
    for (what, v) in [("image", &a.image), ("snapshot", &a.snapshot)] {
        if v.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(invalid(t, format!("{what} is empty; leave it out instead")));
        }
    }
    if a.timeout_secs == Some(0) {
        return Err(invalid(t, "timeout_secs must be at least 1"));
    }
    Ok(CreateSandbox {
        image: a.image,
        snapshot: a.snapshot,
        memory_mib: a.memory_mib,
        cpus: a.cpus,
        env: a.env,
        timeout: a.timeout_secs,
        ..Default::default()
    })
}

/// `run_command`'s sandbox and request.
pub fn command_request(a: RunCommandArgs) -> Result<(String, ExecRequest), ErrorData> {
    let t = names::RUN_COMMAND;
    need_id(t, &a.sandbox_id)?;
    let argv = match (a.command, a.argv) {
        (Some(_), Some(_)) => return Err(invalid(t, "give `command` or `argv`, not both")),
        (None, None) => {
            return Err(invalid(
                t,
                "give `command` (a shell line) or `argv` (a program and its arguments)",
            ))
        }
        (Some(c), None) if c.trim().is_empty() => return Err(invalid(t, "command is empty")),
        (Some(c), None) => vec!["sh".to_string(), "-c".to_string(), c],
        (None, Some(v)) if v.first().is_none_or(|p| p.is_empty()) => {
            return Err(invalid(
                t,
                "argv must start with a program, e.g. [\"ls\", \"-l\", \"/\"]",
            ))
        }
        (None, Some(v)) => v,
    };
    if let Some(cwd) = &a.cwd {
        need_abs(t, "cwd", cwd)?;
    }
    Ok((
        a.sandbox_id,
        ExecRequest {
            argv,
            env: a.env.unwrap_or_default(),
            cwd: a.cwd,
            stdin: a.stdin,
            timeout_ms: timeout_ms(t, a.timeout_secs)?,
            ..Default::default()
        },
    ))
}

/// The environment variable that marks a tool call's command and all its
/// descendants, so a cancelled call can find and kill them in the guest
/// (the agent's exec gives the host no pid to signal).
pub const MARKER_VAR: &str = "FORKVM_MCP_CALL";

/// A marker unique to one call of this process.
pub fn call_marker() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The command that kills every process whose environment carries
/// `marker`: a shell loop over /proc (`sh` and `grep`, which every image
/// with a shell has). Its own environment lacks the marker, so it is
/// spared.
pub fn kill_request(marker: &str) -> ExecRequest {
    let script = format!(
        "for d in /proc/[0-9]*; do \
           grep -qF '{MARKER_VAR}={marker}' \"$d/environ\" 2>/dev/null && kill -KILL \"${{d#/proc/}}\" 2>/dev/null; \
         done; exit 0"
    );
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script],
        timeout_ms: Some(20_000),
        ..Default::default()
    }
}

/// `run_python`'s sandbox and request: the code goes in on stdin, so its
/// size is not bound by the kernel's limit on one argument.
pub fn python_request(a: RunPythonArgs) -> Result<(String, ExecRequest), ErrorData> {
    let t = names::RUN_PYTHON;
    need_id(t, &a.sandbox_id)?;
    if a.code.trim().is_empty() {
        return Err(invalid(t, "code is empty"));
    }
    if let Some(cwd) = &a.cwd {
        need_abs(t, "cwd", cwd)?;
    }
    Ok((
        a.sandbox_id,
        ExecRequest {
            argv: vec!["python3".into(), "-".into()],
            cwd: a.cwd,
            stdin: Some(a.code),
            timeout_ms: timeout_ms(t, a.timeout_secs)?,
            ..Default::default()
        },
    ))
}

/// Check `read_file`'s arguments.
pub fn check_read(a: &ReadFileArgs) -> Result<(), ErrorData> {
    need_id(names::READ_FILE, &a.sandbox_id)?;
    need_abs(names::READ_FILE, "path", &a.path)
}

/// `write_file`'s bytes and mode.
pub fn write_request(a: &WriteFileArgs) -> Result<(Vec<u8>, Option<u32>), ErrorData> {
    let t = names::WRITE_FILE;
    need_id(t, &a.sandbox_id)?;
    need_abs(t, "path", &a.path)?;
    let data = match a.encoding.unwrap_or_default() {
        Encoding::Text => a.content.clone().into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(a.content.trim().as_bytes())
            .map_err(|e| invalid(t, format!("content is not valid base64: {e}")))?,
    };
    let mode = match &a.mode {
        None => None,
        Some(s) => Some(
            u32::from_str_radix(s.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    invalid(t, format!("mode {s:?} is not an octal mode like \"644\""))
                })?,
        ),
    };
    Ok((data, mode))
}

/// `list_files`'s depth.
pub fn list_depth(a: &ListFilesArgs) -> Result<u32, ErrorData> {
    let t = names::LIST_FILES;
    need_id(t, &a.sandbox_id)?;
    need_abs(t, "path", &a.path)?;
    match a.depth.unwrap_or(1) {
        d @ 1..=10 => Ok(d),
        d => Err(invalid(
            t,
            format!("depth {d} is out of range; use 1 to 10"),
        )),
    }
}

/// `branch_sandbox`'s request.
pub fn branch_request(a: &BranchArgs) -> Result<BranchRequest, ErrorData> {
    let t = names::BRANCH;
    need_id(t, &a.sandbox_id)?;
    let count = a.count.unwrap_or(1);
    if !(1..=16).contains(&count) {
        return Err(invalid(
            t,
            format!("count {count} is out of range; use 1 to 16"),
        ));
    }
    Ok(BranchRequest {
        count: Some(count),
        tag: a.tag.clone(),
        ..Default::default()
    })
}

/// `snapshot_sandbox`'s request.
pub fn snapshot_request(a: &SnapshotArgs) -> Result<CreateSnapshot, ErrorData> {
    need_id(names::SNAPSHOT, &a.sandbox_id)?;
    Ok(CreateSnapshot { tag: a.tag.clone() })
}

/// Check `remove_sandbox`'s arguments.
pub fn check_remove(a: &RemoveArgs) -> Result<(), ErrorData> {
    need_id(names::REMOVE, &a.sandbox_id)
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
