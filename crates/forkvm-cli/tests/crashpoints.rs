//! Crash consistency of snapshots: the daemon is killed (SIGKILL, by an
//! injected crash point, `FORKVM_CRASH_AT`) at every step of a snapshot's
//! freeze and publication, and restarted. Afterwards every listed snapshot
//! spawns and its child sees the source's data, the source still runs, it
//! can snapshot again and that snapshot spawns, and no staging is left.
//! Run with `make test`.
//!
//! One source per test: the restarted daemon re-attaches it, so the cost per
//! point is a daemon start, a snapshot and a few spawns, not a boot.
//! `FORKVM_TEST_CRASH_POINTS=a,b` runs only those points (to debug one).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::*;

/// The points a clone's `forkvm snapshot` (a `diff` save) goes through, in
/// order: every point the store declares but those only a `shared` save
/// (`freeze.memory_copied`), a live save (`publish.live_copied`) or a
/// sandbox with volumes (`freeze.volumes_saved`) reaches.
fn diff_points() -> Vec<&'static str> {
    const NOT_DIFF: &[&str] = &[
        "freeze.memory_copied",
        "freeze.volumes_saved",
        "publish.live_copied",
        "splice.pages_written",
        "splice.disk_merged",
        "splice.committed",
    ];
    forkvm_store::crash::POINTS
        .iter()
        .copied()
        .filter(|p| !NOT_DIFF.contains(p))
        .collect()
}

/// The points only a `shared` snapshot (of a sandbox that owns its RAM) or
/// a live save reaches, with the window of issue 30 again for these modes.
const SHARED_POINTS: &[&str] = &[
    "freeze.disk_frozen",
    "freeze.memory_copied",
    "store.files_moved",
];
const LIVE_POINTS: &[&str] = &["freeze.disk_frozen", "publish.live_copied"];

