//! Hostile archives, made header by header (every header kind a guest
//! could use to sneak a name past a check), through [`normalise`].

use super::*;
use forkvm_agent_protocol::tar::{Entry, BLOCK};

/// One header block: `magic` is `ustar\0` + `00` (POSIX) or `ustar  \0`
/// (GNU); `prefix` only means something with POSIX magic.
fn header(
    name: &[u8],
    prefix: &[u8],
    typeflag: u8,
    size: usize,
    link: &[u8],
    gnu: bool,
) -> Vec<u8> {
    let mut h = vec![0u8; BLOCK];
    h[..name.len()].copy_from_slice(name);
    h[100..108].copy_from_slice(b"0004755\0");
    h[108..116].copy_from_slice(b"0001750\0");
    h[116..124].copy_from_slice(b"0001750\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"14000000000\0");
    h[156] = typeflag;
    h[157..157 + link.len()].copy_from_slice(link);
    if gnu {
        h[257..265].copy_from_slice(b"ustar  \0");
    } else {
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
    }
    h[345..345 + prefix.len()].copy_from_slice(prefix);
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn padded(mut data: Vec<u8>) -> Vec<u8> {
    data.resize(data.len().div_ceil(BLOCK) * BLOCK, 0);
    data
}

/// A regular file member.
fn file(name: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = header(name, b"", b'0', data.len(), b"", false);
    v.extend(padded(data.to_vec()));
    v
}

fn of_kind(name: &[u8], typeflag: u8, link: &[u8]) -> Vec<u8> {
    header(name, b"", typeflag, 0, link, false)
}

/// A PAX extended header with these records, for the next member.
fn pax(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in records {
        // "<len> <key>=<value>\n", the length counting itself.
        let rest = k.len() + v.len() + 3;
        let mut len = rest + 1;
        while len.to_string().len() + rest != len {
            len += 1;
        }
        body.extend_from_slice(format!("{len} {k}=").as_bytes());
        body.extend_from_slice(v);
        body.push(b'\n');
    }
    let mut v = header(b"PaxHeaders/x", b"", b'x', body.len(), b"", false);
    v.extend(padded(body));
    v
}

/// A GNU long name (`L`) or long link (`K`) for the next member.
fn gnu_long(typeflag: u8, value: &[u8]) -> Vec<u8> {
    let mut body = value.to_vec();
    body.push(0);
    let mut v = header(b"././@LongLink", b"", typeflag, body.len(), b"", true);
    v.extend(padded(body));
    v
}

fn archive(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut v = parts.concat();
    v.extend_from_slice(&[0u8; 2 * BLOCK]);
    v
}

fn read(tar: &[u8]) -> Vec<Entry> {
    entries(tar).collect::<Result<Vec<_>, _>>().unwrap()
}

fn names(tar: &[u8]) -> Vec<String> {
    read(tar)
        .iter()
        .map(|e| String::from_utf8_lossy(&e.path).into_owned())
        .collect()
}

/// Every member of an output: relative, clean, no `..`, no NUL.
fn assert_clean(tar: &[u8]) {
    for e in read(tar) {
        assert_eq!(clean_name(&e.path).as_deref(), Some(&e.path[..]), "{e:?}");
        assert!(matches!(e.kind, Kind::File | Kind::Dir | Kind::Symlink));
        assert_eq!(e.mode & 0o6000, 0, "set-id bits kept: {e:?}");
    }
}

#[test]
fn a_normal_tree_passes_unchanged() {
    let mut w = Writer::new();
    let m = Meta {
        mode: 0o755,
        uid: 1000,
        gid: 1000,
        mtime: 1_700_000_000,
        dev: (0, 0),
    };
    let long = format!("tmp/out/{}/file.txt", "d".repeat(120));
    w.dir("tmp/out", &m);
    w.file("tmp/out/a.txt", &m, b"hello");
    w.symlink("tmp/out/link", "a.txt", &m);
    w.symlink("tmp/out/abs", "/usr/share/zoneinfo/UTC", &m);
    w.file(&long, &m, &[7u8; 1000]);
    let src = w.finish();
    let out = normalise(&src).unwrap();
    assert!(out.dropped.is_empty(), "{:?}", out.dropped);
    let (a, b) = (read(&src), read(&out.tar));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.kind, &x.path, &x.link, x.mode, x.uid, x.mtime),
            (y.kind, &y.path, &y.link, y.mode, y.uid, y.mtime)
        );
        assert_eq!(x.data(&src), y.data(&out.tar));
    }
    assert_clean(&out.tar);
}

