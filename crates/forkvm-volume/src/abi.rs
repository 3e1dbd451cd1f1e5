//! The subset of the FUSE kernel ABI (protocol 7.23 and later) that the
//! volume server speaks, hand-written so that every byte is under our
//! control: a server started on a restored guest never sees FUSE_INIT and
//! must encode replies from the parameters saved in the journal.
//!
//! A request is a `fuse_in_header` followed by the opcode's arguments; a
//! reply is a `fuse_out_header` followed by the opcode's output:
//!
//! ```text
//!  fuse_in_header (40 bytes)                    fuse_out_header (16 bytes)
//!  +-----+--------+--------+--------+-----+     +-----+-------+--------+
//!  | len | opcode | unique | nodeid | uid |...  | len | error | unique |
//!  | u32 | u32    | u64    | u64    | u32 |     | u32 | i32   | u64    |
//!  +-----+--------+--------+--------+-----+     +-----+-------+--------+
//! ```
//!
//! All integers are little-endian (the host and the guest are x86_64 or
//! aarch64). `error` is 0 or a negated errno; an error reply has no body.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

pub const FUSE_KERNEL_VERSION: u32 = 7;
/// The minor we answer with (at most): 7.31 has every field we use and none
/// of the later request extensions we would have to parse.
pub const OUR_MINOR: u32 = 31;
/// Oldest minor with the 64-byte `fuse_init_out` and today's entry layout.
pub const MIN_MINOR: u32 = 23;

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
}

/// INIT flags we may accept.
pub const FUSE_ASYNC_READ: u32 = 1;
pub const FUSE_BIG_WRITES: u32 = 1 << 5;
pub const FUSE_AUTO_INVAL_DATA: u32 = 1 << 12;
pub const FUSE_PARALLEL_DIROPS: u32 = 1 << 18;
pub const FUSE_MAX_PAGES: u32 = 1 << 22;
/// What we accept of the kernel's offer. No WRITEBACK_CACHE: host-side
/// changes must be visible and writes must reach the host at write(2).
pub const WANTED_FLAGS: u32 = FUSE_ASYNC_READ
    | FUSE_BIG_WRITES
    | FUSE_AUTO_INVAL_DATA
    | FUSE_PARALLEL_DIROPS
    | FUSE_MAX_PAGES;

/// open reply flag: keep the page cache across opens (AUTO_INVAL_DATA drops
/// it when the mtime changes).
pub const FOPEN_KEEP_CACHE: u32 = 2;

pub const FATTR_MODE: u32 = 1;
pub const FATTR_UID: u32 = 2;
pub const FATTR_GID: u32 = 4;
pub const FATTR_SIZE: u32 = 8;
pub const FATTR_ATIME: u32 = 16;
pub const FATTR_MTIME: u32 = 32;
pub const FATTR_FH: u32 = 64;
pub const FATTR_ATIME_NOW: u32 = 128;
pub const FATTR_MTIME_NOW: u32 = 256;

pub const MAX_WRITE: u32 = 1024 * 1024;
pub const MAX_PAGES: u16 = 256;

/// The decoded `fuse_in_header`.
#[derive(Debug, Clone, Copy)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    /// Parses the header; `None` when the request is shorter than its
    /// header or its `len` disagrees with the bytes received.
    pub fn parse(buf: &[u8]) -> Option<(InHeader, &[u8])> {
        if buf.len() < IN_HEADER || rd_u32(buf, 0)? as usize != buf.len() {
            return None;
        }
        Some((
            InHeader {
                opcode: rd_u32(buf, 4)?,
                unique: rd_u64(buf, 8)?,
                nodeid: rd_u64(buf, 16)?,
            },
            &buf[IN_HEADER..],
        ))
    }
}

pub fn rd_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub fn rd_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Splits `b` at the first NUL: (name, rest). `None` without a NUL.
pub fn cstr(b: &[u8]) -> Option<(&OsStr, &[u8])> {
    let nul = b.iter().position(|&c| c == 0)?;
    Some((OsStr::from_bytes(&b[..nul]), &b[nul + 1..]))
}

/// An error reply.
pub fn reply_err(unique: u64, errno: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUT_HEADER);
    out.extend_from_slice(&(OUT_HEADER as u32).to_le_bytes());
    out.extend_from_slice(&(-errno).to_le_bytes());
    out.extend_from_slice(&unique.to_le_bytes());
    out
}

