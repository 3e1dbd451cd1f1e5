//! One served volume: the root fd, the node table with its journal, the
//! cache of O_PATH fds per node and the open file handles.
//!
//! Every host path is resolved below the root fd with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`: a symlink, a `..` or a mount point anywhere in the
//! path fails the lookup instead of leaving the volume, even if the host
//! directory changes under us. Single names below an already-resolved
//! directory fd use the `*at` calls with `AT_SYMLINK_NOFOLLOW`.
//!
//! A cached O_PATH fd follows its inode, not its path: a rename by the
//! guest keeps it right, an unlinked node keeps working while this server
//! runs (fstat of an open unlinked file), and only a forgotten node is
//! evicted.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::journal::{Journal, Record};
use crate::security::{fh_decode, fh_encode, FH_DIR};
use crate::table::{Table, ROOT};
use crate::{VolumeConfig, VolumeError};

const RESOLVE_NO_XDEV: u64 = 0x01;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
const RESOLVE: u64 =
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/// A journal grows by one record per lookup (entries time out after 1 s,
/// so a busy guest looks names up again and again). Past this size it is
/// rewritten compacted, and again each time it has grown 4x since.
const COMPACT_AT: u64 = if cfg!(test) { 4096 } else { 16 << 20 };

/// How many O_PATH fds are kept; the oldest quarter goes when full.
const FD_CACHE: usize = 4096;

pub type Errno = i32;

pub fn errno(e: &io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

pub fn cpath(p: &[u8]) -> Result<CString, Errno> {
    CString::new(p).map_err(|_| libc::EINVAL)
}

/// `openat2(2)` with [`RESOLVE`].
pub fn openat2(dir: RawFd, path: &OsStr, flags: i32, mode: u32) -> Result<OwnedFd, Errno> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve: RESOLVE,
    };
    let p = cpath(path.as_bytes())?;
    loop {
        // SAFETY: `p` is NUL-terminated and `how` is a valid open_how of
        // the size passed; the kernel only reads them.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                p.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd to us.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(errno(&e));
        }
    }
}

