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
    assert!(
        wait_until(Duration::from_secs(30), || d.json(&["inspect", &id])
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
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "400000000");
    assert!(d.log().contains(&format!("sandbox {id} resumed")));
}
