//! OCI and Docker v2 image documents: manifests, indexes (manifest lists)
//! and image configs, and the resolution of an image from the blob store.
//!
//! An image is reached from one root document, named by its digest:
//!
//! ```text
//! index / manifest list  --(platform linux/amd64)-->  manifest
//! manifest  --config-->  config blob (Env, Cmd, ..., rootfs.diff_ids)
//!           --layers-->  layer blobs, bottom first (tar, tar+gzip, tar+zstd)
//! ```
//!
//! OCI (`application/vnd.oci.image.*`) and Docker schema 2
//! (`application/vnd.docker.distribution.*`, `application/vnd.docker.image.*`,
//! `application/vnd.docker.container.image.v1+json`) documents have the same
//! JSON shape, so both parse into the `oci-spec` types; only the media types
//! differ. Docker schema 1 manifests (signed, pre-2017) are refused.
//!
//! Registry pulls and archive imports both put the documents into the
//! [`BlobStore`] first and then call [`resolve`], so both see one code path.

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use serde::Deserialize;

use crate::blobs::BlobStore;
use crate::error::ImageError;
use crate::meta::ImageConfig;
use crate::unpack::Compression;

/// Media types this module understands.
pub mod media {
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_MANIFEST_LIST: &str =
        "application/vnd.docker.distribution.manifest.list.v2+json";
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    pub const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

    /// What a registry client should accept for a manifest request.
    pub const MANIFEST_ACCEPT: &[&str] = &[
        OCI_INDEX,
        OCI_MANIFEST,
        DOCKER_MANIFEST_LIST,
        DOCKER_MANIFEST,
    ];
}

/// Manifests, indexes and configs are small; anything bigger than this is
/// refused before it is read into memory.
pub const MAX_DOCUMENT: u64 = 8 << 20;

/// How deep indexes may nest (index -> index -> manifest is legal OCI).
const MAX_NESTING: usize = 4;

/// One layer of an image, bottom first in [`ResolvedImage::layers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRef {
    /// The blob's digest (`sha256:…`); for uncompressed layers it equals
    /// the layer's diff id.
    pub digest: String,
    pub media_type: String,
    pub size: u64,
}

impl LayerRef {
    /// The compression the media type announces; [`Compression::Auto`]
    /// (detect by magic bytes) for types that do not say.
    pub fn compression(&self) -> Compression {
        compression_of(&self.media_type)
    }
}

/// An image resolved to the blobs that make it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedImage {
    /// The root document's digest (the index's for a multi-platform image,
    /// the one `docker images --digests` shows); None when the source had
    /// no manifest (a plain rootfs tarball, a legacy `docker save`).
    pub manifest_digest: Option<String>,
    pub layers: Vec<LayerRef>,
    pub config: ImageConfig,
    pub config_digest: Option<String>,
}

/// A parsed root document.
#[derive(Debug, Clone)]
pub enum Document {
    Index(Box<ImageIndex>),
    Manifest(Box<ImageManifest>),
}

/// Whether a media type names a layer blob this code can apply.
pub fn is_layer_media_type(mt: &str) -> bool {
    matches!(
        mt,
        media::OCI_LAYER
            | media::OCI_LAYER_GZIP
            | media::OCI_LAYER_ZSTD
            | media::DOCKER_LAYER
            | media::DOCKER_LAYER_GZIP
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
    )
}

/// The compression a layer media type announces.
pub fn compression_of(mt: &str) -> Compression {
    if mt.ends_with("+gzip") || mt.ends_with(".tar.gzip") {
        Compression::Gzip
    } else if mt.ends_with("+zstd") {
        Compression::Zstd
    } else if mt.ends_with(".tar") {
        Compression::None
    } else {
        Compression::Auto
    }
}

fn malformed(what: &str, reason: impl ToString) -> ImageError {
    ImageError::Malformed {
        what: what.to_string(),
        reason: reason.to_string(),
    }
}

