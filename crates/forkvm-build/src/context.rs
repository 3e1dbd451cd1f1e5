//! The build context: `COPY`/`ADD` source resolution, the walk of copied
//! directories, and content hashing for cache keys.
//!
//! Rules, as in Docker:
//!
//! * Sources are relative to the context root; a leading `/` is dropped
//!   (`/app.py` is the context's `app.py`). A source whose `..` leads out
//!   of the context, or that resolves through a symlink to a place outside
//!   it, is an error.
//! * A source with glob characters (`*`, `?`, `[`; syntax as in
//!   [`crate::ignore`]) copies every matching path that `.dockerignore`
//!   does not exclude; no match is an error. A named source that is
//!   excluded is an error too: it is not part of the context.
//! * A directory source copies the directory's *contents* (sorted), with
//!   subdirectories, symlinks (as symlinks, targets unchanged) and empty
//!   directories; paths that `.dockerignore` excludes are left out. Other
//!   kinds of files (sockets, fifos, devices) are skipped with a warning.
//!   A symlink named as a source is followed (inside the context).

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::archive::{ArchiveEntry, EntryKind};
use crate::ignore::{has_glob, segment_matches, Ignore};
use crate::{hex, BuildError};

/// A build context directory and its `.dockerignore`.
#[derive(Debug)]
pub struct Context {
    root: PathBuf,
    ignore: Ignore,
}

/// One resolved source.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// Path relative to the context root as named (`""` is the root).
    pub rel: String,
    /// The real path on the host (symlinks resolved).
    pub host: PathBuf,
    pub is_dir: bool,
}

impl Source {
    /// The last component of the source as named.
    pub fn name(&self) -> &str {
        self.rel.rsplit('/').next().unwrap_or("")
    }
}

impl Context {
    /// Open a context directory and read its `.dockerignore`, if any.
    pub fn open(dir: &Path) -> Result<Context, BuildError> {
        let root = fs::canonicalize(dir).map_err(|e| BuildError::io(dir, e))?;
        let meta = fs::metadata(&root).map_err(|e| BuildError::io(&root, e))?;
        if !meta.is_dir() {
            return Err(BuildError::io(
                &root,
                io::Error::other("the build context must be a directory"),
            ));
        }
        let ig_path = root.join(".dockerignore");
        let ignore = match fs::read_to_string(&ig_path) {
            Ok(text) => Ignore::parse(&text)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ignore::default(),
            Err(e) => return Err(BuildError::io(&ig_path, e)),
        };
        Ok(Context { root, ignore })
    }

    /// The context directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolve one source argument (after variable substitution).
    pub fn sources(&self, src: &str, line: usize) -> Result<Vec<Source>, BuildError> {
        let mut segs: Vec<&str> = Vec::new();
        for s in src.split('/') {
            match s {
                "" | "." => {}
                ".." => {
                    if segs.pop().is_none() {
                        return Err(BuildError::at(
                            line,
                            format!(
                                "source {src:?} is outside the build context {}; only files under it can be copied",
                                self.root.display()
                            ),
                        ));
                    }
                }
                s => segs.push(s),
            }
        }
        if !segs.iter().any(|s| has_glob(s)) {
            let rel = segs.join("/");
            if !rel.is_empty() && self.ignore.excluded(&rel) {
                return Err(BuildError::at(
                    line,
                    format!("source {src:?} is excluded by .dockerignore"),
                ));
            }
            return Ok(vec![self.resolve(&rel, src, line)?]);
        }
        let mut found = Vec::new();
        self.glob(String::new(), &segs, src, line, &mut found)?;
        if found.is_empty() {
            return Err(BuildError::at(
                line,
                format!("no file in the build context matches the source pattern {src:?}"),
            ));
        }
        found.sort_by(|a, b| a.rel.cmp(&b.rel));
        found.dedup_by(|a, b| a.rel == b.rel);
        Ok(found)
    }

    fn glob(
        &self,
        rel: String,
        segs: &[&str],
        src: &str,
        line: usize,
        out: &mut Vec<Source>,
    ) -> Result<(), BuildError> {
        let Some((seg, rest)) = segs.split_first() else {
            if !self.ignore.excluded(&rel) {
                out.push(self.resolve(&rel, src, line)?);
            }
            return Ok(());
        };
        if !has_glob(seg) {
            let next = join(&rel, seg);
            if fs::symlink_metadata(self.root.join(&next)).is_ok() {
                self.glob(next, rest, src, line, out)?;
            }
            return Ok(());
        }
        if !fs::metadata(self.root.join(&rel)).is_ok_and(|m| m.is_dir()) {
            return Ok(());
        }
        let here = self.resolve(&rel, src, line)?;
        if *seg == "**" {
            // Zero directories, then every directory below.
            self.glob(rel.clone(), rest, src, line, out)?;
        }
        for name in sorted_names(&here.host)? {
            let child = join(&rel, &name);
            if *seg == "**" {
                // `**` does not follow symlinked directories, so it never
                // wanders out of the context.
                let dir = fs::symlink_metadata(here.host.join(&name)).is_ok_and(|m| m.is_dir());
                if dir {
                    self.glob(child, segs, src, line, out)?;
                } else if rest.is_empty() {
                    // A trailing `**` matches the files below too.
                    self.glob(child, rest, src, line, out)?;
                }
            } else if segment_matches(seg, &name) {
                self.glob(child, rest, src, line, out)?;
            }
        }
        Ok(())
    }

