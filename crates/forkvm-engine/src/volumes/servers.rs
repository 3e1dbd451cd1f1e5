//! The running volume servers, by sandbox id (a leaf the manager holds).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use forkvm_volume::ServerHandle;

#[derive(Default)]
pub struct Servers(Mutex<HashMap<String, Arc<ServerHandle>>>);

impl Servers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ServerHandle>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: &str) -> Option<Arc<ServerHandle>> {
        self.map().get(id).cloned()
    }

    /// Keep `h` as the server of `id`, stopping the one it replaces.
    pub fn insert(&self, id: &str, h: ServerHandle) {
        let old = self.map().insert(id.to_string(), Arc::new(h));
        if let Some(old) = old {
            shutdown(old);
        }
    }

    /// Stop the server of `id`, if any.
    pub fn remove(&self, id: &str) {
        let old = self.map().remove(id);
        if let Some(old) = old {
            shutdown(old);
        }
    }
}

/// Stop a server whose last holder lets go (a snapshot may still hold it
/// for a moment; it then ends when its QEMU does).
fn shutdown(h: Arc<ServerHandle>) {
    if let Ok(h) = Arc::try_unwrap(h) {
        h.shutdown();
    }
}
