//! Snapshots that travel (docs/registry.md): two forkvm daemons with separate
//! homes and network pools stand in for two hosts, and Debian's
//! `docker-registry` on 127.0.0.1 for the registry between them.
//!
//! What the registry holds is read from its storage directory, not taken
//! from forkvm's word: the blobs a push added are counted and summed there,
//! and a corrupted blob or an edited config is made there or through its
//! HTTP API with curl.

mod common;

#[path = "../../forkvm-image/tests/support/registry.rs"]
mod registry;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A process holding 64 MiB of random bytes in memory; it writes their
/// SHA-256 at start and, when `/run/go` appears, hashes the buffer again
/// (after a restore: the restored memory) into `/run/out`.
const HOLDER: &str = r#"
import hashlib, os, time
buf = os.urandom(64 << 20)
with open('/run/buf.tmp', 'w') as f:
    f.write(hashlib.sha256(buf).hexdigest())
os.rename('/run/buf.tmp', '/run/buf.sha')
while not os.path.exists('/run/go'):
    time.sleep(0.05)
with open('/run/out.tmp', 'w') as f:
    f.write(hashlib.sha256(buf).hexdigest())
os.rename('/run/out.tmp', '/run/out')
time.sleep(1e6)
"#;

fn blob_dir(reg: &registry::Registry) -> PathBuf {
    reg.storage.join("docker/registry/v2/blobs/sha256")
}

/// Every blob in the registry's storage: digest → size.
fn blobs(reg: &registry::Registry) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for pre in std::fs::read_dir(blob_dir(reg))
        .into_iter()
        .flatten()
        .flatten()
    {
        for b in std::fs::read_dir(pre.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(md) = std::fs::metadata(b.path().join("data")) {
                m.insert(
                    format!("sha256:{}", b.file_name().to_string_lossy()),
                    md.len(),
                );
            }
        }
    }
    m
}

fn blob_path(reg: &registry::Registry, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").unwrap();
    blob_dir(reg).join(&hex[..2]).join(hex).join("data")
}

fn read_json(reg: &registry::Registry, digest: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(blob_path(reg, digest)).unwrap()).unwrap()
}

/// The digest a tag of `repo` names, read from the storage.
fn tag_digest(reg: &registry::Registry, repo: &str, tag: &str) -> String {
    let p = reg.storage.join(format!(
        "docker/registry/v2/repositories/{repo}/_manifests/tags/{tag}/current/link"
    ));
    std::fs::read_to_string(p).unwrap().trim().to_string()
}

/// The last JSON line of `forkvm --json snapshot push|pull`: its result.
fn result(out: &str, kind: &str) -> serde_json::Value {
    let last: serde_json::Value =
        serde_json::from_str(out.lines().last().expect("output")).expect("a JSON line");
    assert_eq!(last["type"], kind, "{out}");
    last["result"].clone()
}

fn wait_file(d: &Daemon, id: &str, path: &str) -> String {
    let mut got = String::new();
    let ok = wait_until(Duration::from_secs(120), || {
        got = try_sh(d, id, &format!("cat {path} 2>/dev/null"));
        !got.is_empty()
    });
    assert!(ok, "{path} never appeared in {id}");
    got.trim().to_string()
}

