//! The tar archives `put_archive` carries: a reader ([`entries`]), a small
//! writer ([`Writer`]) and the splitter a host uses for archives bigger than
//! one frame ([`split()`]).
//!
//! Host and agent share this code, so the splitter's idea of where an entry
//! begins and ends is exactly the extractor's.
//!
//! # Accepted format
//!
//! An uncompressed tar stream of 512-byte blocks: each entry is a header
//! block followed by its data, padded to a whole block. The archive ends at
//! an all-zero block or, equally, at the end of the bytes when that falls
//! on an entry boundary (the parts [`split()`] makes carry no end marker).
//!
//! * Header flavours: POSIX ustar (with the `prefix` field), GNU (`ustar  `
//!   magic; `L`/`K` long name and long link entries) and old V7 headers.
//!   Every header's checksum is verified (the unsigned sum, or the signed
//!   one some old writers used).
//! * Numeric fields: octal text, or GNU base-256 when the first byte has its
//!   high bit set (sizes of 8 GiB and more, negative mtimes).
//! * PAX extended headers (`x`): the records `path`, `linkpath`, `size`,
//!   `uid`, `gid` and `mtime` (with a fraction) override the header's
//!   fields; other records (uname, gname, xattrs, ...) are ignored. A record
//!   with an empty value leaves the header's field in place. Global PAX
//!   headers (`g`) and GNU volume labels (`V`) are skipped, as Go's
//!   archive/tar does (and Docker's tooling is built on it).
//! * Entry types: regular (`0`, NUL, `7`), hard link (`1`), symlink (`2`),
//!   character and block devices (`3`, `4`), directory (`5`, GNU `D`, or a
//!   regular entry whose name ends in `/`) and FIFO (`6`). Links, devices,
//!   directories and FIFOs have no data whatever their size field says
//!   (again as Go does; GNU `D` data is skipped). Sparse (`S`),
//!   multi-volume (`M`) and unknown types are refused.
//! * Limits: an extended header or GNU long name is at most [`MAX_META`]
//!   bytes.
//!
//! Paths are returned as the raw bytes of the archive; it is up to the
//! extractor to decide what a safe path is.

pub(crate) mod split;
mod write;

#[cfg(test)]
mod tests;

pub use split::{split, Part};
pub use write::{Meta, Writer};

/// The tar block size.
pub const BLOCK: usize = 512;
/// Largest PAX extended header or GNU long name accepted.
pub const MAX_META: u64 = 1 << 20;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    HardLink,
    Symlink,
    CharDev,
    BlockDev,
    Dir,
    Fifo,
}

/// One archive entry, with the offsets of its parts in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// The entry's path, as stored (after PAX and GNU overrides).
    pub path: Vec<u8>,
    /// Link target of a hard link or symlink (empty otherwise).
    pub link: Vec<u8>,
    /// Permission bits, including setuid, setgid and sticky.
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    /// Seconds since the epoch, and nanoseconds (from a PAX `mtime`).
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// Data bytes (0 for every kind but [`Kind::File`]).
    pub size: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// Where the entry starts: its first extended header, if any.
    pub start: usize,
    /// Where its main header block is.
    pub header: usize,
    /// Where its data starts.
    pub data: usize,
    /// Where the next entry starts (after the data's padding).
    pub end: usize,
}

impl Entry {
    /// The entry's data within `archive` (the archive it was read from).
    pub fn data<'a>(&self, archive: &'a [u8]) -> &'a [u8] {
        let end = self.data.saturating_add(self.size as usize);
        archive.get(self.data..end).unwrap_or_default()
    }
}

