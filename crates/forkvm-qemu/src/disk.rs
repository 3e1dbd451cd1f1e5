//! Root disks: copy-on-write qcow2 overlays over a read-only base image.

use std::path::Path;

/// Create `overlay` as a qcow2 file whose backing file is the raw image
/// `base`. Creating an overlay writes a few hundred KiB of metadata and takes
/// milliseconds whatever the size of the base.
pub async fn create_overlay(base: &Path, overlay: &Path) -> Result<(), String> {
    let img = qemu_img_binary();
    let out = tokio::process::Command::new(&img)
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(overlay)
        .output()
        .await
        .map_err(|e| format!("cannot run {img}: {e}; install qemu-utils (scripts/setup.sh)"))?;
    if !out.status.success() {
        return Err(format!(
            "qemu-img create failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn qemu_img_binary() -> String {
    std::env::var("FORKVM_QEMU_IMG").unwrap_or_else(|_| "qemu-img".to_string())
}
