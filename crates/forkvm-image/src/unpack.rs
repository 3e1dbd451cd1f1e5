//! Applying a layer tar onto a staging root, with OCI/AUFS semantics.
//!
//! A layer is a tar (plain, gzip or zstd; told apart by magic bytes) of the
//! files it adds or changes, plus markers for what it deletes:
//!
//! * `dir/.wh.<name>` (a whiteout) deletes `<name>` of a lower layer;
//!   when the same layer also has `dir/<name>/` (before or after the
//!   whiteout), the directory stays with this layer's entries only;
//! * `dir/.wh..wh..opq` (an opaque marker) deletes everything lower layers
//!   put in `dir`, keeping what this layer puts there, wherever in the tar
//!   the marker comes;
//! * other `.wh..wh.*` names are AUFS bookkeeping and are skipped.
//!
//! An entry replaces whatever is at its path (a file over a directory, a
//! directory over a file, anything over a symlink), except that a directory
//! over a directory keeps the contents and takes the new metadata, as
//! Docker does. Files, directories, symlinks, hardlinks (also to files of
//! lower layers), character and block devices and fifos are made here (the
//! `tar` crate only parses), with their owner, mode (setuid, setgid and
//! sticky bits included), mtime and the xattrs of PAX `SCHILY.xattr.*`
//! records (`security.capability` among them). Order matters: ownership
//! first (chown clears setuid bits and capabilities), then mode, then
//! xattrs. Directory mtimes are set when the layer is done, since adding
//! children changes them.
//!
//! Path safety (the input is untrusted and this runs as root) is in
//! [`crate::safepath`]: names are confined to the root, parents resolved
//! like in a chroot, and the last component never followed.

use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tar::EntryType;

use crate::error::ImageError;
use crate::safepath::{clean_entry_path, entry_err, resolve_dir, split_last};

/// A layer's compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Tell by the first bytes.
    Auto,
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// What the first bytes of a stream say (gzip `1f 8b`, zstd
    /// `28 b5 2f fd`, otherwise plain).
    pub fn detect(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Wrap a reader in the decompressor it needs; `Auto` peeks at the first
/// bytes (and puts them back).
pub fn decompress<'a>(mut r: impl Read + 'a, c: Compression) -> io::Result<Box<dyn Read + 'a>> {
    let mut head = Vec::with_capacity(4);
    (&mut r).take(4).read_to_end(&mut head)?;
    let c = match c {
        Compression::Auto => Compression::detect(&head),
        c => c,
    };
    let r = io::Cursor::new(head).chain(r);
    Ok(match c {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(r)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(r)?),
        Compression::None | Compression::Auto => Box::new(r),
    })
}

/// What one layer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerStats {
    pub entries: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    /// Character and block devices and fifos.
    pub devices: u64,
    /// Whiteouts and opaque markers.
    pub whiteouts: u64,
    /// Bytes of regular file content written.
    pub bytes: u64,
    /// Entries of types that have no place in a root filesystem (sockets,
    /// PAX global headers, unknown types), skipped as Docker skips them.
    pub skipped: u64,
}

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Apply one layer tar onto `root` (see the module doc).
pub fn apply_layer(
    root: &Path,
    layer: impl Read,
    compression: Compression,
) -> Result<LayerStats, ImageError> {
    let malformed = |e: io::Error| ImageError::Malformed {
        what: "the layer tar".into(),
        reason: e.to_string(),
    };
    // Buffered: the tar reader asks for 512-byte headers one at a time.
    let layer = io::BufReader::with_capacity(1 << 20, layer);
    let mut ar = tar::Archive::new(decompress(layer, compression).map_err(malformed)?);
    let mut ap = Applier {
        root,
        created: HashSet::new(),
        ancestors: HashSet::new(),
        dir_times: Vec::new(),
        stats: LayerStats::default(),
    };
    for entry in ar.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        ap.stats.entries += 1;
        ap.apply(&mut entry)?;
    }
    // Parents' times last: setting a child's changes its parent's mtime.
    for (rel, t) in ap.dir_times.iter().rev() {
        match set_mtime(&root.join(rel), *t) {
            // Replaced later in the layer by something else: nothing to do.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            r => r.map_err(|e| entry_err(rel, "setting the mtime", e))?,
        }
    }
    Ok(ap.stats)
}

