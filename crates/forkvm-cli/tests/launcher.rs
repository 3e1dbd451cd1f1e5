//! The test launcher, `forkvm serve --ephemeral` (docs/testing.md#the-test-launcher):
//! a test run that is killed leaves nothing behind.
//!
//! * `killed_harness_leaves_nothing`: a child harness (this test binary run
//!   again, as `child_harness`) starts a daemon in the launcher's temporary
//!   home and one in a session home, a sandbox in each, reports their pids
//!   and names and waits; it is killed with SIGKILL. Afterwards neither
//!   daemon, reaper, QEMU, network namespace, uplink, cgroup, home nor RAM
//!   directory of that run may remain.
//! * `killed_daemon_is_reaped`: a daemon in a temporary home is killed with
//!   SIGKILL while its sandbox runs; its reaper removes the same things.
//!
//! "Everything" is: the daemon, its reaper, the sandbox's QEMU, network
//! namespace (with its tap) and host uplink, its cgroups and the daemon's
//! cgroup group, the daemon's nftables table, its home and RAM directory.
//!
//! Only what these runs created is looked at, by pid and by name.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// What one sandbox of a run leaves on the host while it exists.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
struct Traces {
    daemon_pid: u32,
    reaper_pid: Option<u32>,
    qemu_pid: u32,
    home: PathBuf,
    run_dir: PathBuf,
    netns: PathBuf,
    uplink: PathBuf,
    cgroups: Vec<PathBuf>,
    /// The daemon's host nftables table.
    nft_table: String,
}

fn traces(d: &Daemon, sb: &Sandbox) -> Traces {
    let daemon_pid = d.child.as_ref().expect("daemon").id();
    let qemu_pid = sb.pid();
    let tail: String = sb.id.chars().filter(char::is_ascii_alphanumeric).collect();
    let tail = &tail[tail.len().saturating_sub(12)..];
    Traces {
        daemon_pid,
        reaper_pid: reaper_of(daemon_pid),
        qemu_pid,
        home: d.home.clone(),
        run_dir: d.run_dir(),
        netns: PathBuf::from(format!("/run/netns/fvm-{}", sb.id)),
        uplink: PathBuf::from(format!("/sys/class/net/fvh{tail}")),
        cgroups: cgroups_of(qemu_pid, &sb.id),
        nft_table: format!("forkvm-{}", forkvm_daemon::config::home_hash(&d.home)),
    }
}

/// The launcher's reaper: the daemon's child that runs the daemon's own
/// executable (`forkvm serve --reaper`; the daemon's other children are
/// QEMUs and helpers of other programs).
fn reaper_of(daemon: u32) -> Option<u32> {
    let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let own = exe(daemon)?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == daemon && exe(pid).as_ref() == Some(&own)).then_some(pid)
    })
}

/// The cgroup directories (v1 and v2) of a sandbox's QEMU that are named
/// after the sandbox.
fn cgroups_of(pid: u32, id: &str) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut out = Vec::new();
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if !path.contains(id) {
            continue;
        }
        let rel = path.trim_start_matches('/');
        let cands: Vec<PathBuf> = if ctrl.is_empty() {
            vec![
                Path::new("/sys/fs/cgroup").join(rel),
                Path::new("/sys/fs/cgroup/unified").join(rel),
            ]
        } else {
            let c = ctrl.split(',').next().unwrap_or("");
            let c = c.strip_prefix("name=").unwrap_or(c);
            vec![Path::new("/sys/fs/cgroup").join(c).join(rel)]
        };
        for c in cands.into_iter().filter(|p| p.is_dir()) {
            // And the daemon's group above it (`forkvm-<home hash>`).
            out.extend(c.parent().map(Path::to_path_buf));
            out.push(c);
        }
    }
    out
}

/// Everything of `t` that still exists.
fn left(t: &Traces) -> Vec<String> {
    let mut v = Vec::new();
    for (what, pid) in [("daemon", Some(t.daemon_pid)), ("reaper", t.reaper_pid)] {
        if let Some(p) = pid {
            if alive(p) {
                v.push(format!("{what} pid {p}"));
            }
        }
    }
    if alive(t.qemu_pid) {
        v.push(format!("QEMU pid {}", t.qemu_pid));
    }
    for p in [&t.home, &t.run_dir, &t.netns, &t.uplink]
        .into_iter()
        .chain(&t.cgroups)
    {
        if p.exists() {
            v.push(p.display().to_string());
        }
    }
    if nft_has(&t.nft_table) {
        v.push(format!("nft table inet {}", t.nft_table));
    }
    v
}

