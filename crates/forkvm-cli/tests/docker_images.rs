//! What Docker users expect of images (issue 31), with images made by
//! real tools (umoci, skopeo, GNU tar) and run in real VMs through the
//! `forkvm` CLI:
//!
//! * an `ENTRYPOINT` image run with arguments: they replace `Cmd`, not
//!   `Entrypoint`; `--entrypoint` overrides it; `forkvm exec ID` without a
//!   command runs the default command;
//! * a `WorkingDir` the layers lack exists in the guest;
//! * the guest's environment is the image's plus PATH and HOME only;
//! * a three-stage Dockerfile with `COPY --from` (a stage, an image),
//!   heredocs in `RUN` and `COPY`,
//!   `--target`, a stage the target does not need (it would fail), the
//!   context files' mtimes kept, no `/lost+found`;
//! * a `docker save` archive without `manifest.json` refused by import.
//!
//! The layer and format rules have unit tests in forkvm-image and
//! forkvm-build, and `crates/forkvm-image/tests/real_tools.rs` compares the
//! whiteout edge case with `umoci unpack`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Fail (never skip) when a tool is missing.
fn need(tools: &[&str]) {
    for t in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "these tests need {t}: run scripts/setup.sh (make test does)"
        );
    }
}

fn sh(cmd: &str, dir: &Path) -> String {
    let o = Command::new("bash")
        .args(["-c", cmd])
        .current_dir(dir)
        .output()
        .expect("bash");
    assert!(
        o.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A busybox-only root filesystem directory: /bin/busybox (static),
/// /bin/sh, /etc/passwd and /etc/group.
fn busybox_root(dir: &Path) -> PathBuf {
    need(&["busybox"]);
    let root = dir.join("bbroot");
    sh(
        &format!(
            "mkdir -p {r}/bin {r}/etc && cp /bin/busybox {r}/bin/ && ln -s busybox {r}/bin/sh && \
             printf 'root:x:0:0:root:/root:/bin/sh\\n' > {r}/etc/passwd && \
             printf 'root:x:0:\\n' > {r}/etc/group",
            r = root.display()
        ),
        dir,
    );
    root
}

/// The busybox root as a rootfs tarball.
fn busybox_tar(dir: &Path) -> PathBuf {
    let root = busybox_root(dir);
    sh(&format!("tar -C {} -cf bb.tar .", root.display()), dir);
    dir.join("bb.tar")
}

/// An OCI layout made with umoci: the busybox root, then
/// `Entrypoint ["/bin/busybox", "echo", "ep:"]`, `Cmd ["default"]`, a
/// `WorkingDir` no layer has, and `Env X=1`.
fn entrypoint_layout(dir: &Path) -> PathBuf {
    need(&["umoci"]);
    let root = busybox_root(dir);
    sh(
        &format!(
            "umoci init --layout oci && umoci new --image oci:ep && \
             tar -C {r} -cf layer.tar . && umoci raw add-layer --image oci:ep layer.tar && \
             umoci config --image oci:ep --config.entrypoint /bin/busybox \
               --config.entrypoint echo --config.entrypoint ep: --config.cmd default \
               --config.workingdir /made/by/forkvm --config.env X=1 \
               --config.env PATH=/bin",
            r = root.display()
        ),
        dir,
    );
    dir.join("oci")
}

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn an_entrypoint_image_takes_arguments_as_cmd_in_its_missing_workdir() {
    let d = shared();
    let t = tempfile::tempdir().unwrap();
    let oci = entrypoint_layout(t.path());
    d.ok(&[
        "image",
        "import",
        oci.to_str().unwrap(),
        "--name",
        "ep",
        "--replace",
    ]);
    // docker run IMAGE / docker run IMAGE ARGS
    assert_eq!(d.ok(&["run", "--image", "ep"]), "ep: default\n");
    assert_eq!(d.ok(&["run", "--image", "ep", "--", "a", "b"]), "ep: a b\n");
    // --entrypoint replaces it (and drops Cmd); the WorkingDir exists.
    assert_eq!(
        d.ok(&[
            "run",
            "--image",
            "ep",
            "--entrypoint",
            "/bin/busybox",
            "--",
            "pwd"
        ]),
        "/made/by/forkvm\n"
    );
    let st = d.ok(&[
        "run",
        "--image",
        "ep",
        "--entrypoint",
        "/bin/busybox",
        "--",
        "stat",
        "-c",
        "%U %a",
        "/made/by/forkvm",
    ]);
    assert_eq!(st, "root 755\n", "owned as runc makes it");
    // The environment: the image's, plus PATH (the image's here) and HOME;
    // nothing else (no LANG, no TERM, nothing from the kernel).
    let env = d.ok(&[
        "run",
        "--image",
        "ep",
        "--entrypoint",
        "/bin/busybox",
        "--",
        "env",
    ]);
    let mut names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    names.sort();
    assert_eq!(names, ["HOME", "PATH", "X"], "{env}");
    assert!(
        env.contains("PATH=/bin\n") && env.contains("X=1\n"),
        "{env}"
    );

    // exec follows the same rule; without a command it runs the default.
    let sb = Sandbox {
        d,
        id: d.ok(&["spawn", "--image", "ep"]).trim().to_string(),
    };
    let id = sb.id.clone();
    {
        assert_eq!(d.ok(&["exec", &id, "--", "x"]), "ep: x\n");
        assert_eq!(d.ok(&["exec", &id]), "ep: default\n");
        assert_eq!(
            d.ok(&[
                "exec",
                &id,
                "--entrypoint",
                "",
                "--",
                "/bin/busybox",
                "echo",
                "direct"
            ]),
            "direct\n"
        );
        // The API's argv is still a command run as it is.
        let out = d.json(&["exec", &id, "--entrypoint", "/bin/busybox", "--", "true"]);
        assert_eq!(out["exit_code"], 0, "{out}");
    }
}

#[test]
#[ignore = "needs the daemon: run with `make test`"]
fn a_docker_save_without_manifest_json_is_refused_by_import() {
    need(&["umoci", "skopeo", "tar"]);
    let d = shared();
    let t = tempfile::tempdir().unwrap();
    let oci = entrypoint_layout(t.path());
    sh(
        &format!(
            "skopeo copy -q oci:{o}:ep docker-archive:full.tar:x/ep:1 && mkdir unpacked && \
             tar -C unpacked -xf full.tar && rm unpacked/manifest.json && \
             tar -C unpacked -cf cut.tar .",
            o = oci.display()
        ),
        t.path(),
    );
    let cut = t.path().join("cut.tar");
    let o = d.run(&["image", "import", cut.to_str().unwrap(), "--name", "cut"]);
    assert!(!o.status.success(), "imported: {}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("`docker save` archive without its manifest.json"),
        "{e}"
    );
    assert!(!d.home.join("images/cut").exists());
    // The whole archive imports.
    let full = t.path().join("full.tar");
    d.ok(&[
        "image",
        "import",
        full.to_str().unwrap(),
        "--name",
        "uncut",
        "--replace",
    ]);
    d.ok(&["image", "rm", "uncut"]);
}

const THREE_STAGES: &str = "\
FROM bb-ms AS build
WORKDIR /src
ENV WHO=forkvm
COPY app.txt ./
RUN <<EOF
mkdir -p out
/bin/busybox tr a-z A-Z < app.txt > out/APP
echo built > out/stamp
EOF
COPY <<NOTE /src/out/note
made by $WHO
NOTE

FROM bb-ms AS unused
RUN /bin/busybox sh -c 'echo this stage must not run; exit 9'

FROM bb-ms AS test
COPY --from=build /src/out /check/
RUN /bin/busybox grep -q HELLO /check/APP

FROM build AS final
COPY --from=test /check/stamp /usr/local/bin/stamp-copy
COPY --from=bb-ms /etc/passwd /copied/
CMD [\"/bin/busybox\", \"cat\", \"/src/out/APP\", \"/usr/local/bin/stamp-copy\", \"/copied/passwd\", \"/src/out/note\"]
";

#[test]
#[ignore = "boots microVMs: run with `make test`"]
fn a_three_stage_dockerfile_builds_its_target() {
    let d = shared();
    let t = tempfile::tempdir().unwrap();
    let tar = busybox_tar(t.path());
    d.ok(&[
        "image",
        "import",
        tar.to_str().unwrap(),
        "--name",
        "bb-ms",
        "--replace",
    ]);
    let ctx = t.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("app.txt"), "hello\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(ctx.join("app.txt"))
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000))
        .unwrap();
    std::fs::write(ctx.join("Dockerfile"), THREE_STAGES).unwrap();
    let ctxs = ctx.to_str().unwrap();
    let out = d.ok(&["--json", "image", "build", "-t", "ms", ctxs]);
    assert!(
        out.contains("not needed by the target were skipped"),
        "{out}"
    );
    assert!(!out.contains("must not run"), "{out}");
    assert_eq!(
        d.ok(&["run", "--image", "ms"]),
        "HELLO\nbuilt\nroot:x:0:0:root:/root:/bin/sh\nmade by forkvm\n"
    );
    // The final stage is FROM build: its WORKDIR and files; COPY kept the
    // context file's mtime; no /lost+found.
    let o = d.ok(&[
        "run",
        "--image",
        "ms",
        "--",
        "/bin/busybox",
        "sh",
        "-c",
        "pwd; /bin/busybox stat -c %Y app.txt; /bin/busybox ls -a /",
    ]);
    let mut lines = o.lines();
    assert_eq!(lines.next(), Some("/src"), "{o}");
    assert_eq!(lines.next(), Some("1600000000"), "{o}");
    assert!(!o.contains("lost+found"), "{o}");
    // --target builds a middle stage.
    d.ok(&["image", "build", "-t", "ms-test", "--target", "test", ctxs]);
    assert_eq!(
        d.ok(&[
            "run",
            "--image",
            "ms-test",
            "--",
            "/bin/busybox",
            "cat",
            "/check/APP"
        ]),
        "HELLO\n"
    );
    let o = d.run(&["image", "build", "-t", "ms-x", "--target", "nope", ctxs]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("build, unused, test, final"),
        "{}",
        stderr(&o)
    );
    // A rebuild comes from the cache, every stage's steps.
    let out = d.ok(&["--json", "image", "build", "-t", "ms", ctxs]);
    let steps: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["type"] == "step")
        .collect();
    assert!(
        !steps.is_empty() && steps.iter().all(|s| s["cached"] == true),
        "{out}"
    );
    for img in ["ms", "ms-test"] {
        d.ok(&["image", "rm", img]);
    }
}
