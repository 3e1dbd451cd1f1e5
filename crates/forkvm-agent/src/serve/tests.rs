//! End-to-end tests of the serve loop over a socket pair, playing the
//! host's side of the protocol.

use super::*;
use crate::files::tests::temp_dir;
use crate::identity;
use forkvm_agent_protocol::{
    read_frame, write_frame, Stream, ERR_NOT_FOUND, ERR_SPAWN, ERR_TOO_LARGE, OUTPUT_CHUNK,
    PROTOCOL_VERSION,
};
use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Instant;

pub(super) struct Host {
    pub(super) w: UnixStream,
    r: UnixStream,
    shutdowns: mpsc::Receiver<()>,
}

/// Never the real /etc/machine-id or /run of the machine running the
/// tests.
fn nowhere() -> IdentityPaths {
    let nowhere = std::path::Path::new("/nonexistent/forkvm-agent-test");
    IdentityPaths {
        random: "/dev/urandom".into(),
        machine_id: nowhere.join("machine-id"),
        dbus_machine_id: nowhere.join("dbus-machine-id"),
        run_dir: nowhere.join("run"),
        boot_id_over: None,
    }
}

pub(super) fn start() -> Host {
    start_with(nowhere())
}

fn start_with(identity_paths: IdentityPaths) -> Host {
    let (host, guest) = UnixStream::pair().unwrap();
    let mut reader = guest.try_clone().unwrap();
    let (tx, shutdowns) = mpsc::channel();
    let tx = Mutex::new(tx);
    let agent = Agent::new(
        Box::new(guest),
        move || {
            let _ = tx.lock().unwrap().send(());
        },
        &identity_paths,
    );
    thread::spawn(move || serve_conn(&mut reader, &agent, EofPolicy::Return));
    host.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    Host {
        w: host.try_clone().unwrap(),
        r: host,
        shutdowns,
    }
}

#[derive(Debug, Default)]
pub(super) struct ExecOut {
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) end: Option<GuestMsg>,
    max_chunk: usize,
}

impl Host {
    pub(super) fn send(&mut self, msg: &HostMsg, payload: &[u8]) {
        write_frame(&mut self.w, msg, payload).unwrap();
    }
    pub(super) fn recv(&mut self) -> Frame<GuestMsg> {
        read_frame(&mut self.r)
            .unwrap()
            .expect("agent closed the connection")
    }
    pub(super) fn call(&mut self, msg: &HostMsg, payload: &[u8]) -> Frame<GuestMsg> {
        self.send(msg, payload);
        let f = self.recv();
        assert_eq!(f.msg.id(), msg.id());
        f
    }
    fn exec(
        &mut self,
        id: u64,
        argv: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&str>,
        timeout_ms: Option<u64>,
        stdin: &[u8],
    ) -> ExecOut {
        let msg = HostMsg::Exec {
            id,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            cwd: cwd.map(str::to_string),
            timeout_ms,
            user: None,
            detach: false,
            log_path: None,
        };
        self.send(&msg, stdin);
        self.collect(id)
    }
    pub(super) fn collect(&mut self, id: u64) -> ExecOut {
        let mut out = ExecOut::default();
        loop {
            let f = self.recv();
            assert_eq!(f.msg.id(), id);
            match f.msg {
                GuestMsg::Output { stream, .. } => {
                    out.max_chunk = out.max_chunk.max(f.payload.len());
                    match stream {
                        Stream::Stdout => out.stdout.extend(f.payload),
                        Stream::Stderr => out.stderr.extend(f.payload),
                    }
                }
                m => {
                    out.end = Some(m);
                    return out;
                }
            }
        }
    }
}

pub(super) fn exited(out: &ExecOut) -> (Option<i32>, Option<i32>, bool) {
    match &out.end {
        Some(GuestMsg::Exited {
            exit_code,
            signal,
            timed_out,
            ..
        }) => (*exit_code, *signal, *timed_out),
        other => panic!("expected exited, got {other:?}"),
    }
}

