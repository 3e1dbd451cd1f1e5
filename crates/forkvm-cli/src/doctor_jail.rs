//! `forkvm doctor`'s jail checks (docs/security.md): each piece the daemon
//! confines QEMU with, probed for real where that is cheap.
//!
//! * root: the daemon builds jails as root and drops QEMU to a uid of its own;
//! * mount namespace + pivot_root + uid drop: `qemu --version` run inside a
//!   real jail (the same code path as a sandbox, minus the cgroup);
//! * seccomp: a QEMU with no machine started with forkvm's `-sandbox` filter
//!   and told to quit over QMP;
//! * cgroups: the layout found (v2 or v1) and which one sandboxes go into.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use forkvm_daemon::cgroup::Layout;
use forkvm_qemu::jail::Jail;

use crate::doctor::{check, Check, Status};

const NO_JAIL: &str = "or run `forkvm serve --no-jail` (debugging only: QEMU then runs as root)";

pub fn checks(qemu: &Path) -> Vec<Check> {
    let mut v = Vec::new();
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    v.push(if root {
        check("jail: root", Status::Ok, "the daemon can build jails", None)
    } else {
        check(
            "jail: root",
            Status::Warn,
            "not root: the jail probes below are skipped, and a daemon run as this user cannot jail QEMU",
            Some("run doctor and `forkvm serve` as root"),
        )
    });
    if root {
        v.push(jail_probe(qemu));
    }
    v.push(seccomp_probe(qemu));
    v.push(match Layout::detect() {
        Some(l) => check(
            "jail: cgroups",
            Status::Ok,
            format!("{}: each sandbox's QEMU gets its own cgroup there", l.describe()),
            None,
        ),
        None => check(
            "jail: cgroups",
            Status::Warn,
            "no usable cgroup hierarchy under /sys/fs/cgroup: QEMUs run without a cgroup of their own",
            Some("mount cgroup2 at /sys/fs/cgroup (or the v1 cpu, memory, pids controllers)"),
        ),
    });
    v
}

/// Run `qemu --version` in a jail like a sandbox's.
fn jail_probe(qemu: &Path) -> Check {
    const NAME: &str = "jail: mount namespace, pivot_root, uid";
    let Some(bin) = forkvm_qemu::process::resolve(qemu) else {
        return check(
            NAME,
            Status::Fail,
            format!("{} not found", qemu.display()),
            None,
        );
    };
    let root = std::env::temp_dir().join(format!("forkvm-doctor-jail-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&root) {
        return check(
            NAME,
            Status::Warn,
            format!("cannot create {}: {e}", root.display()),
            None,
        );
    }
    let jail = Jail {
        uid: forkvm_daemon::config::DEFAULT_UIDS.0,
        gid: forkvm_daemon::config::DEFAULT_UIDS.0,
        root: root.clone(),
        mounts: Jail::base_mounts(&bin, false),
        cgroup_procs: vec![],
        inherit: vec![],
        rlimits: Default::default(),
    };
    let r = (|| {
        let (prepared, _) = jail.prepare(None).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--version").stdin(Stdio::null());
        // SAFETY: the closure runs between fork and exec and makes only the
        // prepared syscalls (see forkvm_qemu::jail::Prepared::enter).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || prepared.enter());
        }
        let o = cmd.output().map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
        }
    })();
    let _ = std::fs::remove_dir(&root);
    match r {
        Ok(()) => check(
            NAME,
            Status::Ok,
            "QEMU runs in a private mount namespace with only /usr and a few devices, as an unprivileged uid",
            None,
        ),
        Err(e) => check(
            NAME,
            Status::Fail,
            format!("QEMU cannot run jailed: {e}"),
            Some(NO_JAIL),
        ),
    }
}

/// Start QEMU with forkvm's seccomp filter and make it quit.
fn seccomp_probe(qemu: &Path) -> Check {
    const NAME: &str = "jail: QEMU seccomp (-sandbox)";
    let child = Command::new(qemu)
        .args(["-M", "none", "-nodefaults", "-display", "none", "-S"])
        .args(["-sandbox", forkvm_qemu::spec::SECCOMP, "-qmp", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let out = child.and_then(|mut c| {
        if let Some(mut i) = c.stdin.take() {
            i.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"quit\"}\n")?;
        }
        c.wait_with_output()
    });
    match out {
        Ok(o) if o.status.success() => check(
            NAME,
            Status::Ok,
            format!("accepted: -sandbox {}", forkvm_qemu::spec::SECCOMP),
            None,
        ),
        Ok(o) => check(
            NAME,
            Status::Fail,
            format!(
                "QEMU refused its seccomp filter: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Some("install a QEMU built with libseccomp (scripts/setup.sh), or run `forkvm serve --no-jail` (debugging only)"),
        ),
        Err(e) => check(NAME, Status::Fail, format!("cannot run QEMU: {e}"), None),
    }
}
