//! E2B's envd, the in-sandbox daemon the SDKs' `commands`, `pty` and
//! `files` modules talk to, served by forkvm on the host for each sandbox,
//! with the guest agent underneath.
//!
//! ```text
//!  SDK ──HTTP/1.1──> daemon TCP listener ──(E2b-Sandbox-Id, X-Access-Token)──> envd::router
//!                      POST /process.Process/<Method>        ─┐ Connect, JSON
//!                      POST /filesystem.Filesystem/<Method>  ─┘ (connect.rs)
//!                      GET|POST /files, GET /health, GET /envs
//!                                   │ one engine action per call
//!                                   v
//!                      crate::actions::Engine ──> guest agent  (protocol 3)
//! ```
//!
//! The router only parses and renders, as `/v1` does: `connect` is the
//! protocol's framing, `wire` the message shapes, `process` and
//! `filesystem` the two services, `files` the upload and download
//! endpoints.
//!
//! **Users.** The SDK names a user with `Authorization: Basic
//! base64("<name>:")` (and `?username=` on `/files`); with none, envd's
//! default user applies. Here a named user is who a process runs as and
//! who owns an uploaded file; with none, the image's `User` (else root)
//! is, exactly as for `/v1`. Relative paths are taken from that user's
//! home (`/root` for root, `/home/<name>` otherwise). Filesystem
//! operations other than uploads run as the agent, i.e. root.

mod connect;
mod deadline;
mod files;
mod filesystem;
mod process;
mod wire;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine as _;

use self::connect::{Code, ConnectError};
use super::EnvdTarget;
use crate::actions::Engine;

/// The envd version reported to the SDK, which gates features on it.
///
/// 0.5.7 is the newest envd whose whole feature set is served here:
/// recursive watches (0.1.4), optional stdin (0.3.0), the default user when
/// none is named (0.4.0), closing stdin (0.5.2) and uploads as
/// `application/octet-stream` (0.5.7). The next gate, file metadata
/// (0.6.2, `user.e2b.*` xattrs), has no agent operation behind it, so
/// reporting 0.6.x would let the SDK send metadata that would be lost.
pub const ENVD_VERSION: &str = "0.5.7";

/// One call to envd: which sandbox, as whom, and the request.
pub(crate) struct Call {
    pub mgr: Engine,
    pub id: String,
    /// The user named by the request, if any.
    pub user: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When the call must be over, from `Connect-Timeout-Ms` (none without
    /// it, or with 0, as envd takes it).
    pub deadline: Option<tokio::time::Instant>,
}

impl Call {
    fn content_type(&self) -> Option<&str> {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
    }

    /// The user operations run as: the one named, else the image's.
    fn effective_user(&self) -> Option<String> {
        self.user
            .clone()
            .or_else(|| self.mgr.exec_defaults(&self.id).ok().and_then(|d| d.user))
    }

    /// An absolute guest path: relative ones are under the user's home.
    fn resolve(&self, path: &str) -> Result<String, ConnectError> {
        resolve_path(path, self.effective_user().as_deref())
    }
}

/// The home directory E2B gives a user: `/root` for root, else
/// `/home/<name>`. A numeric uid has no name to go by, so its home is `/`.
fn home_of(user: Option<&str>) -> String {
    let name = user.unwrap_or("root").split(':').next().unwrap_or("root");
    if name.is_empty() || name == "root" || name == "0" {
        "/root".into()
    } else if name.bytes().all(|b| b.is_ascii_digit()) {
        "/".into()
    } else {
        format!("/home/{name}")
    }
}

fn resolve_path(path: &str, user: Option<&str>) -> Result<String, ConnectError> {
    if path.contains('\0') {
        return Err(ConnectError::invalid("a path must not contain NUL"));
    }
    if path.starts_with('/') {
        return Ok(path.to_string());
    }
    let home = home_of(user);
    let rel = path.trim_start_matches("./");
    if rel.is_empty() || rel == "." {
        return Ok(home);
    }
    if rel == "~" {
        return Ok(home);
    }
    let rel = rel.strip_prefix("~/").unwrap_or(rel);
    Ok(format!("{}/{rel}", home.trim_end_matches('/')))
}

/// The user named by `Authorization: Basic base64("<name>:")`.
fn basic_user(h: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(v) = h.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || {
        ConnectError::new(
            Code::Unauthenticated,
            "Authorization must be Basic base64(\"<username>:\") to name a user",
        )
    };
    let v = v.to_str().map_err(|_| bad())?;
    let b64 = v
        .strip_prefix("Basic ")
        .or_else(|| v.strip_prefix("basic "))
        .ok_or_else(bad)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| bad())?;
    let s = String::from_utf8(raw).map_err(|_| bad())?;
    let name = s.split(':').next().unwrap_or("");
    Ok((!name.is_empty()).then(|| name.to_string()))
}

/// The envd routes. Handlers find their sandbox in the [`EnvdTarget`]
/// request extension.
pub(crate) fn router() -> Router<Engine> {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/envs", get(envs))
        .route("/files", get(files::download).post(files::upload))
        .route("/{service}/{method}", post(rpc))
        .fallback(|req: Request| async move {
            http_error(
                StatusCode::NOT_FOUND,
                format!(
                    "{} {} is not an envd route served by forkvm (docs/e2b.md lists them)",
                    req.method(),
                    req.uri().path()
                ),
            )
        })
}

