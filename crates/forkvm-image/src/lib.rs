//! Images: what a sandbox's root disk is made from.
//!
//! ```text
//! $FORKVM_HOME/
//!   blobs/sha256/<hex>          content-addressed blobs (layers, configs,
//!                               manifests), read-only, shared by every image
//!   blobs/ingest/<random>       a blob being written: never read
//!   images/<name>/rootfs.ext4   the root disk (read-only; sandboxes get a
//!                               qcow2 overlay on it)
//!   images/<name>/image.json    its metadata ([`meta::ImageMeta`])
//!   images/.tmp-<name>-<pid>-<n>/    an image being made: never listed
//!   images/.trash-<name>-<pid>-<n>/  an image being deleted
//! ```
//!
//! An image is published like a snapshot: everything is written under a
//! temporary name, fsynced, and renamed into place last, so no half-made
//! image is ever visible.
//!
//! The way in: a source ([`archive::import_source`]; registry pulls too)
//! puts verified blobs into the [`blobs::BlobStore`] and yields an
//! [`oci::ResolvedImage`]; [`install::install_image`] applies its layers
//! ([`unpack`], confined by [`safepath`]) into a staging tree, makes the
//! ext4 ([`ext4`]) and publishes `images/<name>`.

pub mod archive;
pub mod auth;
pub mod blobs;
pub mod error;
pub mod ext4;
pub mod install;
pub mod meta;
pub mod oci;
pub mod progress;
pub mod pull;
pub mod safepath;
mod source;
pub mod unpack;

pub use error::ImageError;
pub use install::valid_image_name;

#[cfg(test)]
mod testutil;
