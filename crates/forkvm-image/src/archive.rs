//! Importing an image from a file or directory: a `docker save` tarball,
//! an OCI image layout (a directory, or a tar of one) or a plain root
//! filesystem tarball. The blobs go into the [`BlobStore`], each verified
//! against its digest; the result is a [`ResolvedImage`] ready to install.
//!
//! The formats, told apart by the names in them:
//!
//! ```text
//! OCI image layout        oci-layout            {"imageLayoutVersion": "1.0.0"}
//!   (skopeo, umoci,       index.json            an index: one entry per tag
//!    buildah, docker 25+) blobs/sha256/<hex>    manifests, configs, layers
//!
//! docker save             manifest.json         [{"Config": "<hex>.json",
//!   (legacy, skopeo                               "RepoTags": ["name:tag"],
//!    docker-archive)                              "Layers": ["<id>/layer.tar"]}]
//!                         <hex>.json            the image config
//!                         <id>/layer.tar        an uncompressed layer (or a
//!                                               symlink to a repeated one)
//!
//! rootfs tarball          any other tar         one layer, no config
//! ```
//!
//! A tar holding what is left of an image format (a `docker save` without
//! `manifest.json`, an OCI layout without `index.json`, an image packed
//! inside a directory) is refused with the format named, never installed
//! as a root filesystem; so is a file that is no tar (xz, zip, qcow2,
//! ext4, … named by their magic bytes).
//!
//! Docker 25+ writes both an OCI layout and `manifest.json` (with paths
//! `blobs/sha256/<hex>`); the layout is read first (it has a manifest
//! digest), `manifest.json` if the layout is incomplete.
//!
//! Digests: an OCI blob must hash to its name. A `docker save` layer is an
//! uncompressed tar, so its blob digest is its diff id: it must hash to the
//! config's `rootfs.diff_ids` entry (or to its `blobs/sha256/<hex>` name).
//! A legacy config's name is its digest. A rootfs tarball is hashed first
//! and then copied, so a file changed in between fails verification. A
//! blob that fails leaves nothing in the store.
//!
//! Which image, when a source has several: the one named by `reference`
//! (a tag or name matched against `RepoTags` and the OCI ref-name
//! annotations), or the only one; several without a reference are an
//! error listing them. Within one name, the linux/amd64 platform.

use std::fs::File;
use std::path::Path;

use oci_spec::image::{Descriptor, ImageIndex};
use serde::Deserialize;

use crate::blobs::{digest_hex, sha256_digest, BlobError, BlobStore};
use crate::error::{blob_err, io_err, ImageError};
use crate::meta::ImageConfig;
use crate::oci::{
    self, check_config_platform, config_from_oci, layer_refs, media, parse_document,
    select_platform, Document, LayerRef, ResolvedImage,
};
use crate::progress::{Progress, ProgressEvent};
use crate::source::{Counting, Source, Wanted};
use crate::unpack::Compression;

/// The kinds of import source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveFormat {
    /// `docker save` output (`manifest.json`).
    DockerArchive,
    /// An OCI image layout directory.
    OciLayout,
    /// A tar of an OCI image layout.
    OciArchive,
    /// A root filesystem tarball (plain, gzip or zstd).
    RootfsTar,
}

impl ArchiveFormat {
    /// The name recorded in [`crate::meta::ImageSource::Import`].
    pub fn as_str(self) -> &'static str {
        match self {
            ArchiveFormat::DockerArchive => "docker-archive",
            ArchiveFormat::OciLayout => "oci-layout",
            ArchiveFormat::OciArchive => "oci-archive",
            ArchiveFormat::RootfsTar => "rootfs-tar",
        }
    }
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";

fn detect(src: &Source) -> Result<ArchiveFormat, ImageError> {
    if src.has("oci-layout") && src.has("index.json") {
        return Ok(if src.is_tar() {
            ArchiveFormat::OciArchive
        } else {
            ArchiveFormat::OciLayout
        });
    }
    if src.has("manifest.json") {
        return Ok(ArchiveFormat::DockerArchive);
    }
    if !src.is_tar() {
        return Err(ImageError::UnknownFormat {
            path: src.path().to_path_buf(),
            reason: "it is a directory without oci-layout and index.json (to import a root filesystem directory, tar it: tar -C DIR -czf rootfs.tar.gz .)".into(),
        });
    }
    if let Some(what) = image_remains(src) {
        return Err(ImageError::UnknownFormat {
            path: src.path().to_path_buf(),
            reason: what,
        });
    }
    Ok(ArchiveFormat::RootfsTar)
}

