//! Pulling an image from a registry into the blob store.
//!
//! The OCI Distribution protocol itself (the `/v2/` API, bearer-token
//! challenges, basic auth, content negotiation) is spoken by `oci-client`;
//! this module decides what to fetch and where it goes:
//!
//! 1. the reference's manifest is fetched raw (so its exact bytes, and so its
//!    digest, are kept); a digest reference must match what came back;
//! 2. an image index / Docker manifest list is resolved to the entry for the
//!    wanted platform (default linux/amd64), whose manifest is then fetched;
//! 3. the index, the manifest and the config are stored in the
//!    [`BlobStore`], digest-checked;
//! 4. each layer not already in the store is streamed into a
//!    [`BlobStore::writer`]: hashed as it arrives, its size bounded by the
//!    manifest's, and published only when the digest matches. A layer that
//!    is present is not fetched at all ([`ProgressEvent::Cached`]).
//!
//! An interrupted pull (an error, or the future dropped) leaves only whole,
//! verified blobs: a blob being written lives in the store's ingest area and
//! is removed with its writer. A rerun fetches only what is still missing.
//! A process killed outright leaves ingest files for
//! [`BlobStore::clean_ingest`].
//!
//! Transport: a registry whose host is `localhost`, a 127.0.0.0/8 address or
//! `[::1]` (any port) is spoken to over plain http unless
//! [`PullOptions::loopback_plain_http`] is false, as are the hosts listed in
//! [`PullOptions::insecure_http`]; every other registry over https, checked
//! against the system's roots plus [`PullOptions::ca_certs`].

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::{Client, Reference, RegistryOperation};
use serde::Deserialize;

use crate::auth::RegistryAuth;
use crate::blobs::{digest_hex, sha256_digest, BlobError, BlobStore};
use crate::progress::{Progress, ProgressEvent};

mod errors;
mod reference;
mod session;

pub use errors::PullError;
use errors::{chain, map_io, map_oci, Ctx};
pub use reference::{is_loopback, parse_reference, uses_plain_http};
pub use session::Session;

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    pub auth: RegistryAuth,
    /// Registries spoken to over plain http: `host:port` (that port only) or
    /// `host` (any port), e.g. `127.0.0.1:5000`.
    pub insecure_http: Vec<String>,
    /// Extra CA certificates (PEM or DER files) trusted for https.
    pub ca_certs: Vec<PathBuf>,
    /// The platform picked from an image index: (os, architecture).
    pub platform: (String, String),
    /// Speak plain http to loopback registries (`localhost`, 127.0.0.0/8,
    /// `[::1]`), as docker does. Default true; false for one serving https.
    pub loopback_plain_http: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            auth: RegistryAuth::Anonymous,
            insecure_http: Vec::new(),
            ca_certs: Vec::new(),
            platform: ("linux".into(), "amd64".into()),
            loopback_plain_http: true,
        }
    }
}

/// What a pull stored: every digest named here is in the [`BlobStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The reference, normalised (`docker.io/library/busybox:latest`).
    pub reference: String,
    /// The image manifest (for an index: the chosen platform's).
    pub manifest_digest: String,
    /// The index or manifest list the reference named, if it named one.
    pub index_digest: Option<String>,
    pub config_digest: String,
    pub config_json: Vec<u8>,
    /// (digest, media type, size) of each layer, lowest first.
    pub layers: Vec<(String, String, u64)>,
}

/// The manifest media types asked for: two index kinds, then two image
/// manifest kinds (`is_index` relies on the order).
const ACCEPT: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
/// Configs are read whole; a bigger one is not an image config.
const MAX_CONFIG: u64 = 16 << 20;
/// Layers fetched at once.
const PARALLEL: usize = 3;
/// Bytes between two progress events of one blob.
const REPORT_EVERY: u64 = 1 << 20;

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
}

#[derive(Deserialize)]
struct ManifestJson {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct PlatformJson {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Deserialize)]
struct IndexEntry {
    digest: String,
    #[serde(default)]
    platform: Option<PlatformJson>,
}

#[derive(Deserialize)]
struct IndexJson {
    manifests: Vec<IndexEntry>,
}

