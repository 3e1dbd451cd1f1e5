use super::*;

fn file() -> FileEntry {
    FileEntry {
        name: "memory.diff".into(),
        size: 10 << 20,
        sha256: "ab".repeat(32),
        chunks: vec![
            Chunk {
                offset: 0,
                length: 4 << 20,
                digest: format!("sha256:{}", "1".repeat(64)),
                size: 1000,
            },
            Chunk {
                offset: 8 << 20,
                length: 2 << 20,
                digest: format!("sha256:{}", "2".repeat(64)),
                size: 2000,
            },
        ],
    }
}

fn link() -> LinkConfig {
    LinkConfig {
        schema: SCHEMA,
        id: "sn-0123456789ab".into(),
        kind: "diff".into(),
        parent: None,
        manifest_fvs: "AAAA".into(),
        disk_backing: DiskBacking::Image,
        requires: crate::compat::Requires {
            arch: "x86_64".into(),
            qemu: "10.0.2".into(),
            machine: "microvm".into(),
            accel: "tcg".into(),
            cpu_model: "max".into(),
            cpu_vendor: "GenuineIntel".into(),
            cpu_flags: vec![],
            kernel_sha256: "a".repeat(64),
            initrd_sha256: "b".repeat(64),
        },
        files: vec![file()],
    }
}

fn manifest_of(c: &LinkConfig) -> (Vec<u8>, Manifest) {
    let b = to_bytes(c);
    let m = manifest(ARTIFACT_LINK, MT_LINK_CONFIG, &b, layers(&c.files), &c.id);
    (b, m)
}

#[test]
fn a_link_round_trips() {
    let c = link();
    let (b, m) = manifest_of(&c);
    let mb = to_bytes(&m);
    let m2 = parse_manifest(&mb, ARTIFACT_LINK, "m").unwrap();
    assert_eq!(parse_link(&b, &m2, "c").unwrap(), c);
    assert_eq!(m2.layers.len(), 2);
    assert_eq!(m2.config.digest, sha256_digest(&b));
}

#[test]
fn every_chunk_list_corruption_is_refused() {
    type Edit = Box<dyn Fn(&mut FileEntry)>;
    let edits: Vec<(&str, Edit)> = vec![
        ("overlap", Box::new(|f| f.chunks[1].offset = 1 << 20)),
        ("past the end", Box::new(|f| f.size = 9 << 20)),
        ("zero length", Box::new(|f| f.chunks[0].length = 0)),
        ("too long", Box::new(|f| f.chunks[0].length = MAX_CHUNK + 1)),
        (
            "bad digest",
            Box::new(|f| f.chunks[0].digest = "sha256:xyz".into()),
        ),
        (
            "md5",
            Box::new(|f| f.chunks[0].digest = format!("md5:{}", "1".repeat(64))),
        ),
        ("bad sha", Box::new(|f| f.sha256 = "nothex".into())),
        ("path", Box::new(|f| f.name = "../etc/passwd".into())),
        ("hidden", Box::new(|f| f.name = ".memory.head".into())),
        (
            "inflated size",
            Box::new(|f| f.chunks[0].size = (4 << 20) + 5000),
        ),
        ("wraps", Box::new(|f| f.chunks[1].offset = u64::MAX - 5)),
    ];
    for (what, e) in edits {
        let mut f = file();
        e(&mut f);
        assert!(f.check("t").is_err(), "{what} was accepted");
    }
    file().check("t").unwrap();
}

#[test]
fn a_chunk_missing_from_the_layers_is_refused() {
    let c = link();
    let (b, mut m) = manifest_of(&c);
    m.layers.pop();
    let e = parse_link(&b, &m, "c").unwrap_err();
    assert!(e.to_string().contains("not a layer"), "{e}");
    // A layer whose size disagrees with the chunk's.
    let (b, mut m) = manifest_of(&c);
    m.layers[0].size += 1;
    assert!(parse_link(&b, &m, "c").is_err());
}

#[test]
fn foreign_and_newer_documents_are_named() {
    let c = link();
    let (b, m) = manifest_of(&c);
    // A container image's manifest.
    let mut img = m.clone();
    img.artifact_type = String::new();
    img.config.media_type = "application/vnd.oci.image.config.v1+json".into();
    let e = parse_manifest(&to_bytes(&img), ARTIFACT_LINK, "m").unwrap_err();
    assert!(matches!(e, FormatError::Foreign { .. }), "{e}");
    // A newer schema says to upgrade, even with fields this build lacks.
    let mut v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    v["schema"] = 2.into();
    v["files"] = "changed shape".into();
    let e = parse_link(&serde_json::to_vec(&v).unwrap(), &m, "c").unwrap_err();
    assert!(e.to_string().contains("upgrade forkvm"), "{e}");
    // Truncated JSON.
    assert!(matches!(
        parse_link(&b[..b.len() / 2], &m, "c"),
        Err(FormatError::Json { .. })
    ));
    // A file listed twice.
    let mut twice = c.clone();
    twice.files.push(file());
    let (b2, m2) = manifest_of(&twice);
    assert!(parse_link(&b2, &m2, "c")
        .unwrap_err()
        .to_string()
        .contains("twice"));
}

#[test]
fn indexes_are_checked() {
    let entry = |role: &str| {
        let mut d = blob(MT_MANIFEST, &format!("sha256:{}", "3".repeat(64)), 100);
        d.annotations.insert(ANN_ROLE.into(), role.into());
        d
    };
    let idx = |ms: Vec<Descriptor>, at: &str| Index {
        schema_version: 2,
        media_type: MT_INDEX.into(),
        artifact_type: at.into(),
        manifests: ms,
        annotations: Default::default(),
    };
    let ok = idx(vec![entry("image"), entry("link")], ARTIFACT_SNAPSHOT);
    parse_index(&to_bytes(&ok), "i").unwrap();
    for (what, bad) in [
        (
            "no artifact type",
            idx(vec![entry("image"), entry("link")], ""),
        ),
        ("no link", idx(vec![entry("image")], ARTIFACT_SNAPSHOT)),
        (
            "image not first",
            idx(vec![entry("link"), entry("image")], ARTIFACT_SNAPSHOT),
        ),
        (
            "unknown role",
            idx(vec![entry("image"), entry("x")], ARTIFACT_SNAPSHOT),
        ),
        ("empty", idx(vec![], ARTIFACT_SNAPSHOT)),
    ] {
        assert!(
            parse_index(&to_bytes(&bad), "i").is_err(),
            "{what} accepted"
        );
    }
    let mut md5 = ok.clone();
    md5.manifests[1].digest = "md5:00".into();
    assert!(parse_index(&to_bytes(&md5), "i").is_err());
}