/// An envd error of the plain HTTP endpoints: `{"code": status, "message"}`.
pub(crate) fn http_error(status: StatusCode, message: String) -> Response {
    super::error(status, message)
}

/// `GET /envs`: the environment a process starts with (the image's `Env`
/// and the sandbox's own).
async fn envs(State(m): State<Engine>, Extension(t): Extension<EnvdTarget>) -> Response {
    let defaults = match m.exec_defaults(&t.sandbox_id) {
        Ok(d) => d,
        Err(e) => return http_error(crate::api::error::status(&e), e.to_string()),
    };
    let mut env = defaults.env_map();
    match m.get(&t.sandbox_id) {
        Ok(mut sb) => env.append(&mut sb.env),
        Err(e) => return http_error(crate::api::error::status(&e), e.to_string()),
    }
    Json(env).into_response()
}

/// `POST /<service>/<method>`: one Connect call.
async fn rpc(
    State(mgr): State<Engine>,
    Extension(t): Extension<EnvdTarget>,
    Path((service, method)): Path<(String, String)>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let user = match basic_user(&parts.headers) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let stream = matches!(
        (service.as_str(), method.as_str()),
        ("process.Process", "Start" | "Connect") | ("filesystem.Filesystem", "WatchDir")
    );
    let deadline = match deadline::of(&parts.headers) {
        Ok(d) => d,
        Err(e) if stream => return connect::stream_error(e),
        Err(e) => return e.into_response(),
    };
    let mut call = Call {
        mgr,
        id: t.sandbox_id,
        user,
        headers: parts.headers,
        body: Bytes::new(),
        deadline,
    };
    // The one client stream reads its body as it arrives.
    if service == "process.Process" && method == "StreamInput" {
        return deadline::unary(deadline, process::stream_input(call, body), true).await;
    }
    // Requests are small messages; 16 MiB covers a stdin chunk of the
    // agent's 4 MiB input queue in base64 with room to spare.
    call.body = match axum::body::to_bytes(body, connect::MAX_ENVELOPE + 5).await {
        Ok(b) => b,
        Err(e) => {
            return ConnectError::new(Code::ResourceExhausted, format!("request body: {e}"))
                .into_response()
        }
    };
    // A stream's own deadline is kept by its task (process::render,
    // filesystem::watch_dir); this one bounds the work before it begins,
    // and a unary call's whole. Not a Start's: abandoning it half-way could
    // leave a process started that nobody kills, so its stream's task
    // kills it once the deadline has passed, however soon that is.
    let setup = deadline.filter(|_| service != "process.Process" || method != "Start");
    let answer = async move { dispatch(call, &service, &method).await };
    deadline::unary(setup, answer, stream).await
}

async fn dispatch(call: Call, service: &str, method: &str) -> Response {
    match (service, method) {
        ("process.Process", "Start") => process::start(call).await,
        ("process.Process", "Connect") => process::connect(call).await,
        ("process.Process", "List") => process::list(call).await,
        ("process.Process", "SendInput") => process::send_input(call).await,
        ("process.Process", "SendSignal") => process::send_signal(call).await,
        ("process.Process", "Update") => process::update(call).await,
        ("process.Process", "CloseStdin") => process::close_stdin(call).await,
        ("filesystem.Filesystem", "Stat") => filesystem::stat(call).await,
        ("filesystem.Filesystem", "MakeDir") => filesystem::make_dir(call).await,
        ("filesystem.Filesystem", "Move") => filesystem::move_entry(call).await,
        ("filesystem.Filesystem", "ListDir") => filesystem::list_dir(call).await,
        ("filesystem.Filesystem", "Remove") => filesystem::remove(call).await,
        ("filesystem.Filesystem", "WatchDir") => filesystem::watch_dir(call).await,
        ("filesystem.Filesystem", "CreateWatcher") => filesystem::create_watcher(call).await,
        ("filesystem.Filesystem", "GetWatcherEvents") => filesystem::get_watcher_events(call).await,
        ("filesystem.Filesystem", "RemoveWatcher") => filesystem::remove_watcher(call).await,
        _ => ConnectError::new(
            Code::Unimplemented,
            format!("{service}/{method} is not an envd method served by forkvm"),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_from_basic_auth() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h).unwrap(), None);
        // base64("user:")
        h.insert(header::AUTHORIZATION, "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap().as_deref(), Some("user"));
        h.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap_err().code, Code::Unauthenticated);
        // base64(":") names nobody.
        h.insert(header::AUTHORIZATION, "Basic Og==".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap(), None);
    }

    #[test]
    fn relative_paths_start_at_home() {
        assert_eq!(resolve_path("/etc/x", Some("user")).unwrap(), "/etc/x");
        assert_eq!(
            resolve_path("a.txt", Some("user")).unwrap(),
            "/home/user/a.txt"
        );
        assert_eq!(resolve_path("./a", None).unwrap(), "/root/a");
        assert_eq!(resolve_path("~/a", Some("root")).unwrap(), "/root/a");
        assert_eq!(resolve_path("", Some("user")).unwrap(), "/home/user");
        assert_eq!(resolve_path("a", Some("1000:1000")).unwrap(), "/a");
        assert!(resolve_path("a\0b", None).is_err());
    }
}