/// Whether manifest bytes are an index (`true`) or an image manifest;
/// `Err` says what else they are.
fn is_index(bytes: &[u8]) -> Result<bool, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    match v.get("schemaVersion").and_then(|s| s.as_i64()) {
        Some(2) => {}
        Some(1) => {
            return Err("Docker schema 1 manifests are obsolete and not supported; \
                        push the image again with a current docker, buildah or skopeo"
                .into())
        }
        other => return Err(format!("unsupported manifest schemaVersion {other:?}")),
    }
    match v.get("mediaType").and_then(|m| m.as_str()) {
        Some(t) if ACCEPT[..2].contains(&t) => Ok(true),
        Some(t) if ACCEPT[2..].contains(&t) => Ok(false),
        Some(t) => Err(format!("unsupported manifest media type {t}")),
        // OCI allows leaving mediaType out: tell by the fields.
        None if v.get("manifests").is_some() => Ok(true),
        None if v.get("config").is_some() => Ok(false),
        None => Err("the manifest is neither an image manifest nor an index".into()),
    }
}

/// Pick `want` (os, arch) from an index; `Err` lists what there is. The
/// first match wins (a platform's variants, e.g. arm/v6 and arm/v7, are not
/// told apart).
fn choose_platform(idx: &IndexJson, want: &(String, String)) -> Result<String, Vec<String>> {
    let mut available = Vec::new();
    for e in &idx.manifests {
        let Some(p) = &e.platform else { continue };
        if p.os == want.0 && p.architecture == want.1 {
            return Ok(e.digest.clone());
        }
        // Attestation manifests are listed as unknown/unknown: not images.
        if p.os != "unknown" {
            let mut s = format!("{}/{}", p.os, p.architecture);
            if let Some(v) = &p.variant {
                s = format!("{s}/{v}");
            }
            available.push(s);
        }
    }
    Err(available)
}

/// Pull `reference` into `store` (see the module doc).
pub async fn pull(
    reference: &str,
    opts: &PullOptions,
    store: &BlobStore,
    progress: &dyn Progress,
) -> Result<Pulled, PullError> {
    let r = parse_reference(reference)?;
    let canonical = r.whole();
    let host = r.resolve_registry().to_string();
    let unsupported = |what: String| PullError::Unsupported {
        reference: canonical.clone(),
        what,
    };
    let auth = match &opts.auth {
        RegistryAuth::Anonymous => oci_client::secrets::RegistryAuth::Anonymous,
        RegistryAuth::Basic { username, password } => {
            oci_client::secrets::RegistryAuth::Basic(username.clone(), password.clone())
        }
        RegistryAuth::IdentityToken(_) => {
            return Err(unsupported(format!(
                "the credentials for {host} are an OAuth identity token, which forkvm cannot \
                 use; give --username/--password (or a personal access token as the password)"
            )))
        }
    };
    let plain = uses_plain_http(&host, opts);
    let client = make_client(&host, plain, opts)?;
    let mut ctx = Ctx {
        host: &host,
        reference: &canonical,
        what: format!("manifest of {canonical}"),
        authed: !matches!(opts.auth, RegistryAuth::Anonymous),
        blob: false,
        url: format!("{}://{host}/v2/", if plain { "http" } else { "https" }),
    };

    progress.event(ProgressEvent::Phase {
        phase: "resolving".into(),
    });
    // Asks /v2/ how to authenticate and gets a token if it wants one: a dead
    // host or refused credentials show here, before any content is asked for.
    client
        .auth(&r, &auth, RegistryOperation::Pull)
        .await
        .map_err(|e| map_oci(e, &ctx))?;
    let (mut bytes, mut digest) = client
        .pull_manifest_raw(&r, &auth, ACCEPT)
        .await
        .map_err(|e| map_oci(e, &ctx))?;
    check_digest(&bytes, &digest, r.digest().unwrap_or(&digest), &ctx)?;
    let mut index_digest = None;
    if is_index(&bytes).map_err(&unsupported)? {
        let want = format!("{}/{}", opts.platform.0, opts.platform.1);
        let idx: IndexJson = serde_json::from_slice(&bytes)
            .map_err(|e| unsupported(format!("the image index is malformed: {e}")))?;
        let chosen =
            choose_platform(&idx, &opts.platform).map_err(|available| PullError::NoPlatform {
                reference: canonical.clone(),
                want: want.clone(),
                available,
            })?;
        digest_hex(&chosen)
            .map_err(|_| unsupported(format!("the index names a bad digest {chosen:?}")))?;
        store.put(&digest, Some(bytes.len() as u64), &bytes[..])?;
        index_digest = Some(digest);
        ctx.what = format!("{want} manifest {chosen} of {canonical}");
        (bytes, digest) = client
            .pull_manifest_raw(&r.clone_with_digest(chosen.clone()), &auth, ACCEPT)
            .await
            .map_err(|e| map_oci(e, &ctx))?;
        check_digest(&bytes, &digest, &chosen, &ctx)?;
        if is_index(&bytes).map_err(&unsupported)? {
            return Err(unsupported(
                "an index inside an index is not supported".into(),
            ));
        }
    }
    let m: ManifestJson = serde_json::from_slice(&bytes)
        .map_err(|e| unsupported(format!("the image manifest is malformed: {e}")))?;
    if !CONFIG_TYPES.contains(&m.config.media_type.as_str()) {
        return Err(unsupported(format!(
            "not a container image (its config is {:?}, an OCI artifact of another kind)",
            m.config.media_type
        )));
    }
    if m.config.size > MAX_CONFIG {
        return Err(unsupported(format!(
            "its config is {} bytes, more than an image config can be",
            m.config.size
        )));
    }
    for d in std::iter::once(&m.config).chain(&m.layers) {
        digest_hex(&d.digest)
            .map_err(|_| unsupported(format!("the manifest names a bad digest {:?}", d.digest)))?;
    }
    store.put(&digest, Some(bytes.len() as u64), &bytes[..])?;

    progress.event(ProgressEvent::Phase {
        phase: "fetching".into(),
    });
    let f = Fetch {
        client: &client,
        r: &r,
        store,
        progress,
        ctx: &ctx,
    };
    f.blob(m.config.digest.clone(), m.config.size, "config")
        .await?;
    let config_json = store.read(&m.config.digest)?;
    // A digest listed twice is fetched once.
    let mut seen = std::collections::HashSet::new();
    let todo: Vec<(String, u64)> = m
        .layers
        .iter()
        .filter(|d| seen.insert(d.digest.as_str()))
        .map(|d| (d.digest.clone(), d.size))
        .collect();
    // After a failure no new layer is started, but those under way run to
    // their end: what completes stays for a rerun, and when this returns no
    // writer of this pull is left to remove its ingest file later.
    let failed = AtomicBool::new(false);
    let mut fetches = futures_util::stream::iter(todo.into_iter().map(|(digest, size)| {
        let (f, failed) = (&f, &failed);
        async move {
            if failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            f.blob(digest, size, "layer").await
        }
    }))
    .buffer_unordered(PARALLEL);
    let mut first_err = None;
    while let Some(r) = fetches.next().await {
        if let Err(e) = r {
            failed.store(true, Ordering::Relaxed);
            first_err.get_or_insert(e);
        }
    }
    drop(fetches);
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(Pulled {
        reference: canonical.clone(),
        manifest_digest: digest,
        index_digest,
        config_digest: m.config.digest.clone(),
        config_json,
        layers: m
            .layers
            .into_iter()
            .map(|d| (d.digest, d.media_type, d.size))
            .collect(),
    })
}