/// Metadata of an entry, read before its data.
struct Meta {
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: i64,
    xattrs: Vec<(OsString, Vec<u8>)>,
}

struct Applier<'a> {
    root: &'a Path,
    /// Paths (relative, symlink-free) this layer made: opaque markers and
    /// whiteouts must spare them.
    created: HashSet<PathBuf>,
    /// The directories above those: spared too, though their lower
    /// contents are not (an opaque marker may come after `d/sub/new` of a
    /// `d/sub` this layer did not list).
    ancestors: HashSet<PathBuf>,
    dir_times: Vec<(PathBuf, i64)>,
    stats: LayerStats,
}

impl Applier<'_> {
    fn apply<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let raw = entry
            .path()
            .map_err(|e| ImageError::Malformed {
                what: "a layer entry's name".into(),
                reason: e.to_string(),
            })?
            .into_owned();
        let etype = entry.header().entry_type();
        if matches!(
            etype,
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName
        ) {
            self.stats.skipped += 1;
            return Ok(());
        }
        let comps = clean_entry_path(&raw)?;
        let Some((parent, name)) = split_last(&comps) else {
            // The root itself: its owner and mode are forkvm's to set.
            if etype.is_dir() {
                return Ok(());
            }
            return Err(ImageError::UnsafePath {
                path: raw.to_string_lossy().into_owned(),
                reason: "a non-directory entry names the image root".into(),
            });
        };
        if let Some(target) = name.as_bytes().strip_prefix(WHITEOUT.as_bytes()) {
            return self.whiteout(&raw, parent, name, OsStr::from_bytes(target));
        }
        let meta = read_meta(entry).map_err(|e| ImageError::Malformed {
            what: format!("layer entry {raw:?}"),
            reason: e.to_string(),
        })?;
        // Asked to create missing parents, resolve_dir always finds one.
        let dir =
            resolve_dir(self.root, &raw, parent, Some(&mut self.created))?.unwrap_or_default();
        let rel = dir.join(name);
        let abs = self.root.join(&rel);
        let existing = fs::symlink_metadata(&abs).ok();
        let err = |what: &str| {
            let raw = raw.clone();
            let what = what.to_string();
            move |e: io::Error| entry_err(&raw, &what, e)
        };
        match etype {
            EntryType::Directory => {
                if !existing.as_ref().is_some_and(|m| m.is_dir()) {
                    remove_any(&abs, existing.as_ref()).map_err(err("replacing"))?;
                    fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&abs)
                        .map_err(err("creating the directory"))?;
                }
                set_meta(&abs, &meta, false).map_err(err("setting metadata"))?;
                self.dir_times.push((rel.clone(), meta.mtime));
                self.stats.dirs += 1;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                remove_any(&abs, existing.as_ref()).map_err(err("replacing"))?;
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&abs)
                    .map_err(err("creating the file"))?;
                self.stats.bytes += io::copy(entry, &mut f).map_err(err("writing the file"))?;
                drop(f);
                set_meta(&abs, &meta, false).map_err(err("setting metadata"))?;
                set_mtime(&abs, meta.mtime).map_err(err("setting the mtime"))?;
                self.stats.files += 1;
            }
            EntryType::Symlink => {
                let target = link_name(entry, &raw)?;
                remove_any(&abs, existing.as_ref()).map_err(err("replacing"))?;
                std::os::unix::fs::symlink(&target, &abs).map_err(err("creating the symlink"))?;
                set_meta(&abs, &meta, true).map_err(err("setting metadata"))?;
                set_mtime(&abs, meta.mtime).map_err(err("setting the mtime"))?;
                self.stats.symlinks += 1;
            }
            EntryType::Link => {
                let target = link_name(entry, &raw)?;
                let tabs = self.hardlink_target(&raw, &target)?;
                if tabs != abs {
                    remove_any(&abs, existing.as_ref()).map_err(err("replacing"))?;
                    // linkat without AT_SYMLINK_FOLLOW: a symlink target is
                    // linked itself, never followed.
                    fs::hard_link(&tabs, &abs).map_err(err("creating the hardlink"))?;
                }
                self.stats.hardlinks += 1;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let kind = match etype {
                    EntryType::Char => libc::S_IFCHR,
                    EntryType::Block => libc::S_IFBLK,
                    _ => libc::S_IFIFO,
                };
                let h = entry.header();
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                remove_any(&abs, existing.as_ref()).map_err(err("replacing"))?;
                mknod(&abs, kind | 0o600, libc::makedev(major, minor))
                    .map_err(err("creating the device node"))?;
                set_meta(&abs, &meta, false).map_err(err("setting metadata"))?;
                set_mtime(&abs, meta.mtime).map_err(err("setting the mtime"))?;
                self.stats.devices += 1;
            }
            _ => {
                self.stats.skipped += 1;
                return Ok(());
            }
        }
        self.mark(rel);
        Ok(())
    }

    fn mark(&mut self, rel: PathBuf) {
        let mut up = rel.parent();
        while let Some(p) = up.filter(|p| !p.as_os_str().is_empty()) {
            if !self.ancestors.insert(p.to_path_buf()) {
                break;
            }
            up = p.parent();
        }
        self.created.insert(rel);
    }

    fn made_here(&self, rel: &Path) -> bool {
        self.created.contains(rel) || self.ancestors.contains(rel)
    }

    /// Where a hardlink's target is: inside the root, present, not a
    /// directory.
    fn hardlink_target(&self, raw: &Path, target: &Path) -> Result<PathBuf, ImageError> {
        let tcomps = clean_entry_path(target)?;
        let missing = || ImageError::UnsafePath {
            path: raw.to_string_lossy().into_owned(),
            reason: format!(
                "its hardlink target {:?} is not a file in this or a lower layer",
                target
            ),
        };
        let (tparent, tname) = split_last(&tcomps).ok_or_else(missing)?;
        let tdir = resolve_dir(self.root, raw, tparent, None)?.ok_or_else(missing)?;
        let tabs = self.root.join(tdir.join(tname));
        match fs::symlink_metadata(&tabs) {
            Ok(m) if !m.is_dir() => Ok(tabs),
            _ => Err(missing()),
        }
    }

    fn whiteout(
        &mut self,
        raw: &Path,
        parent: &[OsString],
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(), ImageError> {
        self.stats.whiteouts += 1;
        // Whiteouts never create parents: nothing below is there to hide.
        let Some(dir) = resolve_dir(self.root, raw, parent, None)? else {
            return Ok(());
        };
        if name == OPAQUE {
            return self.opaque(raw, &dir);
        }
        if target.as_bytes().starts_with(WHITEOUT.as_bytes()) {
            // `.wh..wh.plnk` and friends: AUFS's own bookkeeping.
            return Ok(());
        }
        if target.is_empty() || target == "." || target == ".." {
            return Err(ImageError::UnsafePath {
                path: raw.to_string_lossy().into_owned(),
                reason: "a whiteout must name a file".into(),
            });
        }
        let rel = dir.join(target);
        // A whiteout hides lower layers only (OCI image spec): what this
        // layer made at the path stays, but a directory it recreated (or
        // wrote into) loses the lower layers' contents, as if the whiteout
        // had come first in the tar (umoci unpacks so).
        if self.made_here(&rel) {
            let is_dir = fs::symlink_metadata(self.root.join(&rel)).is_ok_and(|m| m.is_dir());
            return if is_dir {
                self.opaque(raw, &rel)
            } else {
                Ok(())
            };
        }
        let abs = self.root.join(&rel);
        let m = fs::symlink_metadata(&abs).ok();
        remove_any(&abs, m.as_ref()).map_err(|e| entry_err(raw, "applying the whiteout", e))
    }

    /// Remove everything under `dir` that this layer did not make, at any
    /// depth.
    fn opaque(&self, raw: &Path, dir: &Path) -> Result<(), ImageError> {
        let err = |e| entry_err(raw, "applying the opaque marker", e);
        for child in fs::read_dir(self.root.join(dir)).map_err(err)? {
            let child = child.map_err(err)?;
            let rel = dir.join(child.file_name());
            let abs = child.path();
            let m = fs::symlink_metadata(&abs).map_err(err)?;
            if !self.made_here(&rel) {
                remove_any(&abs, Some(&m)).map_err(err)?;
            } else if m.is_dir() {
                self.opaque(raw, &rel)?;
            }
        }
        Ok(())
    }
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>, raw: &Path) -> Result<PathBuf, ImageError> {
    match entry.link_name() {
        Ok(Some(l)) if !l.as_os_str().is_empty() => Ok(l.into_owned()),
        Ok(_) => Err(ImageError::Malformed {
            what: format!("layer entry {raw:?}"),
            reason: "a link without a target".into(),
        }),
        Err(e) => Err(ImageError::Malformed {
            what: format!("layer entry {raw:?}"),
            reason: e.to_string(),
        }),
    }
}

