//! The time-travel tools: `checkpoint`, `timeline` and `rewind`
//! (docs/mcp.md). Their arguments, checks, results and the calls they make,
//! kept apart from [`crate::tools`] so each file stays readable.
//!
//! Retention is an argument of `checkpoint`, not a tool of its own: an
//! agent sets how many checkpoints to keep when it takes one (as
//! `forkvm checkpoint --keep-last` does), and every extra tool is one more
//! entry a model has to read and choose among.

use forkvm_api::{Checkpoint, CheckpointRequest, Retention, RewindRequest, Rewound, Timeline};
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::render::{sandbox_out, SandboxOut};
use crate::tools::{invalid, names, need_id};
use crate::{error_text, failed, structured, Backend};

// ---------------------------------------------------------------- arguments

/// Arguments of `checkpoint`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointArgs {
    /// Id of the running sandbox; it keeps running.
    pub sandbox_id: String,
    /// A unique name for the checkpoint, to rewind to by name; tagged
    /// checkpoints are never pruned.
    #[serde(default)]
    pub tag: Option<String>,
    /// Retention: keep only the last N checkpoints (1 or more; tagged ones
    /// and every `keep_every`th are kept too). Sets the sandbox's policy,
    /// which then applies after every checkpoint.
    #[serde(default)]
    pub keep_last: Option<u32>,
    /// Retention: also keep every Kth checkpoint by step number (1 or
    /// more). Give it with `keep_last`.
    #[serde(default)]
    pub keep_every: Option<u32>,
}

/// Arguments of `timeline`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimelineArgs {
    /// Id of the sandbox.
    pub sandbox_id: String,
}

/// Arguments of `rewind`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindArgs {
    /// Id of the running sandbox to bring back.
    pub sandbox_id: String,
    /// The checkpoint to go back to: its id (`sn-…`) or tag, from
    /// checkpoint or timeline.
    pub to: String,
    /// Checkpoint the present first, so the rewind can be undone by
    /// rewinding to that checkpoint (`undo` in the result). Default false:
    /// the present is lost.
    #[serde(default)]
    pub checkpoint_first: bool,
}

// ------------------------------------------------------------------ results

/// One checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct CheckpointOut {
    /// Pass it as `to` to rewind, or as `snapshot` to create_sandbox.
    pub checkpoint_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Its step number in the sandbox's timeline, from 1.
    pub seq: u64,
    pub created_at: String,
    /// How long the sandbox was stopped for it, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<f64>,
    /// Bytes stored for it alone (what changed since the previous one).
    pub bytes: u64,
}

/// A checkpoint taken.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct CheckpointTakenOut {
    pub sandbox_id: String,
    pub checkpoint: CheckpointOut,
}

/// A sandbox's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TimelineOut {
    pub sandbox_id: String,
    /// Its kept checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointOut>,
    /// The retention policy: keep the last N (absent: all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// The retention policy: also every Kth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_every: Option<u32>,
    /// What the kept checkpoints store together, in bytes.
    pub bytes: u64,
}

/// A rewind done.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct RewoundOut {
    /// The same sandbox (same id), now running from `to`.
    pub sandbox: SandboxOut,
    /// The checkpoint or snapshot it runs from now.
    pub to: String,
    /// With checkpoint_first: the checkpoint of the present; rewind to it
    /// to undo this rewind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undo: Option<String>,
    /// How long the rewind took, in milliseconds.
    pub rewind_ms: f64,
}

// ---------------------------------------------------------------- checking

fn count(tool: &str, what: &str, n: Option<u32>) -> Result<(), ErrorData> {
    if n == Some(0) {
        return Err(invalid(
            tool,
            format!("{what} must be at least 1 (leave keep_last out to keep every checkpoint)"),
        ));
    }
    Ok(())
}

/// `checkpoint`'s request, and the retention policy to set first (when
/// `keep_last` or `keep_every` is given).
pub fn checkpoint_request(
    a: &CheckpointArgs,
) -> Result<(CheckpointRequest, Option<Retention>), ErrorData> {
    let t = names::CHECKPOINT;
    need_id(t, &a.sandbox_id)?;
    if a.tag.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err(invalid(t, "tag is empty; leave it out instead"));
    }
    count(t, "keep_last", a.keep_last)?;
    count(t, "keep_every", a.keep_every)?;
    if a.keep_every.is_some() && a.keep_last.is_none() {
        return Err(invalid(
            t,
            "keep_every needs keep_last (without keep_last every checkpoint is kept anyway)",
        ));
    }
    let retention = a.keep_last.map(|_| Retention {
        keep_last: a.keep_last,
        keep_every: a.keep_every,
    });
    Ok((CheckpointRequest { tag: a.tag.clone() }, retention))
}

/// `rewind`'s request.
pub fn rewind_request(a: &RewindArgs) -> Result<RewindRequest, ErrorData> {
    let t = names::REWIND;
    need_id(t, &a.sandbox_id)?;
    if a.to.trim().is_empty() {
        return Err(invalid(
            t,
            "to is empty; give a checkpoint id or tag from timeline",
        ));
    }
    Ok(RewindRequest {
        to: a.to.clone(),
        checkpoint_first: a.checkpoint_first,
    })
}

