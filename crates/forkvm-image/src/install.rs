//! Installed images: making `images/<name>/` from a resolved image, and
//! listing, reading and removing them.
//!
//! ```text
//! images/<name>/rootfs.ext4        the root disk, mode 0444
//! images/<name>/image.json         ImageMeta
//! images/.tmp-<name>-<pid>-<n>/    an install in progress (mode 0700):
//!     rootfs/                      the staging tree the layers go into
//!     rootfs.ext4, image.json      made here, then the directory is renamed
//! images/.trash-<name>-<pid>-<n>/  an image being deleted
//! ```
//!
//! An install applies the layers bottom-up into the staging tree, adds the
//! mount points the guest's init needs (`/dev /proc /sys /tmp /run`), makes
//! the ext4, drops the tree, writes `image.json`, fsyncs, and renames the
//! staging directory to `images/<name>` with `RENAME_NOREPLACE` (so two
//! installs of one name cannot both win), or `RENAME_EXCHANGE` when
//! replacing (so `images/<name>` is never absent). Every failure removes
//! the staging directory. Names starting with `.` are never images, so a
//! crash leaves only hidden leftovers, which [`clean_leftovers`] removes.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::blobs::{BlobStore, GcStats};
use crate::error::{io_err, ImageError};
use crate::ext4::make_ext4;
use crate::meta::{ImageMeta, ImageSource};
use crate::oci::ResolvedImage;
use crate::progress::{Progress, ProgressEvent};
use crate::source::Counting;
use crate::unpack::{apply_layer, Compression};

/// The root disk's file name in an image directory.
pub const ROOTFS: &str = "rootfs.ext4";
/// The metadata file's name in an image directory.
pub const IMAGE_JSON: &str = "image.json";

