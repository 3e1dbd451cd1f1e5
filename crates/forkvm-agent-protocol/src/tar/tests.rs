//! Reader, writer and splitter tests, including corrupt archives.

use super::split::{set_checksum, with_size};
use super::*;

fn all(archive: &[u8]) -> Result<Vec<Entry>, TarError> {
    entries(archive).collect()
}

fn meta(mode: u32) -> Meta {
    Meta {
        mode,
        uid: 1000,
        gid: 100,
        mtime: 1_700_000_000,
        dev: (0, 0),
    }
}

/// A raw header block with the given name, type and size, checksummed.
fn raw_header(name: &[u8], typeflag: u8, size: u64, magic: &[u8; 8]) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = typeflag;
    h[257..265].copy_from_slice(magic);
    with_size(&h, size)
}

const USTAR: &[u8; 8] = b"ustar\x0000";
const GNU: &[u8; 8] = b"ustar  \0";

fn push_entry(out: &mut Vec<u8>, h: &[u8; BLOCK], data: &[u8]) {
    out.extend_from_slice(h);
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(BLOCK), 0);
}

#[test]
fn writer_roundtrip_of_every_kind() {
    let long = format!("{}/file.txt", "d".repeat(150));
    let mut w = Writer::new();
    w.dir("app/", &meta(0o755));
    w.file("app/run.sh", &meta(0o4755), b"#!/bin/sh\necho hi\n");
    w.symlink("app/link", "run.sh", &meta(0o777));
    w.hardlink("app/hard", "app/run.sh");
    w.file(
        &long,
        &Meta {
            uid: 5_000_000,
            mtime: -5,
            ..meta(0o600)
        },
        b"x",
    );
    w.symlink("app/far", &"t".repeat(120), &meta(0o777));
    w.entry(
        Kind::CharDev,
        b"dev/null",
        b"",
        &Meta {
            dev: (1, 3),
            ..meta(0o666)
        },
        b"",
    );
    w.entry(Kind::Fifo, b"pipe", b"", &meta(0o600), b"ignored");
    let tar = w.finish();
    let es = all(&tar).unwrap();
    let got: Vec<_> = es
        .iter()
        .map(|e| (e.kind, e.path.as_slice(), e.mode))
        .collect();
    assert_eq!(
        got,
        vec![
            (Kind::Dir, &b"app/"[..], 0o755),
            (Kind::File, b"app/run.sh", 0o4755),
            (Kind::Symlink, b"app/link", 0o777),
            (Kind::HardLink, b"app/hard", 0o644),
            (Kind::File, long.as_bytes(), 0o600),
            (Kind::Symlink, b"app/far", 0o777),
            (Kind::CharDev, b"dev/null", 0o666),
            (Kind::Fifo, b"pipe", 0o600),
        ]
    );
    assert_eq!(es[1].data(&tar), b"#!/bin/sh\necho hi\n");
    assert_eq!(
        (es[1].uid, es[1].gid, es[1].mtime),
        (1000, 100, 1_700_000_000)
    );
    assert_eq!(es[2].link, b"run.sh");
    assert_eq!(es[3].link, b"app/run.sh");
    assert_eq!(
        (es[4].uid, es[4].mtime, es[4].data(&tar)),
        (5_000_000, -5, &b"x"[..])
    );
    assert!(es[4].start < es[4].header, "long path uses a PAX header");
    assert_eq!(es[5].link, "t".repeat(120).as_bytes());
    assert_eq!((es[6].dev_major, es[6].dev_minor), (1, 3));
    assert_eq!(es[7].size, 0, "a fifo has no data");
    // Entries tile the archive.
    for pair in es.windows(2) {
        assert_eq!(pair[0].end, pair[1].start);
    }
}

