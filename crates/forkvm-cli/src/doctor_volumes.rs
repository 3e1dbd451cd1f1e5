//! `forkvm doctor`'s volume checks (docs/volumes.md): the kernel call every
//! volume path goes through, and whether `copy` volumes are reflinked.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::doctor::{check, Check, Status};

/// `FICLONE` from linux/fs.h: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn openat2_check(home: &Path) -> Check {
    let Ok(c) = CString::new(".") else {
        return check("volumes: openat2", Status::Fail, "bad path", None);
    };
    let dir = match std::fs::File::open(home) {
        Ok(d) => d,
        Err(e) => {
            return check(
                "volumes: openat2",
                Status::Warn,
                format!("cannot open {} ({e})", home.display()),
                Some("start the daemon once (it creates its home)"),
            )
        }
    };
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        // RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
        resolve: 0x08 | 0x04 | 0x02 | 0x01,
    };
    // SAFETY: valid dirfd, NUL-terminated path, and an open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor we just opened and own.
        unsafe { libc::close(fd as i32) };
        check(
            "volumes: openat2",
            Status::Ok,
            "confined path resolution works",
            None,
        )
    } else {
        check(
            "volumes: openat2",
            Status::Fail,
            format!(
                "openat2 failed ({}): volumes cannot be served",
                std::io::Error::last_os_error()
            ),
            Some("volumes need Linux 5.6 or newer"),
        )
    }
}

fn reflink_check(home: &Path) -> Check {
    let probe = || -> std::io::Result<bool> {
        let a = tempfile::NamedTempFile::new_in(home)?;
        std::io::Write::write_all(&mut a.as_file(), &[7u8; 4096])?;
        let b = tempfile::NamedTempFile::new_in(home)?;
        // SAFETY: two open descriptors; FICLONE takes the source fd as its argument.
        let r = unsafe { libc::ioctl(b.as_file().as_raw_fd(), FICLONE, a.as_file().as_raw_fd()) };
        Ok(r == 0)
    };
    match probe() {
        Ok(true) => check(
            "volumes: reflinks",
            Status::Ok,
            "the home's filesystem reflinks: `copy` volumes are copied instantly",
            None,
        ),
        Ok(false) => check(
            "volumes: reflinks",
            Status::Warn,
            "the home's filesystem cannot reflink: each branch copies `copy` volumes byte by byte",
            Some("put the home on XFS (reflink=1) or btrfs for instant `copy` volumes"),
        ),
        Err(e) => check(
            "volumes: reflinks",
            Status::Warn,
            format!("cannot probe {} ({e})", home.display()),
            None,
        ),
    }
}

pub(crate) fn checks(home: &Path) -> Vec<Check> {
    vec![openat2_check(home), reflink_check(home)]
}
