//! Tests of the OCI/Docker document parsing, platform selection and
//! resolution (documents written by hand, as registries send them).

use serde_json::{json, Value};

use super::*;
use crate::blobs::sha256_digest;

fn desc(mt: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": mt, "digest": sha256_digest(bytes), "size": bytes.len()})
}

fn config_json(arch: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
            "WorkingDir": "/app",
            "User": "1000:1000",
            "Entrypoint": ["/entry.sh"],
            "Cmd": ["serve", "--port", "8080"],
            "ExposedPorts": {"9090/tcp": {}, "8080": {}, "8080/tcp": {}, "53/udp": {}},
            "Labels": {"b": "2", "a": "1"},
            "Hostname": "ignored",
            "Healthcheck": {"Test": ["CMD", "true"]}
        },
        "rootfs": {"type": "layers", "diff_ids": []}
    }))
    .unwrap()
}

fn manifest(mt: Option<&str>, config: &[u8], config_mt: &str, layers: &[(&str, &[u8])]) -> Vec<u8> {
    let mut m = json!({
        "schemaVersion": 2,
        "config": desc(config_mt, config),
        "layers": layers.iter().map(|(mt, b)| desc(mt, b)).collect::<Vec<_>>(),
    });
    if let Some(mt) = mt {
        m["mediaType"] = json!(mt);
    }
    serde_json::to_vec(&m).unwrap()
}

/// (os, architecture, variant)
type Plat<'a> = Option<(&'a str, &'a str, Option<&'a str>)>;

fn index(mt: &str, entries: &[(&[u8], Plat)]) -> Vec<u8> {
    let manifests: Vec<Value> = entries
        .iter()
        .map(|(b, p)| {
            let mut d = desc(media::OCI_MANIFEST, b);
            if let Some((os, arch, variant)) = p {
                d["platform"] = json!({"os": os, "architecture": arch});
                if let Some(v) = variant {
                    d["platform"]["variant"] = json!(v);
                }
            }
            d
        })
        .collect();
    serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": mt, "manifests": manifests}))
        .unwrap()
}

fn parse_index_bytes(b: &[u8]) -> ImageIndex {
    match parse_document(b, "test").unwrap() {
        Document::Index(i) => *i,
        Document::Manifest(_) => panic!("not an index"),
    }
}

