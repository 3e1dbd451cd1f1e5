//! The server over a fake backend: what a call becomes, and how a failed
//! action is shown.

use std::sync::Mutex;

use serde_json::json;

use super::*;

#[derive(Default)]
pub(crate) struct Fake {
    pub(crate) calls: Mutex<Vec<String>>,
    /// The checkpoints taken of `sb-1`, for the time-travel tools.
    pub(crate) checkpoints: Mutex<Vec<Checkpoint>>,
}

fn gone(id: &str) -> BackendError {
    BackendError::new(404, "not_found", format!("no sandbox {id}"))
}

pub(crate) fn sandbox(id: &str) -> Sandbox {
    serde_json::from_value(json!({
        "id": id, "state": "running", "image": "default", "memory_mib": 512, "cpus": 1,
        "accel": "tcg", "created_at": "2026-01-01T00:00:00Z"
    }))
    .unwrap()
}

pub(crate) fn checkpoint(id: &str, seq: u64, tag: Option<String>) -> Checkpoint {
    Checkpoint {
        id: id.into(),
        tag,
        sandbox: "sb-1".into(),
        seq,
        created_at: "2026-01-01T00:00:00Z".into(),
        parent: None,
        pause_ms: Some(31.0),
        bytes: 3 << 20,
        head: false,
    }
}

/// A modified text file, with a 1 KiB patch when `patch`.
pub(crate) fn fake_change(path: &str, patch: bool) -> forkvm_api::PathChange {
    let state = |size| forkvm_api::PathState {
        kind: "file".into(),
        size,
        mode: 0o644,
        symlink_target: None,
    };
    forkvm_api::PathChange {
        path: path.into(),
        change: forkvm_api::ChangeKind::Modified,
        a: Some(state(6)),
        b: Some(state(9)),
        patch: patch.then(|| format!("@@ -1 +1 @@\n{}", "+line of text\n".repeat(73))),
    }
}

impl Fake {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }

    fn timeline_of(&self, id: String) -> Result<Timeline, BackendError> {
        if id != "sb-1" {
            return Err(gone(&id));
        }
        let checkpoints = self.checkpoints.lock().unwrap().clone();
        Ok(Timeline {
            sandbox: id,
            head: checkpoints.last().map(|c| c.id.clone()),
            retention: Retention::default(),
            bytes: checkpoints.iter().map(|c| c.bytes).sum(),
            checkpoints,
        })
    }
}

