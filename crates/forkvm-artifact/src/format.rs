//! The artifact's documents: the index, the manifests, and the two config
//! kinds, as forkvm writes and reads them (the layout is in the crate doc).
//!
//! * Manifests and configs are serialised from structs with a fixed field
//!   order, so the same snapshot always gives the same bytes and so the same
//!   digests: that is what lets a second push find a link already there.
//! * Reading is strict where a wrong value could do harm: media types and
//!   artifact types must be forkvm's, the config schema must be one this
//!   build knows ([`SCHEMA`]; a newer one asks the user to upgrade), and
//!   every file's chunk list must be in order, inside the file and no chunk
//!   longer than [`crate::chunk::MAX_CHUNK`] ([`FileEntry::check`]).
//! * Unknown fields are ignored, so later versions may add optional ones
//!   without a schema bump.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::chunk::MAX_CHUNK;
use crate::compat::Requires;

pub const MT_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MT_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The index's artifact type: a forkvm snapshot with its chain.
pub const ARTIFACT_SNAPSHOT: &str = "application/vnd.forkvm.snapshot.v1";
/// A chain link's manifest.
pub const ARTIFACT_LINK: &str = "application/vnd.forkvm.snapshot.link.v1";
/// The base image's manifest.
pub const ARTIFACT_IMAGE: &str = "application/vnd.forkvm.image.v1";
pub const MT_LINK_CONFIG: &str = "application/vnd.forkvm.snapshot.link.config.v1+json";
pub const MT_IMAGE_CONFIG: &str = "application/vnd.forkvm.image.config.v1+json";
/// A zstd-compressed chunk of a file.
pub const MT_CHUNK: &str = "application/vnd.forkvm.chunk.v1.zstd";
/// Index annotation: `image` or `link`.
pub const ANN_ROLE: &str = "dev.forkvm.role";
/// Index and manifest annotation: the snapshot id (links) or image name.
pub const ANN_NAME: &str = "dev.forkvm.name";
/// The config schema this build writes and reads.
pub const SCHEMA: u32 = 1;
/// Links in one index at most (forkvm chains are far shorter).
pub const MAX_LINKS: usize = 256;

/// A malformed or foreign document.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("{what} is not valid JSON of its kind: {why}")]
    Json { what: String, why: String },
    #[error("{what} is not a forkvm snapshot artifact: {why}")]
    Foreign { what: String, why: String },
    #[error(
        "{what} uses artifact schema {got}; this forkvm reads schema {SCHEMA}: upgrade forkvm"
    )]
    Schema { what: String, got: u32 },
    #[error("{what}: {why}")]
    Invalid { what: String, why: String },
}

/// A blob reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "artifactType"
    )]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image manifest (the OCI kind, used for artifacts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: String,
    #[serde(rename = "artifactType", default)]
    pub artifact_type: String,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The index a tag names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType")]
    pub media_type: String,
    #[serde(rename = "artifactType", default)]
    pub artifact_type: String,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// One chunk of a file: `length` bytes at `offset`, stored as the blob
/// `digest` of `size` compressed bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub offset: u64,
    pub length: u64,
    pub digest: String,
    pub size: u64,
}

/// A file of a link or image: its size, its SHA-256 (hex, of the whole
/// file, holes read as zeros) and its non-zero chunks in ascending order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
    pub sha256: String,
    pub chunks: Vec<Chunk>,
}

/// What a link's disk layer (`disk.qcow2`) backs onto. A host that pulls
/// it rewrites the qcow2 header to its own path of that file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskBacking {
    /// The disk layer of the chain's snapshot with this id.
    Snapshot(String),
    /// The base image of the index (its root disk, raw).
    Image,
}

/// The parent of a link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    pub id: String,
    /// The parent link's manifest digest.
    pub manifest: String,
}

/// The config of a chain link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkConfig {
    pub schema: u32,
    /// The snapshot id (kept on every host, so a chain pulled twice, or
    /// pulled back, is recognised).
    pub id: String,
    /// `shared`, `diff`, `stream` or `live`.
    pub kind: String,
    pub parent: Option<ParentLink>,
    /// The source host's `manifest.fvs`, base64: checksummed, and the
    /// SHA-256 of every file as that host sealed it.
    pub manifest_fvs: String,
    pub disk_backing: DiskBacking,
    pub requires: Requires,
    pub files: Vec<FileEntry>,
}

