//! [`ImageError`]: everything that can go wrong reading, unpacking and
//! installing an image, with messages that say what to do about it.

use std::io;
use std::path::PathBuf;

use crate::blobs::BlobError;

/// An image error.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The blob store refused or could not serve a blob.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// A blob of an archive or registry failed its checks (digest, size).
    #[error("{what}: {source}")]
    BlobContext {
        what: String,
        #[source]
        source: BlobError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A manifest, index, config or archive is malformed.
    #[error("{what} is malformed: {reason}")]
    Malformed { what: String, reason: String },
    /// A document or layer this code does not handle.
    #[error("{what}: unsupported {kind} {value:?}; {hint}")]
    Unsupported {
        what: String,
        kind: &'static str,
        value: String,
        hint: &'static str,
    },
    /// An index has no linux/amd64 image.
    #[error("{what} has no linux/amd64 image (it has: {platforms}); forkvm runs linux/amd64 guests, so pick a tag built for that platform")]
    NoPlatform { what: String, platforms: String },
    /// A source has several images and nothing says which one to take.
    #[error("{what} holds several images ({names}); name the one to import")]
    Ambiguous { what: String, names: String },
    /// A source has no image of the name asked for.
    #[error("{what} has no image named {reference:?} (it has: {names})")]
    NoSuchImage {
        what: String,
        reference: String,
        names: String,
    },
    /// A file is none of the formats `import` reads.
    #[error("{path} is not an image: {reason}. Import reads a `docker save` tarball, an OCI image layout (directory or tar) or a root filesystem tarball (.tar, .tar.gz, .tar.zst)")]
    UnknownFormat { path: PathBuf, reason: String },
    /// A blob an image needs is missing from an archive or the store.
    #[error("{what} is missing blob {digest}; the archive is incomplete, export or pull the image again")]
    MissingBlob { what: String, digest: String },
    /// A layer entry tried to leave the root or is otherwise unsafe.
    #[error("layer entry {path:?} is refused: {reason} (the layer is malformed or malicious)")]
    UnsafePath { path: String, reason: String },
    /// A layer entry could not be applied.
    #[error("layer entry {path:?}: {what}: {source}")]
    Entry {
        path: String,
        what: String,
        #[source]
        source: io::Error,
    },
    /// A host tool is not installed.
    #[error(
        "{tool} is not installed (or not on PATH); run scripts/setup.sh to install the image tools"
    )]
    MissingTool { tool: String },
    /// A host tool ran and failed.
    #[error("{tool} failed ({status}): {stderr}")]
    ToolFailed {
        tool: String,
        status: String,
        stderr: String,
    },
    /// The requested root disk size cannot hold the image.
    #[error("a root disk of {requested} bytes is too small for this image; it needs at least {minimum} bytes ({} MiB)", minimum.div_ceil(1 << 20))]
    DiskTooSmall { requested: u64, minimum: u64 },
    #[error("{0:?} is not a valid image name: use 1 to 64 of A-Z a-z 0-9 . _ - starting with a letter or digit")]
    BadName(String),
    #[error("image {0:?} already exists; remove it first (forkvm image rm) or ask to replace it")]
    Exists(String),
    #[error("image {0:?} does not exist; see the installed images with forkvm image ls")]
    NotFound(String),
    /// An image's files are there but unusable.
    #[error("image {name:?} is broken: {reason}; remove it and install it again")]
    Broken { name: String, reason: String },
}

/// Wrap an `io::Error` with what was being done.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

/// Wrap a `BlobError` with what blob of what source it was.
pub(crate) fn blob_err(what: impl Into<String>) -> impl FnOnce(BlobError) -> ImageError {
    let what = what.into();
    move |source| ImageError::BlobContext { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_do() {
        let e = ImageError::MissingTool {
            tool: "mkfs.ext4".into(),
        };
        assert!(e.to_string().contains("scripts/setup.sh"), "{e}");
        let e = ImageError::DiskTooSmall {
            requested: 1 << 20,
            minimum: (300 << 20) + 1,
        };
        assert!(e.to_string().contains("301 MiB"), "{e}");
        let e = ImageError::NoPlatform {
            what: "index".into(),
            platforms: "linux/arm64".into(),
        };
        assert!(e.to_string().contains("linux/arm64"), "{e}");
    }
}
