//! The `/v2/` routes against a source of real files: every route, every
//! error kind, the credentials, and that a plan is built once.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use forkvm_artifact::compat::Requires;
use forkvm_artifact::format::{DiskBacking, ImageConfig, LinkConfig, ParentLink, SCHEMA};
use forkvm_artifact::plan::{plan, ImagePart, LinkPart};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;

const TOKEN: &str = "s3cret-token";

/// Snapshots `sn-a` (tag `warm`) and its child `sn-b`, as files in a
/// directory; `key` is what [`Source::resolve`] reports.
struct Files {
    dir: PathBuf,
    key: Mutex<String>,
    builds: AtomicU32,
    held: AtomicU32,
}

fn requires() -> Requires {
    Requires {
        arch: "x86_64".into(),
        qemu: "QEMU emulator version 10.0.0".into(),
        machine: "microvm".into(),
        accel: "tcg".into(),
        cpu_model: "max".into(),
        cpu_vendor: "GenuineIntel".into(),
        cpu_flags: vec![],
        kernel_sha256: "0".repeat(64),
        initrd_sha256: "0".repeat(64),
    }
}

fn entry(p: &FsPath, name: &str) -> forkvm_artifact::FileEntry {
    forkvm_artifact::chunk::index_file(p, name, 65536, &mut |_, _| {}).unwrap()
}

fn link(dir: &FsPath, id: &str, parent: Option<&str>, seed: u8) -> LinkPart {
    let p = dir.join(format!("{id}.mem"));
    if !p.exists() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8 ^ seed).collect();
        std::fs::write(&p, data).unwrap();
    }
    LinkPart {
        config: LinkConfig {
            schema: SCHEMA,
            id: id.into(),
            kind: "diff".into(),
            parent: parent.map(|p| ParentLink {
                id: p.into(),
                manifest: String::new(),
            }),
            manifest_fvs: String::new(),
            disk_backing: DiskBacking::Image,
            requires: requires(),
            files: vec![entry(&p, "memory.img")],
        },
        paths: BTreeMap::from([("memory.img".to_string(), p)]),
    }
}

/// The source the server owns; the test keeps the other handle.
struct Shared(Arc<Files>);

impl Source for Shared {
    fn resolve<'a>(&'a self, reference: &'a str) -> BoxFut<'a, Result<(String, String), OciError>> {
        self.0.resolve(reference)
    }
    fn build<'a>(&'a self, id: &'a str) -> BoxFut<'a, Result<Plan, OciError>> {
        self.0.build(id)
    }
    fn hold(&self, id: &str) -> Option<Box<dyn Send>> {
        self.0.hold(id)
    }
}

impl Source for Files {
    fn resolve<'a>(&'a self, reference: &'a str) -> BoxFut<'a, Result<(String, String), OciError>> {
        Box::pin(async move {
            let id = match reference {
                "warm" | "sn-a" => "sn-a",
                "sn-b" => "sn-b",
                other => {
                    return Err(OciError::new(
                        StatusCode::NOT_FOUND,
                        "MANIFEST_UNKNOWN",
                        format!("no snapshot {other}"),
                    ))
                }
            };
            Ok((id.to_string(), self.key.lock().unwrap().clone()))
        })
    }

    fn build<'a>(&'a self, id: &'a str) -> BoxFut<'a, Result<Plan, OciError>> {
        Box::pin(async move {
            self.builds.fetch_add(1, Ordering::SeqCst);
            let root = self.dir.join("rootfs.ext4");
            if !root.exists() {
                std::fs::write(&root, vec![3u8; 150_000]).unwrap();
            }
            let image = ImagePart {
                config: ImageConfig {
                    schema: SCHEMA,
                    name: "default".into(),
                    image_json: serde_json::json!({"name": "default"}),
                    files: vec![entry(&root, "rootfs.ext4")],
                },
                rootfs: root,
            };
            let mut links = vec![link(&self.dir, "sn-a", None, 1)];
            if id == "sn-b" {
                links.push(link(&self.dir, "sn-b", Some("sn-a"), 2));
            }
            Ok(plan(image, links))
        })
    }