/// Parse a manifest or an index (either family), telling which it is by
/// its `mediaType`, or by its shape when the field is absent (allowed in
/// OCI). `what` names the document in errors.
pub fn parse_document(bytes: &[u8], what: &str) -> Result<Document, ImageError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| malformed(what, e))?;
    let obj = v
        .as_object()
        .ok_or_else(|| malformed(what, "not a JSON object"))?;
    if obj.get("schemaVersion").and_then(|s| s.as_u64()) == Some(1) {
        return Err(ImageError::Unsupported {
            what: what.to_string(),
            kind: "manifest schema",
            value: "1".into(),
            hint: "Docker schema 1 images are obsolete; push the image again with a current Docker or buildah",
        });
    }
    let is_index = match obj.get("mediaType").and_then(|m| m.as_str()) {
        Some(media::OCI_INDEX | media::DOCKER_MANIFEST_LIST) => true,
        Some(media::OCI_MANIFEST | media::DOCKER_MANIFEST) => false,
        Some(other) => {
            return Err(ImageError::Unsupported {
                what: what.to_string(),
                kind: "media type",
                value: other.to_string(),
                hint: "expected an OCI or Docker v2 image manifest or index",
            })
        }
        None if obj.contains_key("manifests") => true,
        None if obj.contains_key("layers") => false,
        None => return Err(malformed(what, "neither a manifest nor an index")),
    };
    if is_index {
        serde_json::from_value(v)
            .map(|i| Document::Index(Box::new(i)))
            .map_err(|e| malformed(what, e))
    } else {
        serde_json::from_value(v)
            .map(|m| Document::Manifest(Box::new(m)))
            .map_err(|e| malformed(what, e))
    }
}

fn platform_name(d: &Descriptor) -> String {
    match d.platform() {
        Some(p) => {
            let mut s = format!("{}/{}", p.os(), p.architecture());
            if let Some(v) = p.variant() {
                s.push('/');
                s.push_str(v);
            }
            s
        }
        None => "unknown".into(),
    }
}

/// Whether an index entry is a BuildKit attestation (provenance, SBOM),
/// not an image: those carry the platform `unknown/unknown`.
fn is_attestation(d: &Descriptor) -> bool {
    d.annotations()
        .as_ref()
        .is_some_and(|a| a.contains_key("vnd.docker.reference.type"))
}

/// Pick the linux/amd64 manifest of an index: an entry without a variant
/// (or `v1`) first, then any amd64 variant. An index whose only entry has
/// no platform (as OCI layouts often write) yields that entry.
pub fn select_platform(index: &ImageIndex) -> Result<Descriptor, ImageError> {
    let amd64 = |d: &&Descriptor| {
        d.platform().as_ref().is_some_and(|p| {
            p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
        })
    };
    let candidates: Vec<&Descriptor> = index.manifests().iter().filter(amd64).collect();
    let plain = candidates.iter().find(|d| {
        d.platform()
            .as_ref()
            .and_then(|p| p.variant().as_deref())
            .is_none_or(|v| v == "v1")
    });
    if let Some(d) = plain.or(candidates.first()) {
        return Ok((*d).clone());
    }
    let images: Vec<&Descriptor> = index
        .manifests()
        .iter()
        .filter(|d| !is_attestation(d))
        .collect();
    if let [only] = images[..] {
        if only.platform().is_none() {
            return Ok(only.clone());
        }
    }
    let mut names: Vec<String> = images.iter().map(|d| platform_name(d)).collect();
    names.dedup();
    Err(ImageError::NoPlatform {
        what: "the image index".into(),
        platforms: if names.is_empty() {
            "no images".into()
        } else {
            names.join(", ")
        },
    })
}

/// The part of an image config forkvm reads: `config` (run-time defaults)
/// and the platform. Parsed leniently (only these fields), because configs
/// written by old tools lack fields `oci-spec` requires.
#[derive(Deserialize)]
struct ConfigDoc {
    #[serde(default)]
    config: Option<oci_spec::image::Config>,
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
}

fn parse_config_doc(bytes: &[u8]) -> Result<ConfigDoc, ImageError> {
    let what = "the image config";
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| malformed(what, e))?;
    if !v.is_object() {
        return Err(malformed(what, "not a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| malformed(what, e))
}

/// The run-time defaults of an OCI or Docker image config blob.
pub fn config_from_oci(bytes: &[u8]) -> Result<ImageConfig, ImageError> {
    let doc = parse_config_doc(bytes)?;
    let Some(c) = doc.config else {
        return Ok(ImageConfig::default());
    };
    let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    // `8080` means `8080/tcp` (OCI image spec); buildah writes the former.
    let mut exposed_ports: Vec<String> = c
        .exposed_ports()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            if p.contains('/') {
                p
            } else {
                format!("{p}/tcp")
            }
        })
        .collect();
    exposed_ports.sort();
    exposed_ports.dedup();
    Ok(ImageConfig {
        env: c.env().clone().unwrap_or_default(),
        working_dir: non_empty(c.working_dir()),
        user: non_empty(c.user()),
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
        exposed_ports,
        labels: c.labels().clone().unwrap_or_default().into_iter().collect(),
    })
}

