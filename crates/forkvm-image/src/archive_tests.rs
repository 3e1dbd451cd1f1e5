//! Tests of [`super::import_source`]: each source format written by hand
//! (as docker, skopeo and umoci write them), plus corrupt and ambiguous
//! ones. `tests/real_tools.rs` checks the same against the real tools.

use std::fs;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::*;
use crate::progress::NoProgress;
use crate::testutil::{gzip, zstd, TarBuf};
use crate::unpack::{apply_layer, Compression};

/// An image's blobs.
struct Img {
    layers: Vec<Vec<u8>>,
    config: Vec<u8>,
    manifest: Vec<u8>,
}

fn layer(n: u8) -> Vec<u8> {
    TarBuf::new()
        .file(&format!("layer{n}"), 0o644, &[b'0' + n])
        .file("etc/which", 0o644, &[b'0' + n])
        .finish()
}

fn config(arch: &str, layers: &[Vec<u8>]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256_digest(l)).collect();
    serde_json::to_vec(&json!({
        "architecture": arch, "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["A=1"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}
    }))
    .unwrap()
}

fn desc(mt: &str, b: &[u8]) -> Value {
    json!({"mediaType": mt, "digest": sha256_digest(b), "size": b.len()})
}

/// An OCI image whose layers are gzip blobs of `tars`.
fn image(arch: &str, tars: &[Vec<u8>]) -> Img {
    let config = config(arch, tars);
    let layers: Vec<Vec<u8>> = tars.iter().map(|t| gzip(t)).collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": desc(media::OCI_CONFIG, &config),
        "layers": layers.iter().map(|l| desc(media::OCI_LAYER_GZIP, l)).collect::<Vec<_>>(),
    }))
    .unwrap();
    Img {
        layers,
        config,
        manifest,
    }
}

fn put_blob(dir: &Path, b: &[u8]) {
    let p = dir.join("blobs/sha256").join(&sha256_digest(b)[7..]);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, b).unwrap();
}

fn put_image(dir: &Path, img: &Img) {
    for b in img.layers.iter().chain([&img.config, &img.manifest]) {
        put_blob(dir, b);
    }
}

/// An OCI layout whose index.json lists `entries` (document, ref name).
fn oci_dir(dir: &Path, entries: &[(&[u8], &str)]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let manifests: Vec<Value> = entries
        .iter()
        .map(|(b, name)| {
            let mt = if serde_json::from_slice::<Value>(b).unwrap()["manifests"].is_array() {
                media::OCI_INDEX
            } else {
                media::OCI_MANIFEST
            };
            let mut d = desc(mt, b);
            d["annotations"] = json!({REF_NAME: name});
            d
        })
        .collect();
    let ix = json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": manifests});
    fs::write(dir.join("index.json"), serde_json::to_vec(&ix).unwrap()).unwrap();
}

fn tar_dir(dir: &Path, out: &Path) {
    let mut b = tar::Builder::new(fs::File::create(out).unwrap());
    b.append_dir_all(".", dir).unwrap();
    b.finish().unwrap();
}

struct Env {
    t: tempfile::TempDir,
    store: BlobStore,
}

fn env() -> Env {
    let t = tempfile::tempdir().unwrap();
    let store = BlobStore::open(t.path().join("blobs")).unwrap();
    Env { t, store }
}

impl Env {
    fn p(&self, name: &str) -> PathBuf {
        self.t.path().join(name)
    }

    fn import(&self, path: &Path) -> Result<(ResolvedImage, ArchiveFormat), ImageError> {
        import_source_ref(path, None, &self.store, &NoProgress)
    }

    /// Apply an imported image's layers and read /etc/which.
    fn unpacked(&self, r: &ResolvedImage) -> (PathBuf, String) {
        let root = self.t.path().join(format!("root-{}", rand_suffix()));
        fs::create_dir(&root).unwrap();
        for l in &r.layers {
            let f = self.store.open_blob(&l.digest).unwrap();
            apply_layer(&root, f, Compression::Auto).unwrap();
        }
        let which = fs::read_to_string(root.join("etc/which")).unwrap();
        (root, which)
    }

