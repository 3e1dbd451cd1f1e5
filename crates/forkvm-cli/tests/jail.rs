//! The QEMU jail, checked from outside against real sandboxes: every QEMU
//! (cold boot, clone of a boot template, warm-pool QEMU) runs as a uid of its
//! own with no capabilities, `no_new_privs`, QEMU's seccomp filter, a root
//! that is not the host's, pid and ipc namespaces of its own, rlimits on
//! open files and file size, a cgroup of its own under the daemon's, and
//! none of the daemon's inherited descriptors; and asked over its QMP
//! socket, as a compromised QEMU would be, it cannot open host files.
//! docs/security.md describes the jail. Run with `make test`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// One `Key:\tvalue` line of /proc/PID/status.
fn status(pid: u32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// The `Soft Hard` columns of one /proc/PID/limits line.
fn limit(pid: u32, name: &str) -> (String, String) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let l = s
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/limits"));
    let mut f = l[name.len()..].split_whitespace();
    (f.next().unwrap().into(), f.next().unwrap().into())
}

/// The daemon's process id.
fn daemon_pid(d: &Daemon) -> u32 {
    d.child.as_ref().expect("daemon running").id()
}

/// `hierarchy id:controllers` -> path, from /proc/PID/cgroup.
fn cgroups_of(pid: u32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (h, p) = l.rsplit_once(':')?;
            Some((h.to_string(), p.to_string()))
        })
        .collect()
}

/// Assert everything the jail promises about the QEMU of sandbox `id`
/// (started by daemon `d`); returns its uid.
fn assert_jailed(d: &Daemon, pid: u32, id: &str) -> u32 {
    let uids: Vec<u32> = status(pid, "Uid")
        .split_whitespace()
        .map(|u| u.parse().unwrap())
        .collect();
    assert_eq!(uids.len(), 4);
    assert!(
        uids.iter().all(|&u| u == uids[0] && u != 0),
        "uids {uids:?}"
    );
    let gids = status(pid, "Gid");
    assert!(gids.split_whitespace().all(|g| g != "0"), "gids {gids}");
    assert_eq!(status(pid, "Groups"), "");
    for cap in ["CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"] {
        assert_eq!(status(pid, cap), "0000000000000000", "{cap} of QEMU {pid}");
    }
    assert_eq!(status(pid, "NoNewPrivs"), "1");
    assert_eq!(status(pid, "Seccomp"), "2");

    // Its root is a tree of its own, where the host's files are absent.
    let host = std::fs::metadata("/").unwrap();
    let root = std::fs::metadata(format!("/proc/{pid}/root/")).unwrap();
    assert!(
        (host.dev(), host.ino()) != (root.dev(), root.ino()),
        "QEMU {pid} has the host's root"
    );
    let inside = |p: &str| PathBuf::from(format!("/proc/{pid}/root{p}"));
    assert!(!inside("/etc/shadow").exists());
    assert!(!inside("/root").exists());
    assert!(inside("/usr/bin").is_dir(), "QEMU needs /usr");

    // A cgroup named after the sandbox, in every hierarchy it is placed in,
    // under the daemon's own cgroup there (or the leaf the daemon moved
    // itself into, on v2).
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cg.lines().any(|l| l.ends_with(&format!("/{id}"))),
        "QEMU {pid} of {id} is not in a cgroup of its own:\n{cg}"
    );
    let own = cgroups_of(daemon_pid(d));
    for (h, p) in cgroups_of(pid) {
        if !p.ends_with(&format!("/{id}")) {
            continue;
        }
        let (_, dp) = own
            .iter()
            .find(|(dh, _)| *dh == h)
            .unwrap_or_else(|| panic!("the daemon is not in hierarchy {h}"));
        let dp = dp.strip_suffix("/forkvm-daemon").unwrap_or(dp);
        let base = dp.trim_end_matches('/');
        assert!(
            p.starts_with(&format!("{base}/forkvm-")),
            "QEMU {pid} of {id} is in {h}:{p}, not under the daemon's {h}:{dp}"
        );
    }

    // Namespaces of its own: it sees no other process (pid 1 of its pid
    // namespace) and shares no System V IPC or message queues.
    for ns in ["pid", "ipc", "mnt"] {
        let host = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        assert_ne!(host, its, "QEMU {pid} shares the host's {ns} namespace");
    }
    let nspid = status(pid, "NSpid");
    assert_eq!(
        nspid.split_whitespace().collect::<Vec<_>>(),
        [pid.to_string().as_str(), "1"],
        "NSpid of QEMU {pid}"
    );

    // rlimits, hard = soft: 2048 open files, files no bigger than its RAM
    // or disk plus room (see forkvm_daemon::jail::fsize_limit).
    assert_eq!(
        limit(pid, "Max open files"),
        ("2048".into(), "2048".into()),
        "QEMU {pid}"
    );
    let (soft, hard) = limit(pid, "Max file size");
    assert_eq!(soft, hard);
    let fsize: u64 = soft
        .parse()
        .unwrap_or_else(|_| panic!("QEMU {pid}'s file size is not limited: {soft}"));
    assert!(
        (1 << 30..4 << 40).contains(&fsize),
        "QEMU {pid}'s file size limit {fsize}"
    );
    uids[0]
}

