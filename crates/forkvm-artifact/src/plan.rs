//! The documents of one snapshot's artifact, built once from its parts:
//! the image's and every link's manifest and config, the index, and where
//! each chunk blob's bytes are on this host.
//!
//! Both ways a snapshot leaves a host use it: [`crate::push`] sends a
//! [`Plan`] to a registry, and a daemon serving its own snapshots over the
//! OCI distribution API answers from one. So a node serves byte for byte
//! what a push of the same snapshot would have put into a registry: the
//! same index, manifests, configs and chunk blobs, under the same digests.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::chunk::{read_chunk, ChunkError};
use crate::format::{self, Chunk, Descriptor, ImageConfig, LinkConfig, ParentLink};

/// The image to push: its config and where its root disk is.
pub struct ImagePart {
    pub config: ImageConfig,
    pub rootfs: PathBuf,
}

/// A chain link to push: its config (the parent's manifest digest is filled
/// in by [`plan`]) and where each of its files is.
pub struct LinkPart {
    pub config: LinkConfig,
    pub paths: BTreeMap<String, PathBuf>,
}

/// One manifest of the artifact (the image or a link), with its config.
pub struct Doc {
    /// The image name or the snapshot id.
    pub name: String,
    /// `image` or `link`.
    pub role: &'static str,
    /// The manifest's bytes, and their digest.
    pub manifest: Vec<u8>,
    pub digest: String,
    /// The config's bytes, and its descriptor in the manifest.
    pub config: Vec<u8>,
    pub config_desc: Descriptor,
    /// The chunk blobs, in the manifest's order.
    pub layers: Vec<Descriptor>,
    /// Where each chunk blob's bytes come from: a file and its chunk.
    pub sources: HashMap<String, (PathBuf, Chunk)>,
}

/// Every document of a snapshot's artifact: the image first, then the
/// links base first (the snapshot itself last), and the index naming them.
pub struct Plan {
    pub docs: Vec<Doc>,
    pub index: Vec<u8>,
    pub index_digest: String,
}

/// A blob of a [`Plan`].
pub enum Blob<'a> {
    /// A config, held in memory.
    Config(&'a [u8]),
    /// A chunk: read and compressed from the file when asked for
    /// ([`Plan::read_chunk`]).
    Chunk { path: &'a PathBuf, chunk: &'a Chunk },
}

impl Blob<'_> {
    /// Its size in bytes (a chunk's compressed size).
    pub fn size(&self) -> u64 {
        match self {
            Blob::Config(b) => b.len() as u64,
            Blob::Chunk { chunk, .. } => chunk.size,
        }
    }
}

fn doc(
    name: &str,
    role: &'static str,
    artifact: &str,
    config_type: &str,
    config: Vec<u8>,
    files: &[format::FileEntry],
    paths: &dyn Fn(&str) -> PathBuf,
) -> Doc {
    let layers = format::layers(files);
    let m = format::manifest(artifact, config_type, &config, layers.clone(), name);
    let bytes = format::to_bytes(&m);
    let mut sources = HashMap::new();
    for f in files {
        for c in &f.chunks {
            sources
                .entry(c.digest.clone())
                .or_insert_with(|| (paths(&f.name), c.clone()));
        }
    }
    Doc {
        name: name.to_string(),
        role,
        digest: format::sha256_digest(&bytes),
        manifest: bytes,
        config_desc: m.config,
        config,
        layers,
        sources,
    }
}

/// The index document for `docs` (as pushed under the tag).
fn index(docs: &[Doc]) -> Vec<u8> {
    let manifests = docs
        .iter()
        .map(|d| {
            let mut e = format::blob(format::MT_MANIFEST, &d.digest, d.manifest.len() as u64);
            e.artifact_type = Some(
                if d.role == "image" {
                    format::ARTIFACT_IMAGE
                } else {
                    format::ARTIFACT_LINK
                }
                .to_string(),
            );
            e.annotations.insert(format::ANN_ROLE.into(), d.role.into());
            e.annotations
                .insert(format::ANN_NAME.into(), d.name.clone());
            e
        })
        .collect();
    format::to_bytes(&format::Index {
        schema_version: 2,
        media_type: format::MT_INDEX.into(),
        artifact_type: format::ARTIFACT_SNAPSHOT.into(),
        manifests,
        annotations: BTreeMap::from([(
            format::ANN_NAME.to_string(),
            docs.last().map(|d| d.name.clone()).unwrap_or_default(),
        )]),
    })
}

