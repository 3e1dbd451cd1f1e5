//! The snapshot store: immutable snapshots on disk, published atomically.
//!
//! ```text
//! $FORKVM_HOME/snapshots/
//!   <id>/manifest.fvs     the manifest (see [`manifest`]): ids, machine, digests
//!   <id>/memory.img       guest RAM, sparse (zero pages are holes)
//!   <id>/memory.diff      or, for a diff snapshot, the pages it changed over
//!                         its parent (see [`memdiff`])
//!   <id>/device.state     QEMU device state (a migration stream without RAM)
//!   <id>/memory.head      a diff snapshot's RAM flattened for its clones: a
//!                         cache built at its first spawn, not an artefact
//!                         (see [`head`])
//!   <id>/disk.qcow2       the frozen disk layer (its backing file is the
//!                         image or the parent's layer)
//!   <id>/disk.qcow2       alone, no manifest: a frozen layer whose snapshot
//!                         is not published (yet, or ever); a disk chain may
//!                         name it, so only layer collection deletes it
//!   .tmp-<id>/            a snapshot being written: never listed
//!   .trash-<id>/          a snapshot being deleted: never listed
//! ```
//!
//! Publication follows the content-store discipline: every file is written
//! into `.tmp-<id>/`, fsynced and made read-only, the manifest (which carries
//! every file's SHA-256) is written last, the directory is fsynced, and only
//! then is it renamed to `<id>/` and the parent directory fsynced. A crash at
//! any point leaves either no snapshot or a complete one; the daemon deletes
//! leftover `.tmp-*` and `.trash-*` directories when it starts.
//!
//! **A frozen disk layer is different**: the source's new top layer names it
//! by path from the moment the disk is frozen, long before the snapshot is
//! published. So it is put at its final path, `<id>/disk.qcow2`, *before*
//! anything can name it ([`Store::reserve_layer`]), and it never moves
//! again. Such a snapshot is published into that directory: its other files
//! are renamed in, and the manifest, renamed in last, is what makes it
//! visible. A crash before that leaves `<id>/` without a manifest, which is
//! never listed; at start its files other than the layer are removed
//! ([`Store::sweep`]), and the layer stays until no chain names it
//! ([`Store::collect_layers`]). Nothing the sweep deletes is ever named by a
//! disk chain.
//!
//! Verification at spawn is cheap on purpose. The manifest and the device
//! state (kilobytes) are hashed every time. The memory image and disk layer
//! (hundreds of MiB) are hashed once, and the result is cached against the
//! file's identity (device, inode, size, mtime and ctime in nanoseconds).
//! Any write to a file changes its mtime/ctime, so tampering through the
//! filesystem is caught at the next spawn, while a spawn of a verified
//! snapshot never re-reads its memory.

pub mod crash;
pub mod head;
pub mod manifest;
pub mod memdiff;
pub mod splice;
pub mod splice_disk;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub use manifest::{
    Artefact, MachineConfig, Manifest, ManifestError, ParentRef, SnapVolume, VOLUMES_DIR,
};

/// The manifest file name.
pub const MANIFEST: &str = "manifest.fvs";
pub const MEMORY: &str = "memory.img";
pub const DEVICE_STATE: &str = "device.state";
/// The pages a diff snapshot changed over its parent (see [`memdiff`]).
pub const MEMORY_DIFF: &str = "memory.diff";
pub const DISK: &str = "disk.qcow2";
/// Files up to this size are re-hashed on every verification.
pub const SMALL_FILE: u64 = 1 << 20;

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no snapshot {0:?}")]
    NotFound(String),
    #[error("snapshot {id} is corrupted: {why}; remove it with `forkvm snapshot rm {id}` and take it again")]
    Corrupt { id: String, why: String },
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A published snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// SHA-256 of the manifest file.
    pub digest: String,
}

