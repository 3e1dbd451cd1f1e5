//! A node's snapshots, served read-only over the OCI distribution API, so
//! another forkvm daemon pulls one with the existing snapshot pull and no
//! registry stands between them (docs/registry.md, "Nodes serve their
//! snapshots").
//!
//! ```text
//! GET       /v2/                                        200 {} (credentials checked)
//! GET|HEAD  /v2/forkvm/snapshots/manifests/<reference>  the index (id or tag), or a
//!                                                       manifest or index by sha256 digest
//! GET|HEAD  /v2/forkvm/snapshots/blobs/sha256:<hex>     a config or a chunk blob
//! PUT|POST|PATCH|DELETE anywhere here                   405 UNSUPPORTED: read-only
//! ```
//!
//! * **Content.** A snapshot's documents are the [`Plan`] a push of it
//!   would send (forkvm_artifact::plan, built from the same export), so the
//!   bytes and digests are exactly a push's. A plan is built the first time
//!   its snapshot is asked for by id or tag, then kept (the last
//!   [`MAX_PLANS`]), keyed by the snapshot's sealed manifest digest: a
//!   second request costs a lookup. File chunk lists come from the
//!   daemon's artifact cache, so even a rebuild after a restart reads no
//!   file it chunked before. A chunk blob is read from its file and
//!   compressed when asked for, checked against its digest on the way.
//! * **Digests** (a manifest by `sha256:`, every blob) are answered from
//!   the plans built so far: a client resolves the snapshot by id or tag
//!   first, as every pull does, and then asks for what the index names.
//! * **Credentials**: the daemon's token, as `Authorization: Bearer <token>`
//!   or HTTP Basic with any user name and the token as password, compared
//!   in constant time. Without them every route answers 401 with
//!   `WWW-Authenticate: Basic realm="forkvm"`, which tells OCI clients
//!   (oci-client, docker, oras) to send Basic credentials.
//! * **Errors** are OCI error bodies:
//!   `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"..."}]}`.
//! * Only the exact path `/v2/` and paths under `/v2/forkvm/` come here
//!   ([`is_oci_path`]): E2B's control plane owns `/v2/sandboxes...` on the
//!   same listener.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use base64::Engine as _;
use forkvm_artifact::format;
use forkvm_artifact::plan::{read_blob, Blob, Plan};

use crate::api::{bearer, constant_time_eq};

/// The one repository a node serves.
pub const REPOSITORY: &str = "forkvm/snapshots";
/// Plans kept at once (each is the chunk lists of one chain: kilobytes).
pub const MAX_PLANS: usize = 32;
/// Chunk blobs read and compressed at once (a chunk is up to 4 MiB).
const READS: usize = 4;

/// A boxed future, for [`Source`]'s methods.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An error in the OCI error format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciError {
    pub status: StatusCode,
    /// An OCI distribution error code (`MANIFEST_UNKNOWN`, `BLOB_UNKNOWN`,
    /// `UNAUTHORIZED`, `UNSUPPORTED`, ...).
    pub code: &'static str,
    pub message: String,
}

impl OciError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> OciError {
        OciError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for OciError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "errors": [{"code": self.code, "message": self.message}]
        });
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"forkvm\""),
            );
        }
        r
    }
}

/// Where snapshots come from: the daemon ([`EngineSource`]), or files in
/// the unit tests.
pub trait Source: Send + Sync + 'static {
    /// The snapshot id `reference` (an id or a tag) names, and a key that
    /// changes whenever the snapshot's content could (its sealed manifest's
    /// digest).
    fn resolve<'a>(&'a self, reference: &'a str) -> BoxFut<'a, Result<(String, String), OciError>>;
    /// Build the documents of snapshot `id`.
    fn build<'a>(&'a self, id: &'a str) -> BoxFut<'a, Result<Plan, OciError>>;
    /// Keep snapshot `id` (and so its chain) from being removed while one of
    /// its blobs is read; `None` when it is going.
    fn hold(&self, id: &str) -> Option<Box<dyn Send>>;
}