    fn hold(&self, _id: &str) -> Option<Box<dyn Send>> {
        self.held.fetch_add(1, Ordering::SeqCst);
        Some(Box::new(()))
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    state: Arc<Served>,
    files: Arc<Files>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let files = Arc::new(Files {
            dir: dir.path().to_path_buf(),
            key: Mutex::new("k1".into()),
            builds: AtomicU32::new(0),
            held: AtomicU32::new(0),
        });
        Fixture {
            state: Arc::new(Served::new(Box::new(Shared(files.clone())), TOKEN.into())),
            files,
            _dir: dir,
        }
    }
    fn files(&self) -> &Files {
        &self.files
    }
    async fn call(
        &self,
        method: &str,
        path: &str,
        auth: Option<&str>,
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut b = axum::http::Request::builder().method(method).uri(path);
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        let r = router(self.state.clone())
            .oneshot(b.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = r.status();
        let headers = r.headers().clone();
        let body = r.into_body().collect().await.unwrap().to_bytes().to_vec();
        (status, headers, body)
    }
    async fn get(&self, path: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
        self.call("GET", path, Some(&format!("Bearer {TOKEN}")))
            .await
    }
}

fn basic(user: &str, pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

fn error_code(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).expect("an OCI error body");
    let e = &v["errors"][0];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    e["code"].as_str().unwrap().to_string()
}

const M: &str = "/v2/forkvm/snapshots/manifests";
const B: &str = "/v2/forkvm/snapshots/blobs";

#[tokio::test]
async fn the_base_route_checks_bearer_and_basic_credentials() {
    let f = Fixture::new();
    for ok in [
        format!("Bearer {TOKEN}"),
        format!("bearer {TOKEN}"),
        basic("forkvm", TOKEN),
        basic("anyone", TOKEN),
        basic("", TOKEN),
    ] {
        let (s, h, body) = f.call("GET", "/v2/", Some(&ok)).await;
        assert_eq!(s, StatusCode::OK, "{ok}");
        assert_eq!(body, b"{}");
        assert_eq!(h["Docker-Distribution-API-Version"], "registry/2.0");
    }
    for bad in [
        None,
        Some("Bearer wrong".to_string()),
        Some(basic("forkvm", "wrong")),
        Some(basic("forkvm", &format!("{TOKEN}x"))),
        Some(format!("Basic {TOKEN}")),
        Some("Basic !!!".to_string()),
        Some(format!("Token {TOKEN}")),
        Some(TOKEN.to_string()),
    ] {
        for path in [
            "/v2/",
            &format!("{M}/warm"),
            &format!("{B}/sha256:{}", "a".repeat(64)),
        ] {
            let (s, h, body) = f.call("GET", path, bad.as_deref()).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{bad:?} {path}");
            assert_eq!(h[header::WWW_AUTHENTICATE], "Basic realm=\"forkvm\"");
            assert_eq!(error_code(&body), "UNAUTHORIZED");
        }
    }
    // Nothing was built for a refused request.
    assert_eq!(f.files().builds.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_snapshot_by_id_or_tag_is_its_index_and_built_once() {
    let f = Fixture::new();
    let (s, h, index) = f.get(&format!("{M}/warm")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h[header::CONTENT_TYPE], format::MT_INDEX);
    let digest = format::sha256_digest(&index);
    assert_eq!(h["Docker-Content-Digest"], digest.as_str());
    assert_eq!(h[header::CONTENT_LENGTH], index.len().to_string().as_str());
    format::parse_index(&index, "index").unwrap();
    // By id: the same snapshot, the same bytes, from the cache.
    let (_, _, again) = f.get(&format!("{M}/sn-a")).await;
    assert_eq!(again, index);
    assert_eq!(f.files().builds.load(Ordering::SeqCst), 1);
    // Byte for byte a push's: the plan of the same parts.
    let want = f.files().build("sn-a").await.unwrap();
    assert_eq!(want.index, index);
    // A new key (the snapshot changed) builds again.
    *f.files().key.lock().unwrap() = "k2".into();
    f.get(&format!("{M}/warm")).await;
    assert_eq!(f.files().builds.load(Ordering::SeqCst), 3);
    // HEAD: the headers, no body.
    let (s, h, body) = f
        .call(
            "HEAD",
            &format!("{M}/warm"),
            Some(&format!("Bearer {TOKEN}")),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.is_empty());
    assert_eq!(h[header::CONTENT_LENGTH], index.len().to_string().as_str());
    assert_eq!(h["Docker-Content-Digest"], digest.as_str());
}

#[tokio::test]
async fn manifests_and_blobs_by_digest_are_what_the_index_names() {
    let f = Fixture::new();
    let (_, _, index) = f.get(&format!("{M}/sn-b")).await;
    let idx = format::parse_index(&index, "index").unwrap();
    assert_eq!(idx.manifests.len(), 3, "image, sn-a, sn-b");
    let (s, _, by_digest) = f
        .get(&format!("{M}/{}", format::sha256_digest(&index)))
        .await;
    assert_eq!((s, by_digest), (StatusCode::OK, index.clone()));
    let mut blobs = 0;
    for d in &idx.manifests {
        let (s, h, m) = f.get(&format!("{M}/{}", d.digest)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], format::MT_MANIFEST);
        assert_eq!(format::sha256_digest(&m), d.digest);
        assert_eq!(m.len() as u64, d.size);
        let man: format::Manifest = serde_json::from_slice(&m).unwrap();
        for b in std::iter::once(&man.config).chain(&man.layers) {
            let (s, h, bytes) = f.get(&format!("{B}/{}", b.digest)).await;
            assert_eq!(s, StatusCode::OK, "{}", b.digest);
            assert_eq!(format::sha256_digest(&bytes), b.digest);
            assert_eq!(bytes.len() as u64, b.size);
            assert_eq!(h["Docker-Content-Digest"], b.digest.as_str());
            assert_eq!(h[header::CONTENT_LENGTH], b.size.to_string().as_str());
            // HEAD tells the size without reading the chunk.
            let held = f.files().held.load(Ordering::SeqCst);
            let (s, h, body) = f
                .call(
                    "HEAD",
                    &format!("{B}/{}", b.digest),
                    Some(&basic("u", TOKEN)),
                )
                .await;
            assert_eq!(s, StatusCode::OK);
            assert!(body.is_empty());
            assert_eq!(h[header::CONTENT_LENGTH], b.size.to_string().as_str());
            assert_eq!(f.files().held.load(Ordering::SeqCst), held);
            blobs += 1;
        }
    }
    assert!(blobs > 6, "{blobs}");
    assert!(
        f.files().held.load(Ordering::SeqCst) > 0,
        "chunk reads hold the snapshot"
    );
    // The child's link names the parent's manifest digest.
    let (_, _, top) = f.get(&format!("{M}/{}", idx.manifests[2].digest)).await;
    let man: format::Manifest = serde_json::from_slice(&top).unwrap();
    let (_, _, cfg) = f.get(&format!("{B}/{}", man.config.digest)).await;
    let c = format::parse_link(&cfg, &man, "c").unwrap();
    assert_eq!(c.parent.unwrap().manifest, idx.manifests[1].digest);
}

#[tokio::test]
async fn each_error_kind_is_an_oci_error() {
    let f = Fixture::new();
    let unknown = format!("sha256:{}", "b".repeat(64));
    for (method, path, status, code) in [
        (
            "GET",
            format!("{M}/nope"),
            StatusCode::NOT_FOUND,
            "MANIFEST_UNKNOWN",
        ),
        // A digest of nothing built yet.
        (
            "GET",
            format!("{M}/{unknown}"),
            StatusCode::NOT_FOUND,
            "MANIFEST_UNKNOWN",
        ),
        (
            "GET",
            format!("{B}/{unknown}"),
            StatusCode::NOT_FOUND,
            "BLOB_UNKNOWN",
        ),
        (
            "HEAD",
            format!("{B}/{unknown}"),
            StatusCode::NOT_FOUND,
            "BLOB_UNKNOWN",
        ),
        (
            "GET",
            format!("{B}/sha256:abc"),
            StatusCode::BAD_REQUEST,
            "DIGEST_INVALID",
        ),
        (
            "GET",
            format!("{B}/md5:{}", "a".repeat(32)),
            StatusCode::BAD_REQUEST,
            "DIGEST_INVALID",
        ),
        (
            "GET",
            format!("{M}/sha256:XYZ"),
            StatusCode::BAD_REQUEST,
            "DIGEST_INVALID",
        ),
        (
            "GET",
            format!("{M}/.hidden"),
            StatusCode::BAD_REQUEST,
            "TAG_INVALID",
        ),
        (
            "GET",
            "/v2/forkvm/other/manifests/x".into(),
            StatusCode::NOT_FOUND,
            "NAME_UNKNOWN",
        ),
        (
            "GET",
            "/v2/forkvm/snapshots/tags/list".into(),
            StatusCode::NOT_FOUND,
            "NAME_UNKNOWN",
        ),
        (
            "PUT",
            format!("{M}/warm"),
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
        ),
        (
            "DELETE",
            format!("{M}/warm"),
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
        ),
        (
            "DELETE",
            format!("{B}/{unknown}"),
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
        ),
        (
            "POST",
            format!("{B}/uploads/"),
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
        ),
        (
            "PATCH",
            format!("{B}/uploads/x"),
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
        ),
        (
            "POST",
            "/v2/".into(),
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
        ),
    ] {
        let (s, h, body) = f
            .call(method, &path, Some(&format!("Bearer {TOKEN}")))
            .await;
        assert_eq!(s, status, "{method} {path}");
        if method == "HEAD" {
            continue;
        }
        assert_eq!(
            h[header::CONTENT_TYPE],
            "application/json",
            "{method} {path}"
        );
        assert_eq!(error_code(&body), code, "{method} {path}");
    }
    // A chunk whose file is gone: the blob is unknown, not a server error.
    let (_, _, index) = f.get(&format!("{M}/warm")).await;
    let idx = format::parse_index(&index, "index").unwrap();
    let (_, _, m) = f.get(&format!("{M}/{}", idx.manifests[1].digest)).await;
    let man: format::Manifest = serde_json::from_slice(&m).unwrap();
    std::fs::remove_file(f.files().dir.join("sn-a.mem")).unwrap();
    let (s, _, body) = f.get(&format!("{B}/{}", man.layers[0].digest)).await;
    assert_eq!(
        (s, error_code(&body).as_str()),
        (StatusCode::NOT_FOUND, "BLOB_UNKNOWN")
    );
    // A chunk whose file changed since it was indexed: refused, never sent.
    std::fs::write(f.files().dir.join("sn-a.mem"), vec![9u8; 200_000]).unwrap();
    let (s, _, body) = f.get(&format!("{B}/{}", man.layers[0].digest)).await;
    assert_eq!(
        (s, error_code(&body).as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN")
    );
}

#[test]
fn only_the_base_and_the_forkvm_namespace_are_served_here() {
    for p in ["/v2/", "/v2/forkvm/snapshots/manifests/x", "/v2/forkvm/x"] {
        assert!(is_oci_path(p), "{p}");
    }
    // E2B's control plane owns these on the same listener.
    for p in [
        "/v2/sandboxes",
        "/v2/sandboxes/x/connect",
        "/v2",
        "/v1/info",
        "/v2/forkvmx",
    ] {
        assert!(!is_oci_path(p), "{p}");
    }
}

#[test]
fn the_daemons_errors_become_oci_errors() {
    use crate::error::EngineError;
    let e = from_api(EngineError::not_found("no snapshot sn-x"));
    assert_eq!(
        (e.status, e.code),
        (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN")
    );
    assert_eq!(e.message, "no snapshot sn-x");
    let e = from_api(EngineError::conflict("still being written"));
    assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "UNSUPPORTED"));
    let e = from_api(EngineError::invalid("has volumes"));
    assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "UNSUPPORTED"));
    let e = from_api(EngineError::internal("disk gone"));
    assert_eq!(
        (e.status, e.code),
        (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN")
    );
}
