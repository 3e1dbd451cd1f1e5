//! Clones of a diff snapshot map its chain flattened into one file
//! (`memory.head`, see docs/snapshots.md): they hold the exact state of
//! every link, and siblings share the chain's pages instead of each holding
//! a private copy. Real daemon, real microVMs; run with `make test`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// MiB of random data each level's process holds in memory.
const HELD_MIB: u64 = 16;

/// A process of level `@K@`: 16 MiB of random bytes held in memory, and a
/// random file on disk; it answers `/tmp/q@K@` with the md5 of its memory.
const HOLDER: &str = r#"
import hashlib, os, time
k = '@K@'
buf = os.urandom(@MIB@ << 20)
open('/root/disk' + k, 'wb').write(os.urandom(1 << 20))
os.sync()
def put(name, value):
    open('/tmp/' + name + '.tmp', 'w').write(value)
    os.rename('/tmp/' + name + '.tmp', '/tmp/' + name)
put('m' + k, hashlib.md5(buf).hexdigest())
while True:
    if os.path.exists('/tmp/q' + k):
        os.remove('/tmp/q' + k)
        put('a' + k, hashlib.md5(buf).hexdigest())
    time.sleep(0.05)
"#;

/// Start level `k`'s holder; returns (md5 of its memory, md5 of its file).
fn hold(d: &Daemon, id: &str, k: usize) -> (String, String) {
    let program = HOLDER
        .replace("@K@", &k.to_string())
        .replace("@MIB@", &HELD_MIB.to_string());
    let log = format!("/tmp/holder{k}.log");
    start_python(d, id, &format!("/root/holder{k}.py"), &log, &program);
    let mut m = String::new();
    assert!(
        wait_until(Duration::from_secs(180), || {
            m = try_sh(d, id, &format!("cat /tmp/m{k} 2>/dev/null"));
            m.len() == 32
        }),
        "holder {k} never started: {}",
        try_sh(d, id, &format!("cat {log}"))
    );
    (m, disk_md5(d, id, k))
}

fn disk_md5(d: &Daemon, id: &str, k: usize) -> String {
    let o = sh(d, id, &format!("md5sum /root/disk{k}"));
    o.split_whitespace().next().unwrap_or_default().to_string()
}

/// Ask level `k`'s holder for the md5 of its memory, computed now.
fn ask(d: &Daemon, id: &str, k: usize) -> String {
    sh(d, id, &format!("rm -f /tmp/a{k}; touch /tmp/q{k}"));
    let mut v = String::new();
    assert!(
        wait_until(Duration::from_secs(120), || {
            v = try_sh(d, id, &format!("cat /tmp/a{k} 2>/dev/null"));
            v.len() == 32
        }),
        "{id}: holder {k} did not answer"
    );
    v
}

/// The smaps fields (KiB) of `pid`'s mapping of `path` that is `len` bytes.
fn mapping_smaps(pid: u32, path: &Path, len: u64) -> Option<Vec<(String, u64)>> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let want = path.to_string_lossy();
    let mut found = None;
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = f.first() else { continue };
        if first.contains('-') && !first.ends_with(':') {
            if found.is_some() {
                break;
            }
            let (a, b) = first.split_once('-')?;
            let size = u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?;
            if size == len && f.get(5) == Some(&want.as_ref()) {
                found = Some(Vec::new());
            }
        } else if let (Some(v), true) = (found.as_mut(), f.len() >= 3 && f[2] == "kB") {
            v.push((first.trim_end_matches(':').to_string(), f[1].parse().ok()?));
        }
    }
    found
}

fn field(s: &[(String, u64)], name: &str) -> u64 {
    s.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)
}

