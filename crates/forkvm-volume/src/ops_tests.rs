//! One test per opcode against a volume in a temp dir, by raw bytes, plus
//! malformed requests.

use super::*;
use crate::VolumeConfig;
use std::fs;
use std::os::unix::fs::MetadataExt;

struct T {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    vol: Volume,
    unique: std::cell::Cell<u64>,
}

fn setup(read_only: bool) -> T {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("vol");
    fs::create_dir(&root).unwrap();
    let vol = Volume::open(
        VolumeConfig {
            index: 0,
            root: root.clone(),
            read_only,
            journal: tmp.path().join("j"),
            host_owner: (0, 0),
            guest_owner: (1000, 1000),
        },
        "unit".into(),
    )
    .unwrap();
    T {
        _tmp: tmp,
        root,
        vol,
        unique: std::cell::Cell::new(1),
    }
}

impl T {
    /// Sends one request; returns (errno, body).
    fn call(&self, opcode: u32, node: u64, args: &[u8]) -> (i32, Vec<u8>) {
        let u = self.unique.get();
        self.unique.set(u + 1);
        let mut r = Vec::new();
        r.extend_from_slice(&((40 + args.len()) as u32).to_le_bytes());
        r.extend_from_slice(&opcode.to_le_bytes());
        r.extend_from_slice(&u.to_le_bytes());
        r.extend_from_slice(&node.to_le_bytes());
        r.extend_from_slice(&[0u8; 16]);
        r.extend_from_slice(args);
        let out = handle(&self.vol, &r).expect("a reply");
        assert_eq!(rd_u32(&out, 0).unwrap() as usize, out.len());
        assert_eq!(rd_u64(&out, 8).unwrap(), u);
        (-(rd_u32(&out, 4).unwrap() as i32), out[16..].to_vec())
    }

    fn ok(&self, opcode: u32, node: u64, args: &[u8]) -> Vec<u8> {
        let (e, b) = self.call(opcode, node, args);
        assert_eq!(e, 0, "opcode {opcode}");
        b
    }

    fn lookup(&self, parent: u64, name: &str) -> u64 {
        rd_u64(&self.ok(op::LOOKUP, parent, &z(name)), 0).unwrap()
    }

    fn open(&self, node: u64, flags: i32) -> u64 {
        let mut a = Body::default();
        a.u32(flags as u32).u32(0);
        rd_u64(&self.ok(op::OPEN, node, &a.0), 0).unwrap()
    }
}

