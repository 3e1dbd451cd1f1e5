//! Named files of an import source, a directory or a (maybe compressed) tar,
//! read without unpacking it and copied into the blob store verified.
//!
//! A tar is read in passes, never whole into memory: the first pass lists
//! the entries that could matter (names at most two deep, and everything
//! under `blobs/`) and keeps the small documents among them (manifests,
//! configs, `index.json`, `oci-layout`, up to [`CACHE_BUDGET`] in all); a
//! second pass streams the blobs wanted into the store. A plain tar's
//! passes seek past the data they skip; a compressed one is decompressed
//! again. A document that was not kept costs one more pass.
//!
//! Names are the archive's own, normalized (`./a/b` is `a/b`) and confined
//! (a name with `..` above the top is never matched). Symlinks and
//! hardlinks between entries (legacy `docker save` links a repeated
//! layer's `layer.tar` to the first copy) are followed inside the archive.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use tar::EntryType;

use crate::blobs::BlobStore;
use crate::error::{blob_err, io_err, ImageError};
use crate::oci::MAX_DOCUMENT;
use crate::progress::{Progress, ProgressEvent};
use crate::safepath::clean_entry_path;
use crate::unpack::{decompress, Compression};

/// Entries up to this size may be kept in memory by the listing pass.
const SMALL: u64 = 1 << 20;
/// At most this much is kept in memory in all.
pub const CACHE_BUDGET: u64 = 64 << 20;
/// How many links a name may go through inside an archive.
const MAX_HOPS: usize = 8;

/// A blob to copy: the archive entry (or file) and what it must hash to.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub name: String,
    pub digest: String,
    pub size: Option<u64>,
}

/// A listed tar entry.
#[derive(Debug)]
pub enum Item {
    File { size: u64, data: Option<Vec<u8>> },
    Symlink(String),
    Hardlink(String),
    Other,
}

/// An opened source.
#[derive(Debug)]
pub enum Source {
    Dir(PathBuf),
    Tar {
        path: PathBuf,
        /// The whole file's compression.
        compression: Compression,
        items: HashMap<String, Item>,
    },
}

/// Normalize an archive name; None for one that leaves the top.
pub fn norm(name: &Path) -> Option<String> {
    let c = clean_entry_path(name).ok()?;
    let parts: Vec<String> = c.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    Some(parts.join("/"))
}

fn not_tar(path: &Path, e: impl ToString) -> ImageError {
    ImageError::UnknownFormat {
        path: path.to_path_buf(),
        reason: format!(
            "it is neither a directory nor a tar archive ({})",
            e.to_string()
        ),
    }
}

/// How much of a file [`sniff`] looks at (ext4's magic is at 1080).
const SNIFF_LEN: u64 = 2048;

/// Name a file format that is not a tar by its magic bytes, so an import
/// of the wrong file says what it got. `None`: maybe a tar (plain, gzip or
/// zstd), which the listing pass then reads.
pub fn sniff(head: &[u8]) -> Option<&'static str> {
    const MAGIC: &[(&[u8], &str)] = &[
        (
            &[0xfd, b'7', b'z', b'X', b'Z', 0],
            "xz-compressed data (decompress it first: xz -d, or recompress with gzip or zstd)",
        ),
        (
            b"BZh",
            "bzip2-compressed data (decompress it first: bunzip2, or recompress with gzip or zstd)",
        ),
        (
            &[0x04, 0x22, 0x4d, 0x18],
            "lz4-compressed data (decompress it first, or recompress with gzip or zstd)",
        ),
        (b"PK\x03\x04", "a zip archive"),
        (b"7z\xbc\xaf\x27\x1c", "a 7-zip archive"),
        (b"QFI\xfb", "a qcow2 disk image"),
        (b"hsqs", "a squashfs filesystem image"),
        (b"\x7fELF", "an ELF executable"),
        (b"!<arch>", "an ar archive (a .deb?)"),
    ];
    // A tar header says `ustar` at 257; compressed data is looked into later.
    if head.get(257..262) == Some(b"ustar") || Compression::detect(head) != Compression::None {
        return None;
    }
    if let Some((_, what)) = MAGIC.iter().find(|(m, _)| head.starts_with(m)) {
        return Some(what);
    }
    if head.get(1080..1082) == Some(&[0x53, 0xef]) {
        return Some("an ext2/3/4 filesystem image (forkvm makes its own from a tar: tar -C MOUNTPOINT -cf rootfs.tar .)");
    }
    let text = head.iter().find(|b| !b.is_ascii_whitespace());
    if matches!(text, Some(b'{') | Some(b'[')) && head.len() < 512 {
        return Some("a JSON document");
    }
    None
}

