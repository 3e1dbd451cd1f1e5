//! A full home (issue 30, "A full disk and a crash during a snapshot",
//! points 2–4), on a loop-mounted ext4 of 1,200 MiB with a 256 MiB reserve.
//!
//! A guest fills the home by writing to its own disk. The daemon must stop
//! it before the home is full and show it `suspended` with the reason;
//! calls into it must answer at once with 507; every write path must be
//! refused with 507 and leave nothing behind; and once space is freed the
//! sandbox must resume by itself and finish its write.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn free_mib(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes into the struct on this stack; the path is
    // NUL-terminated.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    assert_eq!(r, 0);
    (s.f_bavail as u64 * s.f_frsize as u64) >> 20
}

fn staging_left(home: &std::path::Path) -> Vec<String> {
    let mut left = Vec::new();
    for dir in ["snapshots", "images"] {
        if let Ok(rd) = std::fs::read_dir(home.join(dir)) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(".tmp") || n.starts_with(".new") {
                    left.push(format!("{dir}/{n}"));
                }
            }
        }
    }
    left
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_guest_that_fills_the_home_is_suspended_and_resumes_when_space_returns() {
    let fs = SmallFs::new(1200);
    let home = fs.mnt.join("home");
    let d = Daemon::start_in_env(&home, &[("FORKVM_DISK_RESERVE_MIB", "256")]);
    let id = d.ok(&["spawn", "--no-template"]).trim().to_string();
    let sb = Sandbox {
        d: &d,
        id: id.clone(),
    };

    // Leave the reserve and 150 MiB more, then let the guest write 400 MB
    // of data that does not compress to zeros.
    let ballast = fs.mnt.join("ballast");
    let keep = 256 + 150;
    let take = free_mib(&fs.mnt).saturating_sub(keep);
    let o = std::process::Command::new("fallocate")
        .args(["-l", &format!("{take}M")])
        .arg(&ballast)
        .output()
        .unwrap();
    assert!(o.status.success(), "fallocate: {}", stderr(&o));
    let writer =
        "nohup sh -c 'yes forkvm-disk-pressure-0123456789 | head -c 400000000 > /root/fill; \
                  sync; echo done > /root/fill.done' > /dev/null 2>&1 &";
    sh(&d, &id, writer);

    let t = Instant::now();
    let mut v = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(300), || {
            v = d.json(&["inspect", &id]);
            !v["suspended"].is_null()
        }),
        "the guest was never suspended (free {} MiB)\n{}",
        free_mib(&fs.mnt),
        d.log()
    );
    eprintln!(
        "suspended after {:?}: {} (free {} MiB)",
        t.elapsed(),
        v["suspended"],
        free_mib(&fs.mnt)
    );
    assert_eq!(v["state"], "running", "{v}");
    assert!(
        v["suspended"].as_str().unwrap().contains("disk full"),
        "{v}"
    );
    // Stopped before the home was full: the daemon and its database keep
    // room (the floor is half the reserve; the guest's last writes in
    // flight may take some of it).
    let free = free_mib(&fs.mnt);
    assert!(
        free >= 32,
        "the home is down to {free} MiB: the guest was stopped too late"
    );
    assert!(d.log().contains(&format!("sandbox {id} suspended")));
    assert!(!d.ok(&["ps"]).contains("running"), "{}", d.ok(&["ps"]));

    // Calls into it answer at once with the reason.
    let a = Instant::now();
    let o = d.run(&["exec", "--timeout", "60", &id, "--", "true"]);
    assert!(
        a.elapsed() < Duration::from_secs(5),
        "exec took {:?}",
        a.elapsed()
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("suspended") && err.contains("HTTP 507"),
        "{err}"
    );

    // Every write path is refused with 507 before it writes anything.
    let busybox_tar = fs.mnt.join("..").join("bb.tar");
    let o = std::process::Command::new("tar")
        .args(["-cf"])
        .arg(&busybox_tar)
        .args(["-C", "/", "bin/busybox"])
        .output()
        .unwrap();
    assert!(o.status.success(), "tar: {}", stderr(&o));
    let bb = busybox_tar.to_str().unwrap();
    for args in [
        vec!["snapshot", id.as_str()],
        vec!["pause", id.as_str()],
        vec!["spawn", "--no-template"],
        vec!["image", "import", bb, "--name", "bb-full"],
    ] {
        let o = d.run(&args);
        assert!(!o.status.success(), "{args:?} succeeded on a full home");
        let err = stderr(&o);
        assert!(err.contains("HTTP 507"), "{args:?}: {err}");
    }
    assert!(staging_left(&home).is_empty(), "{:?}", staging_left(&home));
    assert!(d.json(&["snapshot", "ls"])["snapshots"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(d.json(&["ps"])["sandboxes"].as_array().unwrap().len(), 1);

    // Space returns: it resumes by itself and finishes its write.
    std::fs::remove_file(&ballast).unwrap();
    resumes_and_finishes(&d, &sb, 400_000_000);
}

/// Once space is back: the sandbox resumes by itself (and says so in the
/// log, written with space), and the guest's write of `bytes` completes.
fn resumes_and_finishes(d: &Daemon, sb: &Sandbox, bytes: u64) {
    let id = &sb.id;
    assert!(
        wait_until(Duration::from_secs(30), || d.json(&["inspect", id])
            ["suspended"]
            .is_null()),
        "not resumed after space was freed\n{}",
        d.log()
    );
    assert!(
        wait_until(Duration::from_secs(300), || sb
            .exec(&["cat", "/root/fill.done"])
            .status
            .success()),
        "the guest's write never finished"
    );
    let o = sb.exec(&["sh", "-c", "wc -c < /root/fill"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), bytes.to_string());
    assert!(d.log().contains(&format!("sandbox {id} resumed")));
}

/// Fills what is left of the home, to the last block, with ordinary data.
fn fill_to_the_last_block(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let big = dir.join("ballast-big");
    let take = free_mib(dir).saturating_sub(8);
    let o = std::process::Command::new("fallocate")
        .args(["-l", &format!("{take}M")])
        .arg(&big)
        .output()
        .unwrap();
    assert!(o.status.success(), "fallocate: {}", stderr(&o));
    // The rest by writing, until the filesystem says ENOSPC.
    let small = dir.join("ballast-rest");
    let mut f = std::fs::File::create(&small).unwrap();
    let block = vec![0x5au8; 64 * 1024];
    loop {
        use std::io::Write;
        match f.write_all(&block) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the home: {e}"),
        }
    }
    drop(f);
    vec![big, small]
}

