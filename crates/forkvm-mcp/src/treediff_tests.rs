use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::tests::{call, text, Fake};
use crate::Server;

fn msg(e: ErrorData) -> String {
    assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    e.message.to_string()
}

/// The structured result, after checking it has every property its tool's
/// output schema requires (fields left out when empty must not be among them).
fn structured_of(r: &CallToolResult) -> serde_json::Value {
    let v = r.structured_content.clone().expect("structured content");
    let tool = if v.get("diff_ms").is_some() {
        "diff"
    } else {
        "merge"
    };
    let tools = crate::tools::catalog();
    let schema = tools
        .iter()
        .find(|t| t.name == tool)
        .unwrap()
        .output_schema
        .clone();
    let required = schema.unwrap()["required"].as_array().unwrap().clone();
    for key in required {
        let key = key.as_str().unwrap();
        assert!(
            v.get(key).is_some(),
            "{tool} result lacks required {key}: {v}"
        );
    }
    v
}

#[test]
fn the_catalog_lists_diff_and_merge_with_their_schemas() {
    let tools = crate::tools::catalog();
    let find = |n: &str| tools.iter().find(|t| t.name == n).expect(n).clone();
    let d = find("diff");
    assert_eq!(d.input_schema.get("required"), Some(&json!(["a", "b"])));
    let mut keys: Vec<_> = d.input_schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    keys.sort();
    assert_eq!(keys, ["a", "b", "limit", "patches", "path"]);
    assert_eq!(d.annotations.as_ref().unwrap().read_only_hint, Some(true));
    let m = find("merge");
    assert_eq!(
        m.input_schema.get("required"),
        Some(&json!(["sandbox_id", "into"]))
    );
    assert_eq!(
        m.input_schema["properties"]["strategy"]["$ref"],
        "#/$defs/Strategy"
    );
    let strategy = serde_json::to_string(&m.input_schema["$defs"]["Strategy"]).unwrap();
    for s in ["ours", "theirs", "text"] {
        assert!(strategy.contains(&format!("\"{s}\"")), "{strategy}");
    }
    assert_eq!(m.annotations.as_ref().unwrap().destructive_hint, Some(true));
    for t in [d, m] {
        let out = t.output_schema.as_ref().expect("output schema");
        assert_eq!(out.get("type"), Some(&json!("object")), "{}", t.name);
    }
}

#[test]
fn arguments_are_checked_before_any_call() {
    let d = |a: &str, b: &str, path: Option<&str>, limit: Option<u32>| DiffArgs {
        a: a.into(),
        b: b.into(),
        path: path.map(Into::into),
        patches: false,
        limit,
    };
    let (req, limit) = diff_request(&d("sb-1", "sn-2", Some("/root"), None)).unwrap();
    assert_eq!(
        (req.b.as_str(), req.path.as_deref(), req.text, limit),
        ("sn-2", Some("/root"), false, 50)
    );
    for (args, words) in [
        (d(" ", "sn-2", None, None), "a is empty"),
        (d("sb-1", "", None, None), "b is empty"),
        (d("sb-1", "sb-2", Some("root"), None), "is not absolute"),
        (d("sb-1", "sb-2", None, Some(0)), "limit must be 1 to 1000"),
        (
            d("sb-1", "sb-2", None, Some(1001)),
            "limit must be 1 to 1000",
        ),
    ] {
        let m = msg(diff_request(&args).unwrap_err());
        assert!(m.contains(words), "{m}");
    }
    let m = |id: &str, into: &str, path: Option<&str>| MergeArgs {
        sandbox_id: id.into(),
        into: into.into(),
        path: path.map(Into::into),
        strategy: Some(Strategy::Text),
        dry_run: true,
    };
    let req = merge_request(&m("sb-2", "sb-1", None)).unwrap();
    assert_eq!(req.strategy, Some(MergeStrategy::Text));
    assert!(req.dry_run && req.into == "sb-1");
    for (args, words) in [
        (m("", "sb-1", None), "sandbox_id is empty"),
        (m("sb-2", " ", None), "into is empty"),
        (m("sb-2", "sb-2", None), "into is sandbox_id itself"),
        (m("sb-2", "sb-1", Some("x/y")), "is not absolute"),
    ] {
        let e = msg(merge_request(&args).unwrap_err());
        assert!(e.contains(words), "{e}");
    }
}