/// Whether the listing pass keeps a small entry's content.
fn worth_keeping(name: &str, head: &[u8]) -> bool {
    let top = !name.contains('/');
    (top && (name.ends_with(".json") || name == "oci-layout" || name == "repositories"))
        || (name.starts_with("blobs/") && head.first() == Some(&b'{'))
}

impl Source {
    /// Open a directory, or list a tar (one pass).
    pub fn open(path: &Path) -> Result<Source, ImageError> {
        let meta =
            std::fs::metadata(path).map_err(io_err(format!("opening {}", path.display())))?;
        if meta.is_dir() {
            return Ok(Source::Dir(path.to_path_buf()));
        }
        let mut f = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
        let mut head = Vec::new();
        (&mut f)
            .take(SNIFF_LEN)
            .read_to_end(&mut head)
            .map_err(io_err(format!("reading {}", path.display())))?;
        if let Some(kind) = sniff(&head) {
            return Err(ImageError::UnknownFormat {
                path: path.to_path_buf(),
                reason: format!("it is {kind}, not a tar archive or a directory"),
            });
        }
        let compression = Compression::detect(&head);
        let mut src = Source::Tar {
            path: path.to_path_buf(),
            compression,
            items: HashMap::new(),
        };
        let mut items = HashMap::new();
        let mut budget = CACHE_BUDGET;
        let mut seen = 0u64;
        src.scan(&mut |name, etype, size, link, r| {
            seen += 1;
            let depth = name.matches('/').count();
            if depth > 1 && !name.starts_with("blobs/") {
                return Ok(true);
            }
            let item = match etype {
                EntryType::Regular | EntryType::Continuous => {
                    let mut data = None;
                    if size <= SMALL && size <= budget {
                        let mut v = Vec::with_capacity(size as usize);
                        r.read_to_end(&mut v).map_err(|e| not_tar(path, e))?;
                        if worth_keeping(name, &v) {
                            budget -= size;
                            data = Some(v);
                        }
                    }
                    Item::File { size, data }
                }
                EntryType::Symlink => Item::Symlink(link.unwrap_or_default()),
                EntryType::Link => Item::Hardlink(link.unwrap_or_default()),
                _ => Item::Other,
            };
            items.insert(name.to_string(), item);
            Ok(true)
        })
        .map_err(|e| match e {
            ImageError::Malformed { reason, .. } => not_tar(path, reason),
            e => e,
        })?;
        if seen == 0 {
            return Err(not_tar(path, "no entries"));
        }
        if let Source::Tar { items: i, .. } = &mut src {
            *i = items;
        }
        Ok(src)
    }

    /// The path the source was opened from.
    pub fn path(&self) -> &Path {
        match self {
            Source::Dir(p) | Source::Tar { path: p, .. } => p,
        }
    }

    /// Whether the source is a tar file.
    pub fn is_tar(&self) -> bool {
        matches!(self, Source::Tar { .. })
    }

    /// The names a tar's listing kept (at most two deep, and `blobs/…`);
    /// none for a directory.
    pub fn names(&self) -> Vec<&str> {
        match self {
            Source::Dir(_) => Vec::new(),
            Source::Tar { items, .. } => items.keys().map(String::as_str).collect(),
        }
    }

    /// Whether a file of this name is there (through links, in a tar).
    pub fn has(&self, name: &str) -> bool {
        match self {
            Source::Dir(d) => norm(Path::new(name)).is_some_and(|n| d.join(n).is_file()),
            Source::Tar { .. } => self.resolve(name).is_some(),
        }
    }

