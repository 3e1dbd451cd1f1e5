//! [`AgentConn`] against a fake agent on a unix socket: protocol-version
//! gating, how an old agent's refusals surface, and archive splitting.

use super::*;
use forkvm_agent_protocol::tar::{self, Kind, Meta, Writer};
use std::sync::Mutex as StdMutex;
use tokio::net::UnixListener;

/// What the fake agent answers to one request: reply frames.
pub(super) type Respond = Box<dyn FnMut(&Frame<HostMsg>) -> Vec<(GuestMsg, Vec<u8>)> + Send>;

/// A fake agent speaking `protocol`: answers pings itself, everything else
/// with `respond`, and records the type of every request it receives.
pub(super) async fn fake(
    protocol: u32,
    mut respond: Respond,
) -> (
    Arc<AgentConn>,
    Arc<StdMutex<Vec<String>>>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let seen: Arc<StdMutex<Vec<String>>> = Arc::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            let n = match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            while let Some(frame) = proto::decode::<HostMsg>(&mut buf).unwrap() {
                let kind = serde_json::to_value(&frame.msg).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_string();
                seen2.lock().unwrap().push(kind);
                let replies = match frame.msg {
                    HostMsg::Ping { id } => vec![(
                        GuestMsg::Pong {
                            id,
                            agent_version: "test".into(),
                            protocol,
                            uptime_ms: 1,
                        },
                        vec![],
                    )],
                    _ => respond(&frame),
                };
                for (m, p) in replies {
                    s.write_all(&proto::encode(&m, &p).unwrap()).await.unwrap();
                }
            }
        }
    });
    let conn = AgentConn::connect(&sock).await.unwrap();
    (conn, seen, dir)
}

/// What a protocol-1 agent answers to a request type it does not know.
pub(super) fn old_agent(f: &Frame<HostMsg>) -> Vec<(GuestMsg, Vec<u8>)> {
    let kind = serde_json::to_value(&f.msg).unwrap()["type"].clone();
    let message = format!(
        "unsupported or malformed request: unknown variant `{}`, expected one of `ping`, `exec`, `write_file`, `read_file`, `shutdown`, `identity`, `set_clock`, `net_probe` at line 1 column 20",
        kind.as_str().unwrap()
    );
    if matches!(f.msg, HostMsg::Exec { .. }) {
        return vec![(
            GuestMsg::Exited {
                id: f.msg.id(),
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                duration_ms: 1,
            },
            vec![],
        )];
    }
    vec![(
        GuestMsg::Error {
            id: f.msg.id(),
            code: proto::ERR_INVALID.into(),
            message,
        },
        vec![],
    )]
}

pub(super) const T: Duration = Duration::from_secs(10);

pub(super) fn is_unsupported(r: Result<impl std::fmt::Debug, AgentError>) -> bool {
    match r {
        Err(e @ AgentError::Unsupported { .. }) => e.to_string().contains("rebuild the template"),
        other => {
            eprintln!("not unsupported: {other:?}");
            false
        }
    }
}

#[tokio::test]
async fn an_old_agent_is_refused_clearly_and_never_sent_fields_it_would_drop() {
    let (conn, seen, _dir) = fake(1, Box::new(old_agent)).await;
    assert!(is_unsupported(conn.sync(T).await));
    assert!(is_unsupported(conn.resize_rootfs(T).await));
    assert!(is_unsupported(conn.port_open(8080, T).await));
    let tar = Writer::new().finish();
    assert!(is_unsupported(
        conn.put_archive("/app", None, &tar, T).await
    ));
    // These would silently run as root / in the foreground: refused here.
    let spec = ExecSpec {
        argv: vec!["id".into()],
        ..Default::default()
    };
    assert!(is_unsupported(
        conn.exec_as(spec.clone(), Some("app"), T, None).await
    ));
    let start = StartSpec {
        argv: vec!["server".into()],
        ..Default::default()
    };
    assert!(is_unsupported(conn.start_detached(start, T).await));
    // A plain exec still works with it.
    assert_eq!(conn.exec(spec, T).await.unwrap().exit_code, Some(0));
    assert_eq!(conn.protocol(T).await.unwrap(), 1);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "sync",
            "resize_rootfs",
            "port_probe",
            "put_archive",
            "ping",
            "exec"
        ],
        "the version was asked once and no user/detach exec was sent"
    );
}

/// A protocol-2 agent that answers every new request sensibly.
fn new_agent(f: &Frame<HostMsg>) -> Vec<(GuestMsg, Vec<u8>)> {
    let id = f.msg.id();
    let m = match &f.msg {
        HostMsg::Exec {
            detach: true,
            user,
            log_path,
            timeout_ms: None,
            ..
        } => {
            assert_eq!(user.as_deref(), Some("node"));
            GuestMsg::Started {
                id,
                pid: 321,
                log_path: log_path
                    .clone()
                    .unwrap_or_else(|| "/run/forkvm/start-321.log".into()),
            }
        }
        HostMsg::Exec {
            user,
            detach: false,
            ..
        } => GuestMsg::Exited {
            id,
            exit_code: Some(if user.as_deref() == Some("app") { 7 } else { 0 }),
            signal: None,
            timed_out: false,
            duration_ms: 1,
        },
        HostMsg::PortProbe { port, .. } => GuestMsg::PortOpen {
            id,
            open: *port == 8888,
        },
        HostMsg::ResizeRootfs { .. } => GuestMsg::RootfsResized {
            id,
            old_bytes: 2 << 30,
            new_bytes: 10 << 30,
        },
        HostMsg::Sync { .. } => GuestMsg::Synced { id },
        HostMsg::PutArchive { .. } => GuestMsg::Error {
            id,
            code: proto::ERR_UNSUPPORTED.into(),
            message: "pretend this one is newer".into(),
        },
        other => panic!("unexpected {other:?}"),
    };
    vec![(m, vec![])]
}

