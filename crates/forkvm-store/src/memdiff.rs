//! `memory.diff`: the guest pages a diff snapshot changed, over its parent.
//!
//! A diff snapshot holds no memory image. Its RAM is its chain's base image
//! (the nearest ancestor with a `memory.img`) with the pages of every diff
//! link from the base down to it laid over, oldest first. Each link stores
//! only the pages whose content differs from its parent's view of RAM.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "FORKVMMD"
//!      8     4  format version, u32 little-endian (1)
//!     12     4  page size, u32 LE (4096)
//!     16     8  RAM size in bytes, u64 LE (a multiple of the page size)
//!     24     8  number of pages stored, u64 LE
//!     32    32  SHA-256 of bytes 0..32 followed by the bitmap
//!     64     B  bitmap: B = ceil(RAM pages / 8); page i is bit (i % 8) of
//!               byte (i / 8), set when the page is stored
//!      D     -  the stored pages, in ascending page order, where D is
//!               64 + B rounded up to a multiple of the page size
//! ```
//!
//! The file is exactly `D + pages * page size` long. The header checksum
//! covers the page list, so a flipped bit there is caught before any page
//! lands in the wrong place; the page data is covered by the manifest's
//! SHA-256 of the whole file, like every other artefact. Compatibility
//! follows the manifest's rule: a reader refuses a version it does not know.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub const MAGIC: [u8; 8] = *b"FORKVMMD";
pub const VERSION: u32 = 1;
pub const PAGE: u64 = 4096;
const HEADER: u64 = 64;

/// Errors reading a `memory.diff`.
#[derive(Debug, thiserror::Error)]
pub enum MemDiffError {
    #[error("{0}")]
    Format(String),
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MemDiffError + '_ {
    move |source| MemDiffError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn bitmap_len(ram_bytes: u64) -> u64 {
    (ram_bytes / PAGE).div_ceil(8)
}

fn data_offset(ram_bytes: u64) -> u64 {
    (HEADER + bitmap_len(ram_bytes)).div_ceil(PAGE) * PAGE
}

fn checksum(head: &[u8], bitmap: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(head);
    h.update(bitmap);
    h.finalize().into()
}

/// Write a diff of `pages` (ascending, unique page indices) whose contents
/// are `data`, in the same order. The caller fsyncs through the store.
pub fn write(path: &Path, ram_bytes: u64, pages: &[u64], data: &[u8]) -> Result<(), MemDiffError> {
    let bad = |m: String| Err(MemDiffError::Format(m));
    if ram_bytes == 0 || ram_bytes % PAGE != 0 {
        return bad(format!(
            "RAM size {ram_bytes} is not a whole number of pages"
        ));
    }
    if data.len() as u64 != pages.len() as u64 * PAGE {
        return bad("page data does not match the page list".into());
    }
    let n = ram_bytes / PAGE;
    let mut bitmap = vec![0u8; bitmap_len(ram_bytes) as usize];
    let mut last = None;
    for &p in pages {
        if p >= n || last.is_some_and(|l| p <= l) {
            return bad(format!("page {p} is out of order or outside RAM"));
        }
        bitmap[(p / 8) as usize] |= 1 << (p % 8);
        last = Some(p);
    }
    let mut head = Vec::with_capacity(HEADER as usize);
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(PAGE as u32).to_le_bytes());
    head.extend_from_slice(&ram_bytes.to_le_bytes());
    head.extend_from_slice(&(pages.len() as u64).to_le_bytes());
    let sum = checksum(&head, &bitmap);
    head.extend_from_slice(&sum);
    let mut f = File::create(path).map_err(io(path))?;
    f.write_all(&head).map_err(io(path))?;
    f.write_all(&bitmap).map_err(io(path))?;
    let pad = data_offset(ram_bytes) - HEADER - bitmap.len() as u64;
    f.write_all(&vec![0u8; pad as usize]).map_err(io(path))?;
    f.write_all(data).map_err(io(path))?;
    Ok(())
}

/// An opened, header-checked `memory.diff`.
#[derive(Debug, Clone)]
pub struct MemDiff {
    pub path: PathBuf,
    pub ram_bytes: u64,
    /// The stored pages, ascending.
    pub pages: Vec<u64>,
    data_offset: u64,
}