/// A success reply with `body`.
pub fn reply_ok(unique: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OUT_HEADER + body.len());
    out.extend_from_slice(&((OUT_HEADER + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&unique.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Little-endian body builder.
#[derive(Default)]
pub struct Body(pub Vec<u8>);

impl Body {
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// Attributes as the guest sees them (uid/gid already mapped).
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    pub fn from_stat(st: &libc::stat, owner: (u32, u32)) -> Attr {
        Attr {
            ino: st.st_ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: (st.st_atime, st.st_atime_nsec as u32),
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            ctime: (st.st_ctime, st.st_ctime_nsec as u32),
            mode: st.st_mode,
            nlink: st.st_nlink as u32,
            uid: owner.0,
            gid: owner.1,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
        }
    }

    /// `struct fuse_attr` (88 bytes).
    pub fn encode(&self, b: &mut Body) {
        b.u64(self.ino)
            .u64(self.size)
            .u64(self.blocks)
            .u64(self.atime.0 as u64)
            .u64(self.mtime.0 as u64)
            .u64(self.ctime.0 as u64)
            .u32(self.atime.1)
            .u32(self.mtime.1)
            .u32(self.ctime.1)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.rdev)
            .u32(self.blksize)
            .u32(0);
    }
}

/// Entry and attribute cache lifetime in the guest (1 s): short enough
/// that host-side changes show up quickly, long enough to batch stats.
pub const TIMEOUT_SECS: u64 = 1;

/// `struct fuse_entry_out` (128 bytes).
pub fn entry_out(nodeid: u64, attr: &Attr) -> Body {
    let mut b = Body::default();
    b.u64(nodeid)
        .u64(0)
        .u64(TIMEOUT_SECS)
        .u64(TIMEOUT_SECS)
        .u32(0)
        .u32(0);
    attr.encode(&mut b);
    b
}

/// `struct fuse_attr_out` (104 bytes).
pub fn attr_out(attr: &Attr) -> Body {
    let mut b = Body::default();
    b.u64(TIMEOUT_SECS).u32(0).u32(0);
    attr.encode(&mut b);
    b
}

/// `struct fuse_open_out` (16 bytes).
pub fn open_out(fh: u64, flags: u32) -> Body {
    let mut b = Body::default();
    b.u64(fh).u32(flags).u32(0);
    b
}

/// Appends one `struct fuse_dirent` (padded to 8 bytes); false when it does
/// not fit in `max` bytes.
pub fn push_dirent(
    out: &mut Vec<u8>,
    max: usize,
    ino: u64,
    off: u64,
    typ: u32,
    name: &[u8],
) -> bool {
    let len = 24 + name.len();
    let padded = (len + 7) & !7;
    if out.len() + padded > max {
        return false;
    }
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&off.to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&typ.to_le_bytes());
    out.extend_from_slice(name);
    out.resize(out.len() + padded - len, 0);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_header_checks_len() {
        let mut req = vec![0u8; 48];
        req[0..4].copy_from_slice(&48u32.to_le_bytes());
        req[4..8].copy_from_slice(&op::GETATTR.to_le_bytes());
        req[8..16].copy_from_slice(&9u64.to_le_bytes());
        req[16..24].copy_from_slice(&1u64.to_le_bytes());
        let (h, rest) = InHeader::parse(&req).unwrap();
        assert_eq!(
            (h.opcode, h.unique, h.nodeid, rest.len()),
            (op::GETATTR, 9, 1, 8)
        );
        // A len that disagrees with the bytes, or a short header, is refused.
        assert!(InHeader::parse(&req[..47]).is_none());
        assert!(InHeader::parse(&req[..20]).is_none());
    }

    #[test]
    fn reply_layouts() {
        let e = reply_err(5, libc::ENOENT);
        assert_eq!(e.len(), 16);
        assert_eq!(rd_u32(&e, 4).unwrap() as i32, -libc::ENOENT);
        let a = Attr {
            ino: 1,
            size: 2,
            blocks: 0,
            atime: (0, 0),
            mtime: (0, 0),
            ctime: (0, 0),
            mode: 0o100644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        };
        assert_eq!(entry_out(2, &a).0.len(), 128);
        assert_eq!(attr_out(&a).0.len(), 104);
        assert_eq!(open_out(1, 0).0.len(), 16);
        let mut d = Vec::new();
        assert!(push_dirent(&mut d, 4096, 1, 1, 4, b"abc"));
        assert_eq!(d.len(), 32);
        assert!(!push_dirent(&mut d, 40, 1, 2, 4, b"abc"));
    }

    #[test]
    fn cstr_needs_nul() {
        let (a, rest) = cstr(b"ab\0cd\0").unwrap();
        assert_eq!(a, "ab");
        assert_eq!(cstr(rest).unwrap().0, "cd");
        assert!(cstr(b"ab").is_none());
    }
}
