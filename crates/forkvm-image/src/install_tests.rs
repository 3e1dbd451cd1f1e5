//! Tests of installing, listing, reading and removing images: layers put in
//! a store, installed, and the root disk read back with debugfs.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::meta::ImageConfig;
use crate::oci::{media, LayerRef};
use crate::progress::NoProgress;
use crate::testutil::{cap_net_bind_service, debugfs, gzip, TarBuf};

struct Env {
    t: tempfile::TempDir,
    store: BlobStore,
}

impl Env {
    fn new() -> Env {
        let t = tempfile::tempdir().unwrap();
        let store = BlobStore::open(t.path().join("blobs")).unwrap();
        Env { t, store }
    }

    fn images(&self) -> PathBuf {
        self.t.path().join("images")
    }

    fn resolved(&self, layers: &[Vec<u8>]) -> ResolvedImage {
        ResolvedImage {
            manifest_digest: Some(crate::blobs::sha256_digest(b"m")),
            layers: layers
                .iter()
                .map(|l| LayerRef {
                    digest: self.store.put_bytes(l).unwrap(),
                    media_type: media::OCI_LAYER_GZIP.into(),
                    size: l.len() as u64,
                })
                .collect(),
            config: ImageConfig {
                cmd: vec!["/bin/app".into()],
                ..Default::default()
            },
            config_digest: None,
        }
    }

    fn install(
        &self,
        name: &str,
        r: &ResolvedImage,
        replace: bool,
    ) -> Result<ImageMeta, ImageError> {
        install_image(
            &self.images(),
            name,
            r,
            &self.store,
            ImageSource::Import {
                format: "oci-layout".into(),
                file: "/x".into(),
            },
            &InstallOptions {
                replace,
                ..Default::default()
            },
            &NoProgress,
        )
    }

    /// The entries of images/, hidden ones included.
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.images())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

fn base_layer() -> Vec<u8> {
    gzip(
        &TarBuf::new()
            .dir("etc", 0o755)
            .file("etc/gone", 0o644, b"g")
            .file("usr/bin/su", 0o4755, b"su")
            .pax(&[(
                "SCHILY.xattr.security.capability",
                &cap_net_bind_service()[..],
            )])
            .file("usr/bin/ping", 0o755, b"ping")
            .symlink("run", "/var/run")
            .finish(),
    )
}

fn small_layer(marker: &[u8]) -> Vec<u8> {
    TarBuf::new().file("etc/marker", 0o644, marker).finish()
}

fn top_layer(marker: &[u8]) -> Vec<u8> {
    TarBuf::new()
        .file("etc/.wh.gone", 0o644, b"")
        .file("etc/marker", 0o644, marker)
        .hardlink("usr/bin/su-again", "usr/bin/su")
        .finish()
}

#[test]
fn install_makes_a_bootable_image() {
    let e = Env::new();
    let r = e.resolved(&[base_layer(), top_layer(b"one")]);
    let m = e.install("web-1.0", &r, false).unwrap();
    assert_eq!(e.entries(), ["web-1.0"]);
    let dir = e.images().join("web-1.0");
    let disk = dir.join(ROOTFS);
    assert_eq!(
        fs::metadata(&disk).unwrap().permissions().mode() & 0o777,
        0o444
    );
    assert_eq!(fs::metadata(&disk).unwrap().len(), m.size_bytes);
    let names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "only the disk and image.json: {names:?}");
    assert_eq!(read_image(&e.images(), "web-1.0").unwrap(), m);
    assert_eq!(
        m.layers,
        r.layers
            .iter()
            .map(|l| l.digest.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        (m.digest.clone(), m.config.cmd.clone()),
        (r.manifest_digest.clone(), vec!["/bin/app".to_string()])
    );
    assert!(
        m.created_at.ends_with('Z') && m.created_at.len() == 20,
        "{}",
        m.created_at
    );

    for (d, mode) in [
        ("/dev", "0755"),
        ("/proc", "0555"),
        ("/sys", "0555"),
        ("/tmp", "01777"),
    ] {
        let s = debugfs(&disk, &format!("stat {d}"));
        assert!(
            s.contains("Type: directory") && s.contains(&format!("Mode:  {mode}")),
            "{d}: {s}"
        );
    }
    // The image's own /run symlink is kept.
    assert!(debugfs(&disk, "stat /run").contains("Type: symlink"));
    assert!(debugfs(&disk, "cat /etc/marker").contains("one"));
    assert!(debugfs(&disk, "ls /etc").contains("marker"));
    assert!(!debugfs(&disk, "ls /etc").contains("gone"));
    let su = debugfs(&disk, "stat /usr/bin/su");
    assert!(
        su.contains("Mode:  04755") && su.contains("Links: 2"),
        "{su}"
    );
    let caps = debugfs(&disk, "ea_list /usr/bin/ping");
    assert!(caps.contains("security.capability (20)"), "{caps}");
}

