//! FUSE request handlers: one function per opcode, each turning a raw
//! request into a raw reply against one [`Volume`].
//!
//! Ownership rule: every entry shows `guest_owner` in the guest; whatever
//! the guest creates is chowned to `host_owner` on the host; a guest chown
//! is accepted and does nothing (so `tar x` as root works without giving
//! the guest a say over host ownership).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;

use crate::abi::{self, op, rd_u32, rd_u64, Attr, Body, InHeader};
use crate::fs::{check, cpath, errno, fstat, lstatat, openat2, proc_path, Errno, Volume};
use crate::journal::Record;
use crate::links;
use crate::security::{fh_encode, strip_mode, symlink_target_ok, valid_name, wants_write, FH_DIR};
use crate::table::ROOT;

type Res = Result<Vec<u8>, Errno>;

/// Handles one request; `None` for the opcodes that take no reply.
pub fn handle(vol: &Volume, req: &[u8]) -> Option<Vec<u8>> {
    let (h, args) = match InHeader::parse(req) {
        Some(x) => x,
        None => {
            vol.warn("malformed FUSE request", 0, &req.len());
            // Without a trustworthy unique there is nobody to answer.
            return None;
        }
    };
    let res = match h.opcode {
        op::FORGET => {
            forget(vol, h.nodeid, rd_u64(args, 0).unwrap_or(0));
            return None;
        }
        op::BATCH_FORGET => {
            let count = rd_u32(args, 0).unwrap_or(0) as usize;
            for i in 0..count {
                let (Some(n), Some(c)) = (rd_u64(args, 8 + i * 16), rd_u64(args, 16 + i * 16))
                else {
                    break;
                };
                forget(vol, n, c);
            }
            return None;
        }
        op::INTERRUPT => return None,
        op::INIT => init(vol, args),
        op::DESTROY => Ok(Vec::new()),
        op::LOOKUP => lookup(vol, h.nodeid, args),
        op::GETATTR => getattr(vol, h.nodeid, args),
        op::SETATTR => setattr(vol, h.nodeid, args),
        op::READLINK => readlink(vol, h.nodeid),
        op::SYMLINK => symlink(vol, h.nodeid, args),
        op::MKNOD => mknod(vol, h.nodeid, args),
        op::MKDIR => mkdir(vol, h.nodeid, args),
        op::UNLINK => remove(vol, h.nodeid, args, 0),
        op::RMDIR => remove(vol, h.nodeid, args, libc::AT_REMOVEDIR),
        op::RENAME => rename(vol, h.nodeid, rd_u64(args, 0), 0, args.get(8..)),
        op::RENAME2 => rename(
            vol,
            h.nodeid,
            rd_u64(args, 0),
            rd_u32(args, 8).unwrap_or(u32::MAX),
            args.get(16..),
        ),
        op::LINK => {
            vol.warn("refused a hard link from the guest", h.nodeid, &"link");
            Err(libc::EPERM)
        }
        op::OPEN => open(vol, h.nodeid, args),
        op::READ => read(vol, args),
        op::WRITE => write(vol, args),
        op::STATFS => statfs(vol),
        op::RELEASE | op::RELEASEDIR => {
            if let Some(fh) = rd_u64(args, 0) {
                vol.handle_release(fh);
            }
            Ok(Vec::new())
        }
        // Every write reaches the host file at once (no writeback cache)
        // and locks are not served, so a close has nothing to flush:
        // ENOSYS makes the kernel stop sending FLUSH, which saves a round
        // trip on every close(2).
        op::FLUSH => Err(libc::ENOSYS),
        op::FSYNC | op::FSYNCDIR => fsync(vol, args),
        op::OPENDIR => opendir(vol, h.nodeid),
        op::READDIR => readdir(vol, args),
        op::CREATE => create(vol, h.nodeid, args),
        op::FALLOCATE => fallocate(vol, args),
        op::LSEEK => lseek(vol, args),
        // With default_permissions the kernel checks modes itself; ENOSYS
        // tells it never to ask again.
        op::ACCESS => Err(libc::ENOSYS),
        // xattrs, locks, ioctl, copy_file_range: not supported.
        _ => Err(libc::ENOSYS),
    };
    Some(match res {
        Ok(body) => abi::reply_ok(h.unique, &body),
        Err(e) => abi::reply_err(h.unique, e),
    })
}