/// The config of the base image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub schema: u32,
    /// Its name on the pushing host.
    pub name: String,
    /// Its `image.json` there (how commands run in it).
    pub image_json: serde_json::Value,
    /// `rootfs.ext4`.
    pub files: Vec<FileEntry>,
}

impl FileEntry {
    /// The chunk list is usable: ascending, non-overlapping, inside the
    /// file, each at most [`MAX_CHUNK`] long and named by a sha256 digest.
    pub fn check(&self, what: &str) -> Result<(), FormatError> {
        let bad = |why: String| FormatError::Invalid {
            what: format!("{what}, file {:?}", self.name),
            why,
        };
        if self.name.is_empty()
            || self.name.contains('/')
            || self.name.starts_with('.')
            || self.name.len() > 64
        {
            return Err(bad("not a plain file name".into()));
        }
        if !is_hex64(&self.sha256) {
            return Err(bad(format!("bad sha256 {:?}", self.sha256)));
        }
        let mut end = 0u64;
        for c in &self.chunks {
            if c.offset < end {
                return Err(bad(format!(
                    "chunk at {} overlaps the one before",
                    c.offset
                )));
            }
            if c.length == 0 || c.length > MAX_CHUNK {
                return Err(bad(format!(
                    "chunk at {} has length {}",
                    c.offset, c.length
                )));
            }
            end = c
                .offset
                .checked_add(c.length)
                .filter(|e| *e <= self.size)
                .ok_or_else(|| bad(format!("chunk at {} ends past the file", c.offset)))?;
            if !c.digest.strip_prefix("sha256:").is_some_and(is_hex64) {
                return Err(bad(format!("bad chunk digest {:?}", c.digest)));
            }
            // zstd never grows data by more than a small frame overhead.
            if c.size > c.length + 4096 {
                return Err(bad(format!(
                    "chunk at {} claims {} bytes",
                    c.offset, c.size
                )));
            }
        }
        Ok(())
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The distinct chunk blobs of `files`, in order of first use.
pub fn layers(files: &[FileEntry]) -> Vec<Descriptor> {
    let mut seen = std::collections::HashSet::new();
    let mut v = Vec::new();
    for c in files.iter().flat_map(|f| &f.chunks) {
        if seen.insert(c.digest.clone()) {
            v.push(blob(MT_CHUNK, &c.digest, c.size));
        }
    }
    v
}

/// A plain descriptor.
pub fn blob(media_type: &str, digest: &str, size: u64) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: digest.into(),
        size,
        artifact_type: None,
        annotations: BTreeMap::new(),
    }
}

/// The manifest of a link or image whose config is `config` (bytes
/// already serialised) and whose chunk blobs are `layers`.
pub fn manifest(
    artifact_type: &str,
    config_type: &str,
    config: &[u8],
    layers: Vec<Descriptor>,
    name: &str,
) -> Manifest {
    Manifest {
        schema_version: 2,
        media_type: MT_MANIFEST.into(),
        artifact_type: artifact_type.into(),
        config: blob(config_type, &sha256_digest(config), config.len() as u64),
        layers,
        annotations: BTreeMap::from([(ANN_NAME.to_string(), name.to_string())]),
    }
}

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(b: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{:x}", sha2::Sha256::digest(b))
}

fn json_err(what: &str) -> impl Fn(serde_json::Error) -> FormatError + '_ {
    move |e| FormatError::Json {
        what: what.to_string(),
        why: e.to_string(),
    }
}

