use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::tests::{call, checkpoint as a_checkpoint, sandbox, text, Fake};
use crate::Server;

fn msg(e: ErrorData) -> String {
    assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    e.message.to_string()
}

fn cp_args(tag: Option<&str>, keep_last: Option<u32>, keep_every: Option<u32>) -> CheckpointArgs {
    CheckpointArgs {
        sandbox_id: "sb".into(),
        tag: tag.map(Into::into),
        keep_last,
        keep_every,
    }
}

#[test]
fn the_catalog_lists_the_time_travel_tools_with_their_schemas() {
    let tools = crate::tools::catalog();
    let find = |n: &str| tools.iter().find(|t| t.name == n).expect(n).clone();
    let cp = find("checkpoint");
    assert_eq!(
        cp.input_schema.get("required"),
        Some(&json!(["sandbox_id"]))
    );
    let props = cp.input_schema["properties"].as_object().unwrap();
    let mut keys: Vec<_> = props.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["keep_every", "keep_last", "sandbox_id", "tag"]);
    // Tidied: plain integer types, no Rust formats.
    assert_eq!(props["keep_last"]["type"], "integer");
    assert!(props["keep_last"].get("format").is_none());
    assert_eq!(cp.annotations.as_ref().unwrap().read_only_hint, Some(false));
    let tl = find("timeline");
    assert_eq!(tl.annotations.as_ref().unwrap().read_only_hint, Some(true));
    let rw = find("rewind");
    assert_eq!(
        rw.input_schema.get("required"),
        Some(&json!(["sandbox_id", "to"]))
    );
    assert_eq!(
        rw.annotations.as_ref().unwrap().destructive_hint,
        Some(true)
    );
    for t in [cp, tl, rw] {
        let out = t.output_schema.as_ref().expect("output schema");
        assert_eq!(out.get("type"), Some(&json!("object")), "{}", t.name);
    }
}

#[test]
fn checkpoint_arguments_are_checked_and_retention_is_optional() {
    let (req, r) = checkpoint_request(&cp_args(Some("before-tests"), None, None)).unwrap();
    assert_eq!(req.tag.as_deref(), Some("before-tests"));
    assert_eq!(r, None);
    let (_, r) = checkpoint_request(&cp_args(None, Some(3), Some(10))).unwrap();
    assert_eq!(
        r,
        Some(Retention {
            keep_last: Some(3),
            keep_every: Some(10)
        })
    );
    for (a, words) in [
        (
            CheckpointArgs {
                sandbox_id: " ".into(),
                ..cp_args(None, None, None)
            },
            "sandbox_id is empty",
        ),
        (cp_args(Some(""), None, None), "tag is empty"),
        (cp_args(None, Some(0), None), "keep_last must be at least 1"),
        (
            cp_args(None, Some(2), Some(0)),
            "keep_every must be at least 1",
        ),
        (cp_args(None, None, Some(4)), "keep_every needs keep_last"),
    ] {
        let m = msg(checkpoint_request(&a).unwrap_err());
        assert!(m.starts_with("checkpoint: "), "{m}");
        assert!(m.contains(words), "{m}");
    }
}

#[test]
fn rewind_needs_a_target() {
    let r = rewind_request(&RewindArgs {
        sandbox_id: "sb".into(),
        to: "good".into(),
        checkpoint_first: true,
    })
    .unwrap();
    assert_eq!((r.to.as_str(), r.checkpoint_first), ("good", true));
    let m = msg(rewind_request(&RewindArgs {
        sandbox_id: "sb".into(),
        to: "  ".into(),
        checkpoint_first: false,
    })
    .unwrap_err());
    assert!(m.contains("to is empty"), "{m}");
}

#[test]
fn timelines_and_rewinds_render_for_the_model() {
    let t = Timeline {
        sandbox: "sb-1".into(),
        head: Some("sn-2".into()),
        retention: Retention {
            keep_last: Some(2),
            keep_every: None,
        },
        checkpoints: vec![
            a_checkpoint("sn-1", 1, Some("base".into())),
            a_checkpoint("sn-2", 2, None),
        ],
        bytes: 6 << 20,
    };
    let (out, text) = timeline_out(&t);
    assert_eq!(out.checkpoints.len(), 2);
    assert_eq!(out.keep_last, Some(2));
    assert!(
        text.contains("2 checkpoints, 6.0 MiB stored; keeping the last 2\n"),
        "{text}"
    );
    assert!(text.contains("1\tsn-1\tbase\t"), "{text}");
    assert!(text.contains("2\tsn-2\t-\t"), "{text}");
    let v = serde_json::to_value(&out).unwrap();
    assert_eq!(v["checkpoints"][0]["checkpoint_id"], "sn-1");
    assert!(v.get("keep_every").is_none(), "{v}");

    let r = Rewound {
        sandbox: sandbox("sb-1"),
        to: "sn-1".into(),
        undo: Some(a_checkpoint("sn-3", 3, None)),
        rewind_ms: 950.2,
    };
    let (out, text) = rewound_out(&r);
    assert_eq!(out.undo.as_deref(), Some("sn-3"));
    assert_eq!(out.sandbox.id, "sb-1");
    assert!(text.contains("back at sn-1 (950 ms)"), "{text}");
    assert!(
        text.contains("rewind {\"to\": \"sn-3\"} undoes this"),
        "{text}"
    );
    let (out, text) = rewound_out(&Rewound { undo: None, ..r });
    assert!(out.undo.is_none() && !text.contains("undo"), "{text}");
}

