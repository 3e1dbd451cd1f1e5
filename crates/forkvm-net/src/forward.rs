//! Port forwarding: a TCP listener on a host loopback port, relaying each
//! connection to a guest port.
//!
//! A userspace relay rather than a DNAT on the host: every sandbox has the
//! same guest address, so the host cannot route to a guest directly; the
//! relay dials the sandbox's unique uplink address, and the namespace's
//! DNAT rule carries the connection on to the guest. A relay also needs no
//! `route_localnet` change on the host, and it ends with the daemon, so a
//! crashed daemon leaves no forwarded port behind (the next one re-opens
//! the recorded ports).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running forward; dropping it closes the listener and every relayed
/// connection.
pub struct Forward {
    pub host_port: u16,
    pub guest_port: u16,
    task: JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listen on `127.0.0.1:host_port` (0: any free port) and relay to
/// `target:guest_port`.
pub async fn open(host_port: u16, target: Ipv4Addr, guest_port: u16) -> std::io::Result<Forward> {
    let listener = TcpListener::bind(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::LOCALHOST,
        host_port,
    )))
    .await?;
    let bound = listener.local_addr()?.port();
    let to = SocketAddr::V4(SocketAddrV4::new(target, guest_port));
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                r = listener.accept() => {
                    let Ok((mut inbound, _)) = r else { continue };
                    conns.spawn(async move {
                        let out = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(to)).await;
                        if let Ok(Ok(mut out)) = out {
                            let _ = out.set_nodelay(true);
                            let _ = inbound.set_nodelay(true);
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                        // On failure the inbound connection is closed: the
                        // client sees EOF, as with nothing listening.
                    });
                }
                // Reap finished relays so the set does not grow.
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(Forward {
        host_port: bound,
        guest_port,
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn relays_both_ways_and_closes_on_drop() {
        // A real echo server on loopback stands in for the guest.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    loop {
                        let n = s.read(&mut b).await.unwrap_or(0);
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let f = open(0, Ipv4Addr::LOCALHOST, port).await.unwrap();
        assert_ne!(f.host_port, 0);
        let mut c = TcpStream::connect(("127.0.0.1", f.host_port))
            .await
            .unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        let hp = f.host_port;
        drop(f);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(("127.0.0.1", hp)).await.is_err());
        // The relayed connection was closed too.
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut b)).await;
        assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
    }

    #[tokio::test]
    async fn a_taken_port_is_an_error() {
        let held = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = held.local_addr().unwrap().port();
        assert!(open(p, Ipv4Addr::LOCALHOST, 9).await.is_err());
    }
}
