//! Never lose a VM (issue 30, break 1's second half).
//!
//! - A QEMU that runs on while its record says otherwise (what a daemon out
//!   of file descriptors used to do: mark a running sandbox `failed: QEMU
//!   exited`) is found at the next start and killed, and until then the
//!   host firewall still treats its interface as a sandbox's.
//! - A sandbox whose network namespace cannot be deleted at `rm` stays
//!   listed as `failed` with what is left, and the daemon finishes the
//!   removal later by itself.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;

fn host_if(id: &str) -> String {
    let tail: String = id.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    format!("fvh{}", &tail[tail.len().saturating_sub(12)..])
}

fn netns(id: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(format!("fvm-{id}"))
}

fn nft_ifaces(d: &Daemon) -> String {
    let table = format!("forkvm-{}", forkvm_daemon::config::home_hash(&d.home));
    let o = Command::new("nft")
        .args(["list", "set", "inet", &table, "ifaces"])
        .output()
        .expect("nft (scripts/setup.sh installs nftables)");
    assert!(o.status.success(), "no host table {table}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn sql(d: &Daemon, q: &str) {
    let o = Command::new("sqlite3")
        .arg(d.home.join("state.db"))
        .arg(q)
        .output()
        .expect("sqlite3 (scripts/setup.sh installs it)");
    assert!(o.status.success(), "sqlite3: {}", stderr(&o));
}

#[test]
#[ignore]
fn a_qemu_whose_record_was_lost_is_killed_at_restart_and_isolated_until_then() {
    let mut d = Daemon::start();
    let id = d.ok(&["spawn", "--network", "nat"]).trim().to_string();
    let pid = d.json(&["inspect", &id])["pid"].as_u64().expect("pid") as u32;
    let iface = host_if(&id);
    assert!(nft_ifaces(&d).contains(&iface));

    // The daemon dies; its QEMU runs on, and its interface stays in the set
    // that isolates sandboxes from the host while no daemon runs.
    d.stop(libc::SIGKILL);
    assert!(alive(pid));
    assert!(
        nft_ifaces(&d).contains(&iface),
        "the firewall forgot the sandbox while no daemon ran"
    );
    // What a daemon out of descriptors did: record the sandbox as failed
    // while its QEMU kept running.
    sql(
        &d,
        &format!(
            "UPDATE sandboxes SET state='failed', pid=NULL, failure='QEMU exited (simulated)' WHERE id='{id}'"
        ),
    );
    d.spawn_process();
    // Found before the daemon served its first request.
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "QEMU {pid} of {id} still runs unmanaged after the restart\n{}",
        d.log()
    );
    assert!(d.log().contains("running unmanaged"), "{}", d.log());
    // Removing it now leaves nothing: namespace, interface, set element.
    d.ok(&["rm", &id]);
    assert!(!netns(&id).exists());
    assert!(!std::path::Path::new("/sys/class/net").join(&iface).exists());
    assert!(!nft_ifaces(&d).contains(&iface));
}

#[test]
#[ignore]
fn a_namespace_that_cannot_be_deleted_keeps_the_sandbox_listed_until_it_is() {
    let d = Daemon::start();
    let id = d.ok(&["spawn", "--network", "nat"]).trim().to_string();
    let pid = d.json(&["inspect", &id])["pid"].as_u64().expect("pid") as u32;
    let ns = netns(&id);
    assert!(ns.exists());
    // Two more mounts stacked on the namespace file: each `ip netns del`
    // detaches one and then cannot unlink a file that is still a mount
    // point (EBUSY), so deletion fails twice before it succeeds.
    for _ in 0..2 {
        let o = Command::new("mount")
            .args(["--bind"])
            .arg(&ns)
            .arg(&ns)
            .output()
            .unwrap();
        assert!(o.status.success(), "mount --bind: {}", stderr(&o));
    }
    let o = d.run(&["rm", &id]);
    assert!(
        !o.status.success(),
        "rm reported success with the namespace left"
    );
    let err = stderr(&o);
    assert!(
        err.contains("could not be deleted") && err.contains("retries"),
        "{err}"
    );
    // The VM is gone; the record is not, and says what is left.
    assert!(!alive(pid));
    let v = d.json(&["inspect", &id]);
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["failure"].as_str().unwrap_or("").contains("namespace"),
        "{v}"
    );
    // The daemon retries (every 5 s) until the namespace is gone, then
    // forgets the sandbox.
    assert!(
        wait_until(Duration::from_secs(40), || !d
            .run(&["inspect", &id])
            .status
            .success()),
        "the sandbox was never removed\n{}",
        d.log()
    );
    assert!(!ns.exists(), "its namespace is still there");
    assert!(!d.home.join("sandboxes").join(&id).exists());
    assert!(d.log().contains(&format!("removal of {id} finished")));
}