fn name_arg<'a>(vol: &Volume, node: u64, b: &'a [u8]) -> Result<(&'a OsStr, &'a [u8]), Errno> {
    let (name, rest) = abi::cstr(b).ok_or(libc::EINVAL)?;
    if !valid_name(name) {
        vol.warn("refused an invalid name from the guest", node, &name);
        return Err(libc::EINVAL);
    }
    Ok((name, rest))
}

fn ro(vol: &Volume) -> Result<(), Errno> {
    if vol.cfg.read_only {
        Err(libc::EROFS)
    } else {
        Ok(())
    }
}

fn attr(vol: &Volume, st: &libc::stat) -> Attr {
    Attr::from_stat(st, vol.cfg.guest_owner)
}

fn init(vol: &Volume, a: &[u8]) -> Res {
    let (major, minor) = (
        rd_u32(a, 0).ok_or(libc::EINVAL)?,
        rd_u32(a, 4).ok_or(libc::EINVAL)?,
    );
    let readahead = rd_u32(a, 8).unwrap_or(0);
    let offered = rd_u32(a, 12).unwrap_or(0);
    if major != abi::FUSE_KERNEL_VERSION || minor < abi::MIN_MINOR {
        vol.warn("guest FUSE protocol too old", 0, &(major, minor));
        return Err(libc::EPROTO);
    }
    let minor = minor.min(abi::OUR_MINOR);
    let flags = offered & abi::WANTED_FLAGS;
    vol.reset(Record::Init {
        minor,
        flags,
        max_write: abi::MAX_WRITE,
    })
    .map_err(|e| {
        vol.warn("cannot reset the journal on FUSE_INIT", 0, &e);
        libc::EIO
    })?;
    let mut b = Body::default();
    b.u32(abi::FUSE_KERNEL_VERSION)
        .u32(minor)
        .u32(readahead)
        .u32(flags)
        // max_background / congestion_threshold: the benchmark has 256
        // concurrent guest workers; let async requests keep up.
        .u16(256)
        .u16(192)
        .u32(abi::MAX_WRITE)
        .u32(1)
        .u16(abi::MAX_PAGES)
        .u16(0)
        .u32(0);
    b.0.resize(64, 0);
    Ok(b.0)
}

fn forget(vol: &Volume, node: u64, n: u64) {
    if node == ROOT {
        return;
    }
    let dropped = vol.with_table(|t| {
        vol.record(t, Record::Forget { node, n });
        !t.0.nodes.contains_key(&node)
    });
    if dropped {
        vol.evict(node);
    }
}

/// Stats `name` in `parent` and answers with a (new or existing) entry.
fn entry(vol: &Volume, parent: u64, name: &OsStr) -> Res {
    let pfd = vol.node_fd(parent)?;
    let st = lstatat(pfd.as_raw_fd(), name)?;
    let node = vol.register(parent, name, &st);
    Ok(abi::entry_out(node, &attr(vol, &st)).0)
}

fn lookup(vol: &Volume, parent: u64, a: &[u8]) -> Res {
    let (name, _) = name_arg(vol, parent, a)?;
    match entry(vol, parent, name) {
        // A negative entry (node id 0) that the guest caches for the entry
        // timeout, as it caches positive ones: a program probing for files
        // that do not exist (Python's imports, a shell's PATH search) pays
        // one round trip per name and second, not one per probe.
        Err(libc::ENOENT) => Ok(abi::entry_out(0, &abi::Attr::default()).0),
        r => r,
    }
}

/// `fuse_getattr_in.getattr_flags` bit: `fh` is set (fstat of an open file).
const FUSE_GETATTR_FH: u32 = 1;

