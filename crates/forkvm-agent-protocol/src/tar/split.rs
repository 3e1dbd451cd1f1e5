//! Splitting an archive into `put_archive` requests of bounded size.
//!
//! Tar entries are independent, so an archive is cut at entry boundaries:
//! each [`Part`] is a run of whole entries (with their extended headers)
//! that fits the limit, and is itself a valid archive (without the end
//! marker, which the reader does not need).
//!
//! A regular file too big for one part is sent in pieces. Every piece is an
//! archive of that one entry with the same headers except the size: the
//! main header's size field says the piece's length and a PAX `size` record,
//! if there was one, is removed (the other PAX records, GNU long names and
//! global headers are kept as they are). The first piece is a normal part,
//! which creates the file; each later one has `append_at` set to the offset
//! of its data in the file, which tells the agent to write it there into the
//! file the earlier pieces made (see `HostMsg::PutArchive`). Pieces must be
//! sent in order, each after the previous one was acknowledged.

use std::borrow::Cow;
use std::ops::Range;

use super::{checksums, entries, number, padded, pax_records, Entry, Kind, TarError, BLOCK};

/// One request's worth of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Header blocks sent before `body`: the rewritten headers of a piece of
    /// a split file, empty for a run of whole entries.
    pub head: Vec<u8>,
    /// The bytes of the original archive this part carries.
    pub body: Range<usize>,
    /// Zero bytes sent after `body` (the last piece's padding).
    pub pad: usize,
    /// `PutArchive::append_at` for this part.
    pub append_at: Option<u64>,
}

impl Part {
    /// The payload size.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len() + self.pad
    }

    /// Whether the part carries nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload for this part of `archive` (the archive it was split
    /// from): borrowed unless headers or padding had to be added.
    pub fn payload<'a>(&self, archive: &'a [u8]) -> Cow<'a, [u8]> {
        let body = &archive[self.body.clone()];
        if self.head.is_empty() && self.pad == 0 {
            return Cow::Borrowed(body);
        }
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(body);
        v.resize(self.len(), 0);
        Cow::Owned(v)
    }
}

/// Cut `archive` into parts of at most `limit` payload bytes (a host passes
/// `MAX_PAYLOAD`). An empty archive gives no parts. Fails if the archive
/// does not parse, or if an entry other than a regular file (or a file's
/// headers with one block of data) is bigger than `limit`.
pub fn split(archive: &[u8], limit: usize) -> Result<Vec<Part>, TarError> {
    let mut parts = Vec::new();
    let mut run: Option<Range<usize>> = None;
    let flush = |run: &mut Option<Range<usize>>, parts: &mut Vec<Part>| {
        if let Some(body) = run.take() {
            parts.push(Part {
                head: Vec::new(),
                body,
                pad: 0,
                append_at: None,
            });
        }
    };
    for e in entries(archive) {
        let e = e?;
        if e.end - e.start <= limit {
            match &mut run {
                Some(r) if e.end - r.start <= limit => r.end = e.end,
                _ => {
                    flush(&mut run, &mut parts);
                    run = Some(e.start..e.end);
                }
            }
            continue;
        }
        flush(&mut run, &mut parts);
        pieces(archive, &e, limit, &mut parts)?;
    }
    flush(&mut run, &mut parts);
    Ok(parts)
}

/// Split one big regular file into pieces (see the module doc).
fn pieces(archive: &[u8], e: &Entry, limit: usize, parts: &mut Vec<Part>) -> Result<(), TarError> {
    let unsplittable = TarError::Unsplittable {
        offset: e.start,
        limit,
    };
    if e.kind != Kind::File {
        return Err(unsplittable);
    }
    let meta = rewrite_meta(archive, e)?;
    let main: [u8; BLOCK] = archive
        .get(e.header..e.header + BLOCK)
        .and_then(|b| b.try_into().ok())
        .ok_or(TarError::Truncated { offset: e.start })?;
    let room = limit.saturating_sub(meta.len() + BLOCK);
    let chunk = room - room % BLOCK;
    if chunk == 0 {
        return Err(unsplittable);
    }
    let size = e.size as usize;
    let mut off = 0usize;
    while off < size {
        let n = chunk.min(size - off);
        let mut head = meta.clone();
        head.extend_from_slice(&with_size(&main, n as u64));
        parts.push(Part {
            head,
            body: e.data + off..e.data + off + n,
            pad: padded(n).unwrap_or(n) - n,
            append_at: (off > 0).then_some(off as u64),
        });
        off += n;
    }
    Ok(())
}

/// The extended headers of `e` (everything from its start to its main
/// header), with any PAX `size` record removed.
fn rewrite_meta(archive: &[u8], e: &Entry) -> Result<Vec<u8>, TarError> {
    let mut out = Vec::new();
    let mut off = e.start;
    while off < e.header {
        let h: [u8; BLOCK] = archive
            .get(off..off + BLOCK)
            .and_then(|b| b.try_into().ok())
            .ok_or(TarError::Truncated { offset: e.start })?;
        let len = number(&h[124..136], off, "size")? as usize;
        let data = archive
            .get(off + BLOCK..off + BLOCK + len)
            .ok_or(TarError::Truncated { offset: e.start })?;
        let next = off + BLOCK + padded(len).unwrap_or(len);
        if h[156] == b'x' {
            let bad = |why| TarError::BadPax { offset: off, why };
            let mut kept = Vec::new();
            for (k, v) in pax_records(data).map_err(bad)? {
                if k != b"size" {
                    pax_record(&mut kept, k, v);
                }
            }
            if !kept.is_empty() {
                out.extend_from_slice(&with_size(&h, kept.len() as u64));
                let padded_len = padded(kept.len()).unwrap_or(kept.len());
                kept.resize(padded_len, 0);
                out.extend_from_slice(&kept);
            }
        } else {
            out.extend_from_slice(&archive[off..next.min(e.header)]);
        }
        off = next;
    }
    Ok(out)
}

/// Append one PAX record, `"<len> <key>=<value>\n"`, where `len` counts the
/// whole record including its own digits.
pub(crate) fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// A copy of header `h` with its size field set to `size` (which must fit
/// 11 octal digits) and its checksum recomputed.
pub(crate) fn with_size(h: &[u8; BLOCK], size: u64) -> [u8; BLOCK] {
    let mut h = *h;
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    set_checksum(&mut h);
    h
}

/// Recompute and store a header's checksum.
pub(crate) fn set_checksum(h: &mut [u8; BLOCK]) {
    let (sum, _) = checksums(h);
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}
