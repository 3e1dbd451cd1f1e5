//! `memory.head`: a diff snapshot's RAM as one flat file, built once.
//!
//! A diff snapshot's RAM is its chain's base image with every link's pages
//! laid over it (see [`crate::memdiff`]). Its clones map this file instead,
//! privately and read-only, exactly like a `shared` snapshot's `memory.img`:
//! no clone copies a link's page into its own memory, and siblings share the
//! chain's pages through the page cache.
//!
//! The head is a cache, not an artefact: it is not in the manifest, it is
//! derived from files that are, and it is deleted with its snapshot.
//!
//! ```text
//! <id>/memory.head         the base with every link applied, oldest first
//! <id>/memory.head.stamp   "<manifest sha256> <ino> <size> <mtime ns> <ctime ns>"
//! <id>/.memory.head.tmp    a head being built (or a crashed build): replaced
//! ```
//!
//! A head is built under the temporary name, made read-only and renamed
//! into place; only then is the stamp written (the same way). A head is used
//! only if its stamp names the snapshot's manifest digest, the kernel boot
//! it was built in, and the file's identity as it was built (any write,
//! truncation or replacement changes the inode, size, mtime or ctime), so a
//! half-written head, one from a build a crash interrupted before its stamp,
//! or one altered afterwards is rebuilt rather than used. Like the store's
//! verification cache, this trusts the file's identity, not its bytes.
//!
//! Why the boot id, and no fsync: a cache needs no durability, only never to
//! be trusted when incomplete. Within one boot the page cache is the truth,
//! whether or not the daemon crashed; a host crash can lose unwritten pages
//! of the head, but it also changes the boot id, so every head of the
//! previous boot is rebuilt. Fsyncing a 512 MiB guest's head took ~150 ms of
//! the ~350 ms its first spawn paid (bench/network, one child per branch
//! point). Where the boot id cannot be read, the head is fsynced as before.
//!
//! A branch that spawns children at once starts their head before its
//! snapshot exists ([`Prebuild`]): while the snapshot's files are compared,
//! written, hashed and fsynced, another thread copies the parent's view (its
//! base image, or its own usable head) into `.tmp-head-<id>` in the store's
//! root and lays the new pages over it; once the snapshot is published, the
//! file is renamed into its directory and stamped as above. The first child
//! then finds its head ready instead of copying the base itself (~45 ms of a
//! 512 MiB guest's spawn on ext4). A crash leaves the file to the store's
//! sweep of `.tmp-*`.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::memdiff::{MemDiff, MemDiffError, PAGE};

/// The head's file name in its snapshot's directory.
pub const HEAD: &str = "memory.head";
/// The stamp that makes a head usable.
pub const STAMP: &str = "memory.head.stamp";
/// The head being built.
pub const TMP: &str = ".memory.head.tmp";

/// `FICLONE` = `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// How the base went into a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseCopy {
    /// Reflinked: no data copied.
    Reflink,
    /// Its data extents copied, holes left as holes.
    Sparse,
}

/// What building a head did.
#[derive(Debug, Clone, Copy)]
pub struct Built {
    pub base: BaseCopy,
    /// Bytes of base data copied (0 for a reflink).
    pub base_bytes: u64,
    /// Link pages written (a page several links hold counts once per link).
    pub pages: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MemDiffError + '_ {
    move |source| MemDiffError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// This kernel boot's id, or None where it cannot be read.
fn boot_id() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn stamp_of(key: &str, boot: Option<&str>, m: &std::fs::Metadata) -> String {
    format!(
        "{key} {} {} {} {} {}\n",
        boot.unwrap_or("-"),
        m.ino(),
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    )
}

/// Is the head in `dir` complete, built for `key` (the snapshot's manifest
/// digest), and untouched since?
pub fn usable(dir: &Path, key: &str) -> bool {
    let (Ok(m), Ok(s)) = (
        std::fs::metadata(dir.join(HEAD)),
        std::fs::read_to_string(dir.join(STAMP)),
    ) else {
        return false;
    };
    s == stamp_of(key, boot_id().as_deref(), &m)
}

/// Build the head in `dir`: `base` with the diffs `links` (oldest first)
/// laid over it, `ram_bytes` long. Every link is checked (its header, its
/// RAM size, its length) before a page is written; on any error nothing
/// usable is left behind.
pub fn build(
    dir: &Path,
    key: &str,
    base: &Path,
    links: &[PathBuf],
    ram_bytes: u64,
) -> Result<Built, MemDiffError> {
    let stamp = dir.join(STAMP);
    // The stamp goes first: from here on, no head is usable until the new
    // one is complete.
    match std::fs::remove_file(&stamp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&stamp)(e)),
        _ => {}
    }
    let diffs = links
        .iter()
        .map(|l| MemDiff::open(l))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(d) = diffs.iter().find(|d| d.ram_bytes != ram_bytes) {
        return Err(MemDiffError::Format(format!(
            "{}: holds {} bytes of RAM, the snapshot has {ram_bytes}",
            d.path.display(),
            d.ram_bytes
        )));
    }
    let boot = boot_id();
    // Without a boot id in the stamp, only durability keeps a head that a
    // host crash cut short from being trusted.
    let durable = boot.is_none();
    let tmp = dir.join(TMP);
    let r = write_head(&tmp, base, &diffs, ram_bytes, durable);
    let built = match r {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    install(dir, key, &tmp, boot.as_deref())?;
    Ok(built)
}