    fn ingest_empty(&self) -> bool {
        fs::read_dir(self.store.root().join("ingest"))
            .unwrap()
            .count()
            == 0
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn oci_layout_dir_and_tar() {
    let e = env();
    let img = image("amd64", &[layer(1), layer(2)]);
    let dir = e.p("layout");
    oci_dir(&dir, &[(&img.manifest, "t")]);
    put_image(&dir, &img);
    let (r, f) = e.import(&dir).unwrap();
    assert_eq!(f, ArchiveFormat::OciLayout);
    assert_eq!(r.manifest_digest, Some(sha256_digest(&img.manifest)));
    assert_eq!(r.config_digest, Some(sha256_digest(&img.config)));
    assert_eq!(r.config.cmd, ["/bin/sh"]);
    assert_eq!(r.layers.len(), 2);
    let (root, which) = e.unpacked(&r);
    assert_eq!(which, "2");
    assert!(root.join("layer1").exists() && root.join("layer2").exists());

    // The same layout as a tar, into a fresh store.
    let e2 = env();
    let tar = e2.p("layout.tar");
    tar_dir(&dir, &tar);
    let (r2, f) = e2.import(&tar).unwrap();
    assert_eq!(f, ArchiveFormat::OciArchive);
    assert_eq!(r2, r);
    assert_eq!(e2.store.list().len(), 4);
    // Importing again reads no blob.
    let cached = std::sync::Mutex::new(0);
    let p = |ev: ProgressEvent| {
        if let ProgressEvent::Cached { .. } = ev {
            *cached.lock().unwrap() += 1;
        }
    };
    import_source(&tar, &e2.store, &p).unwrap();
    assert_eq!(*cached.lock().unwrap(), 4);
}

#[test]
fn index_with_two_platforms_picks_amd64() {
    let e = env();
    let amd = image("amd64", &[layer(1)]);
    let arm = image("arm64", &[layer(2)]);
    let ix = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": media::OCI_INDEX,
        "manifests": [
            {"mediaType": media::OCI_MANIFEST, "digest": sha256_digest(&arm.manifest),
             "size": arm.manifest.len(), "platform": {"os": "linux", "architecture": "arm64"}},
            {"mediaType": media::OCI_MANIFEST, "digest": sha256_digest(&amd.manifest),
             "size": amd.manifest.len(), "platform": {"os": "linux", "architecture": "amd64"}},
        ]
    }))
    .unwrap();
    let dir = e.p("layout");
    oci_dir(&dir, &[(&ix, "multi")]);
    put_blob(&dir, &ix);
    put_image(&dir, &amd);
    // The arm64 image's blobs are absent: only what is used is read.
    put_blob(&dir, &arm.manifest);
    let (r, _) = e.import(&dir).unwrap();
    assert_eq!(r.manifest_digest, Some(sha256_digest(&ix)));
    assert_eq!(e.unpacked(&r).1, "1");

    // An arm64-only image is refused, naming what it has.
    let e = env();
    let dir = e.p("arm");
    oci_dir(&dir, &[(&arm.manifest, "arm")]);
    put_image(&dir, &arm);
    let err = e.import(&dir).unwrap_err();
    assert!(matches!(err, ImageError::NoPlatform { .. }), "{err}");
    assert!(err.to_string().contains("linux/arm64"), "{err}");
}

#[test]
fn several_tags_need_a_reference() {
    let e = env();
    let a = image("amd64", &[layer(1)]);
    let b = image("amd64", &[layer(2)]);
    let dir = e.p("layout");
    oci_dir(&dir, &[(&a.manifest, "a"), (&b.manifest, "b")]);
    put_image(&dir, &a);
    put_image(&dir, &b);
    let err = e.import(&dir).unwrap_err();
    assert!(
        matches!(err, ImageError::Ambiguous { .. }) && err.to_string().contains("a, b"),
        "{err}"
    );
    let (r, _) = import_source_ref(&dir, Some("b"), &e.store, &NoProgress).unwrap();
    assert_eq!(e.unpacked(&r).1, "2");
    // Docker 25's index.json: full names and bare tags.
    let e = env();
    let dir = e.p("docker25");
    oci_dir(&dir, &[(&a.manifest, "latest"), (&b.manifest, "latest")]);
    let mut ix: Value = serde_json::from_slice(&fs::read(dir.join("index.json")).unwrap()).unwrap();
    ix["manifests"][0]["annotations"][CONTAINERD_NAME] = json!("docker.io/library/a:latest");
    ix["manifests"][1]["annotations"][CONTAINERD_NAME] = json!("docker.io/team/b:latest");
    fs::write(dir.join("index.json"), serde_json::to_vec(&ix).unwrap()).unwrap();
    put_image(&dir, &a);
    put_image(&dir, &b);
    let err = import_source_ref(&dir, Some("latest"), &e.store, &NoProgress).unwrap_err();
    assert!(
        err.to_string()
            .contains("docker.io/library/a:latest, docker.io/team/b:latest"),
        "{err}"
    );
    let (r, _) = import_source_ref(&dir, Some("team/b:latest"), &e.store, &NoProgress).unwrap();
    assert_eq!(e.unpacked(&r).1, "2");
    let (r, _) = import_source_ref(&dir, Some("a:latest"), &e.store, &NoProgress).unwrap();
    assert_eq!(e.unpacked(&r).1, "1");
    let err = import_source_ref(&dir, Some("c"), &e.store, &NoProgress).unwrap_err();
    assert!(matches!(err, ImageError::NoSuchImage { .. }), "{err}");
}