/// Why an archive cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TarError {
    #[error(
        "the tar header at byte {offset} has a bad checksum: the archive is corrupt or is not an uncompressed tar"
    )]
    Checksum { offset: usize },
    #[error("the tar header at byte {offset} has an invalid {field} field")]
    BadField { offset: usize, field: &'static str },
    #[error("the tar archive is truncated inside the entry that starts at byte {offset}")]
    Truncated { offset: usize },
    #[error(
        "the tar entry at byte {offset} has type {typeflag:?}, which is not supported (regular files, directories, symlinks, hard links, devices and FIFOs are)"
    )]
    Unsupported { offset: usize, typeflag: char },
    #[error("the tar entry at byte {offset} has a bad PAX extended header: {why}")]
    BadPax { offset: usize, why: String },
    #[error(
        "the tar entry at byte {offset} has an extended header or long name of {size} bytes, over the {MAX_META}-byte limit"
    )]
    MetaTooLarge { offset: usize, size: u64 },
    #[error("the tar entry at byte {offset} has an empty name")]
    EmptyName { offset: usize },
    #[error(
        "the tar entry at byte {offset} cannot be split into requests of {limit} bytes: only regular files can be split, and its headers alone must fit with one block of data"
    )]
    Unsplittable { offset: usize, limit: usize },
}

/// Iterate over the entries of an archive held in memory. The iterator ends
/// after the first error.
pub fn entries(archive: &[u8]) -> Entries<'_> {
    Entries {
        buf: archive,
        pos: 0,
        done: false,
    }
}

/// See [`entries`].
pub struct Entries<'a> {
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

impl Iterator for Entries<'_> {
    type Item = Result<Entry, TarError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.next_entry();
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        r.transpose()
    }
}

/// Per-entry overrides from `x`, `L` and `K` headers.
#[derive(Default)]
struct Overrides {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<(i64, u32)>,
    /// Whether any header that must be followed by an entry was seen.
    pending: bool,
}

/// The 512-byte block at `off`, if the archive holds all of it.
fn block(buf: &[u8], off: usize) -> Option<&[u8; BLOCK]> {
    buf.get(off..off.checked_add(BLOCK)?)?.try_into().ok()
}

/// `n` rounded up to a whole number of blocks.
pub(crate) fn padded(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(BLOCK)
}