impl Backend for Fake {
    async fn create(&self, req: CreateSandbox) -> Result<Sandbox, BackendError> {
        self.log(format!("create {:?}", req.image));
        Ok(sandbox("sb-1"))
    }
    async fn exec(&self, id: String, req: ExecRequest) -> Result<ExecResult, BackendError> {
        self.log(format!("exec {id} {:?}", req.argv));
        if id != "sb-1" {
            return Err(gone(&id));
        }
        Ok(serde_json::from_value(json!({
            "exit_code": 0, "timed_out": false, "stdout": "42\n", "stderr": "",
            "encoding": "utf8", "stdout_truncated": false, "stderr_truncated": false,
            "stdout_bytes": 3, "stderr_bytes": 0, "duration_ms": 5, "signal": null
        }))
        .unwrap())
    }
    async fn read_file(&self, id: String, _: String) -> Result<Vec<u8>, BackendError> {
        Err(gone(&id))
    }
    async fn write_file(
        &self,
        _: String,
        path: String,
        _: Option<u32>,
        data: Vec<u8>,
    ) -> Result<FileWritten, BackendError> {
        Ok(FileWritten {
            path,
            size: data.len() as u64,
        })
    }
    async fn list_dir(&self, id: String, _: String, _: u32) -> Result<EntryList, BackendError> {
        Err(gone(&id))
    }
    async fn branch(&self, id: String, _: BranchRequest) -> Result<BranchResult, BackendError> {
        Err(BackendError::new(
            409,
            "conflict",
            format!("sandbox {id} is paused; resume it first"),
        ))
    }
    async fn snapshot(&self, id: String, _: CreateSnapshot) -> Result<Snapshot, BackendError> {
        Err(gone(&id))
    }
    async fn list(&self) -> Result<Vec<Sandbox>, BackendError> {
        Ok(vec![sandbox("sb-1"), sandbox("sb-2")])
    }
    async fn logs(&self, id: String) -> Result<String, BackendError> {
        if id != "sb-1" {
            return Err(gone(&id));
        }
        Ok("Linux version 6.x\nforkvm agent ready\n".into())
    }
    async fn checkpoint(
        &self,
        id: String,
        req: CheckpointRequest,
    ) -> Result<Checkpoint, BackendError> {
        self.log(format!("checkpoint {id} {:?}", req.tag));
        if id != "sb-1" {
            return Err(gone(&id));
        }
        if req.tag.as_deref() == Some("taken") {
            return Err(BackendError::new(
                409,
                "conflict",
                "the tag taken names another snapshot",
            ));
        }
        let mut cps = self.checkpoints.lock().unwrap();
        let seq = cps.len() as u64 + 1;
        let c = checkpoint(&format!("sn-{seq}"), seq, req.tag);
        cps.push(c.clone());
        Ok(c)
    }
    async fn timeline(&self, id: String) -> Result<Timeline, BackendError> {
        self.log(format!("timeline {id}"));
        self.timeline_of(id)
    }
    async fn set_retention(&self, id: String, r: Retention) -> Result<Timeline, BackendError> {
        self.log(format!(
            "retention {id} {:?} {:?}",
            r.keep_last, r.keep_every
        ));
        let mut t = self.timeline_of(id)?;
        t.retention = r;
        Ok(t)
    }
    async fn rewind(&self, id: String, req: RewindRequest) -> Result<Rewound, BackendError> {
        self.log(format!("rewind {id} {} {}", req.to, req.checkpoint_first));
        if id != "sb-1" {
            return Err(gone(&id));
        }
        let known = self
            .checkpoints
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.id == req.to || c.tag.as_deref() == Some(&req.to));
        if !known {
            return Err(BackendError::new(
                404,
                "not_found",
                format!("no snapshot {}", req.to),
            ));
        }
        let undo = if req.checkpoint_first {
            Some(
                self.checkpoint(id.clone(), CheckpointRequest::default())
                    .await?,
            )
        } else {
            None
        };
        Ok(Rewound {
            sandbox: sandbox(&id),
            to: req.to,
            undo,
            rewind_ms: 812.5,
        })
    }
    async fn diff(&self, a: String, req: DiffRequest) -> Result<Diff, BackendError> {
        self.log(format!("diff {a} {} {:?} {}", req.b, req.path, req.text));
        if a == "sb-nosuch" || req.b == "sb-nosuch" {
            return Err(gone("sb-nosuch"));
        }
        // `b` "big" has 300 changes in three directories, each with a 1 KiB patch.
        let n = if req.b == "big" { 300 } else { 3 };
        let changes = (0..n)
            .map(|i| fake_change(&format!("/root/d{}/f{i:03}", i % 3), req.text))
            .collect();
        Ok(Diff {
            a,
            b: req.b,
            path: req.path.unwrap_or_else(|| "/".into()),
            changes,
            stats: forkvm_api::DiffStats {
                added: 0,
                deleted: 0,
                modified: n,
                other: 0,
            },
            entries: 2 * n + 10,
            contents_read: 1,
            diff_ms: 12.0,
        })
    }
    async fn merge(&self, child: String, req: MergeRequest) -> Result<Merged, BackendError> {
        self.log(format!(
            "merge {child} {} {:?} {:?} {}",
            req.into, req.path, req.strategy, req.dry_run
        ));
        let conflict = forkvm_api::Conflict {
            path: "/root/d0/f000".into(),
            base: None,
            ours: None,
            theirs: None,
            reason: "both changed its content".into(),
        };
        if req.strategy.is_none() && !req.dry_run {
            return Err(BackendError::new(
                409,
                "conflict",
                "1 conflict(s), nothing was changed: /root/d0/f000 (both changed its content); \
                 settle them with a strategy (ours, theirs or text), or list them all with a dry run",
            ));
        }
        Ok(Merged {
            child,
            into: req.into,
            base: "sn-0".into(),
            applied: vec![fake_change("/root/d1/f001", false)],
            settled: req.strategy.map(|_| conflict.clone()).into_iter().collect(),
            conflicts: if req.dry_run && req.strategy.is_none() {
                vec![conflict]
            } else {
                vec![]
            },
            dry_run: req.dry_run,
            merge_ms: 40.0,
        })
    }
    async fn remove(&self, id: String) -> Result<(), BackendError> {
        Err(BackendError::new(
            0,
            "",
            format!("cannot reach the daemon to remove {id}"),
        ))
    }
}