fn z(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn io_args(fh: u64, off: u64, size: u32) -> Vec<u8> {
    let mut a = Body::default();
    a.u64(fh).u64(off).u32(size).u32(0).u64(0).u32(0).u32(0);
    a.0
}

#[test]
fn init_negotiates_and_is_journaled() {
    let t = setup(false);
    let mut a = Body::default();
    a.u32(7)
        .u32(41)
        .u32(65536)
        .u32(abi::FUSE_AUTO_INVAL_DATA | (1 << 16) | abi::FUSE_MAX_PAGES);
    let b = t.ok(op::INIT, 0, &a.0);
    assert_eq!(b.len(), 64);
    assert_eq!(rd_u32(&b, 4), Some(abi::OUR_MINOR));
    // Auto-inval and max_pages accepted, writeback cache (1 << 16) refused.
    assert_eq!(
        rd_u32(&b, 12),
        Some(abi::FUSE_AUTO_INVAL_DATA | abi::FUSE_MAX_PAGES)
    );
    assert_eq!(rd_u32(&b, 20), Some(abi::MAX_WRITE));
    assert_eq!(t.vol.init_params().unwrap().minor, abi::OUR_MINOR);
    let mut old = Body::default();
    old.u32(7).u32(12).u32(0).u32(0);
    assert_eq!(t.call(op::INIT, 0, &old.0).0, libc::EPROTO);
}

#[test]
fn lookup_getattr_forget() {
    let t = setup(false);
    fs::write(t.root.join("f"), "12345").unwrap();
    let n = t.lookup(ROOT, "f");
    assert_eq!(t.lookup(ROOT, "f"), n, "same file, same nodeid");
    let b = t.ok(op::GETATTR, n, &[0u8; 16]);
    assert_eq!(rd_u64(&b, 16 + 8), Some(5), "size");
    assert_eq!(rd_u32(&b, 16 + 68), Some(1000), "uid shows guest_owner");
    // A missing name is a negative entry (node id 0) the guest may cache.
    let (e, b) = t.call(op::LOOKUP, ROOT, &z("nope"));
    assert_eq!((e, rd_u64(&b, 0)), (0, Some(0)), "negative entry");
    assert_eq!(
        rd_u64(&b, 16),
        Some(abi::TIMEOUT_SECS),
        "cached for the timeout"
    );
    for bad in ["..", ".", "a/b", ""] {
        assert_eq!(t.call(op::LOOKUP, ROOT, &z(bad)).0, libc::EINVAL, "{bad}");
    }
    assert_eq!(t.call(op::LOOKUP, ROOT, b"noterminator").0, libc::EINVAL);
    // The file changed under the name: a new nodeid.
    fs::remove_file(t.root.join("f")).unwrap();
    fs::write(t.root.join("f"), "x").unwrap();
    let n2 = t.lookup(ROOT, "f");
    assert_ne!(n2, n);
    // FORGET and BATCH_FORGET take no reply and drop the node at zero.
    let mut r = vec![0u8; 48];
    r[0..4].copy_from_slice(&48u32.to_le_bytes());
    r[4..8].copy_from_slice(&op::FORGET.to_le_bytes());
    r[16..24].copy_from_slice(&n2.to_le_bytes());
    r[40..48].copy_from_slice(&1u64.to_le_bytes());
    assert!(handle(&t.vol, &r).is_none());
    assert!(!t.vol.with_table(|x| x.0.nodes.contains_key(&n2)));
    let mut batch = Body::default();
    batch.u32(1).u32(0).u64(n).u64(2);
    let mut r = vec![0u8; 40];
    r[0..4].copy_from_slice(&((40 + batch.0.len()) as u32).to_le_bytes());
    r[4..8].copy_from_slice(&op::BATCH_FORGET.to_le_bytes());
    r.extend_from_slice(&batch.0);
    assert!(handle(&t.vol, &r).is_none());
    assert!(!t.vol.with_table(|x| x.0.nodes.contains_key(&n)));
}

#[test]
fn malformed_requests() {
    let t = setup(false);
    // Shorter than a header, or len disagreeing: no reply at all.
    assert!(handle(&t.vol, &[0u8; 10]).is_none());
    let mut r = vec![0u8; 40];
    r[0..4].copy_from_slice(&99u32.to_le_bytes());
    assert!(handle(&t.vol, &r).is_none());
    // Truncated arguments: EINVAL.
    assert_eq!(t.call(op::READ, ROOT, &[0u8; 4]).0, libc::EINVAL);
    assert_eq!(t.call(op::SETATTR, ROOT, &[0u8; 4]).0, libc::EINVAL);
    assert_eq!(t.call(op::MKDIR, ROOT, &[0u8; 2]).0, libc::EINVAL);
    // Unknown opcodes and unsupported ones: ENOSYS.
    assert_eq!(t.call(9999, ROOT, &[]).0, libc::ENOSYS);
    assert_eq!(t.call(op::ACCESS, ROOT, &[0u8; 8]).0, libc::ENOSYS);
    // INTERRUPT: no reply.
    let mut r = vec![0u8; 48];
    r[0..4].copy_from_slice(&48u32.to_le_bytes());
    r[4..8].copy_from_slice(&op::INTERRUPT.to_le_bytes());
    assert!(handle(&t.vol, &r).is_none());
    // A stale nodeid.
    assert_eq!(t.call(op::GETATTR, 12345, &[0u8; 16]).0, libc::ESTALE);
    // A forged fh that does not decode to itself.
    assert_eq!(
        t.call(op::READ, ROOT, &io_args(2 << 8 | 0x43, 0, 1)).0,
        libc::EBADF
    );
}

#[test]
fn create_write_read_fsync_flush_release_lseek_fallocate() {
    let t = setup(false);
    let mut a = Body::default();
    a.u32((libc::O_RDWR | libc::O_CREAT) as u32)
        .u32(0o4644)
        .u32(0o022)
        .u32(0);
    let b = t.ok(op::CREATE, ROOT, &cat(&[&a.0, &z("new")]));
    let (node, fh) = (rd_u64(&b, 0).unwrap(), rd_u64(&b, 128).unwrap());
    assert_eq!(fh >> 8, node);
    assert_eq!(
        fs::metadata(t.root.join("new")).unwrap().mode() & 0o7777,
        0o644
    );
    let mut w = io_args(fh, 0, 5);
    w.extend_from_slice(b"hello");
    assert_eq!(rd_u32(&t.ok(op::WRITE, node, &w), 0), Some(5));
    assert_eq!(t.ok(op::READ, node, &io_args(fh, 1, 100)), b"ello");
    t.ok(
        op::FSYNC,
        node,
        &[&fh.to_le_bytes()[..], &[1, 0, 0, 0, 0, 0, 0, 0]].concat(),
    );
    let (e, _) = t.call(
        op::FLUSH,
        node,
        &[&fh.to_le_bytes()[..], &[0u8; 16]].concat(),
    );
    assert_eq!(e, libc::ENOSYS, "FLUSH: the kernel is told not to send it");
    let mut f = Body::default();
    f.u64(fh).u64(0).u64(8192).u32(0).u32(0);
    t.ok(op::FALLOCATE, node, &f.0);
    assert_eq!(fs::metadata(t.root.join("new")).unwrap().len(), 8192);
    let mut s = Body::default();
    s.u64(fh).u64(0).u32(libc::SEEK_END as u32).u32(0);
    assert_eq!(rd_u64(&t.ok(op::LSEEK, node, &s.0), 0), Some(8192));
    let mut rel = Body::default();
    rel.u64(fh).u32(0).u32(0).u64(0);
    t.ok(op::RELEASE, node, &rel.0);
    // A released (or never seen) handle is reopened lazily by path.
    assert_eq!(t.ok(op::READ, node, &io_args(fh, 0, 5)), b"hello");
    // OPEN of an existing file; a second open shares the fh.
    let fh2 = t.open(node, libc::O_RDONLY);
    assert_eq!(t.open(node, libc::O_RDONLY), fh2);
}

#[test]
fn setattr_truncates_chmods_and_ignores_chown() {
    let t = setup(false);
    fs::write(t.root.join("f"), "123456").unwrap();
    let n = t.lookup(ROOT, "f");
    let mut a = Body::default();
    let valid = abi::FATTR_SIZE | abi::FATTR_MODE | abi::FATTR_UID | abi::FATTR_MTIME;
    a.u32(valid)
        .u32(0)
        .u64(0)
        .u64(2)
        .u64(0)
        .u64(0)
        .u64(1_000_000)
        .u64(0);
    a.u32(0)
        .u32(0)
        .u32(0)
        .u32(0o6755)
        .u32(0)
        .u32(77)
        .u32(77)
        .u32(0);
    assert_eq!(a.0.len(), 88);
    let b = t.ok(op::SETATTR, n, &a.0);
    assert_eq!(rd_u64(&b, 16 + 8), Some(2));
    let m = fs::metadata(t.root.join("f")).unwrap();
    assert_eq!(
        (m.len(), m.mode() & 0o7777, m.mtime()),
        (2, 0o755, 1_000_000)
    );
    assert_eq!(m.uid(), 0, "chown is a no-op");
}

#[test]
fn mkdir_mknod_symlink_readlink_link() {
    let t = setup(false);
    let mut a = Body::default();
    a.u32(0o2755).u32(0);
    let d = rd_u64(&t.ok(op::MKDIR, ROOT, &cat(&[&a.0, &z("d")])), 0).unwrap();
    assert_eq!(
        fs::metadata(t.root.join("d")).unwrap().mode() & 0o7777,
        0o755
    );
    let mut m = Body::default();
    m.u32(libc::S_IFREG | 0o644).u32(0).u32(0).u32(0);
    t.ok(op::MKNOD, d, &cat(&[&m.0, &z("r")]));
    assert!(t.root.join("d/r").is_file());
    let mut fifo = Body::default();
    fifo.u32(libc::S_IFIFO | 0o644).u32(0).u32(0).u32(0);
    assert_eq!(
        t.call(op::MKNOD, d, &cat(&[&fifo.0, &z("p")])).0,
        libc::EPERM
    );
    let l = rd_u64(&t.ok(op::SYMLINK, d, &cat(&[&z("l"), &z("../d/r")])), 0).unwrap();
    assert_eq!(t.ok(op::READLINK, l, &[]), b"../d/r");
    for bad in ["/etc/passwd", "../../x", "../.."] {
        assert_eq!(
            t.call(op::SYMLINK, d, &cat(&[&z("b"), &z(bad)])).0,
            libc::EPERM
        );
    }
    let r = t.lookup(d, "r");
    assert_eq!(
        t.call(op::LINK, d, &cat(&[&r.to_le_bytes(), &z("h")])).0,
        libc::EPERM
    );
}

#[test]
fn open_refuses_specials_and_multi_link_files() {
    let t = setup(false);
    fs::write(t.root.join("a"), "a").unwrap();
    fs::hard_link(t.root.join("a"), t.root.join("b")).unwrap();
    let a = t.lookup(ROOT, "a");
    let mut o = Body::default();
    o.u32(0).u32(0);
    assert_eq!(t.call(op::OPEN, a, &o.0).0, libc::EPERM);
    let c =
        std::ffi::CString::new(t.root.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let f = t.lookup(ROOT, "fifo");
    assert_eq!(t.call(op::OPEN, f, &o.0).0, libc::EACCES);
    std::os::unix::fs::symlink("/etc/passwd", t.root.join("s")).unwrap();
    let s = t.lookup(ROOT, "s");
    assert_eq!(t.call(op::OPEN, s, &o.0).0, libc::EACCES);
}

#[test]
fn unlink_rmdir_rename_rename2() {
    let t = setup(false);
    fs::create_dir(t.root.join("d")).unwrap();
    fs::write(t.root.join("f"), "f").unwrap();
    let d = t.lookup(ROOT, "d");
    let f = t.lookup(ROOT, "f");
    let mut r = Body::default();
    r.u64(d);
    t.ok(op::RENAME, ROOT, &cat(&[&r.0, &z("f"), &z("g")]));
    assert!(t.root.join("d/g").exists());
    assert_eq!(
        t.vol.with_table(|x| x.0.path(f)).unwrap(),
        std::path::Path::new("d/g")
    );
    fs::write(t.root.join("h"), "h").unwrap();
    let mut r2 = Body::default();
    r2.u64(d).u32(libc::RENAME_NOREPLACE).u32(0);
    assert_eq!(
        t.call(op::RENAME2, ROOT, &cat(&[&r2.0, &z("h"), &z("g")]))
            .0,
        libc::EEXIST
    );
    let mut ex = Body::default();
    ex.u64(d).u32(libc::RENAME_EXCHANGE).u32(0);
    assert_eq!(
        t.call(op::RENAME2, ROOT, &cat(&[&ex.0, &z("h"), &z("g")]))
            .0,
        libc::EINVAL
    );
    assert_eq!(t.call(op::RMDIR, ROOT, &z("d")).0, libc::ENOTEMPTY);
    t.ok(op::UNLINK, d, &z("g"));
    assert!(t.vol.with_table(|x| x.0.path(f)).is_none());
    t.ok(op::RMDIR, ROOT, &z("d"));
    assert!(!t.root.join("d").exists());
}

#[test]
fn opendir_readdir_releasedir_statfs() {
    let t = setup(false);
    for i in 0..50 {
        fs::write(t.root.join(format!("file-{i:02}")), "").unwrap();
    }
    let mut o = Body::default();
    o.u32(0).u32(0);
    let fh = rd_u64(&t.ok(op::OPENDIR, ROOT, &o.0), 0).unwrap();
    // Small buffers force several READDIRs that resume at d_off.
    let mut names = Vec::new();
    let mut off = 0;
    loop {
        let b = t.ok(op::READDIR, ROOT, &io_args(fh, off, 200));
        if b.is_empty() {
            break;
        }
        let mut at = 0;
        while at < b.len() {
            off = rd_u64(&b, at + 8).unwrap();
            let len = rd_u32(&b, at + 16).unwrap() as usize;
            names.push(String::from_utf8(b[at + 24..at + 24 + len].to_vec()).unwrap());
            at += (24 + len + 7) & !7;
        }
    }
    names.sort();
    assert_eq!(names.len(), 52);
    assert_eq!(names[0], ".");
    assert_eq!(names[51], "file-49");
    let mut rel = Body::default();
    rel.u64(fh).u32(0).u32(0).u64(0);
    t.ok(op::RELEASEDIR, ROOT, &rel.0);
    t.ok(
        op::FSYNCDIR,
        ROOT,
        &[&fh.to_le_bytes()[..], &[0u8; 8]].concat(),
    );
    assert_eq!(t.ok(op::STATFS, ROOT, &[]).len(), 80);
    t.ok(op::DESTROY, ROOT, &[]);
}

#[test]
fn read_only_answers_erofs() {
    let t = setup(true);
    fs::write(t.root.join("f"), "f").unwrap();
    let n = t.lookup(ROOT, "f");
    let mut o = Body::default();
    o.u32(libc::O_WRONLY as u32).u32(0);
    assert_eq!(t.call(op::OPEN, n, &o.0).0, libc::EROFS);
    let mut m = Body::default();
    m.u32(0o755).u32(0);
    assert_eq!(
        t.call(op::MKDIR, ROOT, &cat(&[&m.0, &z("d")])).0,
        libc::EROFS
    );
    assert_eq!(t.call(op::UNLINK, ROOT, &z("f")).0, libc::EROFS);
    let fh = t.open(n, libc::O_RDONLY);
    let mut w = io_args(fh, 0, 1);
    w.push(b'x');
    assert_eq!(t.call(op::WRITE, n, &w).0, libc::EROFS);
    assert_eq!(fs::read_to_string(t.root.join("f")).unwrap(), "f");
}

/// A new server instance (empty fd cache) resolves every node from the
/// root with openat2: a directory swapped on the host for a symlink to the
/// outside is refused, never followed.
#[test]
fn restored_server_never_follows_a_swapped_directory() {
    let t = setup(false);
    let outside = t._tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("f"), "MARKER").unwrap();
    fs::create_dir(t.root.join("d")).unwrap();
    fs::write(t.root.join("d/f"), "inside").unwrap();
    let d = t.lookup(ROOT, "d");
    let f = t.lookup(d, "f");
    fs::rename(t.root.join("d"), t.root.join("d_old")).unwrap();
    std::os::unix::fs::symlink(&outside, t.root.join("d")).unwrap();

    let t2 = T {
        vol: Volume::open(t.vol.cfg.clone(), "unit-2".into()).unwrap(),
        root: t.root.clone(),
        unique: std::cell::Cell::new(1),
        _tmp: tempfile::tempdir().unwrap(),
    };
    let mut o = Body::default();
    o.u32(0).u32(0);
    assert_eq!(t2.call(op::OPEN, f, &o.0).0, libc::ELOOP);
    assert_eq!(
        t2.call(op::GETATTR, d, &[0u8; 16]).0,
        0,
        "d itself is the symlink"
    );
    // d's fd is the symlink itself, which is no directory to look in.
    assert_eq!(t2.call(op::LOOKUP, d, &z("f")).0, libc::ENOTDIR);
    // A forged handle for the node is refused the same way.
    let fh = crate::security::fh_encode(f, libc::O_RDONLY);
    assert_eq!(t2.call(op::READ, f, &io_args(fh, 0, 10)).0, libc::ELOOP);
}

/// Repeated lookups grow the journal; it compacts itself and still
/// replays to the same lookup counts.
#[test]
fn journal_compacts_itself() {
    let t = setup(false);
    fs::write(t.root.join("a-file-with-a-long-name"), "").unwrap();
    let mut n = 0;
    for _ in 0..2000 {
        n = t.lookup(ROOT, "a-file-with-a-long-name");
    }
    let size = fs::metadata(&t.vol.cfg.journal).unwrap().len();
    assert!(size < 4096 * 4, "journal is {size} bytes");
    let (_, recs) = crate::journal::Journal::open(&t.vol.cfg.journal).unwrap();
    let table = crate::table::Table::replay(&recs);
    assert_eq!(table.nodes[&n].lookups, 2000);
}

/// An open file whose name is gone still answers fstat and I/O on the
/// same server.
#[test]
fn unlinked_open_file_keeps_working() {
    let t = setup(false);
    let mut a = Body::default();
    a.u32(libc::O_RDWR as u32).u32(0o600).u32(0).u32(0);
    let b = t.ok(op::CREATE, ROOT, &cat(&[&a.0, &z("tmp")]));
    let (node, fh) = (rd_u64(&b, 0).unwrap(), rd_u64(&b, 128).unwrap());
    t.ok(op::UNLINK, ROOT, &z("tmp"));
    let b = t.ok(op::GETATTR, node, &[0u8; 16]);
    assert_eq!(rd_u32(&b, 16 + 64), Some(0), "nlink 0");
    let mut g = Body::default();
    g.u32(1).u32(0).u64(fh);
    t.ok(op::GETATTR, node, &g.0);
    let mut w = io_args(fh, 0, 2);
    w.extend_from_slice(b"hi");
    t.ok(op::WRITE, node, &w);
    assert_eq!(t.ok(op::READ, node, &io_args(fh, 0, 10)), b"hi");
}

/// `mkdir -p` by requests; the node of the last directory.
fn mkdirs(t: &T, path: &str) -> u64 {
    let mut node = ROOT;
    for c in path.split('/') {
        let mut a = Body::default();
        a.u32(0o755).u32(0);
        node = rd_u64(&t.ok(op::MKDIR, node, &cat(&[&a.0, &z(c)])), 0).unwrap();
    }
    node
}

fn rename_args(newdir: u64, old: &str, new: &str) -> Vec<u8> {
    let mut r = Body::default();
    r.u64(newdir);
    cat(&[&r.0, &z(old), &z(new)])
}

/// Whether any path below `root` resolves, on the host, outside it.
fn escapes(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let top = fs::canonicalize(root).unwrap();
    let mut bad = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p.clone());
            }
            // A dangling link resolves nowhere and cannot be followed out.
            if let Ok(c) = fs::canonicalize(&p) {
                if !c.starts_with(&top) {
                    bad.push(p);
                }
            }
        }
    }
    bad
}

