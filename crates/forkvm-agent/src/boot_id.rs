//! The boot id each clone reports.
//!
//! The kernel makes `/proc/sys/kernel/random/boot_id` once per boot and
//! offers no way to change it, so every clone of one snapshot would report
//! its source's. As pid 1 of a booted VM the agent copies it to
//! `/run/forkvm/boot_id` (tmpfs) and bind-mounts that file, read-only, over
//! the kernel's ([`crate::identity::IdentityPaths::boot_id_over`]), as
//! container managers do for their containers; a clone's `identity` request
//! then writes a fresh [`uuid_v4`] there, drawn from the RNG it has just
//! reseeded: one more `pwrite` beside the other ids. A procfs mounted afresh
//! (a new pid namespace with its own `/proc`) still shows the kernel's:
//! docs/snapshots.md lists it with what else clones share.

use std::path::Path;

use crate::sys;

/// Where the kernel shows its boot id.
pub const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// A random (version 4) UUID in the kernel's `boot_id` spelling.
pub fn uuid_v4(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Bind-mount `file` read-only over `over`. A mount that fails is reported
/// on the console and leaves the kernel's file in view (every clone then
/// shows its source's boot id, as before); identities are never refused for
/// it.
pub fn mount_over(file: &Path, over: &Path) {
    let src = file.to_string_lossy();
    let r = sys::mount(&src, over, None, libc::MS_BIND, None).and_then(|()| {
        sys::mount(
            "none",
            over,
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
            None,
        )
    });
    if let Err(e) = r {
        eprintln!(
            "forkvm-agent: cannot mount {src} over {}: {e}; clones will share this boot id",
            over.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_v4_spelling() {
        assert_eq!(uuid_v4([0xff; 16]), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert_eq!(uuid_v4([0; 16]), "00000000-0000-4000-8000-000000000000");
    }
}
