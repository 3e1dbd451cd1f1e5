//! The egress allow-list holds for every packet that leaves a sandbox's
//! namespace, not only the guest's: a process that joins the namespace with
//! QEMU's uid (what a compromised QEMU is) meets the same list. And the
//! host's own services stay closed to a sandbox whatever its allow-list
//! says, unless it was given `--allow-host`.
//!
//! Every destination is one this test made: the servers of the test's
//! "internet" namespace, and a listener on the host's address on the link
//! to that namespace.

use std::io::Write;
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::internet::internet;

/// Connect to `addr:port`, send `send`, and print the first line of the
/// answer (`got ...`), or why there was none (`refused` for a reset or
/// EPERM, `failed` for anything else, a time-out included).
pub(crate) const DIAL: &str = r#"
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    s.settimeout(5)
    s.sendall(sys.argv[4].encode().decode("unicode_escape").encode())
    print("got", s.recv(200).decode().strip().splitlines()[0])
except (ConnectionRefusedError, PermissionError) as e:
    print("refused", type(e).__name__)
except Exception as e:
    print("failed", type(e).__name__, e)
"#;

/// Dial from the guest.
pub(crate) fn guest_dial(d: &Daemon, id: &str, addr: &str, port: u16, send: &str) -> String {
    let o = d.run(&[
        "exec",
        id,
        "--",
        "python3",
        "-c",
        DIAL,
        addr,
        &port.to_string(),
        "5",
        send,
    ]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A process's real uid and gid, from /proc.
fn ids_of(pid: u32) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("QEMU's status");
    let field = |name: &str| -> u32 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("Uid:"), field("Gid:"))
}

/// Dial from a process that joins the network namespace of the sandbox's
/// QEMU and takes QEMU's uid and gid, as a compromised QEMU could.
fn ns_dial(qemu: u32, addr: &str, port: u16, send: &str) -> String {
    let (uid, gid) = ids_of(qemu);
    eprintln!("dialing {addr}:{port} in QEMU {qemu}'s namespace as uid {uid} gid {gid}");
    let o = Command::new("nsenter")
        .arg(format!("--net=/proc/{qemu}/ns/net"))
        .args([
            "setpriv",
            "--reuid",
            &uid.to_string(),
            "--regid",
            &gid.to_string(),
        ])
        .args(["--clear-groups", "/usr/bin/python3", "-I", "-c", DIAL, addr])
        .args([&port.to_string(), "5", send])
        .current_dir("/")
        .output()
        .expect("nsenter and setpriv (util-linux) are needed for this test");
    assert!(
        o.status.success(),
        "nsenter/setpriv failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A TCP server on the host itself, on `addr`, that greets each client
/// and counts them. It lives as long as the test process.
pub(crate) fn host_server(addr: &str) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind((addr, 0)).expect("a listener on the host's link address");
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            s.fetch_add(1, Ordering::SeqCst);
            let mut c = c;
            let _ = c.write_all(b"host says hi\n");
        }
    });
    (port, seen)
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn the_allow_list_holds_in_the_namespace_and_the_host_needs_allow_host() {
    let d = shared();
    let net = internet();
    let (hport, host_seen) = host_server(&net.host_addr);
    // Negative control: the host's server answers the host.
    let o = Command::new("/usr/bin/python3")
        .args([
            "-I",
            "-c",
            DIAL,
            &net.host_addr,
            &hport.to_string(),
            "5",
            "",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "got host says hi"
    );
    host_seen.store(0, Ordering::SeqCst);

    // The allow-list: the internet's HTTP port, and the host's server's
    // port on any address; not the internet's line server on 9000.
    let id = d
        .ok(&[
            "spawn",
            "--allow",
            &format!("{}:8080", net.addr),
            "--allow",
            &format!("0.0.0.0/0:{hport}"),
        ])
        .trim()
        .to_string();
    let sb = Sandbox { d, id: id.clone() };
    let qemu = sb.pid();
    let get = "GET /hello HTTP/1.0\\r\\n\\r\\n";

    // A process in the namespace, with QEMU's uid: the allowed destination
    // works (this also proves nsenter/setpriv put us where QEMU is)...
    let r = ns_dial(qemu, &net.addr, 8080, get);
    assert_eq!(r, "got HTTP/1.0 200 OK", "the allowed destination failed");
    assert!(net.log("http.log").contains("/hello"));
    // ...one not on the list is refused at once, in the namespace, and
    // never reaches the server.
    let before = net.log("line.log");
    let t = Instant::now();
    let r = ns_dial(qemu, &net.addr, 9000, "from-the-namespace\\n");
    assert!(
        r.starts_with("refused"),
        "a process in the sandbox's namespace reached {}:9000, which is not on the allow-list: {r}",
        net.addr
    );
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "refused egress should fail fast"
    );
    assert!(!net.log("line.log").contains("from-the-namespace"));
    assert_eq!(net.log("line.log"), before);
    // The guest meets the same list.
    assert_eq!(
        guest_dial(d, &id, &net.addr, 8080, get),
        "got HTTP/1.0 200 OK"
    );
    let r = guest_dial(d, &id, &net.addr, 9000, "from-the-guest\\n");
    assert!(r.starts_with("refused"), "the guest reached 9000: {r}");

    // `0.0.0.0/0:PORT` covers the host's address, but without --allow-host
    // the host's own server on PORT stays closed, to the guest and to the
    // namespace alike.
    let r = guest_dial(d, &id, &net.host_addr, hport, "");
    assert!(!r.starts_with("got"), "the guest reached the host: {r}");
    let r = ns_dial(qemu, &net.host_addr, hport, "");
    assert!(!r.starts_with("got"), "the namespace reached the host: {r}");
    assert_eq!(host_seen.load(Ordering::SeqCst), 0);
    let v = d.json(&["inspect", &id]);
    assert!(v["network"]["allow_host"].is_null(), "{v}");
    drop(sb);

    // With --allow-host the same entry opens it.
    let id = d
        .ok(&[
            "spawn",
            "--allow",
            &format!("0.0.0.0/0:{hport}"),
            "--allow-host",
        ])
        .trim()
        .to_string();
    let sb = Sandbox { d, id: id.clone() };
    assert_eq!(
        guest_dial(d, &id, &net.host_addr, hport, ""),
        "got host says hi"
    );
    assert_eq!(
        ns_dial(sb.pid(), &net.host_addr, hport, ""),
        "got host says hi"
    );
    assert_eq!(host_seen.load(Ordering::SeqCst), 2);
    // Still only the list: the internet's HTTP port is not on it.
    let r = ns_dial(sb.pid(), &net.addr, 8080, get);
    assert!(r.starts_with("refused"), "{r}");
    let v = d.json(&["inspect", &id]);
    assert_eq!(v["network"]["allow_host"], true, "{v}");
    drop(sb);
}