fn selected(points: &[&'static str]) -> Vec<&'static str> {
    match std::env::var("FORKVM_TEST_CRASH_POINTS") {
        Ok(only) if !only.is_empty() => points
            .iter()
            .copied()
            .filter(|p| only.split(',').any(|o| o == *p))
            .collect(),
        _ => points.to_vec(),
    }
}

fn snapshot_ids(d: &Daemon) -> Vec<String> {
    ids(&d.json(&["snapshot", "ls"])["snapshots"])
}

/// The daemon must have killed itself at `point` while running `take`.
fn wait_for_crash(d: &mut Daemon, point: &str, out: &std::process::Output) {
    let mut c = d.child.take().expect("a daemon");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().expect("wait") {
            break Some(s);
        }
        if t.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(status) = status else {
        // SAFETY: signalling the daemon this test started.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let _ = c.wait();
        panic!(
            "crash point {point} was never reached (the snapshot answered: {} {})",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        );
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the daemon should have killed itself at {point}: {status}; {}",
        d.log()
    );
    assert!(
        !out.status.success(),
        "a snapshot answered although its daemon died at {point}"
    );
}

/// Spawn a child of `snap` and check it sees `mark` in /root/mark.
fn spawns_with(d: &Daemon, snap: &str, mark: &str, why: &str) {
    let o = d.run(&["spawn", "--snapshot", snap]);
    assert!(
        o.status.success(),
        "{why}: snapshot {snap} does not spawn: {}\n{}",
        stderr(&o),
        d.log()
    );
    let child = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(
        sh(d, &child, "cat /root/mark"),
        format!("{mark}\n"),
        "{why}"
    );
    d.ok(&["rm", &child]);
}

/// Kill the daemon at each of `points` while `take` snapshots `src`, and
/// check what the restarted daemon offers. `take` gets the source's id.
fn crash_each(d: &mut Daemon, src: &str, points: &[&str], take: &dyn Fn(&str) -> Vec<String>) {
    for point in points {
        let t = Instant::now();
        sh(d, src, &format!("echo {point} > /root/mark; sync"));
        let before = snapshot_ids(d);
        d.stop(libc::SIGTERM);
        d.env.retain(|(k, _)| k != forkvm_store::crash::ENV);
        d.env
            .push((forkvm_store::crash::ENV.into(), point.to_string()));
        d.spawn_process();
        let args = take(src);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = d.run(&args);
        wait_for_crash(d, point, &out);
        d.env.retain(|(k, _)| k != forkvm_store::crash::ENV);
        d.spawn_process();

        let staging: Vec<String> = std::fs::read_dir(d.home.join("snapshots"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect();
        assert!(staging.is_empty(), "{point}: staging left: {staging:?}");
        let dir = d.home.join("sandboxes").join(src);
        let states: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".state"))
            .collect();
        assert!(states.is_empty(), "{point}: state files left: {states:?}");
        // The source runs on, with its data.
        assert_eq!(
            d.json(&["inspect", src])["state"],
            "running",
            "{point}: the source"
        );
        let o = d.run(&["exec", src, "--", "cat", "/root/mark"]);
        assert!(
            o.status.success(),
            "{point}: the source does not answer: {}\n{}\n{}",
            stderr(&o),
            d.log(),
            std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default()
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{point}\n"));
        // Whatever is listed now is complete: it spawns, with the data.
        let after = snapshot_ids(d);
        let new: Vec<&String> = after.iter().filter(|s| !before.contains(s)).collect();
        assert!(new.len() <= 1, "{point}: {new:?}");
        for s in &new {
            spawns_with(d, s, point, &format!("{point}: the crashed snapshot"));
        }
        // The source can snapshot again, and that snapshot spawns: its disk
        // layer's chain goes through whatever the crash left.
        let again = d.ok(&["snapshot", src]).trim().to_string();
        spawns_with(d, &again, point, &format!("{point}: the next snapshot"));
        // Keep the list short for the next point (and collect their layers).
        for s in new.iter().map(|s| s.as_str()).chain([again.as_str()]) {
            d.ok(&["snapshot", "rm", s]);
        }
        // No chain was ever unreadable, let alone broken.
        assert!(
            !d.log().contains("layer collection skipped") && !d.log().contains("is broken"),
            "{point}: {}",
            d.log()
        );
        eprintln!(
            "crash point {point}: checked in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
}

/// A clone (the default sandbox) killed at every step of a `diff` snapshot,
/// then of a live one.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_daemon_killed_at_any_step_of_a_snapshot_leaves_it_whole_or_absent() {
    let t = Instant::now();
    let mut d = Daemon::start();
    let src = d.ok(&["spawn"]).trim().to_string();
    crash_each(&mut d, &src, &selected(&diff_points()), &|s| {
        vec!["snapshot".into(), s.into()]
    });
    crash_each(&mut d, &src, &selected(LIVE_POINTS), &|s| {
        ["branch", s, "--mode", "live", "--count", "0"]
            .map(String::from)
            .to_vec()
    });
    d.ok(&["rm", &src]);
    eprintln!("all crash points in {:.1} s", t.elapsed().as_secs_f64());
}

/// A sandbox that owns its RAM (a `shared` snapshot copies it while the
/// source is stopped) killed at the steps only that kind has.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_daemon_killed_while_copying_memory_leaves_the_snapshot_whole_or_absent() {
    let mut d = Daemon::start();
    let src = d.ok(&["spawn", "--no-template"]).trim().to_string();
    crash_each(&mut d, &src, &selected(SHARED_POINTS), &|s| {
        vec!["snapshot".into(), s.into()]
    });
    d.ok(&["rm", &src]);
}

/// A checkpoint pruned out of the middle of a timeline (spliced into the
/// next one) with the daemon killed at each step of the splice: afterwards
/// every listed checkpoint spawns with its own data, and nothing the splice
/// wrote is left unnamed.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_daemon_killed_while_pruning_a_checkpoint_keeps_the_timeline_whole() {
    let mut d = Daemon::start();
    for point in [
        "splice.pages_written",
        "splice.disk_merged",
        "splice.committed",
    ] {
        let src = d.ok(&["spawn"]).trim().to_string();
        let mut cps = Vec::new();
        for n in 1..=2 {
            // Synced: the first checkpoint's disk layer holds `first`, the
            // second's (thin) only what changed since.
            let first = if n == 1 {
                "echo first > /root/first; "
            } else {
                ""
            };
            sh(
                &d,
                &src,
                &format!("{first}echo {point}-{n} > /root/mark; sync"),
            );
            cps.push(
                d.json(&["checkpoint", &src])["id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        d.stop(libc::SIGTERM);
        d.env
            .push((forkvm_store::crash::ENV.into(), point.to_string()));
        d.spawn_process();
        // Keeping the last one prunes the first: spliced into the second.
        let out = d.run(&["checkpoint", &src, "--keep-last", "1", "--policy-only"]);
        wait_for_crash(&mut d, point, &out);
        d.env.retain(|(k, _)| k != forkvm_store::crash::ENV);
        d.spawn_process();
        let listed = snapshot_ids(&d);
        assert!(
            listed.contains(&cps[1]),
            "{point}: the kept checkpoint is gone"
        );
        for (n, cp) in cps.iter().enumerate() {
            if listed.contains(cp) {
                spawns_with(&d, cp, &format!("{point}-{}", n + 1), point);
            }
        }
        let dir = d.home.join("snapshots").join(&cps[1]);
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n.ends_with(".splice")
                    || n == forkvm_store::splice_disk::DISK_SPLICE
                    || (n.starts_with("memory.") && n.ends_with(".diff"))
            })
            .collect();
        let named = d.json(&["snapshot", "inspect", &cps[1]]);
        assert_eq!(left.len(), 1, "{point}: {left:?} in {}: {named}", cps[1]);
        // The kept checkpoint reads the first one's blocks from its own disk
        // chain (the page cache dropped), whether or not they were merged.
        let kid = d.ok(&["spawn", "--snapshot", &cps[1]]).trim().to_string();
        assert_eq!(
            sh(
                &d,
                &kid,
                "echo 3 > /proc/sys/vm/drop_caches; cat /root/first /root/mark"
            ),
            format!("first\n{point}-2\n"),
            "{point}"
        );
        d.ok(&["rm", &kid]);
        // The timeline goes on: the next checkpoint spawns.
        sh(&d, &src, &format!("echo {point}-3 > /root/mark"));
        let next = d.json(&["checkpoint", &src])["id"]
            .as_str()
            .unwrap()
            .to_string();
        spawns_with(&d, &next, &format!("{point}-3"), point);
        d.ok(&["rm", &src]);
        eprintln!("crash point {point}: the timeline is whole");
    }
}