/// Rename a complete head `tmp` into `dir` and stamp it (the stamp must be
/// gone already). Without a boot id, both renames are made durable.
fn install(dir: &Path, key: &str, tmp: &Path, boot: Option<&str>) -> Result<(), MemDiffError> {
    let (head, stamp) = (dir.join(HEAD), dir.join(STAMP));
    let durable = boot.is_none();
    std::fs::rename(tmp, &head).map_err(io(&head))?;
    if durable {
        sync_dir(dir)?;
    }
    let m = std::fs::metadata(&head).map_err(io(&head))?;
    let stmp = dir.join(format!("{TMP}.stamp"));
    {
        let f = File::create(&stmp).map_err(io(&stmp))?;
        f.write_all_at(stamp_of(key, boot, &m).as_bytes(), 0)
            .and_then(|_| if durable { f.sync_all() } else { Ok(()) })
            .map_err(io(&stmp))?;
    }
    std::fs::rename(&stmp, &stamp).map_err(io(&stamp))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// The name a head built ahead of snapshot `id` has in the store's root.
pub fn prebuild_name(id: &str) -> String {
    format!(".tmp-head-{id}")
}

/// A head started before its snapshot is published: the parent's view
/// copied, the new snapshot's pages laid over it, then [`Prebuild::adopt`]ed
/// into the published directory. Dropped without adopting, it removes its
/// file.
pub struct Prebuild {
    path: PathBuf,
    file: Option<File>,
    built: Built,
}

impl Prebuild {
    /// Copy `view` (the parent chain's mapped file: its base image, or its
    /// usable head) to `path`, `ram_bytes` long.
    pub fn start(path: &Path, view: &Path, ram_bytes: u64) -> Result<Prebuild, MemDiffError> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(path)(e)),
            _ => {}
        }
        // From here on, Drop removes the file whatever fails.
        let mut p = Prebuild {
            path: path.to_path_buf(),
            file: None,
            built: Built {
                base: BaseCopy::Sparse,
                base_bytes: 0,
                pages: 0,
            },
        };
        let (f, how, n) = clone_into(view, path)?;
        if f.metadata().map_err(io(path))?.len() != ram_bytes {
            f.set_len(ram_bytes).map_err(io(path))?;
        }
        p.built.base = how;
        p.built.base_bytes = n;
        p.file = Some(f);
        Ok(p)
    }

    /// Lay the new snapshot's pages (ascending, `data` in their order) over
    /// the copy.
    pub fn lay(&mut self, pages: &[u64], data: &[u8]) -> Result<(), MemDiffError> {
        let f = self
            .file
            .as_ref()
            .ok_or_else(|| MemDiffError::Format("the head being built has no file".into()))?;
        if data.len() as u64 != pages.len() as u64 * PAGE {
            return Err(MemDiffError::Format(format!(
                "{} pages but {} bytes of page data",
                pages.len(),
                data.len()
            )));
        }
        let len = f.metadata().map_err(io(&self.path))?.len();
        if let Some(&bad) = pages.iter().find(|&&p| p * PAGE >= len) {
            return Err(MemDiffError::Format(format!(
                "page {bad} is past the guest's RAM"
            )));
        }
        lay_pages(f, &self.path, pages, data)?;
        self.built.pages += pages.len() as u64;
        Ok(())
    }

    /// Make the head snapshot `dir`'s (manifest digest `key`): read-only
    /// (fsynced when there is no boot id), renamed in and stamped.
    pub fn adopt(mut self, dir: &Path, key: &str) -> Result<Built, MemDiffError> {
        let boot = boot_id();
        match std::fs::remove_file(dir.join(STAMP)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io(&dir.join(STAMP))(e))
            }
            _ => {}
        }
        if let Some(f) = self.file.take() {
            if boot.is_none() {
                f.sync_all().map_err(io(&self.path))?;
            }
        }
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o444))
            .map_err(io(&self.path))?;
        install(dir, key, &self.path, boot.as_deref())?;
        // Renamed away: nothing for Drop to remove.
        self.path = PathBuf::new();
        Ok(self.built)
    }
}