/// What fetching a blob of one pull needs. (A struct with an async method,
/// not a closure: closures over references make the pull future not Send.)
struct Fetch<'a> {
    client: &'a Client,
    r: &'a Reference,
    store: &'a BlobStore,
    progress: &'a dyn Progress,
    ctx: &'a Ctx<'a>,
}

impl Fetch<'_> {
    async fn blob(&self, digest: String, size: u64, kind: &str) -> Result<(), PullError> {
        let c = Ctx {
            host: self.ctx.host,
            reference: self.ctx.reference,
            what: format!("{kind} {digest}"),
            authed: self.ctx.authed,
            blob: true,
            url: self.ctx.url.clone(),
        };
        fetch_blob(
            self.client,
            self.r,
            &digest,
            size,
            self.store,
            self.progress,
            &c,
        )
        .await
    }
}

/// oci-client checked the header and reference digests; forkvm keys blobs by
/// sha256, so the bytes must hash to `want` under sha256 in any case.
fn check_digest(bytes: &[u8], got: &str, want: &str, c: &Ctx) -> Result<(), PullError> {
    let actual = sha256_digest(bytes);
    if actual != want || got != want {
        return Err(PullError::DigestMismatch {
            host: c.host.to_string(),
            what: c.what.clone(),
            expected: want.to_string(),
            actual,
        });
    }
    Ok(())
}

