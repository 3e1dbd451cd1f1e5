//! Saving and restoring VM state through QEMU's migration machinery.
//!
//! A forkvm snapshot keeps guest RAM in its own file (the RAM of every
//! sandbox is a `memory-backend-file`), so the migration stream only has to
//! carry device state: with the `x-ignore-shared` capability QEMU skips RAM
//! blocks backed by shared memory, and the stream is tens of KiB.
//!
//! Restoring starts QEMU with `-incoming defer` and the snapshot's RAM file
//! mapped privately (`share=off,readonly=on,rom=off`), then feeds it the
//! device state with `migrate-incoming`. Untouched guest pages stay shared
//! with every other clone through the page cache.
//!
//! A clone's RAM is a private mapping, which `x-ignore-shared` does not
//! skip, so a migration of a clone would read and write all of its RAM. For
//! those, [`save_device_state`] uses `xen-save-devices-state`, which writes
//! every device's section and no RAM at all: a few KiB in about a
//! millisecond. The daemon carries the clone's written pages itself (see
//! [`crate::ram`]). The stream it writes has no configuration section and
//! records the guest as running; [`crate::MachineSpec::device_state_only`]
//! sets up the loading QEMU for both.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::qmp::{Qmp, QmpError};

/// Set migration capabilities.
pub async fn set_capabilities(qmp: &Qmp, caps: &[(&str, bool)]) -> Result<(), QmpError> {
    let list: Vec<Value> = caps
        .iter()
        .map(|(c, on)| json!({"capability": c, "state": on}))
        .collect();
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({ "capabilities": list })),
    )
    .await
    .map(drop)
}

/// Parameters for a live save: a short final stop (the downtime limit QEMU
/// aims for when deciding to stop the guest for the last copy) and no
/// bandwidth cap (QEMU's default of 128 MiB/s is meant for networks, not a
/// local file).
pub async fn set_live_parameters(qmp: &Qmp) -> Result<(), QmpError> {
    qmp.execute(
        "migrate-set-parameters",
        Some(json!({ "downtime-limit": 5, "max-bandwidth": 64u64 << 30 })),
    )
    .await
    .map(drop)
}

/// Poll `query-migrate` until the migration completes. Returns its status
/// object. Polling at 1 ms keeps the added latency below what events would
/// save, without depending on the `events` capability.
pub async fn wait_migration(qmp: &Qmp, timeout: Duration) -> Result<Value, QmpError> {
    wait_migration_with(qmp, None, timeout).await
}