impl Entries<'_> {
    fn next_entry(&mut self) -> Result<Option<Entry>, TarError> {
        let start = self.pos;
        let mut ov = Overrides::default();
        loop {
            let off = self.pos;
            let end_here = |ov: &Overrides| {
                if ov.pending {
                    Err(TarError::Truncated { offset: start })
                } else {
                    Ok(None)
                }
            };
            if off == self.buf.len() {
                return end_here(&ov);
            }
            let Some(h) = block(self.buf, off) else {
                return Err(TarError::Truncated { offset: start });
            };
            if h.iter().all(|&b| b == 0) {
                return end_here(&ov);
            }
            check_checksum(h, off)?;
            let typeflag = h[156];
            let hdr_size = number(&h[124..136], off, "size")?;
            let data_start = off + BLOCK;
            if matches!(typeflag, b'x' | b'g' | b'L' | b'K' | b'V') {
                if hdr_size > MAX_META {
                    return Err(TarError::MetaTooLarge {
                        offset: off,
                        size: hdr_size,
                    });
                }
                let len = hdr_size as usize;
                let data = self
                    .buf
                    .get(data_start..data_start + len)
                    .ok_or(TarError::Truncated { offset: start })?;
                self.pos = data_start + padded(len).unwrap_or(len);
                match typeflag {
                    b'x' => {
                        apply_pax(&mut ov, data, off)?;
                        ov.pending = true;
                    }
                    b'L' => {
                        ov.path = Some(cstr(data).to_vec());
                        ov.pending = true;
                    }
                    b'K' => {
                        ov.link = Some(cstr(data).to_vec());
                        ov.pending = true;
                    }
                    // Global headers and volume labels: skipped (see the
                    // module doc).
                    _ => {}
                }
                continue;
            }
            return self
                .finish_entry(h, typeflag, hdr_size, start, off, ov)
                .map(Some);
        }
    }

    fn finish_entry(
        &mut self,
        h: &[u8; BLOCK],
        typeflag: u8,
        hdr_size: u64,
        start: usize,
        off: usize,
        ov: Overrides,
    ) -> Result<Entry, TarError> {
        let ustar = &h[257..263] == b"ustar\0";
        let path = match ov.path {
            Some(p) => p,
            None => {
                let name = cstr(&h[0..100]);
                let prefix = if ustar { cstr(&h[345..500]) } else { &[] };
                if prefix.is_empty() {
                    name.to_vec()
                } else {
                    [prefix, b"/", name].concat()
                }
            }
        };
        if path.is_empty() {
            return Err(TarError::EmptyName { offset: off });
        }
        let mut kind = match typeflag {
            b'0' | b'\0' | b'7' => Kind::File,
            b'1' => Kind::HardLink,
            b'2' => Kind::Symlink,
            b'3' => Kind::CharDev,
            b'4' => Kind::BlockDev,
            b'5' | b'D' => Kind::Dir,
            b'6' => Kind::Fifo,
            other => {
                return Err(TarError::Unsupported {
                    offset: off,
                    typeflag: char::from(other),
                })
            }
        };
        // Old (pre-POSIX) archives mark directories by a trailing slash.
        if kind == Kind::File && typeflag != b'7' && path.ends_with(b"/") {
            kind = Kind::Dir;
        }
        let link = ov.link.unwrap_or_else(|| cstr(&h[157..257]).to_vec());
        let size = ov.size.unwrap_or(hdr_size);
        // Only regular files (and GNU dumpdirs, whose listing is skipped)
        // carry data.
        let data_len = match (kind, typeflag) {
            (Kind::File, _) | (_, b'D') => size,
            _ => 0,
        };
        let data_len =
            usize::try_from(data_len).map_err(|_| TarError::Truncated { offset: start })?;
        let data = off + BLOCK;
        let data_end = data
            .checked_add(data_len)
            .filter(|&e| e <= self.buf.len())
            .ok_or(TarError::Truncated { offset: start })?;
        // A missing final padding is forgiven: the data is all there.
        let end = padded(data_end).unwrap_or(data_end).min(self.buf.len());
        let (mtime, mtime_nsec) = match ov.mtime {
            Some(t) => t,
            None => (signed_number(&h[136..148], off, "mtime")?, 0),
        };
        let dev = |r: std::ops::Range<usize>, field| -> Result<u32, TarError> {
            if !matches!(kind, Kind::CharDev | Kind::BlockDev) {
                return Ok(0);
            }
            u32::try_from(number(&h[r], off, field)?)
                .map_err(|_| TarError::BadField { offset: off, field })
        };
        let entry = Entry {
            kind,
            path,
            link,
            mode: (number(&h[100..108], off, "mode")? & 0o7777) as u32,
            uid: match ov.uid {
                Some(u) => u,
                None => number(&h[108..116], off, "uid")?,
            },
            gid: match ov.gid {
                Some(g) => g,
                None => number(&h[116..124], off, "gid")?,
            },
            mtime,
            mtime_nsec,
            size: if kind == Kind::File { size } else { 0 },
            dev_major: dev(329..337, "devmajor")?,
            dev_minor: dev(337..345, "devminor")?,
            start,
            header: off,
            data,
            end,
        };
        self.pos = end;
        Ok(entry)
    }
}

/// The bytes of a NUL-terminated (or full-width) header field.
fn cstr(field: &[u8]) -> &[u8] {
    match field.iter().position(|&b| b == 0) {
        Some(n) => &field[..n],
        None => field,
    }
}

/// An unsigned numeric field: octal text (leading spaces, then digits, then
/// spaces or NULs) or GNU base-256.
pub(crate) fn number(field: &[u8], offset: usize, name: &'static str) -> Result<u64, TarError> {
    let bad = || TarError::BadField {
        offset,
        field: name,
    };
    match field.first() {
        Some(0xff) => Err(bad()),
        Some(&b) if b & 0x80 != 0 => field[1..]
            .iter()
            .try_fold(u64::from(b & 0x7f), |v, &b| {
                v.checked_mul(256)?.checked_add(u64::from(b))
            })
            .ok_or_else(bad),
        _ => {
            let s = field.trim_ascii_start();
            let digits = s.iter().take_while(|b| (b'0'..=b'7').contains(b)).count();
            if !s[digits..].iter().all(|&b| b == 0 || b == b' ') {
                return Err(bad());
            }
            s[..digits]
                .iter()
                .try_fold(0u64, |v, &d| {
                    v.checked_mul(8)?.checked_add(u64::from(d - b'0'))
                })
                .ok_or_else(bad)
        }
    }
}

