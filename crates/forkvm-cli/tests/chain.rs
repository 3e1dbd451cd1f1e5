//! The disk chain of a source branched many times stays bounded (see
//! docs/disk-chain.md), against a real daemon and real microVMs. Run with
//! `make test`. The pause figures are a benchmark's business
//! (`bench/branch`, its `chain` case); this test checks depth and data.

mod common;

use std::time::Duration;

use common::*;

/// The source's disk chain as `GET /v1/sandboxes/{id}` reports it.
fn chain(d: &Daemon, id: &str) -> (u64, bool) {
    let v = d.json(&["inspect", id]);
    let disk = &v["disk"];
    (
        disk["layers"]
            .as_u64()
            .unwrap_or_else(|| panic!("no disk.layers in {v}")),
        disk["streaming"].as_bool().expect("disk.streaming"),
    )
}

/// Branch one source 100 times while it writes between branches. Its chain
/// is never deeper than 2 layers (the top plus the layer just frozen, until
/// the stream folds it in) and ends at 1; the source's data (a random file
/// written first, and one line per round) is intact; a child of an early
/// branch point sees exactly that instant; the sandbox directory keeps only
/// its top layer.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_source_branched_100_times_keeps_a_short_chain_and_its_data() {
    const ROUNDS: usize = 100;
    const BOUND: u64 = 2;
    let d = shared();
    let src = d.spawn_cold();
    assert_eq!(chain(d, &src.id), (1, false));
    let sum = sh(
        d,
        &src.id,
        "head -c 8M /dev/urandom > /root/blob && sync && md5sum /root/blob | cut -d' ' -f1",
    );
    let mut snaps = Vec::new();
    let mut deepest = 0;
    for i in 0..ROUNDS {
        sh(d, &src.id, &format!("echo {i} >> /root/rounds"));
        let v = d.json(&["branch", &src.id, "--count", "0"]);
        snaps.push(
            v["snapshot"]["id"]
                .as_str()
                .expect("snapshot id")
                .to_string(),
        );
        let (layers, _) = chain(d, &src.id);
        assert!(
            layers <= BOUND,
            "after branch {i} the chain is {layers} layers deep"
        );
        deepest = deepest.max(layers);
    }
    // Every branch froze a layer and a stream folded it back in (a test
    // that never saw a freeze would prove nothing about streams).
    let streamed = format!(
        "sandbox {}: disk chain streamed, 1 frozen layer(s) folded into the top",
        src.id
    );
    assert!(
        wait_until(Duration::from_secs(60), || d
            .log()
            .matches(&streamed)
            .count()
            == ROUNDS),
        "{} streams logged for {ROUNDS} branches (deepest chain seen: {deepest})",
        d.log().matches(&streamed).count()
    );
    assert_eq!(chain(d, &src.id), (1, false));
    // Caches dropped, so the reads come from the disk chain, not the guest.
    let after = sh(
        d,
        &src.id,
        "sync; echo 3 > /proc/sys/vm/drop_caches; md5sum /root/blob | cut -d' ' -f1",
    );
    assert_eq!(after.trim(), sum.trim(), "the random file changed");
    let rounds = sh(d, &src.id, "cat /root/rounds");
    let want: String = (0..ROUNDS).map(|i| format!("{i}\n")).collect();
    assert_eq!(rounds, want);
    // The source keeps writing on the streamed top.
    sh(d, &src.id, "echo more >> /root/rounds && sync");

    // A child of branch point 10 (taken after round 10's line) reads the
    // frozen layers, which the streams never touched.
    let child = d
        .ok(&["spawn", "--snapshot", &snaps[10]])
        .trim()
        .to_string();
    let seen = sh(
        d,
        &child,
        "echo 3 > /proc/sys/vm/drop_caches; cat /root/rounds; md5sum /root/blob | cut -d' ' -f1",
    );
    let want: String = (0..=10).map(|i| format!("{i}\n")).collect();
    assert_eq!(seen, format!("{want}{}\n", sum.trim()));
    d.ok(&["rm", &child]);

    // Only the top layer is left in the sandbox directory: the frozen
    // layers' links went with the streams.
    let dir = forkvm_daemon::Config::for_home(&d.home)
        .sandbox_paths(&src.id)
        .dir;
    let qcow2: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".qcow2"))
        .collect();
    assert_eq!(
        qcow2.len(),
        1,
        "layers left in {}: {qcow2:?}",
        dir.display()
    );
    // With the streams done no chain reads the branch points' layers: once
    // the branch points go, their store directories go whole.
    for s in snaps.iter().rev() {
        d.ok(&["snapshot", "rm", s]);
    }
    let store = d.home.join("snapshots");
    let left: Vec<_> = snaps.iter().filter(|s| store.join(s).exists()).collect();
    assert!(
        left.is_empty(),
        "layers kept after their snapshots went: {left:?}"
    );
}
