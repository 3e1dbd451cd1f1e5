//! The tar stream of a `COPY`/`ADD` step, and tar archive detection for
//! `ADD`.
//!
//! [`ArchiveSpec::write_tar`] writes a GNU-format tar (long names use GNU
//! long-name records) whose entry paths are relative to the step's
//! destination directory, without a leading `/` or `./`. Entries come in
//! the order of the instruction's sources, each source's tree sorted by
//! byte order, so the same plan always gives the same bytes. Every entry
//! has uid/gid 0, no user or group names, and the context file's mtime
//! (as Docker's COPY keeps it), or the fixed [`ARCHIVE_MTIME`] for what has
//! none; the receiver applies the step's owner. Entries from
//! an archive that `ADD` extracts keep their own headers (mode, owner,
//! mtime) and order.
//!
//! While writing, each file is re-hashed: if it no longer has the size
//! and sha256 the plan saw, writing fails with [`BuildError::Changed`],
//! because the step's cache key would not describe the snapshot.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use sha2::{Digest, Sha256};
use tar::{Builder, EntryType, Header};

use crate::{hex, BuildError};

/// The mtime of an entry without one of its own: 2000-01-01T00:00:00Z;
/// not 0 because tools such as Python's zipfile reject dates before 1980.
pub const ARCHIVE_MTIME: u64 = 946_684_800;

/// How to produce the tar stream of a `COPY`/`ADD` step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArchiveSpec {
    pub entries: Vec<ArchiveEntry>,
}

/// One entry of the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchiveEntry {
    /// Path relative to the destination (`a/b.txt`); for
    /// [`EntryKind::Extract`], the directory the archive's entries go
    /// under (`""` for the destination itself).
    pub path: String,
    pub kind: EntryKind,
    /// The context file's mtime (seconds), kept as Docker's COPY keeps it;
    /// `None`: [`ARCHIVE_MTIME`]. Not part of the cache key (Docker's is
    /// by content too), so a cached step keeps the mtimes it was built with.
    pub mtime: Option<u64>,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq)]
pub enum EntryKind {
    Dir {
        mode: u32,
    },
    File {
        host: PathBuf,
        mode: u32,
        size: u64,
        /// Hex sha256 of the content when planned.
        sha256: String,
    },
    Symlink {
        target: String,
    },
    /// A file whose content is in the plan (a `COPY <<EOF` heredoc).
    Inline {
        mode: u32,
        data: Vec<u8>,
    },
    /// A local tar archive that `ADD` unpacks: its entries are copied into
    /// the stream.
    Extract {
        host: PathBuf,
        compression: Compression,
        /// Hex sha256 of the archive file when planned.
        sha256: String,
    },
}

/// A tar archive's compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Bzip2,
    Xz,
}

impl Compression {
    /// The name used in cache keys and messages.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "tar",
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Xz => "xz",
        }
    }
}

impl ArchiveSpec {
    /// Number of entries and bytes of file content (not counting what
    /// extracted archives hold), for progress messages.
    pub fn summary(&self) -> (usize, u64) {
        let bytes = self
            .entries
            .iter()
            .map(|e| match &e.kind {
                EntryKind::File { size, .. } => *size,
                EntryKind::Inline { data, .. } => data.len() as u64,
                _ => 0,
            })
            .sum();
        (self.entries.len(), bytes)
    }

    /// Write the tar stream; returns the writer after the end-of-archive
    /// blocks.
    pub fn write_tar<W: Write>(&self, w: W) -> Result<W, BuildError> {
        let mut b = Builder::new(w);
        let werr = BuildError::Stream;
        for e in &self.entries {
            match &e.kind {
                EntryKind::Dir { mode } => {
                    let mut h = header(EntryType::Directory, *mode, 0, e.mtime);
                    b.append_data(&mut h, &e.path, io::empty()).map_err(werr)?;
                }
                EntryKind::Symlink { target } => {
                    let mut h = header(EntryType::Symlink, 0o777, 0, e.mtime);
                    b.append_link(&mut h, &e.path, target).map_err(werr)?;
                }
                EntryKind::File {
                    host,
                    mode,
                    size,
                    sha256,
                } => {
                    let f = File::open(host).map_err(|err| BuildError::io(host, err))?;
                    let mut r = Checked {
                        inner: f,
                        remaining: *size,
                        hasher: Sha256::new(),
                    };
                    let mut h = header(EntryType::Regular, *mode, *size, e.mtime);
                    b.append_data(&mut h, &e.path, &mut r).map_err(|err| {
                        if err.kind() == io::ErrorKind::UnexpectedEof {
                            BuildError::Changed { path: host.clone() }
                        } else {
                            werr(err)
                        }
                    })?;
                    let mut extra = [0u8; 1];
                    let grew = r
                        .inner
                        .read(&mut extra)
                        .map_err(|err| BuildError::io(host, err))?;
                    if grew != 0 || hex(&r.hasher.finalize()) != *sha256 {
                        return Err(BuildError::Changed { path: host.clone() });
                    }
                }
                EntryKind::Inline { mode, data } => {
                    let mut h = header(EntryType::Regular, *mode, data.len() as u64, e.mtime);
                    b.append_data(&mut h, &e.path, &data[..]).map_err(werr)?;
                }
                EntryKind::Extract {
                    host, compression, ..
                } => copy_archive(&mut b, host, *compression, &e.path)?,
            }
        }
        b.into_inner().map_err(werr)
    }
}

fn header(kind: EntryType, mode: u32, size: u64, mtime: Option<u64>) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(mtime.unwrap_or(ARCHIVE_MTIME));
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// A reader that yields exactly `remaining` bytes, hashing them, and fails
/// with `UnexpectedEof` when the file is shorter.
struct Checked {
    inner: File,
    remaining: u64,
    hasher: Sha256,
}