impl Snapshot {
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A diff snapshot's stored pages: `memory.diff`, or the file a splice
    /// wrote (crate::splice), as its manifest names it.
    pub fn memory_diff_path(&self) -> PathBuf {
        let file = self
            .manifest
            .artefact("memory_diff")
            .map_or(MEMORY_DIFF, |a| a.file.as_str());
        self.dir.join(file)
    }

    /// Is this the snapshot a child recorded as its parent with the
    /// manifest digest `digest`? Its manifest is that one, or replaced it
    /// when a link below was spliced out ([`Manifest::supersedes`]).
    pub fn answers_to(&self, digest: &str) -> bool {
        self.digest == digest || self.manifest.supersedes.iter().any(|d| d == digest)
    }
}

/// A file's identity for the verification cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

fn file_key(m: &std::fs::Metadata) -> FileKey {
    FileKey {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
    }
}

/// The snapshot store rooted at a directory.
pub struct Store {
    root: PathBuf,
    verified: Mutex<HashMap<FileKey, String>>,
    /// Ids whose frozen layer is reserved by a snapshot in progress: their
    /// directories have no manifest yet, but are not orphans.
    reserved: Arc<Mutex<HashSet<String>>>,
}

/// A snapshot being written.
pub struct Staging {
    pub id: String,
    pub dir: PathBuf,
    /// `<id>/`, once a frozen disk layer is reserved there.
    layer_dir: Option<PathBuf>,
    reserved: Arc<Mutex<HashSet<String>>>,
}

impl Staging {
    /// Where the snapshot's `file` is written: in the staging directory,
    /// but for a reserved disk layer, which is at its final path already.
    pub fn path(&self, file: &str) -> PathBuf {
        match &self.layer_dir {
            Some(d) if file == DISK => d.join(DISK),
            _ => self.dir.join(file),
        }
    }

    /// Undo [`Store::reserve_layer`]: for a snapshot that failed before its
    /// layer was frozen, when nothing names the layer (the overlay naming it
    /// is deleted first).
    pub fn discard_layer(&mut self) {
        if let Some(d) = self.layer_dir.take() {
            let _ = std::fs::remove_dir_all(&d);
            self.unreserve();
        }
    }

    fn unreserve(&self) {
        if let Ok(mut r) = self.reserved.lock() {
            r.remove(&self.id);
        }
    }
}

impl Drop for Staging {
    /// A staging directory that was not published is removed. A reserved
    /// layer stays (a chain may name it: layer collection decides), and
    /// whatever publication had already moved beside it goes.
    fn drop(&mut self) {
        if self.dir.exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        if let Some(d) = self.layer_dir.take() {
            if !d.join(MANIFEST).exists() {
                trim_to_layer(&d);
            }
            self.unreserve();
        }
    }
}

/// Remove everything in a snapshot directory without a manifest but its
/// disk layer (the directory too, if it has none). Returns whether anything
/// is left.
fn trim_to_layer(d: &Path) -> bool {
    let mut layer = false;
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.file_name() == DISK {
            layer = true;
            continue;
        }
        let _ = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(e.path())
        } else {
            std::fs::remove_file(e.path())
        };
    }
    if !layer {
        let _ = std::fs::remove_dir(d);
    }
    layer
}

