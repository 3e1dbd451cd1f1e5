//! Images as the daemon serves them: listing, inspection, removal, the
//! per-exec defaults an image's config gives, and the long operations
//! (pull, import) that install new ones. Builds are [`crate::builder`],
//! which sits above the launcher that images sit below.
//!
//! The files are the truth (`images/<name>/rootfs.ext4` + `image.json`, see
//! the forkvm-image crate); the database only says which sandboxes and
//! snapshots use an image, which is what makes a removal a 409.
//!
//! * [`install`]: pull and import;
//! * [`start`]: the image's part of a cold boot (disk growth, start command);
//! * [`stream`]: progress of a long operation as NDJSON lines.

pub mod install;
pub mod start;
pub mod stream;

pub use forkvm_api::DOCKERFILE_IN_CONTEXT;
pub use start::BootReq;

use std::path::PathBuf;

use forkvm_image::meta::{ImageConfig as MetaConfig, ImageMeta, ImageSource, ReadyCheck};

use crate::db::Origin;
use crate::error::{EngineError, HintAction};
use crate::manager::Manager;

/// Turn the on-disk metadata into the wire type.
pub fn view(meta: &ImageMeta) -> forkvm_api::Image {
    let (source, reference) = match &meta.source {
        None | Some(ImageSource::Builtin) => ("builtin", None),
        Some(ImageSource::Registry { reference }) => ("registry", Some(reference.clone())),
        Some(ImageSource::Import { file, .. }) => ("import", Some(file.clone())),
        Some(ImageSource::Build { base, .. }) => ("build", Some(base.clone())),
    };
    let c = &meta.config;
    forkvm_api::Image {
        name: meta.name.clone(),
        format: meta.format.clone(),
        size_bytes: meta.size_bytes,
        created_at: meta.created_at.clone(),
        source: source.to_string(),
        reference,
        digest: meta.digest.clone(),
        layers: meta.layers.clone(),
        config: forkvm_api::ImageConfig {
            env: c.env.clone(),
            working_dir: c.working_dir.clone(),
            user: c.user.clone(),
            entrypoint: c.entrypoint.clone(),
            cmd: c.cmd.clone(),
            exposed_ports: c.exposed_ports.clone(),
            labels: c.labels.clone(),
        },
        start: meta.start.as_ref().map(|s| forkvm_api::StartCommand {
            command: s.command.clone(),
            ready_port: match s.ready {
                Some(ReadyCheck::Port { port }) => Some(port),
                _ => None,
            },
            ready_command: match &s.ready {
                Some(ReadyCheck::Command { command }) => Some(command.clone()),
                _ => None,
            },
            ready_timeout_secs: Some(s.ready_timeout_secs),
        }),
        sandboxes: Vec::new(),
        snapshots: Vec::new(),
    }
}

/// The start command of a request, in the metadata's terms.
pub fn start_spec(
    s: &forkvm_api::StartCommand,
) -> Result<forkvm_image::meta::StartSpec, EngineError> {
    if s.command.is_empty() || s.command[0].is_empty() {
        return Err(EngineError::invalid(
            "start.command must name a program, e.g. [\"python3\", \"-m\", \"http.server\", \"8000\"]",
        ));
    }
    let ready = match (&s.ready_port, &s.ready_command) {
        (Some(_), Some(_)) => {
            return Err(EngineError::invalid(
                "give start.ready_port or start.ready_command, not both",
            ))
        }
        (Some(0), None) => return Err(EngineError::invalid("start.ready_port must be 1-65535")),
        (Some(p), None) => Some(ReadyCheck::Port { port: *p }),
        (None, Some(c)) if c.is_empty() => {
            return Err(EngineError::invalid(
                "start.ready_command must name a program",
            ))
        }
        (None, Some(c)) => Some(ReadyCheck::Command { command: c.clone() }),
        (None, None) => None,
    };
    let timeout = s.ready_timeout_secs.unwrap_or(60);
    if timeout == 0 || timeout > 3600 {
        return Err(EngineError::invalid(
            "start.ready_timeout_secs must be between 1 and 3600",
        ));
    }
    Ok(forkvm_image::meta::StartSpec {
        command: s.command.clone(),
        ready,
        ready_timeout_secs: timeout,
    })
}

/// What uses an image: sandboxes, snapshots, and its boot templates and
/// build caches (derived: removed with it).
type Users = (Vec<String>, Vec<String>, Vec<String>);

impl Manager {
    fn image_dir(&self, name: &str) -> PathBuf {
        self.cfg.images_dir().join(name)
    }

    /// An installed image's metadata. An image without `image.json` (a bare
    /// `rootfs.ext4` put there by hand) gets one made up from the file.
    pub fn image_meta(&self, name: &str) -> Result<ImageMeta, EngineError> {
        if !forkvm_image::valid_image_name(name) {
            return Err(EngineError::invalid(format!(
                "image name {name:?} is not valid: use letters, digits, '.', '-' and '_' \
                 (at most 64, starting with a letter or digit)"
            )));
        }
        let rootfs = self.cfg.image_rootfs(name);
        let md = std::fs::metadata(&rootfs).map_err(|_| {
            EngineError::not_found(format!("no image {name:?}")).hint(HintAction::GetImage)
        })?;
        let json = self.image_dir(name).join("image.json");
        let mut meta = match std::fs::read(&json) {
            Ok(b) => ImageMeta::parse(&b).map_err(|e| {
                EngineError::internal(format!(
                    "{} is unreadable ({e}); remove the image and install it again",
                    json.display()
                ))
            })?,
            Err(_) => ImageMeta {
                name: name.to_string(),
                format: "ext4".into(),
                size_bytes: md.len(),
                created_at: String::new(),
                source: None,
                digest: None,
                layers: Vec::new(),
                config: MetaConfig::default(),
                start: None,
                description: None,
            },
        };
        // The directory name is the name, whatever the file says.
        meta.name = name.to_string();
        Ok(meta)
    }

