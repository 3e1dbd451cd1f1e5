//! End-to-end tests of the protocol-2 requests through the serve loop
//! (resize_rootfs is left out: it would act on the test machine's own root
//! filesystem; see `rootfs` for its tests).

use super::tests::{error_code, exited, start, Host};
use super::*;
use crate::files::tests::temp_dir;
use crate::identity;
use forkvm_agent_protocol::tar::{Meta, Writer};
use std::collections::BTreeMap;
use std::time::Instant;

fn exec_msg(
    id: u64,
    argv: &[&str],
    user: Option<&str>,
    detach: bool,
    log: Option<&str>,
) -> HostMsg {
    HostMsg::Exec {
        id,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        timeout_ms: None,
        user: user.map(str::to_string),
        detach,
        log_path: log.map(str::to_string),
    }
}

fn wait_for(path: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = std::fs::read_to_string(path).unwrap_or_default();
        if s.contains(needle) || Instant::now() > deadline {
            return s;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exec_as_a_user() {
    let mut h = start();
    let out = {
        h.send(
            &exec_msg(1, &["forkvm-x"], Some("forkvm-no-such-user"), false, None),
            b"",
        );
        h.collect(1)
    };
    let (code, message) = error_code(&out.end);
    assert_eq!(code, ERR_INVALID);
    assert!(
        message.contains("does not exist in the image's /etc/passwd"),
        "{message}"
    );
    if !identity::is_root() {
        eprintln!("skipped the rest: needs root to change uid");
        return;
    }
    h.send(
        &exec_msg(
            2,
            &["sh", "-c", "echo $(id -u):$(id -g)"],
            Some("65534:65533"),
            false,
            None,
        ),
        b"",
    );
    let out = h.collect(2);
    assert_eq!(exited(&out), (Some(0), None, false));
    assert_eq!(out.stdout, b"65534:65533\n");
}

#[test]
fn detached_process_outlives_request_and_connection() {
    let d = temp_dir("serve-detach");
    let log = d.join("server.log");
    let log_s = log.to_str().unwrap();
    let mut h = start();
    let f = h.call(
        &exec_msg(
            5,
            &["sh", "-c", "echo up; sleep 0.5; echo still here"],
            None,
            true,
            Some(log_s),
        ),
        b"",
    );
    let GuestMsg::Started { id, pid, log_path } = f.msg else {
        panic!("expected started, got {:?}", f.msg);
    };
    assert_eq!((id, log_path.as_str()), (5, log_s));
    // The host goes away; the process carries on.
    drop(h);
    let text = wait_for(&log, "exited");
    assert_eq!(
        text,
        format!("up\nstill here\nforkvm-agent: pid {pid} exited with code 0\n")
    );

    let mut h = start();
    let f = h.call(&exec_msg(6, &["true"], None, true, None), b"stdin");
    assert_eq!(error_code(&Some(f.msg)).0, ERR_INVALID);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A TCP socket bound to a loopback port without listening: connecting to
/// the port is refused, and nobody else can bind it while the fd lives.
fn bound_not_listening() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
    // SAFETY: fd is a new descriptor nothing else owns.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_in of the length given.
    let rc = unsafe { libc::bind(fd, std::ptr::addr_of!(addr).cast(), len) };
    assert_eq!(rc, 0, "bind: {}", io::Error::last_os_error());
    // SAFETY: addr and len are valid for getsockname to fill in.
    let rc = unsafe { libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut len) };
    assert_eq!(rc, 0, "getsockname: {}", io::Error::last_os_error());
    (owned, u16::from_be(addr.sin_port))
}

#[test]
fn port_probe_sync_and_put_archive() {
    let mut h = start();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let probe = |id| HostMsg::PortProbe {
        id,
        port,
        timeout_ms: 500,
    };
    assert_eq!(
        h.call(&probe(1), b"").msg,
        GuestMsg::PortOpen { id: 1, open: true }
    );
    drop(l);
    // A freed port can be taken at once by another test of this process;
    // a socket bound but never listening keeps its port closed to
    // connections and ours for the probe.
    let (_held, closed) = bound_not_listening();
    let probe2 = HostMsg::PortProbe {
        id: 2,
        port: closed,
        timeout_ms: 500,
    };
    assert_eq!(
        h.call(&probe2, b"").msg,
        GuestMsg::PortOpen { id: 2, open: false }
    );
    assert_eq!(
        h.call(&HostMsg::Sync { id: 3 }, b"").msg,
        GuestMsg::Synced { id: 3 }
    );

    let d = temp_dir("serve-archive");
    let mut w = Writer::new();
    w.file("app/main.py", &Meta::default(), b"print(1)\n");
    w.symlink("app/link", "main.py", &Meta::default());
    let put = |id, archive: &[u8], h: &mut Host| {
        h.call(
            &HostMsg::PutArchive {
                id,
                dest: d.join("dest").to_str().unwrap().into(),
                owner: None,
                append_at: None,
            },
            archive,
        )
        .msg
    };
    let tar = w.finish();
    assert_eq!(
        put(4, &tar, &mut h),
        GuestMsg::ArchiveWritten {
            id: 4,
            entries: 2,
            bytes: 9
        }
    );
    assert_eq!(
        std::fs::read(d.join("dest/app/main.py")).unwrap(),
        b"print(1)\n"
    );
    let reply = Some(put(5, &tar[..1124], &mut h)); // inside the second header
    let (code, message) = error_code(&reply);
    assert_eq!(code, ERR_INVALID);
    assert!(message.contains("truncated"), "{message}");
    std::fs::remove_dir_all(&d).unwrap();
}
