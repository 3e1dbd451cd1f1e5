//! The `write_file` and `read_file` requests.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use forkvm_agent_protocol::{ERR_INVALID, ERR_IO, ERR_NOT_FOUND, ERR_TOO_LARGE, MAX_PAYLOAD};

use crate::serve::ReqError;

fn err(code: &'static str, message: impl Into<String>) -> ReqError {
    ReqError {
        code,
        message: message.into(),
    }
}

/// Map an I/O error on `path` to a protocol error.
pub(crate) fn io_err(action: &str, path: &Path, e: &io::Error) -> ReqError {
    let p = path.display();
    match e.kind() {
        io::ErrorKind::NotFound => err(ERR_NOT_FOUND, format!("{p} does not exist")),
        _ if e.raw_os_error() == Some(libc::ENOTDIR) => err(
            ERR_NOT_FOUND,
            format!("{p}: a component of the path is not a directory"),
        ),
        _ => err(ERR_IO, format!("cannot {action} {p}: {e}")),
    }
}

pub(crate) fn absolute(path: &str) -> Result<&Path, ReqError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(err(ERR_INVALID, format!("path must be absolute: {path:?}")));
    }
    if path.contains('\0') {
        return Err(err(ERR_INVALID, "path contains a NUL byte"));
    }
    Ok(p)
}

/// Replace `path` with `data` atomically: write a temporary file in the same
/// directory, fsync it, set its mode, then rename it over the target. A
/// reader (or a crash) sees either the old or the new content, never a
/// partial file. Returns the number of bytes written.
pub fn write_file(path: &str, mode: u32, create_dirs: bool, data: &[u8]) -> Result<u64, ReqError> {
    replace_file(absolute(path)?, mode, create_dirs, data)
}

/// [`write_file`] for a path the agent chose itself.
pub fn replace_file(
    path: &Path,
    mode: u32,
    create_dirs: bool,
    data: &[u8],
) -> Result<u64, ReqError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(err(
            ERR_INVALID,
            format!("{} does not name a file", path.display()),
        ));
    };
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(err(
                ERR_INVALID,
                format!("parent {} is not a directory", dir.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound && create_dirs => {
            fs::create_dir_all(dir).map_err(|e| io_err("create directory", dir, &e))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(err(
                ERR_NOT_FOUND,
                format!(
                    "parent directory {} does not exist (set create_dirs to create it)",
                    dir.display()
                ),
            ));
        }
        Err(e) => return Err(io_err("access", dir, &e)),
    }
    let existing = fs::metadata(path).ok();
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(err(
            ERR_INVALID,
            format!("{} is a directory", path.display()),
        ));
    }

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".forkvm-{}-{n}.tmp", std::process::id()));
    let tmp: PathBuf = dir.join(tmp_name);

    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io_err("create", &tmp, &e))?;
        f.write_all(data).map_err(|e| io_err("write", &tmp, &e))?;
        // Keep the owner of a file being replaced (the agent runs as root,
        // so the new inode would otherwise be root's). Before chmod, since
        // chown clears setuid/setgid bits.
        if let Some(m) = &existing {
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
        }
        f.set_permissions(Permissions::from_mode(mode & 0o7777))
            .map_err(|e| io_err("chmod", &tmp, &e))?;
        f.sync_all().map_err(|e| io_err("fsync", &tmp, &e))?;
        fs::rename(&tmp, path).map_err(|e| io_err("rename onto", path, &e))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    // Persist the rename itself; failure here does not undo the write.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(data.len() as u64)
}

/// A file read by `read_file`.
#[derive(Debug)]
pub struct FileData {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Read a regular file of at most `max_bytes` (capped at the frame payload
/// limit).
pub fn read_file(path: &str, max_bytes: u64) -> Result<FileData, ReqError> {
    let path = absolute(path)?;
    let limit = max_bytes.min(u64::from(MAX_PAYLOAD));
    let too_large = |size: &str| {
        err(
            ERR_TOO_LARGE,
            format!("file is {size} bytes, over the limit of {limit} bytes"),
        )
    };
    let meta = fs::metadata(path).map_err(|e| io_err("stat", path, &e))?;
    if meta.is_dir() {
        return Err(err(
            ERR_INVALID,
            format!("{} is a directory", path.display()),
        ));
    }
    if !meta.is_file() {
        // FIFOs could block forever and devices can be endless.
        return Err(err(
            ERR_INVALID,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if meta.len() > limit {
        return Err(too_large(&meta.len().to_string()));
    }
    let f = File::open(path).map_err(|e| io_err("open", path, &e))?;
    // The size from stat is only a hint: the file may have grown since, and
    // /proc and /sys files report 0 or 4096. Read at most one byte past the
    // limit to detect that without reading it all.
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| io_err("read", path, &e))?;
    if data.len() as u64 > limit {
        return Err(too_large(&format!("more than {limit}")));
    }
    Ok(FileData {
        data,
        mode: meta.mode() & 0o7777,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh, empty directory under the system temp dir.
    pub fn temp_dir(tag: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "forkvm-agent-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    #[test]
    fn write_then_read_roundtrip_with_mode() {
        let d = temp_dir("rw");
        let p = d.join("f.bin");
        let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        assert_eq!(write_file(s(&p), 0o751, false, &data).unwrap(), 100_000);
        let got = read_file(s(&p), 1 << 20).unwrap();
        assert_eq!(got.data, data);
        assert_eq!(got.mode, 0o751);
        // Replace with shorter content; no temp files left behind.
        write_file(s(&p), 0o600, false, b"short").unwrap();
        assert_eq!(read_file(s(&p), 100).unwrap().data, b"short");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn parent_dirs() {
        let d = temp_dir("parents");
        let p = d.join("a/b/c.txt");
        let e = write_file(s(&p), 0o644, false, b"x").unwrap_err();
        assert_eq!(e.code, ERR_NOT_FOUND);
        assert!(e.message.contains("does not exist"), "{}", e.message);
        write_file(s(&p), 0o644, true, b"x").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"x");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn read_errors() {
        let d = temp_dir("readerr");
        let p = d.join("big");
        fs::write(&p, vec![0u8; 1000]).unwrap();
        let e = read_file(s(&p), 999).unwrap_err();
        assert_eq!(e.code, ERR_TOO_LARGE);
        assert_eq!(e.message, "file is 1000 bytes, over the limit of 999 bytes");
        assert_eq!(read_file(s(&p), 1000).unwrap().data.len(), 1000);
        assert_eq!(
            read_file(s(&d.join("missing")), 10).unwrap_err().code,
            ERR_NOT_FOUND
        );
        assert_eq!(read_file(s(&d), 10).unwrap_err().code, ERR_INVALID);
        assert_eq!(
            read_file("relative/path", 10).unwrap_err().code,
            ERR_INVALID
        );
        assert_eq!(
            read_file(s(&p.join("x")), 10).unwrap_err().code,
            ERR_NOT_FOUND
        );
        assert_eq!(
            write_file(s(&d), 0o644, false, b"").unwrap_err().code,
            ERR_INVALID
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn proc_files_with_zero_size_are_read() {
        let got = read_file("/proc/self/status", 1 << 20).unwrap();
        assert!(!got.data.is_empty());
        assert_eq!(
            read_file("/proc/self/status", 10).unwrap_err().code,
            ERR_TOO_LARGE
        );
    }
}