/// The other way a guest stops on a full home: the home reaches 100 % by
/// something else (here a host file), so the guest's next write fails and
/// QEMU stops it with `io-error`. It must show that reason, answer at once,
/// keep the daemon serving on a home with no free block, and go on by
/// itself, with its write intact, once space returns.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_guest_stopped_by_an_io_error_shows_why_and_goes_on_when_space_returns() {
    let fs = SmallFs::new(1200);
    let home = fs.mnt.join("home");
    let d = Daemon::start_in_env(&home, &[("FORKVM_DISK_RESERVE_MIB", "256")]);
    let id = d.ok(&["spawn", "--no-template"]).trim().to_string();
    let sb = Sandbox {
        d: &d,
        id: id.clone(),
    };
    let ballast = fill_to_the_last_block(&fs.mnt);
    assert_eq!(free_mib(&fs.mnt), 0);

    // Start the writer through the agent (no host disk needed), 200 MB
    // that the qcow2 must allocate. With no free block left, the guest can
    // be stopped by the I/O error of any write, the agent's own included,
    // before this exec's answer leaves it. Either way the exec answers
    // well before its timeout: done, or 507 once the guest is seen stopped.
    let writer = "nohup sh -c 'yes forkvm-io-error-0123456789 | head -c 200000000 > /root/fill; \
                  sync; echo done > /root/fill.done' > /dev/null 2>&1 &";
    let a = Instant::now();
    let o = d.run(&["exec", "--timeout", "30", &id, "--", "sh", "-c", writer]);
    assert!(
        o.status.success() || stderr(&o).contains("HTTP 507"),
        "{}",
        stderr(&o)
    );
    assert!(
        a.elapsed() < Duration::from_secs(20),
        "the writer's exec took {:?}: a call in flight when the guest stopped waited for its timeout",
        a.elapsed()
    );
    let mut v = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(300), || {
            v = d.json(&["inspect", &id]);
            !v["suspended"].is_null()
        }),
        "the guest was never shown suspended\n{}",
        d.log()
    );
    let why = v["suspended"].as_str().unwrap().to_string();
    assert!(why.contains("a write failed"), "{v}");
    let a = Instant::now();
    let o = d.run(&["exec", "--timeout", "60", &id, "--", "true"]);
    assert!(
        a.elapsed() < Duration::from_secs(5),
        "exec took {:?}",
        a.elapsed()
    );
    assert!(stderr(&o).contains("HTTP 507"), "{}", stderr(&o));
    // The daemon still answers on a home with no free block.
    assert_eq!(d.json(&["ps"])["sandboxes"].as_array().unwrap().len(), 1);

    for b in &ballast {
        std::fs::remove_file(b).unwrap();
    }
    // (The line saying it was suspended went to a log on the full home, so
    // it may be lost; `why` was read from the API instead.)
    eprintln!("suspended: {why}");
    resumes_and_finishes(&d, &sb, 200_000_000);
}

