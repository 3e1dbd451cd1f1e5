//! Pulls from a real registry: Debian's `docker-registry` (distribution 2.8)
//! on 127.0.0.1, filled with `skopeo copy` from OCI layouts made by `umoci`.
//!
//! Each test makes its own temp dir (layout, registry storage, blob store)
//! and registry process, which it kills by PID when done. Blob downloads are
//! counted from the registry's access log, so "not fetched" means the
//! registry never served it.

use std::io::{Read as _, Write as _};

use base64::Engine as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use forkvm_image::auth::{credentials_for, RegistryAuth};
use forkvm_image::blobs::{sha256_digest, BlobStore};
use forkvm_image::progress::{NoProgress, ProgressEvent};
use forkvm_image::pull::{pull, PullError, PullOptions, Pulled};

#[path = "support/registry.rs"]
mod support;
use support::{need_tools, run, Registry};

/// An OCI layout at `dir/oci` with tags `base` (busybox, one layer), `app`
/// (base + one small layer) and, if asked, `big` (base + `big_mib` MiB of
/// random bytes) and `multi` (an index: linux/arm64 and linux/amd64 = base).
fn make_layout(dir: &Path, big_mib: usize, multi: bool) {
    run("umoci", &["init", "--layout", "oci"], dir);
    run("umoci", &["new", "--image", "oci:base"], dir);
    run("umoci", &["unpack", "--image", "oci:base", "b-base"], dir);
    std::fs::create_dir_all(dir.join("b-base/rootfs/bin")).unwrap();
    std::fs::copy("/bin/busybox", dir.join("b-base/rootfs/bin/busybox")).unwrap();
    run("umoci", &["repack", "--image", "oci:base", "b-base"], dir);
    run("umoci", &["unpack", "--image", "oci:base", "b-app"], dir);
    std::fs::write(dir.join("b-app/rootfs/hello"), "hello from app\n").unwrap();
    run("umoci", &["repack", "--image", "oci:app", "b-app"], dir);
    if big_mib > 0 {
        run("umoci", &["unpack", "--image", "oci:base", "b-big"], dir);
        let mut f = std::fs::File::create(dir.join("b-big/rootfs/big")).unwrap();
        let mut rnd = std::fs::File::open("/dev/urandom").unwrap();
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..big_mib {
            rnd.read_exact(&mut buf).unwrap();
            f.write_all(&buf).unwrap();
        }
        run("umoci", &["repack", "--image", "oci:big", "b-big"], dir);
    }
    if multi {
        run("umoci", &["new", "--image", "oci:arm"], dir);
        run(
            "umoci",
            &["config", "--image", "oci:arm", "--architecture", "arm64"],
            dir,
        );
        // umoci makes no indexes: write one into the layout by hand.
        let ipath = dir.join("oci/index.json");
        let mut idx: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&ipath).unwrap()).unwrap();
        let entry = |tag: &str, arch: &str| {
            let m = idx["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
                .unwrap()
                .clone();
            serde_json::json!({"mediaType": m["mediaType"], "digest": m["digest"],
                "size": m["size"], "platform": {"os": "linux", "architecture": arch}})
        };
        let blob = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [entry("arm", "arm64"), entry("base", "amd64")]}))
        .unwrap();
        let d = sha256_digest(&blob);
        std::fs::write(dir.join("oci/blobs/sha256").join(&d[7..]), &blob).unwrap();
        idx["manifests"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": d,
            "size": blob.len(), "annotations": {"org.opencontainers.image.ref.name": "multi"}}));
        std::fs::write(&ipath, serde_json::to_vec(&idx).unwrap()).unwrap();
    }
}

