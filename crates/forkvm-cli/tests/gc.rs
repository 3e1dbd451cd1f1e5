//! End-to-end test of the garbage collection of branch points, against a
//! real daemon and real microVMs. Run with `make test`.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// `forkvm branch ID ARGS…`: the snapshot id and the children's ids.
fn branch(d: &Daemon, id: &str, args: &[&str]) -> (String, Vec<String>) {
    let mut a = vec!["branch", id];
    a.extend_from_slice(args);
    let v = d.json(&a);
    let snap = v["snapshot"]["id"]
        .as_str()
        .expect("snapshot id")
        .to_string();
    assert_eq!(v["snapshot"]["origin"], "branch", "{v}");
    (snap, ids(&v["children"]))
}

/// The files of a snapshot directory that only the store links: path and
/// allocated bytes.
fn sole_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            (m.is_file() && m.nlink() == 1).then(|| (e.path(), m.blocks() * 512))
        })
        .collect()
}

fn snapshot_ids(d: &Daemon) -> BTreeSet<String> {
    ids(&d.json(&["snapshot", "ls"])["snapshots"])
        .into_iter()
        .collect()
}

/// The ids and bytes of a prune result, in its order.
fn pruned(v: &serde_json::Value) -> Vec<(String, u64)> {
    v["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Branch a sandbox several times; tag one branch point, pin one, spawn a
/// child from one, and build diff chains from that child: one whose tip is
/// tagged, and one nothing needs. A prune frees exactly the branch points
/// nothing needs, children first, with the bytes that left the disk; the
/// kept ones still spawn, the source still runs with its data, and pins
/// survive a restart. Then the background collector (grace 0) takes a
/// branch point as soon as its pin goes.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn unneeded_branch_points_are_collected_and_the_rest_kept() {
    // Background collection runs every second, but with an hour of grace it
    // must leave this test's young branch points alone.
    // Streaming off: this test is about what collection must keep, such as
    // a collected branch point's layer that a running source still reads
    // through (tests/chain.rs covers streams, after which nothing does).
    let mut d = Daemon::start_env(&[
        ("FORKVM_GC_GRACE", "3600"),
        ("FORKVM_GC_INTERVAL", "1"),
        ("FORKVM_DISK_CHAIN_MAX", "0"),
    ]);
    let info = d.json(&["info"]);
    assert_eq!(info["gc"]["enabled"], true, "{info}");
    assert_eq!(info["gc"]["grace_secs"], 3600);
    let src = d.ok(&["spawn", "--no-template"]).trim().to_string();
    sh(
        &d,
        &src,
        "mkdir -p /work && echo precious > /work/data && sync",
    );

    // The tag `prune` would be shadowed by the prune route.
    let o = d.run(&["branch", &src, "--count", "0", "--tag", "prune"]);
    assert!(
        !o.status.success() && stderr(&o).contains("reserved"),
        "{}",
        stderr(&o)
    );

    let (b_tag, _) = branch(&d, &src, &["--count", "0", "--tag", "gc-keep"]);
    let (b_pin, _) = branch(&d, &src, &["--mode", "full", "--count", "0"]);
    let (b_used, kids) = branch(&d, &src, &["--mode", "full", "--count", "1"]);
    let child = kids[0].clone();
    // Written just before the last branch: it lives in that branch point's
    // disk layer, which the source's disk chain keeps going through.
    sh(&d, &src, "echo in-the-last-layer > /work/data2 && sync");
    let (b_gone, _) = branch(&d, &src, &["--count", "0"]);
    let v = d.json(&["snapshot", "pin", &b_pin]);
    assert_eq!(v["pinned"], true);
    assert!(d.ok(&["snapshot", "ls"]).contains("(pinned)"));
    let o = d.run(&["snapshot", "pin", "sn-000000000000"]);
    assert!(
        !o.status.success() && stderr(&o).contains("no snapshot"),
        "{}",
        stderr(&o)
    );

    // Chains of diff snapshots of the child (a clone of a shared snapshot).
    // d1 <- {d2, d3 (tagged)}: d1 stays for d3, d2 goes.
    let (d1, e1) = branch(&d, &child, &["--mode", "diff", "--count", "1"]);
    let (d2, _) = branch(&d, &e1[0], &["--mode", "diff", "--count", "0"]);
    let (d3, _) = branch(
        &d,
        &e1[0],
        &["--mode", "diff", "--count", "0", "--tag", "gc-tip"],
    );
    d.ok(&["rm", &e1[0]]);
    // d4 <- d5, nothing needs either: d5 must go before d4.
    let (d4, e4) = branch(&d, &child, &["--mode", "diff", "--count", "1"]);
    let (d5, _) = branch(&d, &e4[0], &["--mode", "diff", "--count", "0"]);
    d.ok(&["rm", &e4[0]]);
    assert_eq!(d.json(&["snapshot", "inspect", &d5])["kind"], "diff");

    let all = snapshot_ids(&d);
    let gone: BTreeSet<String> = [&b_gone, &d2, &d4, &d5].into_iter().cloned().collect();
    let kept: BTreeSet<String> = [&b_tag, &b_pin, &b_used, &d1, &d3]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(
        all,
        gone.union(&kept).cloned().collect(),
        "snapshots before the prune"
    );

    // Within the grace period nothing goes, and a dry run removes nothing.
    assert!(pruned(&d.json(&["snapshot", "prune"])).is_empty());
    let dry = d.json(&["snapshot", "prune", "--all", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    let estimate: HashMap<String, u64> = pruned(&dry).into_iter().collect();
    assert_eq!(estimate.keys().cloned().collect::<BTreeSet<_>>(), gone);
    assert_eq!(snapshot_ids(&d), all, "a dry run removed something");

    let store = d.home.join("snapshots");
    let before: HashMap<String, Vec<(PathBuf, u64)>> = gone
        .iter()
        .map(|id| (id.clone(), sole_files(&store.join(id))))
        .collect();
    let r = d.json(&["snapshot", "prune", "--all"]);
    assert_eq!(r["dry_run"], false);
    assert_eq!(r["grace_secs"], 0);
    assert!(r["failed"].as_array().unwrap().is_empty(), "{r}");
    let order = pruned(&r);
    let at = |id: &str| order.iter().position(|(x, _)| x == id).unwrap();
    assert!(
        at(&d5) < at(&d4),
        "children go before their parents: {order:?}"
    );
    assert_eq!(
        order
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<BTreeSet<_>>(),
        gone
    );
    let mut total = 0;
    for (id, bytes) in &order {
        // The bytes reported are those of the files that left the disk.
        let left: u64 = before[id]
            .iter()
            .filter(|(p, _)| !p.exists())
            .map(|(_, n)| n)
            .sum();
        assert_eq!(*bytes, left, "freed bytes of {id}");
        assert!(
            *bytes > 0 && *bytes >= estimate[id],
            "{id}: {bytes} < {}",
            estimate[id]
        );
        total += bytes;
        // Gone from the API and from the store, but for a disk layer that
        // a live disk chain still goes through.
        assert!(!d.run(&["snapshot", "inspect", id]).status.success());
        let files: Vec<String> = std::fs::read_dir(store.join(id))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            files.is_empty() || files == ["disk.qcow2"],
            "{id} left {files:?}"
        );
    }
    assert_eq!(r["freed_bytes"].as_u64(), Some(total));
    assert_eq!(snapshot_ids(&d), kept);
    let log = d.log();
    assert!(
        log.contains(&format!("removed snapshot {b_gone}")),
        "the daemon did not log the removal: {log}"
    );

    // The kept ones still spawn with the source's data; the tagged tip's
    // chain runs through d1 and the child's snapshot.
    for s in [&b_tag, &b_pin, &d3] {
        let kid = d.ok(&["spawn", "--snapshot", s]).trim().to_string();
        assert_eq!(sh(&d, &kid, "cat /work/data"), "precious\n", "child of {s}");
        d.ok(&["rm", &kid]);
    }
    // The source and the child run on, their data intact: read from their
    // disks, through the layer of the collected branch point, not from the
    // guest's page cache.
    assert!(
        store.join(&b_gone).join("disk.qcow2").exists(),
        "the source's chain goes through the layer of {b_gone}"
    );
    assert_eq!(
        sh(
            &d,
            &src,
            "sync && echo 3 > /proc/sys/vm/drop_caches && cat /work/data /work/data2"
        ),
        "precious\nin-the-last-layer\n"
    );
    sh(&d, &src, "echo after > /work/data3 && sync");
    assert_eq!(sh(&d, &child, "cat /work/data"), "precious\n");

    // A restart with no grace at all: the pin and the tags still hold.
    d.stop(libc::SIGTERM);
    d.env = vec![
        ("FORKVM_GC_GRACE".into(), "0".into()),
        ("FORKVM_GC_INTERVAL".into(), "1".into()),
        ("FORKVM_DISK_CHAIN_MAX".into(), "0".into()),
    ];
    d.spawn_process();
    assert_eq!(d.json(&["snapshot", "inspect", &b_pin])["pinned"], true);
    std::thread::sleep(Duration::from_secs(3)); // a few background passes
    assert_eq!(snapshot_ids(&d), kept);
    // Unpinned, nothing needs it: the background collector takes it.
    assert_eq!(d.json(&["snapshot", "unpin", &b_pin])["pinned"], false);
    assert!(
        wait_until(Duration::from_secs(60), || !snapshot_ids(&d)
            .contains(&b_pin)),
        "the background collector left {b_pin}: {}",
        d.log()
    );
    // The log line follows the removal (index first, then files and layers).
    assert!(
        wait_until(Duration::from_secs(30), || d
            .log()
            .contains(&format!("removed snapshot {b_pin}"))),
        "the removal of {b_pin} was not logged: {}",
        d.log()
    );
    kept.iter()
        .filter(|id| **id != b_pin)
        .for_each(|id| assert!(snapshot_ids(&d).contains(id), "{id} went too"));
    assert_eq!(sh(&d, &src, "cat /work/data3"), "after\n");

    // Once the source goes, nothing names that layer: the layer collector
    // deletes what was left of the branch point.
    d.ok(&["rm", &src]);
    assert!(
        wait_until(Duration::from_secs(30), || !store.join(&b_gone).exists()),
        "the disk layer of {b_gone} outlived the source"
    );
}