pub(super) fn error_code(msg: &Option<GuestMsg>) -> (&str, &str) {
    match msg {
        Some(GuestMsg::Error { code, message, .. }) => (code, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn ping() {
    let mut h = start();
    let f = h.call(&HostMsg::Ping { id: 42 }, b"");
    match f.msg {
        GuestMsg::Pong {
            id,
            agent_version,
            protocol,
            uptime_ms,
        } => {
            assert_eq!(id, 42);
            assert_eq!(agent_version, env!("CARGO_PKG_VERSION"));
            assert_eq!(protocol, PROTOCOL_VERSION);
            assert!(uptime_ms > 0);
        }
        m => panic!("unexpected {m:?}"),
    }
}

#[test]
fn exec_streams_and_exit_code() {
    let mut h = start();
    let out = h.exec(
        1,
        &["sh", "-c", "echo hi; echo err >&2; exit 3"],
        &[],
        None,
        None,
        b"",
    );
    assert_eq!(out.stdout, b"hi\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(exited(&out), (Some(3), None, false));
}

#[test]
fn exec_stdin_reaches_cat() {
    let mut h = start();
    let input: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let out = h.exec(2, &["cat"], &[], None, None, &input);
    assert_eq!(exited(&out), (Some(0), None, false));
    assert!(out.stdout == input, "stdin did not round-trip through cat");
}

#[test]
fn exec_env_and_cwd() {
    let mut h = start();
    let dir = temp_dir("cwd").canonicalize().unwrap();
    let dir_s = dir.to_str().unwrap();
    let out = h.exec(
        3,
        &[
            "sh",
            "-c",
            "echo \"$FOO|$BAR\"; pwd -P; test -n \"$PATH\" && echo path-inherited",
        ],
        &[("FOO", "foo value"), ("BAR", "")],
        Some(dir_s),
        None,
        b"",
    );
    assert_eq!(exited(&out), (Some(0), None, false));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("foo value|\n{dir_s}\npath-inherited\n")
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let out = h.exec(4, &["pwd"], &[], None, None, b"");
    assert_eq!(out.stdout, b"/\n", "default cwd is /");
}

#[test]
fn exec_large_output_streams_through() {
    let mut h = start();
    const N: usize = 10 * 1024 * 1024;
    let out = h.exec(
        5,
        &["sh", "-c", &format!("head -c {N} /dev/urandom")],
        &[],
        None,
        Some(60_000),
        b"",
    );
    assert_eq!(exited(&out), (Some(0), None, false));
    assert_eq!(out.stdout.len(), N);
    assert!(out.max_chunk <= OUTPUT_CHUNK && out.max_chunk > 0);
    // And a second, differently shaped stream on stderr.
    let out = h.exec(
        6,
        &["sh", "-c", &format!("yes abcdefgh | head -c {N} >&2")],
        &[],
        None,
        Some(60_000),
        b"",
    );
    assert_eq!(exited(&out), (Some(0), None, false));
    assert_eq!(out.stderr.len(), N);
    assert!(out.stderr.chunks(9).all(|c| c == &b"abcdefgh\n"[..c.len()]));
}

#[test]
fn exec_timeout_kills() {
    let mut h = start();
    let t = Instant::now();
    let out = h.exec(7, &["sleep", "30"], &[], None, Some(300), b"");
    let took = t.elapsed();
    let (code, signal, timed_out) = exited(&out);
    assert!(timed_out);
    assert_eq!((code, signal), (None, Some(libc::SIGKILL)));
    assert!(took < Duration::from_millis(1300), "took {took:?}");
    match out.end {
        Some(GuestMsg::Exited { duration_ms, .. }) => {
            assert!((300..1300).contains(&duration_ms))
        }
        _ => unreachable!(),
    }
}

#[test]
fn exec_errors() {
    let mut h = start();
    let out = h.exec(8, &["forkvm-no-such-command-xyz"], &[], None, None, b"");
    assert_eq!(
        error_code(&out.end),
        (
            ERR_NOT_FOUND,
            "executable not found: forkvm-no-such-command-xyz"
        )
    );
    let out = h.exec(9, &[], &[], None, None, b"");
    assert_eq!(error_code(&out.end).0, ERR_INVALID);
    let out = h.exec(10, &["true"], &[], Some("/forkvm/no/such/dir"), None, b"");
    assert_eq!(
        error_code(&out.end),
        (
            ERR_SPAWN,
            "working directory /forkvm/no/such/dir does not exist in the image"
        )
    );
}

#[test]
fn concurrent_requests_do_not_block_each_other() {
    let mut h = start();
    h.send(
        &HostMsg::Exec {
            id: 1,
            argv: vec!["sh".into(), "-c".into(), "sleep 1; echo done".into()],
            env: BTreeMap::new(),
            cwd: None,
            timeout_ms: None,
            user: None,
            detach: false,
            log_path: None,
        },
        b"",
    );
    let t = Instant::now();
    let f = h.call(&HostMsg::Ping { id: 2 }, b"");
    assert!(matches!(f.msg, GuestMsg::Pong { id: 2, .. }));
    assert!(t.elapsed() < Duration::from_millis(500));
    let out = h.collect(1);
    assert_eq!(out.stdout, b"done\n");
    assert_eq!(exited(&out), (Some(0), None, false));
}

#[test]
fn files_roundtrip_and_limits() {
    let mut h = start();
    let dir = temp_dir("files");
    let path = dir.join("sub/dir/data.bin");
    let path_s = path.to_str().unwrap().to_string();
    let content: Vec<u8> = (0..1_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();

    let f = h.call(
        &HostMsg::WriteFile {
            id: 1,
            path: path_s.clone(),
            mode: 0o640,
            create_dirs: false,
        },
        &content,
    );
    assert_eq!(error_code(&Some(f.msg)).0, ERR_NOT_FOUND);

    let f = h.call(
        &HostMsg::WriteFile {
            id: 2,
            path: path_s.clone(),
            mode: 0o640,
            create_dirs: true,
        },
        &content,
    );
    assert_eq!(
        f.msg,
        GuestMsg::FileWritten {
            id: 2,
            size: content.len() as u64
        }
    );

    let f = h.call(
        &HostMsg::ReadFile {
            id: 3,
            path: path_s.clone(),
            max_bytes: 2_000_000,
        },
        b"",
    );
    assert_eq!(
        f.msg,
        GuestMsg::FileData {
            id: 3,
            size: content.len() as u64,
            mode: 0o640
        }
    );
    assert!(f.payload == content, "file content differs");

    let f = h.call(
        &HostMsg::ReadFile {
            id: 4,
            path: path_s.clone(),
            max_bytes: 1000,
        },
        b"",
    );
    let reply = Some(f.msg);
    let (code, message) = error_code(&reply);
    assert_eq!(code, ERR_TOO_LARGE);
    assert_eq!(
        message,
        "file is 1000000 bytes, over the limit of 1000 bytes"
    );

    let f = h.call(
        &HostMsg::ReadFile {
            id: 5,
            path: dir.join("nope").to_str().unwrap().into(),
            max_bytes: 10,
        },
        b"",
    );
    assert_eq!(error_code(&Some(f.msg)).0, ERR_NOT_FOUND);
    let f = h.call(
        &HostMsg::ReadFile {
            id: 6,
            path: dir.to_str().unwrap().into(),
            max_bytes: 10,
        },
        b"",
    );
    assert_eq!(error_code(&Some(f.msg)).0, ERR_INVALID);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shutdown_acks_then_calls_hook() {
    let mut h = start();
    let f = h.call(&HostMsg::Shutdown { id: 9 }, b"");
    assert_eq!(f.msg, GuestMsg::ShutdownAck { id: 9 });
    h.shutdowns.recv_timeout(Duration::from_secs(5)).unwrap();
}

#[test]
fn identity_validates_then_acks() {
    let dir = temp_dir("identity-serve");
    let paths = IdentityPaths {
        random: "/dev/urandom".into(),
        machine_id: dir.join("machine-id"),
        dbus_machine_id: dir.join("dbus-machine-id"),
        run_dir: dir.join("run-forkvm"),
        boot_id_over: None,
    };
    std::fs::write(&paths.machine_id, "ffffffffffffffffffffffffffffffff\n").unwrap();
    let mut h = start_with(paths.clone());
    // A booted VM's instance id is its boot_id, written at start.
    let boot_id = std::fs::read_to_string(paths.instance_id()).unwrap();
    assert_eq!(boot_id.len(), 37, "{boot_id:?}");
    let hostname = identity::current_hostname();
    let msg = |id, unix_time_ns| HostMsg::Identity {
        id,
        hostname: hostname.clone(),
        unix_time_ns,
        machine_id: "00112233445566778899aabbccddeeff".into(),
        instance_id: "inst-1".into(),
    };

    // Too little entropy: rejected before anything changes.
    let f = h.call(&msg(1, identity::now_ns()), &[0u8; 31]);
    let reply = Some(f.msg);
    let (code, message) = error_code(&reply);
    assert_eq!(code, ERR_INVALID);
    assert!(message.contains("entropy"), "{message}");
    assert_eq!(
        std::fs::read_to_string(paths.instance_id()).unwrap(),
        boot_id
    );

    if !identity::is_root() {
        // The RNG ioctls need CAP_SYS_ADMIN: an error, never an ack.
        let f = h.call(&msg(2, identity::now_ns()), &[5u8; 64]);
        assert_eq!(error_code(&Some(f.msg)).0, ERR_IO);
        eprintln!("skipped the ack half: not root");
    } else {
        // The clock is set to what it already is, the hostname likewise.
        let f = h.call(&msg(3, identity::now_ns()), &[5u8; 64]);
        match f.msg {
            GuestMsg::IdentityAck { id, took_us } => {
                assert_eq!(id, 3);
                assert!(took_us < 5_000_000, "took {took_us} us");
            }
            m => panic!("expected identity_ack, got {m:?}"),
        }
        assert_eq!(
            std::fs::read_to_string(&paths.machine_id).unwrap(),
            "00112233445566778899aabbccddeeff\n"
        );
        assert_eq!(
            std::fs::read_to_string(paths.instance_id()).unwrap(),
            "inst-1\n"
        );
        assert!(!paths.dbus_machine_id.exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn garbage_and_unknown_requests_are_survived() {
    let mut h = start();
    // Garbage, including a fake magic with an absurd length, then a ping.
    let mut junk = b"hello there FVA1\xff\xff\xff\xff\xff\xff\xff\xff and more".to_vec();
    junk.extend(encode(&HostMsg::Ping { id: 1 }, b"").unwrap());
    h.w.write_all(&junk).unwrap();
    assert!(matches!(h.recv().msg, GuestMsg::Pong { id: 1, .. }));

    // An unknown request type with an id gets "unsupported" for that id.
    let header = br#"{"type":"format_disk","id":77}"#;
    let mut bytes = MAGIC.to_vec();
    bytes.extend((header.len() as u32).to_le_bytes());
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(header);
    bytes.extend(b"xyz");
    bytes.extend(encode(&HostMsg::Ping { id: 2 }, b"").unwrap());
    h.w.write_all(&bytes).unwrap();
    let f = h.recv();
    assert_eq!(f.msg.id(), 77);
    let reply = Some(f.msg);
    let (code, message) = error_code(&reply);
    assert_eq!(code, forkvm_agent_protocol::ERR_UNSUPPORTED);
    assert!(message.contains("does not support"), "{message}");
    assert!(forkvm_agent_protocol::is_unsupported_error(code, message));
    assert!(matches!(h.recv().msg, GuestMsg::Pong { id: 2, .. }));
}

#[test]
fn resync_keeps_a_split_magic() {
    let mut b = b"xxFV".to_vec();
    resync(&mut b);
    assert_eq!(b, b"xFV"); // "FV" might continue as "A1"; at least one byte dropped
    let mut b = b"FVA1junkFVA1rest".to_vec();
    resync(&mut b);
    assert_eq!(b, b"FVA1rest");
    let mut b = b"F".to_vec();
    resync(&mut b);
    assert!(b.is_empty());
}

/// A reader that plays back a script of reads, like a virtio port whose
/// host disconnects (EOF) mid-frame and reconnects.
struct Script(std::collections::VecDeque<Vec<u8>>);
impl Read for Script {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match self.0.pop_front() {
            Some(mut chunk) => {
                let n = chunk.len().min(out.len());
                out[..n].copy_from_slice(&chunk[..n]);
                if n < chunk.len() {
                    chunk.drain(..n);
                    self.0.push_front(chunk);
                }
                Ok(n)
            }
            None => Err(io::Error::new(io::ErrorKind::BrokenPipe, "end of script")),
        }
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);
impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn eof_discards_partial_frame_and_keeps_reading() {
    let ping = |id| encode(&HostMsg::Ping { id }, b"").unwrap();
    let p1 = ping(1);
    let script = Script(
        vec![
            p1[..7].to_vec(), // host disconnects mid-frame...
            vec![],           // ...EOF...
            vec![],
            p1[7..].to_vec(), // ...stale tail from the old connection (resync)
            ping(2),          // the new connection
        ]
        .into(),
    );
    let cap = Capture::default();
    let r = serve(script, cap.clone(), EofPolicy::Retry, || {}, &nowhere());
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    // Replies come from request threads; give them a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ids = Vec::new();
    while Instant::now() < deadline {
        let mut bytes = cap.0.lock().unwrap().clone();
        ids.clear();
        while let Some(f) = decode::<GuestMsg>(&mut bytes).unwrap() {
            ids.push(f.msg.id());
        }
        if !ids.is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ids, vec![2]);
}
