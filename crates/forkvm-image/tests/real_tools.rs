//! Images made by real tools, imported and installed: an OCI layout built
//! with `umoci` (two layers, the second with a whiteout), copied by
//! `skopeo` to a `docker save` style archive and to an OCI archive, and a
//! rootfs tarball made by GNU tar with xattrs. Each is installed and its
//! root disk read back with `debugfs`. Docker's edge cases (issue 31): a
//! layer that recreates a directory it also whites out, compared with
//! `umoci unpack`; a `docker save` archive (skopeo's) stripped of its
//! `manifest.json`, refused; a `WorkingDir` the layers lack (set with
//! `umoci config` and `buildah config`), created.
//!
//! Needs root (ownership, device nodes, file capabilities) and the tools
//! `scripts/setup.sh` installs; a missing tool fails the test, naming it.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use forkvm_image::archive::{import_source, import_source_ref, ArchiveFormat};
use forkvm_image::blobs::BlobStore;
use forkvm_image::ext4::find_tool;
use forkvm_image::install::{install_image, list_images, InstallOptions, ROOTFS};
use forkvm_image::meta::ImageSource;
use forkvm_image::progress::NoProgress;

/// A capability set granting CAP_NET_BIND_SERVICE, effective (what
/// `setcap cap_net_bind_service+ep` writes).
const CAP: [u8; 20] = [1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

fn need(tool: &str) -> PathBuf {
    find_tool(tool).unwrap_or_else(|| {
        panic!("{tool} is not installed: run scripts/setup.sh (it installs umoci, skopeo, busybox-static and e2fsprogs)")
    })
}

fn busybox() -> PathBuf {
    let p = PathBuf::from("/bin/busybox");
    assert!(
        p.is_file(),
        "/bin/busybox is missing: run scripts/setup.sh (busybox-static)"
    );
    p
}

fn run(tool: &str, args: &[&str]) -> String {
    let o = Command::new(need(tool)).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{tool} {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn debugfs(img: &Path, req: &str) -> String {
    run("debugfs", &["-R", req, img.to_str().unwrap()])
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Fill a root: busybox with a symlink and a hardlink to it, a setuid
/// copy, a copy with a file capability, a user's file, /tmp, /dev/null.
fn populate(r: &Path) {
    for d in ["bin", "etc", "usr/bin", "tmp", "home/app", "dev"] {
        fs::create_dir_all(r.join(d)).unwrap();
    }
    fs::copy(busybox(), r.join("bin/busybox")).unwrap();
    symlink("busybox", r.join("bin/sh")).unwrap();
    fs::hard_link(r.join("bin/busybox"), r.join("bin/busybox-hard")).unwrap();
    fs::write(r.join("etc/hello"), "hello\n").unwrap();
    fs::copy(busybox(), r.join("usr/bin/suid")).unwrap();
    fs::set_permissions(r.join("usr/bin/suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::copy(busybox(), r.join("usr/bin/pinger")).unwrap();
    xattr::set(r.join("usr/bin/pinger"), "security.capability", &CAP).unwrap();
    fs::set_permissions(r.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(r.join("home/app/file"), "mine\n").unwrap();
    for p in ["home/app", "home/app/file"] {
        std::os::unix::fs::chown(r.join(p), Some(1000), Some(1000)).unwrap();
    }
    let st = Command::new("mknod")
        .args([s(&r.join("dev/null")), "c", "1", "3"])
        .status()
        .unwrap();
    assert!(st.success(), "mknod failed (these tests need root)");
}

/// What every image made from [`populate`] must show, `deleted` telling
/// whether /etc/hello was whited out by a second layer.
fn check_disk(disk: &Path, deleted: bool) {
    let bb = fs::metadata(busybox()).unwrap().len();
    let st = debugfs(disk, "stat /bin/busybox");
    assert!(st.contains(&format!("Size: {bb}")), "{st}");
    assert!(st.contains("Links: 2"), "hardlink lost: {st}");
    let sh = debugfs(disk, "stat /bin/sh");
    assert!(
        sh.contains("Type: symlink") && sh.contains("\"busybox\""),
        "{sh}"
    );
    let suid = debugfs(disk, "stat /usr/bin/suid");
    assert!(suid.contains("Mode:  04755"), "{suid}");
    let caps = debugfs(disk, "ea_list /usr/bin/pinger");
    assert!(
        caps.contains("security.capability (20) = 01 00 00 02 00 04 00 00"),
        "{caps}"
    );
    let f = debugfs(disk, "stat /home/app/file");
    assert!(
        f.contains("User:  1000") && f.contains("Group:  1000"),
        "{f}"
    );
    assert!(debugfs(disk, "stat /tmp").contains("Mode:  01777"));
    let null = debugfs(disk, "stat /dev/null");
    assert!(null.contains("Device major/minor number: 01:03"), "{null}");
    for d in ["/proc", "/sys", "/run"] {
        assert!(
            debugfs(disk, &format!("stat {d}")).contains("Type: directory"),
            "{d}"
        );
    }
    let etc = debugfs(disk, "ls /etc");
    if deleted {
        assert!(!etc.contains("hello") && etc.contains("second"), "{etc}");
        assert!(debugfs(disk, "cat /etc/second").contains("two"));
    } else {
        assert!(etc.contains("hello"), "{etc}");
    }
}

struct Env {
    t: tempfile::TempDir,
    store: BlobStore,
}

impl Env {
    fn new() -> Env {
        let t = tempfile::tempdir().unwrap();
        let store = BlobStore::open(t.path().join("blobs")).unwrap();
        Env { t, store }
    }

    fn p(&self, n: &str) -> PathBuf {
        self.t.path().join(n)
    }

    /// Import `src` and install it as `name`; returns its root disk.
    fn install(&self, name: &str, src: &Path, want: ArchiveFormat) -> PathBuf {
        let (r, format) = import_source_ref(src, None, &self.store, &NoProgress).unwrap();
        assert_eq!(format, want);
        let m = install_image(
            &self.p("images"),
            name,
            &r,
            &self.store,
            ImageSource::Import {
                format: format.as_str().into(),
                file: s(src).into(),
            },
            &InstallOptions::default(),
            &NoProgress,
        )
        .unwrap();
        assert_eq!(m.layers.len(), r.layers.len());
        self.p("images").join(name).join(ROOTFS)
    }
}

#[test]
fn umoci_layout_skopeo_archives() {
    for t in ["umoci", "skopeo", "mkfs.ext4", "debugfs"] {
        need(t);
    }
    let e = Env::new();
    let (oci, bundle) = (e.p("oci"), e.p("bundle"));
    let image = format!("{}:base", s(&oci));
    run("umoci", &["init", "--layout", s(&oci)]);
    run("umoci", &["new", "--image", &image]);
    run("umoci", &["unpack", "--image", &image, s(&bundle)]);
    let root = bundle.join("rootfs");
    populate(&root);
    run(
        "umoci",
        &["repack", "--refresh-bundle", "--image", &image, s(&bundle)],
    );
    fs::remove_file(root.join("etc/hello")).unwrap();
    fs::write(root.join("etc/second"), "two\n").unwrap();
    run("umoci", &["repack", "--image", &image, s(&bundle)]);
    run(
        "umoci",
        &[
            "config",
            "--image",
            &image,
            "--config.cmd=/bin/sh",
            "--config.env=A=1",
            "--config.workingdir=/home/app",
            "--config.exposedports=8080/tcp",
            "--config.user=1000",
        ],
    );
    let docker = e.p("docker.tar");
    let ociar = e.p("oci-archive.tar");
    let oci_src = format!("oci:{}:base", s(&oci));
    run(
        "skopeo",
        &[
            "copy",
            &oci_src,
            &format!("docker-archive:{}:x/y:t", s(&docker)),
        ],
    );
    run(
        "skopeo",
        &["copy", &oci_src, &format!("oci-archive:{}:base", s(&ociar))],
    );

    let r = import_source(&oci, &e.store, &NoProgress).unwrap();
    assert_eq!(r.config.cmd, ["/bin/sh"]);
    assert_eq!(r.config.env, ["A=1"]);
    assert_eq!(r.config.working_dir.as_deref(), Some("/home/app"));
    assert_eq!(r.config.user.as_deref(), Some("1000"));
    assert_eq!(r.config.exposed_ports, ["8080/tcp"]);
    assert!(r.manifest_digest.is_some());

    for (name, src, format) in [
        ("from-oci", &oci, ArchiveFormat::OciLayout),
        ("from-oci-archive", &ociar, ArchiveFormat::OciArchive),
        ("from-docker", &docker, ArchiveFormat::DockerArchive),
    ] {
        let disk = e.install(name, src, format);
        check_disk(&disk, true);
    }
    let names: Vec<String> = list_images(&e.p("images"))
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(names, ["from-docker", "from-oci", "from-oci-archive"]);
    // The docker archive holds uncompressed layers: its images' blobs are
    // the diff ids, so the store now has both forms.
    let d = import_source(&docker, &e.store, &NoProgress).unwrap();
    assert_eq!(d.config.cmd, ["/bin/sh"]);
    assert_eq!(d.layers.len(), r.layers.len());
    assert_ne!(d.layers[0].digest, r.layers[0].digest);
}

#[test]
fn gnu_tar_rootfs_with_xattrs() {
    for t in ["tar", "mkfs.ext4", "debugfs"] {
        need(t);
    }
    let e = Env::new();
    let root = e.p("rootfs");
    populate(&root);
    for (name, flag) in [("r.tar.gz", "-z"), ("r.tar.zst", "--zstd"), ("r.tar", "")] {
        let out = e.p(name);
        let mut args = vec![
            "--xattrs",
            "--xattrs-include=*",
            "--numeric-owner",
            "-C",
            s(&root),
            "-cf",
            s(&out),
        ];
        if !flag.is_empty() {
            args.insert(0, flag);
        }
        args.push(".");
        if flag == "--zstd" {
            need("zstd");
        }
        run("tar", &args);
        let disk = e.install(&name.replace('.', "-"), &out, ArchiveFormat::RootfsTar);
        check_disk(&disk, false);
    }
}

/// buildah (its own storage in the test's directory, vfs driver): a base
/// image from scratch and a second image on it (a second layer, added with
/// `buildah copy`), committed as an OCI archive and as a docker archive.
#[test]
fn buildah_images() {
    for t in ["buildah", "mkfs.ext4", "debugfs"] {
        need(t);
    }
    let e = Env::new();
    let (store_root, run_root) = (e.p("containers"), e.p("containers-run"));
    let b = |args: &[&str]| {
        let mut all = vec![
            "--root",
            s(&store_root),
            "--runroot",
            s(&run_root),
            "--storage-driver",
            "vfs",
        ];
        all.extend_from_slice(args);
        run("buildah", &all).trim().to_string()
    };
    // With vfs, a container's "mount" is a plain directory: fill it
    // directly (buildah copy would chown everything to root).
    let c = b(&["from", "scratch"]);
    populate(Path::new(&b(&["mount", &c])));
    b(&[
        "config",
        "--cmd",
        "/bin/sh -c 'echo hi'",
        "--env",
        "B=2",
        "--port",
        "9000",
        &c,
    ]);
    b(&["commit", &c, "localhost/base:1"]);
    let c2 = b(&["from", "localhost/base:1"]);
    let ctx2 = e.p("ctx2");
    fs::create_dir_all(ctx2.join("etc")).unwrap();
    fs::write(ctx2.join("etc/second"), "two\n").unwrap();
    b(&["copy", &c2, s(&ctx2), "/"]);
    let (oci, docker) = (e.p("b-oci.tar"), e.p("b-docker.tar"));
    b(&["commit", &c2, &format!("oci-archive:{}:latest", s(&oci))]);
    b(&[
        "commit",
        "--format",
        "docker",
        &c2,
        &format!("docker-archive:{}:b:latest", s(&docker)),
    ]);
    b(&["rm", "--all"]);
    b(&["rmi", "--all", "--force"]);

    for (name, src, format) in [
        ("buildah-oci", &oci, ArchiveFormat::OciArchive),
        ("buildah-docker", &docker, ArchiveFormat::DockerArchive),
    ] {
        let r = import_source(src, &e.store, &NoProgress).unwrap();
        assert_eq!(r.layers.len(), 2, "{name}");
        assert_eq!(r.config.env.last().map(String::as_str), Some("B=2"));
        assert_eq!(r.config.exposed_ports, ["9000/tcp"]);
        assert_eq!(
            r.config.cmd.last().map(String::as_str),
            Some("echo hi"),
            "{:?}",
            r.config
        );
        let disk = e.install(name, src, format);
        check_disk(&disk, false);
        assert!(debugfs(&disk, "cat /etc/second").contains("two"));
    }
}

/// The names under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            if p.symlink_metadata().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A second layer holding `dir/`, `dir/new` and then `.wh.dir` (in that
/// order, as GNU tar writes them when told to): the lower layer's `dir`
/// contents are hidden, this layer's stay. forkvm's root disk must hold
/// exactly what `umoci unpack` makes of the same layout.
#[test]
fn whiteout_of_a_recreated_dir_matches_umoci_unpack() {
    for t in ["umoci", "tar", "mkfs.ext4", "debugfs"] {
        need(t);
    }
    let e = Env::new();
    let oci = e.p("oci");
    let image = format!("{}:wh", s(&oci));
    run("umoci", &["init", "--layout", s(&oci)]);
    run("umoci", &["new", "--image", &image]);
    let (l1, l2) = (e.p("l1"), e.p("l2"));
    for d in ["dir/sub", "keep"] {
        fs::create_dir_all(l1.join(d)).unwrap();
    }
    for f in ["dir/old", "dir/sub/old", "keep/k"] {
        fs::write(l1.join(f), "lower\n").unwrap();
    }
    let l1tar = e.p("l1.tar");
    run("tar", &["-C", s(&l1), "-cf", s(&l1tar), "./dir", "./keep"]);
    run("umoci", &["raw", "add-layer", "--image", &image, s(&l1tar)]);
    fs::create_dir_all(l2.join("dir")).unwrap();
    fs::write(l2.join("dir/new"), "upper\n").unwrap();
    fs::write(l2.join(".wh.dir"), "").unwrap();
    let l2tar = e.p("l2.tar");
    run(
        "tar",
        &[
            "-C",
            s(&l2),
            "--no-recursion",
            "-cf",
            s(&l2tar),
            "./dir",
            "./dir/new",
            "./.wh.dir",
        ],
    );
    let listing = run("tar", &["-tf", s(&l2tar)]);
    assert_eq!(
        listing.lines().collect::<Vec<_>>(),
        ["./dir/", "./dir/new", "./.wh.dir"],
        "the layer's order is the case under test"
    );
    run("umoci", &["raw", "add-layer", "--image", &image, s(&l2tar)]);
    let bundle = e.p("bundle");
    run("umoci", &["unpack", "--image", &image, s(&bundle)]);
    let want = tree(&bundle.join("rootfs"));
    assert_eq!(want, ["dir", "dir/new", "keep", "keep/k"], "umoci's result");

    let disk = e.install("wh", &oci, ArchiveFormat::OciLayout);
    let dump = e.p("dump");
    fs::create_dir(&dump).unwrap();
    for top in ["dir", "keep"] {
        debugfs(&disk, &format!("rdump /{top} {}", s(&dump)));
    }
    assert_eq!(
        tree(&dump),
        want,
        "forkvm's root disk differs from umoci unpack"
    );
    assert_eq!(fs::read_to_string(dump.join("dir/new")).unwrap(), "upper\n");
}

/// skopeo's `docker save` archive without its `manifest.json` (what a
/// truncated or hand-edited save leaves) is refused, naming the format,
/// instead of being installed as a root filesystem of layer tars.
#[test]
fn a_docker_save_without_manifest_json_is_refused() {
    for t in ["umoci", "skopeo", "tar"] {
        need(t);
    }
    let e = Env::new();
    let (oci, bundle) = (e.p("oci"), e.p("bundle"));
    let image = format!("{}:base", s(&oci));
    run("umoci", &["init", "--layout", s(&oci)]);
    run("umoci", &["new", "--image", &image]);
    run("umoci", &["unpack", "--image", &image, s(&bundle)]);
    populate(&bundle.join("rootfs"));
    run("umoci", &["repack", "--image", &image, s(&bundle)]);
    let docker = e.p("docker.tar");
    run(
        "skopeo",
        &[
            "copy",
            &format!("oci:{}:base", s(&oci)),
            &format!("docker-archive:{}:x/y:t", s(&docker)),
        ],
    );
    // Whole, it imports.
    assert_eq!(
        forkvm_image::archive::detect_format(&docker).unwrap(),
        ArchiveFormat::DockerArchive
    );
    // Unpacked and packed again without it (GNU tar's --delete breaks
    // such archives: the entries after the deleted one are lost).
    let (unpacked, cut) = (e.p("unpacked"), e.p("cut.tar"));
    fs::create_dir(&unpacked).unwrap();
    run("tar", &["-C", s(&unpacked), "-xf", s(&docker)]);
    fs::remove_file(unpacked.join("manifest.json")).unwrap();
    run("tar", &["-C", s(&unpacked), "-cf", s(&cut), "."]);
    let listing = run("tar", &["-tf", s(&cut)]);
    assert!(!listing.contains("manifest.json") && listing.contains("repositories"));
    let err = import_source(&cut, &e.store, &NoProgress).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("`docker save` archive without its manifest.json"),
        "{msg}"
    );
    assert!(e.store.list().is_empty(), "nothing stored");
}

/// A `WorkingDir` that no layer makes (`umoci config --config.workingdir`,
/// `buildah config --workingdir`) is on the root disk, owned by root with
/// mode 0755, as runc would make it.
#[test]
fn a_working_dir_missing_from_the_layers_is_created() {
    for t in ["umoci", "buildah", "mkfs.ext4", "debugfs"] {
        need(t);
    }
    let e = Env::new();
    let (oci, bundle) = (e.p("oci"), e.p("bundle"));
    let image = format!("{}:wd", s(&oci));
    run("umoci", &["init", "--layout", s(&oci)]);
    run("umoci", &["new", "--image", &image]);
    run("umoci", &["unpack", "--image", &image, s(&bundle)]);
    populate(&bundle.join("rootfs"));
    run("umoci", &["repack", "--image", &image, s(&bundle)]);
    run(
        "umoci",
        &[
            "config",
            "--image",
            &image,
            "--config.workingdir=/srv/made/here",
        ],
    );
    let (store_root, run_root) = (e.p("containers"), e.p("containers-run"));
    let b = |args: &[&str]| {
        let mut all = vec![
            "--root",
            s(&store_root),
            "--runroot",
            s(&run_root),
            "--storage-driver",
            "vfs",
        ];
        all.extend_from_slice(args);
        run("buildah", &all).trim().to_string()
    };
    let c = b(&["from", "scratch"]);
    populate(Path::new(&b(&["mount", &c])));
    b(&["config", "--workingdir", "/opt/app", &c]);
    let bo = e.p("b-oci.tar");
    b(&["commit", &c, &format!("oci-archive:{}:latest", s(&bo))]);
    b(&["rm", "--all"]);
    b(&["rmi", "--all", "--force"]);
    for (name, src, format, wd) in [
        ("umoci-wd", &oci, ArchiveFormat::OciLayout, "/srv/made/here"),
        ("buildah-wd", &bo, ArchiveFormat::OciArchive, "/opt/app"),
    ] {
        let r = import_source(src, &e.store, &NoProgress).unwrap();
        assert_eq!(r.config.working_dir.as_deref(), Some(wd), "{name}");
        let disk = e.install(name, src, format);
        let st = debugfs(&disk, &format!("stat {wd}"));
        assert!(
            st.contains("Type: directory")
                && st.contains("Mode:  0755")
                && st.contains("User:     0"),
            "{name}: {st}"
        );
        check_disk(&disk, false);
    }
}
