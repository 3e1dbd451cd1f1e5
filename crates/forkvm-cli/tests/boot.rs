//! Boot reliability and failure reporting (issue 11): a guest that dies in
//! boot gives an error with its panic line and leaves nothing behind, and
//! every JSON operation refuses a body that is not a JSON object.
//! Run with `make test` (which passes `--include-ignored`).

mod common;
mod procs;

use std::path::Path;

use bytes::Bytes;
use common::*;
use forkvm_api::Method;

/// Every (method, path) of the checked-in OpenAPI document that takes a JSON
/// request body, with its path parameters filled in.
fn json_operations(id: &str, snap: &str) -> Vec<(Method, String)> {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&doc_path).expect("docs/openapi.json"))
            .expect("OpenAPI JSON");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if op["requestBody"]["content"]["application/json"].is_null() {
                continue;
            }
            let filled = if path.starts_with("/v1/snapshots/") {
                path.replace("{id}", snap)
            } else {
                path.replace("{id}", id)
            };
            // Processes (a pid or a tag) and watchers that need not exist.
            let filled = filled.replace("{process}", "1").replace("{watcher}", "w1");
            assert!(!filled.contains('{'), "unfilled parameter in {filled}");
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            ops.push((m, filled));
        }
    }
    ops
}

#[tokio::test]
#[ignore = "runs a real daemon: run with `make test`"]
async fn every_json_operation_refuses_bodies_that_are_not_objects() {
    // Its own daemon, so "nothing was created" sees only this test. The ids
    // need not exist: the body is checked before the id is looked up.
    let d = Daemon::start();
    let c = d.client();
    let ops = json_operations("sb-000000000000", "sn-000000000000");
    for op in ["/v1/sandboxes", "/exec", "/branch", "/pool"] {
        assert!(
            ops.iter().any(|(_, p)| p.ends_with(op)),
            "the OpenAPI document lost the JSON operation {op}: {ops:?}"
        );
    }
    for (m, p) in &ops {
        for (body, kind) in [
            ("[null, null]", "an array"),
            ("\"default\"", "a string"),
            ("42", "a number"),
        ] {
            let r = c
                .raw(
                    m.clone(),
                    p,
                    Some((Bytes::from_static(body.as_bytes()), "application/json")),
                )
                .await
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON error");
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert_eq!(r.status.as_u16(), 400, "{m} {p} with {body}: {msg}");
            assert_eq!(v["error"]["code"], "invalid_request", "{m} {p}");
            assert!(
                msg.contains("must be a JSON object") && msg.contains(kind),
                "{m} {p} with {body}: {msg}"
            );
        }
    }
    assert!(c.list_sandboxes().await.unwrap().sandboxes.is_empty());
    assert!(c.list_snapshots().await.unwrap().snapshots.is_empty());
}

/// A guest kernel that panics in boot (here: an initramfs of garbage, so no
/// init and no root) makes the spawn fail with the panic line and the
/// console tail, the daemon logs it with the sandbox id, and nothing stays.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_guest_that_panics_in_boot_says_so_and_leaves_nothing() {
    require_vm_prereqs();
    let dir = tempfile::Builder::new()
        .prefix("fvt-boot-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let home = dir.path().join("h");
    let guest = home.join("guest");
    std::fs::create_dir_all(&guest).unwrap();
    for e in std::fs::read_dir(artifacts().join("guest"))
        .unwrap()
        .flatten()
    {
        if e.file_name() != "initramfs.img" {
            std::os::unix::fs::symlink(e.path(), guest.join(e.file_name())).unwrap();
        }
    }
    // Not a cpio archive in any compression the kernel knows.
    let garbage: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(guest.join("initramfs.img"), garbage).unwrap();
    let d = Daemon::start_in(&home);

    let o = d.run(&["spawn", "--no-template"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "the spawn must fail: {err}");
    assert!(
        err.contains("the VM died while booting: guest kernel panic:")
            && err.contains("Kernel panic - not syncing"),
        "the error must carry the guest's panic line: {err}"
    );
    assert!(
        err.contains("QEMU exited with status"),
        "and how QEMU ended: {err}"
    );
    assert!(
        err.contains("Last console lines:") && err.contains("Initramfs unpacking failed"),
        "and the console tail, which shows the cause: {err}"
    );

    // The daemon logged it at warn with the sandbox id.
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("spawn of sandbox sb-"))
        .unwrap_or_else(|| panic!("no warn line for the failed spawn in:\n{log}"));
    assert!(line.contains("(cold boot) failed"), "{line}");
    let id = line
        .split("spawn of sandbox ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_string();

    // Nothing is left: no record, no files, no process, no network.
    let ps = d.json(&["ps"]);
    assert!(ps["sandboxes"].as_array().unwrap().is_empty(), "{ps}");
    assert!(
        d.sandbox_files(&id).is_empty(),
        "files left: {:?}",
        d.sandbox_files(&id)
    );
    let left = procs::writing_under(&d.home.join("sandboxes").join(&id));
    assert!(left.is_empty(), "QEMU of {id} still runs as pid {left:?}");
    let netns: Vec<_> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&id[3..]))
        .collect();
    assert!(netns.is_empty(), "network namespaces left: {netns:?}");
}