struct Entry {
    id: String,
    key: String,
    plan: Arc<Plan>,
}

/// The server's state: the source, the token, and the plans built so far.
pub struct Served {
    source: Box<dyn Source>,
    token: String,
    plans: Mutex<VecDeque<Entry>>,
    /// Builds run one at a time: two pulls of one snapshot build it once.
    building: tokio::sync::Mutex<()>,
    reads: tokio::sync::Semaphore,
}

impl Served {
    pub fn new(source: Box<dyn Source>, token: String) -> Served {
        Served {
            source,
            token,
            plans: Mutex::new(VecDeque::new()),
            building: tokio::sync::Mutex::new(()),
            reads: tokio::sync::Semaphore::new(READS),
        }
    }

    fn plans(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.plans.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cached(&self, id: &str, key: &str) -> Option<Arc<Plan>> {
        self.plans()
            .iter()
            .find(|e| e.id == id && e.key == key)
            .map(|e| e.plan.clone())
    }

    /// The plan of the snapshot `reference` (id or tag) names, built once.
    pub async fn plan_of(&self, reference: &str) -> Result<Arc<Plan>, OciError> {
        let (id, key) = self.source.resolve(reference).await?;
        if let Some(p) = self.cached(&id, &key) {
            return Ok(p);
        }
        let _one = self.building.lock().await;
        if let Some(p) = self.cached(&id, &key) {
            return Ok(p);
        }
        let plan = Arc::new(self.source.build(&id).await?);
        let mut plans = self.plans();
        plans.retain(|e| e.id != id);
        plans.push_back(Entry {
            id,
            key,
            plan: plan.clone(),
        });
        while plans.len() > MAX_PLANS {
            plans.pop_front();
        }
        Ok(plan)
    }

    /// The plan holding `digest` (a manifest or a blob), if one built so
    /// far does.
    fn holding(&self, find: impl Fn(&Plan) -> bool) -> Option<Arc<Plan>> {
        self.plans()
            .iter()
            .rev()
            .find(|e| find(&e.plan))
            .map(|e| e.plan.clone())
    }
}

/// True for the paths this server answers on the TCP listener: exactly
/// `/v2/`, and everything under `/v2/forkvm/`.
pub fn is_oci_path(path: &str) -> bool {
    path == "/v2/" || path.starts_with("/v2/forkvm/")
}

/// The router of the `/v2/` routes.
pub fn router(state: Arc<Served>) -> Router {
    Router::new()
        .route("/v2/", any(base))
        .route(
            &format!("/v2/{REPOSITORY}/manifests/{{reference}}"),
            any(manifest),
        )
        .route(&format!("/v2/{REPOSITORY}/blobs/{{digest}}"), any(blob))
        .fallback(other)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

/// The token given as `Bearer <token>`, or as the password of HTTP Basic
/// (any user name), checked in constant time.
pub fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    if let Some(t) = bearer(v) {
        return constant_time_eq(t.as_bytes(), token.as_bytes());
    }
    let Some((scheme, rest)) = v.trim_start().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return false;
    }
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(rest.trim()) else {
        return false;
    };
    match raw.iter().position(|b| *b == b':') {
        Some(i) => constant_time_eq(&raw[i + 1..], token.as_bytes()),
        None => false,
    }
}

async fn auth(State(st): State<Arc<Served>>, req: Request, next: Next) -> Response {
    if !authorized(req.headers(), &st.token) {
        return OciError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "missing or wrong credentials: send the node's token (FORKVM_TOKEN) as the \
             password (any user name), or as Authorization: Bearer <token>",
        )
        .into_response();
    }
    crate::listen::mark_authenticated(&req);
    next.run(req).await
}

/// Anything but GET and HEAD: this registry is read-only.
fn readable(method: &Method) -> Result<(), OciError> {
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    Err(OciError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "UNSUPPORTED",
        format!(
            "{method} is not allowed: a forkvm node serves its snapshots read-only; push it to a \
             registry instead"
        ),
    ))
}