    /// Follow links inside a tar to the regular file a name stands for.
    fn resolve(&self, name: &str) -> Option<String> {
        let Source::Tar { items, .. } = self else {
            return None;
        };
        let mut n = norm(Path::new(name))?;
        for _ in 0..MAX_HOPS {
            match items.get(&n)? {
                Item::File { .. } => return Some(n),
                Item::Symlink(t) => {
                    let dir = Path::new(&n).parent().unwrap_or(Path::new(""));
                    n = norm(&dir.join(t))?;
                }
                Item::Hardlink(t) => n = norm(Path::new(t))?,
                Item::Other => return None,
            }
        }
        None
    }

    /// The size of a tar entry or a file of a directory.
    pub fn size_of(&self, name: &str) -> Option<u64> {
        match self {
            Source::Dir(d) => {
                let n = norm(Path::new(name))?;
                std::fs::metadata(d.join(n)).ok().map(|m| m.len())
            }
            Source::Tar { items, .. } => match items.get(&self.resolve(name)?)? {
                Item::File { size, .. } => Some(*size),
                _ => None,
            },
        }
    }

    fn describe(&self, name: &str) -> String {
        format!("{name} in {}", self.path().display())
    }

    fn missing(&self, name: &str, digest: &str) -> ImageError {
        ImageError::MissingBlob {
            what: format!("{} (no {name})", self.path().display()),
            digest: digest.to_string(),
        }
    }

    /// Read a small file (a document) whole.
    pub fn read_small(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let too_big = |size: u64| ImageError::Malformed {
            what: self.describe(name),
            reason: format!("{size} bytes is too big for a manifest or config"),
        };
        match self {
            Source::Dir(d) => {
                let n = norm(Path::new(name)).ok_or_else(|| self.missing(name, "?"))?;
                let p = d.join(n);
                let f = File::open(&p).map_err(io_err(format!("reading {}", p.display())))?;
                let mut v = Vec::new();
                f.take(MAX_DOCUMENT + 1)
                    .read_to_end(&mut v)
                    .map_err(io_err(format!("reading {}", p.display())))?;
                if v.len() as u64 > MAX_DOCUMENT {
                    return Err(too_big(v.len() as u64));
                }
                Ok(v)
            }
            Source::Tar { items, .. } => {
                let n = self.resolve(name).ok_or_else(|| self.missing(name, "?"))?;
                match items.get(&n) {
                    Some(Item::File { data: Some(d), .. }) => return Ok(d.clone()),
                    Some(Item::File { size, .. }) if *size > MAX_DOCUMENT => {
                        return Err(too_big(*size))
                    }
                    _ => {}
                }
                // Not kept by the listing: one more pass for it.
                let mut out = None;
                self.scan(&mut |en, _, _, _, r| {
                    if en != n {
                        return Ok(true);
                    }
                    let mut v = Vec::new();
                    r.read_to_end(&mut v).map_err(io_err(self.describe(name)))?;
                    out = Some(v);
                    Ok(false)
                })?;
                out.ok_or_else(|| self.missing(name, "?"))
            }
        }
    }

    /// Copy blobs into the store, each verified against its digest. Blobs
    /// already there are not read.
    pub fn copy(
        &self,
        wanted: &[Wanted],
        store: &BlobStore,
        progress: &dyn Progress,
    ) -> Result<(), ImageError> {
        let mut todo: HashMap<String, &Wanted> = HashMap::new();
        for w in wanted {
            if store.has(&w.digest) {
                progress.event(ProgressEvent::Cached {
                    item: w.digest.clone(),
                });
                continue;
            }
            match self {
                Source::Dir(d) => {
                    let n =
                        norm(Path::new(&w.name)).ok_or_else(|| self.missing(&w.name, &w.digest))?;
                    let p = d.join(n);
                    let f = File::open(&p).map_err(|e| match e.kind() {
                        io::ErrorKind::NotFound => self.missing(&w.name, &w.digest),
                        _ => io_err(format!("reading {}", p.display()))(e),
                    })?;
                    put(store, w, f, progress).map_err(blob_err(self.describe(&w.name)))?;
                }
                Source::Tar { .. } => {
                    let n = self
                        .resolve(&w.name)
                        .ok_or_else(|| self.missing(&w.name, &w.digest))?;
                    todo.entry(n).or_insert(w);
                }
            }
        }
        if todo.is_empty() {
            return Ok(());
        }
        self.scan(&mut |name, _, _, _, r| {
            if let Some(w) = todo.get(name) {
                put(store, w, r, progress).map_err(blob_err(self.describe(name)))?;
            }
            Ok(true)
        })?;
        for w in wanted {
            if !store.has(&w.digest) {
                return Err(self.missing(&w.name, &w.digest));
            }
        }
        Ok(())
    }

