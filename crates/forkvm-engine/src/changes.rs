//! Change notices: what the state database, the warm pools and the image
//! store report when something changes, for the event stream
//! (`crate::events`) to turn into events.
//!
//! A leaf module on purpose: the database and the pools only say *what*
//! changed (a kind and an id); rendering the object as the API shows it
//! needs the manager, which the event task has. Notices are dropped until
//! someone asks for the receiver, so a database opened by a test or a tool
//! keeps nothing.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// What happened to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Created,
    Updated,
    Deleted,
}

/// One notice.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Sandbox(String, Action),
    Snapshot(String, Action),
    /// A snapshot's warm pool gained or lost a waiting QEMU.
    Pool(String),
    /// An image by name.
    Image(String, Action),
    /// A completed branch.
    Branch(Box<forkvm_api::BranchEvent>),
}

/// A cheap, cloneable handle that sends notices (unbounded: a notice is a
/// few bytes, and losing one would leave a client's tree wrong).
#[derive(Clone, Default)]
pub struct Notifier(Arc<Mutex<Option<UnboundedSender<Change>>>>);

impl Notifier {
    pub fn send(&self, c: Change) {
        if let Some(tx) = self.0.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(c);
        }
    }

    /// Start delivering notices to the returned receiver (a later call
    /// replaces it).
    pub fn receiver(&self) -> UnboundedReceiver<Change> {
        let (tx, rx) = unbounded_channel();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_flow_only_once_someone_listens() {
        let n = Notifier::default();
        n.send(Change::Pool("lost".into()));
        let mut rx = n.receiver();
        n.clone()
            .send(Change::Sandbox("sb-1".into(), Action::Created));
        assert_eq!(
            rx.try_recv().unwrap(),
            Change::Sandbox("sb-1".into(), Action::Created)
        );
        assert!(rx.try_recv().is_err(), "the notice before was dropped");
    }
}
