//! The event stream (`GET /v1/events`), the dashboard's login on TCP, and
//! `forkvm ui`'s relay on the unix socket, against a real daemon.
//!
//! Streams are read with plain HTTP/1.0 requests over a socket, so the
//! response is the bare SSE text until the server closes it: what any
//! client (a browser's EventSource, curl) sees.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use serde_json::Value;

const TOKEN: &str = "events-test-token";

/// One request with `Connection: close`; returns (status, head, body).
fn http(port: u16, req: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn get(port: u16, path: &str, extra: &str) -> (u16, String, String) {
    http(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n"),
    )
}

/// One SSE message: (event, id, data).
type Msg = (String, Option<u64>, String);

/// Open `/v1/events` and deliver its messages on a channel (until the
/// daemon closes the stream or the test ends).
fn stream(port: u16, auth: &str, last: Option<u64>) -> mpsc::Receiver<Msg> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let last = last.map_or(String::new(), |l| format!("Last-Event-ID: {l}\r\n"));
    write!(s, "GET /v1/events HTTP/1.0\r\n{auth}{last}\r\n").unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(s);
        let mut line = String::new();
        // The head.
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
        }
        let (mut event, mut id, mut data) = (String::new(), None, String::new());
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if !event.is_empty() && tx.send((event.clone(), id, data.clone())).is_err() {
                    return;
                }
                (event, id, data) = (String::new(), None, String::new());
            } else if let Some(v) = l.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = l.strip_prefix("id:") {
                id = v.trim().parse().ok();
            } else if let Some(v) = l.strip_prefix("data:") {
                data = v.trim_start().to_string();
            }
        }
    });
    rx
}

fn next(rx: &mpsc::Receiver<Msg>, what: &str) -> Msg {
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("no event while waiting for {what}"))
}

