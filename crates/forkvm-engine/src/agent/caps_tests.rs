//! The protocol-3 client ([`super::caps`]) against a fake agent: an old
//! agent is refused before anything is sent, streams decode and end, a
//! dropped stream is cancelled in the guest, and request ids never repeat
//! across connections.

use super::tests::{fake, is_unsupported, old_agent, T};
use super::*;
use forkvm_agent_protocol::{ProcEnd, ProcStream};

#[tokio::test]
async fn an_agent_older_than_protocol_3_is_refused_before_anything_is_sent() {
    let (conn, seen, _dir) = fake(2, Box::new(old_agent)).await;
    assert!(is_unsupported(conn.proc_list().await));
    assert!(is_unsupported(conn.fs_stat("/etc").await));
    assert!(is_unsupported(
        conn.proc_start(ProcSpec {
            cmd: "sleep".into(),
            ..Default::default()
        })
        .await
        .map(|(pid, _)| pid)
    ));
    assert!(is_unsupported(
        conn.fs_watch("/tmp", false).await.map(|_| ())
    ));
    let e = conn.proc_list().await.unwrap_err();
    assert!(
        e.to_string().contains("list background processes"),
        "the message says what it cannot do: {e}"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        ["ping"],
        "only the version was asked"
    );
}

/// A protocol-3 agent with one process (pid 42) that has printed "hi" and
/// ends at once, and a watch that reports one create.
fn v3_agent(f: &Frame<HostMsg>) -> Vec<(GuestMsg, Vec<u8>)> {
    let id = f.msg.id();
    match &f.msg {
        HostMsg::ProcConnect(r) if r.pid == Some(42) || r.tag.as_deref() == Some("web") => vec![
            (GuestMsg::ProcStarted { id, pid: 42 }, vec![]),
            (
                GuestMsg::ProcData {
                    id,
                    stream: ProcStream::Stdout,
                    lost: 3,
                },
                b"hi\n".to_vec(),
            ),
            (GuestMsg::Keepalive { id }, vec![]),
            (
                GuestMsg::ProcEnd(ProcEnd {
                    id,
                    pid: 42,
                    exit_code: 0,
                    exited: true,
                    signal: None,
                    status: "exit status 0".into(),
                    error: None,
                }),
                vec![],
            ),
        ],
        HostMsg::ProcConnect(_) | HostMsg::ProcSignal(_) => vec![(
            GuestMsg::Error {
                id,
                code: proto::ERR_NOT_FOUND.into(),
                message: "no such process".into(),
            },
            vec![],
        )],
        HostMsg::FsWatch { .. } => vec![
            (GuestMsg::WatchStarted { id }, vec![]),
            (
                GuestMsg::FsEvents {
                    id,
                    events: vec![proto::FsEvent {
                        name: "a".into(),
                        op: proto::FsOp::Create,
                    }],
                    dropped: 0,
                },
                vec![],
            ),
        ],
        HostMsg::StreamCancel { .. } => vec![(GuestMsg::Ack { id }, vec![])],
        HostMsg::FsList { .. } => vec![(GuestMsg::FsEntries { id, count: 0 }, b"[]".to_vec())],
        _ => vec![(
            GuestMsg::Error {
                id,
                code: proto::ERR_UNSUPPORTED.into(),
                message: "not in this fake".into(),
            },
            vec![],
        )],
    }
}

#[tokio::test]
async fn a_process_stream_replays_then_ends_and_a_dropped_watch_is_cancelled() {
    let (conn, seen, _dir) = fake(3, Box::new(v3_agent)).await;
    for target in [ProcTarget::Pid(42), ProcTarget::Tag("web".into())] {
        let (pid, mut s) = conn.proc_connect(&target).await.unwrap();
        assert_eq!(pid, 42);
        assert_eq!(
            s.next().await.unwrap(),
            Some(ProcEvent::Data {
                stream: ProcStream::Stdout,
                lost: 3,
                data: b"hi\n".to_vec()
            })
        );
        assert_eq!(s.next().await.unwrap(), Some(ProcEvent::Keepalive));
        assert!(matches!(s.next().await.unwrap(), Some(ProcEvent::End(e)) if e.exit_code == 0));
        assert_eq!(s.next().await.unwrap(), None, "nothing after the end");
    }
    match conn.proc_connect(&ProcTarget::Pid(7)).await {
        Err(AgentError::Guest { code, .. }) => assert_eq!(code, proto::ERR_NOT_FOUND),
        other => panic!("expected not_found, got {:?}", other.map(|(p, _)| p)),
    }
    assert!(conn.fs_list("/", 1).await.unwrap().is_empty());

    let mut w = conn.fs_watch("/tmp", true).await.unwrap();
    let watch_id = w.id();
    assert!(matches!(
        w.next().await.unwrap(),
        Some(WatchEvent::Events { events, .. }) if events.len() == 1
    ));
    drop(w);
    // The cancel is sent from a task of its own.
    let t = tokio::time::Instant::now();
    while !seen.lock().unwrap().contains(&"stream_cancel".to_string()) {
        assert!(t.elapsed() < T, "a dropped stream must be cancelled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The ended process streams were not cancelled: only the watch was.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().filter(|s| *s == "stream_cancel").count(), 1);
    assert!(watch_id > 0);
}

#[test]
fn request_ids_never_repeat_across_connections() {
    let a: Vec<u64> = (0..1000).map(|_| next_request_id()).collect();
    let b: Vec<u64> = (0..1000).map(|_| next_request_id()).collect();
    let all: std::collections::HashSet<_> = a.iter().chain(&b).collect();
    assert_eq!(all.len(), 2000);
}
