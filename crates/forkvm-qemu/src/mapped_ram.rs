//! The RAM layout of a `mapped-ram` migration file, read and edited from
//! outside QEMU.
//!
//! With the `mapped-ram` capability, QEMU writes a migration to a file with
//! every RAM block's pages at fixed offsets, so pages dirtied again during a
//! live save overwrite their earlier copy instead of growing the stream. The
//! stream part of the file names each block and where its pages are:
//!
//! ```text
//! QEVM header, configuration section, then the RAM section's start:
//!   u8 0x01 (SECTION_START)  be32 section id  u8 3 "ram"  be32 instance  be32 version
//!   be64 total RAM bytes | 0x04 (RAM_SAVE_FLAG_MEM_SIZE)
//!   for each RAM block, until their lengths add up to the total:
//!     u8 idstr length, idstr
//!     be64 used length (bytes)
//!     mapped-ram header, 28 bytes, big-endian, packed:
//!       be32 version (1)   be64 page size (4096)
//!       be64 bitmap offset (always right after this header)
//!       be64 pages offset (bitmap end rounded up to 1 MiB)
//!     (the bitmap: one bit per page, set when the page is in the file; host
//!      `unsigned long` words, so on a little-endian host bit i is bit i % 8
//!      of byte i / 8; its length is the page count rounded up to 64 bits)
//!     (the pages: page i at pages offset + i * page size; holes elsewhere)
//!   the next block starts at pages offset + used length
//! then the rest of the stream: RAM section parts, device sections, EOF.
//! ```
//!
//! Loading reads exactly the pages whose bits are set and leaves every
//! other page of the destination's RAM as it is. (QEMU itself relies on
//! that: a zero page is never written, because fresh RAM is zero.) forkvm
//! uses it for a live save of a clone: the clone's changed pages move into
//! the snapshot's `memory.diff`, the RAM block's bitmap is cleared and its
//! pages punched out, and the snapshot's children load the file over the
//! chain's RAM, which they already map.
//!
//! This layout is written by a migration with `x-ignore-shared` and
//! `postcopy-ram` off (each adds a field to a block's record); forkvm's live
//! saves have both off. Every header is checked against where it was found
//! (its bitmap follows it) and against its block's length, so a stream that
//! is laid out otherwise is refused, not misread.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

pub const PAGE: u64 = 4096;
/// `RAM_SAVE_FLAG_MEM_SIZE`, in the low bits of the total RAM size.
const FLAG_MEM_SIZE: u64 = 0x04;
const HEADER_LEN: u64 = 28;
const HEADER_VERSION: u32 = 1;
/// `MAPPED_RAM_FILE_OFFSET_ALIGNMENT`.
const ALIGN: u64 = 1 << 20;
/// How far into the file the RAM section's start is looked for: it follows
/// the header and the configuration section (well under 1 KiB).
const SCAN: usize = 64 << 10;

/// One RAM block of a mapped-ram file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub idstr: String,
    pub used_length: u64,
    pub bitmap_offset: u64,
    pub pages_offset: u64,
}

fn bad(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap_or_default())
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap_or_default())
}

impl Block {
    pub fn pages(&self) -> u64 {
        self.used_length / PAGE
    }

    /// The bitmap's length in the file: whole 64-bit words.
    pub fn bitmap_len(&self) -> u64 {
        self.pages().div_ceil(64) * 8
    }

