//! Background processes, PTYs, filesystem operations, watches and archives
//! against real microVMs (docs/processes.md), through the REST client and
//! the CLI. Run with `make test` (which passes `--include-ignored`).
//!
//! Every test uses the binary's shared daemon, so the image's boot template
//! is made once and every sandbox here is a clone of it.

mod common;

use std::io::Read;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use common::*;
use forkvm_api::{
    BranchMode, BranchRequest, Client, ClientError, FileKind, FsOp, ProcessEvent, PtySize,
    StartProcess, WatchEvent,
};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn status(e: &ClientError) -> u16 {
    match e {
        ClientError::Api { status, .. } => *status,
        other => panic!("expected an API error, got {other}"),
    }
}

/// The text of a process's output events (stdout, stderr and PTY).
fn text(ev: &ProcessEvent) -> String {
    let d = match ev {
        ProcessEvent::Stdout { data, .. }
        | ProcessEvent::Stderr { data, .. }
        | ProcessEvent::Pty { data, .. } => data,
        _ => return String::new(),
    };
    let b = base64::engine::general_purpose::STANDARD
        .decode(d)
        .expect("base64");
    String::from_utf8_lossy(&b).into_owned()
}

/// Attach and collect output until `until` appears in it (then stop) or
/// the process ends; returns the output and the end event, if any. Bounded
/// by `secs`.
async fn attach_until(
    c: &Client,
    id: &str,
    process: &str,
    until: &str,
    secs: u64,
) -> (String, Option<ProcessEvent>) {
    let mut out = String::new();
    let r = tokio::time::timeout(
        Duration::from_secs(secs),
        c.attach_process(id, process, |ev| {
            out.push_str(&text(ev));
            !out.contains(until)
        }),
    )
    .await;
    match r {
        Ok(Ok(end)) => (out, end),
        Ok(Err(e)) => panic!("attach to {process} failed: {e}"),
        Err(_) => panic!("attach to {process}: no {until:?} within {secs} s; got {out:?}"),
    }
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn background_processes_replay_their_output_and_take_stdin_and_signals() {
    let d = shared();
    let sb = d.spawn();
    let id = sb.id.clone();
    let c = d.client();
    rt().block_on(async {
        // A background process outlives its request; its output is kept.
        let started = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&[
                        "sh",
                        "-c",
                        "echo one; echo two >&2; sleep 1; echo three; sleep 1000",
                    ]),
                    tag: Some("bg".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(started.pid > 1);
        assert_eq!(started.tag.as_deref(), Some("bg"));
        // Attach twice, by tag and by pid: each replays from the start.
        for p in ["bg".to_string(), started.pid.to_string()] {
            let (out, end) = attach_until(&c, &id, &p, "three", 60).await;
            assert!(end.is_none(), "still running");
            // stdout and stderr are two pipes read by two threads in the
            // guest: their relative order is not kept, only each one's own.
            let (one, three) = (out.find("one\n"), out.find("three\n"));
            assert!(
                one.is_some() && out.contains("two\n") && one < three,
                "replayed output: {out:?}"
            );
        }
        let l = c.list_processes(&id).await.unwrap();
        let bg = l
            .processes
            .iter()
            .find(|p| p.pid == started.pid)
            .expect("listed");
        assert_eq!(bg.tag.as_deref(), Some("bg"));
        assert_eq!(bg.argv[0], "sh");

        // stdin: `cat` echoes what is written, and ends once it is closed.
        let cat = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&["cat"]),
                    stdin: true,
                    tag: Some("cat".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        c.write_stdin(&id, "cat", Bytes::from_static(b"hello cat\n"))
            .await
            .unwrap();
        let (out, _) = attach_until(&c, &id, "cat", "hello cat", 60).await;
        assert_eq!(out, "hello cat\n");
        c.close_stdin(&id, &cat.pid.to_string()).await.unwrap();
        let (out, end) = attach_until(&c, &id, "cat", "never printed", 60).await;
        assert_eq!(out, "hello cat\n");
        match end {
            Some(ProcessEvent::End {
                exit_code: 0,
                exited: true,
                ..
            }) => {}
            other => panic!("cat should exit 0 once its stdin closes: {other:?}"),
        }
        // A closed or missing stdin is refused.
        let e = c
            .write_stdin(&id, "bg", Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert_eq!(status(&e), 400, "{e}");

        // SIGTERM ends the whole group; a late attach still gets the end.
        c.signal_process(&id, "bg", 15).await.unwrap();
        let (_, end) = attach_until(&c, &id, "bg", "never printed", 60).await;
        match end {
            Some(ProcessEvent::End {
                exited: false,
                signal: Some(15),
                ..
            }) => {}
            other => panic!("bg should end by SIGTERM: {other:?}"),
        }
        // Kill.
        let sl = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&["sleep", "1000"]),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let pid = sl.pid.to_string();
        c.kill_process(&id, &pid).await.unwrap();
        let (_, end) = attach_until(&c, &id, &pid, "never printed", 60).await;
        assert!(
            matches!(
                end,
                Some(ProcessEvent::End {
                    signal: Some(9),
                    ..
                })
            ),
            "{end:?}"
        );
        // An ended process leaves the list once its end is recorded.
        let mut listed = true;
        for _ in 0..100 {
            let l = c.list_processes(&id).await.unwrap();
            listed = l
                .processes
                .iter()
                .any(|p| p.pid == sl.pid || p.pid == started.pid);
            if !listed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!listed, "ended processes are not listed");

        // Bad input and unknown processes.
        let e = c
            .attach_process(&id, "4000000", |_| true)
            .await
            .unwrap_err();
        assert_eq!(status(&e), 404, "{e}");
        // The hint names the action, which the CLI words as its command.
        match &e {
            forkvm_api::ClientError::Api { hint: Some(h), .. } => {
                assert_eq!(h.action, forkvm_api::types::HintAction::ListProcesses);
                assert_eq!(h.target.as_deref(), Some(id.as_str()));
            }
            other => panic!("no hint: {other}"),
        }
        assert!(
            e.to_string()
                .contains("list the running processes of sandbox"),
            "{e}"
        );
        let e = c.signal_process(&id, "nope", 15).await.unwrap_err();
        assert_eq!(status(&e), 404, "{e}");
        let e = c.signal_process(&id, "nope", 0).await.unwrap_err();
        assert_eq!(status(&e), 400, "{e}");
        let e = c.kill_process(&id, "a b").await.unwrap_err();
        assert_eq!(status(&e), 400, "{e}");
        let e = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&["true"]),
                    tag: Some("123".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(status(&e), 400, "{e}");
        let e = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&["no-such-program-here"]),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!([400, 404].contains(&status(&e)), "{e}");
        let e = c.list_processes("sb-000000000000").await.unwrap_err();
        assert_eq!(status(&e), 404, "{e}");
    });

    // The CLI: start, list, attach (exit code passed through), stdin.
    let pid = d
        .ok(&[
            "proc",
            "start",
            &id,
            "--tag",
            "cli",
            "-i",
            "--",
            "sh",
            "-c",
            "read x; echo got $x; exit 7",
        ])
        .trim()
        .to_string();
    assert!(pid.parse::<u32>().is_ok(), "{pid:?}");
    assert!(d.ok(&["proc", "ls", &id]).contains("cli"));
    d.ok(&["proc", "stdin", &id, "cli", "word\n"]);
    let o = d.run(&["proc", "attach", &id, "cli"]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "got word\n");
    let o = d.run(&["proc", "signal", &id, "cli", "BOGUS"]);
    assert!(!o.status.success());
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_pty_gets_output_and_resizes_and_a_streamed_start_ends_with_the_exit_code() {
    let d = shared();
    let sb = d.spawn();
    let id = sb.id.clone();
    let c = d.client();
    rt().block_on(async {
        let p = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&["sh"]),
                    pty: Some(PtySize { cols: 80, rows: 24 }),
                    tag: Some("tty".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let l = c.list_processes(&id).await.unwrap();
        let listed = l.processes.iter().find(|x| x.pid == p.pid).unwrap();
        assert_eq!(listed.pty, Some(PtySize { cols: 80, rows: 24 }));
        c.write_stdin(&id, "tty", Bytes::from_static(b"stty size\n"))
            .await
            .unwrap();
        let (out, _) = attach_until(&c, &id, "tty", "24 80", 60).await;
        assert!(out.contains("24 80"), "{out:?}");
        c.resize_pty(
            &id,
            "tty",
            PtySize {
                cols: 100,
                rows: 40,
            },
        )
        .await
        .unwrap();
        c.write_stdin(&id, "tty", Bytes::from_static(b"stty size\n"))
            .await
            .unwrap();
        let (out, _) = attach_until(&c, &id, "tty", "40 100", 60).await;
        assert!(out.contains("40 100"), "{out:?}");
        // Closing a PTY's stdin is refused with what to do instead.
        let e = c.close_stdin(&id, "tty").await.unwrap_err();
        assert_eq!(status(&e), 400, "{e}");
        let e = c
            .resize_pty(&id, "tty", PtySize { cols: 0, rows: 40 })
            .await
            .unwrap_err();
        assert_eq!(status(&e), 400, "{e}");
        c.write_stdin(&id, "tty", Bytes::from_static(b"exit 5\n"))
            .await
            .unwrap();
        let (_, end) = attach_until(&c, &id, "tty", "never printed", 60).await;
        assert!(
            matches!(end, Some(ProcessEvent::End { exit_code: 5, .. })),
            "{end:?}"
        );
        // A process without a PTY cannot be resized.
        let q = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&["sleep", "100"]),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let e = c
            .resize_pty(&id, &q.pid.to_string(), PtySize { cols: 10, rows: 10 })
            .await
            .unwrap_err();
        assert_eq!(status(&e), 400, "{e}");
        c.kill_process(&id, &q.pid.to_string()).await.unwrap();

        // Streamed start: start, output, end with the exit code.
        let mut events = Vec::new();
        let end = c
            .start_process_stream(
                &id,
                &StartProcess {
                    argv: argv(&["sh", "-c", "echo streamed; echo oops >&2; exit 3"]),
                    env: [("X".to_string(), "y".to_string())].into(),
                    cwd: Some("/tmp".into()),
                    ..Default::default()
                },
                |ev| {
                    events.push(ev.clone());
                    true
                },
            )
            .await
            .unwrap();
        assert!(
            matches!(events[0], ProcessEvent::Start { .. }),
            "{events:?}"
        );
        let out: String = events.iter().map(text).collect();
        assert!(
            out.contains("streamed\n") && out.contains("oops\n"),
            "{out:?}"
        );
        assert!(
            matches!(
                end,
                Some(ProcessEvent::End {
                    exit_code: 3,
                    exited: true,
                    ..
                })
            ),
            "{end:?}"
        );
    });
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn every_filesystem_operation_and_a_watch_sees_a_create_and_a_delete() {
    let d = shared();
    let sb = d.spawn();
    let id = sb.id.clone();
    let c = d.client();
    rt().block_on(async {
        let made = c.make_dir(&id, "/tmp/t/a/b").await.unwrap();
        assert!(!made.existed);
        assert_eq!(made.entry.kind, FileKind::Dir);
        assert!(c.make_dir(&id, "/tmp/t/a/b").await.unwrap().existed);
        c.write_file(
            &id,
            "/tmp/t/a/f.txt",
            Some(0o640),
            Bytes::from_static(b"hi"),
        )
        .await
        .unwrap();
        let st = c.stat_file(&id, "/tmp/t/a/f.txt").await.unwrap();
        assert_eq!(
            (
                st.kind,
                st.size,
                st.mode,
                st.name.as_str(),
                st.owner.as_str()
            ),
            (FileKind::File, 2, 0o640, "f.txt", "root")
        );
        assert_eq!(st.permissions, "-rw-r-----");
        assert!(c.file_exists(&id, "/tmp/t/a/f.txt").await.unwrap());
        assert!(!c.file_exists(&id, "/tmp/nope").await.unwrap());
        let e = c.stat_file(&id, "/tmp/nope").await.unwrap_err();
        assert_eq!(status(&e), 404, "{e}");

        let top = c.list_dir(&id, "/tmp/t", 1).await.unwrap();
        let names: Vec<_> = top.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(names, ["/tmp/t/a"]);
        let deep = c.list_dir(&id, "/tmp/t", 3).await.unwrap();
        let mut paths: Vec<_> = deep.entries.iter().map(|e| e.path.clone()).collect();
        paths.sort();
        assert_eq!(paths, ["/tmp/t/a", "/tmp/t/a/b", "/tmp/t/a/f.txt"]);
        let e = c.list_dir(&id, "/tmp/t", 0).await.unwrap_err();
        assert_eq!(status(&e), 400, "{e}");

        let moved = c
            .move_file(&id, "/tmp/t/a/f.txt", "/tmp/t/g.txt")
            .await
            .unwrap();
        assert_eq!(moved.path, "/tmp/t/g.txt");
        assert!(!c.file_exists(&id, "/tmp/t/a/f.txt").await.unwrap());
        assert_eq!(&c.read_file(&id, "/tmp/t/g.txt").await.unwrap()[..], b"hi");

        c.remove_file(&id, "/tmp/t/a").await.unwrap();
        assert!(!c.file_exists(&id, "/tmp/t/a").await.unwrap());
        let e = c.remove_file(&id, "/tmp/t/a").await.unwrap_err();
        assert_eq!(status(&e), 404, "{e}");
        for bad in ["/", "relative/path"] {
            let e = c.remove_file(&id, bad).await.unwrap_err();
            assert_eq!(status(&e), 400, "{bad}: {e}");
        }

        // Several files at once: up, then down again.
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in [("x/one.txt", &b"first"[..]), ("two.bin", &[0u8, 1, 2][..])] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        let up = c
            .upload_archive(&id, "/tmp/up", Bytes::from(b.into_inner().unwrap()))
            .await
            .unwrap();
        assert_eq!((up.entries, up.bytes), (2, 8));
        let tar = c
            .download_archive(&id, &["/tmp/up/x", "/tmp/up/two.bin"])
            .await
            .unwrap();
        let mut got = std::collections::BTreeMap::new();
        let mut a = tar::Archive::new(&tar[..]);
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            got.insert(name.trim_end_matches('/').to_string(), data);
        }
        assert_eq!(got["tmp/up/x/one.txt"], b"first");
        assert_eq!(got["tmp/up/two.bin"], [0, 1, 2]);
        assert!(got.contains_key("tmp/up/x"), "{:?}", got.keys());
        let e = c.download_archive(&id, &["/tmp/none"]).await.unwrap_err();
        assert_eq!(status(&e), 404, "{e}");
        let e = c.download_archive(&id, &[]).await.unwrap_err();
        assert_eq!(status(&e), 400, "{e}");

        // A streamed watch sees a create and a delete.
        c.make_dir(&id, "/tmp/w").await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let c2 = c.clone();
        let id2 = id.clone();
        let watch = tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut seen = Vec::new();
            c2.watch_dir(&id2, "/tmp/w", false, |ev| {
                match ev {
                    WatchEvent::Start => {
                        if let Some(t) = tx.take() {
                            let _ = t.send(());
                        }
                    }
                    WatchEvent::Events { events, .. } => {
                        seen.extend(events.iter().map(|e| (e.op, e.name.clone())));
                    }
                    _ => {}
                }
                !seen
                    .iter()
                    .any(|(op, n)| *op == FsOp::Remove && n == "new.txt")
            })
            .await
            .map(|()| seen)
        });
        rx.await.expect("the watch started");
        c.write_file(&id, "/tmp/w/new.txt", None, Bytes::from_static(b"x"))
            .await
            .unwrap();
        c.remove_file(&id, "/tmp/w/new.txt").await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(60), watch)
            .await
            .expect("the watch saw the delete within 60 s")
            .unwrap()
            .unwrap();
        // The agent writes files through a temp file and a rename, so the
        // new name may show up as a create or as the rename's target.
        assert!(
            seen.iter()
                .any(|(op, n)| *op == FsOp::Create && n == "new.txt"),
            "{seen:?}"
        );

        // The polled form.
        let w = c.create_watcher(&id, "/tmp/w", false).await.unwrap();
        c.make_dir(&id, "/tmp/w/sub").await.unwrap();
        let mut events = Vec::new();
        for _ in 0..100 {
            events.extend(c.poll_watcher(&id, &w.watcher_id).await.unwrap().events);
            if events
                .iter()
                .any(|e| e.name == "sub" && e.op == FsOp::Create)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(events.iter().any(|e| e.name == "sub"), "{events:?}");
        c.remove_watcher(&id, &w.watcher_id).await.unwrap();
        let e = c.poll_watcher(&id, &w.watcher_id).await.unwrap_err();
        assert_eq!(status(&e), 404, "{e}");
    });

    // The CLI.
    d.ok(&["fs", "mkdir", &id, "/tmp/cli/d"]);
    assert!(d.ok(&["fs", "ls", &id, "/tmp/cli"]).contains("/tmp/cli/d"));
    d.ok(&["fs", "mv", &id, "/tmp/cli/d", "/tmp/cli/e"]);
    assert!(d
        .ok(&["fs", "stat", &id, "/tmp/cli/e"])
        .contains("type: dir"));
    assert_eq!(
        d.run(&["fs", "exists", &id, "/tmp/cli/d"]).status.code(),
        Some(1)
    );
    d.ok(&["fs", "rm", &id, "/tmp/cli"]);
    assert_eq!(
        d.run(&["fs", "exists", &id, "/tmp/cli"]).status.code(),
        Some(1)
    );
    let o = d.run(&["fs", "download", &id, "/tmp/up/two.bin"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut a = tar::Archive::new(&o.stdout[..]);
    let names: Vec<String> = a
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert!(names.contains(&"tmp/up/two.bin".to_string()), "{names:?}");
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_branch_child_attaches_to_the_process_it_inherited() {
    let d = shared();
    let sb = d.spawn();
    let id = sb.id.clone();
    let c = d.client();
    let child = rt().block_on(async {
        let p = c
            .start_process(
                &id,
                &StartProcess {
                    argv: argv(&[
                        "sh",
                        "-c",
                        "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done",
                    ]),
                    tag: Some("ticker".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        attach_until(&c, &id, "ticker", "tick 3\n", 60).await;
        // A stream open on the parent across the branch keeps working.
        let c2 = c.clone();
        let id2 = id.clone();
        let open = tokio::spawn(async move {
            let mut out = String::new();
            c2.attach_process(&id2, "ticker", |ev| {
                out.push_str(&text(ev));
                !out.contains("tick 60\n")
            })
            .await
            .map(|_| out)
        });
        let r = c
            .branch(
                &id,
                &BranchRequest {
                    mode: Some(BranchMode::Diff),
                    count: Some(1),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let child = r.children[0].id.clone();
        let guard = Sandbox {
            d,
            id: child.clone(),
        };

        // The child lists the process it inherited, with the same pid.
        let l = c.list_processes(&child).await.unwrap();
        let inherited = l
            .processes
            .iter()
            .find(|x| x.tag.as_deref() == Some("ticker"))
            .unwrap_or_else(|| panic!("the child lists the ticker: {l:?}"));
        assert_eq!(inherited.pid, p.pid);
        // It replays the output from before the branch and goes on.
        let (out, end) = attach_until(&c, &child, "ticker", "tick 40\n", 120).await;
        assert!(end.is_none());
        assert!(out.starts_with("tick 0\ntick 1\n"), "{out:?}");
        // The parent's process is its own: killing the child's leaves it.
        c.kill_process(&child, "ticker").await.unwrap();
        let (out, _) = attach_until(&c, &id, "ticker", "tick 45\n", 120).await;
        assert!(out.starts_with("tick 0\n"), "{out:?}");
        let out = tokio::time::timeout(Duration::from_secs(120), open)
            .await
            .expect("the parent's open stream goes on")
            .unwrap()
            .unwrap();
        assert!(out.contains("tick 60\n"), "{out:?}");
        let mut left = true;
        for _ in 0..100 {
            let l = c.list_processes(&child).await.unwrap();
            left = l.processes.iter().any(|x| x.pid == p.pid);
            if !left {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!left, "the child's killed copy is no longer listed");
        (child, guard)
    });
    let (child, _guard) = child;
    // The CLI in the child: the inherited process is listed there (killed
    // above, so not any more) and the parent's is.
    assert!(d.ok(&["proc", "ls", &id]).contains("ticker"));
    assert!(!d.ok(&["proc", "ls", &child]).contains("ticker"));
}