#[test]
fn checkpoint_timeline_and_rewind_reach_the_backend() {
    let fake = Arc::new(Fake::default());
    let s = Server::new(fake.clone());
    let r = call(
        &s,
        "checkpoint",
        json!({"sandbox_id": "sb-1", "tag": "t1", "keep_last": 2, "keep_every": 5}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let v = r.structured_content.clone().unwrap();
    assert_eq!(v["checkpoint"]["checkpoint_id"], "sn-1");
    assert_eq!(v["checkpoint"]["tag"], "t1");
    assert!(text(&r).contains("rewind {\"to\": \"t1\"}"), "{}", text(&r));
    call(&s, "checkpoint", json!({"sandbox_id": "sb-1"})).unwrap();

    let r = call(&s, "timeline", json!({"sandbox_id": "sb-1"})).unwrap();
    let v = r.structured_content.clone().unwrap();
    assert_eq!(v["checkpoints"].as_array().unwrap().len(), 2);

    let r = call(
        &s,
        "rewind",
        json!({"sandbox_id": "sb-1", "to": "t1", "checkpoint_first": true}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let v = r.structured_content.clone().unwrap();
    assert_eq!(v["to"], "t1");
    assert_eq!(v["undo"], "sn-3");
    assert_eq!(v["sandbox"]["id"], "sb-1");
    // The policy is set before the checkpoint, so that one is pruned by it.
    assert_eq!(
        *fake.calls.lock().unwrap(),
        [
            "retention sb-1 Some(2) Some(5)",
            "checkpoint sb-1 Some(\"t1\")",
            "checkpoint sb-1 None",
            "timeline sb-1",
            "rewind sb-1 t1 true",
            "checkpoint sb-1 None",
        ]
    );
}

#[test]
fn bad_calls_are_tool_errors_that_say_what_to_do() {
    let fake = Arc::new(Fake::default());
    let s = Server::new(fake.clone());
    // A target that does not exist: the daemon's 404, with the hint.
    let r = call(
        &s,
        "rewind",
        json!({"sandbox_id": "sb-1", "to": "sn-nosuch"}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    let t = text(&r);
    assert!(
        t.starts_with("rewind failed: no snapshot sn-nosuch [not_found]"),
        "{t}"
    );
    assert!(t.contains("What to do: check the id"), "{t}");
    // A refused policy takes no checkpoint.
    let r = call(
        &s,
        "checkpoint",
        json!({"sandbox_id": "sb-9", "keep_last": 1}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("no sandbox sb-9"), "{}", text(&r));
    // A refused checkpoint after the policy was set says so.
    let r = call(
        &s,
        "checkpoint",
        json!({"sandbox_id": "sb-1", "tag": "taken", "keep_last": 3}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    let t = text(&r);
    assert!(t.starts_with("checkpoint failed: the tag taken"), "{t}");
    assert!(
        t.ends_with("The retention policy was set; no checkpoint was taken."),
        "{t}"
    );
    // Bad arguments never reach the backend.
    let r = call(
        &s,
        "checkpoint",
        json!({"sandbox_id": "sb-1", "keep_last": 0}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("at least 1"), "{}", text(&r));
    let r = call(&s, "rewind", json!({"sandbox_id": "sb-1"})).unwrap();
    assert!(text(&r).contains("missing field `to`"), "{}", text(&r));
    let r = call(&s, "timeline", json!({"sandbox_id": "sb-1", "x": 1})).unwrap();
    assert!(text(&r).contains("unknown field `x`"), "{}", text(&r));
    assert_eq!(
        *fake.calls.lock().unwrap(),
        [
            "rewind sb-1 sn-nosuch false",
            "retention sb-9 Some(1) None",
            "retention sb-1 Some(3) None",
            "checkpoint sb-1 Some(\"taken\")"
        ]
    );
    assert!(fake.checkpoints.lock().unwrap().is_empty());
}
