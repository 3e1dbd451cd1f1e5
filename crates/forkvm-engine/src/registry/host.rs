//! This host as the compatibility rule sees it (forkvm_artifact::compat),
//! and a cache of file digests and chunk lists keyed by file identity.
//!
//! The cache lives in `$FORKVM_HOME/cache/artifact/`: one JSON file per
//! entry, named by what it is of (`file-<identity>` for a whole-file
//! SHA-256, `chunks-<identity>-<chunk size>` for a chunk list). A file's
//! identity is its device, inode, size, and mtime and ctime in nanoseconds,
//! so any write makes a new key and a stale entry is never used; entries are
//! written to a temporary name and renamed, so a crash leaves none half
//! written. Hashing a 2 GiB root disk takes about a second: this is why.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use forkvm_artifact::chunk;
use forkvm_artifact::compat::HostProfile;
use forkvm_artifact::FileEntry;

use crate::error::EngineError;
use crate::manager::Manager;

fn identity(p: &Path) -> Result<String, EngineError> {
    let m = std::fs::metadata(p)
        .map_err(|e| EngineError::internal(format!("cannot read {}: {e}", p.display())))?;
    Ok(format!(
        "{:x}-{:x}-{}-{}.{}-{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

fn cache_dir(home: &Path) -> PathBuf {
    home.join("cache").join("artifact")
}

fn load<T: serde::de::DeserializeOwned>(p: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

fn save<T: serde::Serialize>(p: &Path, v: &T) {
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    let ok = p.parent().map(std::fs::create_dir_all).is_some()
        && std::fs::write(&tmp, serde_json::to_vec(v).unwrap_or_default()).is_ok()
        && std::fs::rename(&tmp, p).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The hex SHA-256 of a file, cached by identity (blocking).
pub fn file_sha256(home: &Path, p: &Path) -> Result<String, EngineError> {
    let c = cache_dir(home).join(format!("file-{}", identity(p)?));
    if let Some(d) = load::<String>(&c) {
        return Ok(d);
    }
    let d = chunk::hash_file(p).map_err(|e| EngineError::internal(e.to_string()))?;
    save(&c, &d);
    Ok(d)
}

/// Record a file's SHA-256, known from elsewhere (a pull checked it), so the
/// next look-up does not read the file again.
pub fn remember_sha256(home: &Path, p: &Path, sha256: &str) {
    if let Ok(id) = identity(p) {
        save(
            &cache_dir(home).join(format!("file-{id}")),
            &sha256.to_string(),
        );
    }
}

/// A file's chunk list, cached by identity (blocking). `progress(done,
/// total)` sees the bytes read when it is computed.
pub fn chunks(
    home: &Path,
    p: &Path,
    name: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FileEntry, EngineError> {
    let c = cache_dir(home).join(format!("chunks-{}-{}", identity(p)?, chunk::CHUNK));
    if let Some(mut e) = load::<FileEntry>(&c) {
        e.name = name.to_string();
        return Ok(e);
    }
    let e = chunk::index_file(p, name, chunk::CHUNK, progress)
        .map_err(|e| EngineError::internal(e.to_string()))?;
    save(&c, &e);
    save(
        &cache_dir(home).join(format!("file-{}", identity(p)?)),
        &e.sha256,
    );
    Ok(e)
}

/// The CPU vendor and flags from `/proc/cpuinfo` (first processor).
pub fn cpu() -> (String, Vec<String>) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let mut flags: Vec<String> = field("flags")
        .split_whitespace()
        .map(String::from)
        .collect();
    flags.sort();
    (field("vendor_id"), flags)
}

/// The machine types of `qemu` (`-machine help`).
pub async fn machine_types(qemu: &Path) -> Vec<String> {
    let out = tokio::process::Command::new(qemu)
        .args(["-machine", "help"])
        .output()
        .await;
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// What a host with this configuration, accelerator (`kvm`/`tcg`) and QEMU
/// (`--version` line) offers a pulled snapshot. Shared by the daemon's pulls
/// and `forkvm doctor`.
pub async fn profile(
    cfg: &crate::config::Config,
    accel: &str,
    qemu: &str,
) -> Result<HostProfile, EngineError> {
    let (vendor, flags) = cpu();
    let home = cfg.home.clone();
    let (k, i) = (cfg.kernel(), cfg.initrd());
    let (ks, is) = tokio::task::spawn_blocking(move || {
        Ok::<_, EngineError>((file_sha256(&home, &k)?, file_sha256(&home, &i)?))
    })
    .await
    .map_err(|e| EngineError::internal(e.to_string()))??;
    Ok(HostProfile {
        arch: std::env::consts::ARCH.to_string(),
        qemu: qemu.to_string(),
        machine_types: machine_types(&cfg.qemu).await,
        cpu_model: if accel == "kvm" { "host" } else { "max" }.into(),
        cpu_vendor: vendor,
        cpu_flags: if accel == "kvm" { flags } else { Vec::new() },
        accel: accel.to_string(),
        kernel_sha256: ks,
        initrd_sha256: is,
    })
}

impl Manager {
    /// What this host offers a pulled snapshot.
    pub async fn host_profile(&self) -> Result<HostProfile, EngineError> {
        profile(&self.cfg, &self.accel.accel.to_string(), &self.qemu_version).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_cached_by_identity_and_a_write_invalidates_them() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"one").unwrap();
        let a = file_sha256(d.path(), &f).unwrap();
        assert_eq!(a, chunk::hash_file(&f).unwrap());
        assert_eq!(file_sha256(d.path(), &f).unwrap(), a);
        std::thread::sleep(std::time::Duration::from_millis(5));
        std::fs::write(&f, b"two").unwrap();
        let b = file_sha256(d.path(), &f).unwrap();
        assert_ne!(a, b);
        assert_eq!(b, chunk::hash_file(&f).unwrap());
        // A corrupt cache entry is recomputed, not trusted.
        for e in std::fs::read_dir(cache_dir(d.path())).unwrap().flatten() {
            std::fs::write(e.path(), b"{not json").unwrap();
        }
        assert_eq!(file_sha256(d.path(), &f).unwrap(), b);
    }

    #[test]
    fn the_cpu_is_read() {
        let (vendor, flags) = cpu();
        assert!(
            !vendor.is_empty() && flags.iter().any(|f| f == "fpu"),
            "{vendor} {flags:?}"
        );
    }
}
