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

#[test]
#[ignore = "boots VMs: run with --include-ignored (make test)"]
fn guest_trim_returns_the_overlays_space_to_the_host() {
    let d = shared();
    let sb = d.spawn();
    let disk = forkvm_daemon::Config::for_home(&d.home)
        .sandbox_paths(&sb.id)
        .disk;
    // The guest sees a disk that takes discards (fstrim refuses otherwise).
    let max = sh(d, &sb.id, "cat /sys/block/vda/queue/discard_max_bytes");
    assert_ne!(
        max.trim(),
        "0",
        "the guest's virtio-blk does not take discards"
    );

    sh(d, &sb.id, "sync");
    let base = allocated(&disk);
    // Data qcow2 must store: not zeroes (detect-zeroes would drop those).
    // A 16 MiB random block repeated; the overlay does not deduplicate.
    sh(
        d,
        &sb.id,
        &format!(
            "head -c 16M /dev/urandom > /root/seed && \
             for i in $(seq {}); do cat /root/seed; done > /root/big && \
             rm /root/seed && sync",
            WRITE_MIB / 16
        ),
    );
    let full = allocated(&disk);
    let grown = full.saturating_sub(base);
    assert!(
        grown >= WRITE_MIB * MIB * 9 / 10,
        "the overlay grew by only {} MiB for {WRITE_MIB} MiB written",
        grown / MIB
    );

    let trim = sh(d, &sb.id, "rm /root/big && sync && fstrim -v / && sync");
    // QEMU punches the holes as the discards arrive; give it a moment.
    let mut after = allocated(&disk);
    wait_until(std::time::Duration::from_secs(10), || {
        after = allocated(&disk);
        full.saturating_sub(after) >= grown * 9 / 10
    });
    let returned = full.saturating_sub(after);
    eprintln!(
        "discard: overlay {} MiB before the write, {} MiB after writing {WRITE_MIB} MiB, \
         {} MiB after rm + fstrim ({} MiB returned; guest said: {})",
        base / MIB,
        full / MIB,
        after / MIB,
        returned / MIB,
        trim.trim()
    );
    assert!(
        returned >= grown * 9 / 10,
        "fstrim returned only {} of {} MiB to the host ({} MiB allocated before the write, {} after)",
        returned / MIB,
        grown / MIB,
        base / MIB,
        after / MIB
    );
}