impl Drop for Prebuild {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Write `data` (pages in the order of `pages`) into `f`, runs of adjacent
/// pages in one write.
fn lay_pages(f: &File, path: &Path, pages: &[u64], data: &[u8]) -> Result<(), MemDiffError> {
    let pg = PAGE as usize;
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] == pages[j - 1] + 1 {
            j += 1;
        }
        f.write_all_at(&data[i * pg..j * pg], pages[i] * PAGE)
            .map_err(io(path))?;
        i = j;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), MemDiffError> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(io(dir))
}

/// Write the head under its temporary name, read-only (fsynced if
/// `durable`). A leftover of a crashed build is replaced.
fn write_head(
    tmp: &Path,
    base: &Path,
    diffs: &[MemDiff],
    ram_bytes: u64,
    durable: bool,
) -> Result<Built, MemDiffError> {
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(tmp)(e)),
        _ => {}
    }
    let (f, how, base_bytes) = clone_into(base, tmp)?;
    // The base may be shorter (a trailing hole); RAM past it reads zero.
    if f.metadata().map_err(io(tmp))?.len() != ram_bytes {
        f.set_len(ram_bytes).map_err(io(tmp))?;
    }
    let mut pages = 0;
    for d in diffs {
        let data = d.read_data()?;
        lay_pages(&f, tmp, &d.pages, &data)?;
        pages += d.pages.len() as u64;
    }
    if durable {
        f.sync_all().map_err(io(tmp))?;
    }
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o444)).map_err(io(tmp))?;
    Ok(Built {
        base: how,
        base_bytes,
        pages,
    })
}

/// Copy `src` to a new file `dst` sparsely: a reflink where the
/// filesystem can share extents, else its data extents copied (holes stay
/// holes). Returns how, and the bytes of data copied.
pub fn clone_file(src: &Path, dst: &Path) -> Result<(BaseCopy, u64), MemDiffError> {
    clone_into(src, dst).map(|(_, how, n)| (how, n))
}

fn clone_into(src: &Path, dst: &Path) -> Result<(File, BaseCopy, u64), MemDiffError> {
    let s = File::open(src).map_err(io(src))?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(io(dst))?;
    // SAFETY: FICLONE takes the source fd as its argument; both fds are ours.
    if unsafe { libc::ioctl(f.as_raw_fd(), FICLONE, s.as_raw_fd()) } == 0 {
        return Ok((f, BaseCopy::Reflink, 0));
    }
    let n = copy_extents(&s, &f).map_err(io(dst))?;
    Ok((f, BaseCopy::Sparse, n))
}

