//! Sandbox networking against real VMs: egress through NAT, `network: none`,
//! isolation from the host and from other sandboxes, the allow-list, port
//! forwarding, the network of branched children (including connections the
//! source had open), and cleanup after many cycles and a daemon crash.
//!
//! "The internet" is a network namespace this test creates, joined to the
//! host by a veth pair, with Python servers listening inside it
//! (`network/internet.rs`). `network/namespace.rs` holds the allow-list's
//! tests for processes inside a sandbox's namespace and for the host;
//! `network/change.rs` changes a running sandbox's allow-list.

#[path = "network/change.rs"]
mod change;
mod common;
#[path = "network/internet.rs"]
mod internet;
#[path = "network/namespace.rs"]
mod namespace;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::*;
use internet::internet;

/// Fetch a URL in the guest with curl; returns (exit code, stdout).
fn guest_fetch(d: &Daemon, id: &str, url: &str, secs: u32) -> (i32, String) {
    let o = d.run(&[
        "exec",
        id,
        "--",
        "curl",
        "-sS",
        "--max-time",
        &secs.to_string(),
        url,
    ]);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

/// GET a path on a host loopback port (plain HTTP/1.0 over a socket).
fn host_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// Retry `host_get` while the guest server starts.
fn host_get_retry(port: u16, path: &str) -> String {
    let mut last = None;
    for _ in 0..200 {
        last = host_get(port, path);
        if let Some(b) = &last {
            if !b.is_empty() {
                return b.clone();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("nothing answered on 127.0.0.1:{port}{path} ({last:?})");
}

fn ports_of(d: &Daemon, id: &str) -> Vec<(u16, u16)> {
    let v = d.json(&["port", id]);
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["guest"].as_u64().unwrap() as u16,
                p["host"].as_u64().unwrap() as u16,
            )
        })
        .collect()
}

/// A guest HTTP server on `port` that answers with the guest's hostname.
fn start_hostname_server(d: &Daemon, id: &str, port: u16) {
    let program = format!(
        r#"
import http.server, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("host=%s\n" % socket.gethostname()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", {port}), H).serve_forever()
"#
    );
    start_python(d, id, "/root/srv.py", "/root/srv.log", &program);
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn egress_works_with_nat_and_not_with_none() {
    let d = shared();
    let net = internet();
    let info = d.json(&["info"]);
    assert_eq!(info["network"]["available"], true, "{info}");
    assert_eq!(info["network"]["default_mode"], "nat");

    let sb = d.spawn();
    let (rc, out) = guest_fetch(d, &sb.id, &net.url("/hello"), 20);
    assert_eq!(rc, 0, "a nat sandbox must reach the test's server: {out}");
    assert_eq!(out, "hello from the internet\n");
    let v = d.json(&["inspect", &sb.id]);
    let n = &v["network"];
    assert_eq!(n["mode"], "nat", "{v}");
    assert_eq!(n["guest_ip"], "172.16.0.2");
    // In the daemon's pool (the test launcher gives each daemon a /20).
    let pool = info["network"]["pool"].as_str().unwrap();
    assert_eq!(pool, d.ready["net_pool"].as_str().unwrap());
    let (base, _) = pool.split_once('/').unwrap();
    let prefix: String = base.split('.').take(2).collect::<Vec<_>>().join(".");
    assert!(
        n["host_ip"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{prefix}.")),
        "{n} not in {pool}"
    );
    assert!(v["timings"]["network_ms"].as_f64().is_some(), "{v}");
    assert!(v["timings"]["network_ready_ms"].as_f64().is_some(), "{v}");

    let none = d.ok(&["spawn", "--network", "none"]).trim().to_string();
    let (rc, out) = guest_fetch(d, &none, &net.url("/hello"), 5);
    assert_ne!(rc, 0, "a network:none sandbox reached the server: {out}");
    let v = d.json(&["inspect", &none]);
    assert_eq!(v["network"]["mode"], "none", "{v}");
    assert!(v["network"]["host_ip"].is_null());
    // Its own kernel still has loopback.
    assert_eq!(
        sh(d, &none, "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(\"ok\")'"),
        "ok\n"
    );
    d.ok(&["rm", &none]);

    // Bad network requests are refused before anything starts.
    for (args, want) in [
        (
            vec!["spawn", "--network", "none", "--port", "80"],
            "need network: nat",
        ),
        (vec!["spawn", "--allow", "10.0.0.1/24"], "host bits"),
        (vec!["spawn", "--allow-host"], "--allow"),
        (
            vec!["spawn", "--port", "80", "--port", "80"],
            "listed twice",
        ),
        (
            vec!["spawn", "--count", "2", "--port", "80:18080"],
            "cannot share host port",
        ),
    ] {
        let o = d.run(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    let o = d.run(&["spawn", "--port", "0"]);
    assert!(
        stderr(&o).contains("guest port cannot be 0"),
        "{}",
        stderr(&o)
    );
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn guests_cannot_reach_the_host_or_each_other_unless_allowed() {
    let net = internet();
    let token = "t0ken-net";
    // The daemon listens on every host address, so a sandbox would reach
    // its TCP port through any of them if the host table let it.
    let port = {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let d = Daemon::start_with(Some((format!("0.0.0.0:{port}"), token.into())));
    // An endpoint behind the token: a 401 proves the request reached the
    // daemon.
    let api = format!("http://{}:{port}/v1/info", net.host_addr);
    // Negative control: the host itself reaches the daemon at that address.
    let o = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &api])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "401");

    let a = d.spawn();
    let b_id = d.ok(&["spawn", "--port", "8000"]).trim().to_string();
    let b = Sandbox {
        d: &d,
        id: b_id.clone(),
    };
    start_hostname_server(&d, &b.id, 8000);
    let (_, hp) = ports_of(&d, &b.id)[0];
    assert_eq!(host_get_retry(hp, "/"), format!("host={}\n", b.id));
    let b_uplink = d.json(&["inspect", &b.id])["network"]["uplink_ip"]
        .as_str()
        .unwrap()
        .to_string();
    let a_host_ip = d.json(&["inspect", &a.id])["network"]["host_ip"]
        .as_str()
        .unwrap()
        .to_string();

    let code = |id: &str, url: &str| {
        let out = try_sh(
            &d,
            id,
            &format!(
                "curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 {url}; echo \" rc=$?\""
            ),
        );
        out.trim().to_string()
    };
    // The daemon's port, through the host's address on the test link and
    // through the sandbox's own gateway on the host: unreachable.
    for url in [api.clone(), format!("http://{a_host_ip}:{port}/v1/health")] {
        let r = code(&a.id, &url);
        assert!(
            r.starts_with("000"),
            "the guest reached the daemon at {url}: {r}"
        );
    }
    // Another sandbox's published port, through its uplink: unreachable.
    let r = code(&a.id, &format!("http://{b_uplink}:8000/"));
    assert!(r.starts_with("000"), "sandbox A reached sandbox B: {r}");
    // The outside world still works from A.
    assert_eq!(guest_fetch(&d, &a.id, &net.url("/hello"), 20).0, 0);

    // An allow-list naming the daemon's address and port, with
    // --allow-host, opens exactly that, and closes everything else
    // (network/namespace.rs checks that without --allow-host the host stays
    // closed).
    let allowed = d
        .ok(&[
            "spawn",
            "--allow",
            &format!("{}:{port}", net.host_addr),
            "--allow",
            &format!("{b_uplink}:8000"),
            "--allow-host",
        ])
        .trim()
        .to_string();
    let c = Sandbox {
        d: &d,
        id: allowed.clone(),
    };
    assert_eq!(
        code(&c.id, &api),
        "401 rc=0",
        "the allow-list did not open the daemon"
    );
    assert_eq!(
        try_sh(
            &d,
            &c.id,
            &format!("curl -s --max-time 5 http://{b_uplink}:8000/")
        ),
        format!("host={}\n", b.id),
        "the allow-list did not open sandbox B's published port"
    );
    let t = std::time::Instant::now();
    let (rc, out) = guest_fetch(&d, &c.id, &net.url("/hello"), 10);
    assert_ne!(
        rc, 0,
        "a destination outside the allow-list answered: {out}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "refused egress should fail fast (reset), not time out"
    );
    drop(c);
    drop(b);
    drop(a);
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn a_forwarded_port_serves_the_host() {
    let d = shared();
    // A host port of our choosing, and one allocated by the daemon.
    let fixed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let id = d
        .ok(&[
            "spawn",
            "--port",
            "8000",
            "--port",
            &format!("8001:{fixed}"),
        ])
        .trim()
        .to_string();
    let sb = Sandbox { d, id };
    let ports = ports_of(d, &sb.id);
    assert_eq!(ports.len(), 2, "{ports:?}");
    assert!(ports.contains(&(8001, fixed)), "{ports:?}");
    let auto = ports.iter().find(|p| p.0 == 8000).unwrap().1;
    assert_ne!(auto, 0);
    // A stock `python3 -m http.server` in the guest, reached from the host.
    sh(
        d,
        &sb.id,
        "mkdir -p /srv/www && echo served-from-the-guest > /srv/www/index.txt && \
         cd /srv/www && (setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &) && \
         (setsid python3 -m http.server 8001 >/dev/null 2>&1 </dev/null &)",
    );
    assert_eq!(
        host_get_retry(auto, "/index.txt"),
        "served-from-the-guest\n"
    );
    assert_eq!(
        host_get_retry(fixed, "/index.txt"),
        "served-from-the-guest\n"
    );
    // The CLI's plain output names both.
    let text = d.ok(&["port", &sb.id]);
    assert!(
        text.contains(&format!("8001/tcp -> 127.0.0.1:{fixed}")),
        "{text}"
    );
    // A host port that is taken is a clear conflict, and leaves nothing.
    let before = d.json(&["ps"])["sandboxes"].as_array().unwrap().len();
    let o = d.run(&["spawn", "--port", &format!("8000:{fixed}")]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("pick another host port"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        d.json(&["ps"])["sandboxes"].as_array().unwrap().len(),
        before
    );
    // Removing the sandbox closes its ports.
    drop(sb);
    assert!(TcpStream::connect(("127.0.0.1", auto)).is_err());
    assert!(TcpStream::connect(("127.0.0.1", fixed)).is_err());
}

/// In the guest: open a connection to the line server, then for each
/// trigger file /tmp/go-N send a line with the hostname and record what
/// happened in /tmp/result-N.
const HOLDER: &str = r#"
import os, socket, time
s = socket.create_connection((os.environ["SRV"], 9000))
s.sendall(b"open " + socket.gethostname().encode() + b"\n")
f = s.makefile("rb")
f.readline()
n = 0
while True:
    if os.path.exists("/tmp/go-%d" % n):
        try:
            s.sendall(("line %s %d\n" % (socket.gethostname(), n)).encode())
            r = f.readline().decode().strip()
            res = "echo" if r.startswith("echo") else "eof:" + r
        except Exception as e:
            res = "error:" + type(e).__name__
        with open("/tmp/result-%d.tmp" % n, "w") as o:
            o.write(res)
        os.rename("/tmp/result-%d.tmp" % n, "/tmp/result-%d" % n)
        n += 1
    time.sleep(0.02)
"#;

fn trigger(d: &Daemon, id: &str, n: u32) -> String {
    sh(
        d,
        id,
        &format!("touch /tmp/go-{n}; for i in $(seq 300); do [ -f /tmp/result-{n} ] && break; sleep 0.05; done; cat /tmp/result-{n}"),
    )
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn branched_children_serve_on_their_own_ports_and_drop_inherited_connections() {
    let d = shared();
    let net = internet();
    let src = d.ok(&["spawn", "--port", "8000"]).trim().to_string();
    let src = Sandbox { d, id: src };
    start_hostname_server(d, &src.id, 8000);
    let (_, src_port) = ports_of(d, &src.id)[0];
    assert_eq!(host_get_retry(src_port, "/"), format!("host={}\n", src.id));
    // A connection the source holds open across the branch.
    let program = format!("import os\nos.environ['SRV'] = '{}'\n{HOLDER}", net.addr);
    start_python(d, &src.id, "/root/holder.py", "/root/holder.log", &program);
    assert!(
        wait_until(Duration::from_secs(60), || net
            .log("line.log")
            .contains(&format!("open {}", src.id))),
        "the source did not connect: {}",
        try_sh(d, &src.id, "cat /root/holder.log")
    );
    assert_eq!(trigger(d, &src.id, 0), "echo");

    let v = d.json(&["branch", &src.id, "--mode", "diff", "--count", "4"]);
    let kids: Vec<String> = ids(&v["children"]);
    assert_eq!(kids.len(), 4, "{v}");
    let _guards: Vec<Sandbox> = kids.iter().map(|k| Sandbox { d, id: k.clone() }).collect();
    let mut host_ports = vec![src_port];
    for k in &kids {
        let c = &v["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == *k)
            .unwrap();
        assert!(
            c["timings"]["network_ready_ms"].as_f64().is_some(),
            "children must come up with their network proven: {c}"
        );
        let p = ports_of(d, k);
        assert_eq!(
            p.len(),
            1,
            "a child inherits the source's guest ports: {p:?}"
        );
        assert_eq!(p[0].0, 8000);
        host_ports.push(p[0].1);
        // The server process came over from the source; it answers with the
        // child's own hostname, on the child's own host port.
        assert_eq!(host_get_retry(p[0].1, "/"), format!("host={k}\n"));
        // Its own egress works at once.
        let (rc, out) = guest_fetch(d, k, &net.url(&format!("/from-{k}")), 20);
        assert_eq!(
            (rc, out.as_str()),
            (0, format!("seen /from-{k}\n").as_str())
        );
    }
    host_ports.sort_unstable();
    host_ports.dedup();
    assert_eq!(host_ports.len(), 5, "every sandbox has its own host port");
    // The source keeps serving, on its own port.
    assert_eq!(host_get_retry(src_port, "/"), format!("host={}\n", src.id));
    assert!(net.log("http.log").contains(&format!("/from-{}", kids[0])));

    // The connection the source had open: in each child it is reset, and
    // nothing a child sends on it reaches the server.
    for k in &kids {
        let r = trigger(d, k, 1);
        assert!(
            r.starts_with("error:") || r.starts_with("eof:"),
            "child {k}'s inherited connection still worked: {r}"
        );
    }
    // In the source it still works.
    assert_eq!(trigger(d, &src.id, 1), "echo");
    let log = net.log("line.log");
    assert!(log.contains(&format!("line {} 1", src.id)), "{log}");
    for k in &kids {
        assert!(
            !log.contains(&format!("line {k}")),
            "child {k}'s data reached the server on the source's connection:\n{log}"
        );
    }
}

/// The host-side uplink name of a sandbox (or of its namespace name), as
/// docs/networking.md gives it: `fvh` and the last 12 alphanumerics.
fn host_if(id: &str) -> String {
    let tail: String = id.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    format!("fvh{}", &tail[tail.len().saturating_sub(12)..])
}

fn link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

/// Records under `/run/forkvm/net/<sub>` that name this daemon's home:
/// (file name, contents).
fn owned_records(d: &Daemon, sub: &str) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(format!("/run/forkvm/net/{sub}")) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            (name, std::fs::read_to_string(e.path()).unwrap_or_default())
        })
        .filter(|(_, t)| t.lines().any(|l| std::path::Path::new(l) == d.home))
        .collect()
}

/// Everything of one daemon's networking that could leak.
fn leftovers(d: &Daemon, ids: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for id in ids {
        let ns = format!("fvm-{id}");
        if std::path::Path::new("/run/netns").join(&ns).exists() {
            left.push(format!("namespace {ns}"));
        }
        let host_if = host_if(id);
        if link_exists(&host_if) {
            left.push(format!("link {host_if}"));
        }
    }
    // Pool claims and namespace owners recorded for these sandboxes.
    for sub in ["slots", "ns"] {
        for (name, t) in owned_records(d, sub) {
            if ids
                .iter()
                .any(|id| name == format!("fvm-{id}") || t.starts_with(&format!("{id}\n")))
            {
                left.push(format!("registry {sub}/{name}"));
            }
        }
    }
    // The daemon's host table names none of their interfaces.
    let table = format!("forkvm-{}", forkvm_daemon::config::home_hash(&d.home));
    let o = Command::new("nft")
        .args(["list", "set", "inet", &table, "ifaces"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the daemon's host table {table} is missing"
    );
    let text = String::from_utf8_lossy(&o.stdout);
    for id in ids {
        let host_if = host_if(id);
        if text.contains(&host_if) {
            left.push(format!("nft set {table} ifaces holds {host_if}"));
        }
    }
    left
}

/// Listening TCP ports of a process (from /proc/net/tcp and its fds).
/// The daemon's listening ports other than its own API port (the test
/// launcher always serves TCP too).
fn forwarded_ports(d: &Daemon, pid: u32) -> Vec<u16> {
    let api = d.ready["port"].as_u64();
    listening_ports(pid)
        .into_iter()
        .filter(|p| Some(u64::from(*p)) != api)
        .collect()
}

fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy().to_string();
                if let Some(i) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(i.to_string());
                }
            }
        }
    }
    let f = std::fs::File::open("/proc/net/tcp").unwrap();
    BufReader::new(f)
        .lines()
        .skip(1)
        .map_while(Result::ok)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // state 0A = LISTEN
            (w.len() > 9 && w[3] == "0A" && inodes.contains(w[9]))
                .then(|| u16::from_str_radix(w[1].split(':').nth(1)?, 16).ok())
                .flatten()
        })
        .collect()
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn nothing_is_left_after_many_cycles_and_a_daemon_crash() {
    let net = internet();
    let mut d = Daemon::start();
    let mut seen = Vec::new();
    for i in 0..50 {
        let id = d.ok(&["spawn", "--port", "8000"]).trim().to_string();
        if i % 10 == 0 {
            assert_eq!(guest_fetch(&d, &id, &net.url("/hello"), 20).0, 0);
        }
        seen.push(id.clone());
        d.ok(&["rm", &id]);
    }
    let left = leftovers(&d, &seen);
    assert!(left.is_empty(), "after 50 spawn/rm cycles: {left:?}");
    let daemon_pid = d.child.as_ref().unwrap().id();
    assert!(
        forwarded_ports(&d, daemon_pid).is_empty(),
        "forwarded ports left open: {:?}",
        forwarded_ports(&d, daemon_pid)
    );

    // Two sandboxes with published ports; the daemon is killed; one VM
    // dies while no daemon runs.
    let keep = d.ok(&["spawn", "--port", "8000"]).trim().to_string();
    let lost = d.ok(&["spawn", "--port", "8000"]).trim().to_string();
    let (_, keep_port) = ports_of(&d, &keep)[0];
    let (_, lost_port) = ports_of(&d, &lost)[0];
    let lost_pid = d.json(&["inspect", &lost])["pid"].as_u64().unwrap() as i32;
    d.stop(libc::SIGKILL);
    // SAFETY: killing a QEMU this test's daemon started.
    unsafe { libc::kill(lost_pid, libc::SIGKILL) };
    assert!(wait_until(Duration::from_secs(10), || !alive(
        lost_pid as u32
    )));
    d.spawn_process();
    // The survivor is back with its port and its network.
    assert_eq!(ports_of(&d, &keep), vec![(8000, keep_port)]);
    start_hostname_server(&d, &keep, 8000);
    assert_eq!(host_get_retry(keep_port, "/"), format!("host={keep}\n"));
    assert_eq!(guest_fetch(&d, &keep, &net.url("/hello"), 20).0, 0);
    // The lost one is failed, and its network is gone.
    let v = d.json(&["inspect", &lost]);
    assert_eq!(v["state"], "failed", "{v}");
    assert!(TcpStream::connect(("127.0.0.1", lost_port)).is_err());
    let left = leftovers(&d, std::slice::from_ref(&lost));
    assert!(left.is_empty(), "after the crash: {left:?}");
    d.ok(&["rm", &keep, &lost]);
    seen.extend([keep, lost]);
    let left = leftovers(&d, &seen);
    assert!(left.is_empty(), "at the end: {left:?}");
    let daemon_pid = d.child.as_ref().unwrap().id();
    assert!(forwarded_ports(&d, daemon_pid).is_empty());
    assert!(TcpStream::connect(("127.0.0.1", keep_port)).is_err());
}

/// Namespaces this daemon owns (from the host-wide registry) whose sandbox
/// it does not list: pooled QEMUs, or leaks.
fn unlisted_namespaces(d: &Daemon) -> Vec<String> {
    let listed: Vec<String> = d.json(&["ps"])["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("fvm-{}", s["id"].as_str().unwrap()))
        .collect();
    owned_records(d, "ns")
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !listed.contains(name))
        .collect()
}

/// A warm pool hands out QEMUs whose default network (`nat`, no port, no
/// allow-list) is already set up; a spawn that asks for another network
/// still gets a pooled QEMU, with its network redone; removing the pool
/// leaves nothing behind.
#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn a_warm_pool_hands_out_ready_networks_and_redoes_other_ones() {
    let net = internet();
    let d = Daemon::start();
    let first = d.spawn();
    let tpl = d.json(&["inspect", &first.id])["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    drop(first);
    d.ok(&["snapshot", "pool", &tpl, "2"]);
    let ready = || {
        wait_until(Duration::from_secs(120), || {
            d.json(&["info"])["pools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["snapshot"] == tpl.as_str() && p["ready"] == 2)
        })
    };
    // While they wait, each pooled QEMU has a namespace with its uplink.
    assert!(ready(), "the pool never filled");
    let pooled = unlisted_namespaces(&d);
    assert_eq!(pooled.len(), 2, "{pooled:?}");

    let spawn = |args: &[&str]| {
        let mut a = vec!["spawn", "--snapshot", tpl.as_str()];
        a.extend_from_slice(args);
        let v = d.json(&a);
        let v = if v.is_array() { v[0].clone() } else { v };
        assert_eq!(v["timings"]["from_pool"], true, "{v}");
        v
    };
    // The default network: ready-made, and it works.
    let a = spawn(&[]);
    let a_id = a["id"].as_str().unwrap().to_string();
    assert!(
        pooled.contains(&format!("fvm-{a_id}")),
        "{a} not from {pooled:?}"
    );
    assert_eq!(a["network"]["mode"], "nat", "{a}");
    assert!(a["timings"]["network_ready_ms"].as_f64().is_some(), "{a}");
    let (rc, out) = guest_fetch(&d, &a_id, &net.url("/hello"), 20);
    assert_eq!((rc, out.as_str()), (0, "hello from the internet\n"));

    // A published port: the pooled network is redone with the port.
    assert!(ready());
    let b = spawn(&["--port", "8000"]);
    let b_id = b["id"].as_str().unwrap().to_string();
    let ports = ports_of(&d, &b_id);
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(guest_fetch(&d, &b_id, &net.url("/hello"), 20).0, 0);
    start_hostname_server(&d, &b_id, 8000);
    assert_eq!(host_get_retry(ports[0].1, "/"), format!("host={b_id}\n"));

    // No network: the pooled uplink is taken away.
    assert!(ready());
    let c = spawn(&["--network", "none"]);
    let c_id = c["id"].as_str().unwrap().to_string();
    assert_eq!(c["network"]["mode"], "none", "{c}");
    let (rc, out) = guest_fetch(&d, &c_id, &net.url("/hello"), 5);
    assert_ne!(
        rc, 0,
        "a network:none sandbox from the pool reached the server: {out}"
    );
    // After a spawn that asked for another network, refills leave the
    // network to the spawn: a pooled namespace without an uplink appears.
    assert!(ready());
    let bare = unlisted_namespaces(&d)
        .iter()
        .any(|n| !link_exists(&host_if(n)));
    assert!(bare, "every pooled QEMU still has a ready-made uplink");

    // Turning the pool off and removing the sandboxes leaves nothing.
    assert!(ready());
    let mut all: Vec<String> = unlisted_namespaces(&d)
        .iter()
        .map(|n| n.trim_start_matches("fvm-").to_string())
        .collect();
    d.ok(&["snapshot", "pool", &tpl, "0"]);
    for id in [&a_id, &b_id, &c_id] {
        d.ok(&["rm", id]);
        all.push(id.clone());
    }
    assert!(
        wait_until(Duration::from_secs(30), || leftovers(&d, &all).is_empty()),
        "left behind: {:?}",
        leftovers(&d, &all)
    );
    assert!(unlisted_namespaces(&d).is_empty());
}
