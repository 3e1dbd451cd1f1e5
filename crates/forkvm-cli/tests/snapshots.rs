//! End-to-end tests of snapshots and spawning from them, against a real
//! daemon and real microVMs. Run with `make test`.

mod common;
mod procs;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;

/// Snapshot a sandbox with a running process, files and a large Python value;
/// its children see all of it, and their writes stay their own.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn children_resume_the_source_state_and_stay_isolated() {
    let d = shared();
    let src = d.spawn_cold();
    // A Python process holding 64 MiB, which re-hashes it on request, and a
    // counter that keeps running.
    let py = r#"
import hashlib, os, time
value = bytes(range(256)) * (256 * 1024)
open('/tmp/h1', 'w').write(hashlib.sha256(value).hexdigest())
while True:
    if os.path.exists('/tmp/req'):
        os.remove('/tmp/req')
        open('/tmp/h2.tmp', 'w').write(hashlib.sha256(value).hexdigest())
        os.rename('/tmp/h2.tmp', '/tmp/h2')
    time.sleep(0.05)
"#;
    d.ok(&[
        "exec",
        &src.id,
        "--",
        "sh",
        "-c",
        "mkdir -p /work && echo source-file > /work/a.txt",
    ]);
    start_python(d, &src.id, "/tmp/holder.py", "/dev/null", py);
    assert!(wait_until(Duration::from_secs(60), || {
        try_sh(d, &src.id, "cat /tmp/h1 2>/dev/null").len() == 64
    }));
    // A process with its own environment, and the environment the agent
    // gives commands.
    d.ok(&[
        "exec",
        "-e",
        "AGENT_TASK=refactor-42",
        &src.id,
        "--",
        "sh",
        "-c",
        "setsid sleep 100042 >/dev/null 2>&1 </dev/null &",
    ]);
    let h1 = sh(d, &src.id, "cat /tmp/h1");
    let v = d.json(&["snapshot", &src.id]);
    let snap = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["kind"], "shared");
    assert!(v["timings"]["pause_ms"].as_f64().unwrap() > 0.0);
    // The source keeps running.
    assert_eq!(sh(d, &src.id, "cat /work/a.txt"), "source-file\n");

    let b = d.json(&["spawn", "--snapshot", &snap, "--count", "2"]);
    let kids = ids(&b["sandboxes"]);
    assert_eq!(kids.len(), 2);
    let _guards: Vec<Sandbox> = kids
        .iter()
        .map(|id| Sandbox { d, id: id.clone() })
        .collect();
    for k in &kids {
        assert_eq!(d.json(&["inspect", k])["snapshot"], snap.as_str());
        // Files and the running process came along.
        assert_eq!(sh(d, k, "cat /work/a.txt"), "source-file\n");
        assert!(
            sh(d, k, "ps -eo args").contains("python3 /tmp/holder.py"),
            "holder process missing in {k}"
        );
        // The environment came along: the running process's own, and the
        // one every command gets.
        assert_eq!(
            sh(
                d,
                k,
                "tr '\\0' '\\n' < /proc/$(pgrep -f '^sleep 100042$')/environ | grep AGENT_TASK"
            ),
            "AGENT_TASK=refactor-42\n"
        );
        assert_eq!(
            sh(d, k, "echo $HOME $PATH"),
            sh(d, &src.id, "echo $HOME $PATH")
        );
        // The big value is intact in the resumed process.
        sh(d, k, "touch /tmp/req");
        let asked = Instant::now();
        let mut seen = String::new();
        let answered = wait_until(Duration::from_secs(120), || {
            seen = try_sh(d, k, "cat /tmp/h2 2>/dev/null");
            !seen.is_empty()
        });
        assert!(
            answered,
            "the holder in {k} did not answer in {:?}: {}",
            asked.elapsed(),
            try_sh(
                d,
                k,
                "ls -l /tmp; ps -eo pid,stat,time,args; cat /proc/loadavg"
            )
        );
        assert_eq!(seen, h1, "value in {k} changed");
        eprintln!(
            "{k}: the holder re-hashed its value in {:?}",
            asked.elapsed()
        );
    }
    // Writes are private: each child writes its own file.
    sh(
        d,
        &kids[0],
        "echo zero > /work/a.txt; echo only-zero > /work/z.txt; sync",
    );
    sh(d, &src.id, "echo src > /work/s.txt");
    assert_eq!(sh(d, &kids[1], "cat /work/a.txt"), "source-file\n");
    assert_eq!(sh(d, &kids[1], "ls /work"), "a.txt\n");
    assert_eq!(sh(d, &src.id, "cat /work/a.txt"), "source-file\n");
    assert_eq!(sh(d, &kids[0], "ls /work"), "a.txt\nz.txt\n");

    // A snapshot in use cannot be removed; --force removes it and its children.
    let o = d.run(&["snapshot", "rm", &snap]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("in use") && stderr(&o).contains(&kids[0]),
        "{}",
        stderr(&o)
    );
    d.ok(&["snapshot", "rm", "--force", &snap]);
    for k in &kids {
        assert!(
            !d.run(&["inspect", k]).status.success(),
            "{k} survived a forced removal"
        );
        assert!(d.sandbox_files(k).is_empty());
    }
    assert!(!d.ok(&["snapshot", "ls"]).contains(&snap));
}

