//! Guest TRIM returns host disk space: after a guest writes data, deletes it
//! and runs `fstrim`, the sandbox's qcow2 overlay on the host holds about
//! as many allocated blocks as before the write. Measured in allocated
//! bytes (`st_blocks * 512`, what `du` shows), not the file's length, which
//! a qcow2 file never gives back.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

const MIB: u64 = 1 << 20;
/// How much the guest writes (about 20 s under TCG on the test machine).
const WRITE_MIB: u64 = 1024;

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .blocks()
        * 512
}

/// Write `mib` MiB in the guest, sync, delete it, `fstrim`, and return the
/// allocated bytes of `disk` before, after the write and after the trim.
fn write_delete_trim(d: &Daemon, id: &str, disk: &Path, mib: u64) -> (u64, u64, u64, String) {
    sh(d, id, "sync");
    let base = allocated(disk);
    // Data qcow2 must store: not zeroes (detect-zeroes would drop those).
    // A 16 MiB random block repeated; the overlay does not deduplicate.
    sh(
        d,
        id,
        &format!(
            "head -c 16M /dev/urandom > /root/seed && \
             for i in $(seq {}); do cat /root/seed; done > /root/big && \
             rm /root/seed && sync",
            mib / 16
        ),
    );
    let full = allocated(disk);
    let grown = full.saturating_sub(base);
    assert!(
        grown >= mib * MIB * 9 / 10,
        "{} grew by only {} MiB for {mib} MiB written",
        disk.display(),
        grown / MIB
    );
    let said = sh(d, id, "rm /root/big && sync && fstrim -v / && sync");
    // QEMU punches the holes as the discards arrive; give it a moment.
    let mut after = allocated(disk);
    wait_until(std::time::Duration::from_secs(10), || {
        after = allocated(disk);
        full.saturating_sub(after) >= grown * 9 / 10
    });
    eprintln!(
        "discard: {} {} MiB before the write, {} MiB after writing {mib} MiB, \
         {} MiB after rm + fstrim ({} MiB returned; guest said: {})",
        disk.file_name().unwrap().to_string_lossy(),
        base / MIB,
        full / MIB,
        after / MIB,
        full.saturating_sub(after) / MIB,
        said.trim()
    );
    (base, full, after, said)
}

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn guest_trim_returns_the_overlays_space_to_the_host() {
    let d = shared();
    let sb = d.spawn();
    let paths = forkvm_daemon::Config::for_home(&d.home).sandbox_paths(&sb.id);
    // The guest sees a disk that takes discards (fstrim refuses otherwise).
    let max = sh(d, &sb.id, "cat /sys/block/vda/queue/discard_max_bytes");
    assert_ne!(
        max.trim(),
        "0",
        "the guest's virtio-blk does not take discards"
    );

    // The overlay the sandbox started with (opened from QEMU's command line).
    let (base, full, after, _) = write_delete_trim(d, &sb.id, &paths.disk, WRITE_MIB);
    let grown = full - base;
    let returned = full.saturating_sub(after);
    assert!(
        returned >= grown * 9 / 10,
        "fstrim returned only {} of {} MiB to the host ({} MiB allocated before the write, {} after)",
        returned / MIB,
        grown / MIB,
        base / MIB,
        after / MIB
    );

    // After a snapshot the guest writes to a new top layer that QEMU opened
    // over QMP (blockdev-add): the same holds there.
    d.ok(&["snapshot", &sb.id]);
    let mut tops: Vec<_> = std::fs::read_dir(&paths.dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("disk-") && n.ends_with(".qcow2")
        })
        .collect();
    assert_eq!(
        tops.len(),
        1,
        "one new top layer after a snapshot: {tops:?}"
    );
    let top = tops.remove(0);
    let (base, full, after, _) = write_delete_trim(d, &sb.id, &top, 256);
    let returned = full.saturating_sub(after);
    assert!(
        returned >= (full - base) * 9 / 10,
        "after a snapshot, fstrim returned only {} of {} MiB",
        returned / MIB,
        (full - base) / MIB
    );
}
