//! A minimal HTTP/1.1 client for the forkvm daemon, over a unix socket or TCP.
//!
//! `FORKVM_URL` selects the target: `unix:///path/to/forkvm.sock` (or a bare
//! path) or `http://host:port`. Without it, the default socket in the data
//! directory is used. `FORKVM_TOKEN` is sent as a bearer token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::gc::{PruneRequest, PruneResult};
use crate::types::*;

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    /// `host:port`
    Tcp(String),
}

impl Target {
    /// Parse a `FORKVM_URL` value.
    pub fn parse(url: &str) -> Result<Target, String> {
        if let Some(p) = url.strip_prefix("unix://") {
            return Ok(Target::Unix(PathBuf::from(p)));
        }
        if url.starts_with('/') {
            return Ok(Target::Unix(PathBuf::from(url)));
        }
        if let Some(rest) = url.strip_prefix("http://") {
            let hostport = rest.trim_end_matches('/');
            if hostport.is_empty() || hostport.contains('/') {
                return Err(format!("bad FORKVM_URL {url:?}: expected http://HOST:PORT"));
            }
            return Ok(Target::Tcp(hostport.to_string()));
        }
        Err(format!(
            "bad FORKVM_URL {url:?}: use unix:///path/to/forkvm.sock or http://HOST:PORT"
        ))
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix://{}", p.display()),
            Target::Tcp(h) => write!(f, "http://{h}"),
        }
    }
}

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the forkvm daemon at {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP error talking to the daemon: {0}")]
    Http(String),
    /// The daemon answered with an error status.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
        /// What to do next, as an action the client words its own way.
        hint: Option<crate::types::ErrorHint>,
    },
    #[error("unexpected response from the daemon: {0}")]
    Decode(String),
}

impl ClientError {
    /// The API error code, if the daemon returned one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The error a stream reported in one of its events.
    pub fn from_detail(error: crate::types::ErrorDetail) -> Self {
        ClientError::Api {
            status: crate::codes::status_of(&error.code),
            code: error.code,
            message: error.message,
            hint: error.hint,
        }
    }
}

/// A raw response.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// The daemon client.
#[derive(Debug, Clone)]
pub struct Client {
    pub target: Target,
    pub token: Option<String>,
    /// Per-request timeout (exec requests add their own timeout to it).
    pub timeout: Duration,
}

impl Client {
    pub fn new(target: Target, token: Option<String>) -> Client {
        Client {
            target,
            token,
            timeout: Duration::from_secs(600),
        }
    }

    /// From `FORKVM_URL`/`FORKVM_TOKEN`, defaulting to the local socket.
    pub fn from_env() -> Result<Client, String> {
        let target = match std::env::var(crate::ENV_URL) {
            Ok(u) if !u.is_empty() => Target::parse(&u)?,
            _ => Target::Unix(crate::home_dir().join(crate::SOCKET_NAME)),
        };
        let token = std::env::var(crate::ENV_TOKEN)
            .ok()
            .filter(|t| !t.is_empty());
        Ok(Client::new(target, token))
    }

    /// The default unix socket path for a data directory.
    pub fn default_socket(home: &Path) -> PathBuf {
        home.join(crate::SOCKET_NAME)
    }

