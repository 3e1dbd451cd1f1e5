//! `forkvm doctor`: one line per thing forkvm needs, each ok, warn or fail,
//! with the fix. Exits 0 only when forkvm can run (no `fail`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use forkvm_daemon::Config;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
pub(crate) struct Check {
    name: &'static str,
    status: Status,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

pub(crate) fn check(
    name: &'static str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<&str>,
) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        fix: fix.map(str::to_string),
    }
}

const SETUP: &str = "run scripts/setup.sh (or `make setup`)";

pub async fn run(json: bool) -> Result<ExitCode> {
    let home = forkvm_api::home_dir();
    let cfg = Config::for_home(&home);
    let mut checks = qemu_checks(&cfg).await;
    let accel = accel_check(&cfg, &mut checks).await;
    checks.extend(guest_checks(&cfg, accel.as_deref()).await);
    checks.extend(host_checks(&home));
    checks.extend(kernel_checks(&cfg));
    checks.extend(daemon_checks().await?);
    report(&checks, json)
}

/// QEMU, the features forkvm relies on, and qemu-img.
async fn qemu_checks(cfg: &Config) -> Vec<Check> {
    let mut checks = Vec::new();
    match forkvm_qemu::features::version(&cfg.qemu).await {
        Ok(v) if v.major >= 10 => checks.push(check("qemu", Status::Ok, v.text.clone(), None)),
        Ok(v) => checks.push(check(
            "qemu",
            Status::Fail,
            format!(
                "{} is too old; forkvm needs >= 10 (mapped-ram, rom=)",
                v.text
            ),
            Some("install qemu-system-x86 from bookworm-backports: scripts/setup.sh"),
        )),
        Err(e) => checks.push(check("qemu", Status::Fail, e, Some(SETUP))),
    }
    let qemu_ok = checks.last().is_some_and(|c| c.status == Status::Ok);
    if qemu_ok {
        match forkvm_qemu::features::probe(&cfg.qemu, &std::env::temp_dir()).await {
            Ok(f) => {
                let feat = |name, have: bool, why: &str, hard: bool| {
                    check(
                        name,
                        if have {
                            Status::Ok
                        } else if hard {
                            Status::Fail
                        } else {
                            Status::Warn
                        },
                        if have {
                            format!("available ({why})")
                        } else {
                            format!("missing ({why})")
                        },
                        if have { None } else { Some(SETUP) },
                    )
                };
                checks.push(feat(
                    "qemu: microvm machine",
                    f.microvm,
                    "the machine type every sandbox uses",
                    true,
                ));
                let missing = &f.microvm_missing_options;
                checks.push(check(
                    "qemu: microvm options",
                    if f.microvm && missing.is_empty() {
                        Status::Ok
                    } else {
                        Status::Fail
                    },
                    if missing.is_empty() {
                        format!(
                            "accepted: {} (no legacy PIC/PIT, which crash cold boots; docs/boot.md)",
                            forkvm_qemu::spec::MACHINE
                        )
                    } else {
                        format!(
                            "this QEMU's microvm lacks {}; forkvm boots {}",
                            missing.join(", "),
                            forkvm_qemu::spec::MACHINE
                        )
                    },
                    (!missing.is_empty()).then_some(SETUP),
                ));
                checks.push(feat(
                    "qemu: mapped-ram",
                    f.mapped_ram,
                    "live snapshots to a sparse file",
                    false,
                ));
                checks.push(feat(
                    "qemu: x-ignore-shared",
                    f.x_ignore_shared,
                    "templates save device state only",
                    true,
                ));
                checks.push(feat(
                    "qemu: memory-backend-file rom=",
                    f.memory_backend_rom,
                    "read-only copy-on-write clone memory",
                    true,
                ));
                checks.push(feat(
                    "qemu: vmgenid",
                    f.vmgenid,
                    "QEMU wires VMGenID for pc/q35 only, so on microvm the guest agent reseeds the RNG after a fork",
                    false,
                ));
            }
            Err(e) => checks.push(check(
                "qemu features",
                Status::Fail,
                format!("probe failed: {e}"),
                Some(SETUP),
            )),
        }
    }
    match which("qemu-img") {
        Some(p) => checks.push(check("qemu-img", Status::Ok, p, None)),
        None => checks.push(check(
            "qemu-img",
            Status::Fail,
            "not found (copy-on-write disks need it)",
            Some(SETUP),
        )),
    }
    checks
}

