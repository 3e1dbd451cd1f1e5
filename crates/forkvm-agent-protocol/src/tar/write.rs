//! A minimal tar writer: POSIX ustar headers, with a PAX extended header for
//! what does not fit them (paths and link targets over 100 bytes, ids over
//! 2097151, negative or huge mtimes). Enough for a host to build an archive
//! of a few files, and for tests.

use super::split::{pax_record, set_checksum};
use super::{padded, Kind, BLOCK};

/// The metadata of an entry to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Permission bits (including setuid, setgid, sticky).
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    /// Seconds since the epoch.
    pub mtime: i64,
    /// Device numbers, for character and block devices.
    pub dev: (u32, u32),
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            dev: (0, 0),
        }
    }
}

/// Builds an archive in memory.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

/// Largest value of an 8-byte octal field (7 digits).
const MAX_OCTAL7: u64 = 0o7_777_777;
/// Largest value of a 12-byte octal field (11 digits).
const MAX_OCTAL11: u64 = 0o77_777_777_777;

fn octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let s = format!("{v:0digits$o}\0");
    field.copy_from_slice(&s.as_bytes()[s.len() - field.len()..]);
}

impl Writer {
    pub fn new() -> Self {
        Writer::default()
    }

    /// Append any entry. `link` is the target of a hard link or symlink;
    /// `data` is written only for [`Kind::File`].
    pub fn entry(&mut self, kind: Kind, path: &[u8], link: &[u8], meta: &Meta, data: &[u8]) {
        let data = if kind == Kind::File { data } else { &[] };
        let mut pax = Vec::new();
        if path.len() > 100 {
            pax_record(&mut pax, b"path", path);
        }
        if link.len() > 100 {
            pax_record(&mut pax, b"linkpath", link);
        }
        for (key, v) in [(&b"uid"[..], meta.uid), (b"gid", meta.gid)] {
            if v > MAX_OCTAL7 {
                pax_record(&mut pax, key, v.to_string().as_bytes());
            }
        }
        let mtime = u64::try_from(meta.mtime).ok().filter(|&t| t <= MAX_OCTAL11);
        if mtime.is_none() {
            pax_record(&mut pax, b"mtime", meta.mtime.to_string().as_bytes());
        }
        if data.len() as u64 > MAX_OCTAL11 {
            pax_record(&mut pax, b"size", data.len().to_string().as_bytes());
        }
        if !pax.is_empty() {
            let mut h = [0u8; BLOCK];
            h[..14].copy_from_slice(b"PaxHeaders/pax");
            self.header(&mut h, b'x', &Meta::default(), pax.len() as u64);
            self.push_data(&pax);
        }
        let mut h = [0u8; BLOCK];
        let n = path.len().min(100);
        h[..n].copy_from_slice(&path[..n]);
        let l = link.len().min(100);
        h[157..157 + l].copy_from_slice(&link[..l]);
        let typeflag = match kind {
            Kind::File => b'0',
            Kind::HardLink => b'1',
            Kind::Symlink => b'2',
            Kind::CharDev => b'3',
            Kind::BlockDev => b'4',
            Kind::Dir => b'5',
            Kind::Fifo => b'6',
        };
        let meta = Meta {
            uid: meta.uid.min(MAX_OCTAL7),
            gid: meta.gid.min(MAX_OCTAL7),
            mtime: mtime.map_or(0, |t| t as i64),
            ..meta.clone()
        };
        self.header(
            &mut h,
            typeflag,
            &meta,
            (data.len() as u64).min(MAX_OCTAL11),
        );
        self.push_data(data);
    }

    fn header(&mut self, h: &mut [u8; BLOCK], typeflag: u8, meta: &Meta, size: u64) {
        octal(&mut h[100..108], u64::from(meta.mode & 0o7777));
        octal(&mut h[108..116], meta.uid);
        octal(&mut h[116..124], meta.gid);
        octal(&mut h[124..136], size);
        octal(&mut h[136..148], meta.mtime.max(0) as u64);
        h[156] = typeflag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        octal(&mut h[329..337], u64::from(meta.dev.0));
        octal(&mut h[337..345], u64::from(meta.dev.1));
        set_checksum(h);
        self.buf.extend_from_slice(h);
    }

    fn push_data(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        let len = self.buf.len();
        self.buf.resize(padded(len).unwrap_or(len), 0);
    }

    /// A regular file.
    pub fn file(&mut self, path: &str, meta: &Meta, data: &[u8]) {
        self.entry(Kind::File, path.as_bytes(), b"", meta, data);
    }

    /// A directory.
    pub fn dir(&mut self, path: &str, meta: &Meta) {
        self.entry(Kind::Dir, path.as_bytes(), b"", meta, b"");
    }

    /// A symlink to `target`.
    pub fn symlink(&mut self, path: &str, target: &str, meta: &Meta) {
        self.entry(Kind::Symlink, path.as_bytes(), target.as_bytes(), meta, b"");
    }

    /// A hard link to `target`, an earlier entry of the archive.
    pub fn hardlink(&mut self, path: &str, target: &str) {
        let meta = Meta::default();
        self.entry(
            Kind::HardLink,
            path.as_bytes(),
            target.as_bytes(),
            &meta,
            b"",
        );
    }

    /// The archive so far, without the end marker.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The finished archive, with its end marker (two zero blocks).
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.resize(self.buf.len() + 2 * BLOCK, 0);
        self.buf
    }
}