    /// Hash a whole tar file (for a rootfs tarball, the layer blob itself).
    pub fn digest_file(&self, progress: &dyn Progress) -> Result<(String, u64), ImageError> {
        use sha2::{Digest as _, Sha256};
        let p = self.path();
        let f = File::open(p).map_err(io_err(format!("opening {}", p.display())))?;
        let mut h = Sha256::new();
        let mut r = Counting::new(f, p.display().to_string(), None, progress);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = r
                .read(&mut buf)
                .map_err(io_err(format!("reading {}", p.display())))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok((format!("sha256:{:x}", h.finalize()), r.done))
    }

    /// One pass over a tar's entries; `f` gets the normalized name, type,
    /// size, link target and the data, and returns whether to go on.
    #[allow(clippy::type_complexity)]
    fn scan(
        &self,
        f: &mut dyn FnMut(
            &str,
            EntryType,
            u64,
            Option<String>,
            &mut dyn Read,
        ) -> Result<bool, ImageError>,
    ) -> Result<(), ImageError> {
        let Source::Tar {
            path, compression, ..
        } = self
        else {
            return Ok(());
        };
        let file = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
        // Buffered (a seek drops the buffer, so skipping still seeks).
        let file = io::BufReader::with_capacity(1 << 20, file);
        let malformed = |e: io::Error| ImageError::Malformed {
            what: path.display().to_string(),
            reason: e.to_string(),
        };
        if *compression == Compression::None {
            let mut ar = tar::Archive::new(file);
            let entries = ar.entries_with_seek().map_err(malformed)?;
            scan_entries(entries, f, &malformed)
        } else {
            let mut ar = tar::Archive::new(decompress(file, *compression).map_err(malformed)?);
            let entries = ar.entries().map_err(malformed)?;
            scan_entries(entries, f, &malformed)
        }
    }
}

#[allow(clippy::type_complexity)]
fn scan_entries<R: Read>(
    entries: tar::Entries<'_, R>,
    f: &mut dyn FnMut(
        &str,
        EntryType,
        u64,
        Option<String>,
        &mut dyn Read,
    ) -> Result<bool, ImageError>,
    malformed: &dyn Fn(io::Error) -> ImageError,
) -> Result<(), ImageError> {
    for e in entries {
        let mut e = e.map_err(malformed)?;
        let Some(name) = e.path().ok().and_then(|p| norm(&p)) else {
            continue;
        };
        let link = e
            .link_name()
            .ok()
            .flatten()
            .map(|l| l.to_string_lossy().into_owned());
        let etype = e.header().entry_type();
        let size = e.size();
        if !f(&name, etype, size, link, &mut e)? {
            break;
        }
    }
    Ok(())
}

fn put(
    store: &BlobStore,
    w: &Wanted,
    r: impl Read,
    progress: &dyn Progress,
) -> Result<u64, crate::blobs::BlobError> {
    store.put(
        &w.digest,
        w.size,
        Counting::new(r, w.digest.clone(), w.size, progress),
    )
}

/// A reader that reports progress every [`Counting::EVERY`] bytes and at
/// the end.
pub struct Counting<'a, R> {
    inner: R,
    item: String,
    total: Option<u64>,
    pub done: u64,
    last: u64,
    progress: &'a dyn Progress,
}

impl<'a, R> Counting<'a, R> {
    const EVERY: u64 = 16 << 20;

    pub fn new(inner: R, item: String, total: Option<u64>, progress: &'a dyn Progress) -> Self {
        Counting {
            inner,
            item,
            total,
            done: 0,
            last: 0,
            progress,
        }
    }

    fn report(&mut self) {
        self.last = self.done;
        self.progress.event(ProgressEvent::Bytes {
            item: self.item.clone(),
            done: self.done,
            total: self.total,
        });
    }
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if (n == 0 && self.last != self.done) || self.done - self.last >= Self::EVERY {
            self.report();
        }
        Ok(n)
    }
}
