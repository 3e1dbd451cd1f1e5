//! Tests of the tar writer and archive detection.

use super::*;
use std::collections::BTreeMap;
use std::io::Cursor;

fn sha(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn file_entry(dir: &Path, name: &str, data: &[u8], path: &str, mode: u32) -> ArchiveEntry {
    let host = dir.join(name);
    std::fs::write(&host, data).unwrap();
    ArchiveEntry {
        path: path.into(),
        kind: EntryKind::File {
            host,
            mode,
            size: data.len() as u64,
            sha256: sha(data),
        },
        mtime: None,
    }
}

/// (path, type, mode, mtime, uid, content or link target)
type Row = (String, EntryType, u32, u64, u64, Vec<u8>);

fn read_back(bytes: &[u8]) -> Vec<Row> {
    let mut ar = tar::Archive::new(Cursor::new(bytes));
    let mut out = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().to_string_lossy().into_owned();
        let h = e.header().clone();
        let mut data = Vec::new();
        if h.entry_type().is_symlink() || h.entry_type().is_hard_link() {
            data = e
                .link_name()
                .unwrap()
                .unwrap()
                .to_string_lossy()
                .as_bytes()
                .to_vec();
        } else {
            e.read_to_end(&mut data).unwrap();
        }
        out.push((
            path,
            h.entry_type(),
            h.mode().unwrap(),
            h.mtime().unwrap(),
            h.uid().unwrap(),
            data,
        ));
    }
    out
}

/// A small tar: `top/`, `top/f.txt`, `top/l -> f.txt`.
fn sample_tar() -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Directory);
    h.set_mode(0o750);
    h.set_size(0);
    b.append_data(&mut h, "top/", io::empty()).unwrap();
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o600);
    h.set_uid(1000);
    h.set_size(5);
    b.append_data(&mut h, "./top/f.txt", &b"hello"[..]).unwrap();
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "top/l", "f.txt").unwrap();
    b.into_inner().unwrap()
}

#[test]
fn writes_entries_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}/deep.txt", "d".repeat(120));
    let spec = ArchiveSpec {
        entries: vec![
            ArchiveEntry {
                path: "sub".into(),
                kind: EntryKind::Dir { mode: 0o755 },
                mtime: Some(1_700_000_000),
            },
            file_entry(dir.path(), "a", b"alpha", "sub/a.txt", 0o644),
            ArchiveEntry {
                path: "sub/link".into(),
                kind: EntryKind::Symlink {
                    target: "/etc/hosts".into(),
                },
                mtime: None,
            },
            file_entry(dir.path(), "b", b"", "empty", 0o4755),
            file_entry(dir.path(), "c", b"long", &long, 0o600),
        ],
    };
    assert_eq!(spec.summary(), (5, 9));
    let bytes = spec.write_tar(Vec::new()).unwrap();
    let again = spec.write_tar(Vec::new()).unwrap();
    assert_eq!(bytes, again, "same spec, same bytes");
    let rows = read_back(&bytes);
    let m = ARCHIVE_MTIME;
    assert_eq!(
        rows,
        vec![
            (
                "sub".into(),
                EntryType::Directory,
                0o755,
                1_700_000_000,
                0,
                vec![]
            ),
            (
                "sub/a.txt".into(),
                EntryType::Regular,
                0o644,
                m,
                0,
                b"alpha".to_vec()
            ),
            (
                "sub/link".into(),
                EntryType::Symlink,
                0o777,
                m,
                0,
                b"/etc/hosts".to_vec()
            ),
            ("empty".into(), EntryType::Regular, 0o4755, m, 0, vec![]),
            (long, EntryType::Regular, 0o600, m, 0, b"long".to_vec()),
        ]
    );
}

#[test]
fn a_changed_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = file_entry(dir.path(), "a", b"alpha", "a", 0o644);
    let spec = ArchiveSpec { entries: vec![e] };
    // Same size, other content.
    std::fs::write(dir.path().join("a"), b"alphA").unwrap();
    assert!(matches!(
        spec.write_tar(Vec::new()),
        Err(BuildError::Changed { .. })
    ));
    // Shorter.
    std::fs::write(dir.path().join("a"), b"al").unwrap();
    assert!(matches!(
        spec.write_tar(Vec::new()),
        Err(BuildError::Changed { .. })
    ));
    // Longer.
    std::fs::write(dir.path().join("a"), b"alpha and more").unwrap();
    assert!(matches!(
        spec.write_tar(Vec::new()),
        Err(BuildError::Changed { .. })
    ));
    // Gone.
    std::fs::remove_file(dir.path().join("a")).unwrap();
    assert!(matches!(
        spec.write_tar(Vec::new()),
        Err(BuildError::Io { .. })
    ));
}

