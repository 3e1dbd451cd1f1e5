//! The blob store: content-addressed, verified, shared by every image.
//!
//! ```text
//! <root>/sha256/<64 hex>     a complete, verified blob (mode 0444)
//! <root>/ingest/<name>       a blob being written (never read as a blob)
//! ```
//!
//! The discipline is containerd's content store: a writer streams into the
//! ingest area while hashing, the file is fsynced, its digest is compared
//! with the one it was announced under, and only a match is renamed to
//! `sha256/<hex>`. A blob that is already present counts as written. So an
//! interrupted or corrupt download never becomes visible, and two images
//! that share a layer store (and fetch) it once.
//!
//! # Garbage collection and leases
//!
//! A blob no installed image has as a layer is garbage ([`BlobStore::gc`]),
//! except while an install in flight may still use it: a pull or import
//! works through a [`BlobStore::leased`] store, which *claims* every digest
//! it looks at (checks for, reads, writes) before touching it, and holds
//! the claims until the store and all its clones are dropped, after the
//! image is installed or the install failed. `gc` removes only unclaimed
//! blobs, and decides under the same lock that claims take, so:
//!
//! * a blob found cached, being written or just published by a concurrent
//!   install is never removed under it, whichever image it ends up in;
//! * a claim made while `gc` runs waits for it, and then finds the blob
//!   gone and fetches it again, as for any missing blob;
//! * the images that protect blobs are read inside that lock too, so an
//!   install that publishes its image and drops its lease just before is
//!   seen as an image, and one that drops it just after is seen as a claim.
//!
//! The claims live in this process. A daemon that was killed leaves only
//! unclaimed blobs, which the next start's `gc` removes.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use sha2::{Digest as _, Sha256};

/// A blob store error.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("{0:?} is not a sha256 digest (expected sha256:<64 lowercase hex digits>)")]
    BadDigest(String),
    #[error("blob {expected} failed verification: its content hashes to {actual}; the source is corrupt or was tampered with")]
    Mismatch { expected: String, actual: String },
    #[error("blob {digest} is {actual} bytes, but {expected} were announced")]
    SizeMismatch {
        digest: String,
        expected: u64,
        actual: u64,
    },
    #[error("blob {0} is not in the store")]
    Missing(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> BlobError {
    let what = what.into();
    move |source| BlobError::Io { what, source }
}

/// Split `sha256:<hex>` into its hex part, checking its form (the hex part
/// becomes a file name, so nothing else may pass).
pub fn digest_hex(digest: &str) -> Result<&str, BlobError> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| BlobError::BadDigest(digest.to_string()))?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(BlobError::BadDigest(digest.to_string()));
    }
    Ok(hex)
}

/// The `sha256:<hex>` digest of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A content-addressed blob store rooted at a directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
    /// Set on a [`BlobStore::leased`] store: the digests it claimed.
    lease: Option<Arc<Lease>>,
}

/// How many leases claim each (store root, digest), in this process.
type Claims = HashMap<(PathBuf, String), usize>;

static CLAIMS: LazyLock<Mutex<Claims>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn claims() -> MutexGuard<'static, Claims> {
    CLAIMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The digests one leased store (and its clones) claimed.
#[derive(Debug)]
struct Lease {
    root: PathBuf,
    held: Mutex<HashSet<String>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let held = std::mem::take(self.held.get_mut().unwrap_or_else(|e| e.into_inner()));
        let mut c = claims();
        for d in held {
            let key = (self.root.clone(), d);
            if let Some(n) = c.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    c.remove(&key);
                }
            }
        }
    }
}

/// Tells when a leased store and all its clones are gone, with them its
/// claims: a blocking writer task may outlive the install that started it,
/// and collecting before it ends would keep its blobs.
#[derive(Debug, Clone)]
pub struct LeaseWatch(Weak<Lease>);

impl LeaseWatch {
    pub fn released(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// What [`BlobStore::gc`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GcStats {
    pub blobs: u64,
    pub bytes: u64,
}

static INGEST_SEQ: AtomicU64 = AtomicU64::new(0);

impl BlobStore {
    /// Open (creating if needed) the store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, BlobError> {
        let root = root.into();
        for d in ["sha256", "ingest"] {
            fs::create_dir_all(root.join(d))
                .map_err(io_err(format!("creating {}", root.join(d).display())))?;
        }
        Ok(BlobStore { root, lease: None })
    }

    /// The same store, claiming every digest it touches until it and all
    /// its clones are dropped (see the module doc). What a pull or import
    /// works with.
    pub fn leased(&self) -> BlobStore {
        BlobStore {
            root: self.root.clone(),
            lease: Some(Arc::new(Lease {
                root: self.root.clone(),
                held: Mutex::new(HashSet::new()),
            })),
        }
    }

    /// For a leased store: a watch on its lease (see [`LeaseWatch`]).
    pub fn lease_watch(&self) -> Option<LeaseWatch> {
        self.lease.as_ref().map(|l| LeaseWatch(Arc::downgrade(l)))
    }

