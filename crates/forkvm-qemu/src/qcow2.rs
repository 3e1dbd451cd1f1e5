//! The one part of the qcow2 header forkvm reads itself: the backing file.
//!
//! A qcow2 image starts with a big-endian header (see QEMU's
//! `docs/interop/qcow2.txt`):
//!
//! ```text
//! offset  size  field
//!      0     4  magic "QFI\xfb"
//!      4     4  version (2 or 3)
//!      8     8  backing_file_offset (0: no backing file)
//!     16     4  backing_file_size (bytes, at most 1023, no terminator)
//! ```
//!
//! The backing file name is stored at `backing_file_offset` and is resolved
//! against the image's own directory when relative. forkvm reads it to count
//! the layers of a running sandbox's disk chain without starting `qemu-img`
//! (a process per `GET` would cost more than the answer is worth). A file
//! that is not qcow2 ends a chain: it is the raw base image.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The qcow2 magic.
pub const MAGIC: &[u8; 4] = b"QFI\xfb";
/// QEMU refuses backing file names longer than this.
const MAX_NAME: u32 = 1023;
/// A chain longer than this is treated as corrupt (a loop, most likely).
pub const MAX_CHAIN: usize = 4096;

/// Why a header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Qcow2Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid qcow2 image: {why}")]
    Corrupt { path: String, why: String },
}

/// The backing file `image` names, resolved against its directory; `None`
/// for an image without one, or for a file that is not qcow2 at all.
pub fn backing_file(image: &Path) -> Result<Option<PathBuf>, Qcow2Error> {
    let io = |source| Qcow2Error::Io {
        path: image.display().to_string(),
        source,
    };
    let corrupt = |why: String| Qcow2Error::Corrupt {
        path: image.display().to_string(),
        why,
    };
    let mut f = std::fs::File::open(image).map_err(io)?;
    let mut head = [0u8; 20];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]).map_err(io)? {
            0 => break,
            k => n += k,
        }
    }
    if n < 4 || head[..4] != *MAGIC {
        return Ok(None);
    }
    if n < head.len() {
        return Err(corrupt(format!("the header is truncated at {n} bytes")));
    }
    let version = u32::from_be_bytes(head[4..8].try_into().unwrap_or_default());
    if !(2..=3).contains(&version) {
        return Err(corrupt(format!("unknown version {version}")));
    }
    let offset = u64::from_be_bytes(head[8..16].try_into().unwrap_or_default());
    let size = u32::from_be_bytes(head[16..20].try_into().unwrap_or_default());
    if offset == 0 {
        return Ok(None);
    }
    if size == 0 || size > MAX_NAME {
        return Err(corrupt(format!("backing file name of {size} bytes")));
    }
    let mut name = vec![0u8; size as usize];
    f.read_exact_at(&mut name, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(format!(
                "the backing file name at offset {offset} runs past the end of the file"
            ))
        } else {
            io(e)
        }
    })?;
    let name = String::from_utf8(name)
        .map_err(|_| corrupt("the backing file name is not UTF-8".to_string()))?;
    // QEMU accepts `json:{...}` pseudo-filenames; forkvm never writes them.
    if name.starts_with("json:") {
        return Err(corrupt(format!("unsupported backing file {name}")));
    }
    let p = PathBuf::from(&name);
    Ok(Some(if p.is_absolute() {
        p
    } else {
        image.parent().unwrap_or(Path::new("/")).join(p)
    }))
}

/// The chain from `top` down to its base, `top` first, every file that
/// The last entry is the base (a raw image, or a qcow2 without a
/// backing file).
pub fn chain(top: &Path) -> Result<Vec<PathBuf>, Qcow2Error> {
    let mut out = vec![top.to_path_buf()];
    while let Some(next) = backing_file(out.last().map(PathBuf::as_path).unwrap_or(top))? {
        if out.len() >= MAX_CHAIN || out.contains(&next) {
            return Err(Qcow2Error::Corrupt {
                path: top.display().to_string(),
                why: format!("the backing chain loops or passes {MAX_CHAIN} layers"),
            });
        }
        out.push(next);
    }
    Ok(out)
}