#[test]
fn a_symlink_moved_up_is_checked_at_its_new_place() {
    // The attack of issue 30: a link that stays inside from four levels
    // down, then `mv` to the root, where it would name the host's file.
    let t = setup(false);
    fs::write(t.root.join("x"), "x").unwrap();
    let d = mkdirs(&t, "a/b/c/d");
    t.ok(
        op::SYMLINK,
        d,
        &cat(&[&z("l"), &z("../../../../etc/passwd")]),
    );
    t.ok(op::SYMLINK, d, &cat(&[&z("ok"), &z("../../../../x")]));
    assert_eq!(
        t.call(op::RENAME, d, &rename_args(ROOT, "l", "l")).0,
        libc::EPERM
    );
    let mut r2 = Body::default();
    r2.u64(ROOT).u32(libc::RENAME_NOREPLACE).u32(0);
    assert_eq!(
        t.call(op::RENAME2, d, &cat(&[&r2.0, &z("l"), &z("l")])).0,
        libc::EPERM
    );
    let a = t.lookup(ROOT, "a");
    assert_eq!(
        t.call(op::RENAME, d, &rename_args(a, "ok", "ok")).0,
        libc::EPERM,
        "one level short is still out"
    );
    assert!(fs::symlink_metadata(t.root.join("l")).is_err());
    assert!(fs::symlink_metadata(t.root.join("a/b/c/d/l")).is_ok());
    // Within its directory, or deeper, a link moves freely.
    t.ok(op::RENAME, d, &rename_args(d, "ok", "ok2"));
    assert_eq!(fs::read_to_string(t.root.join("a/b/c/d/ok2")).unwrap(), "x");
    let e = mkdirs_in(&t, d, "e");
    t.ok(op::RENAME, d, &rename_args(e, "ok2", "ok3"));
    assert!(fs::symlink_metadata(t.root.join("a/b/c/d/e/ok3")).is_ok());
    assert!(escapes(&t.root).is_empty(), "{:?}", escapes(&t.root));
}

