//! End-to-end tests of lifetimes against a real daemon and real microVMs:
//! metadata and default environments, timeouts (kill and pause), pause and
//! resume with the same id, across a daemon SIGKILL. Run with `make test`.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// A Python process whose counter lives only in its memory: it writes the
/// value out, so a resume that lost memory would start again from 0 (or not
/// run at all).
const COUNTER: &str = r#"
import os, time
n = 0
while True:
    n += 1
    open('/tmp/count.tmp', 'w').write(f"{os.getpid()} {n}")
    os.rename('/tmp/count.tmp', '/tmp/count')
    time.sleep(0.05)
"#;

fn counter(d: &Daemon, id: &str) -> (u64, u64) {
    let s = try_sh(d, id, "cat /tmp/count 2>/dev/null");
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

fn start_counter(d: &Daemon, id: &str) -> (u64, u64) {
    start_python(d, id, "/tmp/counter.py", "/dev/null", COUNTER);
    assert!(wait_until(Duration::from_secs(60), || counter(d, id).1 > 3));
    counter(d, id)
}

fn state(d: &Daemon, id: &str) -> Option<serde_json::Value> {
    let o = d.run(&["--json", "inspect", id]);
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).expect("inspect json"))
}

fn gone(d: &Daemon, id: &str, pid: u32) -> bool {
    state(d, id).is_none() && !alive(pid) && d.sandbox_files(id).is_empty()
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn metadata_env_and_timeouts() {
    let d = shared();
    // Bad input creates nothing.
    for bad in [
        vec!["spawn", "--timeout", "0"],
        vec!["spawn", "--metadata", "bad key=1"],
        vec!["spawn", "--env", "1X=2"],
    ] {
        let o = d.run(&bad);
        assert!(!o.status.success(), "{bad:?} was accepted");
        assert!(
            stderr(&o).contains("invalid_request") || stderr(&o).contains("timeout"),
            "{}",
            stderr(&o)
        );
    }

    // The deadline is set while the spawn is answered, so it lies at least
    // 6 s after this instant (the spawn of `b` below also counts).
    let t_before_a = Instant::now();
    let a = d
        .ok(&[
            "spawn",
            "--metadata",
            "team=a",
            "--metadata",
            "run=7",
            "--env",
            "GREETING=hello",
            "--timeout",
            "6",
        ])
        .trim()
        .to_string();
    let b = d
        .ok(&["spawn", "--metadata", "team=b", "--timeout", "6"])
        .trim()
        .to_string();
    let pid_a = d.json(&["inspect", &a])["pid"].as_u64().unwrap() as u32;
    // Extended: outlives its first timeout.
    let v = d.json(&["timeout", &b, "300"]);
    assert_eq!(v["lifetime"]["timeout"], 300);

    // Listed and filtered by metadata.
    let only_a = d.json(&["ps", "--metadata", "team=a"]);
    assert_eq!(ids(&only_a["sandboxes"]), vec![a.clone()]);
    assert_eq!(only_a["sandboxes"][0]["metadata"]["run"], "7");
    let both = d.json(&["ps", "--metadata", "team=a", "--metadata", "run=8"]);
    assert!(both["sandboxes"].as_array().unwrap().is_empty());

    // The spawn's env is every exec's default; an exec's own env wins.
    assert_eq!(sh(d, &a, "echo $GREETING").trim(), "hello");
    let o = d.ok(&[
        "exec",
        "-e",
        "GREETING=bye",
        &a,
        "--",
        "sh",
        "-c",
        "echo $GREETING",
    ]);
    assert_eq!(o.trim(), "bye");

    // `a` is gone after about 6 s with everything released; `b` is not.
    let v = d.json(&["inspect", &a]);
    let left = v["lifetime"]["remaining_s"].as_f64().unwrap();
    assert!(left > 0.0 && left <= 6.0, "{v}");
    assert!(
        wait_until(Duration::from_secs(30), || gone(d, &a, pid_a)),
        "sandbox {a} outlived its timeout: {:?}",
        state(d, &a)
    );
    let took = t_before_a.elapsed();
    // 5.5 s, not 6: the deadline is wall-clock time, this is monotonic.
    assert!(
        took >= Duration::from_millis(5500),
        "removed too early: {took:?} after its spawn began"
    );
    eprintln!("a 6 s timeout removed the sandbox {took:?} after its spawn began");
    assert!(
        d.log().contains(&format!("timeout of sandbox {a} ran out")),
        "the daemon logs the expiry"
    );
    assert_eq!(d.json(&["inspect", &b])["state"], "running");
    // A cleared timeout.
    let v = d.json(&["timeout", &b, "none"]);
    assert!(v.get("lifetime").is_none(), "{v}");
    d.ok(&["rm", &b]);
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn pause_and_resume_keep_id_memory_disk_and_ports() {
    let d = shared();
    let id = d
        .ok(&["spawn", "--port", "8000", "--timeout", "600"])
        .trim()
        .to_string();
    let sb = Sandbox { d, id: id.clone() };
    let host_port = d.json(&["inspect", &id])["network"]["ports"][0]["host"]
        .as_u64()
        .unwrap();
    sh(d, &id, "echo on-disk > /root/kept.txt && sync");
    sh(
        d,
        &id,
        "cd /root && setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &",
    );
    let fetch = |port: u64| {
        std::process::Command::new("python3")
            .args([
                "-c",
                &format!("import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/kept.txt', timeout=5).read().decode())"),
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    assert!(wait_until(Duration::from_secs(60), || fetch(host_port) == "on-disk"));
    let (pid, n0) = start_counter(d, &id);
    let qemu = sb.pid();

    let v = d.json(&["pause", &id]);
    assert_eq!(v["state"], "paused", "{v}");
    let p = &v["paused"];
    assert_eq!(p["reason"], "request");
    let mem = p["memory_bytes"].as_u64().unwrap();
    // A clone of the boot template: only the pages it changed are stored.
    let ram = v["memory_mib"].as_u64().unwrap() << 20;
    eprintln!(
        "paused clone of {} MiB: {mem} bytes of memory, {} bytes of disk, vCPUs stopped {} ms",
        ram >> 20,
        p["disk_bytes"],
        p["pause_ms"]
    );
    assert!(
        mem > 0 && mem < ram / 2,
        "a paused clone stored {mem} of {ram} bytes"
    );
    assert!(
        wait_until(Duration::from_secs(15), || !alive(qemu)),
        "QEMU runs on"
    );
    assert!(
        d.sandbox_files(&id).is_empty(),
        "{:?}",
        d.sandbox_files(&id)
    );
    assert!(v.get("pid").is_none());
    // Paused: exec is refused with a clear error, the timeout is frozen.
    let o = d.run(&["exec", &id, "--", "true"]);
    assert!(
        !o.status.success() && stderr(&o).contains("paused"),
        "{}",
        stderr(&o)
    );
    let left0 = v["lifetime"]["remaining_s"].as_f64().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let left1 = d.json(&["inspect", &id])["lifetime"]["remaining_s"]
        .as_f64()
        .unwrap();
    assert_eq!(left0, left1, "paused time counted against the timeout");
    // Its saved state cannot be removed under it.
    let o = d.run(&["snapshot", "rm", p["snapshot"].as_str().unwrap()]);
    assert!(!o.status.success(), "the pause snapshot was removable");

    let v = d.json(&["resume", &id]);
    assert_eq!(
        (v["id"].as_str(), v["state"].as_str()),
        (Some(id.as_str()), Some("running")),
        "{v}"
    );
    assert_eq!(v["network"]["ports"][0]["host"].as_u64(), Some(host_port));
    // Memory: the same process, its counter going on from where it was.
    let (pid2, n1) = counter(d, &id);
    assert_eq!(pid2, pid, "a different process");
    assert!(n1 >= n0, "the counter went back: {n0} -> {n1}");
    assert!(
        wait_until(Duration::from_secs(30), || counter(d, &id).1 > n1),
        "the counter stopped"
    );
    // Disk and the published port.
    assert_eq!(sh(d, &id, "cat /root/kept.txt").trim(), "on-disk");
    assert!(wait_until(Duration::from_secs(30), || fetch(host_port) == "on-disk"));
    // A second pause of the resumed sandbox, then removal while paused:
    // everything goes, its pause snapshots too.
    let v = d.json(&["pause", &id]);
    let snap2 = v["paused"]["snapshot"].as_str().unwrap().to_string();
    drop(sb);
    assert!(state(d, &id).is_none());
    let snaps = d.json(&["snapshot", "ls"]);
    assert!(
        !snaps.to_string().contains(&snap2)
            && !snaps
                .to_string()
                .contains(&p["snapshot"].as_str().unwrap().to_string()),
        "pause snapshots outlived their sandbox: {snaps}"
    );
    // Resume and pause answer clearly on bad targets.
    let o = d.run(&["resume", "sb-nosuch"]);
    assert!(
        !o.status.success() && stderr(&o).contains("not_found"),
        "{}",
        stderr(&o)
    );
}

/// `on_timeout: pause`, and timeouts across a daemon SIGKILL.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn timeouts_pause_and_survive_a_daemon_kill() {
    let mut d = Daemon::start();
    let p = d
        .ok(&["spawn", "--timeout", "600", "--on-timeout", "pause"])
        .trim()
        .to_string();
    let (pid, n0) = start_counter(&d, &p);
    // Shortened once the counter runs (an exec under TCG takes a while).
    d.json(&["timeout", &p, "3"]);
    assert!(
        wait_until(Duration::from_secs(30), || state(&d, &p)
            .is_some_and(|v| v["state"] == "paused")),
        "not paused on timeout: {:?}",
        state(&d, &p)
    );
    assert_eq!(state(&d, &p).unwrap()["paused"]["reason"], "timeout");
    // Resumed, it gets its whole timeout again and its memory is intact.
    let v = d.json(&["resume", &p]);
    assert_eq!(v["lifetime"]["timeout"], 3, "{v}");
    assert!(v["lifetime"]["remaining_s"].as_f64().unwrap() > 2.0, "{v}");
    d.json(&["timeout", &p, "600"]);
    let (pid2, n1) = counter(&d, &p);
    assert_eq!(pid2, pid);
    assert!(n1 >= n0);

    // Across a SIGKILL of the daemon: one removed, one paused, one extended.
    let k = d.ok(&["spawn", "--timeout", "5"]).trim().to_string();
    let q = d
        .ok(&["spawn", "--timeout", "5", "--on-timeout", "pause"])
        .trim()
        .to_string();
    let k_pid = d.json(&["inspect", &k])["pid"].as_u64().unwrap() as u32;
    // And one paused without its memory: its disk outlives the daemon.
    let f = d.ok(&["spawn"]).trim().to_string();
    sh(&d, &f, "echo kept > /root/f.txt");
    assert_eq!(
        d.json(&["pause", "--no-memory", &f])["paused"]["memory"],
        false
    );
    d.stop(libc::SIGKILL);
    std::thread::sleep(Duration::from_secs(6));
    d.spawn_process();
    assert!(
        wait_until(Duration::from_secs(30), || gone(&d, &k, k_pid)),
        "{k} outlived its timeout across a restart: {:?}",
        state(&d, &k)
    );
    assert!(
        wait_until(Duration::from_secs(60), || state(&d, &q)
            .is_some_and(|v| v["state"] == "paused")),
        "{q} not paused after a restart: {:?}",
        state(&d, &q)
    );
    assert_eq!(state(&d, &p).unwrap()["state"], "running");
    let v = d.json(&["resume", &q]);
    assert_eq!(v["state"], "running");
    assert_eq!(state(&d, &f).unwrap()["state"], "paused");
    assert_eq!(d.json(&["resume", &f])["state"], "running");
    assert_eq!(sh(&d, &f, "cat /root/f.txt").trim(), "kept");
    for id in [&p, &q, &f] {
        d.ok(&["rm", id]);
    }
    assert!(d.json(&["ps"])["sandboxes"].as_array().unwrap().is_empty());
}

/// Admission control: past the memory commitment a spawn or branch is
/// refused with 503 and leaves nothing; removing a sandbox admits it again.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn admission_refuses_past_the_memory_commitment() {
    let d = Daemon::start_env(&[("FORKVM_MEMORY_COMMIT_MIB", "1024")]);
    let a = d
        .ok(&["spawn", "--no-template", "--memory", "256"])
        .trim()
        .to_string();
    let cap = &d.json(&["info"])["capacity"];
    assert_eq!(cap["memory_commit_mib"], 1024, "{cap}");
    assert!(cap["memory_used_mib"].as_u64().unwrap() > 0, "{cap}");
    assert_eq!(cap["counted_sandboxes"], 1, "{cap}");
    let files_before = std::fs::read_dir(d.run_dir()).unwrap().count();

    // A 1000 MiB cold boot does not fit beside `a`.
    let o = d.run(&["spawn", "--no-template", "--memory", "1000"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("capacity_exceeded") && e.contains("--memory-commit-mib"),
        "{e}"
    );
    assert_eq!(
        ids(&d.json(&["ps"])["sandboxes"]),
        vec![a.clone()],
        "a refused spawn left a sandbox"
    );
    assert_eq!(
        std::fs::read_dir(d.run_dir()).unwrap().count(),
        files_before,
        "a refused spawn left a RAM file"
    );
    assert!(
        d.log().contains("spawn refused"),
        "the daemon logs the refusal"
    );

    // Neither do ten children of a branch of `a`; `a` runs on untouched.
    let o = d.run(&["branch", &a, "--count", "10"]);
    assert!(
        !o.status.success() && stderr(&o).contains("capacity_exceeded"),
        "{}",
        stderr(&o)
    );
    assert_eq!(d.json(&["inspect", &a])["state"], "running");
    assert!(d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .is_empty());

    // Removing `a` admits it again.
    d.ok(&["rm", &a]);
    let b = d
        .ok(&["spawn", "--no-template", "--memory", "1000"])
        .trim()
        .to_string();
    assert_eq!(sh(&d, &b, "echo ok").trim(), "ok");
    d.ok(&["rm", &b]);
}

/// Usage figures on GET and the Prometheus metrics.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn usage_and_metrics() {
    let d = shared();
    let sb = d.spawn();
    sh(
        d,
        &sb.id,
        "dd if=/dev/urandom of=/root/blob bs=1M count=8 2>/dev/null; sync",
    );
    let v = d.json(&["inspect", &sb.id]);
    let u = &v["usage"];
    assert!(u["cpu_ms"].as_u64().unwrap() > 0, "{v}");
    assert!(u["disk_bytes"].as_u64().unwrap() >= 8 << 20, "{v}");
    if v.get("network").is_some() {
        // The network probe at spawn already moved packets.
        assert!(u["net_rx_bytes"].as_u64().unwrap() > 0, "{v}");
        assert!(u["net_tx_bytes"].as_u64().unwrap() > 0, "{v}");
    }
    let m = d.ok(&["metrics"]);
    for want in [
        "forkvm_spawns_total{result=\"ok\"}",
        "forkvm_spawn_seconds_bucket",
        "forkvm_sandboxes{state=\"running\"}",
        &format!("forkvm_sandbox_memory_pss_bytes{{sandbox=\"{}\"}}", sb.id),
        "forkvm_memory_commit_mib",
        "# EOF",
    ] {
        assert!(m.contains(want), "no {want} in\n{m}");
    }
    // A refused request is counted by its code.
    let _ = d.run(&["exec", "sb-nosuch", "--", "true"]);
    assert!(d
        .ok(&["metrics"])
        .contains("forkvm_errors_total{code=\"not_found\"}"));
}

/// `pause --no-memory`, `--on-timeout pause-filesystem` and `resume
/// --no-memory`: the disk is kept, the memory is not, and the resume
/// cold-boots with the same id, metadata, env, network and published port.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn filesystem_pause_keeps_the_disk_and_cold_boots() {
    let d = shared();
    let id = d
        .ok(&[
            "spawn",
            "--port",
            "8000",
            "--timeout",
            "600",
            "--env",
            "MODE=eval",
            "--metadata",
            "suite=fs-pause",
        ])
        .trim()
        .to_string();
    let sb = Sandbox { d, id: id.clone() };
    let host_port = |d: &Daemon| d.json(&["inspect", &id])["network"]["ports"][0]["host"].as_u64();
    let port = host_port(d);
    // No sync here: the pause writes the guest's page cache out itself.
    sh(
        d,
        &id,
        "echo on-disk > /root/kept.txt; echo in-ram > /tmp/ram.txt",
    );
    let (pid, _) = start_counter(d, &id);
    let boot_id = sh(d, &id, "cat /proc/sys/kernel/random/boot_id");
    // Other tests share this daemon and make and remove snapshots of their
    // own meanwhile: count only this sandbox's.
    let own_snapshots = |d: &Daemon| {
        d.json(&["snapshot", "ls"])["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["source"] == id.as_str())
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let snapshots = own_snapshots(d);
    let qemu = sb.pid();

    let cold = |v: &serde_json::Value, why: &str| {
        assert_eq!(v["state"], "running", "{why}: {v}");
        assert_eq!(v["id"], id.as_str());
        assert_eq!(v["metadata"]["suite"], "fs-pause", "{why}");
        assert_eq!(sh(d, &id, "cat /root/kept.txt").trim(), "on-disk", "{why}");
        assert_eq!(
            try_sh(d, &id, "cat /tmp/ram.txt 2>/dev/null"),
            "",
            "{why}: RAM came back"
        );
        assert!(
            try_sh(d, &id, "pgrep -f 'counte[r].py'").is_empty(),
            "{why}: the counter (pid {pid}) survived a cold boot"
        );
        assert_eq!(
            sh(d, &id, "echo $MODE; hostname")
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["eval", id.as_str()]
        );
        assert_eq!(host_port(d), port, "{why}: the published port moved");
        let b = sh(d, &id, "cat /proc/sys/kernel/random/boot_id");
        assert_ne!(b, boot_id, "{why}: the guest did not boot again");
        b
    };

    let t = Instant::now();
    let v = d.json(&["pause", "--no-memory", &id]);
    eprintln!("a filesystem-only pause took {:?}", t.elapsed());
    assert_eq!(v["state"], "paused", "{v}");
    let p = &v["paused"];
    assert_eq!(
        (p["memory"].as_bool(), p["memory_bytes"].as_u64()),
        (Some(false), Some(0)),
        "{v}"
    );
    assert!(p.get("snapshot").is_none(), "{v}");
    assert!(
        wait_until(Duration::from_secs(15), || !alive(qemu)),
        "QEMU runs on"
    );
    assert_eq!(
        own_snapshots(d),
        snapshots,
        "a filesystem-only pause makes no snapshot"
    );
    let files = d.sandbox_files(&id);
    assert!(
        files.iter().any(|f| f.ends_with("disk.qcow2")),
        "the disk goes: {files:?}"
    );
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with("qmp.sock") || f.ends_with("agent.sock")),
        "{files:?}"
    );
    let t = Instant::now();
    let v = d.json(&["resume", &id]);
    eprintln!("its resume (a cold boot) took {:?}", t.elapsed());
    let boot2 = cold(&v, "resume of a filesystem-only pause");

    // A timeout that pauses without memory.
    let v = d.json(&["timeout", &id, "2", "--on-timeout", "pause-filesystem"]);
    assert_eq!(v["lifetime"]["on_timeout"], "pause_filesystem", "{v}");
    sh(d, &id, "echo again > /root/kept2.txt");
    assert!(
        wait_until(Duration::from_secs(90), || d.json(&["inspect", &id])
            ["state"]
            == "paused"),
        "the timeout did not pause it"
    );
    let v = d.json(&["inspect", &id]);
    assert_eq!(
        (
            v["paused"]["memory"].as_bool(),
            v["paused"]["reason"].as_str()
        ),
        (Some(false), Some("timeout")),
        "{v}"
    );
    let v = d.json(&["resume", &id, "--timeout", "600"]);
    let boot3 = cold(&v, "resume after a timeout's filesystem-only pause");
    assert_ne!(boot3, boot2);
    assert_eq!(sh(d, &id, "cat /root/kept2.txt").trim(), "again");

    // A pause with memory, resumed with --no-memory: a cold boot from its disk.
    sh(d, &id, "echo in-ram > /tmp/ram.txt");
    let v = d.json(&["pause", &id]);
    assert_eq!(v["paused"]["memory"], true, "{v}");
    let v = d.json(&["resume", "--no-memory", &id]);
    cold(&v, "resume --no-memory of a full pause");
    // It owns its RAM now, and a full pause and resume still work.
    d.json(&["pause", &id]);
    let v = d.json(&["resume", &id]);
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(sh(d, &id, "cat /root/kept.txt").trim(), "on-disk");
    drop(sb);
    assert!(
        wait_until(Duration::from_secs(15), || d.sandbox_files(&id).is_empty()),
        "{:?}",
        d.sandbox_files(&id)
    );
}

/// A paused sandbox forks without resuming: its pause snapshot is the
/// branch point. The children have its memory (a counter process and a
/// tmpfs file carry on) and disk, each with its own identity; the source
/// stays paused and resumes afterwards as it was. The pause snapshot stays
/// while a child runs from it, even after the source is removed, and goes
/// with the last child. A filesystem-only pause cannot be forked.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_paused_sandbox_forks_without_resuming() {
    let d = shared();
    let src = d.spawn();
    let id = src.id.clone();
    sh(
        d,
        &id,
        "echo in-memory > /dev/shm/kept && echo on-disk > /root/kept.txt && sync",
    );
    let (pid, _) = start_counter(d, &id);
    let v = d.json(&["pause", &id]);
    assert_eq!(v["state"], "paused", "{v}");
    let pause_snap = v["paused"]["snapshot"].as_str().unwrap().to_string();

    // A tag would name the source's own pause snapshot: refused, nothing made.
    let o = d.run(&["branch", &id, "--count", "1", "--tag", "nope"]);
    assert!(
        !o.status.success(),
        "a tagged branch of a paused sandbox was accepted"
    );
    assert!(stderr(&o).contains("paused"), "{}", stderr(&o));

    let r = d.json(&["branch", &id, "--count", "3"]);
    assert_eq!(r["snapshot"]["id"], pause_snap.as_str(), "{r}");
    assert_eq!(r["pause_ms"].as_f64(), Some(0.0), "{r}");
    let kids = ids(&r["children"]);
    assert_eq!(kids.len(), 3, "{r}");
    assert_eq!(state(d, &id).unwrap()["state"], "paused");

    let mut randoms = std::collections::BTreeSet::new();
    for k in &kids {
        assert_eq!(sh(d, k, "cat /dev/shm/kept").trim(), "in-memory");
        assert_eq!(sh(d, k, "cat /root/kept.txt").trim(), "on-disk");
        // The counter process of the source runs on in each child, from
        // where the pause stopped it (the same pid, a count that grows).
        let (p0, n0) = counter(d, k);
        assert_eq!(p0, pid, "child {k} has no counter of the source");
        assert!(wait_until(Duration::from_secs(30), || counter(d, k).1 > n0));
        // Its own identity: hostname and instance id name the child.
        assert_eq!(sh(d, k, "hostname").trim(), k.as_str());
        let instance = sh(d, k, "cat /run/forkvm/instance-id");
        assert!(
            instance.starts_with(k.as_str()),
            "{k}: instance id {instance}"
        );
        randoms.insert(sh(d, k, "head -c 16 /dev/urandom | od -An -tx1"));
    }
    assert_eq!(
        randoms.len(),
        3,
        "children drew the same random bytes: {randoms:?}"
    );
    // What a child writes is its own.
    sh(d, &kids[0], "echo changed > /root/kept.txt && sync");
    assert_eq!(sh(d, &kids[1], "cat /root/kept.txt").trim(), "on-disk");

    // The source resumes as it was paused.
    let v = d.json(&["resume", &id]);
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(
        sh(d, &id, "cat /dev/shm/kept /root/kept.txt"),
        "in-memory\non-disk\n"
    );
    assert_eq!(counter(d, &id).0, pid);

    // Removed, the source leaves its pause snapshot to the children that
    // run from it; the last child takes it along.
    d.ok(&["rm", &id]);
    let kept = || {
        d.run(&["snapshot", "inspect", &pause_snap])
            .status
            .success()
    };
    assert!(kept(), "the children's snapshot went with the source");
    assert_eq!(sh(d, &kids[2], "cat /dev/shm/kept").trim(), "in-memory");
    for k in &kids {
        d.ok(&["rm", k]);
    }
    assert!(
        !kept(),
        "the pause snapshot outlived the source and all its children"
    );

    // A filesystem-only pause saved no memory: nothing to fork from.
    let fs = d.spawn();
    d.ok(&["pause", &fs.id, "--no-memory"]);
    let o = d.run(&["branch", &fs.id, "--count", "1"]);
    assert!(!o.status.success(), "a filesystem-only pause was forked");
    assert!(
        stderr(&o).contains("filesystem only") && stderr(&o).contains("resume"),
        "{}",
        stderr(&o)
    );
}