    fn claim(&self, digest: &str) {
        let Some(l) = &self.lease else {
            return;
        };
        let mut held = l.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.insert(digest.to_string()) {
            *claims()
                .entry((self.root.clone(), digest.to_string()))
                .or_insert(0) += 1;
        }
    }

    /// Removes every blob that is not in `keep` and that no leased store
    /// claims. `keep` (the layers of the installed images) is evaluated
    /// with claims frozen, so that no install slips between it and the
    /// removal (see the module doc).
    pub fn gc(&self, keep: impl FnOnce() -> HashSet<String>) -> GcStats {
        let c = claims();
        let keep = keep();
        let mut st = GcStats::default();
        for d in self.list() {
            if keep.contains(&d) || c.contains_key(&(self.root.clone(), d.clone())) {
                continue;
            }
            // Not `path`: it would claim, and the claims are locked here.
            let Ok(p) = digest_hex(&d).map(|h| self.root.join("sha256").join(h)) else {
                continue;
            };
            let size = fs::metadata(&p).map_or(0, |m| m.len());
            if fs::remove_file(&p).is_ok() {
                st.blobs += 1;
                st.bytes += size;
            }
        }
        st
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob with this digest lives (whether or not it is there).
    pub fn path(&self, digest: &str) -> Result<PathBuf, BlobError> {
        let p = self.root.join("sha256").join(digest_hex(digest)?);
        // Every use of a blob (has, open, read, put, publish) goes
        // through here: a leased store claims it first.
        self.claim(digest);
        Ok(p)
    }

    /// Whether the blob is present.
    pub fn has(&self, digest: &str) -> bool {
        self.path(digest).map(|p| p.is_file()).unwrap_or(false)
    }

    /// Open a present blob for reading.
    pub fn open_blob(&self, digest: &str) -> Result<File, BlobError> {
        let p = self.path(digest)?;
        File::open(&p).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                BlobError::Missing(digest.to_string())
            } else {
                BlobError::Io {
                    what: format!("opening {}", p.display()),
                    source: e,
                }
            }
        })
    }

    /// Read a present blob whole (for manifests and configs: small).
    pub fn read(&self, digest: &str) -> Result<Vec<u8>, BlobError> {
        let mut v = Vec::new();
        self.open_blob(digest)?
            .read_to_end(&mut v)
            .map_err(io_err(format!("reading blob {digest}")))?;
        Ok(v)
    }

    /// Start writing a blob announced as `digest` (and `size`, if known).
    pub fn writer(&self, digest: &str, size: Option<u64>) -> Result<BlobWriter, BlobError> {
        digest_hex(digest)?;
        self.claim(digest);
        let name = format!(
            "{}-{}-{}",
            std::process::id(),
            INGEST_SEQ.fetch_add(1, Ordering::Relaxed),
            &digest["sha256:".len().."sha256:".len() + 12]
        );
        let path = self.root.join("ingest").join(name);
        let file = File::create(&path).map_err(io_err(format!("creating {}", path.display())))?;
        Ok(BlobWriter {
            store: self.clone(),
            digest: digest.to_string(),
            size,
            path,
            file: Some(file),
            hasher: Sha256::new(),
            written: 0,
            published: false,
        })
    }

    /// Copy a reader into the store as `digest`, verifying it. Returns the
    /// number of bytes. A blob already present is not read again.
    pub fn put(&self, digest: &str, size: Option<u64>, mut r: impl Read) -> Result<u64, BlobError> {
        if self.has(digest) {
            return Ok(fs::metadata(self.path(digest)?)
                .map(|m| m.len())
                .unwrap_or(0));
        }
        let mut w = self.writer(digest, size)?;
        io::copy(&mut r, &mut w).map_err(io_err(format!("writing blob {digest}")))?;
        w.commit()
    }

    /// Store bytes whose digest is computed here (for configs and manifests
    /// forkvm writes itself). Returns the digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<String, BlobError> {
        let d = sha256_digest(bytes);
        self.put(&d, Some(bytes.len() as u64), bytes)?;
        Ok(d)
    }

    /// Remove leftovers of interrupted writes (call when nothing writes).
    pub fn clean_ingest(&self) {
        if let Ok(rd) = fs::read_dir(self.root.join("ingest")) {
            for e in rd.flatten() {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// The digests of every blob present.
    pub fn list(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.root.join("sha256"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .map(|h| format!("sha256:{h}"))
            .filter(|d| digest_hex(d).is_ok())
            .collect();
        v.sort();
        v
    }

    /// Delete a blob (GC of blobs no image references).
    pub fn remove(&self, digest: &str) -> Result<(), BlobError> {
        let p = self.path(digest)?;
        match fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(BlobError::Io {
                what: format!("removing {}", p.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

/// A blob being written. Dropped without [`BlobWriter::commit`], its ingest
/// file is removed and nothing becomes visible.
pub struct BlobWriter {
    store: BlobStore,
    digest: String,
    size: Option<u64>,
    path: PathBuf,
    file: Option<File>,
    hasher: Sha256,
    written: u64,
    published: bool,
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let f = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("blob writer already finished"))?;
        let n = f.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

impl BlobWriter {
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Verify size and digest, then publish. Returns the size.
    pub fn commit(mut self) -> Result<u64, BlobError> {
        let file = self.file.take().expect("commit consumes the writer");
        if let Some(want) = self.size {
            if want != self.written {
                return Err(BlobError::SizeMismatch {
                    digest: self.digest.clone(),
                    expected: want,
                    actual: self.written,
                });
            }
        }
        let actual = format!("sha256:{:x}", self.hasher.clone().finalize());
        if actual != self.digest {
            return Err(BlobError::Mismatch {
                expected: self.digest.clone(),
                actual,
            });
        }
        file.sync_all()
            .map_err(io_err(format!("syncing {}", self.path.display())))?;
        drop(file);
        let _ = fs::set_permissions(&self.path, fs::Permissions::from_mode(0o444));
        let dest = self.store.path(&self.digest)?;
        fs::rename(&self.path, &dest).map_err(io_err(format!("publishing {}", dest.display())))?;
        self.published = true;
        if let Ok(d) = File::open(dest.parent().unwrap_or(Path::new("."))) {
            let _ = d.sync_all();
        }
        Ok(self.written)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // Whatever failed or was abandoned, the ingest file goes.
        if !self.published {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_verifies_and_publishes() {
        let t = tempfile::tempdir().unwrap();
        let s = BlobStore::open(t.path()).unwrap();
        let d = sha256_digest(b"hello");
        assert!(!s.has(&d));
        assert_eq!(s.put(&d, Some(5), &b"hello"[..]).unwrap(), 5);
        assert!(s.has(&d));
        assert_eq!(s.read(&d).unwrap(), b"hello");
        assert_eq!(s.list(), vec![d.clone()]);
        // Present: counts as written, the reader is not consumed.
        assert_eq!(s.put(&d, None, &b"ignored"[..]).unwrap(), 5);
    }

    #[test]
    fn corrupt_blob_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let s = BlobStore::open(t.path()).unwrap();
        let d = sha256_digest(b"hello");
        let e = s.put(&d, None, &b"hellO"[..]).unwrap_err();
        assert!(matches!(e, BlobError::Mismatch { .. }), "{e}");
        assert!(!s.has(&d));
        assert_eq!(fs::read_dir(t.path().join("ingest")).unwrap().count(), 0);
    }

    #[test]
    fn wrong_size_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let s = BlobStore::open(t.path()).unwrap();
        let d = sha256_digest(b"hello");
        let e = s.put(&d, Some(4), &b"hello"[..]).unwrap_err();
        assert!(matches!(e, BlobError::SizeMismatch { .. }), "{e}");
        assert!(!s.has(&d));
    }

    #[test]
    fn bad_digests_are_refused() {
        for d in [
            "sha256:../../etc/passwd",
            "md5:abc",
            "sha256:ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789",
            "sha256:",
        ] {
            assert!(matches!(digest_hex(d), Err(BlobError::BadDigest(_))), "{d}");
        }
    }

    #[test]
    fn gc_removes_unreferenced_blobs_but_not_claimed_ones() {
        let t = tempfile::tempdir().unwrap();
        let s = BlobStore::open(t.path()).unwrap();
        let kept = s.put_bytes(b"layer of an image").unwrap();
        let junk = s.put_bytes(b"left by a failed import").unwrap();
        // An install in flight: one blob found cached, one being written.
        let live = s.leased();
        let cached = s.put_bytes(b"cached, about to be used").unwrap();
        assert!(live.has(&cached));
        let mut w = live.writer(&sha256_digest(b"new"), None).unwrap();
        w.write_all(b"new").unwrap();
        let keep = || HashSet::from([kept.clone()]);
        let st = s.gc(keep);
        assert_eq!(
            st,
            GcStats {
                blobs: 1,
                bytes: 23
            }
        );
        assert!(s.has(&kept) && s.has(&cached) && !s.has(&junk));
        // Published while gc ran: claimed, so kept; a clone keeps the lease.
        w.commit().unwrap();
        let clone = live.clone();
        let watch = live.lease_watch().unwrap();
        drop(live);
        assert_eq!(s.gc(keep).blobs, 0);
        assert!(!watch.released());
        // The install failed: its lease goes, and so do its blobs.
        drop(clone);
        assert!(watch.released());
        assert_eq!(s.gc(keep).blobs, 2);
        assert_eq!(s.list(), vec![kept.clone()]);
        // Two leases on one blob: it stays until both are gone.
        let (a, b) = (s.leased(), s.leased());
        let shared = a.put_bytes(b"shared").unwrap();
        assert!(b.has(&shared));
        drop(a);
        assert_eq!(s.gc(keep).blobs, 0);
        drop(b);
        assert_eq!(s.gc(keep).blobs, 1);
    }

    #[test]
    fn dropped_writer_removes_ingest_file() {
        let t = tempfile::tempdir().unwrap();
        let s = BlobStore::open(t.path()).unwrap();
        let mut w = s.writer(&sha256_digest(b"x"), None).unwrap();
        w.write_all(b"x").unwrap();
        drop(w);
        assert_eq!(fs::read_dir(t.path().join("ingest")).unwrap().count(), 0);
    }
}