    /// Send one request and return the raw response, whatever its status.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<Response, ClientError> {
        let fut = self.raw_inner(method, path, body);
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Http(format!("no response within {:?}", self.timeout)))?
    }

    async fn raw_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<Response, ClientError> {
        let resp = self.open(method, path, body).await?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        Ok(Response {
            status,
            content_type,
            body,
        })
    }

    /// Send a request and return the response with its body unread.
    pub(crate) async fn open(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let (payload, ct) = match body {
            Some((b, ct)) => (b, Some(ct)),
            None => (Bytes::new(), None),
        };
        let payload = Full::new(payload).map_err(|never| match never {}).boxed();
        self.open_body(method, path, payload, ct).await
    }

    /// Send a request with any body (e.g. a file streamed from disk).
    pub(crate) async fn open_body(
        &self,
        method: Method,
        path: &str,
        payload: BoxBody<Bytes, std::io::Error>,
        content_type: Option<&str>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let connect_err = |source| ClientError::Connect {
            target: self.target.to_string(),
            source,
        };
        let mut req = Request::builder().method(method).uri(path);
        req = match &self.target {
            Target::Unix(_) => req.header(HOST, "localhost"),
            Target::Tcp(h) => req.header(HOST, h.as_str()),
        };
        if let Some(t) = &self.token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        let req = req
            .body(payload)
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let resp = match &self.target {
            Target::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                send(TokioIo::new(s), req).await?
            }
            Target::Tcp(h) => {
                let s = tokio::net::TcpStream::connect(h.as_str())
                    .await
                    .map_err(connect_err)?;
                send(TokioIo::new(s), req).await?
            }
        };
        Ok(resp)
    }

    /// [`Client::open`] bounded by the client's timeout (for streams: the
    /// time to the response's head, not to its end).
    pub(crate) async fn open_timed(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        tokio::time::timeout(self.timeout, self.open(method, path, body))
            .await
            .map_err(|_| ClientError::Http(format!("no response within {:?}", self.timeout)))?
    }

    /// Send a request and turn non-2xx statuses into [`ClientError::Api`].
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &str)>,
    ) -> Result<Bytes, ClientError> {
        let r = self.raw(method, path, body).await?;
        if r.status.is_success() {
            return Ok(r.body);
        }
        Err(api_error(r.status, &r.body))
    }

    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let body = match body {
            Some(b) => Some((
                Bytes::from(serde_json::to_vec(b).map_err(|e| ClientError::Decode(e.to_string()))?),
                "application/json",
            )),
            None => None,
        };
        let bytes = self.call(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        self.json(Method::GET, "/v1/health", None::<&()>).await
    }

    pub async fn info(&self) -> Result<Info, ClientError> {
        self.json(Method::GET, "/v1/info", None::<&()>).await
    }

    /// `GET /v1/cluster`: only a cluster gateway answers it.
    pub async fn cluster(&self) -> Result<crate::ClusterStatus, ClientError> {
        self.json(Method::GET, "/v1/cluster", None::<&()>).await
    }

    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox, ClientError> {
        self.json(Method::POST, "/v1/sandboxes", Some(req)).await
    }

    pub async fn list_sandboxes(&self) -> Result<SandboxList, ClientError> {
        self.json(Method::GET, "/v1/sandboxes", None::<&()>).await
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox, ClientError> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// The sandbox's published ports.
    pub async fn ports(&self, id: &str) -> Result<Vec<crate::PortForward>, ClientError> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}/ports", enc(id)),
            None::<&()>,
        )
        .await
    }

    pub async fn delete_sandbox(&self, id: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/v1/sandboxes/{}", enc(id)), None)
            .await
            .map(drop)
    }

    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", enc(id)),
            Some(req),
        )
        .await
    }

    /// Run a command with its output streamed (`stream: true`): `on_event`
    /// sees every event as it arrives; the final `exit` event is returned.
    /// A stream that ends in an `error` event gives [`ClientError::Api`].
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecRequest,
        mut on_event: impl FnMut(&ExecEvent),
    ) -> Result<ExecEvent, ClientError> {
        let mut req = req.clone();
        req.stream = true;
        let body =
            Bytes::from(serde_json::to_vec(&req).map_err(|e| ClientError::Decode(e.to_string()))?);
        let path = format!("/v1/sandboxes/{}/exec", enc(id));
        let resp = tokio::time::timeout(
            self.timeout,
            self.open(Method::POST, &path, Some((body, "application/json"))),
        )
        .await
        .map_err(|_| ClientError::Http(format!("no response within {:?}", self.timeout)))??;
        read_ndjson(resp, "exec", |ev: ExecEvent| {
            on_event(&ev);
            match ev {
                ExecEvent::Exit { .. } => Some(Ok(ev)),
                ExecEvent::Error { error } => Some(Err(ClientError::from_detail(error))),
                _ => None,
            }
        })
        .await
    }

    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        data: Bytes,
    ) -> Result<FileWritten, ClientError> {
        let mut uri = format!("/v1/sandboxes/{}/files?path={}", enc(id), enc(path));
        if let Some(m) = mode {
            uri.push_str(&format!("&mode={m:o}"));
        }
        let b = self
            .call(Method::PUT, &uri, Some((data, "application/octet-stream")))
            .await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn read_file(&self, id: &str, path: &str) -> Result<Bytes, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/sandboxes/{}/files?path={}", enc(id), enc(path)),
            None,
        )
        .await
    }

    /// Spawn `req.count` sandboxes at once.
    pub async fn create_batch(&self, req: &CreateSandbox) -> Result<SandboxBatch, ClientError> {
        self.json(Method::POST, "/v1/sandboxes", Some(req)).await
    }

    pub async fn snapshot(&self, id: &str, req: &CreateSnapshot) -> Result<Snapshot, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/snapshot", enc(id)),
            Some(req),
        )
        .await
    }

    pub async fn branch(&self, id: &str, req: &BranchRequest) -> Result<BranchResult, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/branch", enc(id)),
            Some(req),
        )
        .await
    }

    pub async fn list_snapshots(&self) -> Result<SnapshotList, ClientError> {
        self.json(Method::GET, "/v1/snapshots", None::<&()>).await
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<Snapshot, ClientError> {
        self.json(
            Method::GET,
            &format!("/v1/snapshots/{}", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Remove a snapshot; `force` also removes what depends on it.
    pub async fn delete_snapshot(&self, id: &str, force: bool) -> Result<(), ClientError> {
        let q = if force { "?force=true" } else { "" };
        self.call(
            Method::DELETE,
            &format!("/v1/snapshots/{}{q}", enc(id)),
            None,
        )
        .await
        .map(drop)
    }

    pub async fn flatten(&self, id: &str, req: &FlattenRequest) -> Result<Snapshot, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/snapshots/{}/flatten", enc(id)),
            Some(req),
        )
        .await
    }

    /// Set a snapshot's warm-pool size; `None` makes it follow the daemon's
    /// default.
    pub async fn set_pool(&self, id: &str, size: Option<u32>) -> Result<Snapshot, ClientError> {
        self.json(
            Method::PUT,
            &format!("/v1/snapshots/{}/pool", enc(id)),
            Some(&PoolConfig { size }),
        )
        .await
    }

    /// Keep a snapshot from garbage collection.
    pub async fn pin_snapshot(&self, id: &str) -> Result<Snapshot, ClientError> {
        self.json(
            Method::PUT,
            &format!("/v1/snapshots/{}/pin", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Let garbage collection take a snapshot again (if nothing else keeps it).
    pub async fn unpin_snapshot(&self, id: &str) -> Result<Snapshot, ClientError> {
        self.json(
            Method::DELETE,
            &format!("/v1/snapshots/{}/pin", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Collect the branch points nothing needs, now.
    pub async fn prune_snapshots(&self, req: &PruneRequest) -> Result<PruneResult, ClientError> {
        self.json(Method::POST, "/v1/snapshots/prune", Some(req))
            .await
    }

    pub async fn logs(&self, id: &str) -> Result<Bytes, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/sandboxes/{}/logs", enc(id)),
            None,
        )
        .await
    }
}

async fn send<I>(
    io: I,
    req: Request<BoxBody<Bytes, std::io::Error>>,
) -> Result<hyper::Response<hyper::body::Incoming>, ClientError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| ClientError::Http(e.to_string()))
}

/// Read a newline-delimited JSON response line by line. `each` gets every
/// line as a `T` and ends the stream by returning `Some`; a stream that
/// ends first is an error naming `what`. A non-2xx status is the usual
/// [`ClientError::Api`].
pub(crate) async fn read_ndjson<T: DeserializeOwned, R>(
    resp: hyper::Response<hyper::body::Incoming>,
    what: &str,
    mut each: impl FnMut(T) -> Option<Result<R, ClientError>>,
) -> Result<R, ClientError> {
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        return Err(api_error(status, &bytes));
    }
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ClientError::Http(e.to_string()))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(data);
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let v: T = serde_json::from_slice(&line[..line.len() - 1])
                .map_err(|e| ClientError::Decode(format!("bad {what} stream line: {e}")))?;
            if let Some(r) = each(v) {
                return r;
            }
        }
    }
    Err(ClientError::Http(format!(
        "the {what} stream ended before its last event"
    )))
}

/// The error a non-2xx response carries.
pub(crate) fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => ClientError::Api {
            status: status.as_u16(),
            code: e.error.code,
            message: e.error.message,
            hint: e.error.hint,
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            code: "http".into(),
            message: String::from_utf8_lossy(body).into_owned(),
            hint: None,
        },
    }
}

/// Percent-encode a path segment or query value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            Target::parse("unix:///run/x.sock").unwrap(),
            Target::Unix("/run/x.sock".into())
        );
        assert_eq!(
            Target::parse("/run/x.sock").unwrap(),
            Target::Unix("/run/x.sock".into())
        );
        assert_eq!(
            Target::parse("http://127.0.0.1:7070/").unwrap(),
            Target::Tcp("127.0.0.1:7070".into())
        );
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http://").is_err());
    }

    #[test]
    fn encoding_escapes_query_metacharacters() {
        assert_eq!(enc("/tmp/a b&c=d"), "/tmp/a%20b%26c%3Dd");
        assert_eq!(enc("é"), "%C3%A9");
    }
}
