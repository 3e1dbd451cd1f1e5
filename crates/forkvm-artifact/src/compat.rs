//! Which hosts can restore a snapshot: the rule, decided before a pull
//! fetches or writes anything.
//!
//! A restore loads QEMU's device state into a new QEMU and maps the guest's
//! memory as it was, so the receiving host must recreate the machine
//! exactly:
//!
//! | requirement | rule | why |
//! |---|---|---|
//! | architecture | equal (`x86_64`) | guest code and CPU state |
//! | QEMU | same major.minor release | `microvm` is not a versioned machine type: QEMU keeps its migration format only within a release (stable x.y.z updates are bug fixes) |
//! | machine | its type in the host's QEMU | the stream holds a section per device |
//! | accelerator | equal | forkvm runs `-cpu max` under TCG and `-cpu host` under KVM: the guest kernel chose code paths for the CPUID it saw, and KVM's state sections (kvmclock) are absent from a TCG stream. QEMU does not support moving a running guest between the two |
//! | CPU, under KVM | same vendor, and every CPU flag of the source host present here | `-cpu host` exposes the host's CPUID; a guest that uses an instruction the new CPU lacks faults |
//! | CPU, under TCG | `max` of the same QEMU release | TCG emulates the model, so the host CPU does not matter |
//! | guest kernel and initramfs | same SHA-256 | QEMU's `-kernel` loader puts them in ROM regions whose sizes the stream checks, and the agent in the initramfs must speak the daemon's protocol |

use serde::{Deserialize, Serialize};

/// What a snapshot needs of the host that restores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requires {
    pub arch: String,
    /// The first line of `qemu-system-x86_64 --version` on the source host.
    pub qemu: String,
    /// `-M` of the snapshot, e.g. `microvm,acpi=on,pic=off,pit=off`.
    pub machine: String,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// `-cpu`: `max` (TCG) or `host` (KVM).
    pub cpu_model: String,
    /// The source host's CPU vendor (`GenuineIntel`, `AuthenticAMD`).
    pub cpu_vendor: String,
    /// Under KVM: the source host's CPU flags (`/proc/cpuinfo`), sorted.
    /// Empty under TCG.
    #[serde(default)]
    pub cpu_flags: Vec<String>,
    /// Hex SHA-256 of the guest kernel and initramfs.
    pub kernel_sha256: String,
    pub initrd_sha256: String,
}

/// What this host offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostProfile {
    pub arch: String,
    pub qemu: String,
    /// Machine types the host's QEMU has (`-machine help`).
    pub machine_types: Vec<String>,
    pub accel: String,
    pub cpu_model: String,
    pub cpu_vendor: String,
    pub cpu_flags: Vec<String>,
    pub kernel_sha256: String,
    pub initrd_sha256: String,
}

/// `(major, minor)` from a `--version` line (`QEMU emulator version
/// 10.0.2 (…)`) or a bare `10.0.2`.
pub fn release(qemu: &str) -> Option<(u32, u32)> {
    let v = qemu
        .split("version ")
        .nth(1)
        .unwrap_or(qemu)
        .split_whitespace()
        .next()?;
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next().unwrap_or("0").parse().ok()?;
    Some((major, minor))
}

fn short(s: &str) -> &str {
    s.get(..12).unwrap_or(s)
}

/// Check `req` against `host`: `Err` lists every reason the host cannot
/// restore the snapshot, each saying what would.
pub fn check(req: &Requires, host: &HostProfile) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    if req.arch != host.arch {
        why.push(format!(
            "it is an {} guest and this host is {}",
            req.arch, host.arch
        ));
    }
    match (release(&req.qemu), release(&host.qemu)) {
        (Some(a), Some(b)) if a == b => {}
        (a, b) => why.push(format!(
            "it was taken with QEMU {} and this host has QEMU {}; a snapshot restores only \
             under the same QEMU major.minor release (install QEMU {}.{} here, or take the \
             snapshot again on a host with this QEMU)",
            a.map_or_else(|| format!("{:?}", req.qemu), |(x, y)| format!("{x}.{y}")),
            b.map_or_else(|| format!("{:?}", host.qemu), |(x, y)| format!("{x}.{y}")),
            a.map_or(0, |v| v.0),
            a.map_or(0, |v| v.1),
        )),
    }
    let mtype = req.machine.split(',').next().unwrap_or_default();
    if !host.machine_types.iter().any(|t| t == mtype) {
        why.push(format!(
            "it needs QEMU's {mtype:?} machine type, which this host's QEMU lacks"
        ));
    }
    if req.accel != host.accel {
        why.push(format!(
            "it was taken under {} and this host runs guests under {}; forkvm does not move \
             a running guest between TCG and KVM (different CPU models and device state); \
             pull it on a {} host, or run the daemon here with FORKVM_ACCEL={}",
            req.accel.to_uppercase(),
            host.accel.to_uppercase(),
            req.accel.to_uppercase(),
            req.accel
        ));
    } else if req.cpu_model != host.cpu_model {
        why.push(format!(
            "it was taken with -cpu {} and this host uses -cpu {}",
            req.cpu_model, host.cpu_model
        ));
    } else if req.accel == "kvm" {
        if req.cpu_vendor != host.cpu_vendor {
            why.push(format!(
                "it was taken on a {} CPU and this host's is {}",
                req.cpu_vendor, host.cpu_vendor
            ));
        }
        let missing: Vec<&str> = req
            .cpu_flags
            .iter()
            .filter(|f| !host.cpu_flags.contains(f))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            why.push(format!(
                "this host's CPU lacks features the guest may use: {}",
                missing.join(" ")
            ));
        }
    }
    if req.kernel_sha256 != host.kernel_sha256 || req.initrd_sha256 != host.initrd_sha256 {
        why.push(format!(
            "its guest kernel/initramfs (sha256 {}…/{}…) differ from this host's ({}…/{}…); \
             install the same forkvm guest artefacts here (scripts/setup.sh of the same \
             forkvm version)",
            short(&req.kernel_sha256),
            short(&req.initrd_sha256),
            short(&host.kernel_sha256),
            short(&host.initrd_sha256)
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why)
    }
}