#[test]
fn gnu_long_names_prefix_and_old_style_dirs() {
    let name = "n".repeat(300);
    let target = "k".repeat(200);
    let mut tar = Vec::new();
    let mut l = name.as_bytes().to_vec();
    l.push(0);
    push_entry(
        &mut tar,
        &raw_header(b"././@LongLink", b'L', l.len() as u64, GNU),
        &l,
    );
    let mut k = target.as_bytes().to_vec();
    k.push(0);
    push_entry(
        &mut tar,
        &raw_header(b"././@LongLink", b'K', k.len() as u64, GNU),
        &k,
    );
    push_entry(&mut tar, &raw_header(b"short", b'2', 0, GNU), b"");
    // ustar prefix field.
    let mut h = raw_header(b"file", b'0', 3, USTAR);
    h[345..352].copy_from_slice(b"pre/fix");
    set_checksum(&mut h);
    push_entry(&mut tar, &h, b"abc");
    // V7: no magic, a directory by its trailing slash, a NUL typeflag.
    push_entry(&mut tar, &raw_header(b"olddir/", b'\0', 0, &[0; 8]), b"");
    // GNU format ignores the prefix area (it holds atime/ctime there).
    let mut h = raw_header(b"gnufile", b'0', 0, GNU);
    h[345..350].copy_from_slice(b"junk!");
    set_checksum(&mut h);
    push_entry(&mut tar, &h, b"");
    let es = all(&tar).unwrap();
    assert_eq!(es.len(), 4);
    assert_eq!(
        (es[0].kind, &es[0].path, &es[0].link),
        (Kind::Symlink, &name.into_bytes(), &target.into_bytes())
    );
    assert_eq!(es[0].start, 0);
    assert_eq!(
        (es[1].path.as_slice(), es[1].data(&tar)),
        (&b"pre/fix/file"[..], &b"abc"[..])
    );
    assert_eq!(
        (es[2].kind, es[2].path.as_slice()),
        (Kind::Dir, &b"olddir/"[..])
    );
    assert_eq!(es[3].path, b"gnufile");
}

#[test]
fn base256_numbers_and_signed_checksums() {
    let mut h = raw_header(b"f", b'0', 0, GNU);
    // uid 2^40 in base-256; mtime -2 as base-256 two's complement.
    h[108..116].copy_from_slice(&[0x80, 0, 1, 0, 0, 0, 0, 0]);
    h[136..148].copy_from_slice(&[0xff; 12]);
    h[147] = 0xfe;
    set_checksum(&mut h);
    let mut tar = h.to_vec();
    let e = &all(&tar).unwrap()[0];
    assert_eq!((e.uid, e.mtime), (1 << 40, -2));
    // A signed checksum (old writers) is accepted too.
    let (_, signed) = checksums(&h);
    tar[148..156].copy_from_slice(format!("{signed:06o}\0 ").as_bytes());
    assert!(all(&tar).is_ok());
    // A negative size is not.
    let mut h = raw_header(b"f", b'0', 0, GNU);
    h[124..136].copy_from_slice(&[0xff; 12]);
    set_checksum(&mut h);
    assert_eq!(
        all(&h).unwrap_err(),
        TarError::BadField {
            offset: 0,
            field: "size"
        }
    );
}

