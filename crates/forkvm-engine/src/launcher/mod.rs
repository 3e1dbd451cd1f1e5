//! The launcher: starting QEMUs. A cold boot of an image, and the restore
//! of a snapshot into a clone (taken from the warm pool when one is ready,
//! which this service also refills). It starts machines and hands them
//! over as sandboxes; deciding *what* to start (`crate::spawn`,
//! `crate::template`, `crate::branch`) is above it, and so are pausing
//! and resuming (`crate::lifetime`), which use it.

pub mod boot;
pub mod refill;
pub mod restore;