/// Wait for the end of a migration, woken by QEMU's `MIGRATION` events when
/// `events` is given (the `events` capability must be on), with a slow poll
/// as the fallback. Polling `query-migrate` every millisecond both adds up
/// to a millisecond of latency and keeps QEMU's main loop busy answering
/// while it finishes the migration, inside the guest's pause.
pub async fn wait_migration_with(
    qmp: &Qmp,
    mut events: Option<tokio::sync::broadcast::Receiver<crate::QmpEvent>>,
    timeout: Duration,
) -> Result<Value, QmpError> {
    let t = Instant::now();
    let poll = if events.is_some() {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(1)
    };
    loop {
        let v = qmp.execute("query-migrate", None).await?;
        match v["status"].as_str().unwrap_or("") {
            "completed" => return Ok(v),
            "failed" | "cancelled" => {
                return Err(QmpError::Command {
                    command: "migrate".into(),
                    class: "MigrationFailed".into(),
                    desc: v["error-desc"]
                        .as_str()
                        .unwrap_or("migration failed")
                        .to_string(),
                })
            }
            _ => {}
        }
        if t.elapsed() > timeout {
            return Err(QmpError::Timeout("migrate".into()));
        }
        match events.as_mut() {
            None => tokio::time::sleep(poll).await,
            Some(rx) => {
                let deadline = tokio::time::Instant::now() + poll;
                loop {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Err(_) => break,
                        Ok(Ok(ev)) if ev.name == "MIGRATION" => {
                            let st = ev.data["status"].as_str().unwrap_or("");
                            if st == "completed" {
                                return Ok(ev.data);
                            }
                            if matches!(st, "failed" | "cancelled") {
                                break; // query-migrate has the reason
                            }
                        }
                        Ok(Ok(_)) => {}
                        // Lagged: some events were dropped; ask QEMU.
                        Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => break,
                        Ok(Err(_)) => {
                            events = None;
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Save the device state of a (stopped) VM to `path`. RAM is skipped when
/// `x-ignore-shared` is on and RAM is shared.
pub async fn save_state(qmp: &Qmp, path: &Path) -> Result<Value, QmpError> {
    // Subscribe before starting, so the completion event cannot be missed.
    let events = qmp.events();
    qmp.execute(
        "migrate",
        Some(json!({ "uri": format!("file:{}", path.display()) })),
    )
    .await?;
    wait_migration_with(qmp, Some(events), Duration::from_secs(600)).await
}

/// Save the device state, and nothing else, of a stopped VM to `path`.
///
/// `live: false` matters: with `live: true` on a stopped VM, QEMU hands the
/// disks over to a (Xen) migration target and inactivates them, and the
/// source could no longer write its disk after `cont`.
pub async fn save_device_state(qmp: &Qmp, path: &Path) -> Result<(), QmpError> {
    qmp.execute(
        "xen-save-devices-state",
        Some(json!({ "filename": path.display().to_string(), "live": false })),
    )
    .await
    .map(drop)
}

/// The start of a migration stream: magic `QEVM` and version 3.
const STREAM_HEADER: [u8; 8] = *b"QEVM\0\0\0\x03";
/// `QEMU_VM_CONFIGURATION`.
const SECTION_CONFIGURATION: u8 = 0x07;

/// The machine type a migration stream's configuration section names.
pub fn stream_machine(stream: &[u8]) -> Option<String> {
    if stream.len() < 13 || stream[..8] != STREAM_HEADER || stream[8] != SECTION_CONFIGURATION {
        return None;
    }
    let len = u32::from_be_bytes(stream[9..13].try_into().ok()?) as usize;
    let name = stream.get(13..13 + len)?;
    String::from_utf8(name.to_vec()).ok()
}

/// Does this stream carry a configuration section right after its header?
pub fn has_configuration(stream_start: &[u8]) -> bool {
    stream_start.len() > 8
        && stream_start[..8] == STREAM_HEADER
        && stream_start[8] == SECTION_CONFIGURATION
}

/// Give a devices-only stream (from `xen-save-devices-state`) the
/// configuration section an ordinary migration starts with: the machine type
/// and no capability subsection, matching a destination with the validated
/// capabilities (`x-ignore-shared`, `mapped-ram`) off. The destination can
/// then load it with QEMU's defaults.
pub fn add_configuration(stream: &[u8], machine: &str) -> Result<Vec<u8>, String> {
    if stream.len() < 8 || stream[..8] != STREAM_HEADER {
        return Err("not a QEMU migration stream (bad header)".into());
    }
    if has_configuration(stream) {
        return Ok(stream.to_vec());
    }
    let mut out = Vec::with_capacity(stream.len() + 5 + machine.len());
    out.extend_from_slice(&stream[..8]);
    out.push(SECTION_CONFIGURATION);
    out.extend_from_slice(&(machine.len() as u32).to_be_bytes());
    out.extend_from_slice(machine.as_bytes());
    out.extend_from_slice(&stream[8..]);
    Ok(out)
}

/// Load device state into a QEMU started with `-incoming defer` and wait
/// until it is in. The VM is left paused or running as QEMU decides; call
/// `cont` afterwards (it is harmless on a running VM).
pub async fn load_state(qmp: &Qmp, path: &Path) -> Result<(), QmpError> {
    qmp.execute(
        "migrate-incoming",
        Some(json!({ "uri": format!("file:{}", path.display()) })),
    )
    .await?;
    let t = Instant::now();
    loop {
        let v = qmp.execute("query-migrate", None).await?;
        match v["status"].as_str().unwrap_or("") {
            "completed" => return Ok(()),
            "failed" | "cancelled" => {
                return Err(QmpError::Command {
                    command: "migrate-incoming".into(),
                    class: "MigrationFailed".into(),
                    desc: v["error-desc"]
                        .as_str()
                        .unwrap_or("loading the device state failed")
                        .to_string(),
                })
            }
            _ => {}
        }
        if t.elapsed() > Duration::from_secs(120) {
            return Err(QmpError::Timeout("migrate-incoming".into()));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The top block node of the VM's (only) disk, its file and virtual size.
///
/// The file name is `None` when QEMU cannot say it plainly: after external
/// snapshots whose overlay names its backing file by another path, QEMU
/// describes the node as a `json:` blob, and past 4 KiB (a chain of about
/// twenty layers) that blob is cut off. Callers that name their nodes after
/// their files (the daemon does) map the node name instead.
pub async fn top_disk(qmp: &Qmp) -> Result<(String, Option<String>, u64), QmpError> {
    let v = qmp.execute("query-block", None).await?;
    v.as_array()
        .into_iter()
        .flatten()
        .find_map(|d| {
            let ins = d.get("inserted")?;
            Some((
                ins["node-name"].as_str()?.to_string(),
                ins["file"].as_str().and_then(plain_filename),
                ins["image"]["virtual-size"].as_u64()?,
            ))
        })
        .ok_or_else(|| QmpError::Command {
            command: "query-block".into(),
            class: "NoDisk".into(),
            desc: "the VM has no disk".into(),
        })
}

/// Open a new, empty qcow2 overlay as node `node` without its backing
/// chain, ready for [`attach_overlay`]. Opening a file (and reading its
/// header) takes a few milliseconds, so a freeze does it before it stops the
/// guest. The node is the monitor's: a caller that does not attach it
/// removes it with [`crate::blockjob::delete_node`].
pub async fn add_overlay(qmp: &Qmp, file: &Path, node: &str) -> Result<(), QmpError> {
    qmp.execute(
        "blockdev-add",
        Some(json!({
            "driver": "qcow2",
            "node-name": node,
            // As the root disk's nodes on the command line (spec.rs): the
            // guest's TRIM frees this layer's clusters on the host.
            "discard": "unmap",
            "detect-zeroes": "unmap",
            "file": {
                "driver": "file",
                "filename": file.display().to_string(),
                "discard": "unmap",
            },
            "backing": null,
        })),
    )
    .await
    .map(drop)
}

/// Freeze the disk in place: the current top image `top_node` becomes the
/// read-only backing layer of `overlay` (opened by [`add_overlay`]), which
/// takes the guest's writes from now on. Only the graph changes here, so
/// the guest's pause does not pay for opening a file.
pub async fn attach_overlay(qmp: &Qmp, top_node: &str, overlay: &str) -> Result<(), QmpError> {
    qmp.execute(
        "blockdev-snapshot",
        Some(json!({"node": top_node, "overlay": overlay})),
    )
    .await
    .map(drop)
}

/// QEMU reports a node whose backing chain differs from its header as a
/// `json:{...}` pseudo-filename; the node's own file is its `file.filename`.
pub fn plain_filename(f: &str) -> Option<String> {
    match f.strip_prefix("json:") {
        None => Some(f.to_string()),
        Some(j) => {
            let v: Value = serde_json::from_str(j).ok()?;
            v["file"]["filename"].as_str().map(str::to_string)
        }
    }
}

#[cfg(test)]
mod tests {
    /// The configuration section as QEMU writes it (bytes seen in a real
    /// `microvm` stream), added to a devices-only stream and read back.
    #[test]
    fn configuration_sections() {
        let mut real = b"QEVM\0\0\0\x03\x07\0\0\0\x07microvm\x05".to_vec();
        real.extend_from_slice(b"rest");
        assert_eq!(super::stream_machine(&real).as_deref(), Some("microvm"));
        assert!(super::has_configuration(&real));
        let devices = b"QEVM\0\0\0\x03\x04\0\0\0\0\x05timer".to_vec();
        assert!(!super::has_configuration(&devices));
        assert_eq!(super::stream_machine(&devices), None);
        let fixed = super::add_configuration(&devices, "microvm").unwrap();
        assert_eq!(&fixed[..20], b"QEVM\0\0\0\x03\x07\0\0\0\x07microvm");
        assert_eq!(&fixed[20..], &devices[8..]);
        assert_eq!(
            super::add_configuration(&fixed, "microvm").unwrap(),
            fixed,
            "idempotent"
        );
        assert!(super::add_configuration(b"nope", "microvm").is_err());
        assert_eq!(
            super::stream_machine(b"QEVM\0\0\0\x03\x07\0\0\0\x09micro"),
            None,
            "truncated"
        );
    }

    #[test]
    fn pseudo_filenames_resolve_to_the_top_file() {
        assert_eq!(
            super::plain_filename("/a/disk.qcow2").as_deref(),
            Some("/a/disk.qcow2")
        );
        let j = r#"json:{"backing": {"driver": "qcow2", "file": {"driver": "file", "filename": "/x/disk.qcow2"}}, "driver": "qcow2", "file": {"driver": "file", "filename": "/x/disk-2.qcow2"}}"#;
        assert_eq!(super::plain_filename(j).as_deref(), Some("/x/disk-2.qcow2"));
        assert_eq!(super::plain_filename("json:{bad"), None);
    }
}
