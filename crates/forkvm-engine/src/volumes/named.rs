//! Named volumes: directories under `<home>/volumes/` that outlive the
//! sandboxes mounting them. Creating one makes the directory; removing one
//! deletes it, and is refused while a sandbox mounts it.

use std::path::PathBuf;
use std::time::SystemTime;

use forkvm_api::{check_volume_name, Volume};

use crate::error::{EngineError, HintAction};
use crate::manager::Manager;

fn rfc3339(t: Option<SystemTime>) -> String {
    t.map(crate::util::rfc3339).unwrap_or_default()
}

impl Manager {
    /// The directory of a named volume (which may not exist).
    pub fn named_volume_dir(&self, name: &str) -> PathBuf {
        self.cfg.home.join("volumes").join(name)
    }

    /// The sandboxes (running or paused) whose volumes include `dir`.
    fn volume_users(&self, dir: &std::path::Path) -> Vec<String> {
        let Ok(rows) = self.db.list() else {
            return Vec::new();
        };
        rows.into_iter()
            .filter(|r| {
                super::load_state(&self.cfg.sandbox_paths(&r.id))
                    .iter()
                    .any(|v| v.host_path == dir)
            })
            .map(|r| r.id)
            .collect()
    }

    fn volume_view(&self, name: &str) -> Option<Volume> {
        let dir = self.named_volume_dir(name);
        let md = std::fs::metadata(&dir).ok().filter(|m| m.is_dir())?;
        Some(Volume {
            name: name.to_string(),
            path: dir.display().to_string(),
            created_at: rfc3339(md.created().ok().or(md.modified().ok())),
            used_by: self.volume_users(&dir),
        })
    }

    /// Every named volume, by name.
    pub fn list_volumes(&self) -> Vec<Volume> {
        let mut names: Vec<String> = std::fs::read_dir(self.cfg.home.join("volumes"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| check_volume_name(n).is_ok())
            .collect();
        names.sort();
        names.iter().filter_map(|n| self.volume_view(n)).collect()
    }

    /// Create a named volume (409 if it exists).
    pub fn create_volume(&self, name: &str) -> Result<Volume, EngineError> {
        check_volume_name(name).map_err(EngineError::invalid)?;
        let root = self.cfg.home.join("volumes");
        std::fs::create_dir_all(&root)
            .map_err(|e| EngineError::internal(format!("cannot create {}: {e}", root.display())))?;
        match std::fs::create_dir(root.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(EngineError::conflict(format!("volume {name} exists"))
                    .hint_on(HintAction::RemoveVolume, name))
            }
            Err(e) => {
                return Err(EngineError::internal(format!(
                    "cannot create volume {name}: {e}"
                )))
            }
        }
        tracing::info!("created volume {name}");
        self.volume_view(name)
            .ok_or_else(|| EngineError::internal(format!("volume {name} vanished")))
    }

    /// Remove a named volume and its files; refused while a sandbox uses it.
    pub async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        check_volume_name(name).map_err(EngineError::invalid)?;
        let dir = self.named_volume_dir(name);
        if !dir.is_dir() {
            return Err(EngineError::not_found(format!("there is no volume {name}")));
        }
        let users = self.volume_users(&dir);
        if !users.is_empty() {
            return Err(EngineError::conflict(format!(
                "volume {name} is mounted by {}; remove those sandboxes first",
                users.join(", ")
            )));
        }
        // Renamed first, so a half-removed volume is never seen under its name.
        let gone = self
            .cfg
            .home
            .join("volumes")
            .join(format!(".removing-{name}-{}", crate::util::new_id("x")));
        std::fs::rename(&dir, &gone)
            .map_err(|e| EngineError::internal(format!("cannot remove volume {name}: {e}")))?;
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&gone))
            .await
            .map_err(|e| EngineError::internal(e.to_string()))?
            .map_err(|e| {
                EngineError::internal(format!("cannot remove volume {name}'s files: {e}"))
            })?;
        tracing::info!("removed volume {name}");
        Ok(())
    }
}