pub fn fstat(fd: RawFd) -> Result<libc::stat, Errno> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(errno(&io::Error::last_os_error()));
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstatat(dir: RawFd, name: &OsStr) -> Result<libc::stat, Errno> {
    let p = cpath(name.as_bytes())?;
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated, `st` a valid out pointer.
    if unsafe { libc::fstatat(dir, p.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(errno(&io::Error::last_os_error()));
    }
    Ok(st)
}

/// Turns a libc return code into a Result.
pub fn check(rc: libc::c_int) -> Result<(), Errno> {
    if rc < 0 {
        Err(errno(&io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

/// The `/proc/self/fd/N` path of an fd: reopening or chmod-ing through it
/// reaches exactly the inode the fd holds, never a path that changed since.
pub fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default()
}

struct FdCache {
    map: HashMap<u64, (Arc<OwnedFd>, u64)>,
    tick: u64,
}

/// An open file or directory shared by every guest open with the same fh.
pub struct Handle {
    pub file: Arc<File>,
    /// Serialises seek+getdents on a directory handle (the fd's position
    /// is shared by concurrent READDIRs).
    pub lock: Arc<Mutex<()>>,
    refs: u32,
}

pub struct Volume {
    pub cfg: VolumeConfig,
    pub log_id: String,
    pub root: OwnedFd,
    /// Held by SYMLINK and RENAME (see `links`): shared with every other
    /// server of the same host directory.
    pub links: Arc<Mutex<()>>,
    table: Mutex<(Table, Journal)>,
    /// Size of the journal right after the last compaction.
    compacted: std::sync::atomic::AtomicU64,
    fds: Mutex<FdCache>,
    handles: Mutex<HashMap<u64, Handle>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Volume {
    pub fn open(cfg: VolumeConfig, log_id: String) -> Result<Volume, VolumeError> {
        let c = cpath(cfg.root.as_os_str().as_bytes()).map_err(|_| VolumeError::BadRoot {
            path: cfg.root.clone(),
            why: "contains NUL".into(),
        })?;
        // SAFETY: `c` is NUL-terminated.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(VolumeError::Io {
                what: format!("opening volume root {}", cfg.root.display()),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: freshly opened fd, owned here.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        let links = crate::links::lock_for(root.as_raw_fd());
        let (journal, recs) = Journal::open(&cfg.journal)?;
        let table = Table::replay(&recs);
        Ok(Volume {
            cfg,
            log_id,
            root,
            links,
            table: Mutex::new((table, journal)),
            compacted: std::sync::atomic::AtomicU64::new(0),
            fds: Mutex::new(FdCache {
                map: HashMap::new(),
                tick: 0,
            }),
            handles: Mutex::new(HashMap::new()),
        })
    }

    /// Logs a refused or failed operation with the sandbox id.
    pub fn warn(&self, what: &str, node: u64, detail: &dyn std::fmt::Debug) {
        tracing::warn!(
            sandbox = %self.log_id,
            volume = self.cfg.index,
            node,
            ?detail,
            "volume: {what}"
        );
    }

    /// Applies a table change and appends it to the journal.
    pub fn record(&self, t: &mut (Table, Journal), r: Record) {
        t.0.apply(&r);
        if let Err(e) = t.1.append(&r) {
            self.warn("journal append failed", 0, &e);
        }
        let base = self.compacted.load(std::sync::atomic::Ordering::Relaxed);
        if t.1.len > COMPACT_AT.max(base * 4) {
            self.compact(t);
        }
    }

    /// Rewrites the journal in place from the table (tmp + rename, so a
    /// crash leaves either the old or the new one) and appends from there.
    fn compact(&self, t: &mut (Table, Journal)) {
        let res = crate::journal::write_all(&self.cfg.journal, &t.0.snapshot())
            .and_then(|()| Journal::open(&self.cfg.journal));
        match res {
            Ok((j, _)) => {
                self.compacted
                    .store(j.len, std::sync::atomic::Ordering::Relaxed);
                t.1 = j;
            }
            Err(e) => self.warn("journal compaction failed", 0, &e),
        }
    }

    /// Runs `f` holding the SYMLINK/RENAME lock of this host directory.
    pub fn with_links_locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _g = lock(&self.links);
        f()
    }

    pub fn with_table<R>(&self, f: impl FnOnce(&mut (Table, Journal)) -> R) -> R {
        f(&mut lock(&self.table))
    }

    pub fn init_params(&self) -> Option<crate::table::InitParams> {
        lock(&self.table).0.init
    }

    /// A fresh FUSE_INIT: the guest mounted anew and knows no nodes.
    pub fn reset(&self, r: Record) -> Result<(), VolumeError> {
        let mut t = lock(&self.table);
        crate::journal::write_all(&self.cfg.journal, &[])?;
        let (j, _) = Journal::open(&self.cfg.journal)?;
        *t = (Table::new(), j);
        self.record(&mut t, r);
        lock(&self.fds).map.clear();
        lock(&self.handles).clear();
        Ok(())
    }

    pub fn snapshot(&self) -> Vec<Record> {
        lock(&self.table).0.snapshot()
    }

    pub fn evict(&self, node: u64) {
        lock(&self.fds).map.remove(&node);
    }

    /// The O_PATH fd of `node`, resolved safely below the root.
    pub fn node_fd(&self, node: u64) -> Result<Arc<OwnedFd>, Errno> {
        {
            let mut c = lock(&self.fds);
            c.tick += 1;
            let tick = c.tick;
            if let Some(e) = c.map.get_mut(&node) {
                e.1 = tick;
                return Ok(e.0.clone());
            }
        }
        let path = if node == ROOT {
            Some(Path::new(".").to_owned())
        } else {
            lock(&self.table).0.path(node)
        };
        let Some(path) = path else {
            return Err(libc::ESTALE);
        };
        let fd = match openat2(
            self.root.as_raw_fd(),
            path.as_os_str(),
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        ) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                if e == libc::ELOOP || e == libc::EXDEV {
                    self.warn(
                        "refused a path through a host symlink or mount",
                        node,
                        &path,
                    );
                }
                return Err(e);
            }
        };
        let mut c = lock(&self.fds);
        if c.map.len() >= FD_CACHE {
            let mut ticks: Vec<u64> = c.map.values().map(|v| v.1).collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 4];
            c.map.retain(|_, v| v.1 > cut);
        }
        let tick = c.tick;
        c.map.insert(node, (fd.clone(), tick));
        Ok(fd)
    }

    /// Registers `name` in `parent` as found on the host with `st`: the
    /// existing nodeid when it is the same file, else a new one.
    pub fn register(&self, parent: u64, name: &OsStr, st: &libc::stat) -> u64 {
        let ident = (st.st_dev, st.st_ino);
        let mut t = lock(&self.table);
        if let Some(n) = t.0.child(parent, name) {
            let same = match t.0.nodes.get(&n).and_then(|x| x.ident) {
                None => true,
                Some(i) => i == ident,
            };
            if same {
                if let Some(x) = t.0.nodes.get_mut(&n) {
                    x.ident = Some(ident);
                }
                self.record(&mut t, Record::Ref { node: n, n: 1 });
                return n;
            }
            // The name now holds another file: the guest's old node keeps
            // its id (and its cached fd, still that old inode) but loses
            // its path.
            self.record(&mut t, Record::Remove { node: n });
        }
        let node = t.0.alloc();
        self.record(
            &mut t,
            Record::Add {
                node,
                parent,
                name: name.to_owned(),
            },
        );
        if let Some(x) = t.0.nodes.get_mut(&node) {
            x.ident = Some(ident);
        }
        node
    }

    /// Opens `node` for I/O with `flags` (regular files and directories
    /// only; regular files with more than one link are refused because the
    /// other link may be outside the volume).
    pub fn open_node(&self, node: u64, flags: i32, dir: bool) -> Result<File, Errno> {
        let pfd = self.node_fd(node)?;
        let before = fstat(pfd.as_raw_fd())?;
        let fmt = before.st_mode & libc::S_IFMT;
        if dir && fmt != libc::S_IFDIR {
            return Err(libc::ENOTDIR);
        }
        if !dir && fmt == libc::S_IFDIR {
            return Err(libc::EISDIR);
        }
        if !dir && fmt != libc::S_IFREG {
            self.warn("refused to open a host device, fifo or socket", node, &fmt);
            return Err(libc::EACCES);
        }
        if !dir && before.st_nlink > 1 {
            self.warn(
                "refused to open a file with several hard links",
                node,
                &before.st_nlink,
            );
            return Err(libc::EPERM);
        }
        let p = proc_path(pfd.as_raw_fd());
        let extra = if dir { libc::O_DIRECTORY } else { 0 };
        // Reopening through /proc/self/fd reaches the very inode checked
        // above, never a swapped path. No O_NOFOLLOW: the /proc entry is
        // itself a (magic) link, and the inode behind it was checked to be
        // a regular file or a directory.
        // SAFETY: `p` is NUL-terminated.
        let fd = unsafe {
            libc::open(
                p.as_ptr(),
                flags | extra | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if fd < 0 {
            return Err(errno(&io::Error::last_os_error()));
        }
        // SAFETY: freshly opened fd, owned by the File.
        let f = unsafe { File::from_raw_fd(fd) };
        // O_NONBLOCK was only for the open (a fifo must not block us).
        // SAFETY: plain fcntl on our fd.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags & (libc::O_APPEND | libc::O_DIRECT)) };
        Ok(f)
    }

    /// Adds a guest open of `fh` (opening it unless already open).
    pub fn handle_open(
        &self,
        fh: u64,
        open: impl FnOnce() -> Result<File, Errno>,
    ) -> Result<(), Errno> {
        let mut h = lock(&self.handles);
        if let Some(x) = h.get_mut(&fh) {
            x.refs += 1;
            return Ok(());
        }
        drop(h);
        let f = open()?;
        h = lock(&self.handles);
        h.entry(fh).and_modify(|x| x.refs += 1).or_insert(Handle {
            file: Arc::new(f),
            lock: Arc::new(Mutex::new(())),
            refs: 1,
        });
        Ok(())
    }

    /// The file of `fh`; on a miss (a new server instance, or a handle
    /// released early) the file is reopened from the node table.
    pub fn handle(&self, fh: u64) -> Result<(Arc<File>, Arc<Mutex<()>>), Errno> {
        if let Some(x) = lock(&self.handles).get(&fh) {
            return Ok((x.file.clone(), x.lock.clone()));
        }
        let (node, flags, dir) = fh_decode(fh);
        if fh != fh_encode(node, flags) | (fh & FH_DIR) {
            return Err(libc::EBADF);
        }
        let f = match self.open_node(node, flags, dir) {
            Ok(f) => f,
            Err(e) => {
                // Rule: a file deleted while open cannot be reopened by a
                // new server instance (its name is all we have).
                self.warn(
                    "cannot reopen a file handle from an earlier server",
                    node,
                    &e,
                );
                return Err(if e == libc::ENOENT { libc::ESTALE } else { e });
            }
        };
        let mut h = lock(&self.handles);
        let x = h.entry(fh).or_insert(Handle {
            file: Arc::new(f),
            lock: Arc::new(Mutex::new(())),
            refs: 1,
        });
        Ok((x.file.clone(), x.lock.clone()))
    }

    /// Any open file handle of `node`.
    pub fn any_handle(&self, node: u64) -> Option<Arc<File>> {
        lock(&self.handles)
            .iter()
            .find(|(fh, _)| *fh >> 8 == node)
            .map(|(_, h)| h.file.clone())
    }

    pub fn handle_release(&self, fh: u64) {
        let mut h = lock(&self.handles);
        if let Some(x) = h.get_mut(&fh) {
            x.refs = x.refs.saturating_sub(1);
            if x.refs == 0 {
                h.remove(&fh);
            }
        }
    }

    /// Runs `f` on a directory handle's file with its seek position locked.
    pub fn with_dir<R>(&self, fh: u64, f: impl FnOnce(&File) -> R) -> Result<R, Errno> {
        let (file, l) = self.handle(fh)?;
        let _g = lock(&l);
        Ok(f(&file))
    }
}
