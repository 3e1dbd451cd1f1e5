//! `forkvm ui`: open the dashboard (docs/dashboard.md).
//!
//! On TCP the daemon serves `/ui` itself and asks for the token, so this
//! only prints (and opens) its URL. On the unix socket a browser cannot
//! connect, so this relays a loopback port to the socket, for as long as it
//! runs.
//!
//! The socket needs no auth: whoever may open it is trusted. A loopback port
//! is open to every local user, so the relay admits only a browser that
//! knows a secret made for this run: the printed URL carries it once
//! (`/ui/login?key=…`), the relay answers that request itself with a
//! session cookie (`HttpOnly`, `SameSite=Strict`), and every later
//! connection must present the cookie in its first request. After that
//! check a connection is a plain byte pump to the socket; HTTP keep-alive
//! reuses it for the same browser only.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

use forkvm_api::Target;

/// The relay's cookie.
const COOKIE: &str = "forkvm_relay";
/// Most bytes of request head read before deciding.
const MAX_HEAD: usize = 16 << 10;

pub async fn run(port: u16, open: bool) -> Result<()> {
    let target = match std::env::var(forkvm_api::ENV_URL) {
        Ok(u) if !u.is_empty() => Target::parse(&u).map_err(|e| anyhow!(e))?,
        _ => Target::Unix(forkvm_api::home_dir().join(forkvm_api::SOCKET_NAME)),
    };
    match target {
        Target::Tcp(addr) => {
            let url = format!("http://{addr}/ui/");
            println!("{url}");
            println!("sign in with the daemon's token (FORKVM_TOKEN)");
            if open {
                launch(&url);
            }
            Ok(())
        }
        Target::Unix(sock) => relay(&sock, port, open).await,
    }
}

async fn relay(sock: &Path, port: u16, open: bool) -> Result<()> {
    // Fail now, with the usual hint, rather than at the browser's first request.
    UnixStream::connect(sock).await.with_context(|| {
        format!(
            "cannot reach the daemon at {}; start it with `forkvm serve` (or set FORKVM_URL)",
            sock.display()
        )
    })?;
    let l = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{port}; try another --port"))?;
    let addr = l.local_addr()?;
    let key = secret()?;
    let url = format!("http://{addr}/ui/login?key={key}");
    println!("{url}");
    eprintln!(
        "forkvm ui: relaying {addr} to {}; Ctrl-C to stop",
        sock.display()
    );
    if open {
        launch(&url);
    }
    let sock: PathBuf = sock.to_path_buf();
    loop {
        let (c, _) = l.accept().await?;
        let (sock, key) = (sock.clone(), key.clone());
        tokio::spawn(async move {
            if let Err(e) = serve(c, &sock, &key).await {
                eprintln!("forkvm ui: {e:#}");
            }
        });
    }
}

/// 32 random bytes, hex.
fn secret() -> Result<String> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .context("cannot read /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// What to do with a connection, from its first request's head.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The login link: answer with the cookie.
    Login,
    /// Has the cookie: relay.
    Relay,
    Refuse,
}

fn judge(head: &str, key: &str) -> Verdict {
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("");
    let target = request.split(' ').nth(1).unwrap_or("");
    if let Some(q) = target.strip_prefix("/ui/login?") {
        if q.split('&')
            .any(|kv| kv.strip_prefix("key=").is_some_and(|v| eq(v, key)))
        {
            return Verdict::Login;
        }
    }
    let has = lines
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("cookie"))
        .flat_map(|(_, v)| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == COOKIE && eq(v, key));
    if has {
        Verdict::Relay
    } else {
        Verdict::Refuse
    }
}

/// Compare without an early exit.
fn eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut d = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        d |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff));
    }
    d == 0
}

async fn serve(mut c: TcpStream, sock: &Path, key: &str) -> Result<()> {
    let mut head = Vec::with_capacity(2048);
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Err(anyhow!("a request head over {MAX_HEAD} bytes; dropped"));
        }
        let n = c.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let reply = match judge(&text, key) {
        Verdict::Relay => {
            let mut d = UnixStream::connect(sock)
                .await
                .with_context(|| format!("cannot reach the daemon at {}", sock.display()))?;
            d.write_all(&head).await?;
            tokio::io::copy_bidirectional(&mut c, &mut d).await?;
            return Ok(());
        }
        Verdict::Login => format!(
            "HTTP/1.1 303 See Other\r\nLocation: /ui/\r\n\
             Set-Cookie: {COOKIE}={key}; Path=/; HttpOnly; SameSite=Strict\r\n\
             Cache-Control: no-store\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        Verdict::Refuse => {
            let body = "forkvm ui: open the link `forkvm ui` printed (it carries this run's key)\n";
            format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
    };
    c.write_all(reply.as_bytes()).await?;
    c.shutdown().await?;
    Ok(())
}

/// Open `url` in the desktop's browser, if there is a desktop.
fn launch(url: &str) {
    let desktop =
        std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    if !desktop {
        eprintln!("forkvm ui: no desktop session; open the URL above in a browser");
        return;
    }
    if let Err(e) = std::process::Command::new("xdg-open")
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        eprintln!("forkvm ui: cannot run xdg-open ({e}); open the URL above in a browser");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_key_or_its_cookie_gets_through() {
        let k = "abc123";
        let req = |line: &str, extra: &str| format!("{line}\r\nHost: x\r\n{extra}\r\n");
        assert_eq!(
            judge(&req("GET /ui/login?key=abc123 HTTP/1.1", ""), k),
            Verdict::Login
        );
        assert_eq!(
            judge(&req("GET /ui/login?x=1&key=abc123 HTTP/1.1", ""), k),
            Verdict::Login
        );
        assert_eq!(
            judge(&req("GET /ui/login?key=abc12 HTTP/1.1", ""), k),
            Verdict::Refuse
        );
        assert_eq!(
            judge(
                &req(
                    "GET /v1/events HTTP/1.1",
                    "cookie: a=1; forkvm_relay=abc123\r\n"
                ),
                k
            ),
            Verdict::Relay
        );
        assert_eq!(
            judge(
                &req("GET /v1/info HTTP/1.1", "Cookie: forkvm_relay=nope\r\n"),
                k
            ),
            Verdict::Refuse
        );
        assert_eq!(judge(&req("GET /v1/info HTTP/1.1", ""), k), Verdict::Refuse);
        assert_eq!(judge("", k), Verdict::Refuse);
    }

    #[test]
    fn secrets_are_long_and_differ() {
        let (a, b) = (secret().unwrap(), secret().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