impl MemDiff {
    pub fn open(path: &Path) -> Result<MemDiff, MemDiffError> {
        let bad = |m: &str| MemDiffError::Format(format!("{}: {m}", path.display()));
        let f = File::open(path).map_err(io(path))?;
        let len = f.metadata().map_err(io(path))?.len();
        let mut head = [0u8; HEADER as usize];
        if len < HEADER {
            return Err(bad("shorter than its header"));
        }
        f.read_exact_at(&mut head, 0).map_err(io(path))?;
        if head[0..8] != MAGIC {
            return Err(bad("not a forkvm memory diff (bad magic)"));
        }
        let u32_at = |o: usize| u32::from_le_bytes(head[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().unwrap());
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(&format!(
                "format version {version}; this forkvm reads version {VERSION}"
            )));
        }
        if u64::from(u32_at(12)) != PAGE {
            return Err(bad("page size is not 4096"));
        }
        let ram_bytes = u64_at(16);
        let count = u64_at(24);
        if ram_bytes == 0 || ram_bytes % PAGE != 0 || ram_bytes > 1 << 46 {
            return Err(bad("implausible RAM size"));
        }
        let d = data_offset(ram_bytes);
        if count > ram_bytes / PAGE || len != d + count * PAGE {
            return Err(bad(&format!(
                "{len} bytes long, but the header promises {count} pages after offset {d}"
            )));
        }
        let mut bitmap = vec![0u8; bitmap_len(ram_bytes) as usize];
        f.read_exact_at(&mut bitmap, HEADER).map_err(io(path))?;
        if checksum(&head[..32], &bitmap)[..] != head[32..64] {
            return Err(bad("header checksum mismatch"));
        }
        let pages: Vec<u64> = (0..ram_bytes / PAGE)
            .filter(|&p| bitmap[(p / 8) as usize] & (1 << (p % 8)) != 0)
            .collect();
        if pages.len() as u64 != count {
            return Err(bad("page count does not match the bitmap"));
        }
        Ok(MemDiff {
            path: path.to_path_buf(),
            ram_bytes,
            pages,
            data_offset: d,
        })
    }

    /// All stored pages' contents, in the order of [`MemDiff::pages`].
    pub fn read_data(&self) -> Result<Vec<u8>, MemDiffError> {
        let mut buf = vec![0u8; self.pages.len() * PAGE as usize];
        File::open(&self.path)
            .and_then(|f| f.read_exact_at(&mut buf, self.data_offset))
            .map_err(io(&self.path))?;
        Ok(buf)
    }

    /// The content of page `page` if this diff stores it.
    fn page(&self, f: &File, page: u64, buf: &mut [u8]) -> std::io::Result<bool> {
        match self.pages.binary_search(&page) {
            Ok(rank) => {
                f.read_exact_at(buf, self.data_offset + rank as u64 * PAGE)?;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }
}

/// RAM as a chain presents it: a base image with diffs laid over it.
pub struct ChainView {
    base: File,
    base_path: PathBuf,
    /// Oldest first, with their open files.
    links: Vec<(MemDiff, File)>,
}

impl ChainView {
    /// `links` oldest first: the diff right above the base comes first.
    pub fn open(base: &Path, links: &[PathBuf]) -> Result<ChainView, MemDiffError> {
        let mut opened = Vec::new();
        for l in links {
            let d = MemDiff::open(l)?;
            let f = File::open(l).map_err(io(l))?;
            opened.push((d, f));
        }
        Ok(ChainView {
            base: File::open(base).map_err(io(base))?,
            base_path: base.to_path_buf(),
            links: opened,
        })
    }

    /// Read page `page` as the chain's head sees it.
    pub fn page(&self, page: u64, buf: &mut [u8]) -> Result<(), MemDiffError> {
        for (d, f) in self.links.iter().rev() {
            if d.page(f, page, buf).map_err(io(&d.path))? {
                return Ok(());
            }
        }
        // A page past the end of a sparse base reads short: it is zero.
        buf.fill(0);
        let mut off = 0;
        while off < buf.len() {
            let n = self
                .base
                .read_at(&mut buf[off..], page * PAGE + off as u64)
                .map_err(io(&self.base_path))?;
            if n == 0 {
                break;
            }
            off += n;
        }
        Ok(())
    }

    /// Keep only the pages of (`pages`, `data`) that differ from this view.
    pub fn changed(&self, pages: &[u64], data: &[u8]) -> Result<(Vec<u64>, Vec<u8>), MemDiffError> {
        let mut keep = Vec::new();
        let mut out = Vec::new();
        let mut old = vec![0u8; PAGE as usize];
        for (i, &p) in pages.iter().enumerate() {
            let new = &data[i * PAGE as usize..(i + 1) * PAGE as usize];
            self.page(p, &mut old)?;
            if old != new {
                keep.push(p);
                out.extend_from_slice(new);
            }
        }
        Ok((keep, out))
    }

    /// The links, oldest first.
    pub fn links(&self) -> impl Iterator<Item = &MemDiff> {
        self.links.iter().map(|(d, _)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAM: u64 = 40 * PAGE;

    fn page(b: u8) -> Vec<u8> {
        vec![b; PAGE as usize]
    }

    fn sample(dir: &Path) -> PathBuf {
        let p = dir.join("memory.diff");
        let mut data = page(1);
        data.extend(page(2));
        data.extend(page(3));
        write(&p, RAM, &[0, 9, 39], &data).unwrap();
        p
    }

    #[test]
    fn round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = sample(dir.path());
        let d = MemDiff::open(&p).unwrap();
        assert_eq!(d.pages, vec![0, 9, 39]);
        assert_eq!(d.ram_bytes, RAM);
        let data = d.read_data().unwrap();
        assert_eq!(data[0], 1);
        assert_eq!(data[PAGE as usize], 2);
        assert_eq!(data[2 * PAGE as usize], 3);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), PAGE + 3 * PAGE);
    }

    #[test]
    fn refuses_bad_input_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        assert!(write(&p, RAM, &[3, 2], &[page(0), page(0)].concat()).is_err());
        assert!(write(&p, RAM, &[40], &page(0)).is_err());
        assert!(write(&p, RAM, &[1], &[]).is_err());
        assert!(write(&p, RAM + 1, &[], &[]).is_err());
    }

    fn corrupt(f: impl Fn(&mut Vec<u8>)) -> String {
        let dir = tempfile::tempdir().unwrap();
        let p = sample(dir.path());
        let mut b = std::fs::read(&p).unwrap();
        f(&mut b);
        std::fs::write(&p, &b).unwrap();
        MemDiff::open(&p).unwrap_err().to_string()
    }

    #[test]
    fn catches_corruption() {
        assert!(corrupt(|b| b[0] = b'X').contains("bad magic"));
        assert!(corrupt(|b| b[8] = 2).contains("version 2"));
        assert!(corrupt(|b| b[13] = 0).contains("page size"));
        assert!(corrupt(|b| b[24] = 4).contains("promises 4 pages"));
        // A flipped bit in the page list: caught by the header checksum.
        assert!(corrupt(|b| b[HEADER as usize] ^= 2).contains("checksum"));
        assert!(corrupt(|b| b[40] ^= 1).contains("checksum"));
        assert!(corrupt(|b| b.truncate(b.len() - 1)).contains("promises"));
        assert!(corrupt(|b| b.truncate(10)).contains("shorter"));
        assert!(corrupt(|b| b.extend(page(0))).contains("promises"));
    }

    #[test]
    fn a_chain_lays_links_over_the_base_and_keeps_only_changes() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("memory.img");
        // A sparse base: pages 0..10 are 0xAA, the rest is a hole (zero).
        std::fs::write(&base, vec![0xAAu8; 10 * PAGE as usize]).unwrap();
        let l1 = dir.path().join("l1");
        write(&l1, RAM, &[1, 2], &[page(1), page(1)].concat()).unwrap();
        let l2 = dir.path().join("l2");
        write(&l2, RAM, &[2, 30], &[page(2), page(2)].concat()).unwrap();
        let v = ChainView::open(&base, &[l1, l2]).unwrap();
        let mut b = page(9);
        v.page(0, &mut b).unwrap();
        assert_eq!(b, page(0xAA));
        v.page(1, &mut b).unwrap();
        assert_eq!(b, page(1));
        v.page(2, &mut b).unwrap();
        assert_eq!(b, page(2), "the newer link wins");
        v.page(30, &mut b).unwrap();
        assert_eq!(b, page(2));
        v.page(31, &mut b).unwrap();
        assert_eq!(b, page(0), "past the base's end reads zero");
        // A clone that rewrote pages 0, 1 and 2 with what they held, and
        // changed 5: only 5 is a change.
        let (keep, data) = v
            .changed(
                &[0, 1, 2, 5],
                &[page(0xAA), page(1), page(2), page(7)].concat(),
            )
            .unwrap();
        assert_eq!(keep, vec![5]);
        assert_eq!(data, page(7));
    }
}
