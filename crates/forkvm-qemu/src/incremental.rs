//! Incremental disk layers: a dirty bitmap that follows a sandbox's top
//! disk layer from one checkpoint to the next, and the `blockdev-backup`
//! job that copies only the clusters it marks.
//!
//! A freeze makes the running top layer read-only and puts a new, empty
//! one over it ([`crate::migrate::attach_overlay`]); the stream then copies
//! the frozen layers' clusters into the new top
//! ([`crate::blockjob`]), so a later frozen top holds everything written
//! since the base image, not only what changed since the previous freeze.
//! A checkpoint wants the latter. QEMU tracks guest writes per format node
//! in a dirty bitmap, so every new top gets a bitmap named [`BITMAP`]
//! before it is attached (nothing writes to it until then, and the guest's
//! pause does not pay for it), and a restored sandbox gets one on its
//! first layer before its guest runs ([`start_record`]). At a freeze:
//!
//! * [`Track::Start`], a checkpoint: the new top's bitmap stays empty, and
//!   the frozen top's says what the guest wrote since the previous
//!   checkpoint;
//! * [`Track::Carry`], any other freeze: after the guest resumes, the
//!   frozen top's bitmap (final by then) is merged into the new one
//!   ([`carry_record`]), so the record still reaches back to the last
//!   checkpoint.
//!
//! Writes by the stream job do not mark a bitmap (QEMU's copy-on-read
//! writes go straight to the driver, below the dirty tracking; checked on
//! QEMU 10.0), so the bitmap holds the guest's writes only.
//!
//! The checkpoint's own layer is then written by [`start_backup`]: a
//! `blockdev-backup` with `sync: incremental` from the frozen top (its view
//! of the disk at the freeze) into a new qcow2 file whose backing file is
//! the previous checkpoint's layer. Only marked clusters are copied;
//! clusters the guest zeroed or discarded are written as zero clusters (the
//! qcow2 driver sets the zero flag whether or not a backing file is open),
//! so they do not show the backing file's old contents. The target is
//! opened without its backing chain: the jail shows QEMU only the files
//! its disk had when it started, and a backup never reads its target. The
//! bitmaps live only
//! in this QEMU. A restored sandbox's record starts at the snapshot it
//! restored, so its first checkpoint onto that snapshot (the first of a
//! clone, or the next after a rewind) is thin too; one onto any other
//! checkpoint (the next after a pause and resume) stores its whole layer.

use std::path::Path;

use serde_json::{json, Value};

use crate::qmp::{Qmp, QmpError};

/// The bitmap's name on every top layer that carries one.
pub const BITMAP: &str = "forkvm-since-checkpoint";

/// What a freeze does with the dirty bitmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Track {
    /// No bitmap: the sandbox keeps no record since a checkpoint.
    Off,
    /// A checkpoint: the new top starts an empty bitmap.
    Start,
    /// Another freeze: the new top's bitmap takes over the frozen one's.
    Carry,
}

/// `block-dirty-bitmap-add`'s arguments for [`start_record`].
pub fn record_args(node: &str) -> Value {
    json!({"node": node, "name": BITMAP})
}

/// Start the record on `node`: a new top layer before it is attached
/// (nothing writes to it yet), or the top of a sandbox whose guest has not
/// run yet.
pub async fn start_record(qmp: &Qmp, node: &str) -> Result<(), QmpError> {
    qmp.execute("block-dirty-bitmap-add", Some(record_args(node)))
        .await
        .map(drop)
}

/// `block-dirty-bitmap-merge`'s arguments for [`carry_record`].
pub fn carry_args(from: &str, to: &str) -> Value {
    json!({
        "node": to,
        "target": BITMAP,
        "bitmaps": [{"node": from, "name": BITMAP}],
    })
}

/// Add `from`'s record (a frozen top's: final, nothing writes to it any
/// more) to `to`'s, the top that replaced it.
pub async fn carry_record(qmp: &Qmp, from: &str, to: &str) -> Result<(), QmpError> {
    qmp.execute("block-dirty-bitmap-merge", Some(carry_args(from, to)))
        .await
        .map(drop)
}

/// Open `file`, a qcow2 image, as node `node` for a backup to write,
/// without its backing chain (see the module doc).
pub async fn open_target(qmp: &Qmp, file: &Path, node: &str) -> Result<(), QmpError> {
    qmp.execute("blockdev-add", Some(target_args(file, node)))
        .await
        .map(drop)
}

/// `blockdev-add`'s arguments for a backup target.
pub fn target_args(file: &Path, node: &str) -> Value {
    json!({
        "driver": "qcow2",
        "node-name": node,
        "file": {"driver": "file", "filename": file.display().to_string()},
        "backing": null,
    })
}

/// Start copying the clusters `source`'s [`BITMAP`] marks into `target`.
/// Like the streams ([`crate::blockjob`]), the job stays listed once it
/// ends, for its outcome to be read, until it is dismissed.
pub async fn start_backup(
    qmp: &Qmp,
    job: &str,
    source: &str,
    target: &str,
) -> Result<(), QmpError> {
    qmp.execute("blockdev-backup", Some(backup_args(job, source, target)))
        .await
        .map(drop)
}

/// `blockdev-backup`'s arguments for [`start_backup`].
pub fn backup_args(job: &str, source: &str, target: &str) -> Value {
    json!({
        "job-id": job,
        "device": source,
        "target": target,
        "sync": "incremental",
        "bitmap": BITMAP,
        "auto-dismiss": false,
    })
}

/// Drop `node`'s bitmap (a frozen top's, once its checkpoint layer is
/// written).
pub async fn remove_bitmap(qmp: &Qmp, node: &str) -> Result<(), QmpError> {
    qmp.execute(
        "block-dirty-bitmap-remove",
        Some(json!({"node": node, "name": BITMAP})),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_named_bitmap_per_node() {
        assert_eq!(
            record_args("root-l1"),
            json!({"node": "root-l1", "name": BITMAP})
        );
    }

    #[test]
    fn carrying_merges_the_frozen_tops_record_into_the_new_ones() {
        assert_eq!(
            carry_args("root-l1", "root-l2"),
            json!({"node": "root-l2", "target": BITMAP,
                   "bitmaps": [{"node": "root-l1", "name": BITMAP}]})
        );
    }

    #[test]
    fn backup_copies_only_what_the_bitmap_marks_and_keeps_its_outcome() {
        let v = backup_args("forkvm-stream-c1", "root-l1", "ckpt-1");
        assert_eq!(v["sync"], "incremental");
        assert_eq!(v["bitmap"], BITMAP);
        assert_eq!(v["device"], "root-l1");
        assert_eq!(v["target"], "ckpt-1");
        assert_eq!(v["auto-dismiss"], false);
    }

    #[test]
    fn the_target_opens_without_its_backing_chain() {
        let v = target_args(Path::new("/h/s/ckpt.qcow2"), "ckpt-1");
        assert_eq!(v["file"]["filename"], "/h/s/ckpt.qcow2");
        // The jail does not show QEMU the previous checkpoint's layer.
        assert_eq!(v["backing"], Value::Null);
        assert!(v.as_object().unwrap().contains_key("backing"));
    }
}