impl Store {
    /// Open (creating) the store and delete what crashed writers left.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(root).map_err(io(root))?;
        let store = Store {
            root: root.to_path_buf(),
            verified: Mutex::new(HashMap::new()),
            reserved: Arc::new(Mutex::new(HashSet::new())),
        };
        store.sweep();
        Ok(store)
    }

    /// Delete what crashed writers left (`.tmp-*` and `.trash-*`, and in a
    /// snapshot directory without a manifest every file but its disk layer,
    /// which a chain may name); returns the entries that could not be
    /// deleted. A writer of the crashed
    /// daemon may outlive it (a QEMU still saving into a staging
    /// directory), so a removal that races with a file being created is
    /// retried a few times, and the daemon sweeps again once it has dealt
    /// with the old daemon's QEMUs.
    pub fn sweep(&self) -> Vec<String> {
        let mut left = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return left;
        };
        let reserved = self.reserved_ids();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                let d = e.path();
                if d.is_dir() && !d.join(MANIFEST).exists() && !reserved.contains(&name) {
                    trim_to_layer(&d);
                }
                continue;
            }
            if !(name.starts_with(".tmp-") || name.starts_with(".trash-")) {
                continue;
            }
            // A file is a head built ahead of its snapshot (crate::head).
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            let gone = (0..10).any(|i| {
                if i > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                let r = if is_dir {
                    std::fs::remove_dir_all(e.path())
                } else {
                    std::fs::remove_file(e.path())
                };
                match r {
                    Ok(()) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                }
            });
            if !gone {
                left.push(name);
            }
        }
        left
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory a published snapshot lives in.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Start writing a snapshot.
    pub fn begin(&self, id: &str) -> Result<Staging, StoreError> {
        let dir = self.root.join(format!(".tmp-{id}"));
        std::fs::create_dir(&dir).map_err(io(&dir))?;
        Ok(Staging {
            id: id.to_string(),
            dir,
            layer_dir: None,
            reserved: self.reserved.clone(),
        })
    }

    /// Put the disk layer a snapshot is about to freeze, `layer` (a running
    /// sandbox's top file), at its final path in the store, `<id>/disk.qcow2`,
    /// as a hard link, and return that path. Called before anything names
    /// the path (the new top layer's header does), so a file a chain names
    /// always exists; the link is the same file, so what the source writes
    /// until the freeze is in it. Until the snapshot is published or the
    /// staging dropped, the directory is no collection candidate.
    pub fn reserve_layer(&self, st: &mut Staging, layer: &Path) -> Result<PathBuf, StoreError> {
        let d = self.dir(&st.id);
        if let Ok(mut r) = self.reserved.lock() {
            r.insert(st.id.clone());
        }
        std::fs::create_dir(&d).map_err(io(&d))?;
        st.layer_dir = Some(d.clone());
        let disk = d.join(DISK);
        std::fs::hard_link(layer, &disk).map_err(io(&disk))?;
        // The link must outlive a host crash as long as a header naming it.
        fsync_dir(&d)?;
        fsync_dir(&self.root)?;
        Ok(disk)
    }

    fn reserved_ids(&self) -> HashSet<String> {
        self.reserved.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Publish a staged snapshot: hash each artefact, write the manifest,
    /// fsync everything, and rename into place (for a reserved layer: rename
    /// each file into the layer's directory, the manifest last).
    pub fn publish(
        &self,
        staging: Staging,
        mut manifest: Manifest,
    ) -> Result<Snapshot, StoreError> {
        for a in &mut manifest.artefacts {
            let p = staging.path(&a.file);
            let f = File::open(&p).map_err(io(&p))?;
            f.sync_all().map_err(io(&p))?;
            let m = f.metadata().map_err(io(&p))?;
            a.size = m.size();
            a.allocated = m.blocks() * 512;
            a.sha256 = hash_file(&p)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).map_err(io(&p))?;
            self.remember(&p, &a.sha256);
        }
        crash::point("store.hashed");
        let bytes = manifest.encode();
        let mp = staging.path(MANIFEST);
        {
            let mut f = File::create(&mp).map_err(io(&mp))?;
            f.write_all(&bytes).map_err(io(&mp))?;
            f.sync_all().map_err(io(&mp))?;
        }
        std::fs::set_permissions(&mp, std::fs::Permissions::from_mode(0o444)).map_err(io(&mp))?;
        fsync_dir(&staging.dir)?;
        crash::point("store.manifest_written");
        let dest = self.dir(&staging.id);
        match &staging.layer_dir {
            None => std::fs::rename(&staging.dir, &dest).map_err(io(&dest))?,
            Some(d) => {
                // The layer is in place: the rest joins it, the manifest
                // last, and that rename is what publishes the snapshot.
                for e in std::fs::read_dir(&staging.dir).map_err(io(&staging.dir))? {
                    let e = e.map_err(io(&staging.dir))?;
                    if e.file_name() == MANIFEST {
                        continue;
                    }
                    let to = d.join(e.file_name());
                    std::fs::rename(e.path(), &to).map_err(io(&to))?;
                }
                fsync_dir(d)?;
                crash::point("store.files_moved");
                let to = d.join(MANIFEST);
                std::fs::rename(&mp, &to).map_err(io(&to))?;
                fsync_dir(d)?;
                crash::point("store.committed");
                let _ = std::fs::remove_dir(&staging.dir);
            }
        }
        fsync_dir(&self.root)?;
        // The verification cache is keyed by inode, which a rename keeps.
        Ok(Snapshot {
            dir: dest,
            manifest,
            digest: Manifest::digest(&bytes),
        })
    }

    /// Open a published snapshot and check its manifest (not its artefacts).
    pub fn open_snapshot(&self, id: &str) -> Result<Snapshot, StoreError> {
        let dir = self.dir(id);
        let mp = dir.join(MANIFEST);
        let bytes = match std::fs::read(&mp) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(id.to_string()))
            }
            Err(e) => return Err(io(&mp)(e)),
        };
        let manifest = Manifest::decode(&bytes).map_err(|e| StoreError::Corrupt {
            id: id.to_string(),
            why: e.to_string(),
        })?;
        if manifest.id != id {
            return Err(StoreError::Corrupt {
                id: id.to_string(),
                why: format!("its manifest names snapshot {:?}", manifest.id),
            });
        }
        Ok(Snapshot {
            dir,
            digest: Manifest::digest(&bytes),
            manifest,
        })
    }

    /// Check every artefact against its recorded size and SHA-256 (large
    /// files only when they changed since they were last verified).
    pub fn verify(&self, s: &Snapshot) -> Result<(), StoreError> {
        let corrupt = |why: String| StoreError::Corrupt {
            id: s.manifest.id.clone(),
            why,
        };
        for a in &s.manifest.artefacts {
            let p = s.path(&a.file);
            let m = std::fs::metadata(&p)
                .map_err(|e| corrupt(format!("{} is unreadable: {e}", a.file)))?;
            if m.size() != a.size {
                return Err(corrupt(format!(
                    "{} is {} bytes, the manifest says {}",
                    a.file,
                    m.size(),
                    a.size
                )));
            }
            let key = file_key(&m);
            let cached = self.verified.lock().ok().and_then(|c| c.get(&key).cloned());
            // Small files are re-hashed every time (it costs microseconds);
            // large ones only when their identity changed.
            if cached.as_deref() == Some(a.sha256.as_str()) && a.size > SMALL_FILE {
                continue;
            }
            let got = hash_file(&p)?;
            if got != a.sha256 {
                return Err(corrupt(format!("{} does not match its SHA-256", a.file)));
            }
            if let Ok(mut c) = self.verified.lock() {
                c.insert(key, got);
            }
        }
        Ok(())
    }

    fn remember(&self, p: &Path, digest: &str) {
        if let (Ok(m), Ok(mut c)) = (std::fs::metadata(p), self.verified.lock()) {
            c.insert(file_key(&m), digest.to_string());
        }
    }

    /// The ids of all published snapshots (directories with a manifest).
    pub fn ids(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .filter(|n| self.dir(n).join(MANIFEST).is_file())
            .collect();
        v.sort();
        v
    }

    /// Delete a snapshot. The manifest goes first, so the snapshot
    /// disappears at once; then its memory (image or diff, and a diff's
    /// flattened head) and device state. Its disk layer
    /// stays where it is, because qcow2 headers of other layers (the source's
    /// current disk, later snapshots of the same source) may name it by path;
    /// [`Store::collect_layers`] deletes it once nothing does.
    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        let dir = self.dir(id);
        let mp = dir.join(MANIFEST);
        if !mp.exists() {
            return Err(StoreError::NotFound(id.to_string()));
        }
        // A spliced link's memory file has a name of its own
        // (crate::splice): what the manifest names goes too.
        let named: Vec<String> = self
            .open_snapshot(id)
            .map(|s| s.manifest.artefacts.into_iter().map(|a| a.file).collect())
            .unwrap_or_default();
        std::fs::remove_file(&mp).map_err(io(&mp))?;
        for f in named
            .iter()
            .filter(|f| f.as_str() != DISK && !f.contains('/'))
        {
            let _ = std::fs::remove_file(dir.join(f));
        }
        let head_tmp_stamp = format!("{}.stamp", head::TMP);
        for f in [
            MEMORY,
            MEMORY_DIFF,
            DEVICE_STATE,
            head::STAMP,
            head::HEAD,
            head::TMP,
            &head_tmp_stamp,
        ] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        if !dir.join(DISK).exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    }

    /// Directories left holding only a disk layer: of a removed snapshot,
    /// or of one that failed or crashed after its disk was frozen. Not those
    /// reserved by a snapshot in progress.
    pub fn orphan_layers(&self) -> Vec<PathBuf> {
        let reserved = self.reserved_ids();
        std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| !reserved.contains(&*e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .filter(|d| d.is_dir() && !d.join(MANIFEST).exists())
            .collect()
    }

    /// Delete the `candidates` (orphan layers listed *before* the roots
    /// were scanned) that no file in `referenced` (every layer some live disk
    /// chain goes through) names. Returns what was deleted. A layer that
    /// became orphan during the scan is not a candidate: a chain created
    /// during the scan may go through it unseen.
    pub fn collect_layers(
        &self,
        candidates: &[PathBuf],
        referenced: &std::collections::HashSet<PathBuf>,
    ) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        for d in candidates {
            if d.join(MANIFEST).exists() {
                continue;
            }
            let disk = d.join(DISK);
            if disk.exists() && referenced.contains(&disk) {
                continue;
            }
            if std::fs::remove_dir_all(d).is_ok() {
                gone.push(d.clone());
            }
        }
        gone
    }
}