#[test]
fn corrupt_blob_is_named_and_leaves_nothing() {
    let e = env();
    let img = image("amd64", &[layer(1), layer(2)]);
    let dir = e.p("layout");
    oci_dir(&dir, &[(&img.manifest, "t")]);
    put_image(&dir, &img);
    let bad = sha256_digest(&img.layers[1]);
    let p = dir.join("blobs/sha256").join(&bad[7..]);
    let mut bytes = fs::read(&p).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    fs::write(&p, &bytes).unwrap();
    for src in [dir.clone(), {
        let t = e.p("corrupt.tar");
        tar_dir(&dir, &t);
        t
    }] {
        let err = e.import(&src).unwrap_err();
        let s = err.to_string();
        assert!(
            s.contains(&bad[7..]) && s.contains("failed verification"),
            "{s}"
        );
        assert!(!e.store.has(&bad));
        assert!(e.ingest_empty());
    }
}

#[test]
fn a_refused_import_gives_its_blobs_back() {
    // A valid first layer, a corrupt second one: the import stores the
    // first (and documents) before it finds the second bad.
    let e = env();
    let img = image("amd64", &[layer(1), layer(2)]);
    let dir = e.p("layout");
    oci_dir(&dir, &[(&img.manifest, "t")]);
    put_image(&dir, &img);
    let bad = sha256_digest(&img.layers[1]);
    let p = dir.join("blobs/sha256").join(&bad[7..]);
    let mut bytes = fs::read(&p).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    fs::write(&p, &bytes).unwrap();
    let live = e.store.leased();
    import_source_ref(&dir, None, &live, &NoProgress).unwrap_err();
    let left = e.store.list();
    assert!(
        left.contains(&sha256_digest(&img.layers[0])),
        "the valid first layer was stored: {left:?}"
    );
    assert_eq!(e.store.gc(std::collections::HashSet::new).blobs, 0);
    drop(live);
    let st = e.store.gc(std::collections::HashSet::new);
    assert_eq!(st.blobs as usize, left.len());
    assert!(e.store.list().is_empty());
    assert!(e.ingest_empty());
}

/// A legacy `docker save` tarball: `<id>/layer.tar`, a repeated layer as a
/// symlink, the config as `<hex>.json`.
fn docker_legacy(out: &Path, img_layers: &[Vec<u8>], gz: bool) -> Vec<u8> {
    let cfg = config("amd64", img_layers);
    let cfg_name = format!("{}.json", &sha256_digest(&cfg)[7..]);
    let mut tb = TarBuf::new();
    let mut paths = Vec::new();
    for (i, l) in img_layers.iter().enumerate() {
        let id = format!("{:064x}", i + 1);
        let first = img_layers.iter().position(|x| x == l).unwrap();
        let name = format!("{id}/layer.tar");
        if first < i {
            tb.symlink(&name, &format!("../{:064x}/layer.tar", first + 1));
        } else {
            tb.file(&name, 0o644, l);
        }
        tb.file(&format!("{id}/VERSION"), 0o644, b"1.0");
        paths.push(name);
    }
    tb.file(&cfg_name, 0o644, &cfg);
    let m = json!([{"Config": cfg_name, "RepoTags": ["x/y:t"], "Layers": paths}]);
    tb.file("manifest.json", 0o644, &serde_json::to_vec(&m).unwrap());
    tb.file("repositories", 0o644, b"{}");
    let bytes = tb.finish();
    fs::write(out, if gz { gzip(&bytes) } else { bytes }).unwrap();
    cfg
}

