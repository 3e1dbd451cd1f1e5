//! What the installed QEMU can do: its version and each feature forkvm uses.
//!
//! Features are probed by asking QEMU itself over QMP (an empty `-M none`
//! instance), not by guessing from the version number: distributions backport
//! and disable features independently.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::qmp::Qmp;

/// A parsed `qemu-system-x86_64 --version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QemuVersion {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
    /// The first line QEMU printed.
    pub text: String,
}

/// Parse the first line of `--version` output.
pub fn parse_version(out: &str) -> Option<QemuVersion> {
    let line = out.lines().next()?;
    let ver = line.split("version ").nth(1)?.split_whitespace().next()?;
    let mut it = ver.split('.').map(|p| p.parse::<u32>().ok());
    Some(QemuVersion {
        major: it.next()??,
        minor: it.next().flatten().unwrap_or(0),
        micro: it.next().flatten().unwrap_or(0),
        text: line.trim().to_string(),
    })
}

/// Run `bin --version`.
pub async fn version(bin: &Path) -> Result<QemuVersion, String> {
    let out = tokio::process::Command::new(bin)
        .arg("--version")
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_version(&text).ok_or_else(|| format!("unrecognised version output: {text}"))
}

/// The QEMU features forkvm relies on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub microvm: bool,
    pub mapped_ram: bool,
    pub x_ignore_shared: bool,
    /// `rom=` on memory-backend-file (needed for read-only clone memory).
    pub memory_backend_rom: bool,
    pub vmgenid: bool,
    /// The options of [`crate::spec::MACHINE`] that this QEMU's `microvm`
    /// lacks (empty when all are there). Without `pic`/`pit` a cold boot can
    /// die in early boot (see `spec::MACHINE`).
    #[serde(default)]
    pub microvm_missing_options: Vec<String>,
}

/// The option names of a `-M` value (`microvm,acpi=on,pic=off` gives
/// `acpi`, `pic`).
pub fn machine_option_names(machine: &str) -> Vec<String> {
    machine
        .split(',')
        .skip(1)
        .filter_map(|o| o.split_once('=').map(|(k, _)| k.to_string()))
        .collect()
}

/// Start an empty QEMU and ask it which features exist.
pub async fn probe(bin: &Path, scratch: &Path) -> Result<Features, String> {
    std::fs::create_dir_all(scratch).map_err(|e| e.to_string())?;
    let sock = scratch.join(format!("probe-{}.qmp", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let mut child = tokio::process::Command::new(bin)
        .args([
            "-M",
            "none",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-qmp",
        ])
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let result = async {
        let qmp = Qmp::connect(&sock, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        let mut f = Features::default();
        let machines = qmp
            .execute("query-machines", None)
            .await
            .map_err(|e| e.to_string())?;
        f.microvm = machines
            .as_array()
            .is_some_and(|a| a.iter().any(|m| m["name"] == "microvm"));
        // QOM names the machine type `<name>-machine`.
        let props = qmp
            .execute(
                "qom-list-properties",
                Some(json!({"typename": "microvm-machine"})),
            )
            .await
            .unwrap_or_default();
        f.microvm_missing_options = machine_option_names(crate::spec::MACHINE)
            .into_iter()
            .filter(|o| {
                !props
                    .as_array()
                    .is_some_and(|a| a.iter().any(|p| p["name"] == o.as_str()))
            })
            .collect();
        let caps = qmp
            .execute("query-migrate-capabilities", None)
            .await
            .map_err(|e| e.to_string())?;
        let has_cap = |name: &str| {
            caps.as_array()
                .is_some_and(|a| a.iter().any(|c| c["capability"] == name))
        };
        f.mapped_ram = has_cap("mapped-ram");
        f.x_ignore_shared = has_cap("x-ignore-shared");
        f.memory_backend_rom = qmp
            .execute(
                "qom-list-properties",
                Some(json!({"typename": "memory-backend-file"})),
            )
            .await
            .map(|v| {
                v.as_array()
                    .is_some_and(|a| a.iter().any(|p| p["name"] == "rom"))
            })
            .unwrap_or(false);
        f.vmgenid = qmp
            .execute(
                "device-list-properties",
                Some(json!({"typename": "vmgenid"})),
            )
            .await
            .is_ok();
        let _ = qmp.execute("quit", None).await;
        Ok::<_, String>(f)
    }
    .await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = std::fs::remove_file(&sock);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_option_names_skip_the_type() {
        assert_eq!(
            machine_option_names("microvm,acpi=on,pic=off,pit=off"),
            ["acpi", "pic", "pit"]
        );
        assert!(machine_option_names("microvm").is_empty());
    }

    #[test]
    fn versions_parse() {
        let v = parse_version(
            "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright",
        )
        .unwrap();
        assert_eq!((v.major, v.minor, v.micro), (10, 0, 2));
        assert!(v.text.starts_with("QEMU emulator version 10.0.2"));
        let v = parse_version("QEMU emulator version 7.2 (x)").unwrap();
        assert_eq!((v.major, v.minor, v.micro), (7, 2, 0));
        assert!(parse_version("garbage").is_none());
        assert!(parse_version("").is_none());
    }
}