/// How many qcow2 layers `top`'s chain has (the raw base not counted).
pub fn layers(top: &Path) -> Result<usize, Qcow2Error> {
    let c = chain(top)?;
    let base_is_qcow2 = c
        .last()
        .map(|b| crate::disk::image_format(b).is_ok_and(|f| f == "qcow2"))
        .unwrap_or(false);
    Ok(c.len() - usize::from(!base_is_qcow2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal qcow2 header naming `backing` (or none), padded to 512 bytes.
    fn header(version: u32, backing: Option<&str>) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..4].copy_from_slice(MAGIC);
        h[4..8].copy_from_slice(&version.to_be_bytes());
        if let Some(b) = backing {
            h[8..16].copy_from_slice(&256u64.to_be_bytes());
            h[16..20].copy_from_slice(&(b.len() as u32).to_be_bytes());
            h[256..256 + b.len()].copy_from_slice(b.as_bytes());
        }
        h
    }

    #[test]
    fn reads_absolute_and_relative_backing_files() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base.img");
        std::fs::write(&base, vec![0u8; 4096]).unwrap();
        let mid = d.path().join("mid.qcow2");
        std::fs::write(&mid, header(3, Some(base.to_str().unwrap()))).unwrap();
        let top = d.path().join("top.qcow2");
        std::fs::write(&top, header(2, Some("mid.qcow2"))).unwrap();
        assert_eq!(backing_file(&top).unwrap(), Some(mid.clone()));
        assert_eq!(backing_file(&mid).unwrap(), Some(base.clone()));
        assert_eq!(backing_file(&base).unwrap(), None);
        assert_eq!(chain(&top).unwrap(), vec![top.clone(), mid, base]);
        assert_eq!(layers(&top).unwrap(), 2);
    }

    #[test]
    fn a_qcow2_without_backing_counts_itself() {
        let d = tempfile::tempdir().unwrap();
        let only = d.path().join("only.qcow2");
        std::fs::write(&only, header(3, None)).unwrap();
        assert_eq!(backing_file(&only).unwrap(), None);
        assert_eq!(layers(&only).unwrap(), 1);
    }

    #[test]
    fn real_images_from_qemu_img_agree() {
        // qemu-img is installed by scripts/setup.sh; without it this test
        // cannot say anything, so it fails rather than passing silently.
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base.img");
        std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
        let mut below = (base.clone(), "raw");
        for i in 0..3 {
            let p = d.path().join(format!("l{i}.qcow2"));
            let out = std::process::Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", below.1, "-b"])
                .arg(&below.0)
                .arg(&p)
                .output()
                .expect("qemu-img is missing: run scripts/setup.sh");
            assert!(out.status.success(), "{out:?}");
            below = (p, "qcow2");
        }
        assert_eq!(layers(&below.0).unwrap(), 3);
        assert_eq!(chain(&below.0).unwrap().last(), Some(&base));
    }

    #[test]
    fn corrupt_headers_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.qcow2");
        // Truncated header.
        std::fs::write(&p, &header(3, None)[..12]).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // Unknown version.
        std::fs::write(&p, header(9, None)).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // A name longer than QEMU allows.
        let mut h = header(3, Some("a"));
        h[16..20].copy_from_slice(&2000u32.to_be_bytes());
        std::fs::write(&p, &h).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // A zero-length name with an offset.
        h[16..20].copy_from_slice(&0u32.to_be_bytes());
        std::fs::write(&p, &h).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // The name runs past the end of the file.
        let mut h = header(3, Some("abc"));
        h[8..16].copy_from_slice(&510u64.to_be_bytes());
        std::fs::write(&p, &h).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // Not UTF-8.
        let mut h = header(3, Some("abc"));
        h[256] = 0xff;
        std::fs::write(&p, &h).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // A json: pseudo-filename.
        std::fs::write(&p, header(3, Some("json:{}"))).unwrap();
        assert!(matches!(backing_file(&p), Err(Qcow2Error::Corrupt { .. })));
        // A missing file is an I/O error, not "no backing".
        assert!(matches!(
            backing_file(&d.path().join("missing")),
            Err(Qcow2Error::Io { .. })
        ));
    }

    #[test]
    fn loops_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.qcow2");
        let b = d.path().join("b.qcow2");
        std::fs::write(&a, header(3, Some("b.qcow2"))).unwrap();
        std::fs::write(&b, header(3, Some("a.qcow2"))).unwrap();
        assert!(matches!(chain(&a), Err(Qcow2Error::Corrupt { .. })));
    }

    #[test]
    fn a_short_file_is_not_qcow2() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("tiny");
        std::fs::write(&p, b"QF").unwrap();
        assert_eq!(backing_file(&p).unwrap(), None);
    }
}