#[test]
fn a_small_diff_is_listed_whole_and_patches_come_only_when_asked() {
    let fake = Arc::new(Fake::default());
    let s = Server::new(fake.clone());
    let r = call(
        &s,
        "diff",
        json!({"a": "sb-1", "b": "sb-2", "path": "/root"}),
    )
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let v = structured_of(&r);
    assert_eq!(
        (v["total"].as_u64(), v["modified"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(v["changes"].as_array().unwrap().len(), 3);
    assert_eq!(v["changes"][0]["before"], "file 6 B mode 644");
    assert_eq!(v["changes"][0]["after"], "file 9 B mode 644");
    assert!(v["changes"][0].get("patch").is_none() && v.get("not_listed").is_none());
    let t = text(&r);
    assert!(t.starts_with("sb-1 -> sb-2 under /root: 3 changes"), "{t}");
    assert!(
        t.contains("C /root/d0/f000  (file 6 B mode 644 -> file 9 B mode 644)"),
        "{t}"
    );
    assert!(!t.contains("@@"), "{t}");

    let r = call(
        &s,
        "diff",
        json!({"a": "sb-1", "b": "sb-2", "patches": true}),
    )
    .unwrap();
    let v = structured_of(&r);
    assert!(v["changes"][2]["patch"]
        .as_str()
        .unwrap()
        .starts_with("@@ -1 +1 @@\n"));
    assert!(text(&r).contains("--- /root/d2/f002\n@@ -1 +1 @@\n+line of text\n"));
    assert!(v.get("patches_cut").is_none());
    assert_eq!(
        fake.calls.lock().unwrap().clone(),
        [
            "diff sb-1 sb-2 Some(\"/root\") false",
            "diff sb-1 sb-2 None true"
        ]
    );
}

#[test]
fn a_large_diff_is_summarized_by_directory_and_its_patches_held_to_the_budget() {
    let s = Server::new(Arc::new(Fake::default()));
    let r = call(
        &s,
        "diff",
        json!({"a": "sb-1", "b": "big", "patches": true}),
    )
    .unwrap();
    let v = structured_of(&r);
    assert_eq!(v["total"], 300);
    assert_eq!(v["changes"].as_array().unwrap().len(), 50);
    assert_eq!(v["not_listed"], 250);
    // 250 not listed, in /root/d0..d2 (84, 83, 83): one level below the root.
    assert_eq!(
        v["not_listed_by_dir"],
        json!([
            {"dir": "/root", "changes": 250},
        ])
    );
    let patches: usize = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["patch"].as_str())
        .map(str::len)
        .sum();
    assert!(patches <= PATCH_BUDGET + 200, "{patches}");
    let shown = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("patch").is_some())
        .count() as u64;
    assert_eq!(v["patches_cut"].as_u64().unwrap(), 300 - shown + 1, "{v}");
    let t = text(&r);
    assert!(t.len() < 2 * PATCH_BUDGET, "{}", t.len());
    assert!(t.contains("… cut: "), "{t}");
    assert!(
        t.contains("… 250 more changes not listed, by directory: /root 250"),
        "{t}"
    );
    // Under /root the counts are by its subdirectories; a larger limit lists more.
    let r = call(
        &s,
        "diff",
        json!({"a": "sb-1", "b": "big", "path": "/root", "limit": 270}),
    )
    .unwrap();
    let v = structured_of(&r);
    assert_eq!(v["changes"].as_array().unwrap().len(), 270);
    assert_eq!(
        v["not_listed_by_dir"],
        json!([
            {"dir": "/root/d0", "changes": 10},
            {"dir": "/root/d1", "changes": 10},
            {"dir": "/root/d2", "changes": 10},
        ])
    );
    assert!(v.get("patches_cut").is_none(), "no patches were asked for");
}

#[test]
fn dir_under_names_the_directory_one_level_below_the_root() {
    assert_eq!(dir_under("/", "/etc/passwd"), "/etc");
    assert_eq!(dir_under("/", "/top"), "/");
    assert_eq!(
        dir_under("/root/repo", "/root/repo/crates/a/b.rs"),
        "/root/repo/crates"
    );
    assert_eq!(dir_under("/root/repo/", "/root/repo/x"), "/root/repo");
    assert_eq!(cut("ab\ncd\nef", 7), "ab\ncd\n");
    assert_eq!(cut("abcdé", 5), "abcd");
}

#[test]
fn a_conflicting_merge_is_refused_with_what_to_do_and_a_dry_run_lists_it() {
    let fake = Arc::new(Fake::default());
    let s = Server::new(fake.clone());
    let r = call(&s, "merge", json!({"sandbox_id": "sb-2", "into": "sb-1"})).unwrap();
    assert_eq!(r.is_error, Some(true));
    let t = text(&r);
    assert!(
        t.starts_with("merge refused, nothing was changed: 1 conflict(s)"),
        "{t}"
    );
    assert!(
        t.contains("/root/d0/f000 (both changed its content)"),
        "{t}"
    );
    assert!(
        t.contains("dry_run true") && t.contains("strategy \"ours\""),
        "{t}"
    );

    let r = call(
        &s,
        "merge",
        json!({"sandbox_id": "sb-2", "into": "sb-1", "dry_run": true}),
    )
    .unwrap();
    let v = structured_of(&r);
    assert_eq!(v["dry_run"], true);
    assert_eq!(
        v["conflicts"],
        json!([{"path": "/root/d0/f000", "reason": "both changed its content"}])
    );
    let t = text(&r);
    assert!(
        t.starts_with("dry run (nothing changed): merging sb-2 into sb-1"),
        "{t}"
    );
    assert!(
        t.contains("conflict: /root/d0/f000 (both changed its content)"),
        "{t}"
    );
    assert!(
        t.contains("to merge anyway, call merge with strategy"),
        "{t}"
    );

    let r = call(
        &s,
        "merge",
        json!({"sandbox_id": "sb-2", "into": "sb-1", "strategy": "theirs", "path": "/root"}),
    )
    .unwrap();
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let v = structured_of(&r);
    assert_eq!(
        (v["applied"].as_u64(), v["dry_run"].as_bool()),
        (Some(1), Some(false))
    );
    assert_eq!(v["changes"][0]["path"], "/root/d1/f001");
    assert_eq!(v["settled"][0]["path"], "/root/d0/f000");
    assert!(v.get("conflicts").is_none());
    let t = text(&r);
    assert!(
        t.starts_with(
            "merged sb-2 into sb-1 (branch point sn-0): 1 changes applied, 1 conflicts settled"
        ),
        "{t}"
    );
    assert!(t.contains("keep what they had read"), "{t}");

    // A bad strategy is refused before any call.
    let r = call(
        &s,
        "merge",
        json!({"sandbox_id": "sb-2", "into": "sb-1", "strategy": "mine"}),
    )
    .unwrap();
    assert_eq!(r.is_error, Some(true));
    let t = text(&r);
    assert!(
        t.contains("bad argument strategy") && t.contains("`theirs`"),
        "{t}"
    );
    assert_eq!(
        fake.calls.lock().unwrap().clone(),
        [
            "merge sb-2 sb-1 None None false",
            "merge sb-2 sb-1 None None true",
            "merge sb-2 sb-1 Some(\"/root\") Some(Theirs) false"
        ]
    );
}

#[test]
fn a_missing_side_is_a_tool_error_saying_what_to_do() {
    let s = Server::new(Arc::new(Fake::default()));
    let r = call(&s, "diff", json!({"a": "sb-1", "b": "sb-nosuch"})).unwrap();
    assert_eq!(r.is_error, Some(true));
    let t = text(&r);
    assert!(
        t.contains("diff failed: no sandbox sb-nosuch [not_found]. What to do"),
        "{t}"
    );
}
