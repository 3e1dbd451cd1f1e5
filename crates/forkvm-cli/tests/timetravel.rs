//! End-to-end tests of time travel: checkpoints with retention, the
//! timeline, and rewind, against a real daemon and real microVMs. Run with
//! `make test`.

mod common;

use std::time::Duration;

use common::*;

/// A Python process holding 32 MiB. `/tmp/go` holding N rewrites an 8 MiB
/// region chosen by N with bytes drawn from N; `/tmp/req` asks it for its
/// step and the hash of all it holds, now (answered in `/tmp/ans`).
const HOLDER: &str = r#"
import hashlib, os, random, time
buf = bytearray(32 << 20)
step = 0
def answer(path):
    open(path + '.tmp', 'w').write(f"{step} {hashlib.sha256(buf).hexdigest()}")
    os.rename(path + '.tmp', path)
while True:
    if os.path.exists('/tmp/go'):
        n = int(open('/tmp/go').read())
        os.remove('/tmp/go')
        off = (n * (4 << 20)) % (len(buf) - (8 << 20))
        buf[off:off + (8 << 20)] = random.Random(n).randbytes(8 << 20)
        step = n
        answer('/tmp/done')
    if os.path.exists('/tmp/req'):
        os.remove('/tmp/req')
        answer('/tmp/ans')
    time.sleep(0.05)
"#;

/// What the holder holds now: its step and the hash of its memory.
fn memory(d: &Daemon, id: &str) -> String {
    sh(d, id, "rm -f /tmp/ans; touch /tmp/req");
    let mut seen = String::new();
    assert!(
        wait_until(Duration::from_secs(120), || {
            seen = try_sh(d, id, "cat /tmp/ans 2>/dev/null");
            !seen.is_empty()
        }),
        "the holder in {id} did not answer: {}",
        try_sh(d, id, "ps -eo pid,stat,args; ls -l /tmp")
    );
    seen
}

/// The work tree: every file's name and hash.
fn disk(d: &Daemon, id: &str) -> String {
    sh(d, id, "cd /root/work && sha256sum $(ls | sort)")
}

/// One step of the agent: files written, appended and deleted, memory
/// changed; then the checkpoint.
struct Step {
    cp: String,
    memory: String,
    disk: String,
}