#[test]
fn docker_save_legacy_plain_and_gzipped() {
    for gz in [false, true] {
        let e = env();
        let tar = e.p("save.tar");
        let cfg = docker_legacy(&tar, &[layer(1), layer(2), layer(1)], gz);
        let (r, f) = e.import(&tar).unwrap();
        assert_eq!(f, ArchiveFormat::DockerArchive);
        assert_eq!(r.manifest_digest, None);
        assert_eq!(r.config_digest, Some(sha256_digest(&cfg)));
        assert_eq!(r.config.env, ["A=1"]);
        assert_eq!(r.layers[0].digest, sha256_digest(&layer(1)));
        assert_eq!(r.layers[0].digest, r.layers[2].digest);
        assert_eq!(e.unpacked(&r).1, "1");
        let (r2, _) = import_source_ref(&tar, Some("x/y:t"), &e.store, &NoProgress).unwrap();
        assert_eq!(r2, r);
    }
}

#[test]
fn docker_save_corrupt_layer_is_refused() {
    let e = env();
    let tar = e.p("save.tar");
    let mut l2 = layer(2);
    docker_legacy(&tar, &[layer(1), l2.clone()], false);
    // Rewrite the archive with a layer that differs from its diff id.
    let mut bytes = fs::read(&tar).unwrap();
    let pos = bytes.windows(l2.len()).position(|w| w == &l2[..]).unwrap();
    l2[1000] ^= 0xff;
    bytes[pos..pos + l2.len()].copy_from_slice(&l2);
    fs::write(&tar, &bytes).unwrap();
    let err = e.import(&tar).unwrap_err();
    assert!(err.to_string().contains("layer.tar"), "{err}");
    assert!(matches!(err, ImageError::BlobContext { .. }), "{err}");
    assert!(e.ingest_empty());
}

/// Docker 25+: an OCI layout and manifest.json with blobs/ paths.
#[test]
fn docker_save_modern_reads_the_layout_or_falls_back() {
    let e = env();
    let tars = [layer(1), layer(2)];
    let cfg = config("amd64", &tars);
    // Docker 25 layers: uncompressed, named by their diff id.
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": desc(media::OCI_CONFIG, &cfg),
        "layers": tars.iter().map(|l| desc(media::OCI_LAYER, l)).collect::<Vec<_>>(),
    }))
    .unwrap();
    let dir = e.p("save");
    oci_dir(&dir, &[(&manifest, "latest")]);
    for b in tars.iter().chain([&cfg, &manifest]) {
        put_blob(&dir, b);
    }
    let m = json!([{
        "Config": format!("blobs/sha256/{}", &sha256_digest(&cfg)[7..]),
        "RepoTags": ["app:latest"],
        "Layers": tars.iter().map(|l| format!("blobs/sha256/{}", &sha256_digest(l)[7..])).collect::<Vec<_>>(),
    }]);
    fs::write(dir.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    let tar = e.p("save.tar");
    tar_dir(&dir, &tar);
    let (r, f) = e.import(&tar).unwrap();
    assert_eq!(
        (f, r.manifest_digest.clone()),
        (ArchiveFormat::OciArchive, Some(sha256_digest(&manifest)))
    );
    assert_eq!(e.unpacked(&r).1, "2");

    // Without the manifest blob, manifest.json is used.
    let e = env();
    fs::remove_file(
        dir.join("blobs/sha256")
            .join(&sha256_digest(&manifest)[7..]),
    )
    .unwrap();
    tar_dir(&dir, &tar);
    let (r, f) = e.import(&tar).unwrap();
    assert_eq!(
        (f, r.manifest_digest.clone()),
        (ArchiveFormat::DockerArchive, None)
    );
    assert_eq!(e.unpacked(&r).1, "2");
}

#[test]
fn plain_rootfs_tarballs() {
    let t = layer(7);
    for (name, bytes, mt) in [
        ("r.tar", t.clone(), media::OCI_LAYER),
        ("r.tar.gz", gzip(&t), media::OCI_LAYER_GZIP),
        ("r.tar.zst", zstd(&t), media::OCI_LAYER_ZSTD),
    ] {
        let e = env();
        let p = e.p(name);
        fs::write(&p, &bytes).unwrap();
        let (r, f) = e.import(&p).unwrap();
        assert_eq!(f, ArchiveFormat::RootfsTar);
        assert_eq!(r.layers.len(), 1);
        assert_eq!(r.layers[0].digest, sha256_digest(&bytes));
        assert_eq!(
            (r.layers[0].media_type.as_str(), r.layers[0].size),
            (mt, bytes.len() as u64)
        );
        assert_eq!(
            (r.config.clone(), r.config_digest.clone()),
            (ImageConfig::default(), None)
        );
        assert_eq!(e.unpacked(&r).1, "7");
    }
}

