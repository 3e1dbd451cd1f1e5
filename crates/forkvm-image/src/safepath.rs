//! Paths inside an unpacking root, resolved as if the root were `/`.
//!
//! Layer tars are untrusted and are applied by root on the host, so every
//! name in them is confined to the staging root in two steps:
//!
//! 1. [`clean_entry_path`] normalizes an entry's name lexically: a leading
//!    `/` is dropped (names are relative to the image root), `.` goes, and a
//!    `..` that would climb above the root is refused outright (no real
//!    layer has one; one that tries is malicious).
//! 2. [`resolve_dir`] walks the parent directories on disk one component at
//!    a time, never handing the kernel a path with a symlink in it: each
//!    symlink met is read and its target spliced in, an absolute target
//!    restarting at the root and `..` stopping at the root, as `chroot(2)`
//!    would resolve it. A loop is cut after [`MAX_LINKS`] symlinks.
//!
//! The last component of an entry is never resolved: what is there is
//! replaced (or, for a whiteout, removed) without being followed.
//!
//! This is safe against symlinks planted by earlier entries because the
//! unpacker is the only writer of the staging tree (a fresh directory
//! readable only by root), so nothing changes between the check and the use.

use std::collections::{HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use crate::error::ImageError;

/// How many symlinks one resolution may follow (Linux's own limit).
pub const MAX_LINKS: usize = 40;

fn unsafe_path(path: &Path, reason: &str) -> ImageError {
    ImageError::UnsafePath {
        path: path.to_string_lossy().into_owned(),
        reason: reason.to_string(),
    }
}

/// Normalize an entry name to its components below the root (empty for the
/// root itself). Refuses `..` above the root.
pub fn clean_entry_path(raw: &Path) -> Result<Vec<OsString>, ImageError> {
    let mut out: Vec<OsString> = Vec::new();
    for c in raw.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Prefix(_) => return Err(unsafe_path(raw, "it has a path prefix")),
            Component::ParentDir => {
                if out.pop().is_none() {
                    return Err(unsafe_path(raw, "it climbs above the image root with '..'"));
                }
            }
            Component::Normal(s) => out.push(s.to_os_string()),
        }
    }
    Ok(out)
}

/// Resolve the directory named by `comps` inside `root`, following symlinks
/// within the root (see the module doc). Returns the path relative to the
/// root, free of symlinks. Missing directories are created (mode 0755)
/// when `created` is given, and recorded in it; otherwise a missing one
/// yields `Ok(None)`.
pub fn resolve_dir(
    root: &Path,
    entry: &Path,
    comps: &[OsString],
    mut created: Option<&mut HashSet<PathBuf>>,
) -> Result<Option<PathBuf>, ImageError> {
    let mut pending: VecDeque<OsString> = comps.iter().cloned().collect();
    let mut cur = PathBuf::new();
    let mut links = 0;
    while let Some(c) = pending.pop_front() {
        if c.is_empty() || c == "." {
            continue;
        }
        if c == ".." {
            // As in a chroot: the root's parent is the root.
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        let abs = root.join(&next);
        match fs::symlink_metadata(&abs) {
            Ok(m) if m.is_dir() => cur = next,
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(unsafe_path(
                        entry,
                        "too many levels of symbolic links in its parent directories (a symlink loop)",
                    ));
                }
                let target =
                    fs::read_link(&abs).map_err(|e| entry_err(entry, "reading a symlink", e))?;
                if target.is_absolute() {
                    cur = PathBuf::new();
                }
                for tc in target.components().rev() {
                    match tc {
                        Component::Normal(s) => pending.push_front(s.to_os_string()),
                        Component::ParentDir => pending.push_front(OsString::from("..")),
                        Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                    }
                }
            }
            Ok(_) => {
                return Err(entry_err(
                    entry,
                    &format!("{} is not a directory", next.display()),
                    io::Error::from_raw_os_error(libc::ENOTDIR),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(created) = created.as_deref_mut() else {
                    return Ok(None);
                };
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&abs)
                    .map_err(|e| entry_err(entry, "creating a parent directory", e))?;
                created.insert(next.clone());
                cur = next;
            }
            Err(e) => return Err(entry_err(entry, "inspecting a parent directory", e)),
        }
    }
    Ok(Some(cur))
}

/// Split cleaned components into the parent's and the last one.
pub fn split_last(comps: &[OsString]) -> Option<(&[OsString], &OsStr)> {
    comps.split_last().map(|(l, p)| (p, l.as_os_str()))
}

pub(crate) fn entry_err(entry: &Path, what: &str, source: io::Error) -> ImageError {
    ImageError::Entry {
        path: entry.to_string_lossy().into_owned(),
        what: what.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn comps(s: &str) -> Vec<OsString> {
        clean_entry_path(Path::new(s)).unwrap()
    }

    #[test]
    fn cleaning() {
        assert_eq!(comps("/etc/./passwd"), ["etc", "passwd"]);
        assert_eq!(comps("./a/b/../c/"), ["a", "c"]);
        assert!(comps("./").is_empty());
        for bad in ["../x", "a/../../x", "/../etc", ".."] {
            let e = clean_entry_path(Path::new(bad)).unwrap_err();
            assert!(matches!(e, ImageError::UnsafePath { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        symlink("/", root.join("top")).unwrap();
        symlink("../../../../..", root.join("up")).unwrap();
        symlink(t.path(), root.join("out")).unwrap();
        let r = |s: &str| {
            resolve_dir(&root, Path::new(s), &comps(s), None)
                .unwrap()
                .unwrap()
        };
        assert_eq!(r("bin"), Path::new("usr/bin"));
        assert_eq!(r("top/bin"), Path::new("usr/bin"));
        assert_eq!(r("up/usr"), Path::new("usr"));
        assert_eq!(r("usr/bin/../../up/bin"), Path::new("usr/bin"));
        // An absolute symlink to the host's directory of the root is taken
        // as a path inside the root: it does not exist there.
        let s = "out/x";
        assert!(resolve_dir(&root, Path::new(s), &comps(s), None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn loops_are_cut() {
        let t = tempfile::tempdir().unwrap();
        symlink("b", t.path().join("a")).unwrap();
        symlink("a", t.path().join("b")).unwrap();
        symlink("self/x", t.path().join("self")).unwrap();
        for s in ["a/x", "self/y"] {
            let e = resolve_dir(t.path(), Path::new(s), &comps(s), None).unwrap_err();
            assert!(e.to_string().contains("symlink loop"), "{e}");
        }
    }

    #[test]
    fn missing_parents_are_created_and_files_refused() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("f"), b"").unwrap();
        let mut created = HashSet::new();
        let got = resolve_dir(
            t.path(),
            Path::new("a/b"),
            &comps("a/b"),
            Some(&mut created),
        );
        assert_eq!(got.unwrap().unwrap(), Path::new("a/b"));
        assert!(created.contains(Path::new("a")) && created.contains(Path::new("a/b")));
        let e = resolve_dir(t.path(), Path::new("f/x"), &comps("f/x"), None).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }
}