fn mkdirs_in(t: &T, parent: u64, name: &str) -> u64 {
    let mut a = Body::default();
    a.u32(0o755).u32(0);
    rd_u64(&t.ok(op::MKDIR, parent, &cat(&[&a.0, &z(name)])), 0).unwrap()
}

#[test]
fn a_directory_moved_up_is_checked_for_the_links_below_it() {
    let t = setup(false);
    fs::write(t.root.join("x"), "x").unwrap();
    let d = mkdirs(&t, "a/b/c/d");
    t.ok(op::SYMLINK, d, &cat(&[&z("l"), &z("../../../../x")]));
    let b = t.lookup(t.lookup(ROOT, "a"), "b");
    // c (and d, l below it) two levels up: l would climb out.
    assert_eq!(
        t.call(op::RENAME, b, &rename_args(ROOT, "c", "c")).0,
        libc::EPERM
    );
    assert!(t.root.join("a/b/c/d").is_dir() && !t.root.join("c").exists());
    // Sideways and deeper moves need no walk and are fine.
    t.ok(op::RENAME, ROOT, &rename_args(ROOT, "a", "a2"));
    let deep = mkdirs_in(&t, b, "deeper");
    t.ok(op::RENAME, b, &rename_args(deep, "c", "c"));
    assert!(fs::symlink_metadata(t.root.join("a2/b/deeper/c/d/l")).is_ok());
    // A directory whose links all fit at the new depth moves up.
    let m = mkdirs(&t, "m/n");
    t.ok(op::SYMLINK, m, &cat(&[&z("up"), &z("../../x")]));
    t.ok(op::SYMLINK, m, &cat(&[&z("near"), &z("../sib")]));
    t.ok(op::UNLINK, m, &z("up"));
    let mm = t.lookup(ROOT, "m");
    t.ok(op::RENAME, mm, &rename_args(ROOT, "n", "n"));
    assert_eq!(
        fs::read_link(t.root.join("n/near")).unwrap().to_str(),
        Some("../sib")
    );
    assert!(escapes(&t.root).is_empty(), "{:?}", escapes(&t.root));
}