/// What a tar that is neither an OCI layout nor a `docker save` archive
/// holds of one (so it is refused instead of installed as a root
/// filesystem of image files): the format detected and what to do.
fn image_remains(src: &Source) -> Option<String> {
    let names = src.names();
    let has = |n: &str| names.contains(&n);
    // `<64 hex>.json` configs and `<64 hex>.tar` layers (skopeo, docker).
    let by_digest = |n: &&str| {
        n.strip_suffix(".json")
            .or_else(|| n.strip_suffix(".tar"))
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if has("repositories")
        || names.iter().any(|n| n.ends_with("/layer.tar"))
        || names.iter().any(by_digest)
    {
        return Some(
            "it is a `docker save` archive without its manifest.json (it has `repositories`, \
             <id>/layer.tar or <digest>.json/.tar entries, but forkvm needs manifest.json, which \
             Docker writes since 1.10, to know the layers' order); save it again with \
             `docker save` or `skopeo copy … docker-archive:FILE`"
                .into(),
        );
    }
    if has("oci-layout") || has("index.json") {
        let lacks = if has("oci-layout") {
            "index.json"
        } else {
            "oci-layout"
        };
        return Some(format!(
            "it is an incomplete OCI image layout (it lacks {lacks}); export the image again"
        ));
    }
    if names.iter().any(|n| n.starts_with("blobs/sha256/")) {
        return Some(
            "it holds OCI blobs (blobs/sha256/…) but no oci-layout, index.json or manifest.json; \
             export the image again"
                .into(),
        );
    }
    // An image packed with its directory (`tar -cf x.tar layout/`): one
    // top-level directory holding the markers. (A root filesystem has
    // several, and may well have an `app/manifest.json`.)
    let tops: std::collections::BTreeSet<&str> = names
        .iter()
        .map(|n| n.split('/').next().unwrap_or(""))
        .collect();
    if tops.len() > 1 {
        return None;
    }
    for marker in ["oci-layout", "manifest.json"] {
        if let Some(n) = names
            .iter()
            .find(|n| n.split_once('/').is_some_and(|(_, b)| b == marker))
        {
            let dir = n.split('/').next().unwrap_or_default();
            return Some(format!(
                "it holds an image inside the directory {dir}/ ({n}); pack the directory's \
                 contents instead (tar -C {dir} -cf image.tar .) or import the directory itself"
            ));
        }
    }
    None
}

/// What kind of source `path` is (lists a tar once).
pub fn detect_format(path: &Path) -> Result<ArchiveFormat, ImageError> {
    detect(&Source::open(path)?)
}

/// Import the only image of a source (see the module doc).
pub fn import_source(
    path: &Path,
    store: &BlobStore,
    progress: &dyn Progress,
) -> Result<ResolvedImage, ImageError> {
    import_source_ref(path, None, store, progress).map(|(r, _)| r)
}

/// Import the image named `reference` (or the only one) of a source, and
/// say which format it was read as.
pub fn import_source_ref(
    path: &Path,
    reference: Option<&str>,
    store: &BlobStore,
    progress: &dyn Progress,
) -> Result<(ResolvedImage, ArchiveFormat), ImageError> {
    progress.event(ProgressEvent::Phase {
        phase: "reading".into(),
    });
    let src = Source::open(path)?;
    let format = detect(&src)?;
    match format {
        ArchiveFormat::OciLayout | ArchiveFormat::OciArchive => {
            match import_oci(&src, reference, store, progress) {
                Err(ImageError::MissingBlob { what, digest }) if src.has("manifest.json") => {
                    progress.event(ProgressEvent::Log {
                        line: format!(
                            "the OCI layout is incomplete ({what} lacks {digest}); reading manifest.json"
                        ),
                    });
                    import_docker(&src, reference, store, progress)
                        .map(|r| (r, ArchiveFormat::DockerArchive))
                }
                r => r.map(|r| (r, format)),
            }
        }
        ArchiveFormat::DockerArchive => {
            import_docker(&src, reference, store, progress).map(|r| (r, format))
        }
        ArchiveFormat::RootfsTar => import_rootfs(&src, store, progress).map(|r| (r, format)),
    }
}

fn blob_name(digest: &str) -> Result<String, ImageError> {
    Ok(format!("blobs/sha256/{}", digest_hex(digest)?))
}

/// Whether a name (`<ref>` or `<repo>:<ref>`) matches a reference.
fn name_matches(name: &str, reference: &str) -> bool {
    name == reference
        || name.ends_with(&format!("/{reference}"))
        || name.ends_with(&format!(":{reference}"))
}

fn oci_names(d: &Descriptor) -> Vec<String> {
    let a = d.annotations().clone().unwrap_or_default();
    [CONTAINERD_NAME, REF_NAME]
        .iter()
        .filter_map(|k| a.get(*k).cloned())
        .collect()
}

/// The entry of a layout's index.json to import.
fn pick_oci_entry(
    src: &Source,
    ix: &ImageIndex,
    reference: Option<&str>,
) -> Result<Descriptor, ImageError> {
    let entries: Vec<Descriptor> = ix
        .manifests()
        .iter()
        .filter(|d| {
            !d.annotations()
                .as_ref()
                .is_some_and(|a| a.contains_key("vnd.docker.reference.type"))
        })
        .cloned()
        .collect();
    let label = |d: &Descriptor| {
        let a = d.annotations().clone().unwrap_or_default();
        a.get(CONTAINERD_NAME)
            .or(a.get(REF_NAME))
            .cloned()
            .unwrap_or_else(|| "<untagged>".into())
    };
    let labels_of = |ds: &[Descriptor]| {
        let mut l: Vec<String> = ds.iter().map(label).collect();
        l.sort();
        l.dedup();
        l
    };
    let labels = labels_of(&entries);
    let what = format!("{} (index.json)", src.path().display());
    let chosen: Vec<Descriptor> = match reference {
        Some(r) => {
            let c: Vec<Descriptor> = entries
                .iter()
                .filter(|d| oci_names(d).iter().any(|n| name_matches(n, r)))
                .cloned()
                .collect();
            if c.is_empty() {
                return Err(ImageError::NoSuchImage {
                    what,
                    reference: r.into(),
                    names: labels.join(", "),
                });
            }
            c
        }
        None => entries,
    };
    // Several names left (no reference, or one matching several): ask.
    let chosen_labels = labels_of(&chosen);
    if chosen_labels.len() > 1 {
        return Err(ImageError::Ambiguous {
            what,
            names: chosen_labels.join(", "),
        });
    }
    if let [only] = &chosen[..] {
        return Ok(only.clone());
    }
    let mut sub = ix.clone();
    sub.set_manifests(chosen);
    select_platform(&sub)
}

/// Copy a document blob (a manifest, index or config) into the store.
fn copy_doc(
    src: &Source,
    store: &BlobStore,
    digest: &str,
    progress: &dyn Progress,
) -> Result<Vec<u8>, ImageError> {
    let name = blob_name(digest)?;
    src.copy(
        &[Wanted {
            name,
            digest: digest.to_string(),
            size: None,
        }],
        store,
        progress,
    )?;
    Ok(store.read(digest)?)
}

fn import_oci(
    src: &Source,
    reference: Option<&str>,
    store: &BlobStore,
    progress: &dyn Progress,
) -> Result<ResolvedImage, ImageError> {
    let layout: serde_json::Value = serde_json::from_slice(&src.read_small("oci-layout")?)
        .map_err(|e| ImageError::Malformed {
            what: format!("oci-layout in {}", src.path().display()),
            reason: e.to_string(),
        })?;
    if layout
        .get("imageLayoutVersion")
        .and_then(|v| v.as_str())
        .is_none()
    {
        return Err(ImageError::Malformed {
            what: format!("oci-layout in {}", src.path().display()),
            reason: "no imageLayoutVersion".into(),
        });
    }
    let what = format!("index.json in {}", src.path().display());
    let Document::Index(ix) = parse_document(&src.read_small("index.json")?, &what)? else {
        return Err(ImageError::Malformed {
            what,
            reason: "it is a manifest, not an index".into(),
        });
    };
    let root = pick_oci_entry(src, &ix, reference)?;
    let root_digest = root.digest().to_string();
    let mut digest = root_digest.clone();
    for _ in 0..4 {
        let bytes = copy_doc(src, store, &digest, progress)?;
        match parse_document(&bytes, &format!("manifest {digest}"))? {
            Document::Index(i) => digest = select_platform(&i)?.digest().to_string(),
            Document::Manifest(m) => {
                copy_doc(src, store, m.config().digest().as_ref(), progress)?;
                let wanted = layer_refs(&m)?
                    .into_iter()
                    .map(|l| {
                        Ok(Wanted {
                            name: blob_name(&l.digest)?,
                            digest: l.digest,
                            size: Some(l.size),
                        })
                    })
                    .collect::<Result<Vec<_>, ImageError>>()?;
                progress.event(ProgressEvent::Phase {
                    phase: "copying".into(),
                });
                src.copy(&wanted, store, progress)?;
                return oci::resolve(store, &root_digest);
            }
        }
    }
    Err(ImageError::Malformed {
        what,
        reason: "indexes nest too deeply".into(),
    })
}

/// One image of a `docker save` manifest.json.
#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct DiffIds {
    rootfs: Option<RootFsIds>,
}

