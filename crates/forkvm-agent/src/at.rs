//! Directory-relative file system calls (the `*at` family), for
//! `put_archive`.
//!
//! Every name given here is a single path component inside an open
//! directory, and none of these calls follows a symlink in that last
//! component. Together with the component-by-component walk in
//! [`crate::archive`], that is what keeps an archive from writing through a
//! symlink that leads out of its destination.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A path component as a C string (a NUL byte in it is an error).
pub fn cname(name: &[u8]) -> io::Result<CString> {
    CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file name contains a NUL byte"))
}

fn openat(
    dir: BorrowedFd<'_>,
    name: &[u8],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let name = cname(name)?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the
    // dir fd is borrowed for the duration of the call.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    })?;
    // SAFETY: openat just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open a directory by absolute path (following symlinks).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cname(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: open just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open the directory `name` in `dir`; a symlink fails with ELOOP or
/// ENOTDIR, a non-directory with ENOTDIR.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

/// Create a new regular file (it must not exist) for writing, mode 0600
/// until the caller sets the real one.
pub fn create_file_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<File> {
    let fd = openat(
        dir,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )?;
    Ok(File::from(fd))
}

/// Open an existing file for writing, without truncating it; a symlink
/// fails with ELOOP.
pub fn open_write_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<File> {
    Ok(File::from(openat(
        dir,
        name,
        libc::O_WRONLY | libc::O_NOFOLLOW,
        0,
    )?))
}

/// lstat of `name` in `dir`; `None` if it does not exist.
pub fn lstat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<libc::stat>> {
    let name = cname(name)?;
    // SAFETY: all-zero bytes are a valid `struct stat` (integers only).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` writable; both outlive the call.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match cvt(r) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// fstat of an open file.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: all-zero bytes are a valid `struct stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable and outlives the call.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The file type bits of a stat.
pub fn file_type(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// The target of the symlink `name` in `dir`.
pub fn readlink_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    let name = cname(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` has `buf.len()` writable bytes and `name` is
    // NUL-terminated; both outlive the call.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// mkdirat(2).
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let name = cname(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    Ok(())
}

/// Remove `name` (a directory, which must be empty, if `is_dir`).
pub fn unlink_at(dir: BorrowedFd<'_>, name: &[u8], is_dir: bool) -> io::Result<()> {
    let name = cname(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

/// Create the symlink `name` in `dir` pointing at `target`.
pub fn symlink_at(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (target, name) = (cname(target)?, cname(name)?);
    // SAFETY: both strings are NUL-terminated and outlive the call.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// Hard-link `old_name` in `old_dir` as `new_name` in `new_dir`; a symlink
/// is linked itself, not its target.
pub fn link_at(
    old_dir: BorrowedFd<'_>,
    old_name: &[u8],
    new_dir: BorrowedFd<'_>,
    new_name: &[u8],
) -> io::Result<()> {
    let (old, new) = (cname(old_name)?, cname(new_name)?);
    // SAFETY: both names are NUL-terminated and outlive the call; flags 0
    // means the old name is not followed.
    cvt(unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            0,
        )
    })?;
    Ok(())
}

/// mknodat(2): `mode` includes the file type (S_IFCHR, S_IFBLK, S_IFIFO).
pub fn mknod_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    mode: libc::mode_t,
    dev: libc::dev_t,
) -> io::Result<()> {
    let name = cname(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) })?;
    Ok(())
}

/// Change the owner of `name` in `dir`, not following a symlink.
pub fn chown_at(dir: BorrowedFd<'_>, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let name = cname(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// Change the mode of `name` in `dir` (never a symlink: the caller just
/// created the node).
pub fn chmod_at(dir: BorrowedFd<'_>, name: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let name = cname(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) })?;
    Ok(())
}

/// fchown(2) and fchmod(2) of an open file or directory, in that order
/// (chown clears the setuid and setgid bits).
pub fn chown_chmod(fd: BorrowedFd<'_>, uid: u32, gid: u32, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: plain integer arguments; the fd is borrowed for the call.
    cvt(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    Ok(())
}

fn times(sec: i64, nsec: u32) -> [libc::timespec; 2] {
    let ts = libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: libc::c_long::from(nsec.min(999_999_999) as i32),
    };
    [ts, ts]
}

/// Set the access and modification times of `name` in `dir` (not following
/// a symlink), or of `dir` itself when `name` is None.
pub fn set_times_at(
    dir: BorrowedFd<'_>,
    name: Option<&[u8]>,
    sec: i64,
    nsec: u32,
) -> io::Result<()> {
    let t = times(sec, nsec);
    match name {
        Some(name) => {
            let name = cname(name)?;
            // SAFETY: `name` is NUL-terminated and `t` holds two timespecs;
            // both outlive the call.
            cvt(unsafe {
                libc::utimensat(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    t.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        // SAFETY: `t` holds two timespecs and outlives the call.
        None => cvt(unsafe { libc::futimens(dir.as_raw_fd(), t.as_ptr()) }).map(drop)?,
    }
    Ok(())
}