    /// The real path of a context-relative path, which must stay inside.
    fn resolve(&self, rel: &str, src: &str, line: usize) -> Result<Source, BuildError> {
        let path = self.root.join(rel);
        if let Err(e) = fs::symlink_metadata(&path) {
            return Err(if e.kind() == io::ErrorKind::NotFound {
                BuildError::at(
                    line,
                    format!(
                        "source {src:?} not found in the build context {}",
                        self.root.display()
                    ),
                )
            } else {
                BuildError::io(&path, e)
            });
        }
        let host = match fs::canonicalize(&path) {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BuildError::at(
                    line,
                    format!("source {src:?} is a symlink whose target does not exist"),
                ))
            }
            Err(e) => return Err(BuildError::io(&path, e)),
        };
        if !host.starts_with(&self.root) {
            return Err(BuildError::at(
                line,
                format!(
                    "source {src:?} resolves to {}, outside the build context {}; copy the file into the context instead",
                    host.display(),
                    self.root.display()
                ),
            ));
        }
        let is_dir = fs::metadata(&host)
            .map_err(|e| BuildError::io(&host, e))?
            .is_dir();
        Ok(Source {
            rel: rel.to_string(),
            host,
            is_dir,
        })
    }

    /// Add a file source as the entry `path`, or a directory's contents
    /// under `path` (`""` is the destination itself). `chmod` replaces the
    /// mode of files and directories.
    pub fn collect(
        &self,
        src: &Source,
        path: &str,
        chmod: Option<u32>,
        line: usize,
        out: &mut Vec<ArchiveEntry>,
        warnings: &mut Vec<String>,
    ) -> Result<(), BuildError> {
        if src.is_dir {
            let mut walk = Walk {
                ignore: &self.ignore,
                chmod,
                line,
                warnings,
            };
            walk.dir(&src.host, &src.rel, path, out)
        } else {
            let meta = fs::metadata(&src.host).map_err(|e| BuildError::io(&src.host, e))?;
            out.push(file_entry(&src.host, path, &meta, chmod)?);
            Ok(())
        }
    }
}

struct Walk<'a> {
    ignore: &'a Ignore,
    chmod: Option<u32>,
    line: usize,
    warnings: &'a mut Vec<String>,
}

impl Walk<'_> {
    fn dir(
        &mut self,
        host: &Path,
        rel: &str,
        prefix: &str,
        out: &mut Vec<ArchiveEntry>,
    ) -> Result<(), BuildError> {
        for name in sorted_names(host)? {
            let child_host = host.join(&name);
            let child_rel = join(rel, &name);
            let child_path = join(prefix, &name);
            let excluded = self.ignore.excluded(&child_rel);
            let meta =
                fs::symlink_metadata(&child_host).map_err(|e| BuildError::io(&child_host, e))?;
            let ft = meta.file_type();
            if excluded && !(ft.is_dir() && self.ignore.has_exceptions()) {
                continue;
            }
            if ft.is_dir() {
                let mut inner = Vec::new();
                self.dir(&child_host, &child_rel, &child_path, &mut inner)?;
                // An excluded directory is only kept for what an exception
                // re-includes inside it.
                if !excluded || !inner.is_empty() {
                    let mode = self.chmod.unwrap_or(meta.permissions().mode() & 0o7777);
                    out.push(ArchiveEntry {
                        path: child_path,
                        kind: EntryKind::Dir { mode },
                        mtime: mtime_of(&meta),
                    });
                    out.append(&mut inner);
                }
            } else if ft.is_symlink() {
                let target =
                    fs::read_link(&child_host).map_err(|e| BuildError::io(&child_host, e))?;
                out.push(ArchiveEntry {
                    path: child_path,
                    kind: EntryKind::Symlink {
                        target: target.to_string_lossy().into_owned(),
                    },
                    mtime: mtime_of(&meta),
                });
            } else if ft.is_file() {
                out.push(file_entry(&child_host, &child_path, &meta, self.chmod)?);
            } else {
                self.warnings.push(format!(
                    "line {}: skipped {child_rel:?}: not a regular file, directory or symlink",
                    self.line
                ));
            }
        }
        Ok(())
    }
}

fn file_entry(
    host: &Path,
    path: &str,
    meta: &fs::Metadata,
    chmod: Option<u32>,
) -> Result<ArchiveEntry, BuildError> {
    let (size, sha256) = hash_file(host)?;
    Ok(ArchiveEntry {
        path: path.to_string(),
        kind: EntryKind::File {
            host: host.to_path_buf(),
            mode: chmod.unwrap_or(meta.permissions().mode() & 0o7777),
            size,
            sha256,
        },
        mtime: mtime_of(meta),
    })
}

/// A context entry's mtime, for the archive (before 1970: none).
fn mtime_of(meta: &fs::Metadata) -> Option<u64> {
    u64::try_from(std::os::unix::fs::MetadataExt::mtime(meta)).ok()
}

/// Size and hex sha256 of a file's content.
pub fn hash_file(path: &Path) -> Result<(u64, String), BuildError> {
    let mut f = fs::File::open(path).map_err(|e| BuildError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(BuildError::io(path, e)),
        };
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&h.finalize())))
}

fn sorted_names(dir: &Path) -> Result<Vec<String>, BuildError> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| BuildError::io(dir, e))? {
        let e = e.map_err(|e| BuildError::io(dir, e))?;
        match e.file_name().into_string() {
            Ok(n) => names.push(n),
            Err(raw) => {
                return Err(BuildError::io(
                    dir.join(&raw),
                    io::Error::other(
                        "file name is not UTF-8; rename it or list it in .dockerignore",
                    ),
                ))
            }
        }
    }
    names.sort();
    Ok(names)
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_string()
    } else if b.is_empty() {
        a.to_string()
    } else {
        format!("{a}/{b}")
    }
}

#[cfg(test)]
#[path = "context_tests.rs"]
mod tests;