/// The accelerator the daemon would choose, and why; its name for the
/// portability check.
async fn accel_check(cfg: &Config, checks: &mut Vec<Check>) -> Option<String> {
    match forkvm_daemon::choose_accel(cfg, None).await {
        Ok(a) => {
            checks.push(check(
                "accelerator",
                Status::Ok,
                format!("{} — {}", a.accel, a.reason),
                None,
            ));
            Some(a.accel.to_string())
        }
        Err(e) => {
            checks.push(check("accelerator", Status::Fail, e, None));
            None
        }
    }
}

/// The guest kernel, initramfs and default image, and whether pulled
/// snapshots can be restored here.
async fn guest_checks(cfg: &Config, accel: Option<&str>) -> Vec<Check> {
    let mut checks = Vec::new();
    let kernel = cfg.kernel();
    match std::fs::read(&kernel).map(|b| b.starts_with(b"\x7fELF")) {
        Ok(true) => checks.push(check(
            "guest kernel",
            Status::Ok,
            kernel.display().to_string(),
            None,
        )),
        Ok(false) => checks.push(check(
            "guest kernel",
            Status::Fail,
            format!("{} is not an ELF vmlinux", kernel.display()),
            Some("scripts/build-guest.sh --force"),
        )),
        Err(e) => checks.push(check(
            "guest kernel",
            Status::Fail,
            format!("{}: {e}", kernel.display()),
            Some(SETUP),
        )),
    }
    checks.push(initrd_check(&cfg.initrd()));
    checks.push(file_check("default image", &cfg.image_rootfs("default")));
    checks.push(portability_check(cfg, accel).await);
    checks
}

/// Free disk where the home is, /dev/shm, and memory.
fn host_checks(home: &Path) -> Vec<Check> {
    vec![
        disk_check("free disk (FORKVM_HOME)", home, 2 << 30, 10 << 30),
        disk_check(
            "free RAM disk (/dev/shm)",
            Path::new("/dev/shm"),
            512 << 20,
            4 << 30,
        ),
        mem_check(),
    ]
}

/// What the kernel must offer: tun, namespaces, the network pool, uffd,
/// the jail and volumes.
fn kernel_checks(cfg: &Config) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(if Path::new("/dev/net/tun").exists() {
        check(
            "/dev/net/tun",
            Status::Ok,
            "present (sandbox networking)",
            None,
        )
    } else {
        check(
            "/dev/net/tun",
            Status::Warn,
            "missing: sandboxes cannot get a network",
            Some("modprobe tun"),
        )
    });
    checks.push(netns_check());
    checks.extend(crate::doctor_net::checks(
        &std::env::var("FORKVM_NET_POOL").unwrap_or_else(|_| cfg.net_pool.clone()),
    ));
    checks.push(uffd_check());
    checks.extend(crate::doctor_jail::checks(&cfg.qemu));
    checks.extend(crate::doctor_volumes::checks(&cfg.home));
    checks
}

/// Whether a daemon answers, and whether it can give sandboxes a network.
async fn daemon_checks() -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    let client = forkvm_api::Client::from_env().map_err(|e| anyhow::anyhow!(e))?;
    match client.health().await {
        Ok(h) => {
            checks.push(check(
                "daemon",
                Status::Ok,
                format!("answers at {} (version {})", client.target, h.version),
                None,
            ));
            if let Ok(info) = client.info().await {
                let n = info.network;
                checks.push(if n.available {
                    check(
                        "daemon: sandbox networks",
                        Status::Ok,
                        format!("nat available, uplinks from {}", n.pool),
                        None,
                    )
                } else {
                    check(
                        "daemon: sandbox networks",
                        Status::Warn,
                        format!(
                            "unavailable, sandboxes get network: none ({})",
                            n.reason.unwrap_or_default()
                        ),
                        Some("fix the network lines above, then restart the daemon"),
                    )
                });
            }
        }
        Err(forkvm_api::ClientError::Connect { .. }) => checks.push(check(
            "daemon",
            Status::Warn,
            format!("nothing answers at {}", client.target),
            Some("the CLI starts a daemon on demand, or run `forkvm serve`"),
        )),
        Err(e) => checks.push(check(
            "daemon",
            Status::Fail,
            e.to_string(),
            Some("check $FORKVM_HOME/daemon.log"),
        )),
    }
    Ok(checks)
}

