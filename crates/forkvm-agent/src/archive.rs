//! The `put_archive` request: extract a tar stream (see
//! [`forkvm_agent_protocol::tar`]) under a destination directory. This is
//! how a Dockerfile's `COPY`/`ADD` put files into a build sandbox, in images
//! that may have no tar, shell or anything else.
//!
//! # What is written
//!
//! Regular files, directories, symlinks, hard links (to entries extracted
//! earlier under the same destination, in this request or an earlier one),
//! character and block devices and FIFOs, with their permission bits
//! (setuid, setgid and sticky included) and modification times. The owner is
//! the request's `owner` for every entry, or else the numeric uid and gid of
//! each header (user and group names in headers are ignored). Directories
//! the request has to create (the destination, missing parents) get mode
//! 0755 and that owner too (root without one).
//!
//! An existing file, symlink or device in an entry's place is replaced; an
//! existing directory is kept for a directory entry (its mode, owner and
//! mtime are set from the entry) and is an error for any other kind. An
//! existing symlink in a directory entry's place is kept if it leads to a
//! directory inside the destination (made if missing; the entry's metadata
//! is then not applied). The `./` entry (the destination itself) is
//! counted but changes nothing.
//!
//! Directory mtimes are set after all entries of the request are written
//! (writing into a directory changes its mtime); a later request that adds
//! to the same directory changes it again.
//!
//! # Path safety
//!
//! The whole archive is parsed and every path checked before anything is
//! written, so a corrupt archive or a bad path changes nothing. Then:
//!
//! * an entry path (or hard link target) with a `..` component is refused;
//!   a leading `/` is dropped, so absolute paths land under the destination;
//! * parents are walked one component at a time from the destination with
//!   `O_NOFOLLOW`. A symlink met on the way is followed only if it resolves
//!   inside the destination (relative targets from where the link is,
//!   absolute ones against the guest root and then checked to lie below the
//!   destination's real path); any other is an error, as is a chain of more
//!   than 40 symlinks;
//! * the last component is never followed: files are created with
//!   `O_CREAT | O_EXCL | O_NOFOLLOW` after the old entry is removed, and
//!   ownership, modes and times are set on the new file itself.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::Path;

use forkvm_agent_protocol::tar::{self, Entry, Kind};
use forkvm_agent_protocol::{ERR_INVALID, ERR_IO, ERR_NOT_FOUND};

use crate::at::{self, file_type};
use crate::serve::ReqError;
use crate::users;

/// Symlinks followed while resolving one path, as the kernel's limit.
const MAX_SYMLINKS: u32 = 40;

/// What a request wrote (the fields of `ArchiveWritten`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub entries: u64,
    pub bytes: u64,
}

/// A decoded `put_archive` request.
pub struct Request<'a> {
    pub dest: &'a str,
    pub owner: Option<&'a str>,
    pub append_at: Option<u64>,
    pub archive: &'a [u8],
}

fn invalid(message: String) -> ReqError {
    ReqError {
        code: ERR_INVALID,
        message,
    }
}

fn io_err(what: &str, path: &str, e: &io::Error) -> ReqError {
    ReqError {
        code: if e.kind() == io::ErrorKind::NotFound {
            ERR_NOT_FOUND
        } else {
            ERR_IO
        },
        message: format!("cannot {what} {path}: {e}"),
    }
}

fn show(comps: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&comps.join(&b'/')).into_owned()
}

/// The components of an archive path: empty and `.` ones dropped (so a
/// leading `/` is too); `..` refused.
fn components(raw: &[u8]) -> Result<Vec<Vec<u8>>, ReqError> {
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(invalid(format!(
                "archive entry {} has a '..' component; refusing to write outside the destination",
                String::from_utf8_lossy(raw)
            )))
            }
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

/// The components of a symlink target, `..` kept.
fn link_components(raw: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    raw.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
}

/// An absolute path with `.` and `..` resolved lexically (`..` stops at /).
fn lexical(raw: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for c in link_components(raw) {
        if c == b".." {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out
}

fn id32(v: u64, what: &str, entry: &str) -> Result<u32, ReqError> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v != u32::MAX)
        .ok_or_else(|| {
            invalid(format!(
                "archive entry {entry} has {what} {v}, out of range"
            ))
        })
}

