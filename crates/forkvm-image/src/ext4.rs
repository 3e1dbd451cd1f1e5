//! The root disk: an ext4 filesystem image made from a staging tree with
//! `mkfs.ext4 -d` (e2fsprogs), which copies file contents, owners, modes
//! (setuid bits included), mtimes, hardlinks, symlinks, device nodes, fifos
//! and xattrs (`security.capability` included) without mounting anything.
//!
//! Size rule, when no size is asked for:
//!
//! ```text
//! content = sum over distinct inodes of their data, rounded up to 4 KiB
//!           blocks (a directory or a symlink of 60+ bytes takes a block)
//! size    = content * 1.25 + 256 MiB, rounded up to a MiB
//! ```
//!
//! The quarter and the 256 MiB cover ext4's own metadata (journal, inode
//! tables, bitmaps) and leave the sandbox room to write: its writes land in
//! this filesystem (through a qcow2 overlay), so its free space is the
//! sandbox's. A requested size is honoured when it is at least the minimum
//!
//! ```text
//! minimum = (content + inodes * 256 + journal + 16 MiB) * 1.03, in MiB
//! ```
//!
//! (the journal as mke2fs sizes it); a smaller one is an error naming the
//! minimum. Inodes: mke2fs's default of one per 16 KiB, but never fewer than
//! the tree has plus a quarter plus 16384, so trees of many small files fit.
//! No blocks are reserved for root (`-m 0`): a sandbox's user may be
//! anyone, and the whole disk is theirs.
//!
//! mke2fs's `/lost+found` is removed (with `debugfs`) unless the tree has
//! one: Docker images have none.
//!
//! The file is written under a temporary name beside `dest` and renamed
//! into place, so a failed or interrupted mkfs leaves nothing at `dest`.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{io_err, ImageError};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

/// What a tree needs from a filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Content {
    /// Data blocks, in bytes.
    pub bytes: u64,
    /// Distinct inodes.
    pub inodes: u64,
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Measure a tree (without following symlinks; hardlinks count once).
pub fn measure(src: &Path) -> Result<Content, ImageError> {
    let mut c = Content::default();
    let mut seen = HashSet::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).map_err(io_err(format!("measuring {}", p.display())))?;
        if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        c.inodes += 1;
        let ft = m.file_type();
        if ft.is_dir() {
            c.bytes += BLOCK;
            for e in fs::read_dir(&p).map_err(io_err(format!("listing {}", p.display())))? {
                let e = e.map_err(io_err(format!("listing {}", p.display())))?;
                // Directory entries: 8 bytes plus the name, 4-aligned.
                c.bytes += round_up(8 + e.file_name().len() as u64, 4);
                stack.push(e.path());
            }
        } else if ft.is_file() {
            c.bytes += round_up(m.len(), BLOCK);
        } else if ft.is_symlink() && m.len() >= 60 {
            c.bytes += BLOCK;
        }
    }
    Ok(c)
}

/// The size [`make_ext4`] picks for content (see the module doc).
pub fn auto_size(c: Content) -> u64 {
    round_up(c.bytes + c.bytes / 4 + 256 * MIB, MIB)
}

/// mke2fs's default journal size for a filesystem of `size` bytes (4 KiB
/// blocks), from `ext2fs_default_journal_size`.
fn journal_bytes(size: u64) -> u64 {
    let blocks = size / BLOCK;
    let jblocks = match blocks {
        b if b < 2048 => 0,
        b if b < 32 * 1024 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    };
    jblocks * BLOCK
}

fn inode_count(size: u64, c: Content) -> u64 {
    (size / 16384).max(c.inodes + c.inodes / 4 + 16384)
}

/// The smallest size [`make_ext4`] accepts for content.
pub fn minimum_size(c: Content) -> u64 {
    let base = c.bytes + inode_count(0, c) * 256 + 16 * MIB;
    // The journal grows with the size; two rounds settle it.
    let mut size = base;
    for _ in 0..2 {
        size = round_up((base + journal_bytes(size)) * 103 / 100, MIB);
    }
    size
}