fn nft_has(table: &str) -> bool {
    std::process::Command::new("nft")
        .args(["list", "table", "inet", table])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Before the kill, everything the check looks for must exist (or the
/// check after it would prove nothing).
fn assert_present(t: &Traces, what: &str) {
    let missing: Vec<String> = [
        (alive(t.daemon_pid), "the daemon"),
        (alive(t.qemu_pid), "QEMU"),
        (t.home.is_dir(), "the home"),
        (t.netns.exists(), "the network namespace"),
        (t.uplink.exists(), "the uplink"),
        (!t.cgroups.is_empty(), "a cgroup named after the sandbox"),
        (nft_has(&t.nft_table), "the daemon's nft table"),
    ]
    .into_iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, n)| n.to_string())
    .collect();
    assert!(
        missing.is_empty(),
        "{what}: missing before the kill: {missing:?} in {t:?}"
    );
}

fn wait_gone(ts: &[Traces], why: &str, log: &dyn Fn() -> String) {
    let gone = wait_until(Duration::from_secs(180), || {
        ts.iter().all(|t| left(t).is_empty())
    });
    let rest: Vec<Vec<String>> = ts.iter().map(left).collect();
    assert!(gone, "{why}: left behind after 180 s: {rest:?}\n{}", log());
}

/// Not a test on its own: the child harness of `killed_harness_leaves_nothing`
/// (it does nothing unless that test runs it).
#[test]
#[ignore]
fn child_harness() {
    let Some(out) = std::env::var_os("FORKVM_LAUNCHER_CHILD_OUT") else {
        return;
    };
    let temp = Daemon::start_temporary();
    let session = Daemon::start();
    let a = temp.spawn();
    let b = session.spawn();
    let t = [traces(&temp, &a), traces(&session, &b)];
    let tmp = PathBuf::from(&out).with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&t).unwrap()).unwrap();
    std::fs::rename(&tmp, &out).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[test]
#[ignore]
fn killed_harness_leaves_nothing() {
    require_vm_prereqs();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("traces.json");
    let log = std::fs::File::create(dir.path().join("child.log")).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_harness",
            "--include-ignored",
            "--nocapture",
        ])
        .env("FORKVM_LAUNCHER_CHILD_OUT", &out)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(400), || {
        out.exists() || child.try_wait().ok().flatten().is_some()
    });
    let child_log = || std::fs::read_to_string(dir.path().join("child.log")).unwrap_or_default();
    if !up || !out.exists() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the child harness did not report its sandboxes: {}",
            child_log()
        );
    }
    let ts: Vec<Traces> = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_present(&ts[0], "temporary home");
    assert_present(&ts[1], "session home");
    assert!(
        ts[0].reaper_pid.is_some(),
        "no reaper for the temporary home: {ts:?}"
    );
    // SAFETY: SIGKILL to the child harness this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    wait_gone(&ts, "a SIGKILLed harness", &child_log);
}

#[test]
#[ignore]
fn killed_daemon_is_reaped() {
    let mut d = Daemon::start_temporary();
    let sb = d.spawn();
    let t = traces(&d, &sb);
    assert_present(&t, "temporary home");
    assert!(t.reaper_pid.is_some(), "no reaper: {t:?}");
    std::mem::forget(sb); // its daemon is about to die; nothing to remove through it
    d.stop(libc::SIGKILL);
    // The reaper writes to the daemon's log too.
    wait_gone(&[t], "a SIGKILLed daemon", &|| d.log());
}

/// docs/testing.md: the integration tests are `#[ignore]`d, so plain `cargo
/// test` on a machine without QEMU runs only unit tests. Every test in this
/// directory starts a daemon, so every one (but this check) must be marked.
#[test]
fn every_integration_test_is_marked_ignore() {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        &mut all,
    );
    let mut unmarked = Vec::new();
    for f in &all {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            if *l != "#[test]" && *l != "#[tokio::test]" {
                continue;
            }
            let attrs: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|a| a.starts_with("#["))
                .copied()
                .collect();
            let name = lines[i + 1 + attrs.len()..]
                .iter()
                .find(|x| x.contains("fn "))
                .copied()
                .unwrap_or("?");
            if !attrs.iter().any(|a| a.starts_with("#[ignore"))
                && !name.contains("fn every_integration_test_is_marked_ignore")
            {
                unmarked.push(format!("{}:{}: {name}", f.display(), i + 1));
            }
        }
    }
    assert!(all.len() > 20, "found only {} test files", all.len());
    assert!(
        unmarked.is_empty(),
        "integration tests without #[ignore]: {unmarked:#?}"
    );
}
