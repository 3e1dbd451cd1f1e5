//! What a pull writes: the base image (unless this host has one with the
//! same root disk) and every chain link this host lacks, each staged,
//! checked whole, and only then published.
//!
//! A link's files are checked three times: each chunk against its digest,
//! each file against the SHA-256 its link lists, and that against the
//! source host's sealed `manifest.fvs`. Then the disk layer's header is
//! pointed at this host's path of its backing file (`qemu-img rebase -u`:
//! the header only; the data is the source's), and the manifest is sealed
//! again for this host: the guest kernel and initramfs paths are this
//! host's (the compatibility check proved them identical), the parent's
//! digest is that of this host's copy, and the disk layer's SHA-256 is that
//! of the rewritten header. The snapshot id is kept.
//!
//! A link that exists here already is used when it is the same snapshot:
//! this host took it (its manifest is the one pushed), or pulled it from the
//! same link manifest (recorded in `origin.json` beside its files).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use forkvm_artifact::fetch::{fetch_file, Remote, RemoteLink};
use forkvm_artifact::format::DiskBacking;
use forkvm_image::meta::ImageMeta;
use forkvm_image::progress::{Progress, ProgressEvent};
use forkvm_store::{Manifest, Staging, StoreError};

use crate::error::{EngineError, HintAction};
use crate::manager::Manager;
use crate::registry::{fetch_error, host};
use crate::snapshot::store_err;

/// Beside a pulled snapshot's files: where it came from.
pub const ORIGIN_FILE: &str = "origin.json";

#[derive(serde::Serialize, serde::Deserialize)]
pub struct OriginRecord {
    pub reference: String,
    /// The link manifest's digest.
    pub link: String,
    /// The source host's manifest digest.
    pub source_manifest: String,
}

/// What a link needs on this host.
pub enum LinkPlan {
    /// This host has it: its local manifest digest.
    Have(String),
    Fetch,
}

/// An image being written: removed on drop unless published.
pub struct ImageStaging {
    pub dir: PathBuf,
    pub name: String,
    /// The root disk's SHA-256, once assembled and checked.
    pub sha256: Option<String>,
}