/// Refuse a config built for another platform (a single-platform image
/// has no index to choose from, so this is the only check it gets).
pub fn check_config_platform(bytes: &[u8]) -> Result<(), ImageError> {
    let doc = parse_config_doc(bytes)?;
    let os = doc.os.unwrap_or_default();
    let arch = doc.architecture.unwrap_or_default();
    let ok_os = os.is_empty() || os == "linux";
    let ok_arch = arch.is_empty() || arch == "amd64";
    if ok_os && ok_arch {
        return Ok(());
    }
    Err(ImageError::NoPlatform {
        what: "the image config".into(),
        platforms: format!("{os}/{arch}"),
    })
}

fn read_document(store: &BlobStore, digest: &str, what: &str) -> Result<Vec<u8>, ImageError> {
    if !store.has(digest) {
        return Err(ImageError::MissingBlob {
            what: what.to_string(),
            digest: digest.to_string(),
        });
    }
    let len = std::fs::metadata(store.path(digest)?)
        .map(|m| m.len())
        .unwrap_or(0);
    if len > MAX_DOCUMENT {
        return Err(malformed(
            what,
            format!("{digest} is {len} bytes, more than a manifest or config can be"),
        ));
    }
    Ok(store.read(digest)?)
}

/// The layers of a manifest, checked to be layer media types.
pub fn layer_refs(manifest: &ImageManifest) -> Result<Vec<LayerRef>, ImageError> {
    manifest
        .layers()
        .iter()
        .map(|d| {
            let mt = d.media_type().to_string();
            if !is_layer_media_type(&mt) {
                return Err(ImageError::Unsupported {
                    what: format!("layer {}", d.digest()),
                    kind: "layer media type",
                    value: mt,
                    hint: "only tar, tar+gzip and tar+zstd filesystem layers can be applied (is this an artifact rather than a container image?)",
                });
            }
            Ok(LayerRef {
                digest: d.digest().to_string(),
                media_type: mt,
                size: d.size(),
            })
        })
        .collect()
}

/// Resolve an image from its root document (a manifest or an index) in the
/// store: picks linux/amd64 through indexes, reads and checks the config.
/// Manifests and the config must be in the store; layers need not be yet.
pub fn resolve(store: &BlobStore, root_digest: &str) -> Result<ResolvedImage, ImageError> {
    let mut digest = root_digest.to_string();
    for _ in 0..MAX_NESTING {
        let what = format!("manifest {digest}");
        let bytes = read_document(store, &digest, &what)?;
        match parse_document(&bytes, &what)? {
            Document::Index(ix) => digest = select_platform(&ix)?.digest().to_string(),
            Document::Manifest(m) => {
                let mut r = resolve_manifest(store, &m)?;
                r.manifest_digest = Some(root_digest.to_string());
                return Ok(r);
            }
        }
    }
    Err(malformed(
        &format!("image {root_digest}"),
        "indexes nest too deeply",
    ))
}

/// Resolve a parsed manifest (its config must be in the store).
pub fn resolve_manifest(
    store: &BlobStore,
    manifest: &ImageManifest,
) -> Result<ResolvedImage, ImageError> {
    let cd = manifest.config();
    let cmt = cd.media_type().to_string();
    if cmt != media::OCI_CONFIG && cmt != media::DOCKER_CONFIG {
        return Err(ImageError::Unsupported {
            what: "the manifest".into(),
            kind: "config media type",
            value: cmt,
            hint: "this is not a container image (perhaps a Helm chart or another OCI artifact)",
        });
    }
    let config_digest = cd.digest().to_string();
    let bytes = read_document(store, &config_digest, "the image config")?;
    check_config_platform(&bytes)?;
    Ok(ResolvedImage {
        manifest_digest: None,
        layers: layer_refs(manifest)?,
        config: config_from_oci(&bytes)?,
        config_digest: Some(config_digest),
    })
}

#[cfg(test)]
#[path = "oci_tests.rs"]
mod tests;