#[test]
fn corrupt_archives_are_errors_not_panics() {
    let mut w = Writer::new();
    w.file("a", &meta(0o644), &[7u8; 1000]);
    w.file("b", &meta(0o644), b"bb");
    let good = w.finish();

    let mut bad = good.clone();
    bad[5] ^= 1;
    assert_eq!(all(&bad).unwrap_err(), TarError::Checksum { offset: 0 });

    // Cut inside the data, inside a header, and inside the padding.
    assert_eq!(
        all(&good[..700]).unwrap_err(),
        TarError::Truncated { offset: 0 }
    );
    assert_eq!(
        all(&good[..1536 + 100]).unwrap_err(),
        TarError::Truncated { offset: 1536 }
    );
    assert_eq!(
        all(&good[..1000 + 512]).unwrap().len(),
        1,
        "missing final padding is fine"
    );
    assert_eq!(
        all(&good[..1536]).unwrap().len(),
        1,
        "no end marker is fine"
    );
    assert!(all(&[]).unwrap().is_empty());

    // A non-octal digit in mode, checksum still right.
    let mut h = raw_header(b"f", b'0', 0, USTAR);
    h[100..108].copy_from_slice(b"0000x44\0");
    set_checksum(&mut h);
    assert_eq!(
        all(&h).unwrap_err(),
        TarError::BadField {
            offset: 0,
            field: "mode"
        }
    );

    for t in [b'S', b'M', b'Z'] {
        let h = raw_header(b"f", t, 0, GNU);
        assert!(matches!(
            all(&h).unwrap_err(),
            TarError::Unsupported { offset: 0, .. }
        ));
    }
    let h = raw_header(b"", b'0', 0, USTAR);
    assert_eq!(all(&h).unwrap_err(), TarError::EmptyName { offset: 0 });

    // An extended header with no entry after it.
    let mut tar = Vec::new();
    push_entry(
        &mut tar,
        &raw_header(b"x", b'x', 11, USTAR),
        b"11 path=ab\n",
    );
    assert!(matches!(all(&tar).unwrap_err(), TarError::Truncated { .. }));
    tar.extend_from_slice(&[0u8; 1024]);
    assert!(matches!(all(&tar).unwrap_err(), TarError::Truncated { .. }));

    // An oversized extended header is refused before it is read.
    let h = raw_header(b"x", b'x', MAX_META + 1, USTAR);
    assert!(matches!(
        all(&h).unwrap_err(),
        TarError::MetaTooLarge { .. }
    ));

    // After an error the iterator stops.
    let mut it = entries(&bad);
    assert!(it.next().unwrap().is_err());
    assert!(it.next().is_none());
}

#[test]
fn malformed_pax_records() {
    for rec in [
        &b"10 path=a\0"[..], // no newline
        b"99 path=ab\n",     // length past the end
        b"x path=ab\n",      // length not a number
        b"9 pathab\n",       // no '='
        b"12 size=1x\n",     // not a number
        b"14 mtime=1.2.3\n", // not a time
        b"nolength",
    ] {
        let mut tar = Vec::new();
        push_entry(
            &mut tar,
            &raw_header(b"x", b'x', rec.len() as u64, USTAR),
            rec,
        );
        push_entry(&mut tar, &raw_header(b"f", b'0', 0, USTAR), b"");
        assert!(
            matches!(all(&tar), Err(TarError::BadPax { .. })),
            "{:?}: {:?}",
            String::from_utf8_lossy(rec),
            all(&tar)
        );
    }
    // Good records, NUL padding, unknown keys and an empty value.
    let mut rec = Vec::new();
    for (k, v) in [
        ("mtime", "-1.25"),
        ("uname", "me"),
        ("path", ""),
        ("gid", "12345"),
    ] {
        split::pax_record(&mut rec, k.as_bytes(), v.as_bytes());
    }
    rec.extend_from_slice(b"\0\0");
    let rec = &rec[..];
    let mut tar = Vec::new();
    push_entry(
        &mut tar,
        &raw_header(b"x", b'x', rec.len() as u64, USTAR),
        rec,
    );
    push_entry(&mut tar, &raw_header(b"f", b'0', 0, USTAR), b"");
    let e = &all(&tar).unwrap()[0];
    assert_eq!(
        (e.path.as_slice(), e.mtime, e.mtime_nsec, e.gid),
        (&b"f"[..], -2, 750_000_000, 12345)
    );
}

