//! Every protocol-3 message: round trip, truncation, corruption, and the
//! exact wire shape of a few.

use super::*;
use crate::{decode, encode, read_frame, Frame, FrameError, GuestMsg, HostMsg, PREFIX_LEN};

fn entry() -> EntryInfo {
    EntryInfo {
        name: "a.txt".into(),
        kind: FileKind::File,
        path: "/tmp/a.txt".into(),
        size: 3,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "root".into(),
        group: "root".into(),
        modified_ns: 1_700_000_000_123_456_789,
        symlink_target: None,
    }
}

fn r(id: u64) -> ProcRef {
    ProcRef {
        id,
        pid: Some(42),
        tag: None,
    }
}

fn host_msgs() -> Vec<(HostMsg, &'static [u8])> {
    vec![
        (
            HostMsg::ProcStart(ProcStart {
                id: 1,
                cmd: "sh".into(),
                args: vec!["-c".into(), "echo hi".into()],
                envs: BTreeMap::from([("A".into(), "b".into())]),
                cwd: Some("/tmp".into()),
                user: Some("1000".into()),
                tag: Some("srv".into()),
                pty: Some(PtySize { cols: 80, rows: 24 }),
                stdin: true,
            }),
            b"",
        ),
        (HostMsg::ProcConnect(r(2)), b""),
        (HostMsg::ProcList { id: 3 }, b""),
        (HostMsg::ProcInput(r(4)), b"input bytes"),
        (HostMsg::ProcCloseStdin(r(5)), b""),
        (
            HostMsg::ProcSignal(ProcSignal {
                id: 6,
                pid: None,
                tag: Some("srv".into()),
                signal: 15,
            }),
            b"",
        ),
        (
            HostMsg::ProcResize(ProcResize {
                id: 7,
                pid: Some(9),
                tag: None,
                size: PtySize {
                    cols: 100,
                    rows: 30,
                },
            }),
            b"",
        ),
        (HostMsg::StreamCancel { id: 8, stream: 1 }, b""),
        (
            HostMsg::FsStat {
                id: 9,
                path: "/a".into(),
            },
            b"",
        ),
        (
            HostMsg::FsExists {
                id: 10,
                path: "/a".into(),
            },
            b"",
        ),
        (
            HostMsg::FsList {
                id: 11,
                path: "/a".into(),
                depth: 3,
            },
            b"",
        ),
        (
            HostMsg::FsMkdir {
                id: 12,
                path: "/a/b".into(),
            },
            b"",
        ),
        (
            HostMsg::FsMove {
                id: 13,
                source: "/a".into(),
                destination: "/b".into(),
            },
            b"",
        ),
        (
            HostMsg::FsRemove {
                id: 14,
                path: "/a".into(),
            },
            b"",
        ),
        (
            HostMsg::FsWatch {
                id: 15,
                path: "/a".into(),
                recursive: true,
            },
            b"",
        ),
        (
            HostMsg::WatcherCreate {
                id: 16,
                path: "/a".into(),
                recursive: false,
            },
            b"",
        ),
        (
            HostMsg::WatcherPoll {
                id: 17,
                watcher_id: "w1".into(),
            },
            b"",
        ),
        (
            HostMsg::WatcherRemove {
                id: 18,
                watcher_id: "w1".into(),
            },
            b"",
        ),
        (
            HostMsg::GetArchive {
                id: 19,
                paths: vec!["/etc/hosts".into(), "/app".into()],
                max_bytes: Some(1 << 20),
            },
            b"",
        ),
    ]
}

fn guest_msgs() -> Vec<(GuestMsg, &'static [u8])> {
    vec![
        (GuestMsg::ProcStarted { id: 1, pid: 42 }, b""),
        (
            GuestMsg::ProcData {
                id: 1,
                stream: ProcStream::Pty,
                lost: 7,
            },
            b"\x1b[1mhi\r\n",
        ),
        (
            GuestMsg::ProcEnd(ProcEnd {
                id: 1,
                pid: 42,
                exit_code: -1,
                exited: false,
                signal: Some(15),
                status: "signal: terminated".into(),
                error: None,
            }),
            b"",
        ),
        (GuestMsg::Keepalive { id: 1 }, b""),
        (
            GuestMsg::Processes {
                id: 3,
                processes: vec![ProcInfo {
                    pid: 42,
                    tag: Some("srv".into()),
                    cmd: "sleep".into(),
                    args: vec!["30".into()],
                    envs: BTreeMap::new(),
                    cwd: None,
                    pty: None,
                }],
            },
            b"",
        ),
        (GuestMsg::Ack { id: 4 }, b""),
        (
            GuestMsg::FsEntry {
                id: 9,
                entry: entry(),
            },
            b"",
        ),
        (
            GuestMsg::Exists {
                id: 10,
                exists: true,
            },
            b"",
        ),
        (GuestMsg::FsEntries { id: 11, count: 0 }, b"[]"),
        (
            GuestMsg::DirMade {
                id: 12,
                entry: entry(),
                existed: true,
            },
            b"",
        ),
        (GuestMsg::WatchStarted { id: 15 }, b""),
        (
            GuestMsg::FsEvents {
                id: 15,
                events: vec![FsEvent {
                    name: "sub/x".into(),
                    op: FsOp::Rename,
                }],
                dropped: 2,
            },
            b"",
        ),
        (
            GuestMsg::Watcher {
                id: 16,
                watcher_id: "w1".into(),
            },
            b"",
        ),
        (
            GuestMsg::ArchiveData {
                id: 19,
                entries: 1,
                bytes: 0,
            },
            &[0u8; 1024],
        ),
    ]
}

