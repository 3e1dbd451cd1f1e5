//! The server over a fake backend: what a call becomes, and how a failed
//! action is shown.

use std::sync::Mutex;

use serde_json::json;

use super::*;

#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<String>>,
}

fn gone(id: &str) -> BackendError {
    BackendError::new(404, "not_found", format!("no sandbox {id}"))
}

fn sandbox(id: &str) -> Sandbox {
    serde_json::from_value(json!({
        "id": id, "state": "running", "image": "default", "memory_mib": 512, "cpus": 1,
        "accel": "tcg", "created_at": "2026-01-01T00:00:00Z"
    }))
    .unwrap()
}

impl Fake {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
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
    async fn remove(&self, id: String) -> Result<(), BackendError> {
        Err(BackendError::new(
            0,
            "",
            format!("cannot reach the daemon to remove {id}"),
        ))
    }
}

fn call(
    s: &Server<Fake>,
    name: &str,
    args: serde_json::Value,
) -> Result<CallToolResult, ErrorData> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(s.call(name, args.as_object().cloned()))
}

fn text(r: &CallToolResult) -> String {
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
    assert!(t.contains("forkvm serve"), "{t}");
    assert!(!t.contains("[]"), "{t}");
}

#[test]
fn bad_calls_are_invalid_params_and_never_reach_the_backend() {
    let s = Server::new(Arc::new(Fake::default()));
    for (name, args) in [
        ("nope", json!({})),
        ("run_command", json!({"sandbox_id": "sb-1"})),
        ("read_file", json!({"sandbox_id": "sb-1", "path": "rel"})),
        ("list_sandboxes", json!({"all": true})),
    ] {
        let e = call(&s, name, args).unwrap_err();
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{name}");
    }
    let e = call(&s, "nope", json!({})).unwrap_err();
    assert!(e.message.contains("run_python"), "{}", e.message);
    assert!(s.backend.calls.lock().unwrap().is_empty());
}
