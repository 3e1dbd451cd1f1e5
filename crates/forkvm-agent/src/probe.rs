//! Network probes: `net_probe` (can the guest reach the host's gateway?)
//! and `port_probe` (is a server in the guest accepting connections?), and
//! the guest's uptime for `pong`.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use forkvm_agent_protocol::{ERR_INVALID, ERR_IO};

use crate::serve::ReqError;

/// Connect to `addr:port`, retrying until `timeout_ms`: connected or refused
/// means the path works. Returns the microseconds it took.
pub fn net_probe(addr: &str, port: u16, timeout_ms: u32) -> Result<u64, String> {
    let ip: Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
    let to = SocketAddr::from((ip, port));
    let start = Instant::now();
    let limit = Duration::from_millis(u64::from(timeout_ms.max(1)));
    let mut last = String::new();
    while start.elapsed() < limit {
        let left = limit
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&to, left.min(Duration::from_millis(200))) {
            Ok(_) => return Ok(start.elapsed().as_micros() as u64),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Ok(start.elapsed().as_micros() as u64)
            }
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    Err(format!("no route to {to} within {timeout_ms} ms: {last}"))
}

/// Whether a connect error just means "nobody is listening there".
fn means_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT | libc::ENETUNREACH | libc::EHOSTUNREACH)
    )
}

/// Does a server accept a TCP connection on `port` of 127.0.0.1, or else
/// of ::1 (servers that bind "localhost" may take either)? One attempt per
/// address, each bounded by `timeout_ms`. The connection is closed at once.
pub fn port_open(port: u16, timeout_ms: u32) -> Result<bool, ReqError> {
    if port == 0 {
        return Err(ReqError {
            code: ERR_INVALID,
            message: "port 0 cannot be probed".into(),
        });
    }
    let limit = Duration::from_millis(u64::from(timeout_ms.max(1)));
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&v4, limit) {
        Ok(_) => return Ok(true),
        Err(e) if means_closed(&e) => {}
        Err(e) => {
            return Err(ReqError {
                code: ERR_IO,
                message: format!("cannot probe {v4}: {e}"),
            })
        }
    }
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    // IPv6 may be off in the guest: any failure there just means closed.
    Ok(TcpStream::connect_timeout(&v6, limit).is_ok())
}

/// Milliseconds since the guest kernel booted.
pub fn uptime_ms() -> u64 {
    if let Ok(s) = std::fs::read_to_string("/proc/uptime") {
        if let Some(secs) = s
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<f64>().ok())
        {
            return (secs * 1000.0) as u64;
        }
    }
    // /proc not mounted: CLOCK_BOOTTIME is the same clock.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0 {
        let ms = i128::from(ts.tv_sec) * 1000 + i128::from(ts.tv_nsec) / 1_000_000;
        return u64::try_from(ms).unwrap_or(0);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn open_and_closed_ports() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(port_open(port, 1000).unwrap());
        drop(l);
        assert!(!port_open(port, 1000).unwrap(), "refused means closed");
        assert_eq!(port_open(0, 10).unwrap_err().code, ERR_INVALID);
    }

    #[test]
    fn a_server_on_ipv6_loopback_only_counts() {
        let Ok(l) = TcpListener::bind("[::1]:0") else {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        };
        let port = l.local_addr().unwrap().port();
        assert!(port_open(port, 1000).unwrap());
    }

    #[test]
    fn net_probe_counts_refused_as_reachable() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        assert!(net_probe("127.0.0.1", port, 1000).is_ok());
        assert!(net_probe("not-an-ip", port, 10)
            .unwrap_err()
            .contains("not an IPv4"));
    }
}
