//! Nodes serve their snapshots (docs/registry.md): two daemons on this host
//! stand in for two cluster nodes, each with its own home, network pool,
//! jail uids, node name, and TCP listener on 127.0.0.1 with its own token.
//! Node B pulls node A's snapshots straight from A's `/v2/` with the plain
//! `POST /v1/snapshots/pull`; no registry stands between them. A push of
//! the same snapshot to Debian's `docker-registry` shows that the node
//! serves what a push sends: the same index digest.

mod common;
mod procs;

#[path = "../../forkvm-image/tests/support/registry.rs"]
mod registry;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A process holding 16 MiB of random bytes; it writes their SHA-256 at
/// start and, when `/run/go` appears, hashes the buffer again (after a
/// restore: the restored memory) into `/run/out`.
const HOLDER: &str = r#"
import hashlib, os, time
buf = os.urandom(16 << 20)
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

struct Node {
    d: Daemon,
    url: String,
    token: String,
}

fn node(name: &str, pool: &str, uids: &str) -> Node {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let token = format!("tok-{name}-{}", std::process::id());
    let d = Daemon::start_tcp_env(
        (addr.clone(), token.clone()),
        &[
            ("FORKVM_NODE", name),
            ("FORKVM_NET_POOL", pool),
            ("FORKVM_JAIL_UIDS", uids),
        ],
    );
    Node {
        d,
        url: format!("http://{addr}"),
        token,
    }
}

/// curl with the given arguments: (HTTP status, headers and body).
fn curl(args: &[&str]) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "600"])
        .args(args)
        .output()
        .expect("curl (apt-get install curl)");
    assert!(o.status.success(), "curl {args:?}: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, out)
}

fn body(resp: &str) -> serde_json::Value {
    let b = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(b).unwrap_or_else(|e| panic!("not JSON ({e}): {resp}"))
}

fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    resp.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// `POST /v1/snapshots/pull` on `to`, from `from`'s `/v2/`, with `password`:
/// (status, response, seconds).
fn pull(to: &Node, from: &Node, snapshot: &str, password: &str) -> (u16, String, f64) {
    let port = from.url.rsplit(':').next().unwrap();
    let req = serde_json::json!({
        "reference": format!("127.0.0.1:{port}/forkvm/snapshots:{snapshot}"),
        "username": "forkvm",
        "password": password,
        "insecure": true,
    });
    let t = Instant::now();
    let (s, r) = curl(&[
        "-X",
        "POST",
        "-H",
        &format!("Authorization: Bearer {}", to.token),
        "-H",
        "Content-Type: application/json",
        "--data",
        &req.to_string(),
        &format!("{}/v1/snapshots/pull", to.url),
    ]);
    (s, r, t.elapsed().as_secs_f64())
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

/// QEMU processes of `home` (see `procs`).
fn qemus_of(home: &std::path::Path) -> Vec<u32> {
    procs::writing_under(&home.join("sandboxes"))
}

#[test]
#[ignore = "needs QEMU and the guest artefacts: make test"]
fn a_node_pulls_another_nodes_snapshots_from_its_v2() {
    let a = node("na", "10.241.0.0/16", "4100000-4199999");
    let b = node("nb", "10.242.0.0/16", "4200000-4299999");
    let homes: Vec<PathBuf> = vec![a.d.home.clone(), b.d.home.clone()];
    assert_eq!(a.d.json(&["info"])["node"], "na");
    assert_eq!(b.d.json(&["info"])["node"], "nb");

    // 1. On A: a process holding 16 MiB of random bytes, and a file.
    let sa = a.d.spawn();
    assert!(sa.id.starts_with("sb-na-"), "{}", sa.id);
    start_python(&a.d, &sa.id, "/root/holder.py", "/root/holder.log", HOLDER);
    let held = wait_file(&a.d, &sa.id, "/run/buf.sha");
    let file = sh(
        &a.d,
        &sa.id,
        "head -c 3000000 /dev/urandom > /root/file.bin && sync && sha256sum /root/file.bin",
    );
    let snap = a.d.json(&["snapshot", &sa.id])["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(snap.starts_with("sn-na-"), "{snap}");

    // A's /v2/ wants the token; HEAD gives the index's length and digest.
    let (s, r) = curl(&[&format!("{}/v2/", a.url)]);
    assert_eq!(s, 401, "{r}");
    assert_eq!(
        header(&r, "www-authenticate"),
        Some("Basic realm=\"forkvm\"")
    );
    let manifest_url = format!("{}/v2/forkvm/snapshots/manifests/{snap}", a.url);
    let (s, r) = curl(&["-I", "-u", &format!("forkvm:{}", a.token), &manifest_url]);
    assert_eq!(s, 200, "{r}");
    let digest = header(&r, "docker-content-digest").expect(&r).to_string();
    let len: usize = header(&r, "content-length").expect(&r).parse().unwrap();
    let (s, r) = curl(&[
        "-H",
        &format!("Authorization: Bearer {}", a.token),
        &manifest_url,
    ]);
    assert_eq!(s, 200, "{r}");
    let index = r.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(index.len(), len);
    use sha2::Digest as _;
    assert_eq!(
        format!("sha256:{:x}", sha2::Sha256::digest(index.as_bytes())),
        digest
    );
    // Byte for byte what a push sends: the index a push of the same
    // snapshot puts into a registry has the digest A serves.
    {
        registry::need_tools();
        let t = tempfile::tempdir().unwrap();
        let reg = registry::Registry::start(t.path(), false);
        let out = a.d.ok(&[
            "--json",
            "snapshot",
            "push",
            &snap,
            &format!("{}/fvt/node:v1", reg.host),
        ]);
        let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(last["type"], "pushed", "{out}");
        assert_eq!(last["result"]["digest"], digest.as_str(), "{out}");
    }
    // Read-only.
    let (s, r) = curl(&[
        "-X",
        "DELETE",
        "-u",
        &format!("x:{}", a.token),
        &manifest_url,
    ]);
    assert_eq!(s, 405, "{r}");
    assert_eq!(body(&r)["errors"][0]["code"], "UNSUPPORTED");

    // 2. A wrong password: refused, with a clear error, and nothing on B.
    let before = b.d.json(&["snapshot", "ls"]);
    let (s, r, _) = pull(&b, &a, &snap, "wrong");
    assert_eq!(s, 403, "{r}");
    let msg = body(&r)["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("authentication to 127.0.0.1:") && msg.contains("failed"),
        "{msg}"
    );
    assert_eq!(b.d.json(&["snapshot", "ls"]), before);

    // 3. B pulls it from A and spawns it: buffer and file exact.
    let (s, r, t1) = pull(&b, &a, &snap, &a.token);
    assert_eq!(s, 201, "{r}");
    let p1 = body(&r);
    assert_eq!(p1["snapshot"]["id"], snap.as_str(), "{p1}");
    assert_eq!(p1["links"], 2, "the template and the snapshot: {p1}");
    assert_eq!(p1["links_cached"], 0, "{p1}");
    assert_eq!(
        p1["image_created"], false,
        "both homes have the image: {p1}"
    );
    let bytes1 = p1["bytes_fetched"].as_u64().unwrap();
    assert!(bytes1 > 16 << 20, "the random buffer alone is 16 MiB: {p1}");
    {
        let sb = b.d.ok(&["spawn", "--snapshot", &snap]).trim().to_string();
        assert!(sb.starts_with("sb-nb-"), "{sb}");
        sh(&b.d, &sb, "touch /run/go");
        assert_eq!(
            wait_file(&b.d, &sb, "/run/out"),
            held,
            "the buffer differs on B"
        );
        assert_eq!(sh(&b.d, &sb, "sha256sum /root/file.bin"), file);
        b.d.ok(&["rm", &sb]);
    }

    // 4. Another sandbox of the same template on A: B fetches its link only.
    let s2 = a.d.spawn();
    let file2 = sh(
        &a.d,
        &s2.id,
        "head -c 500000 /dev/urandom > /root/two.bin && sync && sha256sum /root/two.bin",
    );
    let snap2 = a.d.json(&["snapshot", &s2.id])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, r, t2) = pull(&b, &a, &snap2, &a.token);
    assert_eq!(s, 201, "{r}");
    let p2 = body(&r);
    assert_eq!(p2["links"], 2, "{p2}");
    assert_eq!(
        p2["links_cached"], 1,
        "B has the template from the first pull: {p2}"
    );
    let bytes2 = p2["bytes_fetched"].as_u64().unwrap();
    assert!(
        bytes2 < bytes1 / 2,
        "the second pull moved {bytes2} bytes, the first {bytes1}: {p2}"
    );
    {
        let sb = b.d.ok(&["spawn", "--snapshot", &snap2]).trim().to_string();
        assert_eq!(sh(&b.d, &sb, "sha256sum /root/two.bin"), file2);
        b.d.ok(&["rm", &sb]);
    }
    eprintln!(
        "node transfer: first pull {bytes1} bytes in {t1:.2} s ({} blobs, {} ms in the daemon); \
         second pull {bytes2} bytes in {t2:.2} s ({} blobs, {} ms; {} of {} links already there)",
        p1["blobs_fetched"],
        p1["total_ms"],
        p2["blobs_fetched"],
        p2["total_ms"],
        p2["links_cached"],
        p2["links"]
    );

    // 5. Nothing left behind: no QEMU of either home, and the homes go.
    drop(s2);
    drop(sa);
    drop(a);
    drop(b);
    for h in &homes {
        assert!(
            wait_until(Duration::from_secs(20), || qemus_of(h).is_empty()),
            "QEMU left running for {}: {:?}",
            h.display(),
            qemus_of(h)
        );
        assert!(!h.exists(), "{} was left", h.display());
    }
}