/// Build the documents of `image` and `links` (base first; each link's
/// parent is the one before it, whose manifest digest is filled in here).
pub fn plan(image: ImagePart, mut links: Vec<LinkPart>) -> Plan {
    let mut docs = Vec::new();
    let rootfs = image.rootfs.clone();
    docs.push(doc(
        &image.config.name,
        "image",
        format::ARTIFACT_IMAGE,
        format::MT_IMAGE_CONFIG,
        format::to_bytes(&image.config),
        &image.config.files,
        &|_| rootfs.clone(),
    ));
    let mut prev: Option<(String, String)> = None;
    for l in &mut links {
        if let (Some(p), Some((id, digest))) = (&mut l.config.parent, &prev) {
            if &p.id == id {
                *p = ParentLink {
                    id: id.clone(),
                    manifest: digest.clone(),
                };
            }
        }
        let paths = l.paths.clone();
        let d = doc(
            &l.config.id,
            "link",
            format::ARTIFACT_LINK,
            format::MT_LINK_CONFIG,
            format::to_bytes(&l.config),
            &l.config.files,
            &move |n| paths.get(n).cloned().unwrap_or_default(),
        );
        prev = Some((l.config.id.clone(), d.digest.clone()));
        docs.push(d);
    }
    let idx = index(&docs);
    Plan {
        index_digest: format::sha256_digest(&idx),
        index: idx,
        docs,
    }
}

impl Plan {
    /// The index's or a manifest's bytes and media type, by digest.
    pub fn manifest(&self, digest: &str) -> Option<(&[u8], &'static str)> {
        if digest == self.index_digest {
            return Some((&self.index, format::MT_INDEX));
        }
        self.docs
            .iter()
            .find(|d| d.digest == digest)
            .map(|d| (d.manifest.as_slice(), format::MT_MANIFEST))
    }

    /// A config or chunk blob of one of the manifests, by digest.
    pub fn blob(&self, digest: &str) -> Option<Blob<'_>> {
        for d in &self.docs {
            if d.config_desc.digest == digest {
                return Some(Blob::Config(&d.config));
            }
            if let Some((path, chunk)) = d.sources.get(digest) {
                return Some(Blob::Chunk { path, chunk });
            }
        }
        None
    }

    /// Every manifest digest (the index's first) and blob digest it holds.
    pub fn digests(&self) -> Vec<String> {
        let mut v = vec![self.index_digest.clone()];
        for d in &self.docs {
            v.push(d.digest.clone());
            v.push(d.config_desc.digest.clone());
            v.extend(d.layers.iter().map(|l| l.digest.clone()));
        }
        v
    }

    /// The snapshot the plan is of (its last link).
    pub fn top(&self) -> &str {
        self.docs.last().map_or("", |d| d.name.as_str())
    }
}