#[test]
fn ustar_names_are_made_relative_or_dropped() {
    let src = archive(&[
        file(b"../../etc/passwd", b"x"),
        file(b"/etc/cron.d/evil", b"x"),
        file(b"./a/./b//c", b"x"),
        file(b"a/b/../../../up", b"x"),
        file(b"..", b"x"),
        file(b"/", b""),
        file(b"d/", b""),
        // POSIX prefix field: the name is prefix + "/" + name.
        {
            let mut v = header(b"x", b"../..", b'0', 1, b"", false);
            v.extend(padded(b"x".to_vec()));
            v
        },
        {
            let mut v = header(b"shadow", b"/etc", b'0', 1, b"", false);
            v.extend(padded(b"x".to_vec()));
            v
        },
    ]);
    let out = normalise(&src).unwrap();
    assert_eq!(
        names(&out.tar),
        ["etc/cron.d/evil", "a/b/c", "d", "etc/shadow"]
    );
    assert_eq!(read(&out.tar)[2].kind, Kind::Dir);
    assert_eq!(out.dropped.len(), 5, "{:?}", out.dropped);
    assert_clean(&out.tar);
}

#[test]
fn pax_path_records_cannot_sneak_dotdot_past() {
    let src = archive(&[
        // The ustar name looks harmless; PAX overrides it.
        pax(&[("path", b"../../../root/.ssh/authorized_keys")]),
        file(b"harmless", b"key"),
        pax(&[("path", b"/abs/olute")]),
        file(b"harmless2", b"x"),
        pax(&[("path", b"nul\0/../../x")]),
        file(b"harmless3", b"x"),
        pax(&[("path", b"fine/name"), ("mtime", b"1700000000.5")]),
        file(b"ignored", b"ok"),
    ]);
    let out = normalise(&src).unwrap();
    assert_eq!(names(&out.tar), ["abs/olute", "fine/name"]);
    assert_eq!(out.dropped.len(), 2);
    assert_eq!(read(&out.tar)[1].data(&out.tar), b"ok");
    assert_clean(&out.tar);
}

#[test]
fn gnu_long_names_cannot_sneak_dotdot_past() {
    let deep = format!("{}/../../../../../../../../etc/passwd", "a/".repeat(60));
    let ok = format!("{}/end", "b".repeat(150));
    let src = archive(&[
        gnu_long(b'L', deep.as_bytes()),
        file(b"short", b"x"),
        gnu_long(b'L', ok.as_bytes()),
        file(b"short2", b"y"),
        // A long link target on a symlink is kept as the guest's content.
        gnu_long(b'K', format!("/{}", "t".repeat(200)).as_bytes()),
        of_kind(b"lnk", b'2', b"short-target"),
    ]);
    let out = normalise(&src).unwrap();
    assert_eq!(names(&out.tar), [ok.clone(), "lnk".to_string()]);
    let e = read(&out.tar);
    assert_eq!(e[1].link.len(), 201);
    assert_eq!(out.dropped.len(), 1);
    assert_clean(&out.tar);
}

#[test]
fn nothing_is_written_through_a_symlink_of_the_archive() {
    let src = archive(&[
        of_kind(b"a", b'2', b"/etc"),
        file(b"a/passwd", b"root::0:0::/:/bin/sh"),
        // The same name again: Python's tarfile would open it through the
        // link.
        file(b"a", b"x"),
        of_kind(b"a", b'5', b""),
        of_kind(b"up", b'2', b"../../.."),
        of_kind(b"up/x", b'5', b""),
        // A name that only starts like the link is not below it.
        file(b"ab", b"fine"),
    ]);
    let out = normalise(&src).unwrap();
    assert_eq!(names(&out.tar), ["a", "up", "ab"]);
    assert_eq!(read(&out.tar)[0].link, b"/etc");
    assert_eq!(out.dropped.len(), 4, "{:?}", out.dropped);
    assert_clean(&out.tar);
}

#[test]
fn hard_links_devices_and_fifos_are_dropped() {
    let src = archive(&[
        of_kind(b"h", b'1', b"/etc/shadow"),
        of_kind(b"h2", b'1', b"kept-file"),
        of_kind(b"dev/sda", b'4', b""),
        of_kind(b"mem", b'3', b""),
        of_kind(b"fifo", b'6', b""),
        of_kind(b"empty-link", b'2', b""),
        file(b"kept-file", b"x"),
    ]);
    let out = normalise(&src).unwrap();
    assert_eq!(names(&out.tar), ["kept-file"]);
    assert_eq!(out.dropped.len(), 6);
    assert_clean(&out.tar);
}

#[test]
fn set_id_bits_are_stripped_and_junk_is_an_error() {
    // `header` writes mode 04755.
    let out = normalise(&archive(&[file(b"suid", b"x")])).unwrap();
    assert_eq!(read(&out.tar)[0].mode, 0o755);
    let mut bad = archive(&[file(b"f", b"x")]);
    bad[0] ^= 1;
    assert!(normalise(&bad).is_err());
    // An empty archive stays an empty archive.
    let out = normalise(&[0u8; 1024]).unwrap();
    assert!(read(&out.tar).is_empty());
}

#[test]
fn clean_names() {
    for (raw, want) in [
        (&b"a/b"[..], Some(&b"a/b"[..])),
        (b"/a//b/", Some(b"a/b")),
        (b"./.", None),
        (b"a/..", None),
        (b"..a/b..", Some(b"..a/b..")),
        (b"a\0b", None),
    ] {
        assert_eq!(clean_name(raw).as_deref(), want, "{raw:?}");
    }
}
