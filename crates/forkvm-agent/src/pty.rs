//! Pseudo-terminals for processes started with `pty`: posix_openpt on
//! /dev/ptmx (devpts is mounted by stage 2), and the window size.

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use forkvm_agent_protocol::PtySize;

/// Both ends of a new terminal.
pub struct Pty {
    pub master: File,
    pub slave: File,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Open a terminal of `size`.
pub fn open(size: PtySize) -> io::Result<Pty> {
    // SAFETY: posix_openpt takes flags only; the fd it returns is ours.
    let fd = cvt(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: fd is a fresh, open descriptor owned by nobody else.
    let master = unsafe { File::from_raw_fd(fd) };
    // SAFETY: grantpt/unlockpt take the master fd we own.
    cvt(unsafe { libc::grantpt(master.as_raw_fd()) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::unlockpt(master.as_raw_fd()) })?;
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `name` is a writable buffer of the length we pass.
    let r = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    // SAFETY: ptsname_r wrote a NUL-terminated string into `name`.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)?;
    set_size(&master, size)?;
    Ok(Pty { master, slave })
}

/// TIOCSWINSZ: the kernel also sends SIGWINCH to the foreground group.
pub fn set_size(master: &File, size: PtySize) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads the winsize we pass, which outlives the call.
    cvt(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// Make the terminal on stdin the child's controlling terminal. The child
/// must already be a session leader (`command::prepare` with a new session
/// installs that hook first, and std runs hooks in order, after it has set
/// up stdio).
pub fn make_controlling(cmd: &mut Command) {
    // SAFETY: the hook runs between fork and exec and only makes one
    // ioctl system call, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // SAFETY: TIOCSCTTY on fd 0 takes an integer argument.
            if libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    };
}
