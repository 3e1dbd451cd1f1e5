//! A running sandbox's egress allow-list changed in place (`forkvm network`,
//! `PUT /v1/sandboxes/{id}/network`): closed, open, closed again, without a
//! restart; the host's own services follow `--allow-host` both ways; a
//! connection established before a change is kept; the changed list is
//! the one a resume sets up.
//!
//! Every destination is one this test made: the servers of the test's
//! "internet" namespace, and a listener on the host's address on the link
//! to that namespace. 192.0.2.1 (TEST-NET-1) only fills an allow-list that
//! lets nothing this test dials through; nothing dials it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use crate::internet::internet;
use crate::namespace::{guest_dial, host_server};

const GET: &str = "GET /hello HTTP/1.0\\r\\n\\r\\n";

/// Keep one connection to the line server open across a change: send a
/// line, wait for `go` to appear, send a second one, print both echoes.
const HOLD: &str = r#"
import os, socket, sys, time
s = socket.create_connection((sys.argv[1], 9000), timeout=10)
s.settimeout(60)
f = s.makefile("rwb")
f.write(b"held-one\n"); f.flush()
print(f.readline().decode().strip(), flush=True)
deadline = time.time() + 120
while not os.path.exists("/tmp/go") and time.time() < deadline:
    time.sleep(0.2)
f.write(b"held-two\n"); f.flush()
print(f.readline().decode().strip(), flush=True)
"#;

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn a_running_sandboxs_allow_list_changes_both_ways_without_a_restart() {
    let d = shared();
    let net = internet();
    let (hport, host_seen) = host_server(&net.host_addr);

    // Closed: the list names only an address nothing here serves.
    let id = d
        .ok(&["spawn", "--allow", "192.0.2.1/32"])
        .trim()
        .to_string();
    let sb = Sandbox { d, id: id.clone() };
    let qemu = sb.pid();
    let r = guest_dial(d, &id, &net.addr, 8080, GET);
    assert!(
        r.starts_with("refused"),
        "closed egress let 8080 through: {r}"
    );

    // Open: any egress, in place (same QEMU).
    let t = std::time::Instant::now();
    let out = d.ok(&["network", &id, "--any"]);
    eprintln!(
        "forkvm network --any took {:?} (CLI process included)",
        t.elapsed()
    );
    assert!(out.contains("any egress"), "{out}");
    assert_eq!(
        guest_dial(d, &id, &net.addr, 8080, GET),
        "got HTTP/1.0 200 OK"
    );
    let v = d.json(&["inspect", &id]);
    assert!(v["network"]["egress"].is_null(), "{v}");
    // Any egress still leaves the host closed.
    let r = guest_dial(d, &id, &net.host_addr, hport, "");
    assert!(!r.starts_with("got"), "any egress opened the host: {r}");

    // Closed again, but for the line server; a connection to it opened
    // before the next change is kept.
    d.ok(&["network", &id, "--allow", &format!("{}:9000", net.addr)]);
    let r = guest_dial(d, &id, &net.addr, 8080, GET);
    assert!(
        r.starts_with("refused"),
        "8080 still open after the change: {r}"
    );
    let held = {
        let addr = net.addr.clone();
        let id = id.clone();
        std::thread::spawn(move || {
            let o = shared().run(&["exec", &id, "--", "python3", "-c", HOLD, &addr]);
            String::from_utf8_lossy(&o.stdout).to_string()
        })
    };
    assert!(
        wait_until(Duration::from_secs(60), || net
            .log("line.log")
            .contains("held-one")),
        "the held connection did not open"
    );
    d.ok(&["network", &id, "--allow", "192.0.2.1/32"]);
    let r = guest_dial(d, &id, &net.addr, 9000, "fresh\\n");
    assert!(
        r.starts_with("refused"),
        "a new connection to 9000 got through: {r}"
    );
    sh(d, &id, "touch /tmp/go");
    let out = held.join().unwrap();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["echo held-one", "echo held-two"],
        "the established connection was cut"
    );

    // The host follows --allow-host, both ways.
    let entry = format!("0.0.0.0/0:{hport}");
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["--json", "network", &id, "--allow", &entry, "--allow-host"]))
            .unwrap();
    assert_eq!(v["allow_host"], true, "{v}");
    assert_eq!(
        guest_dial(d, &id, &net.host_addr, hport, ""),
        "got host says hi"
    );
    assert_eq!(host_seen.load(Ordering::SeqCst), 1);
    let v = d.json(&["inspect", &id]);
    assert_eq!(v["network"]["allow_host"], true, "{v}");
    d.ok(&["network", &id, "--allow", &entry]);
    let r = guest_dial(d, &id, &net.host_addr, hport, "");
    assert!(!r.starts_with("got"), "the host stayed open: {r}");
    assert_eq!(host_seen.load(Ordering::SeqCst), 1);
    let v = d.json(&["inspect", &id]);
    assert!(v["network"]["allow_host"].is_null(), "{v}");
    assert_eq!(v["network"]["egress"][0]["cidr"], "0.0.0.0/0", "{v}");

    // All of it without a restart.
    assert_eq!(sb.pid(), qemu, "the sandbox was restarted");

    // The list is the sandbox's record: a paused sandbox cannot change it,
    // and its resume sets up the changed one, not the one it was spawned with.
    d.ok(&["pause", &id]);
    let o = d.run(&["network", &id, "--any"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("paused"), "{}", stderr(&o));
    d.ok(&["resume", &id]);
    let v = d.json(&["inspect", &id]);
    assert_eq!(v["network"]["egress"][0]["cidr"], "0.0.0.0/0", "{v}");
    assert_eq!(v["network"]["egress"][0]["ports"][0], hport, "{v}");
    let r = guest_dial(d, &id, &net.addr, 8080, GET);
    assert!(
        r.starts_with("refused"),
        "the resumed sandbox lost its list: {r}"
    );

    // What cannot change is refused clearly.
    let o = d.run(&["network", &id, "--allow", "example.com"]);
    assert!(!o.status.success());
    let o = d.run(&["network", "no-such-sandbox", "--any"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no sandbox"), "{}", stderr(&o));
    drop(sb);
    let id = d.ok(&["spawn", "--network", "none"]).trim().to_string();
    let sb = Sandbox { d, id: id.clone() };
    let o = d.run(&["network", &id, "--any"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("has no network"), "{}", stderr(&o));
    drop(sb);
}
