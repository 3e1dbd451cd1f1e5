//! The endpoint over the fake backend: `Host` and `Origin`, JSON-RPC faults
//! and batches, as raw HTTP requests.

use serde_json::json;

use super::*;
use crate::tests::Fake;

fn endpoint(guard: Guard) -> Endpoint<Fake> {
    Endpoint::new(Arc::new(Fake::default()), guard)
}

fn post(host: &str, origin: Option<&str>, version: Option<&str>, body: &str) -> Request<Bytes> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
    if let Some(o) = origin {
        b = b.header(header::ORIGIN, o);
    }
    if let Some(v) = version {
        b = b.header("mcp-protocol-version", v);
    }
    b.body(Bytes::from(body.to_string())).unwrap()
}

async fn answer(e: &Endpoint<Fake>, req: Request<Bytes>) -> (StatusCode, Value) {
    let r = e.handle(req).await;
    let status = r.status();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body).to_string();
    let v = serde_json::from_str(&text)
        .or_else(|_| {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .rfind(|d| !d.trim().is_empty())
                .map(|d| serde_json::from_str(d.trim()))
                .unwrap_or(Ok(Value::String(text.clone())))
        })
        .unwrap_or(Value::String(text));
    (status, v)
}

const INIT: &str = r#"{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}"#;
const LIST: &str = r#"{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}"#;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn origins_and_hosts_from_elsewhere_are_forbidden() {
    rt().block_on(async {
        let lo = endpoint(Guard::Loopback);
        let any = endpoint(Guard::Any);
        let (s, v) = answer(&lo, post("127.0.0.1:7070", None, None, INIT)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["result"]["serverInfo"]["name"], "forkvm");
        let (s, _) = answer(
            &lo,
            post("localhost:7070", Some("http://localhost:6274"), None, INIT),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        // DNS rebinding: a page of evil.example resolved to 127.0.0.1.
        let (s, _) = answer(
            &lo,
            post(
                "evil.example:7070",
                Some("http://evil.example:7070"),
                None,
                INIT,
            ),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, _) = answer(&lo, post("evil.example:7070", None, None, INIT)).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, _) = answer(
            &lo,
            post("127.0.0.1:7070", Some("https://evil.example"), None, INIT),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        // Forbidden comes first, whatever the body.
        let (s, _) = answer(&lo, post("evil.example", None, None, "not json")).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        // A listener reached by any name takes any Host, but no foreign Origin.
        let (s, _) = answer(&any, post("sandboxes.internal:7070", None, None, INIT)).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = answer(
            &any,
            post(
                "sandboxes.internal:7070",
                Some("https://evil.example"),
                None,
                INIT,
            ),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
    });
}

#[test]
fn faults_are_json_rpc_errors() {
    rt().block_on(async {
        let e = endpoint(Guard::Loopback);
        let (s, v) = answer(&e, post("localhost", None, None, "not json {")).await;
        assert_eq!((s, v["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32700)), "{v}");
        assert_eq!(v["id"], Value::Null);
        let (s, v) = answer(&e, post("localhost", None, None, r#"{"hello": 1}"#)).await;
        assert_eq!((s, v["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32600)), "{v}");
        // Not JSON-RPC is a 400 also when its id could be echoed.
        let (s, v) = answer(&e, post("localhost", None, None, r#"{"jsonrpc": "1.0", "id": 7, "method": "ping"}"#)).await;
        assert_eq!((s, v["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32600)), "{v}");
        assert_eq!(v["id"], 7);
        let (s, v) = answer(
            &e,
            post("localhost", None, Some("2025-11-25"), r#"{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"arguments": {}}}"#),
        )
        .await;
        assert_eq!((s, v["error"]["code"].as_i64()), (StatusCode::OK, Some(-32602)), "{v}");
        assert_eq!(v["id"], 9);
        let (_, v) = answer(
            &e,
            post("localhost", None, Some("2025-11-25"), r#"{"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "list_sandboxes", "arguments": [1]}}"#),
        )
        .await;
        assert_eq!(v["error"]["code"], -32602, "{v}");
        // A good call still works.
        let (s, v) = answer(&e, post("localhost", None, Some("2025-11-25"), LIST)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["result"]["tools"].as_array().map(Vec::len), Some(15));
    });
}

#[test]
fn batches_are_answered_under_2025_03_26_only() {
    rt().block_on(async {
        let e = endpoint(Guard::Loopback);
        let batch = format!(
            r#"[{LIST}, {{"jsonrpc": "2.0", "method": "notifications/initialized"}}, {{"jsonrpc": "2.0", "id": 3, "method": "ping"}}, {{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {{}}}}, 7]"#
        );
        let (s, v) = answer(&e, post("localhost", None, Some("2025-03-26"), &batch)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let a = v.as_array().expect("an array");
        let ids: Vec<_> = a.iter().map(|m| m["id"].clone()).collect();
        assert_eq!(ids, [json!(2), json!(3), json!(4), Value::Null], "{v}");
        assert_eq!(a[0]["result"]["tools"].as_array().map(Vec::len), Some(15));
        assert_eq!(a[2]["error"]["code"], -32602);
        assert_eq!(a[3]["error"]["code"], -32600);
        // No header means 2025-03-26, as the transport says.
        let (s, _) = answer(&e, post("localhost", None, None, &format!("[{LIST}]"))).await;
        assert_eq!(s, StatusCode::OK);
        let (s, v) = answer(&e, post("localhost", None, Some("2025-11-25"), &format!("[{LIST}]"))).await;
        assert_eq!((s, v["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32600)), "{v}");
        // Notifications only: nothing to answer.
        let (s, _) = answer(
            &e,
            post("localhost", None, Some("2025-03-26"), r#"[{"jsonrpc": "2.0", "method": "notifications/initialized"}]"#),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED);
    });
}

#[test]
fn schemas_have_no_custom_formats_or_nullable_optionals() {
    for t in crate::tools::catalog() {
        let mut all = serde_json::to_string(&t.input_schema).unwrap();
        all.push_str(&serde_json::to_string(&t.output_schema).unwrap());
        for bad in ["uint32", "uint64", "int32", "int64", "\"null\""] {
            assert!(!all.contains(bad), "{}: {bad} in {all}", t.name);
        }
    }
}