    /// The bitmap, one bit per page (see the module doc for the order).
    pub fn bitmap(&self, f: &File) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; self.bitmap_len() as usize];
        f.read_exact_at(&mut b, self.bitmap_offset)?;
        Ok(b)
    }

    /// Page `i` as the file holds it, or zeros for a page it does not hold.
    pub fn read_page(&self, f: &File, bitmap: &[u8], i: u64, out: &mut [u8]) -> io::Result<()> {
        if is_set(bitmap, i) {
            f.read_exact_at(out, self.pages_offset + i * PAGE)
        } else {
            out.fill(0);
            Ok(())
        }
    }

    /// Take every page of this block out of the file: the bitmap cleared
    /// (a load then leaves the destination's RAM as it is) and the page area
    /// punched out, so the file keeps its length and offsets but not the
    /// pages' space.
    pub fn clear(&self, f: &File) -> io::Result<()> {
        f.write_all_at(&vec![0u8; self.bitmap_len() as usize], self.bitmap_offset)?;
        // SAFETY: fallocate on an fd we own, with plain integer arguments.
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                self.pages_offset as libc::off_t,
                self.used_length as libc::off_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Is page `i` present in `bitmap`?
pub fn is_set(bitmap: &[u8], i: u64) -> bool {
    bitmap
        .get((i / 8) as usize)
        .is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// Where the RAM section starts: `SECTION_START`, an id, `"ram"`, and the
/// total size with the MEM_SIZE flag. Answers the offset of the first
/// block's record and the total.
fn ram_section(head: &[u8]) -> io::Result<(u64, u64)> {
    let mut p = 0;
    while p + 25 <= head.len() {
        if head[p] == 0x01 && head[p + 5] == 3 && &head[p + 6..p + 9] == b"ram" {
            let total = be64(&head[p + 17..]);
            if total & FLAG_MEM_SIZE != 0 {
                return Ok(((p + 25) as u64, total & !(PAGE - 1)));
            }
        }
        p += 1;
    }
    Err(bad(
        "no RAM section in the stream's first 64 KiB: not a mapped-ram migration file".into(),
    ))
}

/// Parse one block record at `at`; answers the block and where the next
/// record starts.
fn block_at(f: &File, at: u64) -> io::Result<(Block, u64)> {
    let mut b = [0u8; 1 + 255 + 8 + HEADER_LEN as usize];
    let n = f.read_at(&mut b, at)?;
    let b = &b[..n];
    let len = *b
        .first()
        .ok_or_else(|| bad(format!("the stream ends at {at}")))? as usize;
    if len == 0 || b.len() < 1 + len + 8 + HEADER_LEN as usize {
        return Err(bad(format!("a truncated RAM block record at {at}")));
    }
    let idstr = String::from_utf8_lossy(&b[1..1 + len]).into_owned();
    let used_length = be64(&b[1 + len..]);
    let h = &b[1 + len + 8..];
    let here = at + 1 + len as u64 + 8;
    let (version, page, bitmap_offset, pages_offset) =
        (be32(h), be64(&h[4..]), be64(&h[12..]), be64(&h[20..]));
    let block = Block {
        idstr,
        used_length,
        bitmap_offset,
        pages_offset,
    };
    if version != HEADER_VERSION {
        return Err(bad(format!(
            "RAM block {} has mapped-ram header version {version}; this forkvm reads version {HEADER_VERSION}",
            block.idstr
        )));
    }
    let want_pages = (bitmap_offset + block.bitmap_len()).div_ceil(ALIGN) * ALIGN;
    if page != PAGE
        || used_length % PAGE != 0
        || bitmap_offset != here + HEADER_LEN
        || pages_offset != want_pages
    {
        return Err(bad(format!(
            "RAM block {} at {at} does not have the mapped-ram layout forkvm reads \
             (page size {page}, length {used_length}, bitmap at {bitmap_offset}, pages at {pages_offset})",
            block.idstr
        )));
    }
    let next = pages_offset + used_length;
    Ok((block, next))
}

/// Every RAM block of a mapped-ram migration file, in stream order.
pub fn blocks(f: &File) -> io::Result<Vec<Block>> {
    let mut head = vec![0u8; SCAN];
    let n = f.read_at(&mut head, 0)?;
    head.truncate(n);
    let (mut at, total) = ram_section(&head)?;
    let mut out = Vec::new();
    let mut sum = 0u64;
    while sum < total {
        let (b, next) = block_at(f, at)?;
        sum += b.used_length;
        out.push(b);
        at = next;
    }
    if sum != total {
        return Err(bad(format!(
            "the RAM blocks add up to {sum} bytes, but the stream says {total}"
        )));
    }
    Ok(out)
}

/// The block of `ram_bytes` (the guest's RAM, whose size no ROM or
/// firmware block has).
pub fn guest_ram(f: &File, ram_bytes: u64) -> io::Result<Block> {
    let mut found = blocks(f)?
        .into_iter()
        .filter(|b| b.used_length == ram_bytes);
    match (found.next(), found.next()) {
        (Some(b), None) => Ok(b),
        (None, _) => Err(bad(format!(
            "the migration file has no RAM block of {ram_bytes} bytes"
        ))),
        _ => Err(bad(format!(
            "the migration file has more than one RAM block of {ram_bytes} bytes"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A synthetic mapped-ram file: a QEVM header and a configuration
    /// section, the RAM section's start, then `blocks` (name, pages, the
    /// pages present with their fill byte), laid out as QEMU lays them out.
    /// A block to lay out: its name, its pages, and the pages present with
    /// the byte each is filled with.
    type Spec<'a> = (&'a str, u64, &'a [(u64, u8)]);

    fn build(blocks: &[Spec]) -> (tempfile::NamedTempFile, Vec<Block>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let mut s = Vec::new();
        s.extend_from_slice(b"QEVM\0\0\0\x03");
        s.push(0x07);
        s.extend_from_slice(&7u32.to_be_bytes());
        s.extend_from_slice(b"microvm");
        s.push(0x01);
        s.extend_from_slice(&2u32.to_be_bytes());
        s.push(3);
        s.extend_from_slice(b"ram");
        s.extend_from_slice(&0u32.to_be_bytes());
        s.extend_from_slice(&4u32.to_be_bytes());
        let total: u64 = blocks.iter().map(|b| b.1 * PAGE).sum();
        s.extend_from_slice(&(total | FLAG_MEM_SIZE).to_be_bytes());
        f.write_all(&s).unwrap();
        let mut at = s.len() as u64;
        let mut out = Vec::new();
        for (name, pages, present) in blocks {
            let mut r = vec![name.len() as u8];
            r.extend_from_slice(name.as_bytes());
            r.extend_from_slice(&(pages * PAGE).to_be_bytes());
            let bitmap_offset = at + r.len() as u64 + HEADER_LEN;
            let b = Block {
                idstr: name.to_string(),
                used_length: pages * PAGE,
                bitmap_offset,
                pages_offset: (bitmap_offset + pages.div_ceil(64) * 8).div_ceil(ALIGN) * ALIGN,
            };
            r.extend_from_slice(&HEADER_VERSION.to_be_bytes());
            r.extend_from_slice(&PAGE.to_be_bytes());
            r.extend_from_slice(&b.bitmap_offset.to_be_bytes());
            r.extend_from_slice(&b.pages_offset.to_be_bytes());
            f.as_file().write_all_at(&r, at).unwrap();
            let mut bitmap = vec![0u8; b.bitmap_len() as usize];
            for (i, fill) in present.iter() {
                bitmap[(*i / 8) as usize] |= 1 << (i % 8);
                f.as_file()
                    .write_all_at(&[*fill; PAGE as usize], b.pages_offset + i * PAGE)
                    .unwrap();
            }
            f.as_file().write_all_at(&bitmap, b.bitmap_offset).unwrap();
            at = b.pages_offset + b.used_length;
            out.push(b);
        }
        // Device sections follow the last block.
        f.as_file().write_all_at(b"\x04devices\x1f", at).unwrap();
        (f, out)
    }

    #[test]
    fn finds_every_block_and_the_guest_ram() {
        let (f, want) = build(&[
            ("pc.bios", 32, &[(0, 0xb1)]),
            ("/objects/mem", 1024, &[(3, 0xaa), (700, 0xbb)]),
            ("vga.rom", 16, &[]),
        ]);
        assert_eq!(blocks(f.as_file()).unwrap(), want);
        let ram = guest_ram(f.as_file(), 1024 * PAGE).unwrap();
        assert_eq!(ram.idstr, "/objects/mem");
        let bm = ram.bitmap(f.as_file()).unwrap();
        assert_eq!(bm.len(), 128);
        let mut page = vec![0u8; PAGE as usize];
        ram.read_page(f.as_file(), &bm, 700, &mut page).unwrap();
        assert!(page.iter().all(|&b| b == 0xbb));
        ram.read_page(f.as_file(), &bm, 4, &mut page).unwrap();
        assert!(
            page.iter().all(|&b| b == 0),
            "an absent page reads as zeros"
        );
        assert!(guest_ram(f.as_file(), 5 * PAGE).is_err());
    }

    #[test]
    fn clear_empties_the_bitmap_and_frees_the_pages() {
        let (f, _) = build(&[
            ("pc.bios", 32, &[(0, 0xb1)]),
            ("/objects/mem", 2048, &[(1, 1), (2, 2), (2047, 3)]),
        ]);
        let len = f.as_file().metadata().unwrap().len();
        let ram = guest_ram(f.as_file(), 2048 * PAGE).unwrap();
        ram.clear(f.as_file()).unwrap();
        assert_eq!(
            f.as_file().metadata().unwrap().len(),
            len,
            "offsets stay valid"
        );
        let bm = ram.bitmap(f.as_file()).unwrap();
        assert!(bm.iter().all(|&b| b == 0));
        let mut page = vec![0xffu8; PAGE as usize];
        f.as_file()
            .read_exact_at(&mut page, ram.pages_offset + PAGE)
            .unwrap();
        assert!(page.iter().all(|&b| b == 0), "the page area is a hole");
        // The other block and the sections after the RAM are untouched.
        let bios = &blocks(f.as_file()).unwrap()[0];
        let bm = bios.bitmap(f.as_file()).unwrap();
        assert!(is_set(&bm, 0));
        let mut tail = [0u8; 9];
        f.as_file()
            .read_exact_at(&mut tail, ram.pages_offset + ram.used_length)
            .unwrap();
        assert_eq!(&tail, b"\x04devices\x1f");
    }

    /// Overwrite the (only) block's mapped-ram header at `at` (an offset
    /// into the header) with what `bytes` makes of the block; the error.
    fn corrupt_header(at: u64, bytes: impl Fn(&Block) -> Vec<u8>) -> io::Error {
        let (f, b) = build(&[("/objects/mem", 64, &[(0, 1)])]);
        f.as_file()
            .write_all_at(&bytes(&b[0]), b[0].bitmap_offset - HEADER_LEN + at)
            .unwrap();
        blocks(f.as_file()).unwrap_err()
    }

    #[test]
    fn refuses_a_stream_it_does_not_read() {
        // Not a mapped-ram stream at all.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"QEVM\0\0\0\x03\x07\0\0\0\x07microvm\x08")
            .unwrap();
        assert!(blocks(f.as_file())
            .unwrap_err()
            .to_string()
            .contains("no RAM section"));
        // A header version from the future.
        let e = corrupt_header(0, |_| 2u32.to_be_bytes().to_vec());
        assert!(e.to_string().contains("version 2"), "{e}");
        // A page size that is not 4 KiB.
        let e = corrupt_header(4, |_| 65536u64.to_be_bytes().to_vec());
        assert!(e.to_string().contains("page size 65536"), "{e}");
        // A bitmap that is not right after its header (another layout).
        let e = corrupt_header(12, |b| (b.bitmap_offset + 8).to_be_bytes().to_vec());
        assert!(e.to_string().contains("layout"), "{e}");
        // Pages not where the bitmap's end puts them.
        let e = corrupt_header(20, |b| (b.pages_offset + ALIGN).to_be_bytes().to_vec());
        assert!(e.to_string().contains("layout"), "{e}");
        // A total that the blocks do not add up to: the walk runs off the end.
        let (f, b) = build(&[("/objects/mem", 64, &[])]);
        let total_at = b[0].bitmap_offset - HEADER_LEN - 8 - 1 - "/objects/mem".len() as u64 - 8;
        f.as_file()
            .write_all_at(&((128 * PAGE) | FLAG_MEM_SIZE).to_be_bytes(), total_at)
            .unwrap();
        assert!(blocks(f.as_file()).is_err());
        // A file cut short inside a block record.
        let (f, b) = build(&[("/objects/mem", 64, &[])]);
        f.as_file().set_len(b[0].bitmap_offset - 10).unwrap();
        assert!(blocks(f.as_file()).is_err());
    }
}