fn read_meta<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Meta> {
    let h = entry.header();
    let to32 = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| io::Error::other(format!("{what} {v} is out of range")))
    };
    let mut meta = Meta {
        uid: to32(h.uid()?, "uid")?,
        gid: to32(h.gid()?, "gid")?,
        mode: h.mode()? & 0o7777,
        mtime: h.mtime().map(|t| t as i64).unwrap_or(0),
        xattrs: Vec::new(),
    };
    if let Some(pax) = entry.pax_extensions()? {
        for ext in pax {
            let ext = ext?;
            let Ok(key) = ext.key() else { continue };
            if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                meta.xattrs
                    .push((OsString::from(name), ext.value_bytes().to_vec()));
            } else if key == "mtime" {
                // PAX times are decimal seconds, maybe with a fraction.
                let v = ext.value().unwrap_or("");
                if let Ok(t) = v.split('.').next().unwrap_or("").parse::<i64>() {
                    meta.mtime = t;
                }
            }
        }
    }
    Ok(meta)
}

/// Remove what is at `abs` (never following a symlink), if anything.
fn remove_any(abs: &Path, existing: Option<&fs::Metadata>) -> io::Result<()> {
    match existing {
        None => Ok(()),
        // remove_dir_all does not follow symlinks inside the tree.
        Some(m) if m.is_dir() => fs::remove_dir_all(abs),
        Some(_) => fs::remove_file(abs),
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Owner, then mode (chown clears setuid), then xattrs (chown clears
/// `security.capability`). Symlinks get owner and xattrs only.
fn set_meta(abs: &Path, meta: &Meta, symlink: bool) -> io::Result<()> {
    std::os::unix::fs::lchown(abs, Some(meta.uid), Some(meta.gid))?;
    if !symlink {
        fs::set_permissions(abs, fs::Permissions::from_mode(meta.mode))?;
    }
    for (name, value) in &meta.xattrs {
        if let Err(e) = xattr::set(abs, name, value) {
            // A host without SELinux may refuse its labels; they mean
            // nothing to the guest either.
            if name == "security.selinux" {
                continue;
            }
            return Err(io::Error::new(
                e.kind(),
                format!("setting xattr {}: {e}", name.to_string_lossy()),
            ));
        }
    }
    Ok(())
}

fn set_mtime(abs: &Path, mtime: i64) -> io::Result<()> {
    let p = cpath(abs)?;
    let t = libc::timespec {
        tv_sec: mtime as libc::time_t,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: `p` is a valid NUL-terminated path and `times` two timespecs,
    // as utimensat requires; AT_SYMLINK_NOFOLLOW keeps symlinks unfollowed.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mknod(abs: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let p = cpath(abs)?;
    // SAFETY: `p` is a valid NUL-terminated path; mknod reads nothing else.
    if unsafe { libc::mknod(p.as_ptr(), mode, dev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