/// Round trip, every truncation, and every way of corrupting the frame.
fn check<M>(msg: &M, payload: &[u8], id: u64, id_of: fn(&M) -> u64)
where
    M: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
{
    let bytes = encode(msg, payload).unwrap();
    let mut buf = bytes.clone();
    let f: Frame<M> = decode(&mut buf).unwrap().unwrap();
    assert_eq!((&f.msg, f.payload.as_slice()), (msg, payload));
    assert_eq!(id_of(&f.msg), id);
    assert!(buf.is_empty());
    let f2: Frame<M> = read_frame(&mut &bytes[..]).unwrap().unwrap();
    assert_eq!(f2.msg, f.msg);

    for cut in 1..bytes.len() {
        let mut part = bytes[..cut].to_vec();
        assert!(
            decode::<M>(&mut part).unwrap().is_none(),
            "{msg:?} cut {cut}"
        );
        assert!(
            matches!(
                read_frame::<M, _>(&mut &bytes[..cut]),
                Err(FrameError::Io(_))
            ),
            "{msg:?} cut {cut}"
        );
    }

    let mut bad = bytes.clone();
    bad[1] ^= 0xff;
    assert!(matches!(
        decode::<M>(&mut bad),
        Err(FrameError::BadMagic(_))
    ));
    let mut bad = bytes.clone();
    bad[PREFIX_LEN] = b'!';
    assert!(matches!(
        decode::<M>(&mut bad),
        Err(FrameError::BadHeader(_))
    ));
    // The header cut short: its tail counted as payload instead.
    let mut bad = bytes.clone();
    let hlen = u32::from_le_bytes(bad[4..8].try_into().unwrap());
    let plen = u32::from_le_bytes(bad[8..12].try_into().unwrap());
    bad[4..8].copy_from_slice(&(hlen - 2).to_le_bytes());
    bad[8..12].copy_from_slice(&(plen + 2).to_le_bytes());
    assert!(matches!(
        decode::<M>(&mut bad),
        Err(FrameError::BadHeader(_))
    ));
}

#[test]
fn every_host_message_survives_framing_and_rejects_corruption() {
    for (i, (m, p)) in host_msgs().iter().enumerate() {
        check(m, p, i as u64 + 1, HostMsg::id);
    }
}

#[test]
fn every_guest_message_survives_framing_and_rejects_corruption() {
    for (m, p) in guest_msgs() {
        let id = m.id();
        check(&m, p, id, GuestMsg::id);
    }
}

#[test]
fn wire_shapes() {
    let v = serde_json::to_value(&host_msgs()[0].0).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"type": "proc_start", "id": 1, "cmd": "sh",
            "args": ["-c", "echo hi"], "envs": {"A": "b"}, "cwd": "/tmp",
            "user": "1000", "tag": "srv", "pty": {"cols": 80, "rows": 24},
            "stdin": true})
    );
    let m: HostMsg = serde_json::from_str(r#"{"type":"proc_start","id":3,"cmd":"ls"}"#).unwrap();
    let HostMsg::ProcStart(s) = m else {
        panic!("{m:?}")
    };
    assert!(s.args.is_empty() && s.pty.is_none() && !s.stdin && s.tag.is_none());
    let m: HostMsg = serde_json::from_str(r#"{"type":"proc_connect","id":3,"tag":"x"}"#).unwrap();
    assert_eq!(
        m,
        HostMsg::ProcConnect(ProcRef {
            id: 3,
            pid: None,
            tag: Some("x".into())
        })
    );
    let v = serde_json::to_value(&guest_msgs()[1].0).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"type": "proc_data", "id": 1, "stream": "pty", "lost": 7})
    );
    let v = serde_json::to_value(&guest_msgs()[11].0).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"type": "fs_events", "id": 15,
            "events": [{"name": "sub/x", "op": "rename"}], "dropped": 2})
    );
    let v = serde_json::to_value(entry()).unwrap();
    assert_eq!(v["kind"], "file");
    // A required field missing is a bad header, not a default.
    let e = serde_json::from_str::<HostMsg>(r#"{"type":"proc_signal","id":1,"pid":3}"#);
    assert!(e.is_err());
}
