//! End-to-end tests: the `forkvm` CLI and REST API against a real daemon that
//! boots real microVMs (QEMU, the Debian guest kernel, the default image).
//! Run with `make test` (which passes `--include-ignored`).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use forkvm_api::Method;
use sha2::{Digest, Sha256};

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn run_prints_python_output_and_removes_the_sandbox() {
    let d = shared();
    let o = d.run(&["run", "--", "python3", "-c", "print(6*7)"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "42\n");
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn run_exits_with_the_command_exit_code() {
    let d = shared();
    let o = d.run(&["run", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(stdout(&o), "out\n");
    assert!(stderr(&o).contains("err\n"));
}

/// One sandbox, many exec features: stdin/env/cwd, a 10 MiB stdout, a
/// timeout, files, then exec after removal.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn exec_features_on_one_sandbox() {
    let d = shared();
    let sb = d.spawn();
    let id = sb.id.clone();

    // stdin, env and cwd reach the command.
    let mut c = d.cmd();
    c.args([
        "exec",
        "-i",
        "-e",
        "GREETING=hello world",
        "-w",
        "/tmp",
        &id,
        "--",
    ])
    .args(["sh", "-c", "read line; echo \"$GREETING|$line|$(pwd)\""])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    {
        use std::io::Write;
        let mut si = child.stdin.take().unwrap();
        si.write_all(b"from stdin\n").unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "hello world|from stdin|/tmp\n");

    // A 10 MiB stdout arrives intact: compare the guest's checksum with ours.
    let gen = "import hashlib,sys,random; r=random.Random(7); b=bytes(r.getrandbits(8) for _ in range(1<<20))*10; \
               sys.stderr.write(hashlib.sha256(b).hexdigest()); sys.stdout.buffer.write(b)";
    let o = sb.exec(&["python3", "-c", gen]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 10 << 20);
    let ours = format!("{:x}", Sha256::digest(&o.stdout));
    assert_eq!(
        ours,
        stderr(&o).trim(),
        "10 MiB stdout was altered in transit"
    );

    // A command past its timeout is killed and reported as a timeout.
    let t = std::time::Instant::now();
    let o = d.run(&[
        "exec",
        "--timeout",
        "1",
        &id,
        "--",
        "sh",
        "-c",
        "echo started; sleep 60",
    ]);
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    assert_eq!(stdout(&o), "started\n", "output before the timeout is kept");
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));
    let o = d.run(&[
        "--json",
        "exec",
        "--timeout",
        "0.5",
        &id,
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(o.status.code(), Some(124), "--json keeps the exit code");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["timed_out"], true);
    assert_eq!(v["signal"], 9);
    assert!(t.elapsed() < Duration::from_secs(90));

    // Files written with the file API read back byte-identical.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = d.client();
    let data: Vec<u8> = (0..(3 << 20) + 17)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    rt.block_on(async {
        let w = client
            .write_file(
                &id,
                "/root/dir/blob.bin",
                Some(0o600),
                Bytes::from(data.clone()),
            )
            .await
            .unwrap();
        assert_eq!(w.size, data.len() as u64);
        let back = client.read_file(&id, "/root/dir/blob.bin").await.unwrap();
        assert!(back == data, "file read back differs");
        // The guest sees the same bytes and the mode.
        let r = client
            .exec(
                &id,
                &forkvm_api::ExecRequest {
                    argv: vec![
                        "sh".into(),
                        "-c".into(),
                        "sha256sum /root/dir/blob.bin; stat -c %a /root/dir/blob.bin".into(),
                    ],
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(
            r.stdout
                .starts_with(&format!("{:x}", Sha256::digest(&data))),
            "{}",
            r.stdout
        );
        assert!(r.stdout.ends_with("600\n"), "{}", r.stdout);
        // Reading a missing file is a 404 with a message.
        let e = client.read_file(&id, "/no/such/file").await.unwrap_err();
        assert_eq!(e.code(), Some("not_found"), "{e}");
        // A relative path is refused.
        let e = client.read_file(&id, "etc/passwd").await.unwrap_err();
        assert_eq!(e.code(), Some("invalid_request"), "{e}");
        // Output is capped with a flag, never silently.
        let r = client
            .exec(
                &id,
                &forkvm_api::ExecRequest {
                    argv: vec![
                        "head".into(),
                        "-c".into(),
                        "100000".into(),
                        "/dev/zero".into(),
                    ],
                    max_output_bytes: Some(1000),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(r.stdout_truncated && r.stdout_bytes == 100_000 && r.stdout.len() == 1000);
        // A missing executable is a clear 404.
        let e = client
            .exec(
                &id,
                &forkvm_api::ExecRequest {
                    argv: vec!["no-such-program".into()],
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no-such-program"), "{e}");
    });

    // Exec in a removed sandbox: a clear 404, non-zero exit.
    d.ok(&["rm", &id]);
    let o = d.run(&["exec", &id, "--", "true"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no sandbox"), "{}", stderr(&o));
    assert!(
        d.sandbox_files(&id).is_empty(),
        "files left: {:?}",
        d.sandbox_files(&id)
    );
    std::mem::forget(sb); // already removed
}

#[tokio::test]
#[ignore = "boots microVMs: run with `make test`"]
async fn bad_input_gets_clear_errors_and_leaves_nothing() {
    // Its own daemon: the "nothing was created" check must not see the
    // sandboxes of tests running alongside. (It boots no VM.)
    let owned = Daemon::start();
    let d = &owned;
    let c = d.client();
    let before = std::fs::read_dir(d.home.join("sandboxes"))
        .map(|r| r.count())
        .unwrap_or(0);
    let count = || async { c.list_sandboxes().await.unwrap().sandboxes.len() };
    let n0 = count().await;

    let post = |body: &'static str| {
        let c = c.clone();
        async move {
            c.raw(
                Method::POST,
                "/v1/sandboxes",
                Some((Bytes::from(body), "application/json")),
            )
            .await
            .unwrap()
        }
    };
    let err = |r: &forkvm_api::client::Response| -> (u16, String, String) {
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON error body");
        (
            r.status.as_u16(),
            v["error"]["code"].as_str().unwrap().to_string(),
            v["error"]["message"].as_str().unwrap().to_string(),
        )
    };

    let (s, code, msg) = err(&post(r#"{"image":"no-such-image"}"#).await);
    assert_eq!((s, code.as_str()), (404, "image_not_found"));
    assert!(
        msg.contains("no-such-image") && msg.contains("default"),
        "{msg}"
    );
    for body in [
        r#"{"memory_mib":0}"#,
        r#"{"memory_mib":99999999}"#,
        r#"{"cpus":0}"#,
        r#"{"cpus":4096}"#,
    ] {
        let (s, code, msg) = err(&post(body).await);
        assert_eq!(
            (s, code.as_str()),
            (400, "invalid_request"),
            "{body}: {msg}"
        );
        assert!(msg.contains("between"), "{msg}");
    }
    let (s, code, msg) = err(&post(r#"{"image": "default", "#).await);
    assert_eq!((s, code.as_str()), (400, "invalid_request"));
    assert!(msg.contains("invalid JSON"), "{msg}");
    let (s, _, msg) = err(&post(r#"{"imag": "default"}"#).await);
    assert_eq!(s, 400);
    assert!(msg.contains("imag"), "unknown field must be named: {msg}");
    let (s, _, msg) = err(&post(r#"{"memory_mib": "lots"}"#).await);
    assert_eq!(s, 400, "{msg}");

    // Unknown sandbox ids, for every sandbox route.
    for (m, p) in [
        (Method::GET, "/v1/sandboxes/sb-000000000000"),
        (Method::DELETE, "/v1/sandboxes/sb-000000000000"),
        (Method::GET, "/v1/sandboxes/sb-000000000000/logs"),
        (
            Method::GET,
            "/v1/sandboxes/sb-000000000000/files?path=/etc/hostname",
        ),
        (Method::GET, "/v1/sandboxes/..%2F..%2Fetc"),
    ] {
        let r = c.raw(m.clone(), p, None).await.unwrap();
        let (s, code, _) = err(&r);
        assert_eq!((s, code.as_str()), (404, "not_found"), "{m} {p}");
    }
    let r = c
        .raw(
            Method::POST,
            "/v1/sandboxes/sb-000000000000/exec",
            Some((Bytes::from(r#"{"argv":["true"]}"#), "application/json")),
        )
        .await
        .unwrap();
    assert_eq!(err(&r).0, 404);
    let r = c.raw(Method::GET, "/v1/nope", None).await.unwrap();
    assert_eq!(err(&r).0, 404);
    let r = c.raw(Method::PATCH, "/v1/sandboxes", None).await.unwrap();
    assert_eq!(err(&r).0, 405);

    // The CLI turns these into non-zero exits with the message.
    let o = d.run(&["run", "--image", "nope", "--", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("image \"nope\" not found"),
        "{}",
        stderr(&o)
    );
    let o = d.run(&["spawn", "--memory", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("memory_mib must be between"),
        "{}",
        stderr(&o)
    );
    let o = d.run(&["rm", "sb-000000000000"]);
    assert_eq!(o.status.code(), Some(1));
    // `exec ID` alone runs the image's default command, so only a missing
    // ID is a usage error.
    let o = d.run(&["exec"]);
    assert_eq!(o.status.code(), Some(2), "usage errors exit 2");
    let o = d.run(&["exec", "sb-000000000000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    // Nothing was created by any of it.
    assert_eq!(count().await, n0);
    let after = std::fs::read_dir(d.home.join("sandboxes"))
        .map(|r| r.count())
        .unwrap_or(0);
    assert!(after <= before, "sandbox dirs leaked: {before} -> {after}");
}

/// A guest kernel panic and a QEMU killed with SIGKILL both turn the sandbox
/// into `failed` with the reason, with no process, socket or file left.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn guest_panic_and_killed_qemu_are_reported_and_cleaned_up() {
    let d = shared();
    let a = d.spawn();
    let b = d.spawn();
    let (pa, pb) = (a.pid(), b.pid());
    assert!(alive(pa) && alive(pb));

    // Panic the guest kernel through sysrq.
    let _ = a.exec(&[
        "sh",
        "-c",
        "echo 1 > /proc/sys/kernel/sysrq; echo c > /proc/sysrq-trigger",
    ]);
    // Kill the other QEMU outright.
    // SAFETY: signalling a QEMU this test's daemon started for this test.
    unsafe { libc::kill(pb as i32, libc::SIGKILL) };

    for (sb, pid, want) in [(&a, pa, "kernel panic"), (&b, pb, "SIGKILL")] {
        let failed = wait_until(Duration::from_secs(60), || {
            d.json(&["inspect", &sb.id])["state"] == "failed"
        });
        assert!(failed, "{} never showed as failed", sb.id);
        let v = d.json(&["inspect", &sb.id]);
        let why = v["failure"].as_str().unwrap_or_default().to_string();
        assert!(
            why.contains(want),
            "failure reason {why:?} should mention {want}"
        );
        assert!(!alive(pid), "QEMU {pid} still running");
        // Only the logs stay until rm; RAM, disk and sockets are gone.
        let left: Vec<_> = d
            .sandbox_files(&sb.id)
            .into_iter()
            .filter(|p| !p.is_dir())
            .collect();
        assert!(left.is_empty(), "runtime files leaked: {left:?}");
        // exec on a failed sandbox says so.
        let o = sb.exec(&["true"]);
        assert!(stderr(&o).contains("has failed"), "{}", stderr(&o));
        // ps shows it with the reason; logs still work.
        assert!(d.ok(&["ps"]).contains(&sb.id));
        d.ok(&["logs", &sb.id]);
    }
    assert!(d.ok(&["logs", &a.id]).contains("Kernel panic"));
    for sb in [&a, &b] {
        d.ok(&["rm", &sb.id]);
        assert!(d.sandbox_files(&sb.id).is_empty());
    }
}

#[tokio::test]
#[ignore = "boots microVMs: run with `make test`"]
async fn tcp_needs_the_right_token() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(Some((addr.clone(), "s3cret-token".into())));
    let target = forkvm_api::Target::Tcp(addr.clone());
    let mut tries = 0;
    let good = forkvm_api::Client::new(target.clone(), Some("s3cret-token".into()));
    while good.health().await.is_err() && tries < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tries += 1;
    }
    assert_eq!(good.health().await.unwrap().status, "ok");
    assert!(good.info().await.is_ok());
    for bad in [Some("wrong"), Some("s3cret-token-longer"), Some(""), None] {
        let c = forkvm_api::Client::new(target.clone(), bad.map(str::to_string));
        let e = c.list_sandboxes().await.unwrap_err();
        match e {
            forkvm_api::ClientError::Api {
                status,
                ref code,
                ref message,
                ..
            } => {
                assert_eq!(status, 401);
                assert_eq!(code, "unauthorized");
                assert!(message.contains("FORKVM_TOKEN"));
            }
            other => panic!("expected 401, got {other}"),
        }
    }
    // The unix socket needs no token (it is protected by file permissions).
    assert!(d.client().info().await.is_ok());
}

/// Sandboxes survive a daemon restart (graceful, and kill -9): still listed,
/// still answering exec.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn daemon_restart_keeps_running_sandboxes() {
    let mut d = Daemon::start();
    let id = d.ok(&["spawn"]).trim().to_string();
    d.ok(&["exec", &id, "--", "sh", "-c", "echo kept > /root/state"]);
    let pid = d.json(&["inspect", &id])["pid"].as_u64().unwrap() as u32;

    for sig in [libc::SIGTERM, libc::SIGKILL] {
        d.stop(sig);
        assert!(alive(pid), "QEMU must outlive the daemon");
        d.spawn_process();
        let v = d.json(&["inspect", &id]);
        assert_eq!(v["state"], "running", "after signal {sig}: {v}");
        assert_eq!(v["pid"].as_u64(), Some(u64::from(pid)));
        let o = d.ok(&["exec", &id, "--", "cat", "/root/state"]);
        assert_eq!(o, "kept\n");
    }
    d.ok(&["rm", &id]);
    assert!(!alive(pid));
    assert!(d.sandbox_files(&id).is_empty());
}

/// With no daemon running, the CLI starts one itself.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn cli_starts_a_daemon_when_none_answers() {
    require_vm_prereqs();
    let dir = tempfile::Builder::new()
        .prefix("fvt-")
        .tempdir_in("/tmp")
        .unwrap();
    for sub in ["guest", "images"] {
        std::os::unix::fs::symlink(artifacts().join(sub), dir.path().join(sub)).unwrap();
    }
    let o = std::process::Command::new(BIN)
        .args(["--json", "info"])
        .env("FORKVM_HOME", dir.path())
        .env_remove("FORKVM_URL")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["accel"]["kind"]
            .as_str()
            .map(|k| k == "kvm" || k == "tcg"),
        Some(true)
    );
    assert!(!v["accel"]["reason"].as_str().unwrap().is_empty());
    let err = stderr(&o);
    let pid: i32 = err
        .split("pid ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("CLI did not say it started a daemon: {err}"));
    // SAFETY: stopping the daemon this test caused to be started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(wait_until(Duration::from_secs(10), || !alive(pid as u32)));
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn doctor_passes_on_a_set_up_host() {
    require_vm_prereqs();
    let o = std::process::Command::new(BIN)
        .args(["doctor"])
        .env("FORKVM_HOME", artifacts())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    for want in [
        "qemu",
        "mapped-ram",
        "x-ignore-shared",
        "rom=",
        "vmgenid",
        "accelerator",
        "guest kernel",
        "default image",
        "/dev/net/tun",
        "network namespaces",
        "userfaultfd",
        "daemon",
    ] {
        assert!(out.contains(want), "doctor output lacks {want}:\n{out}");
    }
    // A missing QEMU is a FAIL with the fix, and a non-zero exit.
    let o = std::process::Command::new(BIN)
        .args(["doctor"])
        .env("FORKVM_HOME", artifacts())
        .env("FORKVM_QEMU", "/nonexistent/qemu")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("FAIL  qemu"), "{}", stdout(&o));
}

/// Send QMP commands to a sandbox's QEMU (the test plays a hung guest).
fn qmp(d: &Daemon, id: &str, cmds: &[&str]) {
    use std::io::{BufRead, BufReader, Write};
    let p = d.home.join("sandboxes").join(id).join("qmp.sock");
    let s = std::os::unix::net::UnixStream::connect(p).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut line = String::new();
    r.read_line(&mut line).unwrap(); // greeting
    for c in std::iter::once(&"qmp_capabilities").chain(cmds) {
        writeln!(w, "{{\"execute\": \"{c}\"}}").unwrap();
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line.contains("\"return\"") || line.contains("\"error\"") {
                break;
            }
        }
    }
}

/// A guest that stops answering: exec fails with 504 and says the guest may
/// be hung, instead of hanging; once the guest runs again, exec works.
#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_hung_guest_gives_a_timeout_not_a_hang() {
    let d = shared();
    let sb = d.spawn();
    qmp(d, &sb.id, &["stop"]);
    let t = std::time::Instant::now();
    let o = d.run(&["exec", "--timeout", "1", &sb.id, "--", "true"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("did not answer") && err.contains("hung"),
        "{err}"
    );
    assert!(
        err.contains("guest_timeout") && err.contains("504"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(60));
    qmp(d, &sb.id, &["cont"]);
    assert_eq!(d.ok(&["exec", &sb.id, "--", "echo", "back"]), "back\n");
}