/// A `copy` volume is copied as it goes, so its size is known only then:
/// a copy that would take the home under its reserve must stop there with
/// 507, remove what it wrote, and leave no sandbox and no snapshot.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_volume_copy_that_would_cross_the_reserve_is_refused_and_leaves_nothing() {
    let fs = SmallFs::new(2000);
    let home = fs.mnt.join("home");
    let d = Daemon::start_in_env(&home, &[("FORKVM_DISK_RESERVE_MIB", "256")]);
    // The volume lives off the home (on /tmp, which copies byte by byte
    // unless it reflinks; then the copy costs nothing and is allowed).
    let vol = tempfile::Builder::new()
        .prefix("fvbudget-")
        .tempdir_in("/tmp")
        .unwrap();
    let o = std::process::Command::new("fallocate")
        .args(["-l", "300M"])
        .arg(vol.path().join("big"))
        .output()
        .unwrap();
    assert!(o.status.success(), "fallocate: {}", stderr(&o));
    let id = d
        .ok(&[
            "spawn",
            "--no-template",
            "--volume",
            &format!("{}:/v:copy", vol.path().display()),
        ])
        .trim()
        .to_string();
    let _sb = Sandbox {
        d: &d,
        id: id.clone(),
    };
    d.ok(&["snapshot", &id, "--tag", "withvol"]);

    // 100 MiB above the reserve: less than the 300 MB the copy needs.
    let ballast = fs.mnt.join("ballast");
    let take = free_mib(&fs.mnt).saturating_sub(256 + 100);
    let o = std::process::Command::new("fallocate")
        .args(["-l", &format!("{take}M")])
        .arg(&ballast)
        .output()
        .unwrap();
    assert!(o.status.success(), "fallocate: {}", stderr(&o));
    let before = free_mib(&fs.mnt);

    let o = d.run(&["spawn", "--snapshot", "withvol"]);
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "the clone's volume copy crossed the reserve"
    );
    assert!(
        err.contains("HTTP 507") && err.contains("volume copy"),
        "{err}"
    );
    assert_eq!(d.json(&["ps"])["sandboxes"].as_array().unwrap().len(), 1);
    let kids: Vec<_> = std::fs::read_dir(home.join("volume-data"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        kids,
        vec![id.clone()],
        "a failed clone left its volume data"
    );
    assert!(
        free_mib(&fs.mnt) + 8 >= before,
        "the failed copy kept its space: {before} MiB free before, {} after",
        free_mib(&fs.mnt)
    );
    assert!(d.log().contains("volume copy"), "not logged");
}