#[test]
fn pax_times() {
    assert_eq!(pax_time(b"12"), Some((12, 0)));
    assert_eq!(pax_time(b"12.5"), Some((12, 500_000_000)));
    assert_eq!(pax_time(b"1.1234567891"), Some((1, 123_456_789)));
    assert_eq!(pax_time(b"-3"), Some((-3, 0)));
    assert_eq!(pax_time(b"-0.5"), Some((-1, 500_000_000)));
    for bad in [&b""[..], b".5", b"1.x", b"--1", b"1e3", b"\xff"] {
        assert_eq!(pax_time(bad), None, "{bad:?}");
    }
}

#[test]
fn end_marker_stops_reading() {
    let mut w = Writer::new();
    w.file("a", &meta(0o644), b"a");
    let mut tar = w.finish();
    tar.extend_from_slice(b"trailing garbage after the end marker");
    assert_eq!(all(&tar).unwrap().len(), 1);
}

/// Reassemble the file data the agent would write from a list of parts.
fn replay(archive: &[u8], parts: &[Part]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut files: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for p in parts {
        let bytes = p.payload(archive);
        let es = all(&bytes).unwrap();
        match p.append_at {
            None => files.extend(es.iter().map(|e| (e.path.clone(), e.data(&bytes).to_vec()))),
            Some(off) => {
                assert_eq!(es.len(), 1, "an append part holds one entry");
                let last = files.last_mut().unwrap();
                assert_eq!(last.0, es[0].path);
                assert_eq!(last.1.len() as u64, off);
                last.1.extend_from_slice(es[0].data(&bytes));
            }
        }
    }
    files
}

#[test]
fn split_groups_small_entries_and_pieces_big_files() {
    let big: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let long = format!("{}/big.bin", "p".repeat(120));
    let mut w = Writer::new();
    for i in 0..10 {
        w.file(&format!("small{i}"), &meta(0o644), &[i as u8; 300]);
    }
    w.file(&long, &meta(0o4750), &big);
    w.dir("after/", &meta(0o700));
    w.file("after/x", &meta(0o644), b"x");
    let tar = w.finish();
    let limit = 4000;
    let parts = split(&tar, limit).unwrap();
    assert!(parts.iter().all(|p| p.len() <= limit && !p.is_empty()));
    let appends: Vec<_> = parts.iter().filter_map(|p| p.append_at).collect();
    assert!(appends.len() >= 5, "{appends:?}");
    // Every piece of the big file keeps its long path, mode and mtime.
    for p in parts.iter().filter(|p| p.append_at.is_some()) {
        let bytes = p.payload(&tar);
        let e = &all(&bytes).unwrap()[0];
        assert_eq!(
            (e.path.as_slice(), e.mode, e.mtime),
            (long.as_bytes(), 0o4750, 1_700_000_000)
        );
    }
    let files = replay(&tar, &parts);
    assert_eq!(files.len(), 13);
    assert_eq!(files[10], (long.into_bytes(), big));
    assert_eq!(files[12], (b"after/x".to_vec(), b"x".to_vec()));
    // The ten small entries (1 KiB each) were grouped three to a part.
    assert_eq!(parts.iter().take_while(|p| p.head.is_empty()).count(), 4);

    // A limit that fits everything: one part, borrowed, equal to the entries.
    let parts = split(&tar, 1 << 20).unwrap();
    assert_eq!(parts.len(), 1);
    assert!(matches!(
        parts[0].payload(&tar),
        std::borrow::Cow::Borrowed(_)
    ));
    assert!(split(&Writer::new().finish(), 4096).unwrap().is_empty());
}