impl Read for Checked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank"));
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// A relative, `..`-free version of a path from an archive.
fn sanitize(path: &str) -> Option<String> {
    let mut parts = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

fn join(prefix: &str, rel: &str) -> String {
    match (prefix.is_empty(), rel.is_empty()) {
        (true, _) => rel.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{rel}"),
    }
}

fn copy_archive<W: Write>(
    b: &mut Builder<W>,
    host: &Path,
    compression: Compression,
    prefix: &str,
) -> Result<(), BuildError> {
    let bad = |message: String| BuildError::Archive {
        path: host.to_path_buf(),
        message,
    };
    let mut ar = tar::Archive::new(open_decompressed(host, compression)?);
    let entries = ar.entries().map_err(|e| bad(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("reading an entry: {e}")))?;
        let kind = entry.header().entry_type();
        // Extension records describe the next entry; the tar crate has
        // applied them already.
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            continue;
        }
        let raw = entry.path().map_err(|e| bad(e.to_string()))?;
        let raw = raw.to_string_lossy().into_owned();
        let Some(rel) = sanitize(&raw) else {
            return Err(bad(format!(
                "entry {raw:?} has a '..' component: refusing to write outside the destination"
            )));
        };
        let path = join(prefix, &rel);
        if path.is_empty() {
            // The archive's own `./`: the destination exists already.
            continue;
        }
        let mut h = entry.header().clone();
        // Some writers leave numeric fields blank; the receiver should not
        // have to guess.
        if h.uid().is_err() {
            h.set_uid(0);
        }
        if h.gid().is_err() {
            h.set_gid(0);
        }
        if h.mtime().is_err() {
            h.set_mtime(ARCHIVE_MTIME);
        }
        if h.mode().is_err() {
            h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        }
        if kind.is_hard_link() || kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| bad(e.to_string()))?
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            let target = if kind.is_hard_link() {
                // Hard link targets name another entry of the archive.
                match sanitize(&target) {
                    Some(t) => join(prefix, &t),
                    None => return Err(bad(format!("hard link target {target:?} has '..'"))),
                }
            } else {
                target
            };
            h.set_size(0);
            b.append_link(&mut h, &path, &target)
                .map_err(|e| bad(format!("copying {raw:?}: {e}")))?;
        } else {
            let size = entry.size();
            h.set_size(size);
            b.append_data(&mut h, &path, &mut entry)
                .map_err(|e| bad(format!("copying {raw:?}: {e}")))?;
        }
    }
    Ok(())
}

/// The compression of a file by its magic bytes.
fn sniff(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(b"BZh") {
        Compression::Bzip2
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Compression::Xz
    } else {
        Compression::None
    }
}

/// Open a possibly compressed file as a stream of its plain content.
fn open_decompressed(host: &Path, c: Compression) -> Result<Box<dyn Read>, BuildError> {
    let f = BufReader::new(File::open(host).map_err(|e| BuildError::io(host, e))?);
    Ok(match c {
        Compression::None => Box::new(f),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(f)),
        Compression::Bzip2 => Box::new(bzip2::bufread::MultiBzDecoder::new(f)),
        Compression::Xz => Box::new(xz_reader(f)),
    })
}

/// Whether a local file is a tar archive (plain, gzip, bzip2 or xz) that
/// `ADD` unpacks, judged by content as Docker does, not by name. A
/// compressed file that is not a tar inside is not one.
pub fn detect_archive(host: &Path) -> Result<Option<Compression>, BuildError> {
    let mut head = [0u8; 8];
    let mut f = File::open(host).map_err(|e| BuildError::io(host, e))?;
    let n = read_full(&mut f, &mut head).map_err(|e| BuildError::io(host, e))?;
    let c = sniff(&head[..n]);
    let mut block = [0u8; 512];
    let mut r = open_decompressed(host, c)?;
    // A corrupt compressed stream is not an archive: it is copied as is.
    let n = read_full(&mut r, &mut block).unwrap_or(0);
    Ok((n == 512 && is_tar_header(&block)).then_some(c))
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A tar header block: its checksum field matches its bytes.
fn is_tar_header(block: &[u8; 512]) -> bool {
    let field = &block[148..156];
    let digits: String = field
        .iter()
        .map(|&b| b as char)
        .filter(|c| ('0'..='7').contains(c))
        .collect();
    let Ok(stored) = u32::from_str_radix(&digits, 8) else {
        return false;
    };
    let sum: u32 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    // 256 is an all-zero block (its checksum field blank): not a header.
    sum == stored && sum != 256
}

/// lzma-rs decodes xz from a `BufRead` into a `Write` in one call, so it
/// runs on a thread that hands chunks to the reader through a bounded
/// channel; dropping the reader makes the thread's next send fail and it
/// stops.
fn xz_reader<R: BufRead + Send + 'static>(input: R) -> ChanReader {
    let (tx, rx) = mpsc::sync_channel::<Result<Vec<u8>, String>>(4);
    std::thread::spawn(move || {
        let mut input = input;
        let mut w = ChanWriter(tx.clone());
        if let Err(e) = lzma_rs::xz_decompress(&mut input, &mut w) {
            let _ = tx.send(Err(e.to_string()));
        }
    });
    ChanReader {
        rx,
        buf: Vec::new(),
        pos: 0,
    }
}

struct ChanWriter(mpsc::SyncSender<Result<Vec<u8>, String>>);

impl Write for ChanWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .send(Ok(buf.to_vec()))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "reader gone"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct ChanReader {
    rx: mpsc::Receiver<Result<Vec<u8>, String>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for ChanReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                Ok(Err(msg)) => return Err(io::Error::new(io::ErrorKind::InvalidData, msg)),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
