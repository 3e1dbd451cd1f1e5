//! Memory reserved by admissions in flight, held in the manager.

use std::sync::Mutex;

/// Memory reserved by admissions whose sandboxes do not run yet.
#[derive(Default)]
pub struct Reservations(pub Mutex<u64>);

/// Held while an admitted operation runs; gives its reservation back.
pub struct Admitted<'a> {
    pub r: &'a Reservations,
    pub mib: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut g = self.r.0.lock().unwrap_or_else(|p| p.into_inner());
        *g = g.saturating_sub(self.mib);
    }
}