fn make_client(host: &str, plain: bool, opts: &PullOptions) -> Result<Client, PullError> {
    let mut certs = Vec::new();
    for p in &opts.ca_certs {
        let data = std::fs::read(p).map_err(|e| PullError::CaCert {
            what: p.display().to_string(),
            reason: format!("cannot read it: {e}"),
        })?;
        let encoding = if data.windows(11).any(|w| w == b"-----BEGIN ") {
            CertificateEncoding::Pem
        } else {
            CertificateEncoding::Der
        };
        certs.push(Certificate { encoding, data });
    }
    let cfg = ClientConfig {
        protocol: if plain {
            ClientProtocol::HttpsExcept(vec![host.to_string()])
        } else {
            ClientProtocol::Https
        },
        extra_root_certificates: certs,
        // Indexes are resolved here, with an error that lists the platforms.
        platform_resolver: None,
        connect_timeout: Some(Duration::from_secs(30)),
        read_timeout: Some(Duration::from_secs(120)),
        user_agent: concat!("forkvm/", env!("CARGO_PKG_VERSION")),
        ..Default::default()
    };
    // Not Client::new: it falls back to a default client on a bad CA file.
    Client::try_from(cfg).map_err(|e| PullError::CaCert {
        what: opts
            .ca_certs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        reason: format!("cannot be used: {}", chain(&e)),
    })
}