/// The manifest digest of a tag in the layout.
fn layout_digest(dir: &Path, tag: &str) -> String {
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("oci/index.json")).unwrap()).unwrap();
    idx["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A registry process; killed (by its PID) when dropped.
/// Records progress events.
#[derive(Default)]
struct Rec(Mutex<Vec<ProgressEvent>>);

impl forkvm_image::progress::Progress for Rec {
    fn event(&self, e: ProgressEvent) {
        self.0.lock().unwrap().push(e);
    }
}

impl Rec {
    fn cached(&self) -> Vec<String> {
        let mut v: Vec<String> = (self.0.lock().unwrap().iter())
            .filter_map(|e| match e {
                ProgressEvent::Cached { item } => Some(item.clone()),
                _ => None,
            })
            .collect();
        v.sort();
        v
    }
    /// Items with byte progress, i.e. fetched.
    fn fetched(&self) -> Vec<String> {
        let mut v: Vec<String> = (self.0.lock().unwrap().iter())
            .filter_map(|e| match e {
                ProgressEvent::Bytes { item, .. } => Some(item.clone()),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

fn ingest_empty(store: &BlobStore) -> bool {
    std::fs::read_dir(store.root().join("ingest"))
        .unwrap()
        .count()
        == 0
}

/// Every blob a pull names is in the store, with the right content.
fn check_stored(store: &BlobStore, p: &Pulled) {
    for d in [&p.manifest_digest, &p.config_digest]
        .into_iter()
        .chain(p.layers.iter().map(|l| &l.0))
        .chain(&p.index_digest)
    {
        assert_eq!(sha256_digest(&store.read(d).unwrap()), *d);
    }
    assert_eq!(store.read(&p.config_digest).unwrap(), p.config_json);
}

// Multi-threaded like the daemon; the other tests use the default runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_pulls_share_layers_and_resolve_digests() {
    need_tools();
    let t = tempfile::tempdir().unwrap();
    make_layout(t.path(), 0, false);
    let reg = Registry::start(t.path(), false);
    reg.push(t.path(), "base", "base:v1", &[]);
    // app as a Docker v2 schema 2 manifest, base as OCI: both kinds.
    reg.push(t.path(), "app", "team/app:v1", &["--format", "v2s2"]);
    let store = BlobStore::open(t.path().join("blobs")).unwrap();
    let opts = PullOptions::default();

    let rec = Rec::default();
    let from = reg.log_len();
    let base = pull(&format!("{}/base:v1", reg.host), &opts, &store, &rec)
        .await
        .unwrap();
    assert_eq!(base.reference, format!("{}/base:v1", reg.host));
    assert_eq!(base.manifest_digest, layout_digest(t.path(), "base"));
    assert_eq!(base.index_digest, None);
    assert_eq!(base.layers.len(), 1);
    assert_eq!(
        base.layers[0].1,
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let cfg: serde_json::Value = serde_json::from_slice(&base.config_json).unwrap();
    assert_eq!(cfg["architecture"], "amd64");
    check_stored(&store, &base);
    assert_eq!(reg.blob_gets(from), 2, "config + layer");
    assert!(rec.cached().is_empty());

    // The second image shares base's layer: only its config and its own
    // layer are fetched.
    let rec = Rec::default();
    let from = reg.log_len();
    let app = pull(&format!("{}/team/app:v1", reg.host), &opts, &store, &rec)
        .await
        .unwrap();
    check_stored(&store, &app);
    assert_eq!(app.layers.len(), 2);
    assert_eq!(app.layers[0].0, base.layers[0].0);
    assert_eq!(
        app.layers[1].1,
        "application/vnd.docker.image.rootfs.diff.tar.gzip"
    );
    assert_eq!(rec.cached(), vec![base.layers[0].0.clone()]);
    let mut want = vec![app.config_digest.clone(), app.layers[1].0.clone()];
    want.sort();
    assert_eq!(rec.fetched(), want);
    assert_eq!(reg.blob_gets(from), 2, "only the new blobs");
    eprintln!(
        "second pull: {} blobs fetched, {} cached",
        want.len(),
        rec.cached().len()
    );

    // By digest: the same image, nothing fetched.
    let rec = Rec::default();
    let from = reg.log_len();
    let by_digest = format!("{}/team/app@{}", reg.host, app.manifest_digest);
    let again = pull(&by_digest, &opts, &store, &rec).await.unwrap();
    assert_eq!(again.reference, by_digest);
    assert_eq!(
        (&again.layers, &again.config_digest),
        (&app.layers, &app.config_digest)
    );
    assert_eq!(reg.blob_gets(from), 0);
    assert_eq!(rec.cached().len(), 3);

    // What is not there.
    let wrong = format!("{}/team/app@sha256:{}", reg.host, "0".repeat(64));
    let e = pull(&wrong, &opts, &store, &NoProgress).await.unwrap_err();
    assert!(matches!(e, PullError::NotFound { .. }), "{e}");
    let e = pull(
        &format!("{}/team/app:v9", reg.host),
        &opts,
        &store,
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, PullError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("team/app:v9"), "{e}");
    let e = pull(
        &format!("{}/nobody/here:v1", reg.host),
        &opts,
        &store,
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("not found"), "{e}");
    eprintln!("missing repository: {e}");
    assert!(ingest_empty(&store));
}

#[tokio::test]
async fn index_resolves_to_linux_amd64() {
    need_tools();
    let t = tempfile::tempdir().unwrap();
    make_layout(t.path(), 0, true);
    let reg = Registry::start(t.path(), false);
    reg.push(t.path(), "multi", "multi:v1", &["--all"]);
    let store = BlobStore::open(t.path().join("blobs")).unwrap();
    let reference = format!("{}/multi:v1", reg.host);
    let p = pull(&reference, &PullOptions::default(), &store, &NoProgress)
        .await
        .unwrap();
    assert_eq!(p.manifest_digest, layout_digest(t.path(), "base"));
    assert_eq!(
        p.index_digest.as_deref(),
        Some(&*layout_digest(t.path(), "multi"))
    );
    check_stored(&store, &p);

    let opts = PullOptions {
        platform: ("linux".into(), "s390x".into()),
        ..Default::default()
    };
    let e = pull(&reference, &opts, &store, &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{reference} has no image for linux/s390x; it has: linux/arm64, linux/amd64")
    );
}

#[tokio::test]
async fn htpasswd_over_tls() {
    need_tools();
    let t = tempfile::tempdir().unwrap();
    make_layout(t.path(), 0, false);
    let reg = Registry::start(t.path(), true);
    reg.push(t.path(), "base", "private/base:v1", &[]);
    let reference = format!("{}/private/base:v1", reg.host);
    let alice = || RegistryAuth::Basic {
        username: "alice".into(),
        password: "s3cret".into(),
    };
    let tls = |auth: RegistryAuth, ca: bool| PullOptions {
        auth,
        ca_certs: if ca {
            vec![t.path().join("ca.pem")]
        } else {
            vec![]
        },
        loopback_plain_http: false,
        ..Default::default()
    };

    // Without the CA, the certificate is not trusted.
    let store = BlobStore::open(t.path().join("blobs-none")).unwrap();
    let e = pull(&reference, &tls(alice(), false), &store, &NoProgress)
        .await
        .unwrap_err();
    assert!(matches!(e, PullError::Tls { .. }), "{e}");
    eprintln!("no CA: {e}");

    // A wrong password: the asked-for message, nothing stored.
    let bad = RegistryAuth::Basic {
        username: "alice".into(),
        password: "wrong".into(),
    };
    let e = pull(&reference, &tls(bad, true), &store, &NoProgress)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "authentication to {} failed: check the user name and password \
             (--username/--password or ~/.docker/config.json)",
            reg.host
        )
    );
    let e = pull(
        &reference,
        &tls(RegistryAuth::Anonymous, true),
        &store,
        &NoProgress,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, PullError::AuthRequired { .. }), "{e}");
    assert!(store.list().is_empty() && ingest_empty(&store));

    // The right password works.
    let p = pull(&reference, &tls(alice(), true), &store, &NoProgress)
        .await
        .unwrap();
    check_stored(&store, &p);

    // Credentials from a docker config file, under docker login's key form.
    let cfg = t.path().join("docker-config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"auths":{{"https://{}":{{"auth":"{auth}"}}}}}}"#,
            reg.host
        ),
    )
    .unwrap();
    let found = credentials_for(&reg.host, None, Some(&cfg)).unwrap();
    assert_eq!(found, alice());
    let store2 = BlobStore::open(t.path().join("blobs-cfg")).unwrap();
    let p2 = pull(&reference, &tls(found, true), &store2, &NoProgress)
        .await
        .unwrap();
    assert_eq!(p2, p);
}

#[tokio::test]
async fn corrupt_blob_in_registry_is_refused() {
    need_tools();
    let t = tempfile::tempdir().unwrap();
    make_layout(t.path(), 0, false);
    let reg = Registry::start(t.path(), false);
    reg.push(t.path(), "app", "app:v1", &[]);
    let store = BlobStore::open(t.path().join("blobs")).unwrap();
    let reference = format!("{}/app:v1", reg.host);
    // Learn the layer digests from a pull into a scratch store.
    let scratch = BlobStore::open(t.path().join("scratch")).unwrap();
    let good = pull(&reference, &PullOptions::default(), &scratch, &NoProgress)
        .await
        .unwrap();
    // Flip one byte of the top layer on the registry's disk (same size).
    let bad = &good.layers[1].0;
    let hex = &bad[7..];
    let data = reg
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();

    let e = pull(&reference, &PullOptions::default(), &store, &NoProgress)
        .await
        .unwrap_err();
    assert!(matches!(e, PullError::DigestMismatch { .. }), "{e}");
    assert!(e.to_string().contains(bad.as_str()), "{e}");
    eprintln!("corrupt layer: {e}");
    assert!(!store.has(bad));
    assert!(ingest_empty(&store));

    // A manifest altered on the registry's disk (still valid JSON, so the
    // registry serves it under its recorded digest): refused by tag and by
    // digest.
    reg.push(t.path(), "base", "base:v1", &[]);
    let m = layout_digest(t.path(), "base");
    let data = reg
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&m[7..9])
        .join(&m[7..])
        .join("data");
    let text = std::fs::read_to_string(&data).unwrap();
    let altered = text.replacen("tar+gzip", "tar+gziP", 1);
    assert_ne!(text, altered);
    std::fs::write(&data, altered).unwrap();
    let store = BlobStore::open(t.path().join("blobs-m")).unwrap();
    for r in [
        format!("{}/base:v1", reg.host),
        format!("{}/base@{m}", reg.host),
    ] {
        let e = pull(&r, &PullOptions::default(), &store, &NoProgress)
            .await
            .unwrap_err();
        assert!(matches!(e, PullError::DigestMismatch { .. }), "{r}: {e}");
        eprintln!("altered manifest: {e}");
    }
    assert!(store.list().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_pull_leaves_no_partial_blob_and_resumes() {
    need_tools();
    let t = tempfile::tempdir().unwrap();
    make_layout(t.path(), 48, false);
    let reg = Registry::start(t.path(), false);
    reg.push(t.path(), "big", "big:v1", &[]);
    let store = BlobStore::open(t.path().join("blobs")).unwrap();
    let reference = format!("{}/big:v1", reg.host);
    let opts = PullOptions::default();

    // Drop the pull once the big layer has started arriving.
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    let tx = Mutex::new(Some(tx));
    let first_bytes = move |e: ProgressEvent| {
        if let ProgressEvent::Bytes { item, done, total } = e {
            if total.is_some_and(|t| t > 32 << 20) && done < total.unwrap_or(0) {
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(item);
                }
            }
        }
    };
    let big = tokio::select! {
        r = pull(&reference, &opts, &store, &first_bytes) => panic!("the pull was not interrupted: {r:?}"),
        d = rx => d.unwrap(),
    };
    assert!(!store.has(&big), "the interrupted layer is not visible");
    // The writer's blocking task ends when it sees the channel closed.
    let t0 = Instant::now();
    while !ingest_empty(&store) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "ingest files left behind"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The registry logs the aborted download when it notices: let it.
    let mut len = reg.log_len();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if std::mem::replace(&mut len, reg.log_len()) == len {
            break;
        }
    }
    let kept = store.list();
    eprintln!("interrupted: {} whole blobs kept, none partial", kept.len());

    let rec = Rec::default();
    let from = reg.log_len();
    let p = pull(&reference, &opts, &store, &rec).await.unwrap();
    check_stored(&store, &p);
    // Everything kept was reused (the manifest is not a fetched blob).
    let reused: Vec<String> = kept
        .into_iter()
        .filter(|d| *d != p.manifest_digest)
        .collect();
    assert!(reused.contains(&p.config_digest), "the config came first");
    assert_eq!(rec.cached(), reused);
    assert!(rec.fetched().contains(&big));
    assert_eq!(reg.blob_gets(from), 3 - reused.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_pull_gives_its_blobs_back() {
    // The daemon pulls through a leased store and collects when the pull
    // fails: the blobs that came whole before the interruption go, once
    // the lease is dropped, and never while it is held.
    need_tools();
    let t = tempfile::tempdir().unwrap();
    make_layout(t.path(), 40, false);
    let reg = Registry::start(t.path(), false);
    reg.push(t.path(), "big", "big:v1", &[]);
    let store = BlobStore::open(t.path().join("blobs")).unwrap();
    let live = store.leased();
    let reference = format!("{}/big:v1", reg.host);
    let opts = PullOptions::default();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Mutex::new(Some(tx));
    let first_bytes = move |e: ProgressEvent| {
        if let ProgressEvent::Bytes { done, total, .. } = e {
            if total.is_some_and(|t| t > 32 << 20) && done > 0 {
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
            }
        }
    };
    tokio::select! {
        r = pull(&reference, &opts, &live, &first_bytes) => panic!("the pull was not interrupted: {r:?}"),
        _ = rx => {}
    };
    let t0 = Instant::now();
    while !ingest_empty(&store) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "ingest files left behind"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kept = store.list();
    assert!(!kept.is_empty(), "the config and base layer came first");
    assert_eq!(store.gc(std::collections::HashSet::new).blobs, 0);
    // The pull's blocking writer may outlive it, holding the lease: what
    // the daemon waits for before it collects.
    let watch = live.lease_watch().unwrap();
    drop(live);
    while !watch.released() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the lease was never given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let st = store.gc(std::collections::HashSet::new);
    eprintln!(
        "interrupted pull: {} blobs ({} bytes) given back",
        st.blobs, st.bytes
    );
    assert_eq!(st.blobs as usize, kept.len());
    assert!(store.list().is_empty());
}