#[test]
fn config_fields_are_read() {
    let c = config_from_oci(&config_json("amd64")).unwrap();
    assert_eq!(c.env, ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"]);
    assert_eq!(c.working_dir.as_deref(), Some("/app"));
    assert_eq!(c.user.as_deref(), Some("1000:1000"));
    assert_eq!(c.entrypoint, ["/entry.sh"]);
    assert_eq!(c.cmd, ["serve", "--port", "8080"]);
    assert_eq!(c.exposed_ports, ["53/udp", "8080/tcp", "9090/tcp"]);
    assert_eq!(c.labels.keys().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn docker_nulls_and_empty_configs() {
    let c = config_from_oci(
        br#"{"architecture":"amd64","os":"linux","config":{"Env":null,"Cmd":null,"Entrypoint":null,"WorkingDir":"","User":"","Labels":null,"ExposedPorts":null},"rootfs":{"type":"layers","diff_ids":[]}}"#,
    )
    .unwrap();
    assert_eq!(c, ImageConfig::default());
    assert_eq!(config_from_oci(b"{}").unwrap(), ImageConfig::default());
    for bad in [&b"[]"[..], b"{\"config\": 3}", b"not json", b""] {
        let e = config_from_oci(bad).unwrap_err();
        assert!(matches!(e, ImageError::Malformed { .. }), "{e}");
    }
}

#[test]
fn config_platform_is_checked() {
    check_config_platform(&config_json("amd64")).unwrap();
    check_config_platform(b"{}").unwrap();
    let e = check_config_platform(&config_json("arm64")).unwrap_err();
    assert!(e.to_string().contains("linux/arm64"), "{e}");
}

#[test]
fn manifests_of_both_families_parse() {
    let cfg = config_json("amd64");
    for (mt, cmt, lmt) in [
        (
            Some(media::OCI_MANIFEST),
            media::OCI_CONFIG,
            media::OCI_LAYER_GZIP,
        ),
        (
            Some(media::DOCKER_MANIFEST),
            media::DOCKER_CONFIG,
            media::DOCKER_LAYER_GZIP,
        ),
        (None, media::OCI_CONFIG, media::OCI_LAYER_ZSTD),
    ] {
        let m = manifest(mt, &cfg, cmt, &[(lmt, b"layer")]);
        let Document::Manifest(m) = parse_document(&m, "m").unwrap() else {
            panic!("not a manifest")
        };
        let l = layer_refs(&m).unwrap();
        assert_eq!(l[0].digest, sha256_digest(b"layer"));
        assert_eq!(l[0].size, 5);
        assert_ne!(l[0].compression(), Compression::Auto);
    }
}

#[test]
fn bad_documents_are_refused() {
    let schema1 = br#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
    let e = parse_document(schema1, "m").unwrap_err();
    assert!(e.to_string().contains("schema 1"), "{e}");
    let art = br#"{"schemaVersion":2,"mediaType":"application/vnd.cncf.helm.chart","layers":[]}"#;
    assert!(matches!(
        parse_document(art, "m").unwrap_err(),
        ImageError::Unsupported { .. }
    ));
    for bad in [
        &b"[1]"[..],
        b"{}",
        b"{\"layers\": 5}",
        b"\xff",
        b"{\"manifests\":[{\"digest\":\"md5:x\"}]}",
    ] {
        let e = parse_document(bad, "m").unwrap_err();
        assert!(matches!(e, ImageError::Malformed { .. }), "{e}");
    }
}

#[test]
fn index_picks_amd64() {
    for mt in [media::OCI_INDEX, media::DOCKER_MANIFEST_LIST] {
        let ix = index(
            mt,
            &[
                (b"arm", Some(("linux", "arm64", Some("v8")))),
                (b"amd-v3", Some(("linux", "amd64", Some("v3")))),
                (b"amd", Some(("linux", "amd64", None))),
            ],
        );
        let d = select_platform(&parse_index_bytes(&ix)).unwrap();
        assert_eq!(d.digest().to_string(), sha256_digest(b"amd"));
    }
    // Only a variant: taken.
    let ix = index(
        media::OCI_INDEX,
        &[(b"v2", Some(("linux", "amd64", Some("v2"))))],
    );
    let d = select_platform(&parse_index_bytes(&ix)).unwrap();
    assert_eq!(d.digest().to_string(), sha256_digest(b"v2"));
    // One entry without a platform (an OCI layout's index.json): taken.
    let ix = index(media::OCI_INDEX, &[(b"only", None)]);
    let d = select_platform(&parse_index_bytes(&ix)).unwrap();
    assert_eq!(d.digest().to_string(), sha256_digest(b"only"));
}

#[test]
fn index_without_amd64_says_what_it_has() {
    let ix = index(
        media::OCI_INDEX,
        &[
            (b"arm", Some(("linux", "arm64", Some("v8")))),
            (b"win", Some(("windows", "amd64", None))),
        ],
    );
    let e = select_platform(&parse_index_bytes(&ix)).unwrap_err();
    let s = e.to_string();
    assert!(matches!(e, ImageError::NoPlatform { .. }));
    assert!(
        s.contains("linux/arm64/v8") && s.contains("windows/amd64"),
        "{s}"
    );
    let e = select_platform(&parse_index_bytes(&index(media::OCI_INDEX, &[]))).unwrap_err();
    assert!(e.to_string().contains("no images"), "{e}");
}

#[test]
fn resolve_through_an_index() {
    let t = tempfile::tempdir().unwrap();
    let store = BlobStore::open(t.path()).unwrap();
    let cfg = config_json("amd64");
    let arm_cfg = config_json("arm64");
    let m = manifest(
        Some(media::OCI_MANIFEST),
        &cfg,
        media::OCI_CONFIG,
        &[(media::OCI_LAYER_GZIP, b"l1"), (media::OCI_LAYER, b"l2")],
    );
    let arm = manifest(Some(media::OCI_MANIFEST), &arm_cfg, media::OCI_CONFIG, &[]);
    let ix = index(
        media::OCI_INDEX,
        &[
            (&arm, Some(("linux", "arm64", None))),
            (&m, Some(("linux", "amd64", None))),
        ],
    );
    let ixd = store.put_bytes(&ix).unwrap();
    store.put_bytes(&m).unwrap();
    // The config is not there yet.
    let e = resolve(&store, &ixd).unwrap_err();
    assert!(matches!(e, ImageError::MissingBlob { .. }), "{e}");
    let cd = store.put_bytes(&cfg).unwrap();
    let r = resolve(&store, &ixd).unwrap();
    assert_eq!(r.manifest_digest.as_deref(), Some(ixd.as_str()));
    assert_eq!(r.config_digest.as_deref(), Some(cd.as_str()));
    assert_eq!(r.layers.len(), 2);
    assert_eq!(r.layers[1].digest, sha256_digest(b"l2"));
    assert_eq!(r.layers[1].compression(), Compression::None);
    assert_eq!(r.config.cmd, ["serve", "--port", "8080"]);
    // An arm64 manifest reached directly is refused by its config.
    store.put_bytes(&arm_cfg).unwrap();
    let armd = store.put_bytes(&arm).unwrap();
    let e = resolve(&store, &armd).unwrap_err();
    assert!(e.to_string().contains("linux/arm64"), "{e}");
}

#[test]
fn artifacts_are_not_images() {
    let t = tempfile::tempdir().unwrap();
    let store = BlobStore::open(t.path()).unwrap();
    let cfg = config_json("amd64");
    store.put_bytes(&cfg).unwrap();
    let m = manifest(None, &cfg, "application/vnd.cncf.helm.config.v1+json", &[]);
    let md = store.put_bytes(&m).unwrap();
    let e = resolve(&store, &md).unwrap_err();
    assert!(e.to_string().contains("not a container image"), "{e}");
    let m = manifest(
        None,
        &cfg,
        media::OCI_CONFIG,
        &[("application/x-thing", b"x")],
    );
    let md = store.put_bytes(&m).unwrap();
    let e = resolve(&store, &md).unwrap_err();
    assert!(e.to_string().contains("application/x-thing"), "{e}");
}
