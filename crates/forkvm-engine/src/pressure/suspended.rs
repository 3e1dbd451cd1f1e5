//! Which sandboxes disk pressure has suspended, and why (see
//! [`crate::pressure`]). A leaf: the manager holds it, the watcher fills it.

use std::collections::HashMap;
use std::sync::Mutex;

/// Sandboxes suspended by disk pressure: id → reason. A suspension wakes
/// the calls waiting on that guest ([`Suspended::wait`]), which answer
/// `507` at once instead of at their timeout.
#[derive(Default)]
pub struct Suspended(Mutex<HashMap<String, String>>, tokio::sync::Notify);

impl Suspended {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn get(&self, id: &str) -> Option<String> {
        self.lock().get(id).cloned()
    }
    pub fn set(&self, id: &str, reason: String) -> bool {
        let new = self.lock().insert(id.to_string(), reason).is_none();
        self.1.notify_waiters();
        new
    }

    /// Resolve with the reason once sandbox `id` is suspended.
    pub async fn wait(&self, id: &str) -> String {
        loop {
            let woken = self.1.notified();
            tokio::pin!(woken);
            // Registered before the check: a suspension between the two
            // still wakes it.
            woken.as_mut().enable();
            if let Some(r) = self.get(id) {
                return r;
            }
            woken.await;
        }
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

    #[tokio::test]
    async fn a_waiter_wakes_when_its_sandbox_is_suspended() {
        let s = std::sync::Arc::new(Suspended::default());
        let w = tokio::spawn({
            let s = s.clone();
            async move { s.wait("b").await }
        });
        tokio::task::yield_now().await;
        s.set("other", "x".into());
        tokio::task::yield_now().await;
        assert!(!w.is_finished(), "another sandbox's suspension woke it");
        s.set("b", "disk full".into());
        assert_eq!(w.await.unwrap(), "disk full");
    }
}
