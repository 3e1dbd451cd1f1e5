//! `get_archive`: several files at once, as a tar (the inverse of
//! `put_archive`; see `forkvm_agent_protocol::caps`).

use std::fs::{self, Metadata};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use forkvm_agent_protocol::tar::{Meta, Writer};
use forkvm_agent_protocol::{ERR_INVALID, ERR_TOO_LARGE, MAX_PAYLOAD};

use crate::files::{absolute, io_err};
use crate::serve::ReqError;

/// A built archive.
pub struct Archive {
    pub tar: Vec<u8>,
    pub entries: u64,
    pub bytes: u64,
}

struct Builder {
    w: Writer,
    entries: u64,
    bytes: u64,
    limit: u64,
}

fn meta(m: &Metadata) -> Meta {
    Meta {
        mode: m.mode() & 0o7777,
        uid: m.uid().into(),
        gid: m.gid().into(),
        mtime: m.mtime(),
        dev: (0, 0),
    }
}

impl Builder {
    fn room(&self, more: u64) -> Result<(), ReqError> {
        // Headers and padding: about one block per entry, plus the data.
        let size = self.w.bytes().len() as u64 + more + 1024;
        if size > self.limit {
            return Err(ReqError {
                code: ERR_TOO_LARGE,
                message: format!(
                    "the archive would exceed {} bytes: download fewer files at a time",
                    self.limit
                ),
            });
        }
        Ok(())
    }

    fn add(&mut self, path: &Path) -> Result<(), ReqError> {
        let m = fs::symlink_metadata(path).map_err(|e| io_err("read", path, &e))?;
        let name = path.to_string_lossy();
        let name = name.trim_start_matches('/');
        let ft = m.file_type();
        if ft.is_dir() {
            self.room(0)?;
            if !name.is_empty() {
                self.w.dir(name, &meta(&m));
                self.entries += 1;
            }
            let mut children: Vec<_> = fs::read_dir(path)
                .map_err(|e| io_err("list", path, &e))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .collect();
            children.sort();
            for c in children {
                self.add(&c)?;
            }
        } else if ft.is_symlink() {
            self.room(0)?;
            let target = fs::read_link(path).map_err(|e| io_err("read", path, &e))?;
            self.w.symlink(name, &target.to_string_lossy(), &meta(&m));
            self.entries += 1;
        } else if ft.is_file() {
            self.room(m.len())?;
            let mut data = Vec::new();
            fs::File::open(path)
                .and_then(|f| f.take(m.len()).read_to_end(&mut data))
                .map_err(|e| io_err("read", path, &e))?;
            self.w.file(name, &meta(&m), &data);
            self.entries += 1;
            self.bytes += data.len() as u64;
        }
        Ok(())
    }
}

/// A tar of `paths`, at most `max_bytes` (and [`MAX_PAYLOAD`]) long.
pub fn get_archive(paths: &[String], max_bytes: Option<u64>) -> Result<Archive, ReqError> {
    if paths.is_empty() {
        return Err(ReqError {
            code: ERR_INVALID,
            message: "no paths to download".into(),
        });
    }
    let mut b = Builder {
        w: Writer::new(),
        entries: 0,
        bytes: 0,
        limit: max_bytes.unwrap_or(u64::MAX).min(MAX_PAYLOAD.into()),
    };
    for p in paths {
        // Members are named by the path asked for; a `..` in it would put
        // `..` in their names (the daemon refuses these too, and rewrites
        // every name it gets: the agent is not trusted with that).
        if p.split('/').any(|c| c == "..") {
            return Err(ReqError {
                code: ERR_INVALID,
                message: format!("path {p:?} has a `..` component: name the directory itself"),
            });
        }
        b.add(absolute(p)?)?;
    }
    Ok(Archive {
        tar: b.w.finish(),
        entries: b.entries,
        bytes: b.bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_dotdot_are_refused() {
        for p in ["/tmp/../etc", "/..", "/a/.."] {
            match get_archive(&[p.to_string()], None) {
                Err(e) => assert_eq!(e.code, ERR_INVALID, "{p}: {}", e.message),
                Ok(_) => panic!("{p} was archived"),
            }
        }
        // `..` inside a name is just a name.
        let a = get_archive(&["/proc/self/..x-absent".to_string()], None);
        assert!(a.is_err_and(|e| e.code != ERR_INVALID));
    }
}
