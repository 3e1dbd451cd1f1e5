//! A forkvm snapshot as an OCI artifact, and moving it through a registry.
//!
//! ```text
//! REPO:TAG ──▶ index  (application/vnd.oci.image.index.v1+json,
//!              │       artifactType application/vnd.forkvm.snapshot.v1)
//!              ├─ manifest "image"  artifactType application/vnd.forkvm.image.v1
//!              │    config  application/vnd.forkvm.image.config.v1+json
//!              │    layers  the base image's root disk in chunks
//!              ├─ manifest "link" for the chain's base   ┐ artifactType
//!              ├─ manifest "link" for each diff link      │ application/vnd.forkvm.snapshot.link.v1
//!              └─ manifest "link" for the snapshot pushed ┘ (base first, the pushed one last)
//!                   config  application/vnd.forkvm.snapshot.link.config.v1+json ([`format::LinkConfig`]):
//!                           the snapshot's own manifest.fvs, its parent link's
//!                           manifest digest, what its disk layer backs onto,
//!                           what a host needs to restore it ([`compat::Requires`]),
//!                           and every file as a list of chunks
//!                   layers  application/vnd.forkvm.chunk.v1.zstd: one blob per
//!                           distinct chunk of device.state, memory.img or
//!                           memory.diff, and disk.qcow2
//! ```
//!
//! * **Chunks** ([`chunk`]): every file is cut at fixed 4 MiB offsets; an
//!   all-zero chunk is a hole and is not stored; each other chunk is
//!   compressed with zstd and named by the SHA-256 of the compressed bytes.
//!   Guest memory and qcow2 clusters sit at fixed offsets, so two snapshots
//!   of one template (or one snapshot pushed twice) produce the same blobs
//!   for the same content, and a registry stores and a pull fetches each once.
//! * **Links** are content-addressed manifests, and each names its parent's
//!   manifest digest, so a chain is a Merkle list: pushing a child whose
//!   parent is already in the registry finds the parent's manifest there and
//!   sends only the child's blobs.
//! * **Verification** on pull is end to end: each blob is checked against
//!   its digest, each assembled file against the SHA-256 its link lists, and
//!   those against the checksummed `manifest.fvs` the source host sealed.
//! * **Compatibility** ([`compat`]) is decided from the configs alone, before
//!   any chunk is fetched or anything is written.
//!
//! [`plan`] builds a snapshot's documents once; [`push`] sends them to a
//! registry, and a forkvm daemon serves them itself (its `/v2/` routes).
//! [`push`] and [`fetch`] speak the protocol through `oci-client`, with
//! forkvm-image's registry session (transport, credentials, errors).

pub mod chunk;
pub mod compat;
pub mod fetch;
pub mod format;
pub mod plan;
pub mod push;

pub use chunk::CHUNK;
pub use compat::{HostProfile, Requires};
pub use format::{DiskBacking, FileEntry, ImageConfig, LinkConfig};