#[test]
fn a_directory_too_large_to_check_moves_with_exdev() {
    let t = setup(false);
    let mut p = t.root.join("a/b/top");
    for _ in 0..crate::links::WALK_NESTING + 2 {
        p.push("n");
    }
    fs::create_dir_all(&p).unwrap();
    let b = t.lookup(t.lookup(ROOT, "a"), "b");
    assert_eq!(
        t.call(op::RENAME, b, &rename_args(ROOT, "top", "top")).0,
        libc::EXDEV
    );
    assert!(t.root.join("a/b/top").is_dir());
}

#[test]
fn no_symlink_climbs_through_a_dot_link() {
    // `x -> .` is fine, but `x/..` from the root would be the root's
    // parent: refused, at any depth.
    let t = setup(false);
    t.ok(op::SYMLINK, ROOT, &cat(&[&z("x"), &z(".")]));
    for bad in ["x/..", "x/../secret", "x/./../y"] {
        assert_eq!(
            t.call(op::SYMLINK, ROOT, &cat(&[&z("l"), &z(bad)])).0,
            libc::EPERM,
            "{bad}"
        );
    }
    let d = mkdirs(&t, "d/e");
    assert_eq!(
        t.call(op::SYMLINK, d, &cat(&[&z("l"), &z("x/../y")])).0,
        libc::EPERM
    );
    assert!(escapes(&t.root).is_empty(), "{:?}", escapes(&t.root));
}

#[test]
fn a_symlink_cannot_be_hardlinked() {
    let t = setup(false);
    let d = mkdirs(&t, "a/b");
    let l = rd_u64(&t.ok(op::SYMLINK, d, &cat(&[&z("l"), &z("../../f")])), 0).unwrap();
    // A second name at the root would be the same link, two levels up.
    assert_eq!(
        t.call(op::LINK, ROOT, &cat(&[&l.to_le_bytes(), &z("h")])).0,
        libc::EPERM
    );
    assert!(fs::symlink_metadata(t.root.join("h")).is_err());
}
