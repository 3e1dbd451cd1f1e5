//! Filesystem requests: `fs_stat`, `fs_exists`, `fs_list`, `fs_mkdir`,
//! `fs_move` and `fs_remove` (envd's `filesystem` service).
//!
//! Entries are described from `lstat`, so a symlink is reported as itself
//! (with its target) and is never followed when listing or removing. The
//! permission string is Go's `FileMode.String()`, which is what envd
//! clients display.

use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use forkvm_agent_protocol::caps::MAX_LIST_ENTRIES;
use forkvm_agent_protocol::{EntryInfo, FileKind, ERR_INVALID, ERR_IO, ERR_TOO_LARGE};

use crate::files::{absolute, io_err};
use crate::serve::ReqError;
use crate::users;

fn err(code: &'static str, message: impl Into<String>) -> ReqError {
    ReqError {
        code,
        message: message.into(),
    }
}

/// User and group names by id, from the guest's /etc (read once per
/// request: a listing names many entries).
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    pub fn load(etc: &Path) -> Names {
        let text = |name| {
            users::read_etc(etc, name)
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        Names {
            users: users::parse_passwd(&text("passwd"))
                .into_iter()
                .map(|p| (p.uid, p.name))
                .collect(),
            groups: users::parse_group(&text("group"))
                .into_iter()
                .map(|g| (g.gid, g.name))
                .collect(),
        }
    }

    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Go's `FileMode.String()` for a unix mode: type letters from
/// "dalTLDpSugct?" (those that apply, `-` if none), then `rwxrwxrwx`.
pub fn permissions(meta: &Metadata) -> String {
    let ft = meta.file_type();
    let mode = meta.mode();
    let mut s = String::new();
    let flags = [
        (ft.is_dir(), 'd'),
        (ft.is_symlink(), 'L'),
        (ft.is_block_device() || ft.is_char_device(), 'D'),
        (ft.is_fifo(), 'p'),
        (ft.is_socket(), 'S'),
        (mode & 0o4000 != 0, 'u'),
        (mode & 0o2000 != 0, 'g'),
        (ft.is_char_device(), 'c'),
        (mode & 0o1000 != 0, 't'),
    ];
    s.extend(flags.iter().filter(|f| f.0).map(|f| f.1));
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// Describe `path` (already lstat-ed as `meta`).
pub fn entry(path: &Path, meta: &Metadata, names: &Names) -> EntryInfo {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let symlink_target = ft
        .is_symlink()
        .then(|| fs::read_link(path).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    EntryInfo {
        name: path.file_name().map_or_else(
            || path.to_string_lossy().into_owned(),
            |n| n.to_string_lossy().into_owned(),
        ),
        kind,
        path: path.to_string_lossy().into_owned(),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        permissions: permissions(meta),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        modified_ns: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        symlink_target,
    }
}

fn lstat(path: &Path) -> Result<Metadata, ReqError> {
    fs::symlink_metadata(path).map_err(|e| io_err("stat", path, &e))
}

pub fn stat(path: &str, etc: &Path) -> Result<EntryInfo, ReqError> {
    let p = absolute(path)?;
    Ok(entry(p, &lstat(p)?, &Names::load(etc)))
}

/// Whether `path` exists (a dangling symlink does).
pub fn exists(path: &str) -> Result<bool, ReqError> {
    let p = absolute(path)?;
    match fs::symlink_metadata(p) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
        Err(e) => Err(io_err("stat", p, &e)),
    }
}

/// The entries under directory `path` (which may be a symlink to one),
/// `depth` levels deep (0 counts as 1), in lexical pre-order. Symlinks are
/// listed, not followed; subdirectories that cannot be read are skipped.
pub fn list(path: &str, depth: u32, etc: &Path) -> Result<Vec<EntryInfo>, ReqError> {
    let root = absolute(path)?;
    let meta = fs::metadata(root).map_err(|e| io_err("stat", root, &e))?;
    if !meta.is_dir() {
        return Err(err(ERR_INVALID, format!("{path} is not a directory")));
    }
    let names = Names::load(etc);
    let mut out = Vec::new();
    walk(root, depth.max(1), &names, &mut out, true)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    depth: u32,
    names: &Names,
    out: &mut Vec<EntryInfo>,
    top: bool,
) -> Result<(), ReqError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if top => return Err(io_err("list", dir, &e)),
        Err(_) => return Ok(()),
    };
    let mut children: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
    children.sort();
    for child in children {
        let Ok(meta) = fs::symlink_metadata(&child) else {
            continue; // removed meanwhile
        };
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(err(
                ERR_TOO_LARGE,
                format!("more than {MAX_LIST_ENTRIES} entries: list less deep"),
            ));
        }
        out.push(entry(&child, &meta, names));
        if meta.is_dir() && depth > 1 {
            walk(&child, depth - 1, names, out, false)?;
        }
    }
    Ok(())
}