/// Each of `kids` has random bytes, a uuid and an instance id no other one
/// has, its own id as hostname, and a clock within a second of the host's.
fn assert_fresh_identities(d: &Daemon, kids: &[String]) {
    let script = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; \
                  python3 -c 'import uuid; print(uuid.uuid4())'; \
                  cat /run/forkvm/instance-id; hostname; date +%s.%N";
    let mut seen = HashSet::new();
    for k in kids {
        let out = sh(d, k, script);
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 5, "{out}");
        for l in &lines[..3] {
            assert!(seen.insert(l.to_string()), "{k} repeated {l}");
        }
        assert!(
            lines[2].starts_with(k.as_str()),
            "instance id {} is not fresh",
            lines[2]
        );
        assert_eq!(lines[3], k, "hostname");
        let guest: f64 = lines[4].parse().unwrap();
        assert!(
            (guest - host_now).abs() < 1.0,
            "{k} clock off by {} s",
            guest - host_now
        );
    }
}

/// Children of one branch (a fan-out) in the modes that store a clone's
/// changes differently: each has its own identity, as siblings of a spawn do.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn branch_fan_out_children_get_fresh_identities() {
    let d = shared();
    let src = d.spawn();
    sh(
        d,
        &src.id,
        "head -c 16 /dev/urandom >/dev/null; python3 -c 'import uuid; uuid.uuid4()'",
    );
    for mode in ["diff", "live"] {
        let r = d.json(&["branch", &src.id, "--mode", mode, "--count", "6"]);
        let kids = ids(&r["children"]);
        assert_eq!(kids.len(), 6, "{mode}");
        let guards: Vec<Sandbox> = kids
            .iter()
            .map(|id| Sandbox { d, id: id.clone() })
            .collect();
        assert_fresh_identities(d, &kids);
        drop(guards);
        d.ok(&[
            "snapshot",
            "rm",
            "--force",
            r["snapshot"]["id"].as_str().unwrap(),
        ]);
    }
}

/// Eight siblings of one snapshot never share random bytes or ids, and their
/// clocks are right.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn siblings_get_fresh_identities() {
    let d = shared();
    let src = d.spawn();
    // Warm the source's RNG and Python before the snapshot.
    sh(
        d,
        &src.id,
        "head -c 16 /dev/urandom >/dev/null; python3 -c 'import uuid; uuid.uuid4()'",
    );
    let snap = d.json(&["snapshot", &src.id])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = d.json(&["spawn", "--snapshot", &snap, "--count", "8"]);
    let kids = ids(&b["sandboxes"]);
    assert_eq!(kids.len(), 8);
    let _guards: Vec<Sandbox> = kids
        .iter()
        .map(|id| Sandbox { d, id: id.clone() })
        .collect();
    assert_fresh_identities(d, &kids);
    d.ok(&["snapshot", "rm", "--force", &snap]);
}

