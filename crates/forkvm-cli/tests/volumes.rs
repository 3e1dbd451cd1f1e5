//! End-to-end tests of volumes (docs/volumes.md): host directories and named
//! volumes mounted into real microVMs over the FUSE relay, through writes,
//! read-only mounts, escape attempts, branches in every mode with `copy` and
//! `shared` volumes, snapshots, pause/resume and a daemon restart. Real
//! daemon, real QEMU; run with `make test`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// A host directory tree for one test: `root/vol` is mounted; `root/secret`
/// lies outside it and holds a marker no guest may ever read.
struct HostDir {
    _t: tempfile::TempDir,
    root: PathBuf,
    marker: String,
}

impl HostDir {
    fn new() -> HostDir {
        let t = tempfile::Builder::new()
            .prefix("fvvol-")
            .tempdir_in("/tmp")
            .unwrap();
        let root = t.path().to_path_buf();
        std::fs::create_dir(root.join("vol")).unwrap();
        let marker = format!("SECRET-{}", std::process::id());
        std::fs::write(root.join("secret"), &marker).unwrap();
        HostDir {
            _t: t,
            root,
            marker,
        }
    }
    fn vol(&self) -> PathBuf {
        self.root.join("vol")
    }
    fn arg(&self, guest: &str, opts: &str) -> String {
        format!("{}:{guest}{opts}", self.vol().display())
    }
}

