//! Host integration tests: a real FUSE mount through the relay and server.
//! Needs root and /dev/fuse; fails with a clear message otherwise.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::time::Duration;

use common::{errno_of, Mount, HOST_OWNER};

#[test]
fn read_write_mkdir_readdir_rename_unlink() {
    let m = Mount::new(false);
    fs::write(m.h("hello"), "from host").unwrap();
    assert_eq!(fs::read_to_string(m.p("hello")).unwrap(), "from host");

    fs::write(m.p("new"), "from guest").unwrap();
    assert_eq!(fs::read_to_string(m.h("new")).unwrap(), "from guest");
    let hm = fs::metadata(m.h("new")).unwrap();
    assert_eq!(
        (hm.uid(), hm.gid()),
        HOST_OWNER,
        "created files belong to host_owner"
    );
    let gm = fs::metadata(m.p("new")).unwrap();
    assert_eq!((gm.uid(), gm.gid()), (0, 0), "entries show guest_owner");

    fs::create_dir(m.p("d")).unwrap();
    assert!(m.h("d").is_dir());
    fs::write(m.p("d/x"), "x").unwrap();
    let mut names: Vec<String> = fs::read_dir(m.p(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "hello", "new"]);

    fs::rename(m.p("d/x"), m.p("y")).unwrap();
    assert!(m.h("y").exists() && !m.h("d/x").exists());
    assert_eq!(fs::read_to_string(m.p("y")).unwrap(), "x");
    fs::rename(m.p("d"), m.p("e")).unwrap();
    fs::write(m.p("e/z"), "z").unwrap();
    assert_eq!(fs::read_to_string(m.h("e/z")).unwrap(), "z");

    fs::remove_file(m.p("y")).unwrap();
    fs::remove_file(m.p("e/z")).unwrap();
    fs::remove_dir(m.p("e")).unwrap();
    assert!(!m.h("y").exists() && !m.h("e").exists());

    // setuid is stripped, truncate and append work.
    fs::set_permissions(m.p("new"), fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(fs::metadata(m.h("new")).unwrap().mode() & 0o7777, 0o755);
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.p("new"))
        .unwrap();
    f.write_all(b"!").unwrap();
    drop(f);
    assert_eq!(fs::read_to_string(m.h("new")).unwrap(), "from guest!");
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.p("new"))
        .unwrap();
    assert_eq!(fs::metadata(m.h("new")).unwrap().len(), 0);
    let st = nix_statfs(&m.p(""));
    assert!(st > 0);
}

fn nix_statfs(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: zeroed statfs is a valid out value; path NUL-terminated.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0);
    s.f_blocks
}

