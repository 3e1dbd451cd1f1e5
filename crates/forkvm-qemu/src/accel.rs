//! Choosing the accelerator: KVM only where it really works, TCG otherwise.
//!
//! `/dev/kvm` existing is not enough. Nested setups such as PVM expose a
//! `/dev/kvm` that answers ioctls but cannot run an ordinary guest kernel
//! (boot takes minutes and then dies on an emulation failure). So KVM is used
//! only when all of these hold:
//!
//! 1. the CPU flags in `/proc/cpuinfo` show `vmx` or `svm`;
//! 2. `/dev/kvm` opens read-write;
//! 3. a probe VM (our kernel and initramfs with `forkvm.probe=1`) boots under
//!    KVM and prints `FORKVM_PROBE_OK` within the probe timeout.
//!
//! Otherwise TCG, with the reason recorded so `forkvm doctor` and
//! `GET /v1/info` can explain the choice.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::spec::Accel;

/// The accelerator chosen and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccelChoice {
    pub accel: Accel,
    pub reason: String,
}

/// What the host offers, read without starting anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVirt {
    pub cpu_flag: Option<&'static str>,
    pub dev_kvm: Result<(), String>,
    /// A nested PVM hypervisor module is loaded.
    pub pvm: bool,
}

impl HostVirt {
    /// Inspect this host.
    pub fn read() -> HostVirt {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let dev_kvm = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map(drop)
            .map_err(|e| e.to_string());
        HostVirt {
            cpu_flag: cpu_virt_flag(&cpuinfo),
            dev_kvm,
            pvm: Path::new("/sys/module/kvm_pvm").exists(),
        }
    }
}

/// `vmx` or `svm` if the first CPU's flags line has it.
pub fn cpu_virt_flag(cpuinfo: &str) -> Option<&'static str> {
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))?
        .split_once(':')?
        .1;
    let mut words = flags.split_whitespace();
    if words.clone().any(|w| w == "vmx") {
        Some("vmx")
    } else if words.any(|w| w == "svm") {
        Some("svm")
    } else {
        None
    }
}

/// Decide the accelerator. `requested` is the `--accel` override. `probe`
/// boots a probe VM under KVM and reports whether it worked; it is only
/// called when the host looks capable.
pub async fn choose<F, Fut>(
    requested: Option<Accel>,
    host: &HostVirt,
    probe: F,
) -> Result<AccelChoice, String>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Duration, String>>,
{
    match requested {
        Some(Accel::Tcg) => {
            return Ok(AccelChoice {
                accel: Accel::Tcg,
                reason: "TCG requested explicitly (--accel tcg)".into(),
            })
        }
        Some(Accel::Kvm) => {
            return match &host.dev_kvm {
                Ok(()) => Ok(AccelChoice {
                    accel: Accel::Kvm,
                    reason: "KVM requested explicitly (--accel kvm); probe skipped".into(),
                }),
                Err(e) => Err(format!(
                    "--accel kvm was requested but /dev/kvm cannot be opened ({e}); \
                     drop --accel to fall back to TCG"
                )),
            }
        }
        None => {}
    }
    let tcg = |reason: String| {
        Ok(AccelChoice {
            accel: Accel::Tcg,
            reason,
        })
    };
    let Some(flag) = host.cpu_flag else {
        let mut why =
            "the CPU has no vmx/svm flag (no hardware virtualization visible)".to_string();
        if host.pvm {
            why.push_str("; /dev/kvm here is the kvm_pvm nested hypervisor, which cannot run an ordinary guest kernel");
        } else if host.dev_kvm.is_ok() {
            why.push_str("; /dev/kvm exists but is not backed by hardware virtualization");
        }
        return tcg(format!("TCG: {why}"));
    };
    if let Err(e) = &host.dev_kvm {
        return tcg(format!(
            "TCG: CPU has {flag} but /dev/kvm cannot be opened ({e})"
        ));
    }
    match probe().await {
        Ok(took) => Ok(AccelChoice {
            accel: Accel::Kvm,
            reason: format!(
                "KVM: CPU has {flag}, /dev/kvm opens, and a probe VM booted in {} ms",
                took.as_millis()
            ),
        }),
        Err(e) => tcg(format!(
            "TCG: CPU has {flag} but a probe VM failed under KVM: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(flag: Option<&'static str>, kvm: bool, pvm: bool) -> HostVirt {
        HostVirt {
            cpu_flag: flag,
            dev_kvm: if kvm {
                Ok(())
            } else {
                Err("No such file".into())
            },
            pvm,
        }
    }

    async fn ok_probe() -> Result<Duration, String> {
        Ok(Duration::from_millis(300))
    }
    async fn bad_probe() -> Result<Duration, String> {
        Err("emulation failure".into())
    }
    async fn no_probe() -> Result<Duration, String> {
        panic!("probe must not run")
    }

    #[test]
    fn flags_are_parsed() {
        assert_eq!(cpu_virt_flag("flags\t\t: fpu vme vmx sse"), Some("vmx"));
        assert_eq!(cpu_virt_flag("flags : fpu svm"), Some("svm"));
        assert_eq!(cpu_virt_flag("flags : fpu vmxx"), None);
        assert_eq!(cpu_virt_flag(""), None);
    }

    #[tokio::test]
    async fn pvm_host_without_flags_gets_tcg_with_reason() {
        let c = choose(None, &host(None, true, true), no_probe)
            .await
            .unwrap();
        assert_eq!(c.accel, Accel::Tcg);
        assert!(c.reason.contains("kvm_pvm"), "{}", c.reason);
    }

    #[tokio::test]
    async fn capable_host_uses_kvm_only_if_the_probe_boots() {
        let c = choose(None, &host(Some("vmx"), true, false), ok_probe)
            .await
            .unwrap();
        assert_eq!(c.accel, Accel::Kvm);
        let c = choose(None, &host(Some("vmx"), true, false), bad_probe)
            .await
            .unwrap();
        assert_eq!(c.accel, Accel::Tcg);
        assert!(c.reason.contains("emulation failure"));
        let c = choose(None, &host(Some("svm"), false, false), no_probe)
            .await
            .unwrap();
        assert_eq!(c.accel, Accel::Tcg);
    }

    #[tokio::test]
    async fn overrides_win_but_kvm_needs_dev_kvm() {
        let c = choose(Some(Accel::Tcg), &host(Some("vmx"), true, false), no_probe)
            .await
            .unwrap();
        assert_eq!(c.accel, Accel::Tcg);
        let c = choose(Some(Accel::Kvm), &host(None, true, true), no_probe)
            .await
            .unwrap();
        assert_eq!(c.accel, Accel::Kvm);
        let e = choose(Some(Accel::Kvm), &host(None, false, false), no_probe)
            .await
            .unwrap_err();
        assert!(e.contains("/dev/kvm"));
    }
}
