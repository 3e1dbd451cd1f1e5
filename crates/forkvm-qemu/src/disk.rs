//! Root disks: copy-on-write qcow2 overlays over a read-only base image.

use std::path::Path;

/// Create `overlay` as a qcow2 file whose backing file is `base` (a raw
/// image, or a frozen qcow2 layer of a snapshot). Creating an overlay writes a few hundred KiB of metadata and takes
/// milliseconds whatever the size of the base.
pub async fn create_overlay(base: &Path, overlay: &Path) -> Result<(), String> {
    let img = qemu_img_binary();
    let fmt = image_format(base).map_err(|e| format!("cannot read {}: {e}", base.display()))?;
    let out = tokio::process::Command::new(&img)
        .args(["create", "-q", "-f", "qcow2", "-F", fmt, "-b"])
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

/// Like [`create_overlay`], with a larger virtual size when `size` is
/// given (the guest sees a bigger disk; its filesystem is grown online).
pub async fn create_overlay_sized(
    base: &Path,
    overlay: &Path,
    size: Option<u64>,
) -> Result<(), String> {
    let Some(size) = size else {
        return create_overlay(base, overlay).await;
    };
    let fmt = image_format(base).map_err(|e| format!("cannot read {}: {e}", base.display()))?;
    create_overlay_unchecked(base, fmt, overlay, size).await
}

/// Create a qcow2 overlay naming `backing` (of format `fmt`) without opening
/// it: the backing file may not exist yet (it is about to be published).
pub async fn create_overlay_unchecked(
    backing: &Path,
    fmt: &str,
    overlay: &Path,
    virtual_size: u64,
) -> Result<(), String> {
    let img = qemu_img_binary();
    let out = tokio::process::Command::new(&img)
        .args(["create", "-q", "-u", "-f", "qcow2", "-F", fmt, "-b"])
        .arg(backing)
        .arg(overlay)
        .arg(virtual_size.to_string())
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

/// Every file in the backing chain of a qcow2 image, the image first.
/// `-U` (force-share) lets it read images a running QEMU has open.
pub async fn backing_chain(image: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let img = qemu_img_binary();
    let out = tokio::process::Command::new(&img)
        .args(["info", "-U", "--backing-chain", "--output=json"])
        .arg(image)
        .output()
        .await
        .map_err(|e| format!("cannot run {img}: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("bad qemu-img output: {e}"))?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["filename"].as_str().map(std::path::PathBuf::from))
        .collect())
}

pub fn qemu_img_binary() -> String {
    std::env::var("FORKVM_QEMU_IMG").unwrap_or_else(|_| "qemu-img".to_string())
}

/// `qcow2` when the file starts with the qcow2 magic, `raw` otherwise.
pub fn image_format(p: &Path) -> std::io::Result<&'static str> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(p)?;
    let n = f.read(&mut magic)?;
    Ok(if n == 4 && magic == *b"QFI\xfb" {
        "qcow2"
    } else {
        "raw"
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_are_sniffed() {
        let d = tempfile::tempdir().unwrap();
        let q = d.path().join("q");
        std::fs::write(&q, b"QFI\xfb\0\0\0\x03").unwrap();
        let r = d.path().join("r");
        std::fs::write(&r, b"\0\0").unwrap();
        assert_eq!(super::image_format(&q).unwrap(), "qcow2");
        assert_eq!(super::image_format(&r).unwrap(), "raw");
        assert!(super::image_format(&d.path().join("missing")).is_err());
    }
}