#[test]
fn existing_names_need_replace() {
    let e = Env::new();
    e.install("img", &e.resolved(&[small_layer(b"one")]), false)
        .unwrap();
    let err = e
        .install("img", &e.resolved(&[small_layer(b"two")]), false)
        .unwrap_err();
    assert!(matches!(err, ImageError::Exists(_)), "{err}");
    let disk = e.images().join("img").join(ROOTFS);
    assert!(debugfs(&disk, "cat /etc/marker").contains("one"));
    e.install("img", &e.resolved(&[small_layer(b"two")]), true)
        .unwrap();
    assert!(debugfs(&disk, "cat /etc/marker").contains("two"));
    assert_eq!(e.entries(), ["img"]);
    // Replace with nothing there is a plain install.
    e.install("fresh", &e.resolved(&[small_layer(b"3")]), true)
        .unwrap();
    assert_eq!(e.entries(), ["fresh", "img"]);
}

#[test]
fn failures_leave_nothing() {
    let e = Env::new();
    // A layer not in the store.
    let mut r = e.resolved(&[small_layer(b"x")]);
    r.layers[0].digest = crate::blobs::sha256_digest(b"absent");
    let err = e.install("a", &r, false).unwrap_err();
    assert!(matches!(err, ImageError::MissingBlob { .. }), "{err}");
    // A corrupt layer (in the store under its digest, but not a tar).
    let r = e.resolved(&[
        small_layer(b"x"),
        gzip(b"this is not a tar, but gzip of text"),
    ]);
    let err = e.install("b", &r, false).unwrap_err();
    assert!(err.to_string().contains("layer 2"), "{err}");
    // An unsafe layer.
    let evil = TarBuf::new()
        .raw(b"../../escape", tar::EntryType::Regular, b"", b"x")
        .finish();
    let err = e.install("c", &e.resolved(&[evil]), false).unwrap_err();
    assert!(matches!(err, ImageError::UnsafePath { .. }), "{err}");
    // A disk too small.
    let r = e.resolved(&[small_layer(b"x")]);
    let err = install_image(
        &e.images(),
        "d",
        &r,
        &e.store,
        ImageSource::Builtin,
        &InstallOptions {
            disk_size: Some(1 << 20),
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::DiskTooSmall { .. }), "{err}");
    // A /dev that is a file.
    let r = e.resolved(&[TarBuf::new().file("dev", 0o644, b"").finish()]);
    let err = e.install("e", &r, false).unwrap_err();
    assert!(err.to_string().contains("/dev is not a directory"), "{err}");
    assert!(e.entries().is_empty(), "{:?}", e.entries());
    assert!(!e.t.path().join("escape").exists());
}

#[test]
fn a_refused_install_gives_its_blobs_back() {
    let e = Env::new();
    let shared = small_layer(b"shared");
    e.install("base", &e.resolved(&[base_layer(), shared.clone()]), false)
        .unwrap();
    let kept = e.store.list();
    assert_eq!(kept.len(), 2);
    // An import sharing a layer with "base", with a layer of its own and
    // one that is refused (a path escape), as the daemon runs it: through
    // a leased store.
    let live = e.store.leased();
    let evil = TarBuf::new()
        .raw(b"../../escape", tar::EntryType::Regular, b"", b"x")
        .finish();
    let layers = [shared, small_layer(b"own"), evil];
    let r = ResolvedImage {
        layers: layers
            .iter()
            .map(|l| LayerRef {
                digest: live.put_bytes(l).unwrap(),
                media_type: media::OCI_LAYER_GZIP.into(),
                size: l.len() as u64,
            })
            .collect(),
        ..e.resolved(&[])
    };
    let err = install_image(
        &e.images(),
        "evil",
        &r,
        &live,
        ImageSource::Builtin,
        &InstallOptions::default(),
        &NoProgress,
    )
    .unwrap_err();
    assert!(matches!(err, ImageError::UnsafePath { .. }), "{err}");
    assert_eq!(e.store.list().len(), 4);
    // Still leased (a concurrent view of a failure not yet handed back):
    // nothing goes.
    assert_eq!(gc_blobs(&e.store, &e.images()).blobs, 0);
    drop(live);
    let st = gc_blobs(&e.store, &e.images());
    assert_eq!(st.blobs, 2, "its own layer and the refused one");
    assert_eq!(e.store.list(), kept, "the shared layer stays with base");
    // A blob planted with no image (what a killed daemon leaves) goes too.
    e.store.put_bytes(b"planted").unwrap();
    assert_eq!(gc_blobs(&e.store, &e.images()).blobs, 1);
    // And with "base" removed, its layers.
    remove_image(&e.images(), "base").unwrap();
    assert_eq!(gc_blobs(&e.store, &e.images()).blobs, 2);
    assert!(e.store.list().is_empty());
}