#[test]
fn read_only_refuses_writes() {
    let m = Mount::new(true);
    fs::write(m.h("f"), "ro").unwrap();
    assert_eq!(fs::read_to_string(m.p("f")).unwrap(), "ro");
    let e = fs::write(m.p("g"), "no").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::OpenOptions::new()
        .write(true)
        .open(m.p("f"))
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::create_dir(m.p("d")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::remove_file(m.p("f")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    assert_eq!(fs::read_to_string(m.h("f")).unwrap(), "ro");
}

#[test]
fn escapes_are_refused() {
    let m = Mount::new(false);
    let outside = m.tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("marker"), "MARKER").unwrap();

    // A host symlink is served as a symlink (the guest resolves it in its
    // own namespace); the server never follows it.
    std::os::unix::fs::symlink(outside.join("marker"), m.h("abs")).unwrap();
    assert!(fs::symlink_metadata(m.p("abs"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(m.p("abs")).unwrap(), outside.join("marker"));
    let e = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(m.p("abs"))
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::ELOOP);

    // A directory swapped for a symlink to the outside after lookup.
    fs::create_dir(m.h("d")).unwrap();
    fs::write(m.h("d/f"), "inside").unwrap();
    assert_eq!(fs::read_to_string(m.p("d/f")).unwrap(), "inside");
    fs::rename(m.h("d"), m.h("d_old")).unwrap();
    std::os::unix::fs::symlink(&outside, m.h("d")).unwrap();
    fs::write(outside.join("f"), "MARKER").unwrap();
    if let Ok(s) = fs::read_to_string(m.p("d/f")) {
        assert_ne!(s, "MARKER");
    }
    assert!(fs::read_to_string(m.p("d/marker"))
        .map(|s| s != "MARKER")
        .unwrap_or(true));

    // Guest symlinks must stay inside.
    for t in ["/etc", "../../x", "../x"] {
        let e = std::os::unix::fs::symlink(t, m.p("l")).unwrap_err();
        assert_eq!(errno_of(&e), libc::EPERM, "{t}");
    }
    fs::create_dir(m.p("sub")).unwrap();
    std::os::unix::fs::symlink("../d_old/f", m.p("sub/ok")).unwrap();
    assert_eq!(
        fs::read_link(m.h("sub/ok")).unwrap().to_str(),
        Some("../d_old/f")
    );

    // A host hard link to an outside file cannot be opened.
    fs::hard_link(outside.join("marker"), m.h("hard")).unwrap();
    let e = fs::read(m.p("hard")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EPERM);
    // Guest hard links are refused.
    let e = fs::hard_link(m.p("d_old/f"), m.p("hl")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EPERM);
    // Only regular files may be made.
    let c = std::ffi::CString::new(m.p("fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: NUL-terminated path.
    assert_ne!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
}

#[test]
fn restore_into_a_new_server_keeps_open_files() {
    let mut m = Mount::new(false);
    fs::write(m.h("a"), "aaaa").unwrap();
    fs::write(m.h("b"), "bbbb").unwrap();
    let mut a = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("a"))
        .unwrap();
    let mut b = fs::File::open(m.p("b")).unwrap();
    let mut s = String::new();
    a.read_to_string(&mut s).unwrap();
    assert_eq!(s, "aaaa");

    m.server().quiesce(Duration::from_secs(5)).unwrap();
    let saved = m.tmp.path().join("saved");
    fs::create_dir(&saved).unwrap();
    m.server().save_journals(&saved).unwrap();
    let root = m.root.clone();
    m.restart(&root, &saved.join("0.journal"));

    // The new server reopens both handles lazily from the journal.
    let mut s = String::new();
    b.read_to_string(&mut s).unwrap();
    assert_eq!(s, "bbbb");
    a.seek(SeekFrom::Start(4)).unwrap();
    a.write_all(b"AA").unwrap();
    assert_eq!(fs::read_to_string(m.h("a")).unwrap(), "aaaaAA");
    // New lookups and creates work.
    fs::write(m.p("c"), "cc").unwrap();
    assert_eq!(fs::read_to_string(m.h("c")).unwrap(), "cc");
    assert_eq!(fs::read_to_string(m.p("b")).unwrap(), "bbbb");
}

#[test]
fn copy_fork_points_open_handles_at_the_copy() {
    let mut m = Mount::new(false);
    fs::create_dir(m.h("dir")).unwrap();
    fs::write(m.h("dir/f"), "orig").unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("dir/f"))
        .unwrap();

    m.server().quiesce(Duration::from_secs(5)).unwrap();
    let saved = m.tmp.path().join("saved");
    fs::create_dir(&saved).unwrap();
    m.server().save_journals(&saved).unwrap();
    let copy = m.tmp.path().join("copy");
    let stats = forkvm_volume::copy_tree(&m.root, &copy).unwrap();
    assert_eq!((stats.files, stats.bytes), (1, 4));
    m.restart(&copy.canonicalize().unwrap(), &saved.join("0.journal"));

    f.write_all(b"COPY").unwrap();
    assert_eq!(fs::read_to_string(copy.join("dir/f")).unwrap(), "COPY");
    assert_eq!(fs::read_to_string(m.h("dir/f")).unwrap(), "orig");
}

#[test]
fn quiesce_holds_requests_until_resume() {
    let m = Mount::new(false);
    fs::write(m.h("q"), "q").unwrap();
    assert_eq!(fs::read_to_string(m.p("q")).unwrap(), "q");
    m.server().quiesce(Duration::from_secs(5)).unwrap();
    let p = m.p("q2");
    let t = std::thread::spawn(move || fs::write(p, "later"));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!m.h("q2").exists(), "a quiesced volume must not change");
    assert!(m.relay.held() > 0);
    m.server().resume();
    t.join().unwrap().unwrap();
    assert_eq!(fs::read_to_string(m.h("q2")).unwrap(), "later");
    assert!(!m.server().is_closed());
}

#[test]
fn deleted_while_open_is_estale_after_restore() {
    let mut m = Mount::new(false);
    fs::write(m.h("gone"), "g").unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("gone"))
        .unwrap();
    fs::remove_file(m.p("gone")).unwrap();
    // The same server still has the fd.
    f.write_all(b"1").unwrap();
    m.server().quiesce(Duration::from_secs(5)).unwrap();
    let saved = m.tmp.path().join("saved");
    fs::create_dir(&saved).unwrap();
    m.server().save_journals(&saved).unwrap();
    let root = m.root.clone();
    m.restart(&root, &saved.join("0.journal"));
    let e = f.write_all(b"2").unwrap_err();
    assert_eq!(
        errno_of(&e),
        libc::ESTALE,
        "documented rule: no name, no reopen"
    );
}

/// Many guest workers at once, as in the benchmark (reads, and writes with
/// fsync): everything completes and lands on the host intact.
#[test]
fn parallel_workers() {
    let m = Mount::new(false);
    let files = 1024;
    let workers = 64;
    fs::create_dir(m.h("data")).unwrap();
    for i in 0..files {
        fs::write(m.h(&format!("data/{i}")), vec![(i % 251) as u8; 4096]).unwrap();
    }
    let mnt = m.mnt.clone();
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let mnt = mnt.clone();
            std::thread::spawn(move || {
                for i in (w..files).step_by(workers) {
                    let p = mnt.join(format!("data/{i}"));
                    let got = fs::read(&p).unwrap();
                    assert_eq!(got, vec![(i % 251) as u8; 4096]);
                    let mut f = fs::OpenOptions::new().write(true).open(&p).unwrap();
                    f.write_all(&vec![(i % 13) as u8; 4096]).unwrap();
                    f.sync_all().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..files {
        assert_eq!(
            fs::read(m.h(&format!("data/{i}"))).unwrap(),
            vec![(i % 13) as u8; 4096]
        );
    }
}
