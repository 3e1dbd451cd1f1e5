//! End-to-end tests of background processes through the serve loop: many
//! streams on one connection, replay, stdin, signals, PTYs, and a process
//! that outlives its connection (as it outlives a branch).

use super::*;
use forkvm_agent_protocol::{
    read_frame, write_frame, ProcEnd, ProcRef, ProcResize, ProcSignal, ProcStart, ProcStream,
    PtySize, ERR_NOT_FOUND,
};
use std::collections::{BTreeMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// One host connection to a shared agent, demultiplexing replies by id.
pub(super) struct Conn {
    w: UnixStream,
    r: UnixStream,
    pending: VecDeque<Frame<GuestMsg>>,
    next_id: u64,
    /// The agent's read loop for this connection.
    serve: Option<thread::JoinHandle<io::Result<()>>>,
}

/// Hanging up waits until the agent's read loop has seen the EOF, as the
/// guest's one port does: there, a new host's bytes can only be read after
/// the old host's EOF. Without the wait, a test's next `connect` could swap
/// the outbox while the old connection's streams were still live, and
/// their frames would reach the new host, which the agent never does.
impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.r.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.serve.take() {
            let _ = t.join();
        }
    }
}

pub(super) fn agent() -> Agent {
    let nowhere = std::path::Path::new("/nonexistent/forkvm-agent-test");
    let paths = IdentityPaths {
        random: "/dev/urandom".into(),
        machine_id: nowhere.join("machine-id"),
        dbus_machine_id: nowhere.join("dbus-machine-id"),
        run_dir: nowhere.join("run"),
        boot_id_over: None,
    };
    Agent::new(Box::new(io::sink()), || {}, &paths)
}

/// Connect a new host to `agent`, as the daemon does after a restart or
/// a restored clone's host does.
pub(super) fn connect(agent: &Agent, first_id: u64) -> Conn {
    let (host, guest) = UnixStream::pair().unwrap();
    let mut reader = guest.try_clone().unwrap();
    agent.outbox.replace(Box::new(guest));
    let a = agent.clone();
    let serve = thread::spawn(move || serve_conn(&mut reader, &a, EofPolicy::Return));
    host.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    Conn {
        w: host.try_clone().unwrap(),
        r: host,
        pending: VecDeque::new(),
        next_id: first_id,
        serve: Some(serve),
    }
}

impl Conn {
    pub(super) fn send(&mut self, msg: &HostMsg, payload: &[u8]) -> u64 {
        write_frame(&mut self.w, msg, payload).unwrap();
        msg.id()
    }
    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
    /// The next frame for request `id`, keeping others for later.
    pub(super) fn recv(&mut self, id: u64) -> Frame<GuestMsg> {
        if let Some(i) = self.pending.iter().position(|f| f.msg.id() == id) {
            return self.pending.remove(i).unwrap();
        }
        loop {
            let f: Frame<GuestMsg> = read_frame(&mut self.r).unwrap().expect("agent hung up");
            if f.msg.id() == id {
                return f;
            }
            self.pending.push_back(f);
        }
    }
    pub(super) fn call(&mut self, msg: &HostMsg, payload: &[u8]) -> GuestMsg {
        let id = self.send(msg, payload);
        self.recv(id).msg
    }
    fn start(&mut self, cmd: &str, args: &[&str], tag: Option<&str>, stdin: bool) -> (u64, u32) {
        let id = self.id();
        self.start_req(ProcStart {
            id,
            cmd: cmd.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            envs: BTreeMap::new(),
            cwd: None,
            user: None,
            tag: tag.map(str::to_string),
            pty: None,
            stdin,
        })
    }
    fn start_req(&mut self, req: ProcStart) -> (u64, u32) {
        let id = self.send(&HostMsg::ProcStart(req), b"");
        match self.recv(id).msg {
            GuestMsg::ProcStarted { pid, .. } => (id, pid),
            m => panic!("expected proc_started, got {m:?}"),
        }
    }
    fn connect(&mut self, pid: Option<u32>, tag: Option<&str>) -> u64 {
        let id = self.id();
        self.send(&HostMsg::ProcConnect(pref(id, pid, tag)), b"")
    }
    /// Output of stream `id` until `until` shows up in it, or its end.
    fn read_until(&mut self, id: u64, until: &str) -> (Vec<u8>, Option<ProcEnd>) {
        if until.is_empty() {
            self.read_until_all(id, &[])
        } else {
            self.read_until_all(id, &[until])
        }
    }
    /// Output of stream `id` until every one of `marks` shows up in it (or
    /// its end; no marks: to its end). Several marks are for output of
    /// stdout and stderr together: two pipes keep no order between them.
    fn read_until_all(&mut self, id: u64, marks: &[&str]) -> (Vec<u8>, Option<ProcEnd>) {
        let mut out = Vec::new();
        loop {
            let f = self.recv(id);
            match f.msg {
                GuestMsg::ProcStarted { .. } | GuestMsg::Keepalive { .. } => {}
                GuestMsg::ProcData { lost, .. } => {
                    assert_eq!(lost, 0);
                    out.extend(f.payload);
                    let seen = String::from_utf8_lossy(&out);
                    if !marks.is_empty() && marks.iter().all(|m| seen.contains(m)) {
                        return (out, None);
                    }
                }
                GuestMsg::ProcEnd(e) => return (out, Some(e)),
                m => panic!("unexpected {m:?}"),
            }
        }
    }
    fn ack(&mut self, msg: &HostMsg, payload: &[u8]) {
        let id = msg.id();
        assert_eq!(self.call(msg, payload), GuestMsg::Ack { id });
    }
}

