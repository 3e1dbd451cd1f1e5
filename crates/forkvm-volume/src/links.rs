//! Keeping guest symlinks inside the volume when they move.
//!
//! A guest may create a relative symlink that climbs (`../../lib/x`) as
//! long as it stays inside the volume from where it is
//! ([`symlink_target_ok`]). How far it reaches depends on its depth, so
//! anything that makes a link shallower must look at the link again:
//!
//! * RENAME of a symlink: its target is checked at the new directory's
//!   depth, as if it were created there.
//! * RENAME of a directory to a shallower place: every symlink below it is
//!   checked at its new depth, by a bounded walk of the subtree
//!   ([`check_subtree`]). A move to the same depth or deeper needs no walk:
//!   each link only gets further from the root.
//! * `copy` trees check each link at its depth in the copy (see `copy`).
//!
//! Depths are measured on the host, by climbing `..` from a directory's fd
//! to the volume root ([`depth`]), never taken from the guest's idea of a
//! path.
//!
//! A check and the rename or symlink it allows must not be separated by
//! another guest's change: between a RENAME's look at what it moves and the
//! `renameat2`, a second guest thread could swap a regular file for a
//! climbing symlink, or create a link inside a directory already walked.
//! So SYMLINK and RENAME run under one lock per host directory served
//! ([`lock_for`]): children sharing a `shared` volume serve the same
//! directory and take the same lock. Host processes are trusted and not
//! locked out.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, Weak};

use crate::fs::{check, cpath, errno, fstat, Errno};
use crate::security::symlink_target_ok;

/// Most entries a directory move walks before giving up with `EXDEV`
/// (which `mv` and most tools answer by copying the tree entry by entry,
/// each symlink then checked where it is created).
pub const WALK_ENTRIES: usize = 65_536;
/// Deepest nesting walked (each level holds two fds open while below it).
pub const WALK_NESTING: usize = 128;
/// Most `..` steps [`depth`] climbs (deeper than any PATH_MAX path).
const MAX_DEPTH: usize = 4096;

type Ident = (u64, u64);

fn ident(st: &libc::stat) -> Ident {
    (st.st_dev, st.st_ino)
}

/// The lock guarding SYMLINK and RENAME in the host directory whose root
/// is `root` (one per directory, shared by every server of it).
pub fn lock_for(root: RawFd) -> Arc<Mutex<()>> {
    static LOCKS: Mutex<Vec<(Ident, Weak<Mutex<()>>)>> = Mutex::new(Vec::new());
    let id = fstat(root).map(|st| ident(&st)).unwrap_or((0, 0));
    let mut locks = LOCKS.lock().unwrap_or_else(|e| e.into_inner());
    locks.retain(|(_, w)| w.strong_count() > 0);
    if let Some(l) = locks
        .iter()
        .find(|(i, _)| *i == id)
        .and_then(|(_, w)| w.upgrade())
    {
        return l;
    }
    let l = Arc::new(Mutex::new(()));
    locks.push((id, Arc::downgrade(&l)));
    l
}