fn getattr(vol: &Volume, node: u64, a: &[u8]) -> Res {
    let st = if rd_u32(a, 0).unwrap_or(0) & FUSE_GETATTR_FH != 0 {
        // An open file answers even when its name is gone.
        fstat(vol.handle(rd_u64(a, 8).ok_or(libc::EINVAL)?)?.0.as_raw_fd())?
    } else {
        match vol.node_fd(node) {
            Ok(fd) => fstat(fd.as_raw_fd())?,
            // Unlinked before its path was ever resolved: any open handle
            // of the node still has the inode.
            Err(libc::ESTALE) => fstat(vol.any_handle(node).ok_or(libc::ESTALE)?.as_raw_fd())?,
            Err(e) => return Err(e),
        }
    };
    Ok(abi::attr_out(&attr(vol, &st)).0)
}

fn setattr(vol: &Volume, node: u64, a: &[u8]) -> Res {
    let valid = rd_u32(a, 0).ok_or(libc::EINVAL)?;
    let fh = rd_u64(a, 8).ok_or(libc::EINVAL)?;
    let size = rd_u64(a, 16).ok_or(libc::EINVAL)?;
    let (atime, mtime) = (rd_u64(a, 32).unwrap_or(0), rd_u64(a, 40).unwrap_or(0));
    let (ansec, mnsec) = (rd_u32(a, 56).unwrap_or(0), rd_u32(a, 60).unwrap_or(0));
    let mode = rd_u32(a, 68).unwrap_or(0);
    let changing = abi::FATTR_MODE
        | abi::FATTR_SIZE
        | abi::FATTR_ATIME
        | abi::FATTR_MTIME
        | abi::FATTR_ATIME_NOW
        | abi::FATTR_MTIME_NOW;
    if valid & changing != 0 {
        ro(vol)?;
    }
    let pfd = vol.node_fd(node)?;
    let st = fstat(pfd.as_raw_fd())?;
    let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
    if valid & abi::FATTR_SIZE != 0 {
        let file = if valid & abi::FATTR_FH != 0 {
            vol.handle(fh)?.0
        } else {
            std::sync::Arc::new(vol.open_node(node, libc::O_WRONLY, false)?)
        };
        file.set_len(size).map_err(|e| errno(&e))?;
    }
    if valid & abi::FATTR_MODE != 0 {
        if is_link {
            return Err(libc::EOPNOTSUPP);
        }
        let p = proc_path(pfd.as_raw_fd());
        // SAFETY: NUL-terminated path to our own fd's inode.
        check(unsafe { libc::chmod(p.as_ptr(), strip_mode(mode) & 0o7777) })?;
    }
    // FATTR_UID / FATTR_GID: accepted as a no-op (see the module doc).
    let _chown = valid & (abi::FATTR_UID | abi::FATTR_GID);
    let times =
        valid & (abi::FATTR_ATIME | abi::FATTR_MTIME | abi::FATTR_ATIME_NOW | abi::FATTR_MTIME_NOW);
    if times != 0 && !is_link {
        let ts = |set: bool, now: bool, s: u64, ns: u32| libc::timespec {
            tv_sec: s as libc::time_t,
            tv_nsec: if now {
                libc::UTIME_NOW
            } else if set {
                ns as _
            } else {
                libc::UTIME_OMIT
            },
        };
        let t = [
            ts(
                valid & abi::FATTR_ATIME != 0,
                valid & abi::FATTR_ATIME_NOW != 0,
                atime,
                ansec,
            ),
            ts(
                valid & abi::FATTR_MTIME != 0,
                valid & abi::FATTR_MTIME_NOW != 0,
                mtime,
                mnsec,
            ),
        ];
        let p = proc_path(pfd.as_raw_fd());
        // SAFETY: NUL-terminated path and a two-element timespec array.
        check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), t.as_ptr(), 0) })?;
    }
    Ok(abi::attr_out(&attr(vol, &fstat(pfd.as_raw_fd())?)).0)
}