fn snapshot(d: &Daemon, id: &str) -> String {
    d.json(&["snapshot", id])["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Nothing half-made in a home: no staging directories of snapshots or
/// images.
fn staging_left(home: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for dir in ["snapshots", "images"] {
        for e in std::fs::read_dir(home.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(".tmp-") {
                v.push(format!("{dir}/{n}"));
            }
        }
    }
    v
}

fn listing(home: &Path) -> BTreeSet<String> {
    let mut s = BTreeSet::new();
    for dir in ["snapshots", "images"] {
        for e in std::fs::read_dir(home.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            s.insert(format!("{dir}/{}", e.file_name().to_string_lossy()));
        }
    }
    s
}

fn curl(args: &[&str]) -> String {
    let o = Command::new("curl")
        .args(["-sS", "--fail-with-body"])
        .args(args)
        .output()
        .expect("curl (apt-get install curl)");
    assert!(
        o.status.success(),
        "curl {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Upload a blob to `repo` through the registry's API (monolithic upload).
fn upload(reg: &registry::Registry, repo: &str, bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = format!("sha256:{:x}", sha2::Sha256::digest(bytes));
    let headers = curl(&[
        "-X",
        "POST",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &format!("http://{}/v2/{repo}/blobs/uploads/", reg.host),
    ]);
    let loc = headers
        .lines()
        .find_map(|l| {
            l.strip_prefix("Location: ")
                .or(l.strip_prefix("location: "))
        })
        .expect("a Location header")
        .trim()
        .to_string();
    let url = if loc.starts_with("http") {
        loc
    } else {
        format!("http://{}{loc}", reg.host)
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let t = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(t.path(), bytes).unwrap();
    curl(&[
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        &format!("@{}", t.path().display()),
        &format!("{url}{sep}digest={digest}"),
    ]);
    digest
}

fn put_manifest(reg: &registry::Registry, repo: &str, at: &str, media: &str, bytes: &[u8]) {
    let t = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(t.path(), bytes).unwrap();
    curl(&[
        "-X",
        "PUT",
        "-H",
        &format!("Content-Type: {media}"),
        "--data-binary",
        &format!("@{}", t.path().display()),
        &format!("http://{}/v2/{repo}/manifests/{at}", reg.host),
    ]);
}

#[test]
#[ignore = "needs QEMU, the guest artefacts and docker-registry: make test"]
fn snapshots_travel_between_two_hosts_through_a_registry() {
    registry::need_tools();
    let t = tempfile::tempdir().unwrap();
    let reg = registry::Registry::start(t.path(), false);
    let a = Daemon::start();
    let b = Daemon::start_env(&[("FORKVM_NET_POOL", "10.232.0.0/16")]);
    let r = |name: &str| format!("{}/fvt/{name}", reg.host);

    // 1. Host A: a Python process holding 64 MiB of random bytes, a file on
    //    disk; snapshot and push.
    let sa = a.spawn();
    start_python(&a, &sa.id, "/root/holder.py", "/root/holder.log", HOLDER);
    let held = wait_file(&a, &sa.id, "/run/buf.sha");
    let file = sh(
        &a,
        &sa.id,
        "head -c 3000000 /dev/urandom > /root/file.bin && sync && sha256sum /root/file.bin",
    );
    let snap = a.json(&["snapshot", &sa.id, "--tag", "travel"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let before = blobs(&reg);
    let pushed = result(
        &a.ok(&["--json", "snapshot", "push", "travel", &r("travel:v1")]),
        "pushed",
    );
    let after = blobs(&reg);
    assert_eq!(pushed["snapshot"], snap.as_str());
    assert_eq!(
        pushed["links"], 2,
        "the template and the snapshot: {pushed}"
    );
    assert_eq!(pushed["image_sent"], true);
    let added: Vec<(&String, &u64)> = after
        .iter()
        .filter(|(k, _)| !before.contains_key(*k))
        .collect();
    // The registry stores manifests as blobs too.
    assert_eq!(
        added.len() as u64,
        pushed["blobs_sent"].as_u64().unwrap() + pushed["manifests_sent"].as_u64().unwrap(),
        "{pushed}"
    );
    assert_eq!(
        added.iter().map(|(_, s)| **s).sum::<u64>(),
        pushed["bytes_sent"].as_u64().unwrap()
    );

    // 2. Host B pulls and spawns it: the process's buffer and the file are
    //    exactly A's.
    let pulled = result(
        &b.ok(&[
            "--json",
            "snapshot",
            "pull",
            &r("travel:v1"),
            "--tag",
            "arrived",
        ]),
        "pulled",
    );
    assert_eq!(pulled["snapshot"]["id"], snap.as_str());
    assert_eq!(pulled["snapshot"]["origin"], "pull");
    assert_eq!(pulled["links"], 2);
    assert_eq!(pulled["links_cached"], 0);
    // The homes share the built default image: B uses its own, fetches none.
    assert_eq!(pulled["image"], "default");
    assert_eq!(pulled["image_created"], false);
    {
        let sb = b.ok(&["spawn", "--snapshot", "arrived"]).trim().to_string();
        sh(&b, &sb, "touch /run/go");
        assert_eq!(
            wait_file(&b, &sb, "/run/out"),
            held,
            "the buffer differs on B"
        );
        assert_eq!(sh(&b, &sb, "sha256sum /root/file.bin"), file);
        b.ok(&["rm", &sb]);
    }
    // A second pull of the same reference finds everything here.
    let again = result(
        &b.ok(&["--json", "snapshot", "pull", &r("travel:v1")]),
        "pulled",
    );
    assert_eq!(again["links_cached"], 2, "{again}");
    assert_eq!(again["blobs_fetched"], 0, "{again}");
    drop(sa);

    // 3. A diff chain of depth 3, pushed after its base: only the links go.
    let x = a.spawn();
    sh(&a, &x.id, "echo 1 > /root/l1 && echo one > /run/m && sync");
    let d1 = snapshot(&a, &x.id);
    let y = a.ok(&["spawn", "--snapshot", &d1]).trim().to_string();
    sh(&a, &y, "echo 2 > /root/l2 && echo two > /run/m && sync");
    let d2 = snapshot(&a, &y);
    let z = a.ok(&["spawn", "--snapshot", &d2]).trim().to_string();
    sh(&a, &z, "echo 3 > /root/l3 && echo three > /run/m && sync");
    let d3 = snapshot(&a, &z);
    let d3v = a.json(&["snapshot", "inspect", &d3]);
    assert_eq!(d3v["depth"], 3, "{d3v}");
    let base = a.json(&["snapshot", "inspect", &d1])["parent"]
        .as_str()
        .unwrap()
        .to_string();
    result(
        &a.ok(&["--json", "snapshot", "push", &base, &r("chain:base")]),
        "pushed",
    );
    let before = blobs(&reg);
    let p3 = result(
        &a.ok(&["--json", "snapshot", "push", &d3, &r("chain:d3")]),
        "pushed",
    );
    let after = blobs(&reg);
    assert_eq!(p3["links"], 4, "{p3}");
    assert_eq!(p3["links_skipped"], 1, "the base was there: {p3}");
    assert_eq!(p3["image_sent"], false, "{p3}");
    let added: BTreeMap<&String, &u64> = after
        .iter()
        .filter(|(k, _)| !before.contains_key(*k))
        .collect();
    assert_eq!(
        added.len() as u64,
        p3["blobs_sent"].as_u64().unwrap() + p3["manifests_sent"].as_u64().unwrap(),
        "{p3}"
    );
    assert_eq!(
        added.values().map(|s| **s).sum::<u64>(),
        p3["bytes_sent"].as_u64().unwrap()
    );
    // Exactly the three links' blobs, configs and manifests, and the index.
    let index_digest = tag_digest(&reg, "fvt/chain", "d3");
    let index = read_json(&reg, &index_digest);
    let entries = index["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 5, "image, base and three links: {index}");
    let mut expect: BTreeSet<String> = BTreeSet::from([index_digest.clone()]);
    for e in &entries[2..] {
        let md = e["digest"].as_str().unwrap();
        expect.insert(md.to_string());
        let m = read_json(&reg, md);
        expect.insert(m["config"]["digest"].as_str().unwrap().to_string());
        for l in m["layers"].as_array().unwrap() {
            expect.insert(l["digest"].as_str().unwrap().to_string());
        }
    }
    // A chunk the registry already had (a zero-free page shared with the
    // base, say) is not sent again, so the sent set is within the links'.
    let sent: BTreeSet<String> = added.keys().map(|k| k.to_string()).collect();
    assert!(
        sent.is_subset(&expect),
        "sent more than the links: {:?}",
        sent.difference(&expect)
    );
    for e in &entries[..2] {
        assert!(
            !sent.contains(e["digest"].as_str().unwrap()),
            "the base or image went again"
        );
    }
    // Host B spawns every depth with exact state.
    let pc = result(
        &b.ok(&["--json", "snapshot", "pull", &r("chain:d3")]),
        "pulled",
    );
    assert_eq!(pc["links"], 4);
    assert_eq!(pc["links_cached"], 1, "B had the base from step 2: {pc}");
    for (k, (id, word)) in [(&d1, "one"), (&d2, "two"), (&d3, "three")]
        .into_iter()
        .enumerate()
    {
        let sb = b.ok(&["spawn", "--snapshot", id]).trim().to_string();
        let depth = k + 1;
        let files = try_sh(
            &b,
            &sb,
            "cat /root/l1 /root/l2 /root/l3 2>/dev/null; cat /run/m",
        );
        let want: String = (1..=depth).map(|i| format!("{i}\n")).collect::<String>() + word + "\n";
        assert_eq!(files, want, "depth {depth} on B");
        b.ok(&["rm", &sb]);
    }
    for id in [&y, &z] {
        a.ok(&["rm", id]);
    }
    drop(x);

    // 4. A corrupted blob: a clear error, and nothing partial on B.
    let c = a.spawn();
    sh(
        c.d,
        &c.id,
        "head -c 6000000 /dev/urandom > /run/noise && sync",
    );
    let sc = snapshot(&a, &c.id);
    result(
        &a.ok(&["--json", "snapshot", "push", &sc, &r("corrupt:v1")]),
        "pushed",
    );
    let idx = read_json(&reg, &tag_digest(&reg, "fvt/corrupt", "v1"));
    let top = read_json(
        &reg,
        idx["manifests"].as_array().unwrap().last().unwrap()["digest"]
            .as_str()
            .unwrap(),
    );
    let biggest = top["layers"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|l| l["size"].as_u64().unwrap())
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let p = blob_path(&reg, &biggest);
    let mut data = std::fs::read(&p).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0x55;
    std::fs::write(&p, &data).unwrap();
    let seen = listing(&b.home);
    let o = b.run(&["snapshot", "pull", &r("corrupt:v1")]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("invalid_image") && err.contains(&biggest),
        "{err}"
    );
    assert!(err.contains("corrupt or was tampered with"), "{err}");
    assert_eq!(listing(&b.home), seen, "the failed pull left something");
    assert!(
        staging_left(&b.home).is_empty(),
        "{:?}",
        staging_left(&b.home)
    );
    assert!(
        b.log().contains("failed"),
        "the daemon did not log the failure"
    );
    drop(c);

    // 5. An incompatible snapshot (its QEMU version edited in the registry)
    //    is refused before anything is written.
    b.ok(&["snapshot", "rm", "arrived"]);
    let seen = listing(&b.home);
    let idx_digest = tag_digest(&reg, "fvt/travel", "v1");
    let mut idx = read_json(&reg, &idx_digest);
    let top_digest = idx["manifests"][2]["digest"].as_str().unwrap().to_string();
    let mut man = read_json(&reg, &top_digest);
    let mut cfg = read_json(&reg, man["config"]["digest"].as_str().unwrap());
    cfg["requires"]["qemu"] = "QEMU emulator version 9.2.0".into();
    let cfg_bytes = serde_json::to_vec(&cfg).unwrap();
    let cfg_digest = upload(&reg, "fvt/travel", &cfg_bytes);
    man["config"]["digest"] = cfg_digest.into();
    man["config"]["size"] = cfg_bytes.len().into();
    let man_bytes = serde_json::to_vec(&man).unwrap();
    let man_digest = {
        use sha2::Digest as _;
        format!("sha256:{:x}", sha2::Sha256::digest(&man_bytes))
    };
    put_manifest(
        &reg,
        "fvt/travel",
        &man_digest,
        "application/vnd.oci.image.manifest.v1+json",
        &man_bytes,
    );
    idx["manifests"][2]["digest"] = man_digest.into();
    idx["manifests"][2]["size"] = man_bytes.len().into();
    put_manifest(
        &reg,
        "fvt/travel",
        "old",
        "application/vnd.oci.image.index.v1+json",
        &serde_json::to_vec(&idx).unwrap(),
    );
    let from = reg.log_len();
    let o = b.run(&["snapshot", "pull", &r("travel:old")]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("incompatible_snapshot") && err.contains("QEMU 9.2") && err.contains("10.0"),
        "{err}"
    );
    assert_eq!(listing(&b.home), seen, "the refused pull wrote something");
    // Only the index, manifests and configs were read: no chunk.
    let chunk_gets = reg.blob_gets(from);
    assert!(
        chunk_gets <= 3,
        "{chunk_gets} blob reads for a refused pull"
    );

    // 6. A private registry (TLS with a test CA, htpasswd): pushes and pulls
    //    take the same credentials and CA setup as image pulls.
    let t2 = tempfile::tempdir().unwrap();
    let private = registry::Registry::start(t2.path(), true);
    for d in [&a, &b] {
        let certs = d.home.join("certs.d").join(&private.host);
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::copy(t2.path().join("ca.pem"), certs.join("ca.crt")).unwrap();
    }
    let pr = format!("{}/team/travel:v1", private.host);
    let o = a.run(&["snapshot", "push", "travel", &pr]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("registry_auth_failed"),
        "{}",
        stderr(&o)
    );
    let o = a.run(&[
        "snapshot",
        "push",
        "travel",
        &pr,
        "--username",
        "alice",
        "--password",
        "wrong",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("authentication"),
        "{}",
        stderr(&o)
    );
    let creds = ["--username", "alice", "--password", "s3cret"];
    let mut push = vec!["--json", "snapshot", "push", "travel", pr.as_str()];
    push.extend(creds);
    let p = result(&a.ok(&push), "pushed");
    assert_eq!(p["links"], 2, "{p}");
    let o = b.run(&["snapshot", "pull", &pr]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("registry_auth_failed"),
        "{}",
        stderr(&o)
    );
    let mut pull = vec![
        "--json",
        "snapshot",
        "pull",
        pr.as_str(),
        "--tag",
        "private",
    ];
    pull.extend(creds);
    let got = result(&b.ok(&pull), "pulled");
    assert_eq!(got["snapshot"]["id"], snap.as_str());
    let sb = b.ok(&["spawn", "--snapshot", "private"]).trim().to_string();
    assert_eq!(sh(&b, &sb, "sha256sum /root/file.bin"), file);
    b.ok(&["rm", &sb]);
    drop(private);
    drop(b);

    // 7. A host without the image: the pull brings it, under its name.
    let ct = tempfile::Builder::new()
        .prefix("fvc-")
        .tempdir_in("/tmp")
        .unwrap();
    let chome = ct.path().join("h");
    std::fs::create_dir_all(chome.join("images")).unwrap();
    let c = Daemon::start_in_env(&chome, &[("FORKVM_NET_POOL", "10.233.0.0/16")]);
    let got = result(
        &c.ok(&["--json", "snapshot", "pull", &r("travel:v1")]),
        "pulled",
    );
    assert_eq!(got["image"], "default", "{got}");
    assert_eq!(got["image_created"], true, "{got}");
    let theirs = std::fs::read_link(a.home.join("images/default")).unwrap();
    let same = Command::new("cmp")
        .arg(chome.join("images/default/rootfs.ext4"))
        .arg(theirs.join("rootfs.ext4"))
        .status()
        .unwrap();
    assert!(same.success(), "the pulled root disk differs");
    let sb = c.ok(&["spawn", "--snapshot", &snap]).trim().to_string();
    assert_eq!(sh(&c, &sb, "sha256sum /root/file.bin"), file);
    c.ok(&["rm", &sb]);
    drop(c);
    drop(a);
}