impl Drop for ImageStaging {
    fn drop(&mut self) {
        if self.dir.exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn internal(what: &str) -> impl Fn(std::io::Error) -> EngineError + '_ {
    move |e| EngineError::internal(format!("{what}: {e}"))
}

impl Manager {
    /// Whether this host has `l` already (see the module doc); 409 when it
    /// has another snapshot of that id.
    pub fn plan_link(&self, l: &RemoteLink) -> Result<LinkPlan, EngineError> {
        let id = &l.config.id;
        let local = match self.store.open_snapshot(id) {
            Ok(s) => s,
            Err(StoreError::NotFound(_)) => return Ok(LinkPlan::Fetch),
            Err(e) => return Err(store_err(e)),
        };
        let source = Manifest::digest(&decode_fvs(l)?);
        let origin: Option<OriginRecord> = std::fs::read(local.path(ORIGIN_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if local.digest == source || origin.is_some_and(|o| o.link == l.digest) {
            Ok(LinkPlan::Have(local.digest))
        } else {
            Err(EngineError::conflict(format!(
                "this host has another snapshot with id {id}, so this one cannot be pulled"
            ))
            .hint_on(HintAction::RemoveSnapshot, id))
        }
    }

    /// The local image whose root disk is the pushed one, by name first.
    pub async fn matching_image(&self, remote: &Remote) -> Result<Option<String>, EngineError> {
        let want = remote.image.files[0].clone();
        let mut names = self.cfg.images();
        names.sort_by_key(|n| n != &remote.image.name);
        let home = self.cfg.home.clone();
        let paths: Vec<(String, PathBuf)> = names
            .into_iter()
            .map(|n| (n.clone(), self.cfg.image_rootfs(&n)))
            .collect();
        tokio::task::spawn_blocking(move || {
            for (n, p) in paths {
                if std::fs::metadata(&p).is_ok_and(|m| m.len() == want.size)
                    && host::file_sha256(&home, &p)? == want.sha256
                {
                    return Ok(Some(n));
                }
            }
            Ok(None)
        })
        .await
        .map_err(|e| EngineError::internal(e.to_string()))?
    }

    /// Fetch the base image into a staging directory under a free name.
    pub async fn stage_image(
        &self,
        remote: &Remote,
        progress: &dyn Progress,
    ) -> Result<(ImageStaging, u64), EngineError> {
        let entry = &remote.image.files[0];
        let base = &remote.image.name;
        let name = if self.cfg.image_rootfs(base).exists() {
            format!("{base}-{}", &entry.sha256[..8])
        } else {
            base.clone()
        };
        if !forkvm_image::valid_image_name(&name) {
            return Err(EngineError::invalid(format!(
                "the snapshot's image is named {base:?}, which is not a valid image name here"
            )));
        }
        let images = self.cfg.images_dir();
        std::fs::create_dir_all(&images).map_err(internal("cannot create the images directory"))?;
        let mut st = ImageStaging {
            dir: images.join(format!(".tmp-{name}-{}-pull", std::process::id())),
            name: name.clone(),
            sha256: None,
        };
        if st.dir.exists() {
            std::fs::remove_dir_all(&st.dir)
                .map_err(internal("cannot clear a staging directory"))?;
        }
        std::fs::create_dir(&st.dir).map_err(internal("cannot create a staging directory"))?;
        let rootfs = st.dir.join("rootfs.ext4");
        progress.event(ProgressEvent::Phase {
            phase: format!("fetching image {base} as {name}"),
        });
        let n = fetch_file(
            &remote.session,
            entry,
            &rootfs,
            &format!("image {name}"),
            progress,
        )
        .await
        .map_err(|e| fetch_error(&e))?;
        let mut meta: ImageMeta =
            serde_json::from_value(remote.image.image_json.clone()).map_err(|e| {
                EngineError::invalid(format!("the pushed image.json is malformed: {e}"))
            })?;
        meta.name = name;
        let json = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        std::fs::write(st.dir.join("image.json"), json)
            .map_err(internal("cannot write image.json"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o444))
            .map_err(internal("cannot make the root disk read-only"))?;
        st.sha256 = Some(entry.sha256.clone());
        Ok((st, n))
    }

    /// Publish a staged image (rename; refused if the name was taken
    /// meanwhile).
    pub fn publish_image(&self, mut st: ImageStaging) -> Result<String, EngineError> {
        let dest = self.cfg.images_dir().join(&st.name);
        if dest.exists() {
            return Err(EngineError::conflict(format!(
                "an image named {} appeared during the pull; pull again",
                st.name
            )));
        }
        for f in ["rootfs.ext4", "image.json"] {
            std::fs::File::open(st.dir.join(f))
                .and_then(|f| f.sync_all())
                .map_err(internal("cannot sync the image"))?;
        }
        std::fs::rename(&st.dir, &dest).map_err(internal("cannot publish the image"))?;
        // Its SHA-256 was checked when it was assembled: the next pull that
        // looks for a matching image need not read 2 GiB again.
        if let Some(sha) = &st.sha256 {
            host::remember_sha256(&self.cfg.home, &dest.join("rootfs.ext4"), sha);
        }
        if let Ok(d) = std::fs::File::open(self.cfg.images_dir()) {
            let _ = d.sync_all();
        }
        st.dir = PathBuf::new();
        let name = std::mem::take(&mut st.name);
        self.db.changes.send(crate::changes::Change::Image(
            name.clone(),
            crate::changes::Action::Created,
        ));
        tracing::info!("image {name}: installed from a snapshot pull");
        Ok(name)
    }

    /// Fetch link `l` into staging and seal its manifest for this host.
    /// `parent_digest`: this host's manifest digest of its parent.
    #[allow(clippy::too_many_arguments)]
    pub async fn stage_link(
        &self,
        remote: &Remote,
        l: &RemoteLink,
        parent_digest: Option<&str>,
        image: &str,
        tag: Option<&str>,
        progress: &dyn Progress,
    ) -> Result<(Staging, Manifest, u64), EngineError> {
        let id = &l.config.id;
        let fvs = decode_fvs(l)?;
        let mut m = Manifest::decode(&fvs).map_err(|e| {
            EngineError::invalid(format!("link {id}: its manifest.fvs is corrupt: {e}"))
        })?;
        if &m.id != id || m.artefacts.len() != l.config.files.len() {
            return Err(EngineError::invalid(format!(
                "link {id}: its manifest does not describe its files"
            )));
        }
        for a in &m.artefacts {
            let f = l.config.files.iter().find(|f| f.name == a.file);
            if f.is_none_or(|f| f.sha256 != a.sha256 || f.size != a.size) {
                return Err(EngineError::invalid(format!(
                    "link {id}: file {} does not match the source's manifest",
                    a.file
                )));
            }
        }
        let staging = self.store.begin(id).map_err(store_err)?;
        let mut bytes = 0;
        for f in &l.config.files {
            let item = format!("{id}/{}", f.name);
            bytes += fetch_file(&remote.session, f, &staging.path(&f.name), &item, progress)
                .await
                .map_err(|e| fetch_error(&e))?;
        }
        let backing = match &l.config.disk_backing {
            DiskBacking::Image => self.cfg.image_rootfs(image),
            DiskBacking::Snapshot(p) => self.store.dir(p).join(forkvm_store::DISK),
        };
        rebase(
            &staging.path(forkvm_store::DISK),
            &backing,
            matches!(l.config.disk_backing, DiskBacking::Image),
        )
        .await?;
        m.machine.kernel = self.cfg.kernel();
        m.machine.initrd = self.cfg.initrd();
        m.base_image = self.cfg.image_rootfs(image).display().to_string();
        m.image = image.to_string();
        m.tag = tag.map(String::from);
        if let (Some(p), Some(d)) = (&mut m.parent, parent_digest) {
            p.manifest_sha256 = d.to_string();
        }
        let origin = OriginRecord {
            reference: remote.session.canonical.clone(),
            link: l.digest.clone(),
            source_manifest: Manifest::digest(&fvs),
        };
        std::fs::write(
            staging.path(ORIGIN_FILE),
            serde_json::to_vec(&origin).unwrap_or_default(),
        )
        .map_err(internal("cannot write origin.json"))?;
        Ok((staging, m, bytes))
    }
}

fn decode_fvs(l: &RemoteLink) -> Result<Vec<u8>, EngineError> {
    base64::engine::general_purpose::STANDARD
        .decode(&l.config.manifest_fvs)
        .map_err(|e| {
            EngineError::invalid(format!(
                "link {}: its manifest is not base64: {e}",
                l.config.id
            ))
        })
}

/// Point a qcow2 layer's header at `backing` (header only: `-u`).
async fn rebase(disk: &Path, backing: &Path, raw: bool) -> Result<(), EngineError> {
    let img = forkvm_qemu::disk::qemu_img_binary();
    let out = tokio::process::Command::new(&img)
        .args([
            "rebase",
            "-u",
            "-f",
            "qcow2",
            "-F",
            if raw { "raw" } else { "qcow2" },
            "-b",
        ])
        .arg(backing)
        .arg(disk)
        .output()
        .await
        .map_err(|e| EngineError::internal(format!("cannot run {img}: {e}")))?;
    if !out.status.success() {
        return Err(EngineError::internal(format!(
            "qemu-img rebase failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