/// Print the checks (a table, or JSON) and the verdict; exit 1 on a failure.
fn report(checks: &[Check], json: bool) -> Result<ExitCode> {
    let failed = checks.iter().any(|c| c.status == Status::Fail);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "ok": !failed, "checks": checks }))?
        );
    } else {
        for c in checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            match &c.fix {
                Some(f) => println!("{tag}  {}: {} — fix: {f}", c.name, c.detail),
                None => println!("{tag}  {}: {}", c.name, c.detail),
            }
        }
        println!(
            "{}",
            if failed {
                "forkvm cannot run here yet: fix the FAIL lines above."
            } else {
                "forkvm can run here."
            }
        );
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Which pulled snapshots this host can restore (docs/registry.md).
async fn portability_check(cfg: &Config, accel: Option<&str>) -> Check {
    let name = "snapshot pulls";
    let (Some(accel), Ok(v)) = (accel, forkvm_qemu::features::version(&cfg.qemu).await) else {
        return check(
            name,
            Status::Warn,
            "unknown until QEMU and the accelerator are",
            None,
        );
    };
    match forkvm_daemon::registry::host::profile(cfg, accel, &v.text).await {
        Ok(p) => check(
            name,
            Status::Ok,
            forkvm_artifact::compat::rule_text(&p),
            None,
        ),
        Err(e) => check(
            name,
            Status::Warn,
            format!("cannot tell: {}", e.message),
            Some(SETUP),
        ),
    }
}

fn which(bin: &str) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

fn file_check(name: &'static str, p: &Path) -> Check {
    match std::fs::metadata(p) {
        Ok(m) if m.len() > 0 => check(
            name,
            Status::Ok,
            format!("{} ({} MiB)", p.display(), m.len() >> 20),
            None,
        ),
        _ => check(
            name,
            Status::Fail,
            format!("{} is missing", p.display()),
            Some(SETUP),
        ),
    }
}

/// The initramfs exists and is page-aligned (see
/// `forkvm_qemu::spec::check_initrd_size`).
fn initrd_check(p: &Path) -> Check {
    let c = file_check("guest initramfs", p);
    if !matches!(c.status, Status::Ok) {
        return c;
    }
    let size = std::fs::metadata(p).map_or(0, |m| m.len());
    match forkvm_qemu::spec::check_initrd_size(size) {
        Ok(()) => c,
        Err(e) => check("guest initramfs", Status::Fail, e, Some(SETUP)),
    }
}

fn statvfs_free(p: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = p.to_path_buf();
    while !p.exists() {
        p = p.parent()?.to_path_buf();
    }
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct we pass; `c` is a valid
    // NUL-terminated path that outlives the call.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut s) != 0 {
            return None;
        }
        Some(s.f_bavail * s.f_frsize)
    }
}

fn disk_check(name: &'static str, p: &Path, fail_below: u64, warn_below: u64) -> Check {
    match statvfs_free(p) {
        Some(free) => {
            let gib = free as f64 / (1u64 << 30) as f64;
            let status = if free < fail_below {
                Status::Fail
            } else if free < warn_below {
                Status::Warn
            } else {
                Status::Ok
            };
            check(
                name,
                status,
                format!("{gib:.1} GiB free at {}", p.display()),
                (status != Status::Ok).then_some("free some space or point FORKVM_HOME elsewhere"),
            )
        }
        None => check(
            name,
            Status::Warn,
            format!("cannot stat {}", p.display()),
            None,
        ),
    }
}

fn mem_check() -> Check {
    let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    });
    match avail {
        Some(kib) if kib >= 1 << 20 => check(
            "free RAM",
            Status::Ok,
            format!("{} MiB available", kib >> 10),
            None,
        ),
        Some(kib) => check(
            "free RAM",
            Status::Warn,
            format!("only {} MiB available", kib >> 10),
            Some("each 512 MiB sandbox can touch up to 512 MiB"),
        ),
        None => check("free RAM", Status::Warn, "cannot read /proc/meminfo", None),
    }
}

fn netns_check() -> Check {
    // Really create a namespace, in a throwaway child, so nothing is left behind.
    match std::process::Command::new("unshare")
        .args(["--net", "true"])
        .status()
    {
        Ok(s) if s.success() => check(
            "network namespaces",
            Status::Ok,
            "a network namespace can be created",
            None,
        ),
        Ok(s) => check(
            "network namespaces",
            Status::Warn,
            format!("`unshare --net` failed ({s})"),
            Some("run the daemon as root"),
        ),
        Err(e) => check(
            "network namespaces",
            Status::Warn,
            format!("cannot run unshare: {e}"),
            Some("apt-get install util-linux"),
        ),
    }
}

fn uffd_check() -> Check {
    // SAFETY: the userfaultfd syscall takes only flags; we close the fd at once.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd >= 0 {
        // SAFETY: fd is a descriptor we just opened and own.
        unsafe { libc::close(fd as i32) };
        check("userfaultfd", Status::Ok, "available", None)
    } else {
        let e = std::io::Error::last_os_error();
        check(
            "userfaultfd",
            Status::Warn,
            format!("unavailable ({e})"),
            Some("run as root or set vm.unprivileged_userfaultfd=1"),
        )
    }
}