fn readlink(vol: &Volume, node: u64) -> Res {
    let fd = vol.node_fd(node)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for its length; "" with an O_PATH fd reads
    // the link the fd itself refers to.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(errno(&io::Error::last_os_error()));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Gives a just-created entry to `host_owner`.
fn chown_new(vol: &Volume, dir: i32, name: &OsStr) -> Result<(), Errno> {
    let c = cpath(name.as_bytes())?;
    let (u, g) = vol.cfg.host_owner;
    // SAFETY: NUL-terminated name below a directory fd we hold.
    check(unsafe { libc::fchownat(dir, c.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW) })
}

fn symlink(vol: &Volume, parent: u64, a: &[u8]) -> Res {
    ro(vol)?;
    let (name, rest) = name_arg(vol, parent, a)?;
    let (target, _) = abi::cstr(rest).ok_or(libc::EINVAL)?;
    let pfd = vol.node_fd(parent)?;
    vol.with_links_locked(|| {
        // The depth on the host, not the guest's path: what a host tool
        // following the link will climb.
        let depth = links::depth(vol.root.as_raw_fd(), pfd.as_raw_fd())?;
        if !symlink_target_ok(depth, target) {
            vol.warn(
                "refused a symlink pointing outside the volume",
                parent,
                &target,
            );
            return Err(libc::EPERM);
        }
        let (t, n) = (cpath(target.as_bytes())?, cpath(name.as_bytes())?);
        // SAFETY: NUL-terminated strings, a directory fd we hold.
        check(unsafe { libc::symlinkat(t.as_ptr(), pfd.as_raw_fd(), n.as_ptr()) })
    })?;
    chown_new(vol, pfd.as_raw_fd(), name)?;
    entry(vol, parent, name)
}

fn mknod(vol: &Volume, parent: u64, a: &[u8]) -> Res {
    ro(vol)?;
    let mode = rd_u32(a, 0).ok_or(libc::EINVAL)?;
    let umask = rd_u32(a, 8).unwrap_or(0);
    let (name, _) = name_arg(vol, parent, a.get(16..).ok_or(libc::EINVAL)?)?;
    if mode & libc::S_IFMT != libc::S_IFREG {
        vol.warn("refused to create a device, fifo or socket", parent, &mode);
        return Err(libc::EPERM);
    }
    let pfd = vol.node_fd(parent)?;
    let n = cpath(name.as_bytes())?;
    let m = libc::S_IFREG | (strip_mode(mode) & 0o1777 & !umask);
    // SAFETY: NUL-terminated name below a directory fd we hold.
    check(unsafe { libc::mknodat(pfd.as_raw_fd(), n.as_ptr(), m, 0) })?;
    chown_new(vol, pfd.as_raw_fd(), name)?;
    entry(vol, parent, name)
}

fn mkdir(vol: &Volume, parent: u64, a: &[u8]) -> Res {
    ro(vol)?;
    let mode = rd_u32(a, 0).ok_or(libc::EINVAL)?;
    let umask = rd_u32(a, 4).unwrap_or(0);
    let (name, _) = name_arg(vol, parent, a.get(8..).ok_or(libc::EINVAL)?)?;
    let pfd = vol.node_fd(parent)?;
    let n = cpath(name.as_bytes())?;
    // SAFETY: NUL-terminated name below a directory fd we hold.
    check(unsafe {
        libc::mkdirat(
            pfd.as_raw_fd(),
            n.as_ptr(),
            strip_mode(mode) & 0o1777 & !umask,
        )
    })?;
    chown_new(vol, pfd.as_raw_fd(), name)?;
    entry(vol, parent, name)
}

fn remove(vol: &Volume, parent: u64, a: &[u8], flags: i32) -> Res {
    ro(vol)?;
    let (name, _) = name_arg(vol, parent, a)?;
    let pfd = vol.node_fd(parent)?;
    let n = cpath(name.as_bytes())?;
    // SAFETY: NUL-terminated name below a directory fd we hold.
    check(unsafe { libc::unlinkat(pfd.as_raw_fd(), n.as_ptr(), flags) })?;
    // The node keeps its cached fd (the inode lives on while open, and
    // fstat of an unlinked open file must still work); it only loses its
    // name.
    vol.with_table(|t| {
        if let Some(node) = t.0.child(parent, name) {
            vol.record(t, Record::Remove { node });
        }
    });
    Ok(Vec::new())
}

fn rename(vol: &Volume, parent: u64, newdir: Option<u64>, flags: u32, names: Option<&[u8]>) -> Res {
    ro(vol)?;
    let newdir = newdir.ok_or(libc::EINVAL)?;
    // RENAME_EXCHANGE and RENAME_WHITEOUT would need more table logic.
    if flags & !libc::RENAME_NOREPLACE != 0 {
        return Err(libc::EINVAL);
    }
    let (old, rest) = name_arg(vol, parent, names.ok_or(libc::EINVAL)?)?;
    let (new, _) = name_arg(vol, newdir, rest)?;
    let (ofd, nfd) = (vol.node_fd(parent)?, vol.node_fd(newdir)?);
    let (o, n) = (cpath(old.as_bytes())?, cpath(new.as_bytes())?);
    vol.with_links_locked(|| {
        check_move(vol, parent, ofd.as_raw_fd(), old, nfd.as_raw_fd())?;
        // SAFETY: NUL-terminated names below directory fds we hold.
        check(unsafe {
            libc::renameat2(
                ofd.as_raw_fd(),
                o.as_ptr(),
                nfd.as_raw_fd(),
                n.as_ptr(),
                flags,
            )
        })
    })?;
    vol.with_table(|t| {
        let replaced = t.0.child(newdir, new);
        match t.0.child(parent, old) {
            Some(node) => vol.record(
                t,
                Record::Move {
                    node,
                    parent: newdir,
                    name: new.to_owned(),
                },
            ),
            None => {
                if let Some(r) = replaced {
                    vol.record(t, Record::Remove { node: r });
                }
            }
        }
    });
    Ok(Vec::new())
}

/// Whether `old` in `ofd` may move into `nfd` (called under the links
/// lock, see `links`): a symlink must be one the guest could create there;
/// a directory moving up must carry only such symlinks, at their new
/// depths. `EPERM` for a link that would leave the volume, `EXDEV` for a
/// directory too large to check (the guest's `mv` then copies it, each
/// link checked as it is created).
fn check_move(vol: &Volume, parent: u64, ofd: i32, old: &OsStr, nfd: i32) -> Result<(), Errno> {
    let st = lstatat(ofd, old)?;
    let root = vol.root.as_raw_fd();
    match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => {
            let target = links::read_link_at(ofd, old)?;
            let depth = links::depth(root, nfd)?;
            if !symlink_target_ok(depth, OsStr::from_bytes(&target)) {
                vol.warn(
                    "refused to move a symlink where it would point outside the volume",
                    parent,
                    &(old, OsStr::from_bytes(&target)),
                );
                return Err(libc::EPERM);
            }
        }
        libc::S_IFDIR => {
            let (from, to) = (links::depth(root, ofd)?, links::depth(root, nfd)?);
            if to < from {
                let c = cpath(old.as_bytes())?;
                // SAFETY: NUL-terminated name below a directory fd we hold.
                let fd = unsafe {
                    libc::openat(
                        ofd,
                        c.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err(errno(&io::Error::last_os_error()));
                }
                // SAFETY: the kernel just returned this fd to us.
                let dir = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
                if let Err(r) = links::check_subtree(dir.as_raw_fd(), to + 1) {
                    vol.warn(
                        "refused to move a directory up with a symlink that would then point outside the volume",
                        parent,
                        &(old, &r),
                    );
                    return Err(r.errno());
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn open(vol: &Volume, node: u64, a: &[u8]) -> Res {
    let flags = rd_u32(a, 0).ok_or(libc::EINVAL)? as i32;
    if wants_write(flags) {
        ro(vol)?;
    }
    let fh = fh_encode(node, flags);
    let (_, reopen, _) = crate::security::fh_decode(fh);
    vol.handle_open(fh, || vol.open_node(node, reopen, false))?;
    Ok(abi::open_out(fh, abi::FOPEN_KEEP_CACHE).0)
}

fn create(vol: &Volume, parent: u64, a: &[u8]) -> Res {
    ro(vol)?;
    let flags = rd_u32(a, 0).ok_or(libc::EINVAL)? as i32;
    let mode = rd_u32(a, 4).ok_or(libc::EINVAL)?;
    let umask = rd_u32(a, 8).unwrap_or(0);
    let (name, _) = name_arg(vol, parent, a.get(16..).ok_or(libc::EINVAL)?)?;
    let pfd = vol.node_fd(parent)?;
    let fh_flags = fh_encode(0, flags);
    let (_, reopen, _) = crate::security::fh_decode(fh_flags);
    let m = strip_mode(mode) & 0o1777 & !umask;
    let keep = reopen | (flags & libc::O_TRUNC);
    let (fd, created) = match openat2(
        pfd.as_raw_fd(),
        name,
        keep | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        m,
    ) {
        Ok(fd) => (fd, true),
        Err(libc::EEXIST) if flags & libc::O_EXCL == 0 => {
            // Lost a race with another creator: open what is there, with
            // the same checks as OPEN.
            (
                openat2(
                    pfd.as_raw_fd(),
                    name,
                    keep | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    0,
                )?,
                false,
            )
        }
        Err(e) => return Err(e),
    };
    let file = std::fs::File::from(fd);
    let st = fstat(file.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink > 1 {
        vol.warn(
            "refused to open an existing special or multi-link file",
            parent,
            &name,
        );
        return Err(libc::EPERM);
    }
    if created {
        let (u, g) = vol.cfg.host_owner;
        // SAFETY: plain fchown on our fd.
        check(unsafe { libc::fchown(file.as_raw_fd(), u, g) })?;
    }
    let node = vol.register(parent, name, &st);
    let fh = fh_encode(node, flags);
    let mut file = Some(file);
    vol.handle_open(fh, || file.take().ok_or(libc::EIO))?;
    let st = fstat(vol.handle(fh)?.0.as_raw_fd())?;
    let mut body = abi::entry_out(node, &attr(vol, &st)).0;
    body.extend_from_slice(&abi::open_out(fh, abi::FOPEN_KEEP_CACHE).0);
    Ok(body)
}

fn read(vol: &Volume, a: &[u8]) -> Res {
    let fh = rd_u64(a, 0).ok_or(libc::EINVAL)?;
    let off = rd_u64(a, 8).ok_or(libc::EINVAL)?;
    let size = rd_u32(a, 16).ok_or(libc::EINVAL)?.min(abi::MAX_WRITE) as usize;
    let (f, _) = vol.handle(fh)?;
    let mut buf = vec![0u8; size];
    let mut got = 0;
    while got < size {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(errno(&e)),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

fn write(vol: &Volume, a: &[u8]) -> Res {
    ro(vol)?;
    let fh = rd_u64(a, 0).ok_or(libc::EINVAL)?;
    let off = rd_u64(a, 8).ok_or(libc::EINVAL)?;
    let size = rd_u32(a, 16).ok_or(libc::EINVAL)? as usize;
    let data = a.get(40..40 + size).ok_or(libc::EINVAL)?;
    let (f, _) = vol.handle(fh)?;
    f.write_all_at(data, off).map_err(|e| errno(&e))?;
    let mut b = Body::default();
    b.u32(size as u32).u32(0);
    Ok(b.0)
}

fn fsync(vol: &Volume, a: &[u8]) -> Res {
    let fh = rd_u64(a, 0).ok_or(libc::EINVAL)?;
    let datasync = rd_u32(a, 8).unwrap_or(0) & 1 != 0;
    let (f, _) = vol.handle(fh)?;
    if datasync {
        f.sync_data()
    } else {
        f.sync_all()
    }
    .map_err(|e| errno(&e))?;
    Ok(Vec::new())
}

fn statfs(vol: &Volume) -> Res {
    // SAFETY: zeroed statfs is a valid out value.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    check(unsafe { libc::fstatfs(vol.root.as_raw_fd(), &mut s) })?;
    let mut b = Body::default();
    b.u64(s.f_blocks)
        .u64(s.f_bfree)
        .u64(s.f_bavail)
        .u64(s.f_files)
        .u64(s.f_ffree)
        .u32(s.f_bsize as u32)
        .u32(s.f_namelen as u32)
        .u32(s.f_frsize as u32)
        .u32(0);
    b.0.resize(80, 0);
    Ok(b.0)
}

fn opendir(vol: &Volume, node: u64) -> Res {
    let fh = node << 8 | FH_DIR;
    vol.handle_open(fh, || vol.open_node(node, libc::O_RDONLY, true))?;
    Ok(abi::open_out(fh, 0).0)
}

/// READDIR offsets are the host's own `d_off` cookies: stable across
/// server instances (a new server seeks a freshly opened fd to them).
fn readdir(vol: &Volume, a: &[u8]) -> Res {
    let fh = rd_u64(a, 0).ok_or(libc::EINVAL)?;
    let off = rd_u64(a, 8).ok_or(libc::EINVAL)?;
    let size = (rd_u32(a, 16).ok_or(libc::EINVAL)? as usize).min(1 << 20);
    vol.with_dir(fh, |f| {
        let fd = f.as_raw_fd();
        // SAFETY: plain lseek on our fd.
        if unsafe { libc::lseek(fd, off as libc::off_t, libc::SEEK_SET) } < 0 {
            return Err(errno(&io::Error::last_os_error()));
        }
        let mut out = Vec::with_capacity(size);
        let mut buf = vec![0u8; size.max(512)];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
            if n < 0 {
                return Err(errno(&io::Error::last_os_error()));
            }
            if n == 0 {
                return Ok(out);
            }
            let mut at = 0usize;
            while at + 19 <= n as usize {
                let ino = rd_u64(&buf, at).unwrap_or(0);
                let d_off = rd_u64(&buf, at + 8).unwrap_or(0);
                let reclen = u16::from_le_bytes([buf[at + 16], buf[at + 17]]) as usize;
                let typ = buf[at + 18] as u32;
                let name_area = buf.get(at + 19..at + reclen).unwrap_or(&[]);
                let name = name_area.split(|&c| c == 0).next().unwrap_or(&[]);
                if reclen == 0 || !abi::push_dirent(&mut out, size, ino, d_off, typ, name) {
                    return Ok(out);
                }
                at += reclen;
            }
        }
    })?
}

fn fallocate(vol: &Volume, a: &[u8]) -> Res {
    ro(vol)?;
    let fh = rd_u64(a, 0).ok_or(libc::EINVAL)?;
    let (off, len) = (
        rd_u64(a, 8).ok_or(libc::EINVAL)?,
        rd_u64(a, 16).ok_or(libc::EINVAL)?,
    );
    let mode = rd_u32(a, 24).unwrap_or(0) as i32;
    let (f, _) = vol.handle(fh)?;
    // SAFETY: plain fallocate on our fd.
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) })?;
    Ok(Vec::new())
}

fn lseek(vol: &Volume, a: &[u8]) -> Res {
    let fh = rd_u64(a, 0).ok_or(libc::EINVAL)?;
    let off = rd_u64(a, 8).ok_or(libc::EINVAL)?;
    let whence = rd_u32(a, 16).ok_or(libc::EINVAL)? as i32;
    let (f, _) = vol.handle(fh)?;
    // SAFETY: plain lseek on our fd; data reads use pread, so moving the
    // shared position is harmless.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as i64, whence) };
    if r < 0 {
        return Err(errno(&io::Error::last_os_error()));
    }
    let mut b = Body::default();
    b.u64(r as u64);
    Ok(b.0)
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