/// Stream one blob into the store unless it is there. The network side runs
/// here; a blocking task writes and hashes, fed through a short channel so
/// at most a few chunks are in memory.
async fn fetch_blob(
    client: &Client,
    r: &Reference,
    digest: &str,
    size: u64,
    store: &BlobStore,
    progress: &dyn Progress,
    c: &Ctx<'_>,
) -> Result<(), PullError> {
    if store.has(digest) {
        progress.event(ProgressEvent::Cached {
            item: digest.to_string(),
        });
        return Ok(());
    }
    let mut stream = client
        .pull_blob_stream(r, digest)
        .await
        .map_err(|e| map_oci(e, c))?;
    let short = |n: u64| {
        PullError::Store(BlobError::SizeMismatch {
            digest: digest.to_string(),
            expected: size,
            actual: n,
        })
    };
    if let Some(n) = stream.content_length.filter(|n| *n != size) {
        return Err(short(n));
    }
    let mut w = store.writer(digest, Some(size))?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    // If this future is dropped, `tx` goes, the task ends, and the writer it
    // hands back is dropped with the join handle: its ingest file is removed.
    let task = tokio::task::spawn_blocking(move || {
        while let Some(b) = rx.blocking_recv() {
            if let Err(e) = w.write_all(&b) {
                return (w, Err(e));
            }
        }
        (w, Ok(()))
    });
    let (mut done, mut reported) = (0u64, 0u64);
    let mut net: Result<(), PullError> = Ok(());
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(b) => b,
            Err(e) => {
                net = Err(map_io(e, c));
                break;
            }
        };
        done += chunk.len() as u64;
        if done > size {
            // Do not let a registry fill the disk past what it announced.
            net = Err(short(done));
            break;
        }
        if tx.send(chunk).await.is_err() {
            break; // The writer failed: its error is returned below.
        }
        if done - reported >= REPORT_EVERY {
            reported = done;
            progress.event(ProgressEvent::Bytes {
                item: digest.to_string(),
                done,
                total: Some(size),
            });
        }
    }
    drop(tx);
    let (w, wrote) = task.await.map_err(|e| PullError::Network {
        host: c.host.to_string(),
        cause: format!("the writer task failed: {e}"),
    })?;
    net?;
    wrote.map_err(|e| {
        PullError::Store(BlobError::Io {
            what: format!("writing blob {digest}"),
            source: e,
        })
    })?;
    let committed = tokio::task::spawn_blocking(move || w.commit())
        .await
        .map_err(|e| PullError::Network {
            host: c.host.to_string(),
            cause: format!("the writer task failed: {e}"),
        })?;
    match committed {
        Err(BlobError::Mismatch { expected, actual }) => Err(PullError::DigestMismatch {
            host: c.host.to_string(),
            what: c.what.clone(),
            expected,
            actual,
        }),
        Err(e) => Err(e.into()),
        Ok(n) => {
            progress.event(ProgressEvent::Bytes {
                item: digest.to_string(),
                done: n,
                total: Some(size),
            });
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn manifest_kinds() {
        let ok = |j: &str| is_index(j.as_bytes());
        let oci_idx = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
        assert_eq!(ok(oci_idx), Ok(true));
        assert_eq!(
            ok(
                r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json","manifests":[]}"#
            ),
            Ok(true)
        );
        assert_eq!(
            ok(
                r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json"}"#
            ),
            Ok(false)
        );
        assert_eq!(
            ok(r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#),
            Ok(false)
        );
        assert_eq!(ok(r#"{"schemaVersion":2,"manifests":[]}"#), Ok(true));
        assert_eq!(ok(r#"{"schemaVersion":2,"config":{}}"#), Ok(false));
        for (j, want) in [
            (r#"{"schemaVersion":1,"fsLayers":[]}"#, "schema 1"),
            (r#"{"schemaVersion":3}"#, "schemaVersion"),
            (r#"{"mediaType":"x"}"#, "schemaVersion"),
            (
                r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.artifact.manifest.v1+json"}"#,
                "media type",
            ),
            (
                r#"{"schemaVersion":2,"mediaType":"text/html"}"#,
                "media type",
            ),
            (r#"{"schemaVersion":2}"#, "neither"),
            ("<html>", "not JSON"),
        ] {
            let e = ok(j).unwrap_err();
            assert!(e.contains(want), "{j}: {e}");
        }
    }

    #[test]
    fn platform_choice() {
        let idx = format!(
            r#"{{"manifests":[
              {{"digest":"sha256:a","platform":{{"os":"linux","architecture":"arm","variant":"v7"}}}},
              {{"digest":"sha256:att","platform":{{"os":"unknown","architecture":"unknown"}}}},
              {{"digest":"sha256:nop"}},
              {{"digest":"{D}","platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#
        );
        let idx: IndexJson = serde_json::from_str(&idx).unwrap();
        let want = |o: &str, a: &str| choose_platform(&idx, &(o.into(), a.into()));
        assert_eq!(want("linux", "amd64"), Ok(D.to_string()));
        assert_eq!(
            want("linux", "s390x"),
            Err(vec!["linux/arm/v7".to_string(), "linux/amd64".to_string()])
        );
        assert!(serde_json::from_str::<IndexJson>(r#"{"manifests":[{"platform":{}}]}"#).is_err());
        let e = PullError::NoPlatform {
            reference: "r/x:1".into(),
            want: "linux/s390x".into(),
            available: vec!["linux/arm/v7".into(), "linux/amd64".into()],
        };
        assert_eq!(
            e.to_string(),
            "r/x:1 has no image for linux/s390x; it has: linux/arm/v7, linux/amd64"
        );
    }

    /// The daemon runs pulls in spawned tasks: the future must be Send.
    #[test]
    fn pull_future_is_send() {
        fn send<T: Send>(_: T) {}
        let t = tempfile::tempdir().unwrap();
        let store = BlobStore::open(t.path()).unwrap();
        send(pull(
            "x",
            &PullOptions::default(),
            &store,
            &crate::progress::NoProgress,
        ));
    }

    #[test]
    fn manifest_digest_check() {
        let c = Ctx {
            host: "h",
            reference: "h/a:1",
            what: "manifest of h/a:1".into(),
            authed: false,
            blob: false,
            url: "http://h/v2/".into(),
        };
        let d = sha256_digest(b"{}");
        assert!(check_digest(b"{}", &d, &d, &c).is_ok());
        // Bytes that are not what the reference named; a header that lies.
        let e = check_digest(b"{}", &d, D, &c).unwrap_err();
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
        assert!(check_digest(b"{ }", &d, &d, &c).is_err());
    }

    #[tokio::test]
    async fn unreachable_registry_and_bad_inputs() {
        let t = tempfile::tempdir().unwrap();
        let store = BlobStore::open(t.path()).unwrap();
        // A port nothing listens on: bind one, then free it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let o = PullOptions::default();
        let e = pull(
            &format!("127.0.0.1:{port}/app:v1"),
            &o,
            &store,
            &crate::progress::NoProgress,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, PullError::Unreachable { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("http://127.0.0.1:{port}/v2/")),
            "{e}"
        );

        let mut o = PullOptions {
            auth: RegistryAuth::IdentityToken("t".into()),
            ..Default::default()
        };
        let e = pull("127.0.0.1:1/app", &o, &store, &crate::progress::NoProgress)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("identity token"), "{e}");
        o.auth = RegistryAuth::Anonymous;
        o.ca_certs = vec![t.path().join("nope.pem")];
        let e = pull("127.0.0.1:1/app", &o, &store, &crate::progress::NoProgress)
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("nope.pem") && e.to_string().contains("cannot read"),
            "{e}"
        );
        std::fs::write(
            t.path().join("junk.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        o.ca_certs = vec![t.path().join("junk.pem")];
        let e = pull("127.0.0.1:1/app", &o, &store, &crate::progress::NoProgress)
            .await
            .unwrap_err();
        assert!(matches!(e, PullError::CaCert { .. }), "{e}");
        assert!(store.list().is_empty());
    }
}
