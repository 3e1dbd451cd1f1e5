//! Thin wrappers around the raw system calls the agent needs.
//!
//! Each wrapper turns the C convention (`-1` plus `errno`) into `io::Result`,
//! so the rest of the agent never touches `errno` or raw pointers. Nothing
//! here calls into NSS: the agent is linked statically against glibc, where
//! NSS lookups would try to `dlopen` modules that are not in the guest.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::ptr;

/// `finit_module` flag: the file is compressed and the kernel should
/// decompress it (`MODULE_INIT_COMPRESSED_FILE` in `<linux/module.h>`).
pub const MODULE_INIT_COMPRESSED_FILE: libc::c_int = 4;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn path_cstring(p: &Path) -> io::Result<CString> {
    Ok(CString::new(p.as_os_str().as_bytes())?)
}

/// mount(2). `fstype` and `data` are optional, as in C.
pub fn mount(
    source: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = CString::new(source)?;
    let target = path_cstring(target)?;
    let fstype = fstype.map(CString::new).transpose()?;
    let data = data.map(CString::new).transpose()?;
    let fstype_ptr = fstype.as_ref().map_or(ptr::null(), |s| s.as_ptr());
    let data_ptr = data.as_ref().map_or(ptr::null(), |s| s.as_ptr().cast());
    // SAFETY: every pointer is null or points at a NUL-terminated CString that
    // lives until after the call; mount(2) does not keep them.
    cvt(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype_ptr,
            flags,
            data_ptr,
        )
    })?;
    Ok(())
}

/// Whether `path` is the root of a mounted filesystem: its device differs
/// from its parent's. (Bind mounts of the same filesystem are not detected,
/// which is fine for the pseudo filesystems the agent mounts.)
pub fn is_mountpoint(path: &Path) -> io::Result<bool> {
    let Some(parent) = path.parent() else {
        return Ok(true); // "/" is always a mount point
    };
    let me = std::fs::metadata(path)?;
    let up = std::fs::metadata(parent)?;
    Ok(me.dev() != up.dev())
}

/// Load a kernel module from an open `.ko` file with `finit_module(2)`.
pub fn finit_module(file: &File, params: &str, flags: libc::c_int) -> io::Result<()> {
    let params = CString::new(params)?;
    // SAFETY: the fd belongs to `file`, which outlives the call; `params` is
    // a NUL-terminated string that outlives the call; flags is a plain int.
    let r = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            file.as_raw_fd(),
            params.as_ptr(),
            flags,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// sethostname(2).
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe the bytes of `name`, which stay
    // valid for the duration of the call; the kernel copies them.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// `RNDADDENTROPY` from `<linux/random.h>`: `_IOW('R', 0x03, int[2])`.
pub const RNDADDENTROPY: libc::Ioctl = 0x4008_5203;
/// `RNDRESEEDCRNG` from `<linux/random.h>`: `_IO('R', 0x07)` (Linux 4.17+).
pub const RNDRESEEDCRNG: libc::Ioctl = 0x5207;

/// Mix `data` into the kernel's input pool and credit `8 * data.len()` bits
/// of entropy (`ioctl(RNDADDENTROPY)`, needs CAP_SYS_ADMIN). `dev` is an open
/// `/dev/urandom` or `/dev/random`.
pub fn add_entropy(dev: &File, data: &[u8]) -> io::Result<()> {
    let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "entropy buffer too large");
    let bits = data
        .len()
        .checked_mul(8)
        .and_then(|b| libc::c_int::try_from(b).ok())
        .ok_or_else(too_big)?;
    let size = libc::c_int::try_from(data.len()).map_err(|_| too_big())?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    // Built as ints so the buffer is aligned for the struct; the bytes go in
    // in memory order, and the kernel reads exactly `buf_size` of them.
    let mut info: Vec<libc::c_int> = Vec::with_capacity(2 + data.len().div_ceil(4));
    info.push(bits);
    info.push(size);
    info.extend(data.chunks(4).map(|c| {
        let mut word = [0u8; 4];
        word[..c.len()].copy_from_slice(c);
        libc::c_int::from_ne_bytes(word)
    }));
    // SAFETY: `info` is a properly aligned rand_pool_info whose buffer holds
    // at least `buf_size` bytes after the two ints; it outlives the call and
    // the kernel only reads it. The fd belongs to `dev`, which outlives the
    // call.
    cvt(unsafe { libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) })?;
    Ok(())
}

/// Make the kernel's CRNG reseed itself from the input pool now, instead of
/// at its next scheduled reseed (`ioctl(RNDRESEEDCRNG)`, needs CAP_SYS_ADMIN).
pub fn reseed_crng(dev: &File) -> io::Result<()> {
    // SAFETY: RNDRESEEDCRNG takes no argument and touches no user memory; the
    // fd belongs to `dev`, which outlives the call.
    cvt(unsafe { libc::ioctl(dev.as_raw_fd(), RNDRESEEDCRNG) })?;
    Ok(())
}