/// Templates: the first spawn of an image boots; later ones restore. The warm
/// pool makes a spawn skip the QEMU start. Memory use is reported.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn templates_pools_and_memory_figures() {
    let d = shared();
    let a = d.spawn();
    let b = d.spawn();
    let tb = d.json(&["inspect", &b.id]);
    // At least the second spawn comes from a template (the first may have
    // made it, or another test did).
    assert!(
        tb["snapshot"].is_string(),
        "second spawn did not use the template: {tb}"
    );
    let tpl = tb["snapshot"].as_str().unwrap().to_string();
    let s = d.json(&["snapshot", "inspect", &tpl]);
    assert_eq!(s["template"], true);
    // Memory figures of a running sandbox.
    let m = &tb["memory"];
    let (rss, pss, dirty) = (
        m["rss_kib"].as_u64().unwrap(),
        m["pss_kib"].as_u64().unwrap(),
        m["private_dirty_kib"].as_u64().unwrap(),
    );
    assert!(rss > 0 && pss > 0 && pss <= rss && dirty <= rss, "{m}");

    // A warm pool.
    let v = d.json(&["snapshot", "pool", &tpl, "2"]);
    assert_eq!(v["pool_size"], 2);
    assert!(wait_until(Duration::from_secs(60), || {
        let i = d.json(&["info"]);
        i["pools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["snapshot"] == tpl.as_str() && p["ready"] == 2)
    }));
    let t = Instant::now();
    let c = d.json(&["spawn", "--snapshot", &tpl]);
    let _c = Sandbox {
        d,
        id: c["id"].as_str().unwrap().to_string(),
    };
    assert_eq!(c["timings"]["from_pool"], true, "{c}");
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(sh(d, &_c.id, "echo pooled"), "pooled\n");
    d.ok(&["snapshot", "pool", &tpl, "0"]);
    drop(a);
}