/// Directories every root filesystem gets (the guest's init mounts on
/// them), with their modes.
const MOUNT_POINTS: &[(&str, u32)] = &[
    ("dev", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("tmp", 0o1777),
    ("run", 0o755),
];

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Whether `name` is a valid image name: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
pub fn valid_image_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

fn check_name(name: &str) -> Result<(), ImageError> {
    if valid_image_name(name) {
        Ok(())
    } else {
        Err(ImageError::BadName(name.to_string()))
    }
}

fn hidden_name(kind: &str, name: &str) -> String {
    format!(
        ".{kind}-{name}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory removed (with whatever is in it) when dropped.
struct Scratch {
    path: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn fsync_dir(p: &Path) -> Result<(), ImageError> {
    fs::File::open(p)
        .and_then(|d| d.sync_all())
        .map_err(io_err(format!("syncing {}", p.display())))
}

/// `renameat2(from, to, flags)`.
fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths; renameat2 reads only them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The choices of an install beyond its source.
#[derive(Debug, Clone, Default)]
pub struct InstallOptions {
    /// Root filesystem size (default: content plus room, see [`crate::ext4`]).
    pub disk_size: Option<u64>,
    /// Swap out an image of the same name (the caller makes sure nothing
    /// uses it: its disk is deleted).
    pub replace: bool,
    /// The start command of the image's boot template.
    pub start: Option<crate::meta::StartSpec>,
}

/// Install an image whose root disk is made by `fill` (given the path to
/// write it to, it returns the filesystem's size), with `meta` as its
/// `image.json` (`size_bytes` and `created_at` are filled in here). The
/// same staging, fsync and atomic publication as [`install_image`]; a
/// Dockerfile build exports its last step's disk this way.
pub fn install_prepared(
    images_dir: &Path,
    mut meta: ImageMeta,
    replace: bool,
    fill: impl FnOnce(&Path) -> Result<u64, ImageError>,
) -> Result<ImageMeta, ImageError> {
    let name = meta.name.clone();
    check_name(&name)?;
    let dest = images_dir.join(&name);
    if !replace && fs::symlink_metadata(&dest).is_ok() {
        return Err(ImageError::Exists(name));
    }
    fs::create_dir_all(images_dir).map_err(io_err(format!("creating {}", images_dir.display())))?;
    let staging = Scratch {
        path: images_dir.join(hidden_name("tmp", &name)),
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging.path)
        .map_err(io_err(format!("creating {}", staging.path.display())))?;
    let disk = staging.path.join(ROOTFS);
    meta.size_bytes = fill(&disk)?;
    meta.created_at = rfc3339(now_secs());
    fs::File::open(&disk)
        .and_then(|f| f.sync_all())
        .map_err(io_err(format!("syncing {}", disk.display())))?;
    fs::set_permissions(&disk, fs::Permissions::from_mode(0o444))
        .map_err(io_err(format!("setting the mode of {}", disk.display())))?;
    write_synced(&staging.path.join(IMAGE_JSON), &meta)?;
    fs::set_permissions(&staging.path, fs::Permissions::from_mode(0o755)).map_err(io_err(
        format!("setting the mode of {}", staging.path.display()),
    ))?;
    fsync_dir(&staging.path)?;
    publish(&staging.path, &dest, &name, replace)?;
    drop(staging);
    fsync_dir(images_dir)?;
    Ok(meta)
}

/// Make `images/<name>` from a resolved image whose layers are in the
/// store (see the module doc). With `replace`, an existing image of that
/// name is swapped out atomically and deleted; callers must make sure no
/// sandbox or snapshot still uses it (their overlays name its root disk).
#[allow(clippy::too_many_arguments)]
pub fn install_image(
    images_dir: &Path,
    name: &str,
    resolved: &ResolvedImage,
    store: &BlobStore,
    source: ImageSource,
    opts: &InstallOptions,
    progress: &dyn Progress,
) -> Result<ImageMeta, ImageError> {
    let (disk_size, replace) = (opts.disk_size, opts.replace);
    check_name(name)?;
    let dest = images_dir.join(name);
    if !replace && fs::symlink_metadata(&dest).is_ok() {
        return Err(ImageError::Exists(name.to_string()));
    }
    for l in &resolved.layers {
        if !store.has(&l.digest) {
            return Err(ImageError::MissingBlob {
                what: "the blob store".into(),
                digest: l.digest.clone(),
            });
        }
    }
    fs::create_dir_all(images_dir).map_err(io_err(format!("creating {}", images_dir.display())))?;
    let staging = Scratch {
        path: images_dir.join(hidden_name("tmp", name)),
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging.path)
        .map_err(io_err(format!("creating {}", staging.path.display())))?;
    let root = staging.path.join("rootfs");
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&root)
        .map_err(io_err(format!("creating {}", root.display())))?;

    progress.event(ProgressEvent::Phase {
        phase: "unpacking".into(),
    });
    for (i, l) in resolved.layers.iter().enumerate() {
        let f = store.open_blob(&l.digest)?;
        let r = Counting::new(f, l.digest.clone(), Some(l.size), progress);
        let st = apply_layer(&root, r, Compression::Auto).map_err(|e| match e {
            ImageError::Malformed { reason, .. } => ImageError::Malformed {
                what: format!("layer {} ({})", i + 1, l.digest),
                reason,
            },
            e => e,
        })?;
        progress.event(ProgressEvent::Log {
            line: format!(
                "layer {}/{}: {} files, {} dirs, {} links, {} whiteouts, {} bytes",
                i + 1,
                resolved.layers.len(),
                st.files,
                st.dirs,
                st.symlinks + st.hardlinks,
                st.whiteouts,
                st.bytes
            ),
        });
    }
    add_mount_points(&root)?;
    if let Some(wd) = resolved.config.working_dir.as_deref() {
        add_working_dir(&root, wd, progress)?;
    }

    progress.event(ProgressEvent::Phase {
        phase: "mkfs".into(),
    });
    let disk = staging.path.join(ROOTFS);
    let size_bytes = make_ext4(&root, &disk, disk_size)?;
    fs::remove_dir_all(&root).map_err(io_err(format!("removing {}", root.display())))?;
    fs::set_permissions(&disk, fs::Permissions::from_mode(0o444))
        .map_err(io_err(format!("setting the mode of {}", disk.display())))?;

    let meta = ImageMeta {
        name: name.to_string(),
        format: "ext4".into(),
        size_bytes,
        created_at: rfc3339(now_secs()),
        source: Some(source),
        digest: resolved.manifest_digest.clone(),
        layers: resolved.layers.iter().map(|l| l.digest.clone()).collect(),
        config: resolved.config.clone(),
        start: opts.start.clone(),
        description: None,
    };
    write_synced(&staging.path.join(IMAGE_JSON), &meta)?;
    fs::set_permissions(&staging.path, fs::Permissions::from_mode(0o755)).map_err(io_err(
        format!("setting the mode of {}", staging.path.display()),
    ))?;
    fsync_dir(&staging.path)?;

    progress.event(ProgressEvent::Phase {
        phase: "installing".into(),
    });
    publish(&staging.path, &dest, name, replace)?;
    // After an exchange the staging path holds the old image: the guard
    // deletes it; after a plain rename it holds nothing.
    drop(staging);
    fsync_dir(images_dir)?;
    Ok(meta)
}

fn publish(staging: &Path, dest: &Path, name: &str, replace: bool) -> Result<(), ImageError> {
    let err = io_err(format!("renaming the new image to {}", dest.display()));
    if replace {
        match rename2(staging, dest, libc::RENAME_EXCHANGE) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
    }
    match rename2(staging, dest, libc::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(ImageError::Exists(name.to_string()))
        }
        Err(e) => Err(err(e)),
    }
}

fn add_mount_points(root: &Path) -> Result<(), ImageError> {
    for (dir, mode) in MOUNT_POINTS {
        let p = root.join(dir);
        match fs::symlink_metadata(&p) {
            // A symlink (say /run -> /var/run) is the image's choice.
            Ok(m) if m.is_dir() || m.file_type().is_symlink() => {}
            Ok(_) => {
                return Err(ImageError::Malformed {
                    what: "the image's root filesystem".into(),
                    reason: format!("/{dir} is not a directory, so the guest cannot boot from it"),
                })
            }
            Err(_) => {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&p)
                    .and_then(|_| fs::set_permissions(&p, fs::Permissions::from_mode(*mode)))
                    .map_err(io_err(format!("creating {}", p.display())))?;
            }
        }
    }
    Ok(())
}

/// Make the config's `WorkingDir` (and its missing parents) when the
/// layers lack it, owned by root with mode 0755, as runc does before the
/// container's process starts (`prepareRootfs` in
/// libcontainer/rootfs_linux.go: `os.MkdirAll(cwd, 0o755)`, as root).
/// Resolved like a layer entry, so a symlink cannot lead it out of the
/// root. A path that is a file is left alone: the image's commands then
/// fail saying so, as Docker's do.
fn add_working_dir(root: &Path, wd: &str, progress: &dyn Progress) -> Result<(), ImageError> {
    let comps = crate::safepath::clean_entry_path(Path::new(wd))?;
    let mut made = HashSet::new();
    match crate::safepath::resolve_dir(root, Path::new(wd), &comps, Some(&mut made)) {
        Ok(_) if !made.is_empty() => {
            progress.event(ProgressEvent::Log {
                line: format!("WorkingDir {wd} is not in the layers: created it (root, 0755)"),
            });
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(ImageError::Entry { .. }) => {
            progress.event(ProgressEvent::Log {
                line: format!("WorkingDir {wd} is not a directory in the image"),
            });
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn write_synced(path: &Path, meta: &ImageMeta) -> Result<(), ImageError> {
    let json = serde_json::to_vec_pretty(meta).map_err(|e| ImageError::Malformed {
        what: "image.json".into(),
        reason: e.to_string(),
    })?;
    let mut f = fs::File::create(path).map_err(io_err(format!("creating {}", path.display())))?;
    f.write_all(&json)
        .and_then(|_| f.write_all(b"\n"))
        .and_then(|_| f.sync_all())
        .map_err(io_err(format!("writing {}", path.display())))
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (UTC; proleptic
/// Gregorian calendar, days to civil date by the usual era arithmetic).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Read an installed image's metadata. An image with a root disk but no
/// `image.json` (one made by hand) gets a meta made up from the disk.
pub fn read_image(images_dir: &Path, name: &str) -> Result<ImageMeta, ImageError> {
    check_name(name)?;
    let dir = images_dir.join(name);
    let disk = dir.join(ROOTFS);
    let disk_meta = fs::metadata(&disk).ok();
    let json = match fs::read(dir.join(IMAGE_JSON)) {
        Ok(j) => Some(j),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(io_err(format!(
                "reading {}",
                dir.join(IMAGE_JSON).display()
            ))(e))
        }
    };
    match (json, disk_meta) {
        (None, None) => Err(ImageError::NotFound(name.to_string())),
        (Some(_), None) => Err(ImageError::Broken {
            name: name.to_string(),
            reason: format!("it has no {ROOTFS}"),
        }),
        (Some(j), Some(_)) => {
            let mut m = ImageMeta::parse(&j).map_err(|e| ImageError::Broken {
                name: name.to_string(),
                reason: format!("its {IMAGE_JSON} does not parse: {e}"),
            })?;
            // The directory is the truth about the name.
            m.name = name.to_string();
            Ok(m)
        }
        (None, Some(dm)) => Ok(synthesized(name, &dm, None)),
    }
}

fn synthesized(name: &str, disk: &fs::Metadata, note: Option<String>) -> ImageMeta {
    let mtime = disk
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    ImageMeta {
        name: name.to_string(),
        format: "ext4".into(),
        size_bytes: disk.len(),
        created_at: rfc3339(mtime),
        source: None,
        digest: None,
        layers: Vec::new(),
        config: Default::default(),
        start: None,
        description: note,
    }
}

/// Every installed image, by name. Hidden entries (installs in progress,
/// deletions) and directories without a root disk are left out; an image
/// whose `image.json` is unreadable is listed from its disk, with the
/// problem as its description.
pub fn list_images(images_dir: &Path) -> Vec<ImageMeta> {
    let Ok(rd) = fs::read_dir(images_dir) else {
        return Vec::new();
    };
    let mut out: Vec<ImageMeta> = rd
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| valid_image_name(n))
        .filter_map(|n| match read_image(images_dir, &n) {
            Ok(m) => Some(m),
            Err(ImageError::NotFound(_)) => None,
            Err(e) => {
                let disk = fs::metadata(images_dir.join(&n).join(ROOTFS)).ok()?;
                Some(synthesized(&n, &disk, Some(e.to_string())))
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The blobs the installed images keep: their layers. (Manifests and
/// configs are not kept: a later pull fetches those small documents again.)
pub fn referenced_blobs(images_dir: &Path) -> HashSet<String> {
    list_images(images_dir)
        .into_iter()
        .flat_map(|m| m.layers)
        .collect()
}

/// Removes the blobs no installed image keeps and no install in flight
/// claims (see `blobs`' module doc): after a failed pull or import, which
/// gives back what it stored, after an image removal, and at daemon start,
/// for what a killed daemon left.
pub fn gc_blobs(store: &BlobStore, images_dir: &Path) -> GcStats {
    store.gc(|| referenced_blobs(images_dir))
}

/// Delete an installed image: renamed out of sight first (so it vanishes
/// at once and a crash leaves only a hidden leftover), then removed.
pub fn remove_image(images_dir: &Path, name: &str) -> Result<(), ImageError> {
    check_name(name)?;
    let dir = images_dir.join(name);
    let trash = images_dir.join(hidden_name("trash", name));
    match fs::rename(&dir, &trash) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ImageError::NotFound(name.to_string()))
        }
        r => r.map_err(io_err(format!("removing {}", dir.display())))?,
    }
    fsync_dir(images_dir)?;
    fs::remove_dir_all(&trash).map_err(io_err(format!("removing {}", trash.display())))
}

/// Remove what interrupted installs and removals left (`.tmp-*`,
/// `.trash-*`). Call only when no install runs (at daemon start).
pub fn clean_leftovers(images_dir: &Path) {
    let Ok(rd) = fs::read_dir(images_dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name();
        let n = n.as_bytes();
        if n.starts_with(b".tmp-") || n.starts_with(b".trash-") {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
#[path = "install_tests.rs"]
mod tests;