pub(crate) fn call(
    s: &Server<Fake>,
    name: &str,
    args: serde_json::Value,
) -> Result<CallToolResult, ErrorData> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(s.call(name, args.as_object().cloned()))
}

pub(crate) fn text(r: &CallToolResult) -> String {
    serde_json::to_value(&r.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn calls_reach_the_backend_and_render_structured_results() {
    let s = Server::new(Arc::new(Fake::default()));
    let r = call(&s, "create_sandbox", json!({"image": "default"})).unwrap();
    assert_eq!(r.is_error, Some(false));
    assert_eq!(r.structured_content.as_ref().unwrap()["id"], "sb-1");
    assert!(text(&r).contains("sandbox_id \"sb-1\""));

    let r = call(
        &s,
        "run_python",
        json!({"sandbox_id": "sb-1", "code": "print(42)"}),
    )
    .unwrap();
    assert_eq!(r.structured_content.as_ref().unwrap()["stdout"], "42\n");
    assert_eq!(r.structured_content.as_ref().unwrap()["exit_code"], 0);

    let r = call(
        &s,
        "write_file",
        json!({"sandbox_id": "sb-1", "path": "/a", "content": "xy"}),
    )
    .unwrap();
    assert_eq!(
        r.structured_content.unwrap(),
        json!({"path": "/a", "size": 2})
    );

    let r = call(&s, "list_sandboxes", json!({})).unwrap();
    assert_eq!(
        r.structured_content.as_ref().unwrap()["sandboxes"][1]["id"],
        "sb-2"
    );
    let calls = s.backend.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        ["create Some(\"default\")", "exec sb-1 [\"python3\", \"-\"]"]
    );
}

#[test]
fn failed_actions_are_tool_errors_that_say_what_to_do() {
    let s = Server::new(Arc::new(Fake::default()));
    let r = call(
        &s,
        "run_command",
        json!({"sandbox_id": "sb-9", "command": "ls"}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(r.structured_content.is_none());
    let t = text(&r);
    assert!(
        t.starts_with("run_command failed: no sandbox sb-9 [not_found]."),
        "{t}"
    );
    assert!(t.contains("list_sandboxes"), "{t}");
    let t = text(&call(&s, "branch_sandbox", json!({"sandbox_id": "sb-1"})).unwrap());
    assert!(t.contains("resume it first [conflict]"), "{t}");
    let t = text(&call(&s, "remove_sandbox", json!({"sandbox_id": "sb-1"})).unwrap());
    assert!(
        t.contains("forkvm serve") && t.ends_with("running one."),
        "{t}"
    );
    assert!(!t.contains("[]"), "{t}");
}

#[test]
fn bad_arguments_are_tool_errors_and_never_reach_the_backend() {
    let s = Server::new(Arc::new(Fake::default()));
    for (name, args, words) in [
        (
            "run_command",
            json!({"sandbox_id": "sb-1"}),
            "give `command`",
        ),
        (
            "run_command",
            json!({"command": "ls"}),
            "missing field `sandbox_id`",
        ),
        (
            "read_file",
            json!({"sandbox_id": "sb-1", "path": "rel"}),
            "not absolute",
        ),
        (
            "list_sandboxes",
            json!({"all": true}),
            "unknown field `all`",
        ),
        (
            "run_python",
            json!({"sandbox_id": "sb-1", "code": 5}),
            "bad argument code",
        ),
        (
            "list_files",
            json!({"sandbox_id": "sb-1", "path": "/", "depth": 99}),
            "out of range",
        ),
        (
            "branch_sandbox",
            json!({"sandbox_id": "sb-1", "count": -1}),
            "count",
        ),
    ] {
        let r = call(&s, name, args).unwrap();
        assert_eq!(r.is_error, Some(true), "{name}");
        let t = text(&r);
        assert!(t.contains(words), "{name}: {t}");
        assert!(t.contains("inputSchema"), "{name}: {t}");
    }
    assert!(s.backend.calls.lock().unwrap().is_empty());
}

#[test]
fn an_unknown_tool_is_a_protocol_error_naming_the_tools() {
    let s = Server::new(Arc::new(Fake::default()));
    let e = call(&s, "nope", json!({})).unwrap_err();
    assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    assert!(e.message.contains("run_python"), "{}", e.message);
}

#[test]
fn a_cancelled_command_is_killed_by_its_marker() {
    let s = Server::new(Arc::new(Fake::default()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let ct = CancellationToken::new();
    ct.cancel();
    let r = rt
        .block_on(
            s.call_ct(
                "run_command",
                json!({"sandbox_id": "sb-1", "command": "sleep 100"})
                    .as_object()
                    .cloned(),
                ct,
            ),
        )
        .unwrap();
    // Cancelled before it started: nothing runs.
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("cancelled"), "{}", text(&r));
    assert!(s.backend.calls.lock().unwrap().is_empty());
}

#[test]
fn the_kill_finds_the_call_by_its_marker() {
    let m = tools::call_marker();
    assert_ne!(m, tools::call_marker());
    let k = tools::kill_request(&m);
    assert_eq!(k.argv[..2], ["sh", "-c"]);
    assert!(
        k.argv[2].contains(&format!("'FORKVM_MCP_CALL={m}'")),
        "{}",
        k.argv[2]
    );
    assert!(k.env.is_empty(), "the killer must not carry the marker");
}

#[test]
fn every_sandbox_console_is_a_resource_and_files_read_by_template() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let b = Fake::default();
    let l = rt.block_on(resources::list(&b)).unwrap();
    let uris: Vec<_> = l.resources.iter().map(|r| r.uri.clone()).collect();
    assert_eq!(
        uris,
        [
            "forkvm://sandboxes/sb-1/console",
            "forkvm://sandboxes/sb-2/console"
        ]
    );
    let r = rt
        .block_on(resources::read(&b, "forkvm://sandboxes/sb-1/console"))
        .unwrap();
    let v = serde_json::to_value(&r.contents).unwrap();
    assert_eq!(v[0]["text"], "Linux version 6.x\nforkvm agent ready\n");
    assert_eq!(v[0]["mimeType"], "text/plain");
    let e = rt
        .block_on(resources::read(
            &b,
            "forkvm://sandboxes/sb-1/files/etc/hosts",
        ))
        .unwrap_err();
    assert_eq!(e.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
    assert!(e.message.contains("no sandbox sb-1"), "{}", e.message);
    let e = rt
        .block_on(resources::read(&b, "file:///etc/hosts"))
        .unwrap_err();
    assert_eq!(e.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
    let t = resources::templates();
    assert_eq!(t.resource_templates.len(), 2);
}