    /// `GET /v1/images`.
    pub fn list_images(&self) -> Vec<forkvm_api::Image> {
        self.cfg
            .images()
            .iter()
            .filter_map(|n| match self.image_meta(n) {
                Ok(m) => Some(view(&m)),
                Err(e) => {
                    tracing::warn!("image {n}: {}", e.message);
                    None
                }
            })
            .collect()
    }

    /// Sandboxes, snapshots (but templates) and templates of an image.
    fn image_users(&self, name: &str) -> Result<Users, EngineError> {
        let sandboxes: Vec<String> = self
            .db
            .list()?
            .into_iter()
            .filter(|r| r.image == name)
            .map(|r| r.id)
            .collect();
        let (mut snaps, mut templates) = (Vec::new(), Vec::new());
        for r in self.db.snapshots()? {
            if r.image != name {
                continue;
            }
            if r.origin == Origin::Template {
                templates.push(r.id);
            } else {
                snaps.push(r.tag.map(|t| format!("{} ({t})", r.id)).unwrap_or(r.id));
            }
        }
        Ok((sandboxes, snaps, templates))
    }

    /// `GET /v1/images/{name}`: the image and what uses it.
    pub fn get_image(&self, name: &str) -> Result<forkvm_api::Image, EngineError> {
        let meta = self.image_meta(name)?;
        let (sandboxes, snapshots, _) = self.image_users(name)?;
        let mut v = view(&meta);
        v.sandboxes = sandboxes;
        v.snapshots = snapshots;
        Ok(v)
    }

    /// Refuse (409, naming them) while sandboxes or snapshots use an image.
    pub fn check_unused(&self, name: &str, what: &str) -> Result<(), EngineError> {
        let (sandboxes, snapshots, _) = self.image_users(name)?;
        if sandboxes.is_empty() && snapshots.is_empty() {
            return Ok(());
        }
        let mut parts = Vec::new();
        if !sandboxes.is_empty() {
            parts.push(format!("sandboxes {}", sandboxes.join(", ")));
        }
        if !snapshots.is_empty() {
            parts.push(format!("snapshots {}", snapshots.join(", ")));
        }
        Err(EngineError::conflict(format!(
            "cannot {what} image {name:?}: it is in use by {}; remove those sandboxes and \
             snapshots first",
            parts.join(" and ")
        )))
    }

    /// Remove an image's boot templates and build caches (after a replace
    /// they describe a disk that is gone).
    pub async fn drop_stale_templates(self: &std::sync::Arc<Self>, name: &str) {
        if let Ok((_, _, templates)) = self.image_users(name) {
            for t in templates {
                if let Err(e) = self.remove_snapshot(&t, false).await {
                    tracing::warn!("image {name}: could not remove template {t}: {}", e.message);
                }
            }
        }
    }

    /// `DELETE /v1/images/{name}`: refused (409, naming them) while
    /// sandboxes or snapshots use it; its boot templates go with it.
    pub async fn remove_image(self: &std::sync::Arc<Self>, name: &str) -> Result<(), EngineError> {
        self.image_meta(name)?;
        self.check_unused(name, "remove")?;
        self.drop_stale_templates(name).await;
        forkvm_image::install::remove_image(&self.cfg.images_dir(), name).map_err(|e| {
            tracing::warn!("image {name}: removal failed: {e}");
            install::image_error(&e)
        })?;
        self.db.changes.send(crate::changes::Change::Image(
            name.to_string(),
            crate::changes::Action::Deleted,
        ));
        tracing::info!("image {name}: removed");
        self.prune_blobs("after a removal").await;
        Ok(())
    }

    /// Delete the blobs no installed image has as a layer (its manifests
    /// and configs included: a later pull fetches those small documents
    /// again) and no pull or import in flight claims (they work through a
    /// leased store, see `forkvm_image::blobs`). Called after an image
    /// removal and after a failed pull or import, which so gives its space
    /// back at once, even while other installs run.
    pub async fn prune_blobs(&self, why: &str) {
        let Ok(store) = self.blobs() else {
            return;
        };
        let images = self.cfg.images_dir();
        let st =
            tokio::task::spawn_blocking(move || forkvm_image::install::gc_blobs(&store, &images))
                .await
                .unwrap_or_default();
        if st.blobs > 0 {
            tracing::info!(
                "blobs: {} no image uses removed ({} bytes) {why}",
                st.blobs,
                st.bytes
            );
        }
    }

    /// After a failed pull or import: once its lease is given back (a
    /// blocking writer may outlive the failure by a moment; 60 s at most,
    /// after which what is still claimed waits for a later collection),
    /// collect.
    pub async fn give_back_blobs(&self, watch: Option<forkvm_image::blobs::LeaseWatch>, why: &str) {
        let t0 = std::time::Instant::now();
        while watch.as_ref().is_some_and(|w| !w.released())
            && t0.elapsed() < std::time::Duration::from_secs(60)
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.prune_blobs(why).await;
    }

    /// The exec defaults of a sandbox's image.
    pub fn exec_defaults_of(&self, id: &str) -> Result<MetaConfig, EngineError> {
        let row = self
            .db
            .get(id)?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        Ok(self.exec_defaults(&row.image))
    }

    /// The defaults an exec in a sandbox of `image` starts from. An image
    /// without metadata has none (the agent's PATH, `/`, root).
    pub fn exec_defaults(&self, image: &str) -> MetaConfig {
        self.image_meta(image).map(|m| m.config).unwrap_or_default()
    }
}
