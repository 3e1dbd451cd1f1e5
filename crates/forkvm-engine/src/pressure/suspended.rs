//! Which sandboxes disk pressure has suspended, and why (see
//! [`crate::pressure`]). A leaf: the manager holds it, the watcher fills it.

use std::collections::HashMap;
use std::sync::Mutex;

/// Sandboxes suspended by disk pressure: id → reason.
#[derive(Default)]
pub struct Suspended(Mutex<HashMap<String, String>>);

impl Suspended {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn get(&self, id: &str) -> Option<String> {
        self.lock().get(id).cloned()
    }
    pub fn set(&self, id: &str, reason: String) -> bool {
        self.lock().insert(id.to_string(), reason).is_none()
    }
    pub fn clear(&self, id: &str) -> Option<String> {
        self.lock().remove(id)
    }
    pub fn ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspensions_are_set_once_and_cleared() {
        let s = Suspended::default();
        assert!(s.set("a", "x".into()));
        assert!(!s.set("a", "y".into()));
        assert_eq!(s.get("a").as_deref(), Some("y"));
        assert_eq!(s.ids(), vec!["a".to_string()]);
        assert_eq!(s.clear("a").as_deref(), Some("y"));
        assert_eq!(s.get("a"), None);
    }
}
