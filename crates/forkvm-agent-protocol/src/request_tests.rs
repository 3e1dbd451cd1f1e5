//! Round trips and malformed frames for the messages of protocol 2, and the
//! compatibility rules between protocol 1 and 2 peers.

use super::*;

/// Encode, decode through both decoders, and compare.
fn roundtrip<M>(msg: &M, payload: &[u8])
where
    M: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug + Clone,
{
    let bytes = encode(msg, payload).unwrap();
    let mut buf = bytes.clone();
    let f: Frame<M> = decode(&mut buf).unwrap().unwrap();
    assert_eq!(f.msg, *msg);
    assert_eq!(f.payload, payload);
    assert!(buf.is_empty());
    let f2: Frame<M> = read_frame(&mut &bytes[..]).unwrap().unwrap();
    assert_eq!(f2.msg, *msg);
}

/// A frame with a hand-written JSON header.
fn raw(header: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend((header.len() as u32).to_le_bytes());
    bytes.extend((payload.len() as u32).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(payload);
    bytes
}

fn decode_raw<M: for<'de> Deserialize<'de>>(header: &str) -> Result<M, FrameError> {
    decode::<M>(&mut raw(header, b"")).map(|f| f.expect("whole frame").msg)
}

#[test]
fn new_host_messages_roundtrip() {
    let exec = HostMsg::Exec {
        id: 1,
        argv: vec!["server".into()],
        env: BTreeMap::from([("PORT".into(), "8000".into())]),
        cwd: Some("/app".into()),
        timeout_ms: None,
        user: Some("1000:users".into()),
        detach: true,
        log_path: Some("/var/log/app.log".into()),
    };
    roundtrip(&exec, b"");
    roundtrip(
        &HostMsg::PortProbe {
            id: 2,
            port: 8888,
            timeout_ms: 250,
        },
        b"",
    );
    let tar = tar::Writer::new().finish();
    roundtrip(
        &HostMsg::PutArchive {
            id: 3,
            dest: "/app".into(),
            owner: Some("node".into()),
            append_at: None,
        },
        &tar,
    );
    roundtrip(
        &HostMsg::PutArchive {
            id: 4,
            dest: "/".into(),
            owner: None,
            append_at: Some(64 << 20),
        },
        b"x",
    );
    roundtrip(&HostMsg::ResizeRootfs { id: 5 }, b"");
    roundtrip(&HostMsg::Sync { id: 6 }, b"");
    for (msg, id) in [
        (
            HostMsg::PortProbe {
                id: 7,
                port: 1,
                timeout_ms: 1,
            },
            7,
        ),
        (HostMsg::ResizeRootfs { id: 8 }, 8),
        (HostMsg::Sync { id: 9 }, 9),
        (
            HostMsg::PutArchive {
                id: 10,
                dest: "/".into(),
                owner: None,
                append_at: None,
            },
            10,
        ),
    ] {
        assert_eq!(msg.id(), id);
    }
}

#[test]
fn new_guest_messages_roundtrip() {
    let msgs = [
        GuestMsg::Started {
            id: 1,
            pid: 4242,
            log_path: "/run/forkvm/start-4242.log".into(),
        },
        GuestMsg::PortOpen { id: 2, open: true },
        GuestMsg::PortOpen { id: 3, open: false },
        GuestMsg::ArchiveWritten {
            id: 4,
            entries: 12,
            bytes: 1 << 33,
        },
        GuestMsg::RootfsResized {
            id: 5,
            old_bytes: 2 << 30,
            new_bytes: 10 << 30,
        },
        GuestMsg::Synced { id: 6 },
    ];
    for (i, m) in msgs.iter().enumerate() {
        roundtrip(m, b"");
        assert_eq!(m.id(), i as u64 + 1);
    }
}

#[test]
fn wire_names_are_snake_case() {
    let h = |m: &HostMsg| serde_json::to_value(m).unwrap()["type"].clone();
    assert_eq!(
        h(&HostMsg::PortProbe {
            id: 1,
            port: 1,
            timeout_ms: 1
        }),
        "port_probe"
    );
    assert_eq!(
        h(&HostMsg::PutArchive {
            id: 1,
            dest: "/".into(),
            owner: None,
            append_at: None
        }),
        "put_archive"
    );
    assert_eq!(h(&HostMsg::ResizeRootfs { id: 1 }), "resize_rootfs");
    assert_eq!(h(&HostMsg::Sync { id: 1 }), "sync");
    let g = |m: &GuestMsg| serde_json::to_value(m).unwrap()["type"].clone();
    assert_eq!(
        g(&GuestMsg::ArchiveWritten {
            id: 1,
            entries: 0,
            bytes: 0
        }),
        "archive_written"
    );
    assert_eq!(
        g(&GuestMsg::RootfsResized {
            id: 1,
            old_bytes: 0,
            new_bytes: 0
        }),
        "rootfs_resized"
    );
    assert_eq!(g(&GuestMsg::PortOpen { id: 1, open: true }), "port_open");
}

#[test]
fn protocol1_exec_still_decodes_with_defaults() {
    // What a protocol-1 host sends: no user, detach or log_path.
    let m: HostMsg = decode_raw(r#"{"type":"exec","id":3,"argv":["true"]}"#).unwrap();
    assert_eq!(
        m,
        HostMsg::Exec {
            id: 3,
            argv: vec!["true".into()],
            env: BTreeMap::new(),
            cwd: None,
            timeout_ms: None,
            user: None,
            detach: false,
            log_path: None,
        }
    );
    let m: HostMsg = decode_raw(r#"{"type":"put_archive","id":3,"dest":"/x"}"#).unwrap();
    assert_eq!(
        m,
        HostMsg::PutArchive {
            id: 3,
            dest: "/x".into(),
            owner: None,
            append_at: None
        }
    );
}

#[test]
fn unknown_fields_are_ignored_both_ways() {
    // A newer peer's extra fields must not break an older reader.
    let m: HostMsg = decode_raw(r#"{"type":"sync","id":1,"future":true}"#).unwrap();
    assert_eq!(m, HostMsg::Sync { id: 1 });
    let m: GuestMsg =
        decode_raw(r#"{"type":"started","id":1,"pid":5,"log_path":"/l","cgroup":"x"}"#).unwrap();
    assert_eq!(
        m,
        GuestMsg::Started {
            id: 1,
            pid: 5,
            log_path: "/l".into()
        }
    );
}

#[test]
fn malformed_new_messages_are_rejected() {
    for header in [
        r#"{"type":"port_probe","id":1,"port":70000,"timeout_ms":1}"#, // port out of range
        r#"{"type":"port_probe","id":1,"port":80}"#,                   // no timeout
        r#"{"type":"put_archive","id":1}"#,                            // no dest
        r#"{"type":"put_archive","id":1,"dest":"/","append_at":-1}"#,
        r#"{"type":"resize_rootfs"}"#, // no id
        r#"{"type":"sync","id":"one"}"#,
        r#"{"type":"exec","id":1,"argv":["x"],"detach":"yes"}"#,
        r#"{"type":"exec","id":1,"argv":["x"],"user":1000}"#,
    ] {
        assert!(
            matches!(decode_raw::<HostMsg>(header), Err(FrameError::BadHeader(_))),
            "{header}"
        );
    }
    for header in [
        r#"{"type":"started","id":1,"pid":-1,"log_path":""}"#,
        r#"{"type":"port_open","id":1}"#,
        r#"{"type":"archive_written","id":1,"entries":1}"#,
        r#"{"type":"rootfs_resized","id":1,"old_bytes":1}"#,
        r#"{"type":"synced"}"#,
    ] {
        assert!(
            matches!(
                decode_raw::<GuestMsg>(header),
                Err(FrameError::BadHeader(_))
            ),
            "{header}"
        );
    }
}

#[test]
fn old_and_new_unsupported_replies_are_recognised() {
    // What a protocol-1 agent answers to `sync`: serde's own message.
    let e = serde_json::from_str::<HostMsg>(r#"{"type":"format_disk","id":1}"#).unwrap_err();
    let old = format!("unsupported or malformed request: {e}");
    assert!(is_unsupported_error(ERR_INVALID, &old), "{old}");
    assert!(is_unsupported_error(ERR_UNSUPPORTED, "anything"));
    assert!(!is_unsupported_error(ERR_INVALID, "argv is empty"));
    assert!(!is_unsupported_error(ERR_IO, "unknown variant"));
}
