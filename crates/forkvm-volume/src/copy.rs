//! `copy_tree`: the volume copy made for a `copy` fork.
//!
//! Regular files are reflinked (FICLONE) when the filesystem can share
//! extents, so a copy of a large tree is instant and takes no space until
//! written; otherwise they are copied. Symlinks are recreated as symlinks
//! and never followed, but only those a guest could have made at their
//! place in the copy (see `security::symlink_target_ok`): an absolute link
//! or one climbing above the copy's root is skipped with a warning, since
//! the copy lives under forkvm's home, and a relative link out of it would
//! name the home's own files. Devices, fifos and sockets are skipped (a
//! volume never serves them). Regular files with more than one hard link are
//! skipped too: the volume server refuses to open them (the other link may
//! be a host file outside the volume), and a copy with a single link would
//! hand their content to the guest. The copy is built in `dst.tmp-<rand>` and renamed
//! into place at the end, so `dst` either is complete or does not exist.
//!
//! [`copy_tree_within`] bounds the bytes a copy may write (files that had to
//! be copied rather than reflinked), so the daemon can keep its free-space
//! reserve: a copy that would cross it stops with [`VolumeError::NoSpace`]
//! and removes what it wrote.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{CopyStats, VolumeError};

/// `FICLONE` = `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

fn io_err(what: &str, p: &Path) -> impl FnOnce(io::Error) -> VolumeError {
    let what = format!("{what} {}", p.display());
    move |source| VolumeError::Io { what, source }
}

/// Copies the tree at `src` to `dst` (which must not exist).
pub fn copy_tree(src: &Path, dst: &Path) -> Result<CopyStats, VolumeError> {
    copy_tree_within(src, dst, None)
}

/// [`copy_tree`], writing at most `budget` bytes of file data (reflinked
/// files cost nothing); over it, the partial copy is removed and the error
/// is [`VolumeError::NoSpace`].
pub fn copy_tree_within(
    src: &Path,
    dst: &Path,
    budget: Option<u64>,
) -> Result<CopyStats, VolumeError> {
    if dst.symlink_metadata().is_ok() {
        return Err(VolumeError::DestExists(dst.to_owned()));
    }
    let meta = fs::symlink_metadata(src).map_err(io_err("reading", src))?;
    if !meta.is_dir() {
        return Err(VolumeError::BadRoot {
            path: src.to_owned(),
            why: "not a directory".into(),
        });
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut tmp_name = dst.file_name().unwrap_or_default().to_owned();
    tmp_name.push(format!(".tmp-{:x}{:x}", std::process::id(), nanos));
    let tmp: PathBuf = dst.with_file_name(tmp_name);
    let mut stats = CopyStats {
        files: 0,
        bytes: 0,
        reflinked: true,
    };
    let mut written = Budget { left: budget };
    let res = copy_dir(src, &tmp, &meta, 0, &mut stats, &mut written)
        .and_then(|()| fs::rename(&tmp, dst).map_err(io_err("renaming into", dst)));
    if res.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    res?;
    if stats.files == 0 {
        stats.reflinked = false;
    }
    Ok(stats)
}

/// What a copy may still write; `None` is unbounded.
struct Budget {
    left: Option<u64>,
}

fn copy_dir(
    src: &Path,
    dst: &Path,
    meta: &fs::Metadata,
    depth: usize,
    stats: &mut CopyStats,
    budget: &mut Budget,
) -> Result<(), VolumeError> {
    fs::create_dir(dst).map_err(io_err("creating", dst))?;
    for ent in fs::read_dir(src).map_err(io_err("listing", src))? {
        let ent = ent.map_err(io_err("listing", src))?;
        let (s, d) = (ent.path(), dst.join(ent.file_name()));
        let m = fs::symlink_metadata(&s).map_err(io_err("reading", &s))?;
        let ft = m.file_type();
        if ft.is_dir() {
            copy_dir(&s, &d, &m, depth + 1, stats, budget)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&s).map_err(io_err("reading link", &s))?;
            if !crate::security::symlink_target_ok(depth, target.as_os_str()) {
                tracing::warn!(
                    path = %s.display(),
                    target = %target.display(),
                    "volume copy: skipped a symlink that would point outside the copy"
                );
                continue;
            }
            std::os::unix::fs::symlink(&target, &d).map_err(io_err("creating link", &d))?;
            finish(&d, &m, false)?;
        } else if ft.is_file() && m.nlink() > 1 {
            tracing::warn!(path = %s.display(), "volume copy: skipped a file with several hard links");
        } else if ft.is_file() {
            copy_file(&s, &d, &m, stats, budget)?;
        }
        // Devices, fifos and sockets: skipped on purpose.
    }
    // Last, so that creating the children does not bump the mtime again.
    finish(dst, meta, true)
}