/// The compressed bytes of a chunk blob (blocking: reads and compresses up
/// to a chunk of the file, and checks the digest).
pub fn read_blob(path: &std::path::Path, chunk: &Chunk) -> Result<Vec<u8>, ChunkError> {
    read_chunk(path, chunk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DiskBacking, ImageConfig};

    fn image(dir: &std::path::Path) -> ImagePart {
        let p = dir.join("rootfs.ext4");
        std::fs::write(&p, vec![7u8; 70_000]).unwrap();
        let e = crate::chunk::index_file(&p, "rootfs.ext4", 65536, &mut |_, _| {}).unwrap();
        ImagePart {
            config: ImageConfig {
                schema: format::SCHEMA,
                name: "default".into(),
                image_json: serde_json::json!({"name": "default"}),
                files: vec![e],
            },
            rootfs: p,
        }
    }

    fn link(dir: &std::path::Path, id: &str, parent: Option<&str>, byte: u8) -> LinkPart {
        let p = dir.join(format!("{id}.mem"));
        std::fs::write(&p, vec![byte; 1000]).unwrap();
        let e = crate::chunk::index_file(&p, "memory.img", 65536, &mut |_, _| {}).unwrap();
        LinkPart {
            config: LinkConfig {
                schema: format::SCHEMA,
                id: id.into(),
                kind: "shared".into(),
                parent: parent.map(|p| ParentLink {
                    id: p.into(),
                    manifest: String::new(),
                }),
                manifest_fvs: String::new(),
                disk_backing: DiskBacking::Image,
                requires: crate::compat::Requires {
                    arch: "x86_64".into(),
                    qemu: "10".into(),
                    machine: "pc".into(),
                    cpu_model: "max".into(),
                    cpu_vendor: String::new(),
                    cpu_flags: vec![],
                    accel: "tcg".into(),
                    kernel_sha256: "0".repeat(64),
                    initrd_sha256: "0".repeat(64),
                },
                files: vec![e],
            },
            paths: BTreeMap::from([("memory.img".to_string(), p)]),
        }
    }

    #[test]
    fn documents_are_deterministic_and_findable_by_digest() {
        let d = tempfile::tempdir().unwrap();
        let mk = || {
            plan(
                image(d.path()),
                vec![
                    link(d.path(), "sn-a", None, 1),
                    link(d.path(), "sn-b", Some("sn-a"), 2),
                ],
            )
        };
        let (a, b) = (mk(), mk());
        assert_eq!(a.index, b.index);
        assert_eq!(a.index_digest, format::sha256_digest(&a.index));
        assert_eq!(a.top(), "sn-b");
        // The index parses as a snapshot, lists image then links in order.
        let i = format::parse_index(&a.index, "index").unwrap();
        let names: Vec<&str> = i
            .manifests
            .iter()
            .map(|m| m.annotations[format::ANN_NAME].as_str())
            .collect();
        assert_eq!(names, ["default", "sn-a", "sn-b"]);
        // The child names its parent's manifest digest.
        let m = format::parse_manifest(&a.docs[2].manifest, format::ARTIFACT_LINK, "m").unwrap();
        let c = format::parse_link(&a.docs[2].config, &m, "c").unwrap();
        assert_eq!(c.parent.unwrap().manifest, a.docs[1].digest);
        // Every digest it lists is served, with the bytes it names.
        for dg in a.digests() {
            if let Some((bytes, mt)) = a.manifest(&dg) {
                assert_eq!(format::sha256_digest(bytes), dg);
                assert!(mt == format::MT_INDEX || mt == format::MT_MANIFEST);
                continue;
            }
            match a.blob(&dg).expect("a blob") {
                Blob::Config(bytes) => assert_eq!(format::sha256_digest(bytes), dg),
                Blob::Chunk { path, chunk } => {
                    let z = read_blob(path, chunk).unwrap();
                    assert_eq!(format::sha256_digest(&z), dg);
                    assert_eq!(z.len() as u64, chunk.size);
                }
            }
        }
        assert!(a.manifest("sha256:00").is_none() && a.blob("sha256:00").is_none());
        // An image alone is not a snapshot.
        let lone = plan(image(d.path()), vec![]);
        let e = format::parse_index(&lone.index, "test").unwrap_err();
        assert!(e.to_string().contains("no chain link"), "{e}");
        let img = &lone.docs[0];
        let m = format::parse_manifest(&img.manifest, format::ARTIFACT_IMAGE, "m").unwrap();
        let c = format::parse_image(&img.config, &m, "c").unwrap();
        assert_eq!(c.files[0].name, "rootfs.ext4");
    }
}