/// A signed numeric field (mtime): as [`number`], plus base-256 negatives.
fn signed_number(field: &[u8], offset: usize, name: &'static str) -> Result<i64, TarError> {
    let bad = || TarError::BadField {
        offset,
        field: name,
    };
    if field.first() == Some(&0xff) {
        // Two's complement over the whole field: it fits an i64 when all
        // but the last 8 bytes are sign extension.
        let (ext, tail) = field.split_at(field.len().saturating_sub(8));
        let tail: [u8; 8] = tail.try_into().map_err(|_| bad())?;
        let v = i64::from_be_bytes(tail);
        if ext.iter().all(|&b| b == 0xff) && v < 0 {
            return Ok(v);
        }
        return Err(bad());
    }
    i64::try_from(number(field, offset, name)?).map_err(|_| bad())
}

/// Verify a header block's checksum.
fn check_checksum(h: &[u8; BLOCK], offset: usize) -> Result<(), TarError> {
    let stored =
        number(&h[148..156], offset, "checksum").map_err(|_| TarError::Checksum { offset })?;
    let (unsigned, signed) = checksums(h);
    if stored == unsigned || i64::try_from(stored).ok() == Some(signed) {
        Ok(())
    } else {
        Err(TarError::Checksum { offset })
    }
}

/// The unsigned and signed sums of a header, its checksum field counted as
/// spaces.
pub(crate) fn checksums(h: &[u8; BLOCK]) -> (u64, i64) {
    let mut unsigned = 0u64;
    let mut signed = 0i64;
    for (i, &b) in h.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    (unsigned, signed)
}

/// A PAX record's key and value.
pub(crate) type PaxRecord<'a> = (&'a [u8], &'a [u8]);

/// The records of a PAX extended header.
pub(crate) fn pax_records(data: &[u8]) -> Result<Vec<PaxRecord<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        // Some writers pad the data with NULs.
        if rest.iter().all(|&b| b == 0) {
            break;
        }
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a record has no length")?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("a record length is not a number")?;
        if len <= sp + 1 || len > rest.len() {
            return Err(format!("a record length of {len} is out of range"));
        }
        let rec = &rest[sp + 1..len];
        let Some((&b'\n', kv)) = rec.split_last() else {
            return Err("a record does not end with a newline".into());
        };
        let eq = kv
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a record has no '='")?;
        out.push((&kv[..eq], &kv[eq + 1..]));
        rest = &rest[len..];
    }
    Ok(out)
}

fn apply_pax(ov: &mut Overrides, data: &[u8], offset: usize) -> Result<(), TarError> {
    let bad = |why: String| TarError::BadPax { offset, why };
    let int = |key: &str, v: &[u8]| -> Result<u64, TarError> {
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                bad(format!(
                    "{key}={} is not a number",
                    String::from_utf8_lossy(v)
                ))
            })
    };
    for (k, v) in pax_records(data).map_err(bad)? {
        if v.is_empty() {
            continue;
        }
        match k {
            b"path" => ov.path = Some(v.to_vec()),
            b"linkpath" => ov.link = Some(v.to_vec()),
            b"size" => ov.size = Some(int("size", v)?),
            b"uid" => ov.uid = Some(int("uid", v)?),
            b"gid" => ov.gid = Some(int("gid", v)?),
            b"mtime" => {
                ov.mtime = Some(pax_time(v).ok_or_else(|| {
                    bad(format!(
                        "mtime={} is not a time",
                        String::from_utf8_lossy(v)
                    ))
                })?)
            }
            _ => {}
        }
    }
    Ok(())
}

/// A PAX time: `[-]seconds[.fraction]`, as (seconds, nanoseconds) with the
/// nanoseconds always counting forward.
pub(crate) fn pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = int.parse().ok()?;
    let mut nanos = 0u32;
    for (i, d) in frac.bytes().take(9).enumerate() {
        nanos += u32::from(d - b'0') * 10u32.pow(8 - i as u32);
    }
    Some(match (neg, nanos) {
        (false, _) => (secs, nanos),
        (true, 0) => (-secs, 0),
        (true, n) => (-secs - 1, 1_000_000_000 - n),
    })
}