/// Set the wall clock (`clock_settime(CLOCK_REALTIME)`, needs CAP_SYS_TIME).
pub fn set_realtime_ns(unix_time_ns: u64) -> io::Result<()> {
    let secs = libc::time_t::try_from(unix_time_ns / 1_000_000_000)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "time out of range"))?;
    // Below 10^9, so it fits every c_long.
    let nanos = (unix_time_ns % 1_000_000_000) as libc::c_long;
    let ts = libc::timespec {
        tv_sec: secs,
        tv_nsec: nanos,
    };
    // SAFETY: `ts` is a valid timespec that outlives the call; the kernel
    // only reads it.
    cvt(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) })?;
    Ok(())
}

/// Set IFF_UP on a network interface (`ip link set <name> up`).
pub fn interface_up(name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is a C struct of byte arrays and a union of integers and
    // sockaddrs; all-zero bytes are a valid value for every member.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifr_ifru.ifru_flags of
    // the ifreq we pass, which lives across the call.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) })?;
    // SAFETY: SIOCGIFFLAGS succeeded, so ifru_flags is the initialised member.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads ifr_name and ifru_flags from our ifreq.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) })?;
    Ok(())
}

/// A zeroed `ifreq` naming `name`, and an AF_INET datagram socket to send
/// interface ioctls on.
fn ifreq_for(name: &str) -> io::Result<(OwnedFd, libc::ifreq)> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero bytes are a valid ifreq (byte arrays and a union of
    // integers and sockaddrs).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok((sock, ifr))
}

fn sockaddr_in(a: std::net::Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux, and a
    // sockaddr is plain bytes; this is how the C API is meant to be used.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Give an interface an IPv4 address and netmask (`ip addr add A/P dev N`).
pub fn set_ipv4(name: &str, addr: std::net::Ipv4Addr, prefix: u8) -> io::Result<()> {
    let (sock, mut ifr) = ifreq_for(name)?;
    ifr.ifr_ifru.ifru_addr = sockaddr_in(addr);
    // SAFETY: SIOCSIFADDR reads ifr_name and ifru_addr of our ifreq.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR, &ifr) })?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    };
    ifr.ifr_ifru.ifru_netmask = sockaddr_in(std::net::Ipv4Addr::from(mask));
    // SAFETY: SIOCSIFNETMASK reads ifr_name and ifru_netmask.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFNETMASK, &ifr) })?;
    Ok(())
}

/// Add a default route via `gw` (`ip route add default via GW`).
pub fn add_default_route(gw: std::net::Ipv4Addr) -> io::Result<()> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: rtentry is a C struct of integers, pointers and sockaddrs; all
    // zero is a valid value (null device pointer = any interface).
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_in(gw);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT reads the rtentry we pass, which lives across the call.
    match cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &rt) }) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Send `sig` to every process in process group `pgid`.
pub fn kill_group(pgid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // Guard against pgid 0/1 (our own group / "everything"): only ever
    // called with the pid of a child we spawned as a group leader.
    if pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal process group <= 1",
        ));
    }
    // SAFETY: kill(2) takes no pointers.
    cvt(unsafe { libc::kill(-pgid, sig) })?;
    Ok(())
}

/// Send `sig` to every process except ourselves (kill(-1, sig)).
pub fn kill_all(sig: libc::c_int) {
    // SAFETY: kill(2) takes no pointers; failure (no processes) is harmless.
    unsafe { libc::kill(-1, sig) };
}

/// Wait up to `timeout_ms` for `fd` to be readable (or hung up).
pub fn poll_readable(fd: RawFd, timeout_ms: libc::c_int) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is a valid pollfd array of length 1 for the call.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r >= 0 {
            return Ok(r > 0 && pfd.revents != 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Fill `buf` from the kernel RNG (getrandom(2), blocking until it is
/// seeded, which it always is by the time a clone asks).
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is valid for writes of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// Detach a mount (`umount2(MNT_DETACH)`), ignoring errors: used to undo
/// a half-done set of mounts.
pub fn umount_detach(path: &str) {
    if let Ok(c) = CString::new(path) {
        // SAFETY: `c` is a valid NUL-terminated string for the call.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// sync(2).
pub fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Wait until everything written to the console has left the UART. Output
/// still queued in the tty layer would be lost by an immediate power off.
pub fn drain_console() {
    for fd in [1, 2] {
        // SAFETY: tcdrain(3) takes no pointers; a non-tty fd just fails.
        unsafe { libc::tcdrain(fd) };
    }
}

/// Remount `/` read-only (best effort, before powering off).
pub fn remount_root_readonly() -> io::Result<()> {
    mount(
        "none",
        Path::new("/"),
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY,
        None,
    )
}

/// Power the machine off. Only meaningful as pid 1; never returns.
pub fn power_off() -> ! {
    use std::io::Write;
    let _ = io::stdout().flush();
    sync();
    drain_console();
    // SAFETY: reboot(2) with RB_POWER_OFF takes no pointers; it only returns
    // on failure.
    unsafe { libc::reboot(libc::RB_POWER_OFF) };
    eprintln!(
        "forkvm-agent: power off failed: {}",
        io::Error::last_os_error()
    );
    drain_console();
    std::process::exit(1)
}