async fn base(method: Method) -> Response {
    if let Err(e) = readable(&method) {
        return e.into_response();
    }
    let mut r = (StatusCode::OK, axum::Json(serde_json::json!({}))).into_response();
    r.headers_mut().insert(
        "Docker-Distribution-API-Version",
        HeaderValue::from_static("registry/2.0"),
    );
    r
}

async fn other(method: Method, req: Request) -> Response {
    if let Err(e) = readable(&method) {
        return e.into_response();
    }
    OciError::new(
        StatusCode::NOT_FOUND,
        "NAME_UNKNOWN",
        format!(
            "no such route {}: a forkvm node serves one repository, {REPOSITORY} (manifests \
             and blobs)",
            req.uri().path()
        ),
    )
    .into_response()
}

fn sha256_digest(s: &str) -> Result<(), OciError> {
    match s.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
            Ok(())
        }
        _ => Err(OciError::new(
            StatusCode::BAD_REQUEST,
            "DIGEST_INVALID",
            format!("{s:?} is not a digest of the form sha256:<64 lowercase hex>"),
        )),
    }
}

/// An OCI tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn valid_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// A 200 with the content headers; the body only for GET.
fn content(
    method: &Method,
    media_type: &str,
    digest: &str,
    body: Option<Vec<u8>>,
    size: u64,
) -> Response {
    let mut r = Response::new(match (method == Method::GET, body) {
        (true, Some(b)) => Body::from(b),
        _ => Body::empty(),
    });
    let h = r.headers_mut();
    let v = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
    h.insert(header::CONTENT_TYPE, v(media_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    h.insert("Docker-Content-Digest", v(digest));
    h.insert(header::ETAG, v(&format!("\"{digest}\"")));
    r
}

async fn manifest(
    State(st): State<Arc<Served>>,
    method: Method,
    Path(reference): Path<String>,
) -> Response {
    match manifest_inner(&st, &method, &reference).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn manifest_inner(
    st: &Served,
    method: &Method,
    reference: &str,
) -> Result<Response, OciError> {
    readable(method)?;
    if reference.starts_with("sha256:") {
        sha256_digest(reference)?;
        let plan = st
            .holding(|p| p.manifest(reference).is_some())
            .ok_or_else(|| {
                OciError::new(
                    StatusCode::NOT_FOUND,
                    "MANIFEST_UNKNOWN",
                    format!(
                    "manifest {reference} is not known to this node; ask for the snapshot by id \
                     or tag first"
                ),
                )
            })?;
        let (bytes, mt) = plan.manifest(reference).expect("found above");
        return Ok(content(
            method,
            mt,
            reference,
            Some(bytes.to_vec()),
            bytes.len() as u64,
        ));
    }
    if !valid_tag(reference) {
        return Err(OciError::new(
            StatusCode::BAD_REQUEST,
            "TAG_INVALID",
            format!("{reference:?} is neither a snapshot id or tag nor a sha256 digest"),
        ));
    }
    let plan = st.plan_of(reference).await?;
    Ok(content(
        method,
        format::MT_INDEX,
        &plan.index_digest,
        Some(plan.index.clone()),
        plan.index.len() as u64,
    ))
}

async fn blob(
    State(st): State<Arc<Served>>,
    method: Method,
    Path(digest): Path<String>,
) -> Response {
    match blob_inner(&st, &method, &digest).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn blob_inner(st: &Served, method: &Method, digest: &str) -> Result<Response, OciError> {
    readable(method)?;
    sha256_digest(digest)?;
    let unknown = || {
        OciError::new(
            StatusCode::NOT_FOUND,
            "BLOB_UNKNOWN",
            format!(
                "blob {digest} is not known to this node; ask for its snapshot by id or tag first"
            ),
        )
    };
    let plan = st
        .holding(|p| p.blob(digest).is_some())
        .ok_or_else(unknown)?;
    let octets = "application/octet-stream";
    match plan.blob(digest).ok_or_else(unknown)? {
        Blob::Config(b) => Ok(content(
            method,
            octets,
            digest,
            Some(b.to_vec()),
            b.len() as u64,
        )),
        Blob::Chunk { chunk, .. } if method == Method::HEAD => {
            Ok(content(method, octets, digest, None, chunk.size))
        }
        Blob::Chunk { path, chunk } => {
            let _slot = st.reads.acquire().await.map_err(|_| unknown())?;
            let _hold = st.source.hold(plan.top()).ok_or_else(|| {
                OciError::new(
                    StatusCode::NOT_FOUND,
                    "BLOB_UNKNOWN",
                    format!("snapshot {} is being removed from this node", plan.top()),
                )
            })?;
            let (p, c) = (path.clone(), chunk.clone());
            let data = tokio::task::spawn_blocking(move || read_blob(&p, &c))
                .await
                .map_err(|e| {
                    OciError::new(StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN", e.to_string())
                })?;
            match data {
                Ok(b) => {
                    let n = b.len() as u64;
                    Ok(content(method, octets, digest, Some(b), n))
                }
                Err(forkvm_artifact::chunk::ChunkError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    Err(OciError::new(
                        StatusCode::NOT_FOUND,
                        "BLOB_UNKNOWN",
                        format!("blob {digest}: its snapshot is gone from this node"),
                    ))
                }
                Err(e) => Err(OciError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "UNKNOWN",
                    e.to_string(),
                )),
            }
        }
    }
}

/// The daemon as a [`Source`]: snapshots by id or tag from its database,
/// documents from the same export as `forkvm snapshot push`.
pub struct EngineSource(pub crate::actions::Engine);

fn from_api(e: crate::error::EngineError) -> OciError {
    let status = crate::api::error::status(&e);
    match status {
        StatusCode::NOT_FOUND => {
            OciError::new(StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN", e.to_string())
        }
        s if s.is_client_error() => OciError::new(s, "UNSUPPORTED", e.to_string()),
        s => OciError::new(s, "UNKNOWN", e.to_string()),
    }
}

impl Source for EngineSource {
    fn resolve<'a>(&'a self, reference: &'a str) -> BoxFut<'a, Result<(String, String), OciError>> {
        Box::pin(async move {
            let m = &self.0;
            if let Some(p) = m.pending_snapshot(reference) {
                return Err(OciError::new(
                    StatusCode::CONFLICT,
                    "UNSUPPORTED",
                    format!(
                        "snapshot {} is still being written ({}); ask again once it is ready",
                        p.id, p.state
                    ),
                ));
            }
            let row = m.snapshot_row(reference).map_err(from_api)?;
            let digest = m.snapshot_digest(&row.id).map_err(from_api)?;
            Ok((row.id, digest))
        })
    }

    fn build<'a>(&'a self, id: &'a str) -> BoxFut<'a, Result<Plan, OciError>> {
        Box::pin(async move {
            let m = &self.0;
            let _lease = m.lease_snapshot(id).ok_or_else(|| {
                OciError::new(
                    StatusCode::NOT_FOUND,
                    "MANIFEST_UNKNOWN",
                    format!("snapshot {id} is being removed from this node"),
                )
            })?;
            let t0 = std::time::Instant::now();
            let (image, links) = m
                .export(id, &forkvm_image::progress::NoProgress)
                .await
                .map_err(from_api)?;
            let plan = forkvm_artifact::plan::plan(image, links);
            tracing::info!(
                "snapshot {id}: served over /v2/ ({} manifests, index {}; built in {} ms)",
                plan.docs.len(),
                plan.index_digest,
                t0.elapsed().as_millis()
            );
            Ok(plan)
        })
    }

    fn hold(&self, id: &str) -> Option<Box<dyn Send>> {
        self.0
            .lease_snapshot(id)
            .map(|l| Box::new(l) as Box<dyn Send>)
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
