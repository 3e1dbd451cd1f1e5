//! JSON-RPC faults answered as JSON-RPC, before rmcp sees the message.
//!
//! rmcp answers a body it cannot parse with `415` and a line of text over
//! HTTP, ignores unparsable lines on stdio, and takes a `tools/call` whose
//! params do not fit its schema for an unknown method (`-32601`). JSON-RPC
//! 2.0 and MCP want `-32700` for what is not JSON, `-32600` for JSON that
//! is not a JSON-RPC message, and `-32602` for a known method's bad params.
//! [`check`] sorts one message (or a batch) into what rmcp should get and
//! what is answered here; the HTTP endpoint ([`crate::http`]) and the stdio
//! filter ([`crate::stdio`]) both use it.

use serde_json::{json, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// What to do with one body or line.
#[derive(Debug, PartialEq)]
pub enum Checked {
    /// A well-formed message: hand it to rmcp as it is.
    Pass(Value),
    /// A fault: answer this JSON-RPC error response instead. `None` for a
    /// notification, which is never answered.
    Reject(Option<Value>),
    /// A JSON array: a batch, each member checked on its own.
    Batch(Vec<Checked>),
}

/// A JSON-RPC error response.
pub fn error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// Sort one HTTP body or stdio line.
pub fn check(bytes: &[u8]) -> Checked {
    match serde_json::from_slice::<Value>(bytes) {
        Err(e) => Checked::Reject(Some(error(
            Value::Null,
            PARSE_ERROR,
            format!("parse error: the message is not JSON ({e})"),
        ))),
        Ok(Value::Array(items)) if items.is_empty() => Checked::Reject(Some(error(
            Value::Null,
            INVALID_REQUEST,
            "an empty batch is not a JSON-RPC message",
        ))),
        Ok(Value::Array(items)) => Checked::Batch(items.into_iter().map(check_one).collect()),
        Ok(v) => check_one(v),
    }
}

/// Sort one JSON value that should be a single JSON-RPC message.
pub fn check_one(v: Value) -> Checked {
    let Some(m) = v.as_object() else {
        return invalid(Value::Null, "a JSON-RPC message is a JSON object");
    };
    let id = m.get("id").cloned();
    let id_ok = matches!(id, Some(Value::String(_)) | Some(Value::Number(_)));
    let reply_id = if id_ok {
        id.clone().unwrap_or_default()
    } else {
        Value::Null
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(reply_id, "\"jsonrpc\" must be \"2.0\"");
    }
    match m.get("method") {
        Some(Value::String(method)) => {
            if id.is_some() && !id_ok {
                return invalid(Value::Null, "\"id\" must be a string or a number");
            }
            let is_request = id.is_some();
            if let Some(msg) = bad_params(method, m.get("params")) {
                return if is_request {
                    Checked::Reject(Some(error(reply_id, INVALID_PARAMS, msg)))
                } else {
                    Checked::Reject(None)
                };
            }
            // Whatever else rmcp cannot read as a client message is, for a
            // request, params that do not fit the method.
            if serde_json::from_value::<rmcp::model::ClientJsonRpcMessage>(v.clone()).is_err() {
                let msg = format!("invalid params for {method}");
                return if is_request {
                    Checked::Reject(Some(error(reply_id, INVALID_PARAMS, msg)))
                } else {
                    Checked::Reject(None)
                };
            }
            Checked::Pass(v)
        }
        Some(_) => invalid(reply_id, "\"method\" must be a string"),
        None => {
            let answer = m.contains_key("result") ^ m.contains_key("error");
            if !id_ok || !answer {
                return invalid(
                    reply_id,
                    "not a JSON-RPC message: a request or notification needs \"method\", \
                     a response \"id\" and one of \"result\" and \"error\"",
                );
            }
            Checked::Pass(v)
        }
    }
}

fn invalid(id: Value, msg: &str) -> Checked {
    Checked::Reject(Some(error(
        id,
        INVALID_REQUEST,
        format!("invalid request: {msg}"),
    )))
}

/// What is wrong with a method's params, for the methods whose params
/// rmcp would otherwise take for an unknown method's.
fn bad_params(method: &str, params: Option<&Value>) -> Option<String> {
    if let Some(p) = params {
        if !p.is_object() {
            return Some(format!("params of {method} must be an object"));
        }
    }
    let p = params.and_then(Value::as_object);
    let field = |k: &str| p.and_then(|p| p.get(k));
    match method {
        "tools/call" => {
            if !field("name").is_some_and(Value::is_string) {
                return Some("tools/call needs params.name, the tool's name as a string".into());
            }
            if field("arguments").is_some_and(|a| !a.is_object() && !a.is_null()) {
                return Some("tools/call params.arguments must be an object".into());
            }
            None
        }
        "resources/read" | "resources/subscribe" | "resources/unsubscribe"
            if !field("uri").is_some_and(Value::is_string) =>
        {
            Some(format!("{method} needs params.uri, a string"))
        }
        "prompts/get" if !field("name").is_some_and(Value::is_string) => {
            Some("prompts/get needs params.name, a string".into())
        }
        _ => None,
    }
}

/// Whether a batch may be sent under this negotiated protocol version
/// (the `MCP-Protocol-Version` header; absent means `2025-03-26`, as the
/// transport says). Only 2025-03-26 has batches: 2025-06-18 removed them.
pub fn batches_allowed(version: Option<&str>) -> bool {
    matches!(version, None | Some("2025-03-26"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(c: &Checked) -> (Value, i64) {
        match c {
            Checked::Reject(Some(e)) => (e["id"].clone(), e["error"]["code"].as_i64().unwrap()),
            other => panic!("not rejected: {other:?}"),
        }
    }

    #[test]
    fn not_json_is_a_parse_error_with_a_null_id() {
        for b in [&b"{"[..], b"hello", b"", b"{\"jsonrpc\": \"2.0\",}"] {
            assert_eq!(code(&check(b)), (Value::Null, PARSE_ERROR), "{b:?}");
        }
    }

    #[test]
    fn json_that_is_not_json_rpc_is_an_invalid_request() {
        for b in [
            &br#"42"#[..],
            br#""x""#,
            br#"{}"#,
            br#"{"jsonrpc": "1.0", "id": 1, "method": "ping"}"#,
            br#"{"jsonrpc": "2.0", "id": 1}"#,
            br#"{"jsonrpc": "2.0", "id": 1, "method": 5}"#,
            br#"{"jsonrpc": "2.0", "id": {}, "method": "ping"}"#,
            br#"{"id": 1, "method": "ping"}"#,
            br#"[]"#,
        ] {
            assert_eq!(
                code(&check(b)).1,
                INVALID_REQUEST,
                "{}",
                String::from_utf8_lossy(b)
            );
        }
        // The id is echoed when it is a valid one.
        let c = check(br#"{"jsonrpc": "1.0", "id": 7, "method": "ping"}"#);
        assert_eq!(code(&c), (json!(7), INVALID_REQUEST));
    }

    #[test]
    fn a_tools_call_without_a_name_or_with_non_object_arguments_is_invalid_params() {
        for p in [
            json!({}),
            json!({"name": 5}),
            json!({"name": "run_command", "arguments": [1]}),
            json!({"name": "run_command", "arguments": "x"}),
            json!([1]),
        ] {
            let m = json!({"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": p});
            assert_eq!(code(&check_one(m)), (json!("a"), INVALID_PARAMS), "{p}");
        }
        let m = json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {}});
        assert_eq!(code(&check_one(m)).1, INVALID_PARAMS);
        // A notification is never answered, even when its params are bad.
        let m = json!({"jsonrpc": "2.0", "method": "tools/call", "params": {}});
        assert_eq!(check_one(m), Checked::Reject(None));
    }

    #[test]
    fn good_messages_pass_and_batches_are_split() {
        let ok = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "x"}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "x", "arguments": {"a": 1}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 4, "result": {}}),
        ];
        for m in ok {
            assert_eq!(check_one(m.clone()), Checked::Pass(m));
        }
        let Checked::Batch(items) = check(
            br#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}}, 3]"#,
        ) else {
            panic!("not a batch")
        };
        assert!(matches!(items[0], Checked::Pass(_)));
        assert_eq!(code(&items[1]), (json!(2), INVALID_PARAMS));
        assert_eq!(code(&items[2]), (Value::Null, INVALID_REQUEST));
    }

    #[test]
    fn batches_belong_to_2025_03_26_only() {
        assert!(batches_allowed(None));
        assert!(batches_allowed(Some("2025-03-26")));
        for v in ["2024-11-05", "2025-06-18", "2025-11-25", "2026-07-28"] {
            assert!(!batches_allowed(Some(v)), "{v}");
        }
    }
}