fn spawn_with<'a>(d: &'a Daemon, vols: &[String]) -> Sandbox<'a> {
    let mut a = vec!["spawn".to_string()];
    for v in vols {
        a.push("--volume".into());
        a.push(v.clone());
    }
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let id = d.ok(&a).trim().to_string();
    assert!(id.starts_with("sb-"), "unexpected spawn output {id:?}");
    Sandbox { d, id }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn host_files_reach_the_guest_and_guest_writes_reach_the_host() {
    let d = shared();
    let h = HostDir::new();
    std::fs::write(h.vol().join("hello.txt"), "from the host\n").unwrap();
    // Files the guest creates belong to the directory's owner on the host.
    std::os::unix::fs::chown(h.vol(), Some(4321), Some(4322)).unwrap();
    let ro = HostDir::new();
    std::fs::write(ro.vol().join("keep.txt"), "unchanged\n").unwrap();
    let sb = spawn_with(d, &[h.arg("/work", ""), ro.arg("/ro", ":ro")]);

    assert_eq!(sh(d, &sb.id, "cat /work/hello.txt"), "from the host\n");
    sh(
        d,
        &sb.id,
        "echo from the guest > /work/out.txt && mkdir -p /work/a/b && echo deep > /work/a/b/c \
         && mv /work/a/b/c /work/a/moved && rm /work/hello.txt",
    );
    assert_eq!(read(&h.vol().join("out.txt")), "from the guest\n");
    assert_eq!(read(&h.vol().join("a/moved")), "deep\n");
    assert!(!h.vol().join("hello.txt").exists());
    let md = std::fs::metadata(h.vol().join("out.txt")).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        (4321, 4322),
        "host owner of a guest file"
    );
    // A host change is seen by the guest.
    std::fs::write(h.vol().join("later.txt"), "later\n").unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || try_sh(
            d,
            &sb.id,
            "cat /work/later.txt"
        ) == "later\n"),
        "the guest never saw a file the host wrote"
    );

    // Read-only: reads work, every write is refused.
    assert_eq!(sh(d, &sb.id, "cat /ro/keep.txt"), "unchanged\n");
    for w in [
        "echo x > /ro/keep.txt",
        "echo x > /ro/new.txt",
        "mkdir /ro/d",
        "rm /ro/keep.txt",
    ] {
        let o = sb.exec(&["sh", "-c", &format!("({w}) 2>&1")]);
        assert!(!o.status.success(), "{w} succeeded on a read-only volume");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("Read-only file system"),
            "{w}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    assert_eq!(read(&ro.vol().join("keep.txt")), "unchanged\n");
    assert!(!ro.vol().join("new.txt").exists());

    // The API shows the volumes.
    let v = d.json(&["inspect", &sb.id]);
    let vols = v["volumes"].as_array().expect("volumes in inspect");
    assert_eq!(vols.len(), 2);
    assert_eq!(vols[1]["read_only"], true);
    assert_eq!(vols[0]["host_path"], h.vol().display().to_string());
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn escapes_from_the_volume_are_refused() {
    let d = shared();
    let h = HostDir::new();
    std::fs::write(h.vol().join("ok.txt"), "ok\n").unwrap();
    // Planted on the host: an absolute symlink and a relative one out of the
    // volume, and a hardlink to the outside file.
    let secret = h.root.join("secret");
    std::os::unix::fs::symlink(&secret, h.vol().join("abs")).unwrap();
    std::os::unix::fs::symlink("../secret", h.vol().join("rel")).unwrap();
    std::fs::hard_link(&secret, h.vol().join("hard")).unwrap();
    let sb = spawn_with(d, &[h.arg("/work", "")]);
    let m = &h.marker;

    // `..` never leaves the guest's own tree.
    for p in [
        "/work/../secret",
        "/work/a/../../secret",
        "/work/abs",
        "/work/rel",
    ] {
        let out = try_sh(d, &sb.id, &format!("cat {p} 2>&1"));
        assert!(!out.contains(m.as_str()), "{p} reached the host: {out}");
    }
    // The hardlink is refused outright.
    let out = try_sh(d, &sb.id, "cat /work/hard 2>&1; echo rc=$?");
    assert!(
        !out.contains(m.as_str()),
        "a hardlink reached the host: {out}"
    );
    assert!(out.contains("rc=1"), "{out}");
    // Symlinks out of the volume and hardlinks cannot be made from the guest.
    for (cmd, name) in [
        ("ln -s /etc/passwd /work/evil", "evil"),
        ("ln -s ../../../../secret /work/evil2", "evil2"),
        ("ln /work/ok.txt /work/hard2", "hard2"),
    ] {
        let o = sb.exec(&["sh", "-c", &format!("({cmd}) 2>&1")]);
        assert!(!o.status.success(), "{cmd} succeeded");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("not permitted"),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(
            std::fs::symlink_metadata(h.vol().join(name)).is_err(),
            "{cmd} left {name} on the host"
        );
    }
    // A symlink inside the volume is fine, and followed inside it.
    sh(d, &sb.id, "ln -s ok.txt /work/inside && cat /work/inside");
    // Nothing outside changed.
    assert_eq!(read(&secret), *m);

    // Sources that would expose forkvm itself are refused.
    let home = d.home.display().to_string();
    let o = d.run(&["spawn", "--volume", &format!("{home}:/h")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("home"), "{}", stderr(&o));
    let o = d.run(&["spawn", "--volume", "/nonexistent-dir-fvt:/x"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("existing host directory"),
        "{}",
        stderr(&o)
    );
    let o = d.run(&["spawn", "--volume", &h.arg("/", "")]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("bad guest path"), "{}", stderr(&o));
}

/// Every path below `vol` that, followed on the host, leads outside it.
fn escaping_paths(vol: &Path) -> Vec<PathBuf> {
    let top = std::fs::canonicalize(vol).unwrap();
    let (mut bad, mut stack) = (Vec::new(), vec![vol.to_path_buf()]);
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p.clone());
            }
            if std::fs::canonicalize(&p).is_ok_and(|c| !c.starts_with(&top)) {
                bad.push(p);
            }
        }
    }
    bad
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_symlink_cannot_be_moved_out_of_the_volume() {
    // Issue 30: a link that stays inside from four levels down, moved to
    // the root, named the host's /etc/passwd.
    let d = shared();
    let h = HostDir::new();
    let sb = spawn_with(d, &[h.arg("/work", "")]);
    let out = try_sh(
        d,
        &sb.id,
        "cd /work && mkdir -p a/b/c/d && ln -s ../../../../etc/passwd a/b/c/d/l \
         && echo made; mv a/b/c/d/l l 2>&1; echo mv=$?; mv a/b/c c 2>&1; echo dir=$?; \
         ln -s . x && ln -s x/.. up 2>&1; echo up=$?",
    );
    assert!(out.contains("made"), "the link was not even created: {out}");
    for (what, tag) in [
        ("moving the link up", "mv=0"),
        ("moving its directory up", "dir=0"),
        ("a link through x -> .", "up=0"),
    ] {
        assert!(!out.contains(tag), "{what} succeeded: {out}");
    }
    assert!(out.contains("not permitted"), "{out}");
    assert!(std::fs::symlink_metadata(h.vol().join("l")).is_err());
    assert!(std::fs::symlink_metadata(h.vol().join("up")).is_err());
    assert!(h.vol().join("a/b/c/d").is_dir());
    assert_eq!(escaping_paths(&h.vol()), Vec::<PathBuf>::new());
    // Within the volume the guest still moves links and directories.
    sh(
        d,
        &sb.id,
        "cd /work && mv a/b/c/d/l a/b/c/d/l2 && mv a a2 && test -L a2/b/c/d/l2",
    );

    // An archive download of a normal tree keeps every name as the guest
    // has it (the daemon rewrites the guest's tar, changing nothing here).
    let tarf = h.root.join("dl.tar");
    d.ok(&[
        "fs",
        "download",
        &sb.id,
        "/work/a2",
        "-o",
        tarf.to_str().unwrap(),
    ]);
    let mut got: Vec<(String, Option<String>)> =
        tar::Archive::new(std::fs::File::open(&tarf).unwrap())
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned());
                (e.path().unwrap().to_string_lossy().into_owned(), link)
            })
            .collect();
    got.sort();
    let want: Vec<String> = sh(d, &sb.id, "find /work/a2 | sort")
        .lines()
        .map(|l| l.trim_start_matches('/').to_string())
        .collect();
    assert_eq!(got.iter().map(|g| g.0.clone()).collect::<Vec<_>>(), want);
    assert!(
        got.contains(&(
            "work/a2/b/c/d/l2".into(),
            Some("../../../../etc/passwd".into())
        )),
        "{got:?}"
    );
    let o = d.run(&["fs", "download", &sb.id, "/work/../etc"]);
    assert!(
        !o.status.success() && stderr(&o).contains(".."),
        "{}",
        stderr(&o)
    );
}

