use super::*;
use forkvm_api::ExecResult;
use serde_json::json;

fn args(v: serde_json::Value) -> Option<serde_json::Map<String, serde_json::Value>> {
    v.as_object().cloned()
}

fn msg(e: ErrorData) -> String {
    assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    e.message.to_string()
}

#[test]
fn the_catalog_has_every_tool_with_object_schemas() {
    let tools = catalog();
    let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        names,
        [
            "create_sandbox",
            "run_command",
            "run_python",
            "read_file",
            "write_file",
            "list_files",
            "branch_sandbox",
            "snapshot_sandbox",
            "list_sandboxes",
            "remove_sandbox",
            "checkpoint",
            "timeline",
            "rewind",
            "diff",
            "merge"
        ]
    );
    for t in &tools {
        assert_eq!(
            t.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            t.name
        );
        let out = t.output_schema.as_ref().expect("output schema");
        assert_eq!(out.get("type"), Some(&json!("object")), "{}", t.name);
        assert!(t.description.as_ref().is_some_and(|d| d.len() > 30));
    }
    let run = &tools[1].input_schema;
    assert_eq!(run.get("required"), Some(&json!(["sandbox_id"])));
    let desc = run["properties"]["command"]["description"]
        .as_str()
        .unwrap();
    assert!(desc.contains("sh -c"), "{desc}");
}

#[test]
fn arguments_are_parsed_strictly_with_the_field_named() {
    let e = parse::<RunCommandArgs>("run_command", args(json!({"sandbox_id": "a", "cmd": "ls"})))
        .unwrap_err();
    assert!(msg(e).contains("unknown field `cmd`"));
    let e = parse::<RunPythonArgs>("run_python", args(json!({"sandbox_id": "a", "code": 5})))
        .unwrap_err();
    let m = msg(e);
    assert!(m.starts_with("run_python: bad argument code:"), "{m}");
    let e = parse::<RemoveArgs>("remove_sandbox", None).unwrap_err();
    assert!(msg(e).contains("missing field `sandbox_id`"));
    let a: ListSandboxesArgs = parse("list_sandboxes", None).unwrap();
    let _ = a;
}