/// Serialise a document (the bytes that are pushed and digested).
pub fn to_bytes<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// Read a snapshot index.
pub fn parse_index(b: &[u8], what: &str) -> Result<Index, FormatError> {
    let i: Index = serde_json::from_slice(b).map_err(json_err(what))?;
    let foreign = |why: String| FormatError::Foreign {
        what: what.to_string(),
        why,
    };
    if i.media_type != MT_INDEX || i.artifact_type != ARTIFACT_SNAPSHOT {
        return Err(foreign(format!(
            "its media type is {:?} with artifact type {:?} (a container image? pull it with \
             `forkvm image pull`)",
            i.media_type, i.artifact_type
        )));
    }
    if i.manifests.is_empty() || i.manifests.len() > MAX_LINKS + 1 {
        return Err(foreign(format!("it lists {} manifests", i.manifests.len())));
    }
    let mut links = 0;
    for (n, d) in i.manifests.iter().enumerate() {
        let role = d.annotations.get(ANN_ROLE).map(String::as_str);
        match role {
            Some("image") if n == 0 => {}
            Some("link") => links += 1,
            _ => return Err(foreign(format!("entry {n} has role {role:?}"))),
        }
        if d.media_type != MT_MANIFEST || !d.digest.strip_prefix("sha256:").is_some_and(is_hex64) {
            return Err(foreign(format!("entry {n} is not a sha256 image manifest")));
        }
    }
    if links == 0 {
        return Err(foreign("it has no chain link".into()));
    }
    Ok(i)
}

/// Read a link or image manifest of the expected artifact type.
pub fn parse_manifest(b: &[u8], artifact: &str, what: &str) -> Result<Manifest, FormatError> {
    let m: Manifest = serde_json::from_slice(b).map_err(json_err(what))?;
    let want_config = if artifact == ARTIFACT_IMAGE {
        MT_IMAGE_CONFIG
    } else {
        MT_LINK_CONFIG
    };
    if m.media_type != MT_MANIFEST
        || m.artifact_type != artifact
        || m.config.media_type != want_config
    {
        return Err(FormatError::Foreign {
            what: what.to_string(),
            why: format!(
                "artifact type {:?}, config {:?}; expected {artifact}",
                m.artifact_type, m.config.media_type
            ),
        });
    }
    if m.config.size > 16 << 20 {
        return Err(FormatError::Invalid {
            what: what.into(),
            why: format!("its config is {} bytes", m.config.size),
        });
    }
    Ok(m)
}

/// Read a link config, and check that its files' chunks are all listed as
/// layers of its manifest `m`.
pub fn parse_link(b: &[u8], m: &Manifest, what: &str) -> Result<LinkConfig, FormatError> {
    let schema = peek_schema(b, what)?;
    let c: LinkConfig = serde_json::from_slice(b).map_err(json_err(what))?;
    let _ = schema;
    check_files(&c.files, m, what)?;
    Ok(c)
}

/// Read an image config (see [`parse_link`]).
pub fn parse_image(b: &[u8], m: &Manifest, what: &str) -> Result<ImageConfig, FormatError> {
    peek_schema(b, what)?;
    let c: ImageConfig = serde_json::from_slice(b).map_err(json_err(what))?;
    if c.files.len() != 1 || c.files[0].name != "rootfs.ext4" {
        return Err(FormatError::Invalid {
            what: what.into(),
            why: "an image holds exactly rootfs.ext4".into(),
        });
    }
    check_files(&c.files, m, what)?;
    Ok(c)
}

/// The schema is checked before the rest, so a newer config with fields this
/// build cannot parse still says "upgrade" rather than "malformed".
fn peek_schema(b: &[u8], what: &str) -> Result<u32, FormatError> {
    #[derive(Deserialize)]
    struct Peek {
        schema: u32,
    }
    let p: Peek = serde_json::from_slice(b).map_err(json_err(what))?;
    if p.schema != SCHEMA {
        return Err(FormatError::Schema {
            what: what.into(),
            got: p.schema,
        });
    }
    Ok(p.schema)
}

fn check_files(files: &[FileEntry], m: &Manifest, what: &str) -> Result<(), FormatError> {
    let listed: std::collections::HashMap<&str, u64> = m
        .layers
        .iter()
        .map(|d| (d.digest.as_str(), d.size))
        .collect();
    let mut names = std::collections::HashSet::new();
    for f in files {
        f.check(what)?;
        if !names.insert(f.name.as_str()) {
            return Err(FormatError::Invalid {
                what: what.into(),
                why: format!("file {:?} is listed twice", f.name),
            });
        }
        for c in &f.chunks {
            if listed.get(c.digest.as_str()) != Some(&c.size) {
                return Err(FormatError::Invalid {
                    what: what.into(),
                    why: format!("chunk {} is not a layer of its manifest", c.digest),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