#[test]
fn names() {
    for ok in ["a", "A9", "py-3.12_slim", &"x".repeat(64), "0day"] {
        assert!(valid_image_name(ok), "{ok}");
    }
    for bad in [
        "",
        ".hidden",
        "-x",
        "_x",
        "a/b",
        "..",
        "a b",
        &"x".repeat(65),
        "é",
        "a:b",
    ] {
        assert!(!valid_image_name(bad), "{bad}");
    }
    let e = Env::new();
    let err = e.install("../x", &e.resolved(&[]), false).unwrap_err();
    assert!(matches!(err, ImageError::BadName(_)), "{err}");
    assert!(matches!(
        remove_image(&e.images(), "../x"),
        Err(ImageError::BadName(_))
    ));
}

#[test]
fn list_read_and_remove() {
    let e = Env::new();
    assert!(list_images(&e.images()).is_empty());
    e.install("b-img", &e.resolved(&[small_layer(b"b")]), false)
        .unwrap();
    let imgs = e.images();
    // A bare disk (as made by hand), a broken image.json, hidden leftovers
    // and a directory without a disk.
    fs::create_dir(imgs.join("a-bare")).unwrap();
    fs::write(imgs.join("a-bare").join(ROOTFS), vec![0u8; 8192]).unwrap();
    fs::create_dir(imgs.join("c-broken")).unwrap();
    fs::write(imgs.join("c-broken").join(ROOTFS), b"").unwrap();
    fs::write(imgs.join("c-broken").join(IMAGE_JSON), b"{not json").unwrap();
    fs::create_dir(imgs.join(".tmp-x-1-1")).unwrap();
    fs::create_dir(imgs.join(".trash-y-1-1")).unwrap();
    fs::create_dir(imgs.join("empty")).unwrap();
    let l = list_images(&imgs);
    let names: Vec<&str> = l.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["a-bare", "b-img", "c-broken"]);
    assert_eq!((l[0].size_bytes, l[0].source.clone()), (8192, None));
    assert!(l[2]
        .description
        .as_deref()
        .unwrap()
        .contains("does not parse"));
    assert!(matches!(
        read_image(&imgs, "c-broken"),
        Err(ImageError::Broken { .. })
    ));
    assert!(matches!(
        read_image(&imgs, "empty"),
        Err(ImageError::NotFound(_))
    ));
    assert!(matches!(
        read_image(&imgs, "nope"),
        Err(ImageError::NotFound(_))
    ));

    remove_image(&imgs, "b-img").unwrap();
    assert!(matches!(
        remove_image(&imgs, "b-img"),
        Err(ImageError::NotFound(_))
    ));
    clean_leftovers(&imgs);
    assert_eq!(e.entries(), ["a-bare", "c-broken", "empty"]);
}

#[test]
fn timestamps() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_795_600_000), "2026-11-25T09:46:40Z");
    assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
}

/// A `WorkingDir` the layers lack is made (root, 0755, with its parents),
/// as runc makes a container's cwd; one behind a symlink stays inside the
/// root; one that is a file is left alone.
#[test]
fn a_missing_working_dir_is_created() {
    let e = Env::new();
    let layer = gzip(
        &TarBuf::new()
            .file("bin/app", 0o755, b"app")
            .symlink("srv", "/data")
            .file("etc/file", 0o644, b"f")
            .finish(),
    );
    for (name, wd, made) in [
        ("wd-new", "/work/deep/dir", Some("/work/deep/dir")),
        ("wd-link", "/srv/app", Some("/data/app")),
        ("wd-file", "/etc/file", None),
    ] {
        let mut r = e.resolved(std::slice::from_ref(&layer));
        r.config.working_dir = Some(wd.into());
        e.install(name, &r, false).unwrap();
        let disk = e.images().join(name).join(ROOTFS);
        match made {
            Some(p) => {
                let st = debugfs(&disk, &format!("stat {p}"));
                assert!(
                    st.contains("Type: directory") && st.contains("Mode:  0755"),
                    "{st}"
                );
                assert!(st.contains("User:     0"), "{st}");
            }
            None => assert!(debugfs(&disk, "stat /etc/file").contains("Type: regular")),
        }
    }
}