/// A chain four diffs deep (the source is a clone of the boot template):
/// each level starts a process holding random data in memory and writes a
/// random file, then is branched in `diff` mode, and the next level is a
/// clone of that. Two siblings spawned together from the head hold every
/// level's memory and files exactly, map the head file built once for
/// them, and hold privately only what they wrote since, while the chain's
/// pages (the held data they both read) are shared between them.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn siblings_of_a_diff_chain_share_its_flattened_head() {
    let d = shared();
    let src = d.spawn();
    let mut want = vec![hold(d, &src.id, 0)];
    let r = d.json(&["branch", &src.id, "--mode", "diff", "--count", "0"]);
    assert_eq!(r["snapshot"]["kind"], "diff");
    let mut snaps = vec![r["snapshot"]["id"].as_str().unwrap().to_string()];
    let mut level_guards = Vec::new();
    for k in 1..=3usize {
        let parent = snaps.last().unwrap().clone();
        let c = d.ok(&["spawn", "--snapshot", &parent]).trim().to_string();
        level_guards.push(Sandbox { d, id: c.clone() });
        want.push(hold(d, &c, k));
        let r = d.json(&["branch", &c, "--mode", "diff", "--count", "0"]);
        let s = &r["snapshot"];
        assert_eq!(s["kind"], "diff");
        assert_eq!(s["parent"].as_str().unwrap(), parent);
        snaps.push(s["id"].as_str().unwrap().to_string());
    }
    // The levels' sources are not needed any more.
    drop(level_guards);
    drop(src);
    let head_snap = snaps.last().unwrap().clone();
    let head_dir = d.home.join("snapshots").join(&head_snap);
    let head = head_dir.join("memory.head");
    assert!(!exists(&head), "built at the first spawn, not before");
    // The pages the links hold, all of them.
    let link_bytes: u64 = snaps
        .iter()
        .map(|s| {
            d.json(&["snapshot", "inspect", s])["sizes"]["memory_diff_bytes"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert!(
        link_bytes >= (4 * HELD_MIB) << 20,
        "the links hold {link_bytes} bytes"
    );

    let b = d.json(&["spawn", "--snapshot", &head_snap, "--count", "2"]);
    let kids = ids(&b["sandboxes"]);
    assert_eq!(kids.len(), 2);
    let kids: Vec<Sandbox> = kids.into_iter().map(|id| Sandbox { d, id }).collect();
    assert!(exists(&head) && exists(&head_dir.join("memory.head.stamp")));
    let built = d
        .log()
        .matches(&format!(
            "built the flattened memory of diff snapshot {head_snap}"
        ))
        .count();
    assert_eq!(built, 1, "two spawns at once built the head {built} times");
    for kid in &kids {
        for (k, (mem, disk)) in want.iter().enumerate() {
            assert_eq!(&ask(d, &kid.id, k), mem, "{}: level {k}'s memory", kid.id);
            assert_eq!(
                &disk_md5(d, &kid.id, k),
                disk,
                "{}: level {k}'s file",
                kid.id
            );
        }
    }
    // Both QEMUs map the head; what each holds privately there is what it
    // wrote since it started, far less than the links' pages; the held data
    // both read is in both mappings, shared (page cache of one file).
    let ram = d.json(&["inspect", &kids[0].id])["memory_mib"]
        .as_u64()
        .unwrap()
        << 20;
    for kid in &kids {
        let s = mapping_smaps(kid.pid(), &head, ram)
            .unwrap_or_else(|| panic!("{}'s QEMU does not map {}", kid.id, head.display()));
        let private = field(&s, "Private_Dirty") << 10;
        let shared = (field(&s, "Shared_Clean") + field(&s, "Shared_Dirty")) << 10;
        eprintln!(
            "{}: private {} MiB, shared {} MiB of the head; the links hold {} MiB",
            kid.id,
            private >> 20,
            shared >> 20,
            link_bytes >> 20
        );
        assert!(
            private < link_bytes / 2,
            "{}: {private} bytes private, the links hold {link_bytes}",
            kid.id
        );
        assert!(
            shared >= (4 * HELD_MIB) << 20,
            "{}: only {shared} bytes shared",
            kid.id
        );
    }
    // Removing the snapshot removes its head too (the clones keep theirs).
    drop(kids);
    d.ok(&["snapshot", "rm", "--force", &snaps[0]]);
    assert!(!exists(&head), "the head outlived its snapshot");
}

/// `memory.head` of `snap` (in the shared daemon's store).
fn head_of(d: &Daemon, snap: &str) -> std::path::PathBuf {
    d.home.join("snapshots").join(snap).join("memory.head")
}

/// How often the daemon logged building `snap`'s head, and how often it
/// did so alongside the snapshot's publication.
fn head_builds(d: &Daemon, snap: &str) -> (usize, usize) {
    let log = d.log();
    let line = format!("built the flattened memory of diff snapshot {snap}");
    (
        log.matches(&line).count(),
        log.matches(&format!("{line} alongside it")).count(),
    )
}

/// A branch that spawns children at once builds their head while its
/// snapshot is published (a copy of the view the source maps, with the new
/// pages laid over it), so the first child maps it without building it. At
/// depth 1 the view is the template's image, at depth 2 the parent's head.
/// The children hold every level's memory and files exactly, and nothing
/// of the build is left in the store.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_branch_with_children_builds_their_head_alongside_it() {
    let d = shared();
    let src = d.spawn();
    let want0 = hold(d, &src.id, 0);
    let r = d.json(&["branch", &src.id, "--mode", "diff", "--count", "1"]);
    assert_eq!(r["snapshot"]["kind"], "diff");
    let s1 = r["snapshot"]["id"].as_str().unwrap().to_string();
    let kid1 = Sandbox {
        d,
        id: ids(&r["children"]).remove(0),
    };
    drop(src);
    assert!(
        exists(&head_of(d, &s1)),
        "no head for the branch point {s1}"
    );
    assert_eq!(
        head_builds(d, &s1),
        (1, 1),
        "built once, alongside the snapshot, not again by the spawn"
    );
    assert_eq!(ask(d, &kid1.id, 0), want0.0, "level 0's memory");
    assert_eq!(disk_md5(d, &kid1.id, 0), want0.1, "level 0's file");
    let ram = d.json(&["inspect", &kid1.id])["memory_mib"]
        .as_u64()
        .unwrap()
        << 20;
    assert!(
        mapping_smaps(kid1.pid(), &head_of(d, &s1), ram).is_some(),
        "the child maps its branch point's head"
    );

    // Depth 2: the view to start from is the parent's head.
    let want1 = hold(d, &kid1.id, 1);
    let r = d.json(&["branch", &kid1.id, "--mode", "diff", "--count", "1"]);
    let s2 = r["snapshot"]["id"].as_str().unwrap().to_string();
    assert_eq!(r["snapshot"]["parent"].as_str(), Some(s1.as_str()));
    assert_eq!(
        r["snapshot"]["depth"].as_u64(),
        Some(2),
        "{}",
        r["snapshot"]
    );
    let kid2 = Sandbox {
        d,
        id: ids(&r["children"]).remove(0),
    };
    assert_eq!(head_builds(d, &s2), (1, 1));
    for (k, (mem, disk)) in [&want0, &want1].into_iter().enumerate() {
        assert_eq!(&ask(d, &kid2.id, k), mem, "depth 2: level {k}'s memory");
        assert_eq!(&disk_md5(d, &kid2.id, k), disk, "depth 2: level {k}'s file");
    }
    assert!(mapping_smaps(kid2.pid(), &head_of(d, &s2), ram).is_some());
    let left: Vec<String> = std::fs::read_dir(d.home.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-head-"))
        .collect();
    assert!(left.is_empty(), "left in the store: {left:?}");
}