/// Extract `req.archive` under `req.dest`, resolving `owner` against `etc`.
pub fn put_archive(req: &Request<'_>, etc: &Path) -> Result<Summary, ReqError> {
    let owner = match req.owner {
        Some(o) => {
            let c = users::resolve(o, etc)?;
            Some((c.uid, c.gid))
        }
        None => None,
    };
    let entries: Vec<Entry> = tar::entries(req.archive)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(e.to_string()))?;
    // Check every path before anything is written.
    let mut plan = Vec::with_capacity(entries.len());
    for e in &entries {
        let comps = components(&e.path)?;
        let link = match e.kind {
            Kind::HardLink => {
                let l = components(&e.link)?;
                if l.is_empty() {
                    return Err(invalid(format!(
                        "hard link {} has no target",
                        String::from_utf8_lossy(&e.path)
                    )));
                }
                l
            }
            _ => Vec::new(),
        };
        plan.push((e, comps, link));
    }
    if req.append_at.is_some() && !(entries.len() == 1 && entries[0].kind == Kind::File) {
        return Err(invalid(
            "append_at needs an archive of exactly one regular file".into(),
        ));
    }
    let mut dest = Dest::open(req.dest, owner)?;
    let mut summary = Summary::default();
    let mut dirs = Vec::new();
    for (e, comps, link) in plan {
        let ids = match owner {
            Some(ids) => ids,
            None => {
                let p = show(&comps);
                (id32(e.uid, "uid", &p)?, id32(e.gid, "gid", &p)?)
            }
        };
        let x = Extract {
            e,
            comps: &comps,
            link: &link,
            ids,
            archive: req.archive,
        };
        summary.bytes += dest.extract(&x, req.append_at, &mut dirs)?;
        summary.entries += 1;
    }
    // Deepest last in archive order is fine: setting a directory's times
    // does not touch its parent's.
    for (comps, sec, nsec) in dirs {
        if let Ok(fd) = dest.dir(&comps, false, &show(&comps)) {
            let _ = at::set_times_at(fd.as_fd(), None, sec, nsec);
        }
    }
    Ok(summary)
}

/// One entry to write.
struct Extract<'a> {
    e: &'a Entry,
    comps: &'a [Vec<u8>],
    link: &'a [Vec<u8>],
    ids: (u32, u32),
    archive: &'a [u8],
}

/// The open destination.
struct Dest {
    fd: OwnedFd,
    /// Its canonical path, as components (empty for /).
    real: Vec<Vec<u8>>,
    shown: String,
    /// Owner of the directories this request creates.
    owner: Option<(u32, u32)>,
    /// The last parent resolved, reused by the next entry in the same place.
    cache: Option<(Vec<Vec<u8>>, OwnedFd)>,
}

