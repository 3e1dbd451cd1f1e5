//! Extraction into temp dirs: every entry kind, ownership, path safety,
//! replacement rules and split archives.

use super::*;
use crate::files::tests::temp_dir;
use forkvm_agent_protocol::tar::{split, Meta, Writer};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

fn meta(mode: u32, uid: u64, mtime: i64) -> Meta {
    Meta {
        mode,
        uid,
        gid: uid + 1,
        mtime,
        dev: (0, 0),
    }
}

fn put(dest: &Path, archive: &[u8]) -> Result<Summary, ReqError> {
    put_opts(dest, None, None, archive, Path::new("/nonexistent"))
}

fn put_opts(
    dest: &Path,
    owner: Option<&str>,
    append_at: Option<u64>,
    archive: &[u8],
    etc: &Path,
) -> Result<Summary, ReqError> {
    put_archive(
        &Request {
            dest: dest.to_str().unwrap(),
            owner,
            append_at,
            archive,
        },
        etc,
    )
}

fn lmeta(p: PathBuf) -> std::fs::Metadata {
    std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_kind_with_modes_owners_and_times() {
    let root = crate::identity::is_root();
    let d = temp_dir("arch-kinds");
    let dest = d.join("new/dest");
    let mut w = Writer::new();
    w.dir("./", &meta(0o755, 0, 1));
    w.dir("bin/", &meta(0o750, 1000, 1_600_000_000));
    w.file(
        "bin/tool",
        &meta(0o4755, 1000, 1_600_000_001),
        b"#!/bin/sh\n",
    );
    w.file("/abs/file", &meta(0o640, 2000, 1_600_000_002), b"absolute");
    w.symlink("bin/link", "tool", &meta(0o777, 1000, 1_600_000_003));
    w.hardlink("bin/hard", "bin/tool");
    w.entry(
        Kind::Fifo,
        b"pipe",
        b"",
        &meta(0o620, 0, 1_600_000_004),
        b"",
    );
    let tar = w.finish();
    let s = put(&dest, &tar).unwrap();
    assert_eq!(
        s,
        Summary {
            entries: 7,
            bytes: 18
        }
    );

    let m = lmeta(dest.join("bin/tool"));
    assert_eq!(
        std::fs::read(dest.join("bin/tool")).unwrap(),
        b"#!/bin/sh\n"
    );
    assert_eq!(m.permissions().mode() & 0o7777, 0o4755, "setuid kept");
    assert_eq!(m.mtime(), 1_600_000_001);
    assert_eq!(m.nlink(), 2);
    assert_eq!(lmeta(dest.join("bin/hard")).ino(), m.ino());
    assert_eq!(std::fs::read(dest.join("abs/file")).unwrap(), b"absolute");
    assert_eq!(
        std::fs::read_link(dest.join("bin/link")).unwrap(),
        Path::new("tool")
    );
    assert_eq!(lmeta(dest.join("bin/link")).mtime(), 1_600_000_003);
    let dir = lmeta(dest.join("bin"));
    assert_eq!(
        (dir.permissions().mode() & 0o7777, dir.mtime()),
        (0o750, 1_600_000_000)
    );
    let fifo = lmeta(dest.join("pipe"));
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
    assert_eq!(fifo.permissions().mode() & 0o7777, 0o620);
    if root {
        assert_eq!((m.uid(), m.gid()), (1000, 1001), "owner from the header");
        assert_eq!(lmeta(dest.join("abs/file")).uid(), 2000);
        assert_eq!(lmeta(dest.join("bin/link")).uid(), 1000);
        // Created parents (and dest) are root's and 0755.
        let created = lmeta(d.join("new"));
        assert_eq!(
            (created.uid(), created.permissions().mode() & 0o777),
            (0, 0o755)
        );
    }
    // Sending it again replaces everything and changes nothing.
    assert_eq!(put(&dest, &tar).unwrap(), s);
    assert_eq!(lmeta(dest.join("bin/tool")).nlink(), 2);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn owner_overrides_headers_and_owns_created_dirs() {
    if !crate::identity::is_root() {
        eprintln!("skipped: needs root to chown");
        return;
    }
    let d = temp_dir("arch-owner");
    let etc = d.join("etc");
    std::fs::create_dir(&etc).unwrap();
    std::fs::write(etc.join("passwd"), "app:x:3000:3001::/home/app:/bin/sh\n").unwrap();
    let dest = d.join("srv/app");
    let mut w = Writer::new();
    w.file("sub/f", &meta(0o2755, 7, 5), b"x");
    w.symlink("l", "sub/f", &meta(0o777, 7, 5));
    let s = put_opts(&dest, Some("app"), None, &w.finish(), &etc).unwrap();
    assert_eq!(s.entries, 2);
    for p in [
        "srv",
        "srv/app",
        "srv/app/sub",
        "srv/app/sub/f",
        "srv/app/l",
    ] {
        let m = lmeta(d.join(p));
        assert_eq!((m.uid(), m.gid()), (3000, 3001), "{p}");
    }
    assert_eq!(
        lmeta(dest.join("sub/f")).permissions().mode() & 0o7777,
        0o2755,
        "setgid kept after chown"
    );
    let e = put_opts(
        &dest,
        Some("nobody-here"),
        None,
        &Writer::new().finish(),
        &etc,
    )
    .unwrap_err();
    assert_eq!(e.code, ERR_INVALID);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn dot_dot_and_corrupt_archives_write_nothing() {
    let d = temp_dir("arch-dotdot");
    let dest = d.join("dest");
    std::fs::create_dir(&dest).unwrap();
    for bad in ["../escape", "a/../../escape", "a/.."] {
        let mut w = Writer::new();
        w.file("first", &Meta::default(), b"1");
        w.file(bad, &Meta::default(), b"2");
        let e = put(&dest, &w.finish()).unwrap_err();
        assert_eq!(e.code, ERR_INVALID, "{bad}");
        assert!(e.message.contains("'..'"), "{}", e.message);
    }
    let mut w = Writer::new();
    w.file("first", &Meta::default(), b"1");
    w.hardlink("h", "../../etc/passwd");
    assert!(put(&dest, &w.finish())
        .unwrap_err()
        .message
        .contains("'..'"));
    let mut w = Writer::new();
    w.file("first", &Meta::default(), b"1");
    w.file("second", &Meta::default(), b"2");
    let mut tar = w.finish();
    tar[1024] ^= 0x55; // corrupt the second header
    let e = put(&dest, &tar).unwrap_err();
    assert!(e.message.contains("checksum"), "{}", e.message);
    assert_eq!(
        std::fs::read_dir(&dest).unwrap().count(),
        0,
        "nothing was written"
    );
    assert!(!d.join("escape").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn symlinks_are_followed_only_inside_dest() {
    let d = temp_dir("arch-links");
    let dest = d.join("dest");
    let outside = d.join("outside");
    std::fs::create_dir_all(dest.join("usr/lib")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    // Links already in the image: relative and absolute, in and out.
    std::os::unix::fs::symlink("usr/lib", dest.join("lib")).unwrap();
    std::os::unix::fs::symlink(dest.join("usr"), dest.join("absusr")).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("out")).unwrap();
    std::os::unix::fs::symlink("../outside", dest.join("up")).unwrap();
    std::os::unix::fs::symlink("usr/../..", dest.join("sneaky")).unwrap();
    std::os::unix::fs::symlink("loop2", dest.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", dest.join("loop2")).unwrap();

    let one = |path: &str| {
        let mut w = Writer::new();
        w.file(path, &Meta::default(), b"data");
        put(&dest, &w.finish())
    };
    one("lib/x.so").unwrap();
    assert_eq!(std::fs::read(dest.join("usr/lib/x.so")).unwrap(), b"data");
    one("absusr/lib/y.so").unwrap();
    assert!(dest.join("usr/lib/y.so").exists());
    one("lib/new/deeper/z").unwrap();
    assert!(
        dest.join("usr/lib/new/deeper/z").exists(),
        "missing dirs made beyond a link"
    );
    for bad in ["out/x", "up/x", "sneaky/x", "out/new/dir/x"] {
        let e = one(bad).unwrap_err();
        assert_eq!(e.code, ERR_INVALID, "{bad}");
        assert!(e.message.contains("leads out of"), "{bad}: {}", e.message);
    }
    assert!(one("loop1/x")
        .unwrap_err()
        .message
        .contains("too many levels"));
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside"
    );
    assert!(!d.join("x").exists());

    // A link the archive itself makes is no different.
    let mut w = Writer::new();
    w.symlink("evil", "/", &Meta::default());
    w.file("evil/tmp/pwned", &Meta::default(), b"x");
    let e = put(&dest, &w.finish()).unwrap_err();
    assert!(e.message.contains("leads out of"), "{}", e.message);
    assert!(!Path::new("/tmp/pwned").exists());

    // The last component is never followed: a file entry replaces the link.
    one("out").unwrap();
    assert!(lmeta(dest.join("out")).is_file());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn dest_slash_semantics_clamp_dot_dot() {
    // With dest = a dir standing in for "/", `..` above it is an escape;
    // the clamp only applies to the real root, tested by `lexical`.
    assert_eq!(
        lexical(b"/a/../../b/./c"),
        vec![b"b".to_vec(), b"c".to_vec()]
    );
    assert_eq!(lexical(b"/"), Vec::<Vec<u8>>::new());
    assert_eq!(
        components(b"/./a//b/").unwrap(),
        vec![b"a".to_vec(), b"b".to_vec()]
    );
    assert!(components(b"").unwrap().is_empty());
}

#[test]
fn replacement_rules() {
    let d = temp_dir("arch-replace");
    let dest = d.join("dest");
    std::fs::create_dir_all(dest.join("adir/inner")).unwrap();
    std::fs::create_dir_all(dest.join("real")).unwrap();
    std::os::unix::fs::symlink("real", dest.join("dirlink")).unwrap();
    std::fs::write(dest.join("file"), b"old").unwrap();
    std::fs::hard_link(dest.join("file"), dest.join("other")).unwrap();
    std::fs::write(dest.join("was_file"), b"old").unwrap();

    let mut w = Writer::new();
    w.symlink("file", "elsewhere", &Meta::default());
    w.dir("was_file/", &meta(0o711, 0, 9));
    w.dir("dirlink/", &meta(0o700, 0, 9));
    w.file("dirlink/inside", &Meta::default(), b"in");
    put(&dest, &w.finish()).unwrap();
    assert_eq!(
        std::fs::read_link(dest.join("file")).unwrap(),
        Path::new("elsewhere")
    );
    assert_eq!(
        std::fs::read(dest.join("other")).unwrap(),
        b"old",
        "the other link is untouched"
    );
    assert!(lmeta(dest.join("was_file")).is_dir());
    assert!(
        lmeta(dest.join("dirlink")).file_type().is_symlink(),
        "a link to a dir inside is kept"
    );
    assert_eq!(std::fs::read(dest.join("real/inside")).unwrap(), b"in");

    let mut w = Writer::new();
    w.file("adir", &Meta::default(), b"x");
    let e = put(&dest, &w.finish()).unwrap_err();
    assert!(e.message.contains("replace a directory"), "{}", e.message);
    let mut w = Writer::new();
    w.file("other/x", &Meta::default(), b"x");
    let e = put(&dest, &w.finish()).unwrap_err();
    assert_eq!(e.message, "archive entry other/x: other is not a directory");
    // A dangling link inside dest is followed, its target made.
    let mut w = Writer::new();
    w.file("file/x", &Meta::default(), b"x");
    put(&dest, &w.finish()).unwrap();
    assert_eq!(std::fs::read(dest.join("elsewhere/x")).unwrap(), b"x");
    let mut w = Writer::new();
    w.hardlink("h", "no/such/file");
    assert_eq!(put(&dest, &w.finish()).unwrap_err().code, ERR_NOT_FOUND);
    let e = put(&dest.join("other"), &Writer::new().finish()).unwrap_err();
    assert!(e.message.contains("is not a directory"), "{}", e.message);
    let e = put_opts(Path::new("relative"), None, None, &[], Path::new("/")).unwrap_err();
    assert!(e.message.contains("absolute"), "{}", e.message);
    let mut w = Writer::new();
    w.symlink("./", "x", &Meta::default());
    let e = put(&dest, &w.finish()).unwrap_err();
    assert!(
        e.message.contains("names the destination itself"),
        "{}",
        e.message
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn directory_mtimes_survive_their_contents() {
    let d = temp_dir("arch-mtime");
    let mut w = Writer::new();
    w.dir("a/", &meta(0o755, 0, 1_000_000));
    w.dir("a/b/", &meta(0o755, 0, 2_000_000));
    w.file("a/b/f", &meta(0o644, 0, 3_000_000), b"f");
    w.file("a/g", &meta(0o644, 0, 4_000_000), b"g");
    put(&d, &w.finish()).unwrap();
    assert_eq!(lmeta(d.join("a")).mtime(), 1_000_000);
    assert_eq!(lmeta(d.join("a/b")).mtime(), 2_000_000);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn split_archives_reassemble_big_files() {
    let d = temp_dir("arch-split");
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let mut w = Writer::new();
    w.file("small", &Meta::default(), b"s");
    w.file("dir/big.bin", &meta(0o4711, 0, 1_234_567), &big);
    w.file("after", &Meta::default(), b"a");
    let tar = w.finish();
    let parts = split(&tar, 16 * 1024).unwrap();
    assert!(parts.len() > 6);
    let mut total = Summary::default();
    for p in &parts {
        let s = put_opts(&d, None, p.append_at, &p.payload(&tar), Path::new("/")).unwrap();
        total.entries += s.entries;
        total.bytes += s.bytes;
    }
    assert_eq!(total.bytes, big.len() as u64 + 2);
    assert_eq!(std::fs::read(d.join("dir/big.bin")).unwrap(), big);
    let m = lmeta(d.join("dir/big.bin"));
    assert_eq!(
        (m.permissions().mode() & 0o7777, m.mtime()),
        (0o4711, 1_234_567)
    );
    assert_eq!(std::fs::read(d.join("after")).unwrap(), b"a");

    // Out of order, or an append part that is not one file: refused.
    let piece = parts.iter().find(|p| p.append_at.is_some()).unwrap();
    let e = put_opts(&d, None, Some(5), &piece.payload(&tar), Path::new("/")).unwrap_err();
    assert!(e.message.contains("out of order"), "{}", e.message);
    let e = put_opts(&d, None, Some(0), &tar, Path::new("/")).unwrap_err();
    assert!(
        e.message.contains("exactly one regular file"),
        "{}",
        e.message
    );
    std::os::unix::fs::symlink("after", d.join("lnk")).unwrap();
    let mut w = Writer::new();
    w.file("lnk", &Meta::default(), b"x");
    let e = put_opts(&d, None, Some(1), &w.finish(), Path::new("/")).unwrap_err();
    assert_eq!(e.code, ERR_IO, "{}", e.message);
    assert_eq!(
        std::fs::read(d.join("after")).unwrap(),
        b"a",
        "not written through the link"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn devices_need_root() {
    if !crate::identity::is_root() {
        eprintln!("skipped: mknod of a device needs root");
        return;
    }
    let d = temp_dir("arch-dev");
    let mut w = Writer::new();
    w.entry(
        Kind::CharDev,
        b"null",
        b"",
        &Meta {
            mode: 0o666,
            dev: (1, 3),
            ..Meta::default()
        },
        b"",
    );
    match put(&d, &w.finish()) {
        Ok(_) => {
            let m = lmeta(d.join("null"));
            assert_eq!(m.rdev(), libc::makedev(1, 3));
            assert_eq!(m.permissions().mode() & 0o7777, 0o666);
        }
        // Some test sandboxes forbid device nodes altogether.
        Err(e) => assert!(
            e.message.contains("Operation not permitted"),
            "{}",
            e.message
        ),
    }
    std::fs::remove_dir_all(&d).unwrap();
}