// --------------------------------------------------------------- rendering

/// A checkpoint as tools show it.
pub fn checkpoint_out(c: &Checkpoint) -> CheckpointOut {
    CheckpointOut {
        checkpoint_id: c.id.clone(),
        tag: c.tag.clone(),
        seq: c.seq,
        created_at: c.created_at.clone(),
        pause_ms: c.pause_ms,
        bytes: c.bytes,
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn line(c: &CheckpointOut) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}",
        c.seq,
        c.checkpoint_id,
        c.tag.as_deref().unwrap_or("-"),
        c.created_at,
        mib(c.bytes)
    )
}

/// A timeline, and its text (one checkpoint a line).
pub fn timeline_out(t: &Timeline) -> (TimelineOut, String) {
    let out = TimelineOut {
        sandbox_id: t.sandbox.clone(),
        checkpoints: t.checkpoints.iter().map(checkpoint_out).collect(),
        keep_last: t.retention.keep_last,
        keep_every: t.retention.keep_every,
        bytes: t.bytes,
    };
    let mut text = format!(
        "sandbox {}: {} checkpoints, {} stored; keeping {}{}\nstep\tid\ttag\tcreated\tsize\n",
        out.sandbox_id,
        out.checkpoints.len(),
        mib(out.bytes),
        out.keep_last
            .map_or("all".into(), |n| format!("the last {n}")),
        out.keep_every
            .map_or(String::new(), |k| format!(" and every {k}th"))
    );
    for c in &out.checkpoints {
        text.push_str(&line(c));
        text.push('\n');
    }
    (out, text)
}

/// A rewind's result, and its text.
pub fn rewound_out(r: &Rewound) -> (RewoundOut, String) {
    let out = RewoundOut {
        sandbox: sandbox_out(&r.sandbox),
        to: r.to.clone(),
        undo: r.undo.as_ref().map(|u| u.id.clone()),
        rewind_ms: r.rewind_ms,
    };
    let mut text = format!(
        "sandbox {} is back at {} ({} ms): its memory, processes and files are those of then",
        out.sandbox.id, out.to, out.rewind_ms as u64
    );
    if let Some(u) = &out.undo {
        text.push_str(&format!(
            "; the present was saved as {u}: rewind {{\"to\": \"{u}\"}} undoes this"
        ));
    }
    (out, text)
}

// ------------------------------------------------------------------- calls

/// The `checkpoint` tool.
pub async fn checkpoint<B: Backend>(
    b: &B,
    args: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<CallToolResult, ErrorData> {
    let name = names::CHECKPOINT;
    let a: CheckpointArgs = crate::tools::parse(name, args)?;
    let (req, retention) = checkpoint_request(&a)?;
    // The policy first, so the new checkpoint is pruned by it like any
    // later one; a refused policy takes no checkpoint.
    let policy_set = retention.is_some();
    if let Some(r) = retention {
        if let Err(e) = b.set_retention(a.sandbox_id.clone(), r).await {
            return Ok(failed(name, e));
        }
    }
    Ok(match b.checkpoint(a.sandbox_id.clone(), req).await {
        Ok(c) => {
            let out = CheckpointTakenOut {
                sandbox_id: a.sandbox_id,
                checkpoint: checkpoint_out(&c),
            };
            let text = format!(
                "checkpoint {} (step {}) of {}, {} stored, the sandbox stopped for {} ms; \
                 rewind {{\"to\": \"{}\"}} brings it back to now",
                out.checkpoint.checkpoint_id,
                out.checkpoint.seq,
                out.sandbox_id,
                mib(out.checkpoint.bytes),
                out.checkpoint.pause_ms.unwrap_or_default() as u64,
                out.checkpoint
                    .tag
                    .as_deref()
                    .unwrap_or(&out.checkpoint.checkpoint_id),
            );
            structured(&out, text)
        }
        // Say what did change, so the model does not set it again.
        Err(e) if policy_set => CallToolResult::error(vec![ContentBlock::text(format!(
            "{} The retention policy was set; no checkpoint was taken.",
            error_text(name, &e)
        ))]),
        Err(e) => failed(name, e),
    })
}

/// The `timeline` tool.
pub async fn timeline<B: Backend>(
    b: &B,
    args: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<CallToolResult, ErrorData> {
    let name = names::TIMELINE;
    let a: TimelineArgs = crate::tools::parse(name, args)?;
    need_id(name, &a.sandbox_id)?;
    Ok(match b.timeline(a.sandbox_id).await {
        Ok(t) => {
            let (out, text) = timeline_out(&t);
            structured(&out, text)
        }
        Err(e) => failed(name, e),
    })
}

/// The `rewind` tool.
pub async fn rewind<B: Backend>(
    b: &B,
    args: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<CallToolResult, ErrorData> {
    let name = names::REWIND;
    let a: RewindArgs = crate::tools::parse(name, args)?;
    let req = rewind_request(&a)?;
    Ok(match b.rewind(a.sandbox_id, req).await {
        Ok(r) => {
            let (out, text) = rewound_out(&r);
            structured(&out, text)
        }
        Err(e) => failed(name, e),
    })
}

#[cfg(test)]
#[path = "timetravel_tests.rs"]
mod tests;
