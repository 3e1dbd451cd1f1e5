//! An unauthenticated client against a daemon's listeners (issue 30, break 1).
//!
//! The daemon is started with `RLIMIT_NOFILE` at 2,048, soft and hard, so it
//! cannot raise it. An attacker with no token then keeps 1,600 idle TCP
//! connections and 500 slowloris connections (a request head that grows by
//! one header line every 5 s) open, reopening whatever the daemon closes
//! every 5 s, for 40 s. Throughout, `/v1/health` over TCP (with the token, a fresh
//! connection each time) and over the unix socket must answer 200 within
//! 1 s, and a running sandbox must stay `running` and still answer exec.
//! Afterwards an idle connection and a slowloris one must have been closed
//! by the daemon's idle and header timeouts, and the log must not show
//! `Too many open files`.
//!
//! Before connection hygiene (crate `forkvm-daemon`, module `listen`) the
//! daemon ran out of descriptors at about 2,040 connections: health timed
//! out and `accept` failed with EMFILE.
//!
//! A client that reconnects as fast as it is evicted (about 2,000
//! connections a second here) is a connection-rate flood. From the same
//! address as the health checker nothing in the daemon tells them apart,
//! and with the attacker reopening every second, 2 of 5 runs saw one health
//! connection among about 155 reset; the answer to that is a rate limit per
//! source address in front of the daemon (docs/api.md, "Connections").

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const TOKEN: &str = "flood-test-token";
const IDLE: usize = 1_600;
const SLOW: usize = 500;
const FLOOD_FOR: Duration = Duration::from_secs(40);
/// How often the attacker reopens what was closed and sends a slowloris
/// connection its next header line.
const REOPEN_EVERY: Duration = Duration::from_secs(5);

/// This process holds 2,100 sockets and more: raise its own soft limit.
fn raise_own_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct on this stack.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    assert!(
        r.rlim_cur >= 8192,
        "this test needs a hard RLIMIT_NOFILE of at least 8192 (have {}): raise it with `ulimit -Hn`",
        r.rlim_cur
    );
}

/// One request over a fresh stream; returns the status and the time taken.
fn request<S: Read + Write>(mut s: S, req: &str) -> Result<(u16, String), String> {
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((status, body.to_string()))
}

fn tcp_health(port: u16) -> Result<u16, String> {
    let s = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_secs(1),
    )
    .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let req = format!(
        "GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    request(s, &req).map(|r| r.0)
}

fn unix_get(d: &Daemon, path: &str) -> Result<(u16, String), String> {
    let s = UnixStream::connect(d.home.join("forkvm.sock")).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    request(
        s,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
}

/// Is this connection still open (no EOF or error waiting on it)?
fn open(s: &TcpStream) -> bool {
    let mut b = [0u8; 64];
    s.set_nonblocking(true).unwrap();
    let r = match (&*s).read(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
        Err(_) => false,
    };
    s.set_nonblocking(false).unwrap();
    r
}

fn connect(port: u16) -> Option<TcpStream> {
    TcpStream::connect(("127.0.0.1", port)).ok()
}

/// The attacker: keeps `IDLE` idle and `SLOW` slowloris connections open
/// until told to stop, reopening what the daemon closes. Returns how many
/// connections it opened in all.
fn attacker(port: u16, stop: Arc<AtomicBool>) -> usize {
    let mut opened = 0;
    let mut idle: Vec<Option<TcpStream>> = (0..IDLE).map(|_| None).collect();
    let mut slow: Vec<Option<TcpStream>> = (0..SLOW).map(|_| None).collect();
    let mut last_line = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for c in idle.iter_mut() {
            if c.as_ref().is_none_or(|s| !open(s)) {
                *c = connect(port);
                opened += 1;
            }
        }
        let line_due = last_line.elapsed() >= REOPEN_EVERY;
        for c in slow.iter_mut() {
            match c {
                Some(s) if open(s) => {
                    if line_due {
                        let _ = s.write_all(b"X-Slow: 1\r\n");
                    }
                }
                _ => {
                    *c = connect(port).and_then(|mut s| {
                        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
                            .ok()
                            .map(|_| s)
                    });
                    opened += 1;
                }
            }
        }
        if line_due {
            last_line = Instant::now();
        }
        // Reopen what was closed every 5 s: an attacker that holds its
        // connections, not a connection-rate flood (see the module doc).
        std::thread::sleep(REOPEN_EVERY);
    }
    opened
}

#[test]
#[ignore]
fn idle_and_slowloris_floods_leave_health_and_sandboxes_alone() {
    raise_own_nofile();
    let port = free_port();
    let d = Daemon::start_with_nofile((format!("127.0.0.1:{port}"), TOKEN.into()), 2048);
    let sb = d.spawn();
    let path = format!("/v1/sandboxes/{}", sb.id);

    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || attacker(port, stop))
    };
    // Let the flood build up to its full size first.
    std::thread::sleep(Duration::from_secs(3));

    let t = Instant::now();
    let mut worst_tcp = Duration::ZERO;
    let mut worst_unix = Duration::ZERO;
    let mut probes = 0;
    while t.elapsed() < FLOOD_FOR {
        let a = Instant::now();
        let r = tcp_health(port);
        let took = a.elapsed();
        assert_eq!(
            r,
            Ok(200),
            "TCP health under the flood failed after {took:?} ({:?} into it)\n{}",
            t.elapsed(),
            d.log()
        );
        assert!(took < Duration::from_secs(1), "TCP health took {took:?}");
        worst_tcp = worst_tcp.max(took);

        let a = Instant::now();
        let r = unix_get(&d, "/v1/health");
        let took = a.elapsed();
        assert!(
            matches!(r, Ok((200, _))),
            "unix health under the flood failed after {took:?}: {r:?}"
        );
        assert!(took < Duration::from_secs(1), "unix health took {took:?}");
        worst_unix = worst_unix.max(took);

        let (status, body) = unix_get(&d, &path).expect("sandbox state");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["state"], "running",
            "the sandbox changed state under the flood: {v}"
        );
        probes += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    stop.store(true, Ordering::Relaxed);
    let opened = flood.join().unwrap();
    eprintln!(
        "flood: {opened} connections opened; {probes} probes; worst health TCP {worst_tcp:?}, unix {worst_unix:?}"
    );
    assert!(
        opened >= IDLE + SLOW,
        "the attacker opened only {opened} connections"
    );

    // The sandbox is still managed: exec answers.
    let o = sb.exec(&["echo", "alive"]);
    assert!(o.status.success(), "exec after the flood: {}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "alive");

    // Timeouts: an idle connection and a slowloris one are both closed by
    // the daemon within 15 s (idle and header timeouts of 10 s).
    let idle = connect(port).expect("connect");
    let mut slow = connect(port).expect("connect");
    slow.write_all(b"GET /v1/health HTTP/1.1\r\n").unwrap();
    let t = Instant::now();
    while (open(&idle) || open(&slow)) && t.elapsed() < Duration::from_secs(15) {
        let _ = slow.write_all(b"X-Slow: 1\r\n");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(!open(&idle), "an idle connection was still open after 15 s");
    assert!(
        !open(&slow),
        "a slowloris connection was still open after 15 s"
    );
    let log = d.log();
    assert!(
        !log.contains("Too many open files"),
        "the daemon ran out of descriptors:\n{log}"
    );
}
