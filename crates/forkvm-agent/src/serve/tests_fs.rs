//! End-to-end tests of the filesystem requests and watches through the
//! serve loop.

use super::tests_procs::{agent, connect, Conn};
use super::*;
use crate::files::tests::temp_dir;
use forkvm_agent_protocol::{EntryInfo, FileKind, FsEvent, FsOp, ERR_NOT_FOUND};
use std::path::Path;
use std::time::Instant;

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn entry_of(m: GuestMsg) -> EntryInfo {
    match m {
        GuestMsg::FsEntry { entry, .. } => entry,
        m => panic!("expected fs_entry, got {m:?}"),
    }
}

fn error_of(m: &GuestMsg) -> &str {
    match m {
        GuestMsg::Error { code, .. } => code,
        m => panic!("expected an error, got {m:?}"),
    }
}

#[test]
fn stat_list_mkdir_move_remove_exists() {
    let d = temp_dir("serve-fs");
    let mut c = connect(&agent(), 0);
    let id = c.id();

    // mkdir -p, twice.
    let deep = d.join("a/b/c");
    match c.call(&HostMsg::FsMkdir { id, path: s(&deep) }, b"") {
        GuestMsg::DirMade { entry, existed, .. } => {
            assert!(!existed);
            assert_eq!((entry.kind, entry.name.as_str()), (FileKind::Dir, "c"));
            assert!(entry.permissions.starts_with('d'), "{}", entry.permissions);
        }
        m => panic!("{m:?}"),
    }
    let id = c.id();
    let m = c.call(&HostMsg::FsMkdir { id, path: s(&deep) }, b"");
    assert!(
        matches!(m, GuestMsg::DirMade { existed: true, .. }),
        "{m:?}"
    );
    std::fs::write(d.join("a/file.txt"), b"hello").unwrap();
    use std::os::unix::fs::PermissionsExt;
    let perm = std::fs::Permissions::from_mode(0o640);
    std::fs::set_permissions(d.join("a/file.txt"), perm).unwrap();
    std::os::unix::fs::symlink("file.txt", d.join("a/link")).unwrap();
    let id = c.id();
    let m = c.call(
        &HostMsg::FsMkdir {
            id,
            path: s(&d.join("a/file.txt")),
        },
        b"",
    );
    assert_eq!(error_of(&m), ERR_INVALID);

    // stat: a file and a symlink.
    let id = c.id();
    let e = entry_of(c.call(
        &HostMsg::FsStat {
            id,
            path: s(&d.join("a/file.txt")),
        },
        b"",
    ));
    assert_eq!(
        (e.kind, e.size, e.path.clone()),
        (FileKind::File, 5, s(&d.join("a/file.txt")))
    );
    assert_eq!((e.mode, e.permissions.as_str()), (0o640, "-rw-r-----"));
    assert!(e.modified_ns > 1_600_000_000_000_000_000);
    assert!(!e.owner.is_empty() && !e.group.is_empty());
    let id = c.id();
    let e = entry_of(c.call(
        &HostMsg::FsStat {
            id,
            path: s(&d.join("a/link")),
        },
        b"",
    ));
    assert_eq!(
        (e.kind, e.symlink_target.as_deref()),
        (FileKind::Symlink, Some("file.txt"))
    );
    assert!(e.permissions.starts_with('L'));
    let id = c.id();
    let m = c.call(
        &HostMsg::FsStat {
            id,
            path: s(&d.join("none")),
        },
        b"",
    );
    assert_eq!(error_of(&m), ERR_NOT_FOUND);
    let id = c.id();
    let m = c.call(
        &HostMsg::FsStat {
            id,
            path: "relative".into(),
        },
        b"",
    );
    assert_eq!(error_of(&m), ERR_INVALID);

    // list, at depths 1 and 3.
    let list = |c: &mut Conn, depth| {
        let id = c.id();
        let sent = c.send(
            &HostMsg::FsList {
                id,
                path: s(&d),
                depth,
            },
            b"",
        );
        let f = c.recv(sent);
        let GuestMsg::FsEntries { count, .. } = f.msg else {
            panic!("{:?}", f.msg)
        };
        let entries: Vec<EntryInfo> = serde_json::from_slice(&f.payload).unwrap();
        assert_eq!(count as usize, entries.len());
        entries
            .into_iter()
            .map(|e| e.path.strip_prefix(&s(&d)).unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(list(&mut c, 0), vec!["/a"]);
    assert_eq!(list(&mut c, 1), vec!["/a"]);
    assert_eq!(
        list(&mut c, 3),
        vec!["/a", "/a/b", "/a/b/c", "/a/file.txt", "/a/link"]
    );

    // move, exists, remove.
    let id = c.id();
    let mv = HostMsg::FsMove {
        id,
        source: s(&d.join("a/file.txt")),
        destination: s(&d.join("a/b/moved.txt")),
    };
    let e = entry_of(c.call(&mv, b""));
    assert_eq!((e.name.as_str(), e.size), ("moved.txt", 5));
    let exists = |c: &mut Conn, p: &Path| {
        let id = c.id();
        match c.call(&HostMsg::FsExists { id, path: s(p) }, b"") {
            GuestMsg::Exists { exists, .. } => exists,
            m => panic!("{m:?}"),
        }
    };
    assert!(!exists(&mut c, &d.join("a/file.txt")));
    assert!(exists(&mut c, &d.join("a/b/moved.txt")));
    assert!(
        exists(&mut c, &d.join("a/link")),
        "a dangling symlink exists"
    );
    assert!(!exists(&mut c, &d.join("a/b/moved.txt/x")));
    let id = c.id();
    assert_eq!(
        c.call(
            &HostMsg::FsRemove {
                id,
                path: s(&d.join("a"))
            },
            b""
        ),
        GuestMsg::Ack { id }
    );
    assert!(!exists(&mut c, &d.join("a")));
    let id = c.id();
    let m = c.call(
        &HostMsg::FsRemove {
            id,
            path: s(&d.join("a")),
        },
        b"",
    );
    assert_eq!(error_of(&m), ERR_NOT_FOUND);
    let id = c.id();
    assert_eq!(
        error_of(&c.call(
            &HostMsg::FsRemove {
                id,
                path: "/".into()
            },
            b""
        )),
        ERR_INVALID
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Events of watch stream `id` until one matches `want`.
fn wait_event(c: &mut Conn, id: u64, want: &FsEvent) -> Vec<FsEvent> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match c.recv(id).msg {
            GuestMsg::FsEvents { events, .. } => {
                seen.extend(events);
                if seen.contains(want) {
                    return seen;
                }
            }
            GuestMsg::Keepalive { .. } => {}
            m => panic!("unexpected {m:?}"),
        }
    }
    panic!("never saw {want:?} in {seen:?}");
}

#[test]
fn watch_sees_create_and_delete_until_cancelled() {
    let d = temp_dir("serve-watch");
    let mut c = connect(&agent(), 100);
    let id = c.id();
    let w = c.send(
        &HostMsg::FsWatch {
            id,
            path: s(&d),
            recursive: true,
        },
        b"",
    );
    assert_eq!(c.recv(w).msg, GuestMsg::WatchStarted { id: w });
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/new.txt"), b"x").unwrap();
    let ev = |name: &str, op| FsEvent {
        name: name.into(),
        op,
    };
    wait_event(&mut c, w, &ev("sub/new.txt", FsOp::Create));
    std::fs::remove_file(d.join("sub/new.txt")).unwrap();
    wait_event(&mut c, w, &ev("sub/new.txt", FsOp::Remove));
    let id = c.id();
    assert_eq!(
        c.call(&HostMsg::StreamCancel { id, stream: w }, b""),
        GuestMsg::Ack { id }
    );

    // A watch on something that is not there fails at once.
    let id = c.id();
    let bad = c.send(
        &HostMsg::FsWatch {
            id,
            path: s(&d.join("none")),
            recursive: false,
        },
        b"",
    );
    assert_eq!(error_of(&c.recv(bad).msg), ERR_NOT_FOUND);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn polled_watcher_collects_events_between_polls() {
    let d = temp_dir("serve-watcher");
    let mut c = connect(&agent(), 200);
    let id = c.id();
    let GuestMsg::Watcher { watcher_id, .. } = c.call(
        &HostMsg::WatcherCreate {
            id,
            path: s(&d),
            recursive: false,
        },
        b"",
    ) else {
        panic!()
    };
    std::fs::write(d.join("f"), b"1").unwrap();
    std::fs::remove_file(d.join("f")).unwrap();
    let id = c.id();
    let poll = HostMsg::WatcherPoll {
        id,
        watcher_id: watcher_id.clone(),
    };
    let GuestMsg::FsEvents {
        events, dropped, ..
    } = c.call(&poll, b"")
    else {
        panic!()
    };
    assert_eq!(dropped, 0);
    let ops: Vec<_> = events.iter().map(|e| (e.name.as_str(), e.op)).collect();
    assert_eq!(
        ops,
        vec![("f", FsOp::Create), ("f", FsOp::Write), ("f", FsOp::Remove)]
    );
    let GuestMsg::FsEvents { events, .. } = c.call(&poll, b"") else {
        panic!()
    };
    assert!(events.is_empty(), "{events:?}");
    let id = c.id();
    let rm = HostMsg::WatcherRemove {
        id,
        watcher_id: watcher_id.clone(),
    };
    assert_eq!(c.call(&rm, b""), GuestMsg::Ack { id });
    assert_eq!(error_of(&c.call(&poll, b"")), ERR_NOT_FOUND);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn get_archive_round_trips_through_put_archive() {
    let d = temp_dir("serve-getarchive");
    std::fs::create_dir_all(d.join("src/app/sub")).unwrap();
    std::fs::write(d.join("src/app/a.txt"), b"alpha").unwrap();
    std::fs::write(d.join("src/app/sub/b.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::write(d.join("src/single"), b"one").unwrap();
    std::os::unix::fs::symlink("a.txt", d.join("src/app/link")).unwrap();
    let mut c = connect(&agent(), 300);
    let id = c.id();
    let paths = vec![s(&d.join("src/app")), s(&d.join("src/single"))];
    let get = HostMsg::GetArchive {
        id,
        paths: paths.clone(),
        max_bytes: None,
    };
    let sent = c.send(&get, b"");
    let f = c.recv(sent);
    assert_eq!(
        f.msg,
        GuestMsg::ArchiveData {
            id,
            entries: 6,
            bytes: 12
        }
    );
    // Unpacked at a new root, everything is where it was under it.
    let id = c.id();
    let put = HostMsg::PutArchive {
        id,
        dest: s(&d.join("copy")),
        owner: None,
        append_at: None,
    };
    assert!(matches!(
        c.call(&put, &f.payload),
        GuestMsg::ArchiveWritten { entries: 6, .. }
    ));
    let copy = d.join("copy").join(d.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read(copy.join("src/app/a.txt")).unwrap(), b"alpha");
    assert_eq!(
        std::fs::read(copy.join("src/app/sub/b.bin")).unwrap(),
        [0u8, 1, 2, 255]
    );
    assert_eq!(std::fs::read(copy.join("src/single")).unwrap(), b"one");
    assert_eq!(
        std::fs::read_link(copy.join("src/app/link")).unwrap(),
        Path::new("a.txt")
    );

    let id = c.id();
    let small = HostMsg::GetArchive {
        id,
        paths,
        max_bytes: Some(2000),
    };
    assert_eq!(
        error_of(&c.call(&small, b"")),
        forkvm_agent_protocol::ERR_TOO_LARGE
    );
    let id = c.id();
    let none = HostMsg::GetArchive {
        id,
        paths: vec![s(&d.join("none"))],
        max_bytes: None,
    };
    assert_eq!(error_of(&c.call(&none, b"")), ERR_NOT_FOUND);
    std::fs::remove_dir_all(&d).unwrap();
}