impl Dest {
    /// Open `dest`, creating it and its missing parents.
    fn open(dest: &str, owner: Option<(u32, u32)>) -> Result<Dest, ReqError> {
        let path = Path::new(dest);
        if !path.is_absolute() || dest.contains('\0') {
            return Err(invalid(format!(
                "destination must be an absolute path: {dest:?}"
            )));
        }
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(invalid(format!(
                    "destination {dest} exists and is not a directory"
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => create_missing(path, owner)?,
            Err(e) => return Err(io_err("access", dest, &e)),
        }
        let real = std::fs::canonicalize(path).map_err(|e| io_err("resolve", dest, &e))?;
        let fd = at::open_dir(&real).map_err(|e| io_err("open", dest, &e))?;
        Ok(Dest {
            fd,
            real: lexical(real.as_os_str().as_bytes()),
            shown: dest.to_string(),
            owner,
            cache: None,
        })
    }

    fn root(&self) -> Result<OwnedFd, ReqError> {
        self.fd
            .try_clone()
            .map_err(|e| io_err("open", &self.shown, &e))
    }

    /// Resolve `comps` (relative to the destination) to a directory,
    /// following only symlinks that stay inside it; with `create`, make
    /// missing directories. `entry` names the archive entry for errors.
    fn dir(&self, comps: &[Vec<u8>], create: bool, entry: &str) -> Result<OwnedFd, ReqError> {
        let mut queue: VecDeque<Vec<u8>> = comps.iter().cloned().collect();
        let mut cur: Vec<Vec<u8>> = Vec::new();
        let mut fd = self.root()?;
        let mut links = 0;
        let mut steps = 0usize;
        while let Some(c) = queue.pop_front() {
            steps += 1;
            if steps > 100_000 {
                return Err(invalid(format!(
                    "archive entry {entry}: the path keeps changing while it is resolved"
                )));
            }
            let here = || show(&[cur.as_slice(), std::slice::from_ref(&c)].concat());
            if c == b".." {
                // Only symlink targets have these (entry paths were checked).
                if cur.pop().is_none() && !self.real.is_empty() {
                    return Err(invalid(format!(
                        "archive entry {entry}: a symlink on its path leads out of {}; refusing to write through it",
                        self.shown
                    )));
                }
                // `cur` holds no symlinks, so walking it again is exact.
                for x in cur.drain(..).rev() {
                    queue.push_front(x);
                }
                fd = self.root()?;
                continue;
            }
            match at::open_dir_at(fd.as_fd(), &c) {
                Ok(next) => {
                    fd = next;
                    cur.push(c);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                    match at::mkdir_at(fd.as_fd(), &c, 0o755) {
                        Ok(()) => {
                            if let Some((u, g)) = self.owner {
                                at::chown_at(fd.as_fd(), &c, u, g)
                                    .map_err(|e| io_err("chown", &here(), &e))?;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io_err("create directory", &here(), &e)),
                    }
                    queue.push_front(c);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(ReqError {
                        code: ERR_NOT_FOUND,
                        message: format!(
                            "archive entry {entry}: {} does not exist under {}",
                            here(),
                            self.shown
                        ),
                    })
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                    let st =
                        at::lstat_at(fd.as_fd(), &c).map_err(|e| io_err("stat", &here(), &e))?;
                    if st.is_none_or(|st| file_type(&st) != libc::S_IFLNK) {
                        return Err(invalid(format!(
                            "archive entry {entry}: {} is not a directory",
                            here()
                        )));
                    }
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(invalid(format!(
                            "archive entry {entry}: too many levels of symlinks"
                        )));
                    }
                    let target = at::readlink_at(fd.as_fd(), &c)
                        .map_err(|e| io_err("read link", &here(), &e))?;
                    if target.starts_with(b"/") {
                        let abs = lexical(&target);
                        let Some(rest) = abs.strip_prefix(self.real.as_slice()) else {
                            return Err(invalid(format!(
                                "archive entry {entry}: {} is a symlink to {}, which leads out of {}; refusing to write through it",
                                here(),
                                String::from_utf8_lossy(&target),
                                self.shown
                            )));
                        };
                        for x in rest.iter().rev() {
                            queue.push_front(x.clone());
                        }
                        cur.clear();
                        fd = self.root()?;
                    } else {
                        for x in link_components(&target).rev() {
                            queue.push_front(x);
                        }
                    }
                }
                Err(e) => return Err(io_err("open", &here(), &e)),
            }
        }
        Ok(fd)
    }

    /// The parent directory for an entry, created if missing.
    fn parent(&mut self, comps: &[Vec<u8>], entry: &str) -> Result<OwnedFd, ReqError> {
        if let Some((c, fd)) = &self.cache {
            if c.as_slice() == comps {
                return fd.try_clone().map_err(|e| io_err("open", entry, &e));
            }
        }
        let fd = self.dir(comps, true, entry)?;
        let copy = fd.try_clone().map_err(|e| io_err("open", entry, &e))?;
        self.cache = Some((comps.to_vec(), copy));
        Ok(fd)
    }

    /// Make room for a new non-directory `name`: remove what is there
    /// unless it is a directory.
    fn clear(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        existing: Option<&libc::stat>,
        entry: &str,
    ) -> Result<(), ReqError> {
        let Some(st) = existing else {
            return Ok(());
        };
        if file_type(st) == libc::S_IFDIR {
            return Err(invalid(format!(
                "archive entry {entry} would replace a directory with a non-directory"
            )));
        }
        // Whatever was resolved through this name may be stale now.
        self.cache = None;
        at::unlink_at(parent, name, false).map_err(|e| io_err("remove", entry, &e))
    }

    /// Write one entry; returns the file bytes written.
    fn extract(
        &mut self,
        x: &Extract<'_>,
        append_at: Option<u64>,
        dirs: &mut Vec<(Vec<Vec<u8>>, i64, u32)>,
    ) -> Result<u64, ReqError> {
        let e = x.e;
        let entry = show(x.comps);
        let Some((name, parent_comps)) = x.comps.split_last() else {
            if e.kind == Kind::Dir {
                return Ok(0);
            }
            return Err(invalid(format!(
                "archive entry {} names the destination itself but is not a directory",
                String::from_utf8_lossy(&e.path)
            )));
        };
        let parent = self.parent(parent_comps, &entry)?;
        let p = parent.as_fd();
        let existing = at::lstat_at(p, name).map_err(|e| io_err("stat", &entry, &e))?;
        let (uid, gid) = x.ids;
        let mode = e.mode as libc::mode_t;
        let shown = entry.as_str();
        let meta_err = |what: &'static str| move |err: io::Error| io_err(what, shown, &err);
        match e.kind {
            Kind::Dir => {
                match existing.as_ref().map(file_type) {
                    Some(libc::S_IFDIR) => {}
                    Some(libc::S_IFLNK) => {
                        // Kept if it leads to a directory inside dest (made
                        // if missing, as for a parent).
                        self.dir(x.comps, true, &entry)?;
                        return Ok(0);
                    }
                    other => {
                        if other.is_some() {
                            self.clear(p, name, existing.as_ref(), &entry)?;
                        }
                        at::mkdir_at(p, name, 0o700).map_err(meta_err("create directory"))?;
                    }
                }
                let fd = at::open_dir_at(p, name).map_err(meta_err("open"))?;
                at::chown_chmod(fd.as_fd(), uid, gid, mode)
                    .map_err(meta_err("set owner and mode of"))?;
                dirs.push((x.comps.to_vec(), e.mtime, e.mtime_nsec));
                Ok(0)
            }
            Kind::File => {
                let data = e.data(x.archive);
                let f = match append_at {
                    None => {
                        self.clear(p, name, existing.as_ref(), &entry)?;
                        let mut f = at::create_file_at(p, name).map_err(meta_err("create"))?;
                        f.write_all(data).map_err(meta_err("write"))?;
                        f
                    }
                    Some(off) => {
                        let f =
                            at::open_write_at(p, name).map_err(meta_err("open for appending"))?;
                        let st = at::fstat(f.as_fd()).map_err(meta_err("stat"))?;
                        if file_type(&st) != libc::S_IFREG || st.st_size as u64 != off {
                            return Err(invalid(format!(
                                "cannot continue {entry} at byte {off}: it is {} bytes (parts sent out of order?)",
                                st.st_size
                            )));
                        }
                        f.write_all_at(data, off).map_err(meta_err("write"))?;
                        f
                    }
                };
                at::chown_chmod(f.as_fd(), uid, gid, mode)
                    .map_err(meta_err("set owner and mode of"))?;
                at::set_times_at(f.as_fd(), None, e.mtime, e.mtime_nsec)
                    .map_err(meta_err("set times of"))?;
                Ok(data.len() as u64)
            }
            Kind::Symlink => {
                self.clear(p, name, existing.as_ref(), &entry)?;
                at::symlink_at(&e.link, p, name).map_err(meta_err("create symlink"))?;
                at::chown_at(p, name, uid, gid).map_err(meta_err("set owner of"))?;
                at::set_times_at(p, Some(name), e.mtime, e.mtime_nsec)
                    .map_err(meta_err("set times of"))?;
                Ok(0)
            }
            Kind::HardLink => {
                let Some((tname, tparent)) = x.link.split_last() else {
                    return Err(invalid(format!("hard link {entry} has no target")));
                };
                let target = show(x.link);
                let tdir = self.dir(tparent, false, &entry)?;
                let tst =
                    at::lstat_at(tdir.as_fd(), tname).map_err(|e| io_err("stat", &target, &e))?;
                let Some(tst) = tst else {
                    return Err(ReqError {
                        code: ERR_NOT_FOUND,
                        message: format!(
                            "hard link {entry} points at {target}, which does not exist under {}",
                            self.shown
                        ),
                    });
                };
                if existing.is_some_and(|st| st.st_dev == tst.st_dev && st.st_ino == tst.st_ino) {
                    return Ok(0);
                }
                self.clear(p, name, existing.as_ref(), &entry)?;
                at::link_at(tdir.as_fd(), tname, p, name).map_err(meta_err("create hard link"))?;
                Ok(0)
            }
            Kind::CharDev | Kind::BlockDev | Kind::Fifo => {
                let (kind, dev) = match e.kind {
                    Kind::CharDev => (libc::S_IFCHR, libc::makedev(e.dev_major, e.dev_minor)),
                    Kind::BlockDev => (libc::S_IFBLK, libc::makedev(e.dev_major, e.dev_minor)),
                    _ => (libc::S_IFIFO, 0),
                };
                self.clear(p, name, existing.as_ref(), &entry)?;
                at::mknod_at(p, name, kind | 0o600, dev).map_err(meta_err("create"))?;
                at::chown_at(p, name, uid, gid).map_err(meta_err("set owner of"))?;
                at::chmod_at(p, name, mode).map_err(meta_err("set mode of"))?;
                at::set_times_at(p, Some(name), e.mtime, e.mtime_nsec)
                    .map_err(meta_err("set times of"))?;
                Ok(0)
            }
        }
    }
}

/// Create `path` and its missing parents, mode 0755, owned by `owner`.
fn create_missing(path: &Path, owner: Option<(u32, u32)>) -> Result<(), ReqError> {
    let mut missing = Vec::new();
    let mut p = path;
    while std::fs::symlink_metadata(p).is_err() {
        missing.push(p);
        match p.parent() {
            Some(up) => p = up,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        let shown = d.display().to_string();
        match std::fs::DirBuilder::new().mode(0o755).create(d) {
            Ok(()) => {
                if let Some((u, g)) = owner {
                    std::os::unix::fs::lchown(d, Some(u), Some(g))
                        .map_err(|e| io_err("chown", &shown, &e))?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create directory", &shown, &e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