/// Copy the data extents of `src` into `dst` at the same offsets (holes
/// stay holes), in the kernel where it can. Returns the bytes copied.
fn copy_extents(src: &File, dst: &File) -> std::io::Result<u64> {
    let len = src.metadata()?.len();
    dst.set_len(len)?;
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    let mut pos: i64 = 0;
    let mut copied = 0u64;
    let mut buf = Vec::new();
    while (pos as u64) < len {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(s, pos, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no more data
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(s, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len as i64 } else { hole };
        let mut off = data;
        while off < end {
            let (mut so, mut doff) = (off, off);
            let want = (end - off) as usize;
            // SAFETY: both fds are ours; the offsets are ours to update.
            let n = unsafe { libc::copy_file_range(s, &mut so, d, &mut doff, want, 0) };
            let n = if n > 0 {
                n as u64
            } else {
                // Not supported here (or EOF races): copy through memory.
                buf.resize(want.min(2 << 20), 0);
                let n = want.min(buf.len());
                src.read_exact_at(&mut buf[..n], off as u64)?;
                dst.write_all_at(&buf[..n], off as u64)?;
                n as u64
            };
            off += n as i64;
            copied += n;
        }
        pos = end;
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memdiff::write;

    const RAM: u64 = 64 * PAGE;

    fn page(b: u8) -> Vec<u8> {
        vec![b; PAGE as usize]
    }

    /// A base whose pages 0..4 are 0xAA and 40..42 are 0xBB, the rest holes,
    /// and two links: the second overwrites a page of the first.
    fn chain(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
        let base = dir.join("memory.img");
        let f = File::create(&base).unwrap();
        f.set_len(RAM).unwrap();
        f.write_all_at(&vec![0xAA; 4 * PAGE as usize], 0).unwrap();
        f.write_all_at(&vec![0xBB; 2 * PAGE as usize], 40 * PAGE)
            .unwrap();
        let l1 = dir.join("l1");
        write(
            &l1,
            RAM,
            &[1, 2, 3, 50],
            &[page(1), page(1), page(1), page(1)].concat(),
        )
        .unwrap();
        let l2 = dir.join("l2");
        write(
            &l2,
            RAM,
            &[2, 41, 63],
            &[page(2), page(2), page(2)].concat(),
        )
        .unwrap();
        (base, vec![l1, l2])
    }

    fn pages_of(p: &Path) -> Vec<u8> {
        let b = std::fs::read(p).unwrap();
        b.chunks(PAGE as usize)
            .map(|c| {
                assert!(c.iter().all(|&x| x == c[0]), "a page of one byte value");
                c[0]
            })
            .collect()
    }

    #[test]
    fn applies_links_in_order_over_a_sparse_base() {
        let dir = tempfile::tempdir().unwrap();
        let (base, links) = chain(dir.path());
        let b = build(dir.path(), "k", &base, &links, RAM).unwrap();
        assert_eq!(b.pages, 7);
        let mut want = vec![0u8; 64];
        want[0] = 0xAA;
        want[1] = 1;
        want[2] = 2; // the newer link wins
        want[3] = 1;
        want[40] = 0xBB;
        want[41] = 2;
        want[50] = 1;
        want[63] = 2;
        let head = dir.path().join(HEAD);
        assert_eq!(pages_of(&head), want);
        // The same as the chain presents it, page by page.
        let v = crate::memdiff::ChainView::open(&base, &links).unwrap();
        let mut p = page(9);
        for i in 0..64 {
            v.page(i, &mut p).unwrap();
            assert_eq!(p[0], want[i as usize], "page {i}");
        }
        let m = std::fs::metadata(&head).unwrap();
        assert!(m.blocks() * 512 < RAM, "the holes stay holes");
        assert_eq!(m.mode() & 0o777, 0o444);
        assert!(usable(dir.path(), "k"));
        assert!(!usable(dir.path(), "another snapshot"));
    }

    /// A head built ahead of its snapshot is the same file `build` makes:
    /// the parent's view (here a head of the first link) with the new
    /// pages over it, usable once adopted.
    #[test]
    fn a_prebuilt_head_equals_a_built_one_and_is_usable_once_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let (base, links) = chain(dir.path());
        let parent = dir.path().join("parent");
        std::fs::create_dir(&parent).unwrap();
        build(&parent, "p", &base, &links[..1], RAM).unwrap();
        let l2 = MemDiff::open(&links[1]).unwrap();
        let data = l2.read_data().unwrap();

        let pre = dir.path().join(prebuild_name("sn-x"));
        let mut p = Prebuild::start(&pre, &parent.join(HEAD), RAM).unwrap();
        p.lay(&l2.pages, &data).unwrap();
        let snap = dir.path().join("sn-x");
        std::fs::create_dir(&snap).unwrap();
        assert!(!usable(&snap, "k"), "nothing usable before adoption");
        let b = p.adopt(&snap, "k").unwrap();
        assert_eq!(b.pages, 3);
        assert!(!pre.exists(), "renamed into the snapshot");
        assert!(usable(&snap, "k"));
        assert!(!usable(&snap, "another snapshot"));
        let m = std::fs::metadata(snap.join(HEAD)).unwrap();
        assert_eq!(m.mode() & 0o777, 0o444);

        let whole = dir.path().join("whole");
        std::fs::create_dir(&whole).unwrap();
        build(&whole, "k", &base, &links, RAM).unwrap();
        assert_eq!(
            pages_of(&snap.join(HEAD)),
            pages_of(&whole.join(HEAD)),
            "the same pages as a head built from the whole chain"
        );
    }

    #[test]
    fn a_prebuilt_head_refuses_bad_pages_and_leaves_nothing_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (base, _) = chain(dir.path());
        let pre = dir.path().join(prebuild_name("sn-y"));
        // A leftover of a crashed daemon is replaced.
        std::fs::write(&pre, b"leftover").unwrap();
        let mut p = Prebuild::start(&pre, &base, RAM).unwrap();
        assert_eq!(std::fs::metadata(&pre).unwrap().len(), RAM);
        assert!(p.lay(&[64], &page(1)).is_err(), "past the guest's RAM");
        assert!(p.lay(&[1, 2], &page(1)).is_err(), "short page data");
        drop(p);
        assert!(!pre.exists(), "a head never adopted is removed");
        // A view that cannot be read fails and leaves nothing either.
        assert!(Prebuild::start(&pre, &dir.path().join("missing"), RAM).is_err());
        assert!(!pre.exists());
    }

    #[test]
    fn a_short_base_reads_zero_past_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("memory.img");
        std::fs::write(&base, page(7)).unwrap();
        build(dir.path(), "k", &base, &[], RAM).unwrap();
        let got = pages_of(&dir.path().join(HEAD));
        assert_eq!(got.len(), 64);
        assert_eq!(got[0], 7);
        assert!(got[1..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_leftover_temp_file_is_replaced_and_never_used() {
        let dir = tempfile::tempdir().unwrap();
        let (base, links) = chain(dir.path());
        // A crashed build: a partial temp file, and no head.
        std::fs::write(dir.path().join(TMP), page(0xEE)).unwrap();
        assert!(!usable(dir.path(), "k"));
        build(dir.path(), "k", &base, &links, RAM).unwrap();
        assert!(!dir.path().join(TMP).exists());
        assert_eq!(pages_of(&dir.path().join(HEAD))[2], 2);
        assert!(usable(dir.path(), "k"));
    }

    #[test]
    fn a_head_without_its_stamp_or_changed_since_is_not_usable() {
        let dir = tempfile::tempdir().unwrap();
        let (base, links) = chain(dir.path());
        build(dir.path(), "k", &base, &links, RAM).unwrap();
        let head = dir.path().join(HEAD);
        // Altered after it was built: its mtime/ctime change.
        std::fs::set_permissions(&head, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
        File::options()
            .write(true)
            .open(&head)
            .unwrap()
            .write_all_at(&page(0), 2 * PAGE)
            .unwrap();
        assert!(!usable(dir.path(), "k"));
        // Rebuilt: usable again, with the right content.
        build(dir.path(), "k", &base, &links, RAM).unwrap();
        assert!(usable(dir.path(), "k"));
        assert_eq!(pages_of(&head)[2], 2);
        // A head whose stamp never got written (a crash in between).
        std::fs::remove_file(dir.path().join(STAMP)).unwrap();
        assert!(!usable(dir.path(), "k"));
    }

    #[test]
    fn a_head_stamped_in_another_boot_is_not_usable() {
        let dir = tempfile::tempdir().unwrap();
        let (base, links) = chain(dir.path());
        build(dir.path(), "k", &base, &links, RAM).unwrap();
        assert!(usable(dir.path(), "k"));
        let boot = boot_id().expect("this kernel has a boot id");
        let stamp = dir.path().join(STAMP);
        let s = std::fs::read_to_string(&stamp).unwrap();
        assert!(s.contains(&boot), "the stamp names this boot: {s}");
        // The same head, as if built before a host crash and reboot: its
        // pages may never have reached the disk.
        std::fs::write(
            &stamp,
            s.replace(&boot, "00000000-0000-0000-0000-000000000000"),
        )
        .unwrap();
        assert!(!usable(dir.path(), "k"));
    }

    #[test]
    fn a_corrupt_or_short_link_errors_and_leaves_no_usable_head() {
        let dir = tempfile::tempdir().unwrap();
        let (base, links) = chain(dir.path());
        build(dir.path(), "k", &base, &links, RAM).unwrap();
        // The second link loses its last byte.
        let b = std::fs::read(&links[1]).unwrap();
        std::fs::write(&links[1], &b[..b.len() - 1]).unwrap();
        let e = build(dir.path(), "k", &base, &links, RAM).unwrap_err();
        assert!(e.to_string().contains("promises"), "{e}");
        assert!(!usable(dir.path(), "k"), "the old stamp is gone");
        assert!(!dir.path().join(TMP).exists());
        // Garbage instead of a diff.
        std::fs::write(&links[1], [b'X'; 100]).unwrap();
        let e = build(dir.path(), "k", &base, &links, RAM).unwrap_err();
        assert!(e.to_string().contains("bad magic"), "{e}");
        // A link of another RAM size.
        write(&links[1], RAM * 2, &[0], &page(1)).unwrap();
        let e = build(dir.path(), "k", &base, &links, RAM).unwrap_err();
        assert!(e.to_string().contains("bytes of RAM"), "{e}");
        assert!(!usable(dir.path(), "k"));
    }
}