fn copy_file(
    src: &Path,
    dst: &Path,
    m: &fs::Metadata,
    stats: &mut CopyStats,
    budget: &mut Budget,
) -> Result<(), VolumeError> {
    let mut from = fs::File::open(src).map_err(io_err("opening", src))?;
    let mut to = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(io_err("creating", dst))?;
    // SAFETY: FICLONE takes the source fd as its argument; both fds are ours.
    let rc = unsafe { libc::ioctl(to.as_raw_fd(), FICLONE, from.as_raw_fd()) };
    if rc != 0 {
        stats.reflinked = false;
        // Checked before writing: the file's size is what it will take.
        if let Some(left) = budget.left {
            if m.len() > left {
                return Err(VolumeError::NoSpace {
                    path: src.to_owned(),
                    needed: m.len(),
                    left,
                });
            }
            budget.left = Some(left - m.len());
        }
        io::copy(&mut from, &mut to).map_err(io_err("copying to", dst))?;
    }
    stats.files += 1;
    stats.bytes += m.len();
    drop(to);
    finish(dst, m, true)
}

/// Owner, mode (not for symlinks) and times, never following a symlink.
fn finish(p: &Path, m: &fs::Metadata, chmod: bool) -> Result<(), VolumeError> {
    std::os::unix::fs::lchown(p, Some(m.uid()), Some(m.gid())).map_err(io_err("chown", p))?;
    if chmod {
        fs::set_permissions(p, fs::Permissions::from_mode(m.mode() & 0o7777))
            .map_err(io_err("chmod", p))?;
    }
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| VolumeError::BadRoot {
        path: p.to_owned(),
        why: "contains NUL".into(),
    })?;
    let t = [
        libc::timespec {
            tv_sec: m.atime(),
            tv_nsec: m.atime_nsec(),
        },
        libc::timespec {
            tv_sec: m.mtime(),
            tv_nsec: m.mtime_nsec(),
        },
    ];
    // SAFETY: NUL-terminated path and a two-element timespec array.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io_err("setting times of", p)(io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_copy_over_its_budget_stops_and_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        fs::create_dir_all(src.join("d")).unwrap();
        fs::write(src.join("a"), vec![1u8; 3000]).unwrap();
        fs::write(src.join("d/b"), vec![2u8; 3000]).unwrap();
        // Where the filesystem reflinks (XFS, btrfs), files cost nothing.
        let probe = copy_tree(&src, &t.path().join("probe")).unwrap();
        fs::remove_dir_all(t.path().join("probe")).unwrap();
        if probe.reflinked {
            assert_eq!(copy_tree_within(&src, &dst, Some(0)).unwrap().bytes, 6000);
            return;
        }
        let e = copy_tree_within(&src, &dst, Some(4000)).unwrap_err();
        assert!(
            matches!(e, VolumeError::NoSpace { needed: 3000, .. }),
            "{e}"
        );
        assert!(!dst.exists());
        let left: Vec<_> = fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "the partial copy is removed");
        let st = copy_tree_within(&src, &dst, Some(6000)).unwrap();
        assert_eq!(st.bytes, 6000);
    }

    #[test]
    fn copies_tree_keeping_symlinks_unfollowed() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        let outside = t.path().join("outside");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(&outside, "SECRET").unwrap();
        fs::write(src.join("sub/a"), "hello").unwrap();
        fs::set_permissions(src.join("sub/a"), fs::Permissions::from_mode(0o640)).unwrap();
        symlink(&outside, src.join("out")).unwrap();
        symlink("sub/a", src.join("rel")).unwrap();
        // Relative links that climb: within the tree, and out of it (into
        // whatever holds the copy: forkvm's home).
        symlink("../rel", src.join("sub/up")).unwrap();
        symlink("../../outside", src.join("sub/far")).unwrap();
        fs::hard_link(&outside, src.join("hard")).unwrap();
        let st = copy_tree(&src, &dst).unwrap();
        // A hard link (maybe to a host file) must not become a readable copy.
        assert!(!dst.join("hard").exists());
        assert_eq!((st.files, st.bytes), (1, 5));
        assert_eq!(fs::read_to_string(dst.join("sub/a")).unwrap(), "hello");
        let m = fs::metadata(dst.join("sub/a")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o640);
        assert_eq!(m.mtime(), fs::metadata(src.join("sub/a")).unwrap().mtime());
        // Links out of the copy (absolute, or climbing above its root) are
        // neither copied as links nor followed.
        assert!(fs::symlink_metadata(dst.join("out")).is_err());
        assert!(fs::symlink_metadata(dst.join("sub/far")).is_err());
        assert_eq!(fs::read_link(dst.join("rel")).unwrap(), Path::new("sub/a"));
        assert_eq!(
            fs::read_link(dst.join("sub/up")).unwrap(),
            Path::new("../rel")
        );
        assert_eq!(fs::read_to_string(dst.join("sub/up")).unwrap(), "hello");
        // No temp dir is left behind and an existing dst is refused.
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 3);
        assert!(matches!(
            copy_tree(&src, &dst),
            Err(VolumeError::DestExists(_))
        ));
    }
}
