//! Runs the real agent binary (not pid 1) against a unix socket named by
//! `FORKVM_AGENT_PORT`, the way a developer would run it outside a VM.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::{read_frame, write_frame, Frame, GuestMsg, HostMsg, Stream};

fn temp_socket() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("forkvm-agent-bin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("agent.sock")
}

#[test]
fn binary_serves_a_unix_socket_and_exits_on_shutdown() {
    let sock = temp_socket();
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_forkvm-agent"))
        .env("FORKVM_AGENT_PORT", &sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                let _ = agent.kill();
                panic!("the agent never connected: {e}");
            }
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = stream;
    let mut recv = || -> Frame<GuestMsg> { read_frame(&mut r).unwrap().unwrap() };

    write_frame(&mut w, &HostMsg::Ping { id: 1 }, b"").unwrap();
    assert!(matches!(
        recv().msg,
        GuestMsg::Pong {
            id: 1,
            protocol: forkvm_agent_protocol::PROTOCOL_VERSION,
            ..
        }
    ));

    let exec = HostMsg::Exec {
        id: 2,
        argv: vec!["sh".into(), "-c".into(), "tr a-z A-Z; echo \"$X\"".into()],
        env: BTreeMap::from([("X".into(), "from env".into())]),
        cwd: None,
        timeout_ms: Some(10_000),
        user: None,
        detach: false,
        log_path: None,
    };
    write_frame(&mut w, &exec, b"hello\n").unwrap();
    let mut stdout = Vec::new();
    loop {
        let f = recv();
        match f.msg {
            GuestMsg::Output {
                id: 2,
                stream: Stream::Stdout,
            } => stdout.extend(f.payload),
            GuestMsg::Exited {
                id: 2,
                exit_code,
                timed_out,
                ..
            } => {
                assert_eq!(exit_code, Some(0));
                assert!(!timed_out);
                break;
            }
            m => panic!("unexpected {m:?}"),
        }
    }
    assert_eq!(stdout, b"HELLO\nfrom env\n");

    write_frame(&mut w, &HostMsg::Shutdown { id: 3 }, b"").unwrap();
    assert_eq!(recv().msg, GuestMsg::ShutdownAck { id: 3 });

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = agent.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not exit after shutdown"
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let mut console = String::new();
    agent
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut console)
        .unwrap();
    assert_eq!(console, "forkvm-agent: ready\n");
    let _ = std::fs::remove_dir_all(sock.parent().unwrap());
}