pub(super) fn pref(id: u64, pid: Option<u32>, tag: Option<&str>) -> ProcRef {
    ProcRef {
        id,
        pid,
        tag: tag.map(str::to_string),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn start_streams_then_every_attach_replays() {
    let agent = agent();
    let mut c = connect(&agent, 0);
    let (sid, pid) = c.start(
        "sh",
        &["-c", "echo one; echo two >&2; read x; echo three"],
        Some("replay"),
        true,
    );
    let (out, end) = c.read_until_all(sid, &["one", "two"]);
    assert!(end.is_none());
    // stdout and stderr are two pipes: either may reach the agent first.
    let first = text(&out);
    assert!(first == "one\ntwo\n" || first == "two\none\n", "{first:?}");
    // Two attaches while it runs: each replays what was missed, in the
    // order the first stream saw it.
    let a = c.connect(Some(pid), None);
    let b = c.connect(None, Some("replay"));
    for s in [a, b] {
        assert_eq!(c.recv(s).msg, GuestMsg::ProcStarted { id: s, pid });
        assert_eq!(text(&c.read_until_all(s, &["one", "two"]).0), first);
    }
    let id = c.id();
    c.ack(&HostMsg::ProcInput(pref(id, Some(pid), None)), b"go\n");
    for s in [sid, a, b] {
        let (out, end) = c.read_until(s, "");
        assert_eq!(text(&out), "three\n");
        let end = end.unwrap();
        assert_eq!((end.pid, end.exit_code, end.exited), (pid, 0, true));
        assert_eq!(end.status, "exit status 0");
    }
    // Ended, but still there for a late attach; no longer listed.
    let late = c.connect(None, Some("replay"));
    let (out, end) = c.read_until(late, "");
    assert_eq!(text(&out), format!("{first}three\n"));
    assert_eq!(end.unwrap().exit_code, 0);
    let id = c.id();
    let GuestMsg::Processes { processes, .. } = c.call(&HostMsg::ProcList { id }, b"") else {
        panic!()
    };
    assert!(processes.iter().all(|p| p.pid != pid));
}

#[test]
fn stdin_reaches_cat_and_closing_it_ends_cat() {
    let agent = agent();
    let mut c = connect(&agent, 100);
    let (sid, pid) = c.start("cat", &[], None, true);
    let id = c.id();
    c.ack(&HostMsg::ProcInput(pref(id, Some(pid), None)), b"hello\n");
    assert_eq!(text(&c.read_until(sid, "hello\n").0), "hello\n");
    let id = c.id();
    c.ack(&HostMsg::ProcInput(pref(id, Some(pid), None)), b"world");
    let id = c.id();
    c.ack(&HostMsg::ProcCloseStdin(pref(id, Some(pid), None)), b"");
    let (out, end) = c.read_until(sid, "");
    assert_eq!(text(&out), "world");
    assert_eq!(end.unwrap().exit_code, 0);
    // Input to an ended process, or to one without stdin, is an error.
    let id = c.id();
    let m = c.call(&HostMsg::ProcInput(pref(id, Some(pid), None)), b"x");
    assert!(
        matches!(m, GuestMsg::Error { ref code, .. } if code == ERR_NOT_FOUND),
        "{m:?}"
    );
    let (_, pid2) = c.start("sleep", &["5"], None, false);
    let id = c.id();
    let m = c.call(&HostMsg::ProcInput(pref(id, Some(pid2), None)), b"x");
    assert!(
        matches!(m, GuestMsg::Error { ref code, .. } if code == ERR_INVALID),
        "{m:?}"
    );
    let id = c.id();
    let kill = HostMsg::ProcSignal(ProcSignal {
        id,
        pid: Some(pid2),
        tag: None,
        signal: libc::SIGKILL,
    });
    c.ack(&kill, b"");
}

#[test]
fn sigterm_ends_sleep_and_list_shows_it_until_then() {
    let agent = agent();
    let mut c = connect(&agent, 200);
    let (sid, pid) = c.start("sleep", &["30"], Some("sleeper"), false);
    let id = c.id();
    let GuestMsg::Processes { processes, .. } = c.call(&HostMsg::ProcList { id }, b"") else {
        panic!()
    };
    let p = processes.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(
        (p.cmd.as_str(), p.args.clone()),
        ("sleep", vec!["30".to_string()])
    );
    assert_eq!(p.tag.as_deref(), Some("sleeper"));
    // A tag is unique among running processes.
    let id = c.id();
    let dup = c.send(
        &HostMsg::ProcStart(ProcStart {
            id,
            cmd: "true".into(),
            args: vec![],
            envs: BTreeMap::new(),
            cwd: None,
            user: None,
            tag: Some("sleeper".into()),
            pty: None,
            stdin: false,
        }),
        b"",
    );
    assert!(matches!(c.recv(dup).msg, GuestMsg::Error { ref code, .. } if code == ERR_INVALID));

    let t = Instant::now();
    let id = c.id();
    c.ack(
        &HostMsg::ProcSignal(ProcSignal {
            id,
            pid: None,
            tag: Some("sleeper".into()),
            signal: libc::SIGTERM,
        }),
        b"",
    );
    let end = c.read_until(sid, "").1.unwrap();
    assert_eq!(
        (end.exit_code, end.exited, end.signal, end.status.as_str()),
        (-1, false, Some(libc::SIGTERM), "signal: terminated")
    );
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn pty_output_arrives_and_resize_works() {
    let agent = agent();
    let mut c = connect(&agent, 300);
    let id = c.id();
    let (sid, pid) = c.start_req(ProcStart {
        id,
        cmd: "sh".into(),
        args: vec![
            "-c".into(),
            "stty size; tty >/dev/null && echo tty-ok; read x; stty size".into(),
        ],
        envs: BTreeMap::new(),
        cwd: None,
        user: None,
        tag: None,
        pty: Some(PtySize { cols: 80, rows: 24 }),
        stdin: false,
    });
    let (out, _) = c.read_until(sid, "tty-ok");
    assert!(text(&out).contains("24 80\r\n"), "{:?}", text(&out));
    let id = c.id();
    c.ack(
        &HostMsg::ProcResize(ProcResize {
            id,
            pid: Some(pid),
            tag: None,
            size: PtySize {
                cols: 100,
                rows: 30,
            },
        }),
        b"",
    );
    let id = c.id();
    c.ack(&HostMsg::ProcInput(pref(id, Some(pid), None)), b"\n");
    let (out, end) = c.read_until(sid, "");
    assert!(text(&out).contains("30 100\r\n"), "{:?}", text(&out));
    assert_eq!(end.unwrap().exit_code, 0);
    // Output of a PTY process is tagged as such.
    let again = c.connect(Some(pid), None);
    loop {
        match c.recv(again).msg {
            GuestMsg::ProcData { stream, .. } => {
                assert_eq!(stream, ProcStream::Pty);
                break;
            }
            GuestMsg::ProcStarted { .. } => {}
            m => panic!("{m:?}"),
        }
    }
    let id = c.id();
    let m = c.call(&HostMsg::ProcCloseStdin(pref(id, Some(pid), None)), b"");
    assert!(matches!(m, GuestMsg::Error { .. }), "{m:?}");
}

#[test]
fn a_process_outlives_its_connection_and_a_new_host_attaches() {
    let agent = agent();
    let mut c = connect(&agent, 400);
    let (sid, pid) = c.start(
        "sh",
        &["-c", "echo before; read x; echo after $x"],
        Some("keep"),
        true,
    );
    assert_eq!(text(&c.read_until(sid, "before").0), "before\n");
    // The host goes away (daemon restart, or the VM was branched and this
    // is a child's new host).
    drop(c);
    let mut c = connect(&agent, 10_000);
    let id = c.id();
    let GuestMsg::Processes { processes, .. } = c.call(&HostMsg::ProcList { id }, b"") else {
        panic!()
    };
    assert!(processes
        .iter()
        .any(|p| p.pid == pid && p.tag.as_deref() == Some("keep")));
    let s = c.connect(None, Some("keep"));
    assert_eq!(text(&c.read_until(s, "before").0), "before\n");
    let id = c.id();
    c.ack(&HostMsg::ProcInput(pref(id, None, Some("keep"))), b"z\n");
    let (out, end) = c.read_until(s, "");
    assert_eq!(text(&out), "after z\n");
    assert_eq!(end.unwrap().exit_code, 0);
    // Nothing more from the old connection's stream reached this one.
    assert!(
        c.pending.iter().all(|f| f.msg.id() != sid),
        "{:?}",
        c.pending
    );
}

#[test]
fn cancel_stops_a_stream_and_errors_are_clear() {
    let mut agent = agent();
    agent.keepalive = Duration::from_millis(100);
    let mut c = connect(&agent, 500);
    let (sid, pid) = c.start("sleep", &["30"], None, false);
    assert!(matches!(c.recv(sid).msg, GuestMsg::Keepalive { .. }));
    let id = c.id();
    c.ack(&HostMsg::StreamCancel { id, stream: sid }, b"");
    thread::sleep(Duration::from_millis(300));
    let id = c.id();
    assert!(matches!(
        c.call(&HostMsg::Ping { id }, b""),
        GuestMsg::Pong { .. }
    ));
    let late: Vec<_> = c.pending.iter().filter(|f| f.msg.id() == sid).collect();
    assert!(late.len() <= 1, "stream went on after cancel: {late:?}");

    let id = c.id();
    for (msg, code) in [
        (
            HostMsg::ProcConnect(pref(id, Some(u32::MAX), None)),
            ERR_NOT_FOUND,
        ),
        (
            HostMsg::ProcConnect(pref(id + 1, Some(pid), Some("x"))),
            ERR_INVALID,
        ),
        (HostMsg::ProcConnect(pref(id + 2, None, None)), ERR_INVALID),
    ] {
        let m = c.call(&msg, b"");
        assert!(
            matches!(&m, GuestMsg::Error { code: c, .. } if c == code),
            "{m:?}"
        );
    }
    let kill = HostMsg::ProcSignal(ProcSignal {
        id: id + 3,
        pid: Some(pid),
        tag: None,
        signal: libc::SIGKILL,
    });
    c.ack(&kill, b"");
}

#[test]
fn many_concurrent_streams_share_the_link() {
    let agent = agent();
    let mut c = connect(&agent, 600);
    const N: usize = 16;
    const LINES: usize = 20_000;
    let mut streams = Vec::new();
    for i in 0..N {
        let script = format!("i=0; while [ $i -lt {LINES} ]; do echo p{i}-$i; i=$((i+1)); done");
        streams.push((i, c.start("sh", &["-c", &script], None, false).0));
    }
    for (i, sid) in streams {
        let (out, end) = c.read_until(sid, "");
        assert_eq!(end.unwrap().exit_code, 0);
        let want: String = (0..LINES).map(|n| format!("p{i}-{n}\n")).collect();
        assert!(
            text(&out) == want,
            "stream {i} garbled ({} bytes)",
            out.len()
        );
    }
}