/// `mkdir -p`; returns the entry and whether the directory existed.
pub fn mkdir(path: &str, etc: &Path) -> Result<(EntryInfo, bool), ReqError> {
    let p = absolute(path)?;
    let existed = match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => true,
        Ok(_) => {
            return Err(err(
                ERR_INVALID,
                format!("{path} exists and is not a directory"),
            ))
        }
        Err(_) => false,
    };
    fs::create_dir_all(p).map_err(|e| io_err("create", p, &e))?;
    Ok((entry(p, &lstat(p)?, &Names::load(etc)), existed))
}

/// rename(2) `source` to `destination`; returns the destination's entry.
pub fn rename(source: &str, destination: &str, etc: &Path) -> Result<EntryInfo, ReqError> {
    let (s, d) = (absolute(source)?, absolute(destination)?);
    fs::rename(s, d).map_err(|e| match e.raw_os_error() {
        Some(libc::EXDEV) => err(
            ERR_IO,
            format!("cannot move {source} to {destination}: they are on different filesystems"),
        ),
        _ if e.kind() == io::ErrorKind::NotFound => io_err("move", s, &e),
        _ => err(
            ERR_IO,
            format!("cannot move {source} to {destination}: {e}"),
        ),
    })?;
    Ok(entry(d, &lstat(d)?, &Names::load(etc)))
}

/// `rm -r` without following symlinks. `/` is refused.
pub fn remove(path: &str) -> Result<(), ReqError> {
    let p = absolute(path)?;
    if p.parent().is_none() {
        return Err(err(ERR_INVALID, "refusing to remove /"));
    }
    let r = if lstat(p)?.is_dir() {
        fs::remove_dir_all(p)
    } else {
        fs::remove_file(p)
    };
    r.map_err(|e| io_err("remove", p, &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn permission_strings_match_go() {
        let d = temp_dir("fsops-perm");
        let f = d.join("f");
        fs::write(&f, b"x").unwrap();
        let check = |p: &Path, mode: u32, want: &str| {
            fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(permissions(&fs::symlink_metadata(p).unwrap()), want);
        };
        check(&f, 0o644, "-rw-r--r--");
        check(&f, 0o4755, "urwxr-xr-x");
        check(&d, 0o1777, "dtrwxrwxrwx");
        check(&d, 0o755, "drwxr-xr-x");
        std::os::unix::fs::symlink("f", d.join("l")).unwrap();
        let l = fs::symlink_metadata(d.join("l")).unwrap();
        assert_eq!(permissions(&l), "Lrwxrwxrwx");
        let null = fs::symlink_metadata("/dev/null").unwrap();
        assert_eq!(permissions(&null), "Dcrw-rw-rw-");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn names_fall_back_to_ids() {
        let d = temp_dir("fsops-names");
        fs::write(d.join("passwd"), "app:x:1000:1001::/home/app:/bin/sh\n").unwrap();
        fs::write(d.join("group"), "grp:x:1001:\n").unwrap();
        let n = Names::load(&d);
        assert_eq!((n.user(1000), n.group(1001)), ("app".into(), "grp".into()));
        assert_eq!((n.user(7), n.group(8)), ("7".into(), "8".into()));
        fs::remove_dir_all(&d).unwrap();
    }
}