fn open_dir_at(dir: RawFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    let c = cpath(name)?;
    // SAFETY: NUL-terminated name below a directory fd we hold.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            // O_PATH: climbing or walking needs no read permission on
            // the directory (listing opens its own fd, see `read_dir`).
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(errno(&std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// How many directories `dir` is below the directory `root` (0 for the
/// root itself), found by climbing `..` on the host. `EXDEV` when `dir` is
/// not below `root` (the host moved it away).
pub fn depth(root: RawFd, dir: RawFd) -> Result<usize, Errno> {
    let want = ident(&fstat(root)?);
    let mut st = fstat(dir)?;
    if ident(&st) == want {
        return Ok(0);
    }
    let mut cur = open_dir_at(dir, b"..")?;
    for n in 1..=MAX_DEPTH {
        let up = fstat(cur.as_raw_fd())?;
        if ident(&up) == want {
            return Ok(n);
        }
        if ident(&up) == ident(&st) {
            // `/..` is `/`: the top, and the root was not on the way.
            return Err(libc::EXDEV);
        }
        st = up;
        cur = open_dir_at(cur.as_raw_fd(), b"..")?;
    }
    Err(libc::EXDEV)
}

/// The target of the symlink `name` in `dir`.
pub fn read_link_at(dir: RawFd, name: &OsStr) -> Result<Vec<u8>, Errno> {
    let c = cpath(name.as_bytes())?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for its length; NUL-terminated name.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check(n as libc::c_int)?;
    buf.truncate(n as usize);
    Ok(buf)
}

/// Why a subtree cannot move up.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A symlink (named, relative to the subtree) would leave the volume
    /// at its new depth: `EPERM`.
    Escapes(Vec<u8>),
    /// The subtree is larger than [`WALK_ENTRIES`] or deeper than
    /// [`WALK_NESTING`]: `EXDEV`, so the caller copies it instead.
    TooLarge,
    /// The walk itself failed.
    Io(Errno),
}

impl Refusal {
    pub fn errno(&self) -> Errno {
        match self {
            Refusal::Escapes(_) => libc::EPERM,
            Refusal::TooLarge => libc::EXDEV,
            Refusal::Io(e) => *e,
        }
    }
}

/// Checks every symlink below the directory `dir`, as if `dir` were at
/// depth `base` below the volume root: a link in `dir` itself is at depth
/// `base`, one in `dir/sub` at `base + 1`. Never follows a symlink.
pub fn check_subtree(dir: RawFd, base: usize) -> Result<(), Refusal> {
    let top = open_dir_at(dir, b".").map_err(Refusal::Io)?;
    let mut stack: Vec<(OwnedFd, std::fs::ReadDir, Vec<u8>)> = Vec::new();
    let rd = read_dir(&top).map_err(Refusal::Io)?;
    stack.push((top, rd, Vec::new()));
    let mut seen = 0usize;
    loop {
        let nesting = stack.len();
        let Some((fd, rd, path)) = stack.last_mut() else {
            return Ok(());
        };
        let Some(ent) = rd.next() else {
            stack.pop();
            continue;
        };
        let ent = ent.map_err(|e| Refusal::Io(errno(&e)))?;
        seen += 1;
        if seen > WALK_ENTRIES {
            return Err(Refusal::TooLarge);
        }
        let name = ent.file_name();
        let ft = ent.file_type().map_err(|e| Refusal::Io(errno(&e)))?;
        let mut child = path.clone();
        if !child.is_empty() {
            child.push(b'/');
        }
        child.extend_from_slice(name.as_bytes());
        // The depth of the directory the entry is in.
        let at = base + nesting - 1;
        if ft.is_symlink() {
            let target = read_link_at(fd.as_raw_fd(), &name).map_err(Refusal::Io)?;
            if !symlink_target_ok(at, OsStr::from_bytes(&target)) {
                return Err(Refusal::Escapes(child));
            }
        } else if ft.is_dir() {
            if nesting >= WALK_NESTING {
                return Err(Refusal::TooLarge);
            }
            let sub = open_dir_at(fd.as_raw_fd(), name.as_bytes()).map_err(Refusal::Io)?;
            let rd = read_dir(&sub).map_err(Refusal::Io)?;
            stack.push((sub, rd, child));
        }
    }
}

/// Lists a directory fd (through its /proc/self/fd entry, which names
/// exactly that inode).
fn read_dir(fd: &OwnedFd) -> Result<std::fs::ReadDir, Errno> {
    std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| errno(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        OwnedFd::from(fs::File::open(p).unwrap())
    }

    #[test]
    fn depth_climbs_to_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("vol");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        let r = dir_fd(&root);
        assert_eq!(depth(r.as_raw_fd(), r.as_raw_fd()), Ok(0));
        let c = dir_fd(&root.join("a/b/c"));
        assert_eq!(depth(r.as_raw_fd(), c.as_raw_fd()), Ok(3));
        // Moved away on the host: not below the root any more.
        fs::rename(root.join("a/b/c"), t.path().join("c")).unwrap();
        assert_eq!(depth(r.as_raw_fd(), c.as_raw_fd()), Err(libc::EXDEV));
    }

    #[test]
    fn subtree_walk_finds_links_that_would_leave() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        fs::create_dir_all(d.join("x/y")).unwrap();
        symlink("../../f", d.join("x/y/l")).unwrap();
        symlink("f", d.join("x/plain")).unwrap();
        let fd = dir_fd(&d);
        // d at depth 0: x/y/l sits at depth 2 and climbs 2: fine.
        assert_eq!(check_subtree(fd.as_raw_fd(), 0), Ok(()));
        symlink("../../../f", d.join("x/y/far")).unwrap();
        assert_eq!(
            check_subtree(fd.as_raw_fd(), 0),
            Err(Refusal::Escapes(b"x/y/far".to_vec()))
        );
        assert_eq!(check_subtree(fd.as_raw_fd(), 1), Ok(()));
    }

    #[test]
    fn subtree_walk_is_bounded() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        let mut p = d.clone();
        for _ in 0..WALK_NESTING + 1 {
            p.push("n");
        }
        fs::create_dir_all(&p).unwrap();
        let fd = dir_fd(&d);
        assert_eq!(check_subtree(fd.as_raw_fd(), 0), Err(Refusal::TooLarge));
        assert_eq!(Refusal::TooLarge.errno(), libc::EXDEV);
    }

    #[test]
    fn one_lock_per_directory() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("other")).unwrap();
        let (a, b) = (dir_fd(t.path()), dir_fd(t.path()));
        let c = dir_fd(&t.path().join("other"));
        let (la, lb, lc) = (
            lock_for(a.as_raw_fd()),
            lock_for(b.as_raw_fd()),
            lock_for(c.as_raw_fd()),
        );
        assert!(Arc::ptr_eq(&la, &lb));
        assert!(!Arc::ptr_eq(&la, &lc));
    }
}