#[tokio::test]
async fn a_current_agent_gets_every_operation() {
    let (conn, _seen, _dir) = fake(2, Box::new(new_agent)).await;
    let start = StartSpec {
        argv: vec!["npm".into(), "start".into()],
        user: Some("node".into()),
        ..Default::default()
    };
    assert_eq!(
        conn.start_detached(start, T).await.unwrap(),
        StartedProcess {
            pid: 321,
            log_path: "/run/forkvm/start-321.log".into()
        }
    );
    let spec = ExecSpec {
        argv: vec!["id".into()],
        ..Default::default()
    };
    let out = conn.exec_as(spec, Some("app"), T, None).await.unwrap();
    assert_eq!(out.exit_code, Some(7), "the user reached the agent");
    assert!(conn.port_open(8888, T).await.unwrap());
    assert!(!conn.port_open(8889, T).await.unwrap());
    assert_eq!(
        conn.resize_rootfs(T).await.unwrap(),
        RootfsSize {
            old_bytes: 2 << 30,
            new_bytes: 10 << 30
        }
    );
    conn.sync(T).await.unwrap();
    // The protocol-2 spelling of "unknown request" maps the same way.
    let tar = Writer::new().finish();
    assert!(is_unsupported(conn.put_archive("/", None, &tar, T).await));
}

/// Extracted (path, content) pairs, in archive order.
type Files = Arc<StdMutex<Vec<(Vec<u8>, Vec<u8>)>>>;

/// An agent that extracts archives into memory, as the real one does on disk.
fn extracting_agent(files: Files) -> Respond {
    Box::new(move |f| {
        let HostMsg::PutArchive {
            id,
            dest,
            append_at,
            owner,
        } = &f.msg
        else {
            panic!("unexpected {:?}", f.msg);
        };
        assert_eq!(
            (dest.as_str(), owner.as_deref()),
            ("/app", Some("1000:1000"))
        );
        assert!(f.payload.len() <= 8192, "a part over the limit");
        let mut files = files.lock().unwrap();
        let (mut entries, mut bytes) = (0, 0);
        for e in tar::entries(&f.payload) {
            let e = e.unwrap();
            let data = e.data(&f.payload).to_vec();
            bytes += data.len() as u64;
            entries += 1;
            match append_at {
                Some(off) => {
                    let last = files.last_mut().unwrap();
                    assert_eq!((&last.0, last.1.len() as u64), (&e.path, *off));
                    last.1.extend(data);
                }
                None => files.push((e.path.clone(), data)),
            }
        }
        vec![(
            GuestMsg::ArchiveWritten {
                id: *id,
                entries,
                bytes,
            },
            vec![],
        )]
    })
}

#[tokio::test]
async fn put_archive_splits_between_entries_and_pieces_big_files() {
    let files = Arc::new(StdMutex::new(Vec::new()));
    let (conn, seen, _dir) = fake(2, extracting_agent(files.clone())).await;
    let big: Vec<u8> = (0..50_000u32).map(|i| (i % 241) as u8).collect();
    let mut w = Writer::new();
    for i in 0..20 {
        w.file(
            &format!("src/f{i}.js"),
            &Meta::default(),
            &[b'a' + i as u8; 700],
        );
    }
    w.file("assets/big.bin", &Meta::default(), &big);
    w.entry(Kind::Dir, b"empty/", b"", &Meta::default(), b"");
    let archive = w.finish();
    let sum = conn
        .put_archive_in_parts("/app", Some("1000:1000"), &archive, 8192, T)
        .await
        .unwrap();
    assert_eq!(sum.entries, 22);
    assert_eq!(sum.bytes, 20 * 700 + 50_000);
    assert!(sum.requests > 8, "{sum:?}");
    assert_eq!(sum.requests as usize, seen.lock().unwrap().len());
    {
        let files = files.lock().unwrap();
        assert_eq!(files.len(), 22);
        assert_eq!(files[20], (b"assets/big.bin".to_vec(), big));
        assert_eq!(files[3], (b"src/f3.js".to_vec(), vec![b'd'; 700]));
    }

    // A corrupt archive is refused before anything is sent.
    let mut bad = archive.clone();
    bad[100] ^= 1;
    let before = seen.lock().unwrap().len();
    let e = conn
        .put_archive_in_parts("/app", Some("1000:1000"), &bad, 8192, T)
        .await
        .unwrap_err();
    assert!(matches!(e, AgentError::InvalidArchive(_)), "{e}");
    assert_eq!(seen.lock().unwrap().len(), before);
}

#[tokio::test]
async fn an_empty_archive_still_makes_one_request() {
    let files = Arc::new(StdMutex::new(Vec::new()));
    let (conn, seen, _dir) = fake(2, extracting_agent(files)).await;
    let sum = conn
        .put_archive("/app", Some("1000:1000"), &[], T)
        .await
        .unwrap();
    assert_eq!(
        sum,
        ArchiveSummary {
            entries: 0,
            bytes: 0,
            requests: 1
        }
    );
    assert_eq!(seen.lock().unwrap().as_slice(), ["put_archive"]);
}