/// The QEMU pid of a sandbox, or of a pooled QEMU (which has no row).
fn qemu_pid(d: &Daemon, id: &str) -> u32 {
    let p = d.home.join("sandboxes").join(id).join("qemu.pid");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    forkvm_qemu::process::QemuId::parse(&text)
        .unwrap_or_else(|e| panic!("{}: {text:?} ({e:?})", p.display()))
        .pid
}

/// A minimal QMP client: the attacker's view of a QEMU it controls.
struct Qmp(BufReader<UnixStream>);

impl Qmp {
    fn connect(sock: &Path) -> Qmp {
        let s = UnixStream::connect(sock).expect("qmp socket");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut q = Qmp(BufReader::new(s));
        q.read(); // greeting
        q.call("qmp_capabilities", serde_json::json!({}));
        q
    }
    fn read(&mut self) -> serde_json::Value {
        let mut l = String::new();
        self.0.read_line(&mut l).expect("qmp read");
        serde_json::from_str(&l).expect("qmp json")
    }
    fn call(&mut self, cmd: &str, args: serde_json::Value) -> serde_json::Value {
        let req = serde_json::json!({ "execute": cmd, "arguments": args });
        writeln!(self.0.get_mut(), "{req}").unwrap();
        loop {
            let v = self.read();
            if v.get("event").is_none() {
                return v;
            }
        }
    }
    fn open(&mut self, node: &str, path: &Path) -> serde_json::Value {
        self.call(
            "blockdev-add",
            serde_json::json!({
                "driver": "file", "filename": path, "node-name": node, "read-only": true,
            }),
        )
    }
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn cold_booted_and_cloned_qemus_are_jailed_each_as_its_own_uid() {
    let d = shared();
    let cold = d.spawn_cold();
    let clone = d.spawn();
    let u1 = assert_jailed(d, cold.pid(), &cold.id);
    let u2 = assert_jailed(d, clone.pid(), &clone.id);
    assert_ne!(u1, u2, "two sandboxes share a uid");
    // Jailed, the sandboxes still work: disk writes, and a branch of each.
    for sb in [&cold, &clone] {
        assert_eq!(sh(d, &sb.id, "echo ok > /root/f && cat /root/f"), "ok\n");
        let v = d.json(&["branch", &sb.id, "--mode", "diff"]);
        let child = v["children"][0]["id"].as_str().unwrap().to_string();
        assert_jailed(d, qemu_pid(d, &child), &child);
        assert_eq!(sh(d, &child, "cat /root/f"), "ok\n");
        d.ok(&["rm", &child]);
    }
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_jailed_qemu_cannot_open_host_files_or_another_sandboxs_disk() {
    let d = shared();
    let a = d.spawn();
    let b = d.spawn();
    let paths = forkvm_daemon::Config::for_home(&d.home);
    let (pa, pb) = (paths.sandbox_paths(&a.id), paths.sandbox_paths(&b.id));
    let mut q = Qmp::connect(&pa.qmp);
    for (i, f) in [
        PathBuf::from("/etc/shadow"),
        PathBuf::from("/etc/passwd"),
        pb.disk.clone(),
        d.home.join("state.db"),
    ]
    .iter()
    .enumerate()
    {
        assert!(
            f.exists(),
            "{} must exist for the test to mean anything",
            f.display()
        );
        let r = q.open(&format!("probe{i}"), f);
        assert!(
            r.get("error").is_some(),
            "jailed QEMU of {} opened {}: {r}",
            a.id,
            f.display()
        );
    }
    // The same request works on a file the jail does show it (its own
    // disk), so the refusals above are the jail's doing.
    let r = q.open("own", &pa.disk);
    assert!(r.get("return").is_some(), "{r}");
    drop(q);
    // And the sandbox is unharmed.
    assert_eq!(sh(d, &a.id, "echo alive"), "alive\n");

    // A compromised QEMU owns its sockets and could swap its QMP socket for
    // a link to another sandbox's: the daemon then refuses to talk to it
    // (the listener is not this sandbox's uid) instead of snapshotting B.
    std::fs::remove_file(&pa.qmp).unwrap();
    std::os::unix::fs::symlink(&pb.qmp, &pa.qmp).unwrap();
    let o = d.run(&["snapshot", &a.id]);
    assert!(
        !o.status.success(),
        "a snapshot went through a swapped socket"
    );
    assert!(stderr(&o).contains("QMP socket"), "{}", stderr(&o));
    assert_eq!(d.json(&["inspect", &b.id])["state"], "running");
    assert_eq!(sh(d, &b.id, "echo fine"), "fine\n");
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn warm_pool_qemus_are_jailed_and_cgroups_go_with_their_sandbox() {
    let d = shared();
    let src = d.spawn();
    let snap = d.json(&["snapshot", &src.id])["id"]
        .as_str()
        .unwrap()
        .to_string();
    d.ok(&["snapshot", "pool", &snap, "1"]);
    // The pooled QEMU is a directory under sandboxes/ with no row.
    let listed = |d: &Daemon| -> Vec<String> {
        std::fs::read_dir(d.home.join("sandboxes"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let rows: Vec<String> = d.json(&["ps"])["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let mut pooled = None;
    assert!(
        wait_until(Duration::from_secs(60), || {
            pooled = listed(d).into_iter().find(|id| {
                !rows.contains(id)
                    && d.home.join("sandboxes").join(id).join("qemu.pid").exists()
                    && d.home.join("sandboxes").join(id).join("qmp.sock").exists()
            });
            pooled.is_some()
        }),
        "no warm-pool QEMU appeared"
    );
    let pooled = pooled.unwrap();
    assert_jailed(d, qemu_pid(d, &pooled), &pooled);
    // A spawn from the pool keeps the jail it was started in.
    let v = d.json(&["spawn", "--snapshot", &snap]);
    let id = v["id"].as_str().unwrap().to_string();
    let pid = qemu_pid(d, &id);
    assert_jailed(d, pid, &id);
    assert_eq!(sh(d, &id, "echo up"), "up\n");

    // Removing the sandbox removes its cgroup.
    let cgroups: Vec<PathBuf> = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(&format!("/{id}")))
        .filter_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (ctrl, path) = rest.split_once(':')?;
            let ctrl = if ctrl.is_empty() { "unified" } else { ctrl };
            Some(PathBuf::from(format!("/sys/fs/cgroup/{ctrl}{path}")))
        })
        .filter(|p| p.exists())
        .collect();
    assert!(
        !cgroups.is_empty(),
        "cannot find the cgroup directories of {id}"
    );
    d.ok(&["rm", &id]);
    assert!(
        wait_until(Duration::from_secs(10), || cgroups
            .iter()
            .all(|p| !p.exists())),
        "cgroups left after rm: {cgroups:?}"
    );
    d.ok(&["snapshot", "pool", &snap, "0"]);
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_descriptor_the_daemon_inherited_does_not_reach_qemu() {
    // A pipe the daemon's parent left open without close-on-exec, at 251.
    let mut p = [0; 2];
    // SAFETY: pipe2(2) into an array we own.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let ino = std::fs::metadata(format!("/proc/self/fd/{}", p[1]))
        .unwrap()
        .ino();
    let pipe = PathBuf::from(format!("pipe:[{ino}]"));
    let d = Daemon::start_passing_fd(p[1], 251);
    let dpid = daemon_pid(&d);
    assert_eq!(
        std::fs::read_link(format!("/proc/{dpid}/fd/251")).unwrap(),
        pipe,
        "the daemon did not inherit the pipe: the test means nothing"
    );
    let sb = d.spawn();
    let pid = sb.pid();
    let fds: Vec<(String, PathBuf)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let t = std::fs::read_link(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), t))
        })
        .collect();
    eprintln!("QEMU {pid} holds {} descriptors", fds.len());
    for (n, t) in &fds {
        assert_ne!(*t, pipe, "QEMU {pid} inherited the daemon's pipe as fd {n}");
    }
    assert_jailed(&d, pid, &sb.id);
    assert_eq!(sh(&d, &sb.id, "echo ok"), "ok\n");

    // As pid 1 of its namespace QEMU gets only the signals it handles from
    // the daemon's namespace: SIGTERM still makes it quit.
    // SAFETY: signalling the QEMU this test's daemon started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    assert!(
        wait_until(Duration::from_secs(20), || !alive(pid)),
        "QEMU {pid} ignored SIGTERM"
    );
    drop(sb);
    for fd in p {
        // SAFETY: closing the pipe this test made.
        unsafe { libc::close(fd) };
    }
}