fn compressed(kind: Compression, data: &[u8]) -> Vec<u8> {
    match kind {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(data).unwrap();
            w.finish().unwrap()
        }
        Compression::Bzip2 => {
            let mut w = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
            w.write_all(data).unwrap();
            w.finish().unwrap()
        }
        Compression::Xz => {
            let mut out = Vec::new();
            lzma_rs::xz_compress(&mut Cursor::new(data), &mut out).unwrap();
            out
        }
    }
}

#[test]
fn detects_and_extracts_every_compression() {
    let dir = tempfile::tempdir().unwrap();
    let tar = sample_tar();
    for kind in [
        Compression::None,
        Compression::Gzip,
        Compression::Bzip2,
        Compression::Xz,
    ] {
        let host = dir.path().join(format!("x.{}", kind.name()));
        let data = compressed(kind, &tar);
        std::fs::write(&host, &data).unwrap();
        assert_eq!(detect_archive(&host).unwrap(), Some(kind), "{kind:?}");
        let spec = ArchiveSpec {
            entries: vec![ArchiveEntry {
                path: "under".into(),
                kind: EntryKind::Extract {
                    host: host.clone(),
                    compression: kind,
                    sha256: sha(&data),
                },
                mtime: None,
            }],
        };
        let rows = read_back(&spec.write_tar(Vec::new()).unwrap());
        let got: BTreeMap<String, (EntryType, u32, u64, Vec<u8>)> = rows
            .into_iter()
            .map(|(p, t, m, _, u, d)| (p, (t, m, u, d)))
            .collect();
        assert_eq!(got.len(), 3, "{kind:?}: {got:?}");
        assert_eq!(got["under/top"].1, 0o750);
        assert_eq!(
            got["under/top/f.txt"],
            (EntryType::Regular, 0o600, 1000, b"hello".to_vec())
        );
        assert_eq!(got["under/top/l"].3, b"f.txt");
    }
}

#[test]
fn non_archives_are_not_detected() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("text", b"just some text\n".repeat(100)),
        ("short", b"x".to_vec()),
        ("empty", Vec::new()),
        ("zeros", vec![0u8; 2048]),
        (
            "gz-not-tar",
            compressed(Compression::Gzip, &b"plain text ".repeat(100)),
        ),
        (
            "xz-not-tar",
            compressed(Compression::Xz, &b"plain text ".repeat(100)),
        ),
        ("corrupt-gz", {
            let mut v = compressed(Compression::Gzip, &sample_tar());
            v.truncate(12);
            v
        }),
        (
            "corrupt-xz",
            vec![0xfd, b'7', b'z', b'X', b'Z', 0, 1, 2, 3, 4],
        ),
        ("bad-checksum", {
            let mut t = sample_tar();
            t[0] ^= 0x20;
            t
        }),
    ];
    for (name, data) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        assert_eq!(detect_archive(&p).unwrap(), None, "{name}");
    }
    assert!(detect_archive(&dir.path().join("missing")).is_err());
}

/// A tar whose single entry is named `name`, written byte by byte so the
/// tar crate's own path checks do not get in the way.
fn raw_tar(name: &str, kind: EntryType, link: &str) -> Vec<u8> {
    let mut h = Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_entry_type(kind);
    h.set_size(0);
    h.set_mode(0o644);
    h.set_cksum();
    let mut v = h.as_bytes().to_vec();
    v.extend([0u8; 1024]);
    v
}

#[test]
fn extraction_refuses_escapes_and_bad_data() {
    let dir = tempfile::tempdir().unwrap();
    let extract = |name: &str, data: &[u8]| {
        let host = dir.path().join(name);
        std::fs::write(&host, data).unwrap();
        ArchiveSpec {
            entries: vec![ArchiveEntry {
                path: String::new(),
                kind: EntryKind::Extract {
                    host,
                    compression: sniff(data),
                    sha256: sha(data),
                },
                mtime: None,
            }],
        }
        .write_tar(Vec::new())
    };
    let e = extract("evil", &raw_tar("../evil", EntryType::Regular, "")).unwrap_err();
    assert!(e.to_string().contains(".."), "{e}");
    let e = extract("hl", &raw_tar("ok", EntryType::Link, "../../etc/passwd")).unwrap_err();
    assert!(e.to_string().contains("hard link"), "{e}");
    // An absolute name is made relative to the destination.
    let rows = read_back(&extract("abs", &raw_tar("/etc/x", EntryType::Regular, "")).unwrap());
    assert_eq!(rows[0].0, "etc/x");
    // A symlink may point anywhere: it is resolved in the guest.
    let rows = read_back(&extract("sl", &raw_tar("s", EntryType::Symlink, "/etc/passwd")).unwrap());
    assert_eq!(rows[0].5, b"/etc/passwd");
    // Truncated compressed data fails while writing.
    let mut gz = compressed(Compression::Gzip, &sample_tar());
    gz.truncate(gz.len() / 2);
    assert!(matches!(
        extract("trunc.gz", &gz),
        Err(BuildError::Archive { .. })
    ));
}