/// Read events until `pred` holds for one; returns every event read.
fn until(rx: &mpsc::Receiver<Msg>, what: &str, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let (_, _, data) = next(rx, what);
        let v: Value = serde_json::from_str(&data).expect("event JSON");
        let done = pred(&v);
        seen.push(v);
        if done {
            return seen;
        }
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn position(seen: &[Value], pred: impl Fn(&Value) -> bool) -> Option<usize> {
    seen.iter().position(pred)
}

#[test]
#[ignore = "boots VMs; run with --include-ignored (make test does)"]
fn the_event_stream_follows_a_branch_in_order_and_replays_on_reconnect() {
    let port = free_port();
    let d = Daemon::start_with(Some((format!("127.0.0.1:{port}"), TOKEN.into())));
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    // Without the token: refused like every other call.
    let (st, _, body) = get(port, "/v1/events", "Authorization: Bearer wrong\r\n");
    assert_eq!(st, 401, "{body}");

    let rx = stream(port, &auth, None);
    let (ev, id, data) = next(&rx, "ready");
    assert_eq!((ev.as_str(), id), ("ready", None), "{data}");
    let ready: Value = serde_json::from_str(&data).unwrap();
    let start = ready["seq"].as_u64().expect("ready carries seq");

    let src = d.spawn_cold();
    let seen = until(&rx, "the source running", |v| {
        v["kind"] == "sandbox.updated"
            && v["id"] == src.id.as_str()
            && v["sandbox"]["state"] == "running"
    });
    assert_eq!(
        seen.iter()
            .find(|v| v["id"] == src.id.as_str())
            .map(|v| v["kind"].clone()),
        Some(Value::from("sandbox.created")),
        "a sandbox is created before it is updated: {seen:?}"
    );
    // Numbered from the ready seq on, without gaps.
    for (i, v) in seen.iter().enumerate() {
        assert_eq!(v["seq"].as_u64(), Some(start + 1 + i as u64), "{seen:?}");
    }

    let r = d.json(&["branch", &src.id, "--mode", "diff", "--count", "2"]);
    let point = r["snapshot"]["id"].as_str().unwrap().to_string();
    let kids = ids(&r["children"]);
    assert_eq!(kids.len(), 2);
    let seen = until(&rx, "the branch event", |v| v["kind"] == "branch");
    let b = &seen.last().unwrap()["branch"];
    assert_eq!(b["source"], src.id.as_str());
    assert_eq!(b["snapshot"], point.as_str());
    assert_eq!(b["mode"], "diff");
    assert_eq!(strings(&b["children"]), kids);
    assert!(b["pause_ms"].as_f64().unwrap() > 0.0, "{b}");
    let created = position(&seen, |v| {
        v["kind"] == "snapshot.created" && v["id"] == point.as_str()
    })
    .unwrap_or_else(|| panic!("no snapshot.created for {point}: {seen:?}"));
    let snap = &seen[created]["snapshot"];
    assert_eq!(snap["mode"], "diff", "{snap}");
    assert!(snap["pause_ms"].as_f64().unwrap() > 0.0, "{snap}");
    for k in &kids {
        let c = position(&seen, |v| {
            v["kind"] == "sandbox.created" && v["id"] == k.as_str()
        })
        .unwrap_or_else(|| panic!("no sandbox.created for child {k}: {seen:?}"));
        assert!(created < c, "the branch point comes before its children");
        assert_eq!(seen[c]["sandbox"]["snapshot"], point.as_str());
    }
    let last_before_rm = seen.last().unwrap()["seq"].as_u64().unwrap();

    d.ok(&["rm", &kids[0]]);
    let seen = until(&rx, "the child's removal", |v| {
        v["kind"] == "sandbox.deleted" && v["id"] == kids[0].as_str()
    });
    let gone = seen.last().unwrap();
    assert!(
        gone.get("sandbox").is_none(),
        "a deleted event carries only the id: {gone}"
    );

    // A reconnect from the branch event replays what came after it.
    let replay = stream(port, &auth, Some(last_before_rm));
    assert_eq!(next(&replay, "ready").0, "ready");
    let again = until(&replay, "the replayed removal", |v| {
        v["kind"] == "sandbox.deleted" && v["id"] == kids[0].as_str()
    });
    assert_eq!(
        again.iter().map(|v| v["seq"].as_u64()).collect::<Vec<_>>(),
        seen.iter().map(|v| v["seq"].as_u64()).collect::<Vec<_>>(),
        "the same events, by the same numbers"
    );
    assert_eq!(again[0]["seq"].as_u64(), Some(last_before_rm + 1));
}

#[test]
#[ignore = "starts a daemon; run with --include-ignored (make test does)"]
fn the_dashboard_needs_the_token_or_its_session_cookie() {
    let port = free_port();
    let d = Daemon::start_with(Some((format!("127.0.0.1:{port}"), TOKEN.into())));
    let ui = d.home.join("ui");
    std::fs::create_dir_all(ui.join("assets")).unwrap();
    std::fs::write(
        ui.join("index.html"),
        "<!doctype html><title>test index</title>",
    )
    .unwrap();
    std::fs::write(ui.join("assets/app.js"), "console.log(1)").unwrap();

    // No session: the page sends the browser to the login, the API says 401.
    let (st, head, _) = get(port, "/ui/", "");
    assert_eq!(st, 303, "{head}");
    assert!(
        head.to_lowercase().contains("location: /ui/login"),
        "{head}"
    );
    let (st, _, _) = get(port, "/v1/info", "");
    assert_eq!(st, 401);
    let (st, head, body) = get(port, "/ui/login", "");
    assert_eq!(st, 200);
    assert!(body.contains("name=\"token\""), "{body}");
    assert!(
        head.to_lowercase()
            .contains("content-security-policy: default-src 'self'"),
        "{head}"
    );

    let login = |token: &str| {
        let form = format!("token={token}");
        http(
            port,
            &format!(
                "POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
                form.len()
            ),
        )
    };
    let (st, head, body) = login("not-the-token");
    assert_eq!(st, 401, "{head}");
    assert!(body.contains("Wrong token"), "{body}");
    assert!(!head.to_lowercase().contains("set-cookie"), "{head}");

    let (st, head, _) = login(TOKEN);
    assert_eq!(st, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("set-cookie")
                .then(|| v.trim().to_string())
        })
        .expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(TOKEN),
        "the cookie is not the token: {cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let with = format!("Cookie: {pair}\r\n");

    let (st, head, body) = get(port, "/ui/", &with);
    assert_eq!(st, 200, "{head}");
    assert!(body.contains("test index"));
    let (st, _, body) = get(port, "/ui/sandbox/sb-123", &with);
    assert_eq!(
        (st, body.contains("test index")),
        (200, true),
        "app routes get index.html"
    );
    let (st, head, _) = get(port, "/ui/assets/app.js", &with);
    assert_eq!(st, 200);
    assert!(head.to_lowercase().contains("text/javascript"), "{head}");
    let (st, _, _) = get(port, "/ui/../state.db", &with);
    assert!(
        st == 404 || st == 400,
        "no way out of the ui directory: {st}"
    );
    let (st, _, body) = get(port, "/v1/info", &with);
    assert_eq!(st, 200, "{body}");
    let (st, _, _) = get(port, "/v1/info", "Cookie: forkvm_session=0123\r\n");
    assert_eq!(st, 401, "a wrong cookie is no session");
    let (st, _, _) = get(port, "/ui/", "Cookie: forkvm_session=0123\r\n");
    assert_eq!(st, 303);
    drop(d);
}

#[test]
#[ignore = "starts a daemon; run with --include-ignored (make test does)"]
fn forkvm_ui_relays_the_socket_only_for_its_login_link() {
    let d = Daemon::start();
    let port = free_port();
    let mut child = d
        .cmd()
        .args(["ui", "--no-open", "--port", &port.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("forkvm ui");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    out.read_line(&mut url).unwrap();
    let url = url.trim().to_string();
    let result = std::panic::catch_unwind(|| {
        let path = url
            .strip_prefix(&format!("http://127.0.0.1:{port}"))
            .unwrap_or_else(|| panic!("unexpected URL {url:?}"));
        assert!(path.starts_with("/ui/login?key="), "{url}");
        // Without the key: refused, whatever the path.
        let (st, _, body) = get(port, "/v1/info", "");
        assert_eq!(st, 403, "{body}");
        let (st, _, _) = get(port, "/ui/login?key=guess", "");
        assert_eq!(st, 403);
        let (st, head, _) = get(port, path, "");
        assert_eq!(st, 303, "{head}");
        let pair = head
            .lines()
            .find_map(|l| l.strip_prefix("Set-Cookie: "))
            .and_then(|c| c.split(';').next())
            .expect("the relay's cookie")
            .to_string();
        let (st, _, body) = get(port, "/v1/info", &format!("Cookie: {pair}\r\n"));
        assert_eq!(st, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["version"].is_string(), "{v}");
    });
    // SAFETY: signalling the relay this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