#[derive(Deserialize)]
struct RootFsIds {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// The digest a file name states: `blobs/sha256/<hex>`, or a legacy
/// config's `<hex>.json`.
fn named_digest(name: &str) -> Option<String> {
    let stem = name
        .strip_prefix("blobs/sha256/")
        .or_else(|| name.strip_suffix(".json").filter(|s| !s.contains('/')))?;
    let d = format!("sha256:{stem}");
    if digest_hex(&d).is_ok() {
        Some(d)
    } else {
        None
    }
}

fn import_docker(
    src: &Source,
    reference: Option<&str>,
    store: &BlobStore,
    progress: &dyn Progress,
) -> Result<ResolvedImage, ImageError> {
    let what = format!("manifest.json in {}", src.path().display());
    let malformed = |reason: String| ImageError::Malformed {
        what: what.clone(),
        reason,
    };
    let entries: Vec<DockerEntry> = serde_json::from_slice(&src.read_small("manifest.json")?)
        .map_err(|e| malformed(e.to_string()))?;
    let tags = |e: &DockerEntry| e.repo_tags.clone().unwrap_or_default();
    let mut names: Vec<String> = entries
        .iter()
        .map(|e| {
            let t = tags(e);
            if t.is_empty() {
                "<untagged>".into()
            } else {
                t.join(" ")
            }
        })
        .collect();
    names.sort();
    let entry = match reference {
        Some(r) => entries
            .iter()
            .find(|e| tags(e).iter().any(|t| name_matches(t, r)))
            .ok_or_else(|| ImageError::NoSuchImage {
                what: what.clone(),
                reference: r.into(),
                names: names.join(", "),
            })?,
        None => match &entries[..] {
            [only] => only,
            [] => return Err(malformed("it lists no image".into())),
            _ => {
                return Err(ImageError::Ambiguous {
                    what: what.clone(),
                    names: names.join(", "),
                })
            }
        },
    };

    let cfg = src.read_small(&entry.config)?;
    let config_digest = sha256_digest(&cfg);
    let cwhat = format!("{} in {}", entry.config, src.path().display());
    if let Some(named) = named_digest(&entry.config) {
        if named != config_digest {
            return Err(blob_err(cwhat)(BlobError::Mismatch {
                expected: named,
                actual: config_digest,
            }));
        }
    }
    check_config_platform(&cfg)?;
    let diff_ids = serde_json::from_slice::<DiffIds>(&cfg)
        .ok()
        .and_then(|d| d.rootfs)
        .map(|r| r.diff_ids)
        .unwrap_or_default();
    if diff_ids.len() != entry.layers.len() {
        return Err(malformed(format!(
            "it lists {} layers but the config has {} diff ids",
            entry.layers.len(),
            diff_ids.len()
        )));
    }
    store
        .put(&config_digest, Some(cfg.len() as u64), &cfg[..])
        .map_err(blob_err(cwhat))?;

    let mut layers = Vec::new();
    let mut wanted = Vec::new();
    for (name, diff_id) in entry.layers.iter().zip(&diff_ids) {
        let digest = named_digest(name).unwrap_or_else(|| diff_id.clone());
        digest_hex(&digest)?;
        let size = src.size_of(name);
        layers.push(LayerRef {
            digest: digest.clone(),
            media_type: media::DOCKER_LAYER.into(),
            size: size.unwrap_or(0),
        });
        wanted.push(Wanted {
            name: name.clone(),
            digest,
            size,
        });
    }
    progress.event(ProgressEvent::Phase {
        phase: "copying".into(),
    });
    src.copy(&wanted, store, progress)?;
    Ok(ResolvedImage {
        manifest_digest: None,
        layers,
        config: config_from_oci(&cfg)?,
        config_digest: Some(config_digest),
    })
}

fn import_rootfs(
    src: &Source,
    store: &BlobStore,
    progress: &dyn Progress,
) -> Result<ResolvedImage, ImageError> {
    let Source::Tar {
        path, compression, ..
    } = src
    else {
        return Err(ImageError::UnknownFormat {
            path: src.path().to_path_buf(),
            reason: "not a tar".into(),
        });
    };
    progress.event(ProgressEvent::Phase {
        phase: "hashing".into(),
    });
    let (digest, size) = src.digest_file(progress)?;
    progress.event(ProgressEvent::Phase {
        phase: "copying".into(),
    });
    let f = File::open(path).map_err(io_err(format!("opening {}", path.display())))?;
    store
        .put(
            &digest,
            Some(size),
            Counting::new(f, digest.clone(), Some(size), progress),
        )
        .map_err(blob_err(format!(
            "{} (did it change while being imported?)",
            path.display()
        )))?;
    let media_type = match compression {
        Compression::Gzip => media::OCI_LAYER_GZIP,
        Compression::Zstd => media::OCI_LAYER_ZSTD,
        Compression::None | Compression::Auto => media::OCI_LAYER,
    };
    Ok(ResolvedImage {
        manifest_digest: None,
        layers: vec![LayerRef {
            digest,
            media_type: media_type.into(),
            size,
        }],
        config: ImageConfig::default(),
        config_digest: None,
    })
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