/// Find a host tool on PATH or in the sbin directories (a daemon's PATH
/// often lacks them).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Make an ext4 image of the tree `src` at `dest` (replacing it). Returns
/// the filesystem's size in bytes: the size chosen or asked for, less a
/// trailing part mke2fs cannot use (at most one 128 MiB block group, and
/// none when the size is a multiple of 128 MiB). See the module doc for the
/// size rule.
pub fn make_ext4(src: &Path, dest: &Path, size: Option<u64>) -> Result<u64, ImageError> {
    let mkfs = find_tool("mkfs.ext4").ok_or_else(|| ImageError::MissingTool {
        tool: "mkfs.ext4 (e2fsprogs)".into(),
    })?;
    let content = measure(src)?;
    let minimum = minimum_size(content);
    let size = match size {
        None => auto_size(content).max(minimum),
        Some(s) if s < minimum => {
            return Err(ImageError::DiskTooSmall {
                requested: s,
                minimum,
            })
        }
        Some(s) => round_up(s, BLOCK),
    };
    let file_name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dest.with_file_name(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let out = Command::new(&mkfs)
        .args(["-q", "-F", "-L", "forkvm-root", "-b", "4096", "-m", "0"])
        .arg("-N")
        .arg(inode_count(size, content).to_string())
        .arg("-d")
        .arg(src)
        .args(["-E", "root_owner=0:0"])
        .arg(&tmp)
        .arg(format!("{}k", size / 1024))
        .output();
    let result = match out {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ImageError::MissingTool {
            tool: "mkfs.ext4 (e2fsprogs)".into(),
        }),
        Err(e) => Err(io_err(format!("running {}", mkfs.display()))(e)),
        Ok(o) if !o.status.success() => {
            let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
            let full = stderr.contains("No space left") || stderr.contains("Could not allocate");
            Err(if full {
                ImageError::DiskTooSmall {
                    requested: size,
                    minimum: minimum.max(size + size / 4),
                }
            } else {
                ImageError::ToolFailed {
                    tool: "mkfs.ext4".into(),
                    status: o.status.to_string(),
                    stderr,
                }
            })
        }
        Ok(_) if fs::symlink_metadata(src.join("lost+found")).is_err() => drop_lost_found(&tmp),
        Ok(_) => Ok(()),
    };
    let result = match result {
        Err(e) => Err(e),
        // mke2fs drops a last block group too small to hold its own
        // metadata, so the file (made by mke2fs) is the true size.
        Ok(()) => fs::File::open(&tmp)
            .and_then(|f| {
                f.sync_all()?;
                f.metadata()
            })
            .and_then(|m| fs::rename(&tmp, dest).map(|_| m.len()))
            .map_err(io_err(format!("publishing {}", dest.display()))),
    };
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Remove the empty `/lost+found` mke2fs always makes: an image's root is
/// what its layers hold, as in a container (e2fsck makes the directory
/// again should it ever need one).
fn drop_lost_found(img: &Path) -> Result<(), ImageError> {
    let debugfs = find_tool("debugfs").ok_or_else(|| ImageError::MissingTool {
        tool: "debugfs (e2fsprogs)".into(),
    })?;
    let o = Command::new(&debugfs)
        .args(["-w", "-R", "rmdir /lost+found"])
        .arg(img)
        .output()
        .map_err(io_err(format!("running {}", debugfs.display())))?;
    // debugfs exits 0 whatever its request did: its errors are on stderr,
    // after the version banner.
    let stderr = String::from_utf8_lossy(&o.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        .collect();
    if !o.status.success() || !errors.is_empty() {
        return Err(ImageError::ToolFailed {
            tool: "debugfs (removing /lost+found)".into(),
            status: o.status.to_string(),
            stderr: errors.join("\n"),
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "ext4_tests.rs"]
mod tests;