fn step(d: &Daemon, id: &str, n: u32, tag: Option<&str>) -> (Step, serde_json::Value) {
    sh(
        d,
        id,
        &format!(
            "mkdir -p /root/work && echo step {n} > /root/work/step-{n}.txt && \
             echo {n} >> /root/work/log && rm -f /root/work/step-{}.txt && \
             chmod 0{} /root/work/log && printf {n} > /tmp/go",
            n.saturating_sub(2),
            if n % 2 == 0 { 600 } else { 644 }
        ),
    );
    let mut done = String::new();
    assert!(wait_until(Duration::from_secs(120), || {
        done = try_sh(d, id, "cat /tmp/done 2>/dev/null");
        done.starts_with(&format!("{n} "))
    }));
    let disk = disk(d, id);
    let mut args = vec!["checkpoint", id];
    if let Some(t) = tag {
        args.extend(["--tag", t]);
    }
    let v = d.json(&args);
    assert_eq!(v["seq"], n, "{v}");
    let s = Step {
        cp: v["id"].as_str().unwrap().to_string(),
        memory: done,
        disk,
    };
    (s, v)
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn checkpoints_retention_and_rewind() {
    let d = shared();
    let sb = d.spawn();
    let id = sb.id.clone();
    let started_from = d.json(&["inspect", &id])["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    d.ok(&["timeout", &id, "900"]);
    start_python(d, &id, "/tmp/holder.py", "/dev/null", HOLDER);
    // Bad input is refused and changes nothing.
    for bad in [
        vec!["checkpoint", &id, "--keep-last", "0", "--policy-only"],
        vec!["checkpoint", "sb-nosuch"],
        vec!["rewind", &id, "sn-nosuch"],
    ] {
        let o = d.run(&bad);
        assert!(!o.status.success(), "{bad:?} was accepted");
    }
    d.ok(&[
        "checkpoint",
        &id,
        "--keep-last",
        "2",
        "--keep-every",
        "3",
        "--policy-only",
    ]);

    let mut steps = Vec::new();
    for n in 1..=6 {
        let tag = (n == 2).then_some("tt-two");
        let (s, v) = step(d, &id, n, tag);
        let pause = v["pause_ms"].as_f64().unwrap();
        assert!(pause > 0.0, "{v}");
        eprintln!(
            "step {n}: checkpoint {} paused {pause:.1} ms, {} bytes",
            s.cp, v["bytes"]
        );
        steps.push(s);
    }
    // A tag names one snapshot only.
    assert!(!d
        .run(&["checkpoint", &id, "--tag", "tt-two"])
        .status
        .success());

    // Retention: the last 2 (5, 6), every 3rd (3, 6) and the tagged (2).
    let t = d.json(&["timeline", &id]);
    let seqs: Vec<u64> = t["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        [2, 3, 5, 6],
        "{t}\n{}",
        d.log()
            .lines()
            .filter(|l| l.contains("checkpoint") || l.contains("retention"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let cp = |n: usize| steps[n - 1].cp.clone();
    // 1 and 4 were spliced out: each kept checkpoint builds on the kept one
    // before it, the first on what the sandbox started from.
    let parents: Vec<String> = t["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["parent"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(parents, [started_from.clone(), cp(2), cp(3), cp(5)], "{t}");
    for gone in [cp(1), cp(4)] {
        assert!(!d.run(&["snapshot", "inspect", &gone]).status.success());
        // Its disk layer was merged into the next one's too: no header
        // names it, and it is collected.
        let dir = d.home.join("snapshots").join(&gone);
        assert!(
            wait_until(Duration::from_secs(30), || !dir.exists()),
            "{} stays: {:?}; named by {}",
            dir.display(),
            std::fs::read_dir(&dir).map(|r| r.flatten().map(|e| e.file_name()).collect::<Vec<_>>()),
            String::from_utf8_lossy(
                &std::process::Command::new("grep")
                    .args(["-rl", "--include=*.qcow2", &gone])
                    .arg(&d.home)
                    .output()
                    .unwrap()
                    .stdout
            )
        );
    }
    // Each checkpoint stores what changed since the one before: an 8 MiB
    // region (and the guest's own churn), not the 24 MiB and more the
    // holder changed since the sandbox started.
    let inspect = |s: &str| d.json(&["snapshot", "inspect", s]);
    let diff_of = |s: &str| inspect(s)["sizes"]["memory_diff_bytes"].as_u64().unwrap();
    // A snapshot of the same instant stores what changed since the
    // sandbox started, over the snapshot it started from.
    let whole = d.json(&["snapshot", &id])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (one, all) = (diff_of(&cp(6)), diff_of(&whole));
    eprintln!(
        "the last checkpoint stores {:.1} MiB of memory, a snapshot of the same state {:.1} MiB; \
         the one with cp 4 spliced in {:.1} MiB",
        one as f64 / 1048576.0,
        all as f64 / 1048576.0,
        diff_of(&cp(5)) as f64 / 1048576.0
    );
    assert!(one * 2 < all, "{}\n{}", inspect(&cp(6)), inspect(&whole));
    // So does its disk layer: the blocks written since checkpoint 5 (the
    // stream folds everything since the start into the running top, which
    // a snapshot freezes whole).
    let disk_of = |s: &str| inspect(s)["sizes"]["disk_bytes"].as_u64().unwrap();
    let whole_disk = disk_of(&whole);
    // Every checkpoint's layer was written again over its parent's
    // (snapshot::freeze::thin). Its size is not checked one by one: the
    // blocks of a step reach the disk at ext4's writeback, which under load
    // can fall after the next checkpoint, so one layer may hold two steps.
    let thin = |c: &str| {
        let one = disk_of(c);
        eprintln!(
            "checkpoint {c}'s disk layer holds {} KiB, a snapshot's of step 6 {} KiB",
            one >> 10,
            whole_disk >> 10
        );
        let log = d.log();
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("checkpoint {c} of sandbox"))
                    && l.contains("disk layer thinned")),
            "{}\n{}",
            inspect(c),
            log.lines()
                .filter(|l| l.contains("disk layer") || l.contains("write record"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    };
    for n in [2, 3, 5, 6] {
        thin(&cp(n));
    }
    let kept: u64 = [2, 3, 5, 6].iter().map(|&n| disk_of(&cp(n))).sum();
    eprintln!("the 4 kept checkpoints' disk layers: {} KiB", kept >> 10);
    // Whole layers would each be about a snapshot's (4x); thin ones
    // partition the writes, plus the metadata every layer rewrites.
    assert!(
        kept < 3 * whole_disk,
        "{kept} bytes in 4 layers, {whole_disk} in a snapshot's"
    );
    d.ok(&["snapshot", "rm", &whole]);

    // Every kept checkpoint still restores exactly, spliced ones included.
    for n in [2usize, 3, 5, 6] {
        let b = d.json(&["spawn", "--snapshot", &cp(n), "--count", "1"]);
        let kid = b["sandboxes"][0]["id"].as_str().unwrap().to_string();
        let _g = Sandbox { d, id: kid.clone() };
        assert_eq!(memory(d, &kid), steps[n - 1].memory, "checkpoint {n}");
        assert_eq!(disk(d, &kid), steps[n - 1].disk, "checkpoint {n}");
    }

    // Rewind to step 3, keeping the present.
    let before = d.json(&["inspect", &id]);
    let r = d.json(&["rewind", &id, &cp(3), "--checkpoint-first"]);
    assert_eq!(r["to"], cp(3).as_str(), "{r}");
    let undo = r["undo"]["id"].as_str().unwrap().to_string();
    // The snapshot taken since checkpoint 6 carried the record over.
    thin(&undo);
    eprintln!("rewind with a checkpoint first: {} ms", r["rewind_ms"]);
    let after = d.json(&["inspect", &id]);
    assert_eq!(after["state"], "running");
    assert_eq!(
        after["network"], before["network"],
        "the network identity changed"
    );
    assert_eq!(after["metadata"], before["metadata"]);
    assert_eq!(after["lifetime"]["timeout"], 900, "{after}");
    assert_eq!(memory(d, &id), steps[2].memory);
    assert_eq!(disk(d, &id), steps[2].disk);
    // The next checkpoint builds on what it runs from now.
    let c7 = d.json(&["checkpoint", &id]);
    assert_eq!(c7["parent"], cp(3).as_str(), "{c7}");
    // The record of writes restarts with the restore: thin again.
    thin(c7["id"].as_str().unwrap());

    // The rewind is undone by rewinding to the checkpoint it took first.
    d.json(&["rewind", &id, &undo]);
    assert_eq!(memory(d, &id), steps[5].memory);
    assert_eq!(disk(d, &id), steps[5].disk);

    // A step whose changes a pause saved, and a checkpoint after the
    // resume that writes nothing new: the checkpoint still holds them (the
    // sandbox now maps its pause's state, not the previous checkpoint's).
    sh(d, &id, "printf 9 > /tmp/go");
    let mut done = String::new();
    assert!(wait_until(Duration::from_secs(120), || {
        done = try_sh(d, &id, "cat /tmp/done 2>/dev/null");
        done.starts_with("9 ")
    }));
    let disk9 = disk(d, &id);
    d.json(&["pause", &id]);
    d.json(&["resume", &id]);
    let c9 = d.json(&["checkpoint", &id])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = d.json(&["spawn", "--snapshot", &c9, "--count", "1"]);
    let kid = b["sandboxes"][0]["id"].as_str().unwrap().to_string();
    let _g = Sandbox { d, id: kid.clone() };
    assert_eq!(
        memory(d, &kid),
        done,
        "a checkpoint after a pause lost its memory"
    );
    assert_eq!(disk(d, &kid), disk9);

    // A snapshot of another sandbox is not a point to rewind to.
    let other = d.spawn();
    let theirs = d.json(&["snapshot", &other.id]);
    let o = d.run(&["rewind", &id, theirs["id"].as_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("lineage"), "{}", stderr(&o));
    assert_eq!(d.json(&["inspect", &id])["state"], "running");
}

/// The tree of the repository this test is built from (its tracked files
/// under crates/ and docs/), as a tar.
fn repository_tar() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("forkvm-repo-{}.tar", std::process::id()));
    let st = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["archive", "--format=tar", "-o"])
        .arg(&out)
        .args(["HEAD", "crates", "docs"])
        .status()
        .expect("git is needed to pack the repository tree (scripts/setup.sh installs it)");
    assert!(st.success(), "git archive failed");
    out
}

fn changes(v: &serde_json::Value) -> Vec<(String, String)> {
    v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["change"].as_str().unwrap().to_string(),
                c["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn diff_and_merge_on_a_repository_tree() {
    let d = shared();
    let src = d.spawn();
    let tar = repository_tar();
    d.ok(&["fs", "upload", &src.id, "/root/repo", tar.to_str().unwrap()]);
    let _ = std::fs::remove_file(&tar);
    sh(
        d,
        &src.id,
        "cd /root/repo && ln -s crates/forkvm-api api-link && mkdir -p olddir/sub && \
         echo old > olddir/sub/f && find . -type f | wc -l > /root/files",
    );
    let b = d.json(&["branch", &src.id, "--count", "3"]);
    let point = b["snapshot"]["id"].as_str().unwrap().to_string();
    let kids = ids(&b["children"]);
    let _guards: Vec<Sandbox> = kids.iter().map(|k| Sandbox { d, id: k.clone() }).collect();
    let (win, clash, third) = (&kids[0], &kids[1], &kids[2]);
    // The winner edits, adds, deletes, chmods, re-points a symlink and
    // deletes a directory.
    sh(
        d,
        win,
        "cd /root/repo && echo '// merged from the winner' >> crates/forkvm-api/src/lib.rs && \
         mkdir -p newdir/deep && echo new > newdir/deep/n.txt && echo top > added.txt && \
         rm docs/gc.md && chmod 0755 docs/cli.md && ln -sfn crates/forkvm-store api-link && \
         rm -rf olddir && ln -s added.txt added-link",
    );
    // The other edits the same file at its top.
    sh(
        d,
        clash,
        "cd /root/repo && sed -i '1i // first line from the other child' crates/forkvm-api/src/lib.rs",
    );

    // The third adds, deletes and chmods, and is only compared.
    sh(
        d,
        third,
        "cd /root/repo && echo third > third.txt && rm -r crates/forkvm-mcp && chmod 0600 docs/api.md",
    );
    let v3 = d.json(&["diff", &src.id, third, "--path", "/root/repo"]);
    let got3 = changes(&v3);
    assert!(
        got3.contains(&("added".into(), "/root/repo/third.txt".into())),
        "{got3:?}"
    );
    assert!(
        got3.contains(&("mode".into(), "/root/repo/docs/api.md".into())),
        "{got3:?}"
    );
    assert!(
        got3.contains(&(
            "deleted".into(),
            "/root/repo/crates/forkvm-mcp/src/lib.rs".into()
        )),
        "{got3:?}"
    );
    assert_eq!(v3["stats"]["added"], 1, "{v3}");

    let v = d.json(&["diff", &src.id, win, "--path", "/root/repo", "--text"]);
    eprintln!(
        "diff of {} entries: {} ms, {} files read",
        v["entries"], v["diff_ms"], v["contents_read"]
    );
    let got = changes(&v);
    let expect = [
        ("added", "/root/repo/added-link"),
        ("added", "/root/repo/added.txt"),
        ("modified", "/root/repo/api-link"),
        ("mode", "/root/repo/docs/cli.md"),
        ("deleted", "/root/repo/docs/gc.md"),
        ("modified", "/root/repo/crates/forkvm-api/src/lib.rs"),
        ("added", "/root/repo/newdir"),
        ("added", "/root/repo/newdir/deep"),
        ("added", "/root/repo/newdir/deep/n.txt"),
        ("deleted", "/root/repo/olddir"),
        ("deleted", "/root/repo/olddir/sub"),
        ("deleted", "/root/repo/olddir/sub/f"),
    ];
    for (k, p) in expect {
        assert!(
            got.contains(&(k.to_string(), p.to_string())),
            "{k} {p} missing from {got:?}"
        );
    }
    // Directories whose entries changed are not changes themselves.
    assert_eq!(got.len(), expect.len(), "{got:?}");
    let lib = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "/root/repo/crates/forkvm-api/src/lib.rs")
        .unwrap();
    assert!(
        lib["patch"]
            .as_str()
            .unwrap()
            .contains("+// merged from the winner"),
        "{lib}"
    );
    // The branch point (a snapshot, read through a clone) differs from the
    // winner the same way.
    let v2 = d.json(&["diff", &point, win, "--path", "/root/repo"]);
    assert_eq!(changes(&v2), got);
    // A file as the path, and a directory only one side has.
    let one = d.json(&["diff", &src.id, win, "--path", "/root/repo/added.txt"]);
    assert_eq!(
        changes(&one),
        [("added".to_string(), "/root/repo/added.txt".to_string())]
    );
    let newdir = d.json(&["diff", &src.id, win, "--path", "/root/repo/newdir"]);
    assert_eq!(newdir["stats"]["added"], 3, "{newdir}");
    // Bad input.
    assert!(!d
        .run(&["diff", &src.id, win, "--path", "rel"])
        .status
        .success());
    assert!(!d.run(&["diff", &src.id, "sb-nosuch"]).status.success());

    // The winner merges into the source: exact bytes, modes, links. It was
    // paused and resumed first, so it runs from a snapshot of its own: the
    // merge still starts from its branch point.
    d.json(&["pause", win]);
    d.json(&["resume", win]);
    let m = d.json(&["merge", win, "--into", &src.id, "--path", "/root/repo"]);
    eprintln!(
        "merge of {} paths: {} ms",
        m["applied"].as_array().unwrap().len(),
        m["merge_ms"]
    );
    assert_eq!(m["base"], point.as_str());
    let after = d.json(&["diff", &src.id, win, "--path", "/root/repo"]);
    assert!(changes(&after).is_empty(), "{after}");
    let sums = "cd /root/repo && sha256sum crates/forkvm-api/src/lib.rs newdir/deep/n.txt && \
                stat -c '%a %N' docs/cli.md api-link added-link && ls olddir docs/gc.md 2>&1 | wc -l";
    assert_eq!(sh(d, &src.id, sums), sh(d, win, sums));

    // The other child conflicts on lib.rs: refused, nothing changed.
    let before = sh(
        d,
        &src.id,
        "sha256sum /root/repo/crates/forkvm-api/src/lib.rs",
    );
    let o = d.run(&["merge", clash, "--into", &src.id, "--path", "/root/repo"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("lib.rs"), "{}", stderr(&o));
    assert_eq!(
        sh(
            d,
            &src.id,
            "sha256sum /root/repo/crates/forkvm-api/src/lib.rs"
        ),
        before
    );
    let dry = d.json(&[
        "merge",
        clash,
        "--into",
        &src.id,
        "--path",
        "/root/repo",
        "--dry-run",
    ]);
    assert_eq!(
        dry["conflicts"][0]["path"], "/root/repo/crates/forkvm-api/src/lib.rs",
        "{dry}"
    );
    // The child's deletions of what the source now has are not its changes:
    // only lib.rs conflicts. A line merge settles it, keeping both edits.
    let m = d.json(&[
        "merge",
        clash,
        "--into",
        &src.id,
        "--path",
        "/root/repo",
        "--text",
    ]);
    assert_eq!(m["settled"].as_array().unwrap().len(), 1, "{m}");
    let lib = sh(d, &src.id, "cat /root/repo/crates/forkvm-api/src/lib.rs");
    assert!(
        lib.starts_with("// first line from the other child\n"),
        "{lib}"
    );
    assert!(lib.ends_with("// merged from the winner\n"), "{lib}");
    // Merging into itself, or from a sandbox without a branch point.
    assert!(!d.run(&["merge", win, "--into", win]).status.success());
}