fn fsync_dir(p: &Path) -> Result<(), StoreError> {
    File::open(p).and_then(|f| f.sync_all()).map_err(io(p))
}

/// Hex SHA-256 of a file, streamed.
pub fn hash_file(p: &Path) -> Result<String, StoreError> {
    let mut f = File::open(p).map_err(io(p))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(p))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(manifest::hex(&h.finalize()))
}

/// Copy `src` to `dst` keeping it sparse: only the data extents of `src`
/// (SEEK_DATA/SEEK_HOLE) are read, and all-zero blocks within them are left
/// as holes. Returns the bytes of data written.
pub fn sparse_copy(src: &Path, dst: &Path) -> Result<u64, StoreError> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::io::AsRawFd;
    let mut s = File::open(src).map_err(io(src))?;
    let len = s.metadata().map_err(io(src))?.len();
    let mut d = File::create(dst).map_err(io(dst))?;
    d.set_len(len).map_err(io(dst))?;
    let fd = s.as_raw_fd();
    let mut pos: i64 = 0;
    let mut written = 0u64;
    let mut buf = vec![0u8; 2 << 20];
    let zero = vec![0u8; 4096];
    while (pos as u64) < len {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no more data
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len as i64 } else { hole };
        s.seek(SeekFrom::Start(data as u64)).map_err(io(src))?;
        let mut off = data;
        while off < end {
            let n = ((end - off) as usize).min(buf.len());
            s.read_exact(&mut buf[..n]).map_err(io(src))?;
            // Write only the 4 KiB pages that are not all zero.
            let mut i = 0;
            while i < n {
                let j = (i + 4096).min(n);
                if buf[i..j] != zero[..j - i] {
                    d.seek(SeekFrom::Start((off as usize + i) as u64))
                        .map_err(io(dst))?;
                    d.write_all(&buf[i..j]).map_err(io(dst))?;
                    written += (j - i) as u64;
                }
                i = j;
            }
            off += n as i64;
        }
        pos = end;
    }
    d.sync_all().map_err(io(dst))?;
    Ok(written)
}

#[cfg(test)]
mod tests;