#[test]
fn what_is_not_an_image() {
    let e = env();
    let p = e.p("notes.txt");
    fs::write(&p, "just some text, not a tar at all\n".repeat(40)).unwrap();
    let err = e.import(&p).unwrap_err();
    assert!(matches!(err, ImageError::UnknownFormat { .. }), "{err}");
    fs::write(&p, gzip(b"gzip of text")).unwrap();
    assert!(matches!(
        e.import(&p).unwrap_err(),
        ImageError::UnknownFormat { .. }
    ));
    let d = e.p("plain-dir");
    fs::create_dir(&d).unwrap();
    let err = e.import(&d).unwrap_err();
    assert!(err.to_string().contains("tar it"), "{err}");
    let err = e.import(&e.p("absent")).unwrap_err();
    assert!(matches!(err, ImageError::Io { .. }), "{err}");
    // A manifest.json naming files outside the archive finds nothing.
    let tar = e.p("evil.tar");
    let m = json!([{"Config": "../../etc/passwd", "RepoTags": [], "Layers": []}]);
    fs::write(
        &tar,
        TarBuf::new()
            .file("manifest.json", 0o644, &serde_json::to_vec(&m).unwrap())
            .finish(),
    )
    .unwrap();
    let err = e.import(&tar).unwrap_err();
    assert!(matches!(err, ImageError::MissingBlob { .. }), "{err}");
}

/// Tars holding what is left of an image format, and files that are no
/// tar, are refused with the format named; a root filesystem with an
/// `app/manifest.json` is still one.
#[test]
fn image_remains_and_other_formats_are_refused_by_name() {
    let e = env();
    let refused = |name: &str, bytes: Vec<u8>, says: &str| {
        let p = e.p(name);
        fs::write(&p, bytes).unwrap();
        let err = e.import(&p).unwrap_err();
        assert!(
            matches!(err, ImageError::UnknownFormat { .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(says), "{name}: {err}");
        assert!(
            matches!(detect_format(&p), Err(ImageError::UnknownFormat { .. })),
            "{name}"
        );
    };
    let legacy = TarBuf::new()
        .file("repositories", 0o644, b"{}")
        .file(&format!("{}/layer.tar", "a".repeat(64)), 0o644, &layer(1))
        .file(&format!("{}/json", "a".repeat(64)), 0o644, b"{}")
        .finish();
    refused(
        "legacy.tar",
        legacy,
        "`docker save` archive without its manifest.json",
    );
    let skopeo_like = TarBuf::new()
        .file(&format!("{}.json", "b".repeat(64)), 0o644, b"{}")
        .file(&format!("{}.tar", "c".repeat(64)), 0o644, &layer(1))
        .finish();
    refused(
        "skopeo.tar",
        gzip(&skopeo_like),
        "without its manifest.json",
    );
    let no_index = TarBuf::new()
        .file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#)
        .file("blobs/sha256/x", 0o644, b"{}")
        .finish();
    refused("no-index.tar", no_index, "lacks index.json");
    let blobs = TarBuf::new().file("blobs/sha256/x", 0o644, b"{}").finish();
    refused("blobs.tar", blobs, "OCI blobs");
    let nested = TarBuf::new()
        .dir("layout", 0o755)
        .file("layout/oci-layout", 0o644, b"{}")
        .file("layout/index.json", 0o644, b"{}")
        .finish();
    refused("nested.tar", nested, "inside the directory layout/");
    let mut xz = vec![0xfd, b'7', b'z', b'X', b'Z', 0];
    xz.resize(4096, 0);
    refused("r.tar.xz", xz, "xz-compressed");
    let mut ext4 = vec![0u8; 4096];
    ext4[1080..1082].copy_from_slice(&[0x53, 0xef]);
    refused("disk.img", ext4, "ext2/3/4 filesystem image");
    let mut zip = b"PK\x03\x04".to_vec();
    zip.resize(1024, 0);
    refused("a.zip", zip, "a zip archive");

    let p = e.p("rootfs-with-manifest.tar");
    fs::write(
        &p,
        TarBuf::new()
            .file("bin/x", 0o755, b"x")
            .file("app/manifest.json", 0o644, b"{}")
            .file("app/index.json", 0o644, b"{}")
            .finish(),
    )
    .unwrap();
    assert_eq!(e.import(&p).unwrap().1, ArchiveFormat::RootfsTar);
}