#[test]
fn split_drops_a_pax_size_record_from_pieces() {
    // A file whose size comes from PAX (as for files over 8 GiB).
    let data = vec![3u8; 5000];
    let mut rec = Vec::new();
    split::pax_record(&mut rec, b"size", b"5000");
    split::pax_record(&mut rec, b"uname", b"root");
    assert!(rec.starts_with(b"13 size=5000\n14 uname=root\n"));
    let rec = &rec[..];
    let mut tar = Vec::new();
    push_entry(
        &mut tar,
        &raw_header(b"x", b'x', rec.len() as u64, USTAR),
        rec,
    );
    push_entry(&mut tar, &raw_header(b"huge", b'0', 0, USTAR), &data);
    assert_eq!(all(&tar).unwrap()[0].size, 5000);
    let parts = split(&tar, 2048).unwrap();
    // 1 KiB of PAX header and 512 bytes of main header leave 512 bytes of data.
    assert_eq!(parts.len(), 10);
    for p in &parts {
        let bytes = p.payload(&tar);
        assert!(
            !bytes.windows(7).any(|w| w == b" size=5"),
            "size record kept"
        );
        assert!(
            bytes.windows(10).any(|w| w == b"uname=root"),
            "other records dropped"
        );
    }
    assert_eq!(replay(&tar, &parts)[0].1, data);
}

#[test]
fn unsplittable_entries() {
    let mut w = Writer::new();
    w.dir(&"d/".repeat(400), &meta(0o755));
    let tar = w.finish();
    assert!(matches!(
        split(&tar, 1024),
        Err(TarError::Unsplittable {
            offset: 0,
            limit: 1024
        })
    ));
    let mut w = Writer::new();
    w.file("f", &meta(0o644), &[0u8; 4096]);
    assert!(matches!(
        split(w.bytes(), 700),
        Err(TarError::Unsplittable { .. })
    ));
    let mut bad = w.finish();
    bad[0] ^= 1;
    assert!(matches!(
        split(&bad, 1 << 20),
        Err(TarError::Checksum { .. })
    ));
}

/// GNU tar's own archives, in its three formats, when it is installed.
#[test]
fn reads_gnu_tar_output() {
    let Ok(out) = std::process::Command::new("tar").arg("--version").output() else {
        eprintln!("skipped: no tar");
        return;
    };
    if !String::from_utf8_lossy(&out.stdout).contains("GNU tar") {
        eprintln!("skipped: not GNU tar");
        return;
    }
    let dir = std::env::temp_dir().join(format!("forkvm-proto-tar-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let long = "l".repeat(150);
    std::fs::create_dir_all(dir.join("src/sub")).unwrap();
    std::fs::write(dir.join("src/sub").join(&long), b"long name content").unwrap();
    std::os::unix::fs::symlink(&long, dir.join("src/sub/link")).unwrap();
    std::fs::hard_link(dir.join("src/sub").join(&long), dir.join("src/hard")).unwrap();
    for format in ["gnu", "pax", "ustar"] {
        let out = std::process::Command::new("tar")
            .args([
                "-C",
                dir.join("src").to_str().unwrap(),
                "--format",
                format,
                "-cf",
                "-",
                ".",
            ])
            .output()
            .unwrap();
        if format == "ustar" {
            // ustar cannot store a 150-byte file name.
            assert!(!out.status.success() || all(&out.stdout).is_ok());
            continue;
        }
        assert!(
            out.status.success(),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let es = all(&out.stdout).unwrap();
        let find = |suffix: &str| {
            es.iter()
                .find(|e| e.path.ends_with(suffix.as_bytes()))
                .unwrap_or_else(|| panic!("{format}: no {suffix}"))
        };
        let f = find(&long);
        // The first of the two names of the inode is the file, the other the link.
        let (file, link) = if f.kind == Kind::File {
            (f, find("hard"))
        } else {
            (find("hard"), f)
        };
        assert_eq!(file.data(&out.stdout), b"long name content", "{format}");
        assert_eq!(link.kind, Kind::HardLink, "{format}");
        assert!(
            file.path.ends_with(&link.link[link.link.len() - 4..])
                || link.link.ends_with(b"hard")
                || link.link.ends_with(long.as_bytes())
        );
        assert_eq!(find("sub/link").link, long.as_bytes(), "{format}");
        assert_eq!(find("sub/").kind, Kind::Dir, "{format}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