/// A corrupted snapshot is refused at spawn with a clear error; a snapshot
/// interrupted by a daemon crash never becomes visible; a restarted daemon
/// lists and spawns from what it had.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn snapshot_durability() {
    let mut d = Daemon::start();
    let id = d.ok(&["spawn", "--no-template"]).trim().to_string();
    sh(&d, &id, "echo durable > /root/d.txt");
    let good = d.json(&["snapshot", &id, "--tag", "good"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let bad = d.json(&["snapshot", &id, "--tag", "bad"])["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Corrupt one byte of each of two artefacts of `bad`.
    let dir = d.home.join("snapshots").join(&bad);
    for f in ["device.state", "memory.img"] {
        let p = dir.join(f);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let mut b = std::fs::read(&p).unwrap();
        let i = b.len() / 2;
        b[i] ^= 0x55;
        std::fs::write(&p, &b).unwrap();
        let o = d.run(&["spawn", "--snapshot", "bad"]);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            stderr(&o).contains("corrupted") && stderr(&o).contains(f),
            "{f}: {}",
            stderr(&o)
        );
        b[i] ^= 0x55;
        std::fs::write(&p, &b).unwrap();
    }
    assert_eq!(
        d.run(&["spawn", "--snapshot", "bad"]).status.code(),
        Some(0),
        "restored bytes verify again"
    );

    // Kill the daemon in the middle of a snapshot: as soon as its staging
    // directory appears. The request goes over the raw API so that nothing
    // restarts the daemon behind our back.
    let snaps_before = d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .len();
    let client = d.client();
    let sid = id.clone();
    let pending = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(client.snapshot(&sid, &forkvm_api::CreateSnapshot::default()))
    });
    let snapdir = d.home.join("snapshots");
    let staged = wait_until(Duration::from_secs(30), || {
        std::fs::read_dir(&snapdir)
            .map(|r| {
                r.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            })
            .unwrap_or(false)
    });
    assert!(staged, "the snapshot never started writing");
    d.stop(libc::SIGKILL);
    assert!(
        pending.join().unwrap().is_err(),
        "the interrupted snapshot cannot have succeeded"
    );
    d.spawn_process();
    let entries: Vec<String> = std::fs::read_dir(d.home.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !entries.iter().any(|e| e.starts_with(".tmp-")),
        "staging left: {entries:?}"
    );
    let listed = d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .clone();
    assert!(listed.len() <= snaps_before + 1);
    for s in &listed {
        // Whatever is listed is complete.
        let sid = s["id"].as_str().unwrap();
        let o = d.run(&["spawn", "--snapshot", sid]);
        assert!(
            o.status.success(),
            "listed snapshot {sid} does not spawn: {}",
            stderr(&o)
        );
    }
    // The source survived (resumed if the crash left it paused).
    assert_eq!(sh(&d, &id, "cat /root/d.txt"), "durable\n");
    // And the good snapshot still spawns after the restart.
    let k = d.ok(&["spawn", "--snapshot", &good]).trim().to_string();
    assert_eq!(sh(&d, &k, "cat /root/d.txt"), "durable\n");

    // The global warm-pool size: restarted with a default of 1, every
    // snapshot without a size of its own gets a pool, filled in the
    // background and shown by `info`.
    d.stop(libc::SIGTERM);
    d.env.push(("FORKVM_POOL_SIZE".into(), "1".into()));
    d.spawn_process();
    assert_eq!(d.json(&["info"])["default_pool_size"], 1);
    let g = d.json(&["snapshot", "inspect", &good]);
    assert_eq!(
        (&g["pool_size"], &g["pool_default"]),
        (&1.into(), &true.into()),
        "{g}"
    );
    let pool_ready = |snap: &str| -> Option<u64> {
        d.json(&["info"])["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["snapshot"] == snap)
            .map(|p| p["ready"].as_u64().unwrap())
    };
    assert!(wait_until(Duration::from_secs(60), || pool_ready(&good) == Some(1)));
    let c = d.json(&["spawn", "--snapshot", "good"]);
    assert_eq!(c["timings"]["from_pool"], true, "{c}");
    // The pool refills behind the claim.
    assert!(wait_until(Duration::from_secs(60), || pool_ready(&good) == Some(1)));
    // A snapshot's own size wins, 0 included; `default` gives it back.
    let g = d.json(&["snapshot", "pool", "good", "0"]);
    assert_eq!(
        (&g["pool_size"], &g["pool_default"]),
        (&0.into(), &false.into()),
        "{g}"
    );
    assert_eq!(pool_ready(&good), None);
    let g = d.json(&["snapshot", "pool", "good", "default"]);
    assert_eq!(
        (&g["pool_size"], &g["pool_default"]),
        (&1.into(), &true.into()),
        "{g}"
    );
    for bad in ["65", "-1", "lots"] {
        let o = d.run(&["snapshot", "pool", "good", bad]);
        assert!(!o.status.success(), "{bad} was accepted");
    }
    // A branch point starts with its own size of 0: its children are
    // spawned at once, so a default pool would only idle.
    let b = d.json(&["branch", &id, "--count", "1"]);
    let bsnap = b["snapshot"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{b}"));
    let bs = d.json(&["snapshot", "inspect", bsnap]);
    assert_eq!(
        (&bs["pool_size"], &bs["pool_default"]),
        (&0.into(), &false.into()),
        "{bs}"
    );
    assert_eq!(pool_ready(bsnap), None);
}

/// A branch that runs out of disk fails with a clear error, leaves the
/// source running, and leaves no snapshot (visible or half-written).
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_branch_on_a_full_disk_fails_cleanly() {
    require_vm_prereqs();
    let fs = SmallFs::new(48);
    // No free-space reserve: this test is about what happens when the disk
    // fills up in the middle of a snapshot, past admission control (which
    // would refuse the spawn on a filesystem this small; checked at the end).
    let mut d = Daemon::start_in_env(&fs.mnt.join("home"), &[("FORKVM_DISK_RESERVE_MIB", "0")]);
    let id = d.ok(&["spawn", "--no-template"]).trim().to_string();
    sh(&d, &id, "echo alive > /root/a.txt");
    for mode in ["full", "live"] {
        let o = d.run(&["branch", &id, "--mode", mode, "--count", "1"]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{mode}: the branch cannot fit in 48 MiB"
        );
        let err = stderr(&o);
        assert!(err.contains("No space left on device"), "{mode}: {err}");
        // The source keeps running and answering (bounded, so a source left
        // stopped fails the test instead of hanging it).
        assert_eq!(
            d.ok(&[
                "exec",
                "--timeout",
                "60",
                &id,
                "--",
                "sh",
                "-c",
                "sync; cat /root/a.txt"
            ]),
            "alive\n",
            "{mode}"
        );
        // No snapshot is visible and nothing half-written is left.
        assert!(d.json(&["snapshot", "ls"])["snapshots"]
            .as_array()
            .unwrap()
            .is_empty());
        let left: Vec<String> = std::fs::read_dir(d.home.join("snapshots"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect();
        assert!(left.is_empty(), "{mode}: staging left behind: {left:?}");
        assert_eq!(
            d.json(&["ps"])["sandboxes"].as_array().unwrap().len(),
            1,
            "no child was made"
        );
    }
    // Asynchronously: the live save fits in tmpfs, so the call returns once
    // the source has resumed; publishing into the full store then fails, and
    // the snapshot shows `failed` with the reason. Nothing of it is on disk.
    let r = d.json(&["branch", &id, "--mode", "live", "--no-wait", "--count", "1"]);
    assert_eq!(r["snapshot"]["state"], "writing", "{r}");
    let sid = r["snapshot"]["id"].as_str().unwrap().to_string();
    let mut v = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(120), || {
            v = d.json(&["snapshot", "inspect", &sid]);
            v["state"] != "writing"
        }),
        "the failed async branch stayed `writing`"
    );
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["failure"]
            .as_str()
            .unwrap_or("")
            .contains("No space left on device"),
        "{v}"
    );
    assert_eq!(
        d.ok(&["exec", "--timeout", "60", &id, "--", "cat", "/root/a.txt"]),
        "alive\n"
    );
    let on_disk: Vec<String> = std::fs::read_dir(d.home.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(on_disk.is_empty(), "left on disk: {on_disk:?}");
    // (Its frozen disk layer stays, unlisted, while the source's disk chain
    // goes through it; there is no manifest, so no snapshot.)
    assert!(!d
        .home
        .join("snapshots")
        .join(&sid)
        .join("manifest.fvs")
        .exists());
    d.ok(&["snapshot", "rm", &sid]);
    assert!(d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(d.json(&["ps"])["sandboxes"].as_array().unwrap().len(), 1);
    d.ok(&["rm", &id]);
    // With the default free-space reserve, the daemon refuses new work on
    // a filesystem this small before it starts: 507 `no_space`.
    d.stop(libc::SIGTERM);
    d.env.clear();
    d.spawn_process();
    let o = d.run(&["spawn", "--no-template"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no_space") && stderr(&o).contains("--disk-reserve-mib"),
        "{}",
        stderr(&o)
    );
    assert!(d.json(&["ps"])["sandboxes"].as_array().unwrap().is_empty());
    d.stop(libc::SIGTERM);
    drop(d);
    drop(fs);
}

/// QEMU processes of `home` (see `procs`).
fn qemus_of(home: &std::path::Path) -> Vec<u32> {
    procs::writing_under(&home.join("sandboxes"))
}

/// A daemon stopped while a warm pool fills must not leave the QEMU the
/// filler was starting: pooled QEMUs belong to no sandbox, so no later
/// daemon would know them (and a test's home is gone by then).
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_daemon_stopped_while_its_pool_fills_leaves_no_qemu() {
    let mut d = Daemon::start();
    let id = d.ok(&["spawn", "--no-template"]).trim().to_string();
    d.ok(&["snapshot", &id, "--tag", "fill"]);
    d.ok(&["rm", &id]);
    d.ok(&["snapshot", "pool", "fill", "3"]);
    // Let the filler start its first QEMUs, then stop the daemon.
    assert!(
        wait_until(Duration::from_secs(30), || !qemus_of(&d.home).is_empty()),
        "the pool never started a QEMU"
    );
    std::thread::sleep(Duration::from_millis(300));
    d.stop(libc::SIGTERM);
    let left = qemus_of(&d.home);
    for pid in &left {
        // SAFETY: a QEMU of this test's own home.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "QEMUs left by the stopped daemon: {left:?}\n{}",
        d.log()
    );
}