/// A background writer holding one file open across branches.
const TICKER: &str = r#"
import time
f = open('/copy/ticks.txt', 'a', buffering=1)
n = 0
while True:
    n += 1
    f.write('tick %d\n' % n)
    time.sleep(0.1)
"#;

fn lines(s: &str) -> usize {
    s.lines().count()
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn branches_give_copy_volumes_their_own_files_and_share_shared_ones() {
    let d = shared();
    let c = HostDir::new();
    let s = HostDir::new();
    std::fs::write(c.vol().join("base.txt"), "base\n").unwrap();
    let src = spawn_with(d, &[c.arg("/copy", ":copy"), s.arg("/shared", "")]);
    start_python(d, &src.id, "/root/ticker.py", "/tmp/ticker.log", TICKER);
    assert!(wait_until(Duration::from_secs(60), || lines(&read(
        &c.vol().join("ticks.txt")
    )) > 2));

    for mode in ["live", "full", "diff"] {
        let v = d.json(&["branch", &src.id, "--mode", mode, "--count", "2"]);
        let kids = ids(&v["children"]);
        assert_eq!(kids.len(), 2, "{mode}: {v}");
        let _g: Vec<Sandbox> = kids.iter().map(|k| Sandbox { d, id: k.clone() }).collect();
        let (a, b) = (&kids[0], &kids[1]);
        // Each child has its own copy as of the branch instant.
        assert_eq!(sh(d, a, "cat /copy/base.txt"), "base\n", "{mode}");
        sh(d, a, "echo child-a > /copy/own.txt");
        sh(d, b, "echo child-b > /copy/own.txt");
        assert_eq!(sh(d, a, "cat /copy/own.txt"), "child-a\n", "{mode}");
        assert_eq!(sh(d, b, "cat /copy/own.txt"), "child-b\n", "{mode}");
        assert!(
            !c.vol().join("own.txt").exists(),
            "{mode}: a child wrote into the source's directory"
        );
        let va = d.json(&["inspect", a]);
        let pa = PathBuf::from(va["volumes"][0]["host_path"].as_str().unwrap());
        assert_ne!(pa, c.vol(), "{mode}");
        assert_eq!(read(&pa.join("own.txt")), "child-a\n", "{mode}");
        // The ticker kept its open file in the child: it now writes the
        // child's copy, while the source's keeps growing on its own.
        let at = lines(&read(&pa.join("ticks.txt")));
        assert!(
            wait_until(Duration::from_secs(60), || lines(&read(
                &pa.join("ticks.txt")
            )) > at + 2),
            "{mode}: the child's open file stopped working"
        );
        let host = lines(&read(&c.vol().join("ticks.txt")));
        assert!(
            wait_until(Duration::from_secs(60), || lines(&read(
                &c.vol().join("ticks.txt")
            )) > host + 2),
            "{mode}: the source's open file stopped working"
        );
        // The shared volume: one child's write is seen by the other and the host.
        sh(d, a, &format!("echo {mode} > /shared/from-a.txt"));
        assert!(
            wait_until(Duration::from_secs(5), || try_sh(
                d,
                b,
                "cat /shared/from-a.txt"
            ) == format!("{mode}\n")),
            "{mode}: the other child never saw a shared write"
        );
        assert_eq!(read(&s.vol().join("from-a.txt")), format!("{mode}\n"));
    }
    // The source is untouched and still serving.
    assert_eq!(sh(d, &src.id, "cat /copy/base.txt"), "base\n");
    assert!(try_sh(d, &src.id, "cat /copy/own.txt 2>&1").contains("No such file"));
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn snapshots_pauses_named_volumes_and_a_daemon_restart_keep_volumes_working() {
    let mut d = Daemon::start();
    let c = HostDir::new();
    d.ok(&["volume", "create", "data"]);
    let l = d.json(&["volume", "ls"]);
    assert_eq!(l["volumes"][0]["name"], "data");
    let named = PathBuf::from(l["volumes"][0]["path"].as_str().unwrap());
    let id = d
        .ok(&[
            "spawn",
            "--volume",
            &c.arg("/copy", ":copy"),
            "--volume",
            "data:/data",
        ])
        .trim()
        .to_string();
    sh(
        &d,
        &id,
        "echo at-snapshot > /copy/f.txt && echo named > /data/n.txt",
    );
    assert_eq!(read(&named.join("n.txt")), "named\n");
    let o = d.run(&["volume", "rm", "data"]);
    assert!(!o.status.success(), "a mounted volume was removed");
    assert!(stderr(&o).contains(&id), "{}", stderr(&o));

    // Spawn from a snapshot taken with volumes mounted.
    d.ok(&["snapshot", &id, "--tag", "withvol"]);
    sh(&d, &id, "echo after > /copy/f.txt");
    let kid = d.ok(&["spawn", "--snapshot", "withvol"]).trim().to_string();
    assert_eq!(sh(&d, &kid, "cat /copy/f.txt"), "at-snapshot\n");
    assert_eq!(sh(&d, &kid, "cat /data/n.txt"), "named\n");
    sh(&d, &kid, "echo kid > /copy/f.txt");
    assert_eq!(read(&c.vol().join("f.txt")), "after\n");
    // Volumes of a snapshot are fixed: asking again is refused.
    let o = d.run(&[
        "spawn",
        "--snapshot",
        "withvol",
        "--volume",
        &c.arg("/x", ""),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("has volumes of its own"),
        "{}",
        stderr(&o)
    );

    // Pause and resume: the sandbox serves its own directories again.
    d.ok(&["pause", &id]);
    d.ok(&["resume", &id]);
    assert_eq!(sh(&d, &id, "cat /copy/f.txt"), "after\n");
    sh(&d, &id, "echo resumed > /copy/g.txt");
    assert_eq!(read(&c.vol().join("g.txt")), "resumed\n");

    // A daemon restart, with a file held open in the guest across it.
    start_python(
        &d,
        &id,
        "/root/ticker.py",
        "/tmp/ticker.log",
        &TICKER.replace("/copy/ticks.txt", "/data/ticks.txt"),
    );
    assert!(wait_until(Duration::from_secs(60), || lines(&read(
        &named.join("ticks.txt")
    )) > 2));
    d.stop(libc::SIGKILL);
    d.spawn_process();
    let at = lines(&read(&named.join("ticks.txt")));
    assert!(
        wait_until(Duration::from_secs(60), || lines(&read(
            &named.join("ticks.txt")
        )) > at + 2),
        "the open file stopped working after the daemon restart"
    );
    assert_eq!(sh(&d, &id, "cat /copy/f.txt"), "after\n");
    sh(&d, &id, "echo restarted > /copy/h.txt");
    assert_eq!(read(&c.vol().join("h.txt")), "restarted\n");

    for s in [&kid, &id] {
        d.ok(&["rm", s]);
    }
    // Removing the sandboxes frees the volume, and their copies are gone.
    assert!(!d.home.join("volume-data").join(&kid).exists());
    d.ok(&["volume", "rm", "data"]);
    assert!(!named.exists());
    assert!(
        c.vol().join("f.txt").exists(),
        "a host directory was touched"
    );
}