/// The rule in one paragraph, for `forkvm doctor`.
pub fn rule_text(host: &HostProfile) -> String {
    let (maj, min) = release(&host.qemu).unwrap_or((0, 0));
    let cpu = if host.accel == "kvm" {
        format!(
            "taken under KVM on a {} CPU whose flags this CPU has",
            host.cpu_vendor
        )
    } else {
        "taken under TCG (-cpu max); the host CPU does not matter".to_string()
    };
    format!(
        "snapshots pulled here must be: x86_64; QEMU {maj}.{min}.x; {cpu}; with guest kernel \
         {}… and initramfs {}…",
        short(&host.kernel_sha256),
        short(&host.initrd_sha256)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Requires {
        Requires {
            arch: "x86_64".into(),
            qemu: "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2)".into(),
            machine: "microvm,acpi=on,pic=off,pit=off".into(),
            accel: "tcg".into(),
            cpu_model: "max".into(),
            cpu_vendor: "GenuineIntel".into(),
            cpu_flags: vec![],
            kernel_sha256: "a".repeat(64),
            initrd_sha256: "b".repeat(64),
        }
    }

    fn host() -> HostProfile {
        HostProfile {
            arch: "x86_64".into(),
            qemu: "QEMU emulator version 10.0.7".into(),
            machine_types: vec!["microvm".into(), "q35".into()],
            accel: "tcg".into(),
            cpu_model: "max".into(),
            cpu_vendor: "AuthenticAMD".into(),
            cpu_flags: vec!["sse2".into()],
            kernel_sha256: "a".repeat(64),
            initrd_sha256: "b".repeat(64),
        }
    }

    #[test]
    fn tcg_ignores_the_host_cpu_and_the_stable_release() {
        assert_eq!(check(&req(), &host()), Ok(()));
    }

    #[test]
    fn each_mismatch_is_named() {
        type Edit = Box<dyn Fn(&mut Requires)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|r| r.qemu = "QEMU emulator version 9.2.0".into()),
                "QEMU 9.2",
            ),
            (Box::new(|r| r.qemu = "11.0.0".into()), "QEMU 11.0"),
            (Box::new(|r| r.arch = "aarch64".into()), "aarch64"),
            (Box::new(|r| r.machine = "q99,acpi=on".into()), "\"q99\""),
            (Box::new(|r| r.accel = "kvm".into()), "between TCG and KVM"),
            (Box::new(|r| r.cpu_model = "host".into()), "-cpu host"),
            (Box::new(|r| r.kernel_sha256 = "c".repeat(64)), "kernel"),
            (Box::new(|r| r.initrd_sha256 = "c".repeat(64)), "initramfs"),
        ];
        for (edit, needle) in cases {
            let mut r = req();
            edit(&mut r);
            let why = check(&r, &host()).expect_err(needle);
            assert!(why.iter().any(|w| w.contains(needle)), "{needle}: {why:?}");
        }
    }

    #[test]
    fn kvm_needs_the_vendor_and_every_flag() {
        let mut r = req();
        let mut h = host();
        (r.accel, r.cpu_model) = ("kvm".into(), "host".into());
        (h.accel, h.cpu_model) = ("kvm".into(), "host".into());
        r.cpu_vendor = "AuthenticAMD".into();
        r.cpu_flags = vec!["sse2".into()];
        assert_eq!(check(&r, &h), Ok(()));
        r.cpu_flags.push("avx512f".into());
        let why = check(&r, &h).unwrap_err();
        assert!(why[0].contains("avx512f"), "{why:?}");
        r.cpu_flags.pop();
        r.cpu_vendor = "GenuineIntel".into();
        assert!(check(&r, &h).unwrap_err()[0].contains("GenuineIntel"));
    }

    #[test]
    fn releases_parse() {
        assert_eq!(release("QEMU emulator version 10.0.2 (x)"), Some((10, 0)));
        assert_eq!(release("9.2.1"), Some((9, 2)));
        assert_eq!(release("11"), Some((11, 0)));
        assert_eq!(release("garbage"), None);
        assert!(rule_text(&host()).contains("QEMU 10.0.x"));
    }
}
