//! Each clone and branch child reports a boot id of its own
//! (`/proc/sys/kernel/random/boot_id`, which the guest agent mounts its own
//! file over; docs/snapshots.md), while what the kernel keeps per boot stays
//! shared and is documented as such: a procfs mounted afresh shows the
//! kernel's own boot id, the same in every clone of one template. Run with
//! `make test`.

mod common;

use std::collections::HashSet;

use common::*;

const BOOT_ID: &str = "cat /proc/sys/kernel/random/boot_id";
/// The kernel's own boot id, through a procfs of a new pid namespace
/// (util-linux's `unshare`, in every Debian image).
const KERNEL_BOOT_ID: &str =
    "unshare --mount --pid --fork --mount-proc cat /proc/sys/kernel/random/boot_id";

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
        })
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn clones_and_branch_children_have_their_own_boot_id() {
    let d = shared();
    // Two clones of the image's boot template, and the source of a branch.
    let a = d.spawn();
    let b = d.spawn();
    let src = d.spawn();
    sh(d, &src.id, "true");
    let r = d.json(&["branch", &src.id, "--mode", "diff", "--count", "2"]);
    let kids: Vec<Sandbox> = ids(&r["children"])
        .into_iter()
        .map(|id| Sandbox { d, id })
        .collect();
    let all: Vec<&Sandbox> = [&a, &b, &src].into_iter().chain(kids.iter()).collect();

    let mut seen = HashSet::new();
    let mut kernel = HashSet::new();
    for s in &all {
        let id = sh(d, &s.id, BOOT_ID).trim().to_string();
        assert!(is_uuid(&id), "{}: boot id {id:?}", s.id);
        // Read twice: stable within one VM.
        assert_eq!(sh(d, &s.id, BOOT_ID).trim(), id, "{}", s.id);
        assert!(seen.insert(id.clone()), "{} repeats boot id {id}", s.id);
        let k = sh(d, &s.id, KERNEL_BOOT_ID).trim().to_string();
        assert!(is_uuid(&k), "{}: kernel boot id {k:?}", s.id);
        assert_ne!(k, id, "{}: the kernel's boot id is in view", s.id);
        kernel.insert(k);
        // The mount is read-only, even for root.
        let o = s.exec(&["sh", "-c", "echo x > /proc/sys/kernel/random/boot_id"]);
        assert!(!o.status.success(), "{}: boot id writable", s.id);
    }
    eprintln!(
        "{} sandboxes: {} boot ids, {} kernel boot ids",
        all.len(),
        seen.len(),
        kernel.len()
    );
    // What stays shared: every one of them is a clone of the one boot
    // template, so the kernel's own boot id (documented) is that template's.
    assert_eq!(kernel.len(), 1, "kernel boot ids {kernel:?}");

    // A sandbox booted cold shows its kernel's boot id as its own.
    let cold = d.spawn_cold();
    assert_eq!(
        sh(d, &cold.id, BOOT_ID).trim(),
        sh(d, &cold.id, KERNEL_BOOT_ID).trim()
    );
}