#[test]
fn run_command_takes_a_shell_line_or_an_argv() {
    let (id, r) = command_request(RunCommandArgs {
        sandbox_id: "sb".into(),
        command: Some("echo hi | wc -c".into()),
        timeout_secs: Some(5),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(id, "sb");
    assert_eq!(r.argv, ["sh", "-c", "echo hi | wc -c"]);
    assert_eq!(r.timeout_ms, Some(5000));
    let (_, r) = command_request(RunCommandArgs {
        sandbox_id: "sb".into(),
        argv: Some(vec!["ls".into(), "/".into()]),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(r.argv, ["ls", "/"]);
    assert_eq!(r.timeout_ms, None);
    for (a, words) in [
        (RunCommandArgs::default(), "sandbox_id is empty"),
        (
            RunCommandArgs {
                sandbox_id: "sb".into(),
                ..Default::default()
            },
            "give `command`",
        ),
        (
            RunCommandArgs {
                sandbox_id: "sb".into(),
                command: Some("ls".into()),
                argv: Some(vec!["ls".into()]),
                ..Default::default()
            },
            "not both",
        ),
        (
            RunCommandArgs {
                sandbox_id: "sb".into(),
                argv: Some(vec![]),
                ..Default::default()
            },
            "must start with a program",
        ),
        (
            RunCommandArgs {
                sandbox_id: "sb".into(),
                command: Some("ls".into()),
                cwd: Some("tmp".into()),
                ..Default::default()
            },
            "not absolute",
        ),
        (
            RunCommandArgs {
                sandbox_id: "sb".into(),
                command: Some("ls".into()),
                timeout_secs: Some(0),
                ..Default::default()
            },
            "at least 1",
        ),
    ] {
        let m = msg(command_request(a).unwrap_err());
        assert!(m.contains(words), "{m}");
    }
}

#[test]
fn python_code_goes_in_on_stdin() {
    let (_, r) = python_request(RunPythonArgs {
        sandbox_id: "sb".into(),
        code: "print(1)".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(r.argv, ["python3", "-"]);
    assert_eq!(r.stdin.as_deref(), Some("print(1)"));
    let e = python_request(RunPythonArgs {
        sandbox_id: "sb".into(),
        code: "  ".into(),
        ..Default::default()
    });
    assert!(msg(e.unwrap_err()).contains("code is empty"));
}

#[test]
fn write_file_decodes_and_checks_mode() {
    let a = WriteFileArgs {
        sandbox_id: "sb".into(),
        path: "/x".into(),
        content: "AP8A".into(),
        encoding: Some(Encoding::Base64),
        mode: Some("755".into()),
    };
    assert_eq!(write_request(&a).unwrap(), (vec![0, 255, 0], Some(0o755)));
    let text = WriteFileArgs {
        sandbox_id: "sb".into(),
        path: "/x".into(),
        content: "hé".into(),
        ..Default::default()
    };
    assert_eq!(
        write_request(&text).unwrap(),
        ("hé".as_bytes().to_vec(), None)
    );
    for (a, words) in [
        (
            WriteFileArgs {
                content: "!!".into(),
                encoding: Some(Encoding::Base64),
                ..a_file()
            },
            "not valid base64",
        ),
        (
            WriteFileArgs {
                mode: Some("9".into()),
                ..a_file()
            },
            "octal",
        ),
        (
            WriteFileArgs {
                mode: Some("17777".into()),
                ..a_file()
            },
            "octal",
        ),
        (
            WriteFileArgs {
                path: "x".into(),
                ..a_file()
            },
            "not absolute",
        ),
    ] {
        let m = msg(write_request(&a).unwrap_err());
        assert!(m.contains(words), "{m}");
    }
}

fn a_file() -> WriteFileArgs {
    WriteFileArgs {
        sandbox_id: "sb".into(),
        path: "/x".into(),
        content: String::new(),
        ..Default::default()
    }
}

#[test]
fn ranges_are_checked() {
    let l = |depth| ListFilesArgs {
        sandbox_id: "sb".into(),
        path: "/".into(),
        depth,
    };
    assert_eq!(list_depth(&l(None)).unwrap(), 1);
    assert_eq!(list_depth(&l(Some(10))).unwrap(), 10);
    assert!(msg(list_depth(&l(Some(0))).unwrap_err()).contains("1 to 10"));
    let b = |count| BranchArgs {
        sandbox_id: "sb".into(),
        count,
        tag: None,
    };
    assert_eq!(branch_request(&b(None)).unwrap().count, Some(1));
    assert_eq!(branch_request(&b(Some(2))).unwrap().count, Some(2));
    assert!(msg(branch_request(&b(Some(17))).unwrap_err()).contains("1 to 16"));
    let c = create_request(CreateArgs {
        image: Some("default".into()),
        snapshot: Some("s".into()),
        ..Default::default()
    });
    assert!(msg(c.unwrap_err()).contains("not both"));
    let c = create_request(CreateArgs {
        image: Some("default".into()),
        timeout_secs: Some(60),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.image.as_deref(), Some("default"));
    assert_eq!(c.timeout, Some(60));
}

fn exec_result(exit: Option<i32>, signal: Option<i32>, timed_out: bool) -> ExecResult {
    ExecResult {
        exit_code: exit,
        signal,
        timed_out,
        stdout: "out".into(),
        stderr: String::new(),
        encoding: Default::default(),
        stdout_truncated: true,
        stderr_truncated: false,
        stdout_bytes: 10,
        stderr_bytes: 0,
        duration_ms: 7,
    }
}

#[test]
fn exec_results_render_their_outcome() {
    let (out, text) = exec_out(exec_result(Some(3), None, false));
    assert_eq!(out.exit_code, Some(3));
    assert!(
        text.starts_with("exit code 3\n--- stdout ---\nout\n"),
        "{text}"
    );
    assert!(text.contains("[stdout truncated"), "{text}");
    assert!(!text.contains("stderr"), "{text}");
    let (_, text) = exec_out(exec_result(None, Some(9), false));
    assert!(text.starts_with("killed by signal 9"), "{text}");
    let (_, text) = exec_out(exec_result(None, Some(9), true));
    assert!(text.starts_with("timed out"), "{text}");
    let v = serde_json::to_value(out).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["signal"], serde_json::Value::Null);
}

#[test]
fn files_come_back_as_text_or_base64() {
    let f = file_out("/a".into(), b"hi\n".to_vec(), Encoding::Text);
    assert_eq!(
        (f.encoding, f.content.as_str(), f.size),
        (Encoding::Text, "hi\n", 3)
    );
    let f = file_out("/a".into(), vec![0xff, 0], Encoding::Text);
    assert_eq!((f.encoding, f.content.as_str()), (Encoding::Base64, "/wA="));
    let f = file_out("/a".into(), b"hi".to_vec(), Encoding::Base64);
    assert_eq!(f.content, "aGk=");
    assert_eq!(serde_json::to_value(f).unwrap()["encoding"], "base64");
}