/// Rewrite a published snapshot's manifest as a forkvm of manifest format 1
/// wrote it, with the machine options `machine` (`None`: from before they
/// were recorded). Its manifest is read-only and checksummed, so it is
/// decoded, changed and sealed again.
fn set_recorded_machine(d: &Daemon, snap: &str, machine: Option<&str>) {
    use sha2::Digest;
    use std::os::unix::fs::PermissionsExt;
    let path = d
        .home
        .join("snapshots")
        .join(snap)
        .join(forkvm_store::MANIFEST);
    let m = forkvm_store::Manifest::decode(&std::fs::read(&path).unwrap()).unwrap();
    let mut body = serde_json::to_value(&m).unwrap();
    let c = &m.machine;
    let mut old = serde_json::json!({
        "memory_mib": c.memory_mib,
        "cpus": c.cpus,
        "accel": c.accel.to_string(),
        "kernel": c.kernel,
        "initrd": c.initrd,
        "cmdline": c.cmdline,
        "volume_port": c.volume_port,
    });
    if let Some(o) = machine {
        old["machine"] = o.into();
    }
    body["machine"] = old;
    let body = serde_json::to_vec(&body).unwrap();
    let mut file = forkvm_store::manifest::MAGIC.to_vec();
    file.extend(1u32.to_le_bytes());
    file.extend((body.len() as u32).to_le_bytes());
    file.extend(&body);
    let sum = sha2::Sha256::digest(&file);
    file.extend(sum);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&path, file).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn recorded_machine(d: &Daemon, snap: &str) -> String {
    let path = d
        .home
        .join("snapshots")
        .join(snap)
        .join(forkvm_store::MANIFEST);
    forkvm_store::Manifest::decode(&std::fs::read(path).unwrap())
        .unwrap()
        .machine
        .machine
}

/// The machine a sandbox's QEMU runs, as QEMU itself reports it over QMP:
/// today's machine has neither the PIC nor the PIT, the older one QEMU's
/// defaults for both.
fn machine_of(d: &Daemon, id: &str) -> String {
    use forkvm_qemu::spec::{LEGACY_MACHINE, MACHINE};
    let sock = d.home.join("sandboxes").join(id).join("qmp.sock");
    let s = std::os::unix::net::UnixStream::connect(&sock)
        .unwrap_or_else(|e| panic!("{}: {e}", sock.display()));
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut ask = |cmd: serde_json::Value| -> serde_json::Value {
        use std::io::{BufRead, Write};
        writeln!(w, "{cmd}").unwrap();
        loop {
            let mut line = String::new();
            assert!(r.read_line(&mut line).unwrap() > 0, "QMP closed");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if let Some(ret) = v.get("return") {
                return ret.clone();
            }
            assert!(v.get("error").is_none(), "{cmd}: {v}");
        }
    };
    ask(serde_json::json!({"execute": "qmp_capabilities"}));
    let prop = |ask: &mut dyn FnMut(serde_json::Value) -> serde_json::Value, p: &str| {
        ask(serde_json::json!({"execute": "qom-get",
            "arguments": {"path": "/machine", "property": p}}))
    };
    let (pic, pit) = (prop(&mut ask, "pic"), prop(&mut ask, "pit"));
    match (pic.as_str(), pit.as_str()) {
        (Some("off"), Some("off")) => MACHINE.into(),
        (Some("auto" | "on"), Some("auto" | "on")) => LEGACY_MACHINE.into(),
        other => panic!("QEMU of {id} has pic/pit {other:?}"),
    }
}

/// Snapshots made before the PIC/PIT were switched off hold those devices in
/// their state and must keep restoring: a restore recreates the machine the
/// manifest records, and a manifest without the field means the old one.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn snapshots_restore_into_the_machine_they_were_made_on() {
    use forkvm_qemu::spec::{LEGACY_MACHINE, MACHINE};
    // The old forkvm, emulated: a QEMU wrapper that drops the new options
    // (and, so that its cold boot cannot die, masks the PIC first).
    let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qemu-old-machine");
    let mut d = Daemon::start();
    // The old forkvm had no jail either (and the wrapper needs /tmp, bash
    // and python3, which a jailed QEMU does not see).
    d.env = vec![
        ("FORKVM_QEMU".into(), wrapper.display().to_string()),
        ("FORKVM_NO_JAIL".into(), "1".into()),
    ];
    d.stop(libc::SIGTERM);
    d.spawn_process();
    let old_vm = d.ok(&["spawn", "--no-template"]).trim().to_string();
    assert_eq!(machine_of(&d, &old_vm), LEGACY_MACHINE);
    sh(&d, &old_vm, "echo kept > /root/mark");
    let old = d.ok(&["snapshot", &old_vm]).trim().to_string();
    // The daemon records the machine it asked for, which the wrapper did
    // not run: write the manifest as the old forkvm did (format 1, with
    // the options its QEMU ran), which today's reads by upgrading it.
    set_recorded_machine(&d, &old, Some(LEGACY_MACHINE));
    assert_eq!(recorded_machine(&d, &old), LEGACY_MACHINE);

    // Today's daemon (the real QEMU) on the same home.
    d.stop(libc::SIGTERM);
    d.env.clear();
    d.spawn_process();
    // Negative control: the old state does not load into today's machine.
    set_recorded_machine(&d, &old, Some(MACHINE));
    let o = d.run(&["spawn", "--snapshot", &old]);
    assert!(
        !o.status.success(),
        "a PIC/PIT state must not load without those devices"
    );
    // A manifest from before the field existed restores into the old
    // machine, and the guest carries on.
    set_recorded_machine(&d, &old, None);
    let child = d.ok(&["spawn", "--snapshot", &old]).trim().to_string();
    assert_eq!(machine_of(&d, &child), LEGACY_MACHINE);
    assert_eq!(sh(&d, &child, "cat /root/mark").trim(), "kept");
    assert_eq!(sh(&d, &child, "sleep 1; echo alive").trim(), "alive");
    // New boots use today's machine.
    let fresh = d.spawn_cold();
    assert_eq!(machine_of(&d, &fresh.id), MACHINE);
    for id in [&child, &old_vm] {
        d.ok(&["rm", id]);
    }
}
