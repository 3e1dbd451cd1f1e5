//! Which descriptors a child keeps across exec.
//!
//! QEMU must get only what it is given (stdio, the tap, the uid lock), not
//! whatever the daemon inherited from its parent without close-on-exec or a
//! library opened without it (issue 30: a pipe at fd 251 of the daemon's
//! parent was open inside QEMU).

use std::io;
use std::os::fd::RawFd;

use crate::jail::check;

/// Mark every descriptor above 2 close-on-exec except those in `keep`
/// (sorted, each above 2): whatever the daemon inherited from its parent
/// without close-on-exec, or a library opened without it, does not reach
/// QEMU. Marking instead of closing keeps the descriptor `std` uses to
/// report a failed exec working until the exec.
///
/// # Safety
/// Only between `fork` and `exec`; it allocates nothing.
pub unsafe fn cloexec_all_except(keep: &[RawFd]) -> io::Result<()> {
    let mut from: u32 = 3;
    for &k in keep {
        let k = k as u32;
        if k > from {
            // SAFETY: close_range(2) on integers.
            unsafe { cloexec_range(from, k - 1)? };
        }
        from = from.max(k + 1);
    }
    // SAFETY: as above.
    unsafe { cloexec_range(from, u32::MAX) }
}

const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// close_range(first, last, CLOSE_RANGE_CLOEXEC), or (before Linux 5.11)
/// fcntl over the numbers below the soft RLIMIT_NOFILE.
unsafe fn cloexec_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: plain syscalls on integers and a struct we own.
    unsafe {
        let r = libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            last as libc::c_uint,
            CLOSE_RANGE_CLOEXEC,
        );
        if r == 0 {
            return Ok(());
        }
        let errno = *libc::__errno_location();
        if errno != libc::ENOSYS && errno != libc::EINVAL {
            return check(-1, "close_range");
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        check(
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim),
            "getrlimit(NOFILE)",
        )?;
        let end = u64::from(last).min(lim.rlim_cur.saturating_sub(1));
        for fd in u64::from(first)..=end {
            let fd = fd as libc::c_int;
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kept_descriptors_survive_exec() {
        use std::os::unix::process::CommandExt;
        // Two descriptors without close-on-exec, as a daemon's parent may
        // leave them: 200 is kept, 201 must not reach the program.
        let mut cmd = std::process::Command::new("ls");
        cmd.args(["-1", "/proc/self/fd"]);
        // SAFETY: dup2(2) and close_range(2) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                for fd in [200, 201] {
                    if libc::dup2(2, fd) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                cloexec_all_except(&[200])
            });
        }
        let o = cmd.output().expect("ls");
        assert!(o.status.success());
        let mut fds: Vec<u32> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        fds.sort_unstable();
        // ls's own directory descriptor is 3.
        assert_eq!(fds, [0, 1, 2, 3, 200]);
    }
}
