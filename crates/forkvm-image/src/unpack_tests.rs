//! Tests of [`super::apply_layer`]: one edge case each, layers built in
//! memory. They run as root (ownership, devices, capabilities).

use std::fs;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt};
use std::path::Path;

use tar::EntryType;

use super::*;
use crate::testutil::{cap_net_bind_service, gzip, zstd, TarBuf};

fn apply(root: &Path, tar: &[u8]) -> Result<LayerStats, ImageError> {
    apply_layer(root, tar, Compression::Auto)
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    fs::create_dir(&root).unwrap();
    (t, root)
}

fn lmeta(p: impl AsRef<Path>) -> fs::Metadata {
    fs::symlink_metadata(p).unwrap()
}

#[test]
fn files_dirs_owners_modes_and_mtimes() {
    let (_t, root) = setup();
    let tar = TarBuf::new()
        .dir("etc/", 0o755)
        .file_owned("etc/app.conf", 0o640, 1000, 1001, b"x=1\n")
        .dir("tmp", 0o1777)
        .dir("srv/data", 0o2750)
        .finish();
    let st = apply(&root, &tar).unwrap();
    assert_eq!((st.files, st.dirs, st.bytes), (1, 3, 4));
    let m = lmeta(root.join("etc/app.conf"));
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 1001, 0o640));
    assert_eq!(m.mtime(), 1_600_000_000);
    assert_eq!(fs::read(root.join("etc/app.conf")).unwrap(), b"x=1\n");
    assert_eq!(lmeta(root.join("tmp")).mode() & 0o7777, 0o1777);
    assert_eq!(lmeta(root.join("srv/data")).mode() & 0o7777, 0o2750);
    // Directory mtimes are set last, after their children were made.
    assert_eq!(lmeta(root.join("etc")).mtime(), 1_600_000_000);
    // A missing parent ("srv") is made 0755.
    assert_eq!(lmeta(root.join("srv")).mode() & 0o7777, 0o755);
}

#[test]
fn gzip_and_zstd_layers_are_detected() {
    let tar = TarBuf::new().file("a", 0o644, b"hi").finish();
    for (bytes, c) in [
        (gzip(&tar), Compression::Auto),
        (zstd(&tar), Compression::Auto),
        (gzip(&tar), Compression::Gzip),
        (tar.clone(), Compression::None),
    ] {
        let (_t, root) = setup();
        apply_layer(&root, &bytes[..], c).unwrap();
        assert_eq!(fs::read(root.join("a")).unwrap(), b"hi");
    }
}

#[test]
fn corrupt_layers_are_errors() {
    let (_t, root) = setup();
    let mut tar = TarBuf::new().file("a", 0o644, b"hi").finish();
    tar[100] ^= 0xff; // breaks the header checksum
    let e = apply(&root, &tar).unwrap_err();
    assert!(matches!(e, ImageError::Malformed { .. }), "{e}");
    let gz = gzip(&TarBuf::new().file("a", 0o644, &[7; 5000]).finish());
    let e = apply(&root, &gz[..gz.len() / 2]).unwrap_err();
    assert!(matches!(e, ImageError::Malformed { .. }), "{e}");
}

#[test]
fn whiteout_deletes_a_lower_file_and_dir() {
    let (_t, root) = setup();
    apply(
        &root,
        &TarBuf::new()
            .file("etc/keep", 0o644, b"k")
            .file("etc/gone", 0o644, b"g")
            .file("var/cache/x/y", 0o644, b"y")
            .finish(),
    )
    .unwrap();
    let st = apply(
        &root,
        &TarBuf::new()
            .file("etc/.wh.gone", 0o644, b"")
            .file("var/cache/.wh.x", 0o644, b"")
            .file("nothere/.wh.x", 0o644, b"")
            .finish(),
    )
    .unwrap();
    assert_eq!(st.whiteouts, 3);
    assert!(root.join("etc/keep").exists());
    assert!(!root.join("etc/gone").exists() && !root.join("etc/.wh.gone").exists());
    assert!(!root.join("var/cache/x").exists() && root.join("var/cache").is_dir());
    // A whiteout of a missing directory's child creates nothing.
    assert!(!root.join("nothere").exists());
}

#[test]
fn whiteout_spares_the_same_layer() {
    let (_t, root) = setup();
    apply(&root, &TarBuf::new().dir("d", 0o755).finish()).unwrap();
    // Replace the dir by a file, with the whiteout after it (some tools
    // order so): the new file stays.
    apply(
        &root,
        &TarBuf::new()
            .file("d", 0o644, b"file now")
            .file(".wh.d", 0o644, b"")
            .finish(),
    )
    .unwrap();
    assert_eq!(fs::read(root.join("d")).unwrap(), b"file now");
}

/// A layer that recreates `d/` and whites out `d`: the lower `d`'s
/// contents go, this layer's stay, whichever comes first in the tar
/// (`tests/real_tools.rs` compares the same case with `umoci unpack`).
#[test]
fn whiteout_of_a_dir_the_layer_recreates_hides_the_lower_contents() {
    for whiteout_first in [false, true] {
        let (_t, root) = setup();
        apply(
            &root,
            &TarBuf::new()
                .file("d/old", 0o644, b"o")
                .file("d/sub/old", 0o644, b"o")
                .file("e/old", 0o644, b"o")
                .finish(),
        )
        .unwrap();
        let mut upper = TarBuf::new();
        if whiteout_first {
            upper.file(".wh.d", 0o644, b"").file(".wh.e", 0o644, b"");
        }
        upper
            .dir("d", 0o750)
            .file("d/new", 0o644, b"n")
            .dir("d/sub", 0o755)
            // `e` is recreated only as the parent of a new file.
            .file("e/sub/new", 0o644, b"n");
        if !whiteout_first {
            upper.file(".wh.d", 0o644, b"").file(".wh.e", 0o644, b"");
        }
        apply(&root, &upper.finish()).unwrap();
        let mut d = walk(&root.join("d"));
        d.sort();
        assert_eq!(d, ["new", "sub"], "whiteout first: {whiteout_first}");
        let mut e = walk(&root.join("e"));
        e.sort();
        assert_eq!(e, ["sub", "sub/new"], "whiteout first: {whiteout_first}");
        assert_eq!(lmeta(root.join("d")).permissions().mode() & 0o7777, 0o750);
    }
}

#[test]
fn opaque_dir_clears_lower_contents_only() {
    let (_t, root) = setup();
    apply(
        &root,
        &TarBuf::new()
            .file("d/old", 0o644, b"o")
            .file("d/sub/old", 0o644, b"o")
            .file("d/sub2/old", 0o644, b"o")
            .file("other/keep", 0o644, b"k")
            .finish(),
    )
    .unwrap();
    // The marker comes after some of this layer's entries, as it may.
    apply(
        &root,
        &TarBuf::new()
            .dir("d", 0o755)
            .file("d/new", 0o644, b"n")
            .file("d/sub/new", 0o644, b"n")
            .file("d/.wh..wh..opq", 0o644, b"")
            .file("d/after", 0o644, b"a")
            .finish(),
    )
    .unwrap();
    let mut names: Vec<String> = walk(&root.join("d"));
    names.sort();
    assert_eq!(names, ["after", "new", "sub", "sub/new"]);
    assert!(root.join("other/keep").exists());
    assert!(!root.join("d/.wh..wh..opq").exists());
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()).into_iter().map(|c| format!("{n}/{c}")));
        }
        out.push(n);
    }
    out
}

#[test]
fn hardlinks_within_and_across_layers() {
    let (_t, root) = setup();
    apply(&root, &TarBuf::new().file("bin/tool", 0o755, b"T").finish()).unwrap();
    let st = apply(
        &root,
        &TarBuf::new()
            .hardlink("bin/alias", "bin/tool")
            .file("lib/a", 0o644, b"A")
            .hardlink("lib/b", "/lib/a")
            .finish(),
    )
    .unwrap();
    assert_eq!(st.hardlinks, 2);
    let (a, b) = (lmeta(root.join("bin/tool")), lmeta(root.join("bin/alias")));
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(
        lmeta(root.join("lib/a")).ino(),
        lmeta(root.join("lib/b")).ino()
    );
    // A file written over one name of a hardlinked pair breaks the pair;
    // the other name keeps its content.
    apply(
        &root,
        &TarBuf::new().file("bin/alias", 0o755, b"new").finish(),
    )
    .unwrap();
    assert_eq!(fs::read(root.join("bin/tool")).unwrap(), b"T");
}

#[test]
fn hardlinks_cannot_reach_outside_or_missing_files() {
    let (t, root) = setup();
    let secret = t.path().join("secret");
    fs::write(&secret, b"s").unwrap();
    symlink(t.path(), root.join("host")).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            TarBuf::new().hardlink("h1", "missing").finish(),
            "not a file",
        ),
        (
            TarBuf::new()
                .raw(b"h2", EntryType::Link, b"../secret", b"")
                .finish(),
            "'..'",
        ),
        (
            TarBuf::new().hardlink("h3", "host/secret").finish(),
            "not a file",
        ),
        (TarBuf::new().hardlink("h4", "/").finish(), "not a file"),
    ];
    for (tar, want) in cases {
        let e = apply(&root, &tar).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
    // A hardlink to a symlink pointing out links the symlink itself.
    apply(
        &root,
        &TarBuf::new()
            .symlink("s", secret.to_str().unwrap())
            .hardlink("h5", "s")
            .finish(),
    )
    .unwrap();
    assert!(lmeta(root.join("h5")).file_type().is_symlink());
    assert_eq!(lmeta(&secret).nlink(), 1);
}

#[test]
fn setuid_binary_keeps_its_mode() {
    let (_t, root) = setup();
    apply(
        &root,
        &TarBuf::new()
            .file("usr/bin/su", 0o4755, b"su")
            .file_owned("usr/bin/wall", 0o2755, 0, 5, b"w")
            .file_owned("usr/bin/mine", 0o4750, 1000, 1000, b"m")
            .finish(),
    )
    .unwrap();
    assert_eq!(lmeta(root.join("usr/bin/su")).mode() & 0o7777, 0o4755);
    assert_eq!(lmeta(root.join("usr/bin/wall")).mode() & 0o7777, 0o2755);
    let m = lmeta(root.join("usr/bin/mine"));
    assert_eq!((m.mode() & 0o7777, m.uid()), (0o4750, 1000));
}

#[test]
fn file_capability_and_other_xattrs_are_kept() {
    let (_t, root) = setup();
    let cap = cap_net_bind_service();
    apply(
        &root,
        &TarBuf::new()
            .pax(&[
                ("SCHILY.xattr.security.capability", &cap[..]),
                ("SCHILY.xattr.user.note", b"hello"),
            ])
            .file_owned("usr/bin/ping", 0o755, 0, 0, b"P")
            .finish(),
    )
    .unwrap();
    let p = root.join("usr/bin/ping");
    assert_eq!(xattr::get(&p, "security.capability").unwrap(), Some(cap));
    assert_eq!(
        xattr::get(&p, "user.note").unwrap().as_deref(),
        Some(&b"hello"[..])
    );
}

#[test]
fn symlink_loop_is_an_error_not_a_hang() {
    let (_t, root) = setup();
    let tar = TarBuf::new()
        .symlink("a", "b")
        .symlink("b", "a")
        .file("a/x", 0o644, b"x")
        .finish();
    let e = apply(&root, &tar).unwrap_err();
    assert!(e.to_string().contains("symlink loop"), "{e}");
    // The loop itself is fine to have in an image.
    apply(&root, &TarBuf::new().symlink("c", "c").finish()).unwrap();
}

#[test]
fn dotdot_names_are_refused() {
    let (t, root) = setup();
    for name in [&b"../escape"[..], b"a/../../escape", b"/../escape"] {
        let tar = TarBuf::new()
            .raw(name, EntryType::Regular, b"", b"x")
            .finish();
        let e = apply(&root, &tar).unwrap_err();
        assert!(matches!(e, ImageError::UnsafePath { .. }), "{e}");
    }
    assert!(!t.path().join("escape").exists());
    // A `..` that stays inside is only untidy.
    let tar = TarBuf::new()
        .raw(b"a/../inside", EntryType::Regular, b"", b"x")
        .finish();
    apply(&root, &tar).unwrap();
    assert!(root.join("inside").is_file());
}

#[test]
fn absolute_names_land_inside_the_root() {
    let (t, root) = setup();
    let outside = t.path().join("abs-target");
    let name = format!("{}", outside.display());
    let tar = TarBuf::new()
        .raw(name.as_bytes(), EntryType::Regular, b"", b"x")
        .raw(b"/etc/passwd", EntryType::Regular, b"", b"root")
        .finish();
    apply(&root, &tar).unwrap();
    assert!(!outside.exists());
    assert!(root.join(name.trim_start_matches('/')).is_file());
    assert_eq!(fs::read(root.join("etc/passwd")).unwrap(), b"root");
}

#[test]
fn symlinked_parents_pointing_out_stay_in() {
    let (t, root) = setup();
    let host = t.path().join("host");
    fs::create_dir(&host).unwrap();
    let host_s = host.to_str().unwrap();
    let tar = TarBuf::new()
        .symlink("abs", host_s)
        .file("abs/pwned", 0o644, b"x")
        .symlink("up", "../../../..")
        .file("up/pwned2", 0o644, b"x")
        .symlink("deep/rel", "../../host")
        .file("deep/rel/pwned3", 0o644, b"x")
        .finish();
    apply(&root, &tar).unwrap();
    assert_eq!(
        fs::read_dir(&host).unwrap().count(),
        0,
        "nothing may land outside"
    );
    assert!(root
        .join(host_s.trim_start_matches('/'))
        .join("pwned")
        .is_file());
    assert!(root.join("pwned2").is_file());
    assert!(root.join("host/pwned3").is_file());
}

#[test]
fn last_component_symlinks_are_replaced_not_followed() {
    let (t, root) = setup();
    let victim = t.path().join("victim");
    fs::write(&victim, b"safe").unwrap();
    let vdir = t.path().join("vdir");
    fs::create_dir(&vdir).unwrap();
    apply(
        &root,
        &TarBuf::new()
            .symlink("f", victim.to_str().unwrap())
            .symlink("d", vdir.to_str().unwrap())
            .symlink("w", victim.to_str().unwrap())
            .finish(),
    )
    .unwrap();
    apply(
        &root,
        &TarBuf::new()
            .file_owned("f", 0o4777, 1000, 1000, b"overwritten?")
            .dir("d", 0o777)
            .file("d/inside", 0o644, b"i")
            .file(".wh.w", 0o644, b"")
            .finish(),
    )
    .unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"safe");
    let vm = lmeta(&victim);
    assert_eq!((vm.uid(), vm.mode() & 0o7777 != 0o4777), (0, true));
    assert!(lmeta(root.join("f")).is_file() && lmeta(root.join("d")).is_dir());
    assert!(root.join("d/inside").is_file() && fs::read_dir(&vdir).unwrap().count() == 0);
    assert!(fs::symlink_metadata(root.join("w")).is_err() && victim.exists());
}

#[test]
fn long_paths_gnu_and_pax() {
    let (_t, root) = setup();
    let a = "a".repeat(150);
    let b = "b".repeat(200);
    let long = format!("{a}/{b}/file"); // > 255 in total, each part < 256
    let pax_name = format!("p/{}/q", "c".repeat(180));
    let link_target = format!("/{a}/{b}/file");
    let tar = TarBuf::new()
        .file(&format!("{a}/x"), 0o644, b"100+")
        .file(&long, 0o644, b"255+")
        .pax(&[("path", pax_name.as_bytes())])
        .file("short-name-replaced-by-pax", 0o644, b"pax")
        .symlink("ln", &link_target)
        .finish();
    apply(&root, &tar).unwrap();
    assert_eq!(fs::read(root.join(format!("{a}/x"))).unwrap(), b"100+");
    assert_eq!(fs::read(root.join(&long)).unwrap(), b"255+");
    assert_eq!(fs::read(root.join(&pax_name)).unwrap(), b"pax");
    assert!(!root.join("short-name-replaced-by-pax").exists());
    assert_eq!(
        fs::read_link(root.join("ln")).unwrap(),
        Path::new(&link_target)
    );
}

#[test]
fn device_nodes_and_fifos() {
    let (_t, root) = setup();
    let st = apply(
        &root,
        &TarBuf::new()
            .device("dev/null", EntryType::Char, 1, 3)
            .device("dev/loop0", EntryType::Block, 7, 0)
            .device("run/fifo", EntryType::Fifo, 0, 0)
            .finish(),
    )
    .unwrap();
    assert_eq!(st.devices, 3);
    let n = lmeta(root.join("dev/null"));
    assert!(n.file_type().is_char_device());
    assert_eq!(n.rdev(), libc::makedev(1, 3));
    assert_eq!(n.mode() & 0o7777, 0o666);
    assert!(lmeta(root.join("dev/loop0")).file_type().is_block_device());
    assert!(lmeta(root.join("run/fifo")).file_type().is_fifo());
}

#[test]
fn entries_replace_what_is_there() {
    let (_t, root) = setup();
    apply(
        &root,
        &TarBuf::new()
            .file("was-dir/child", 0o644, b"c")
            .file("was-file", 0o644, b"f")
            .dir("stays/", 0o700)
            .file("stays/child", 0o644, b"c")
            .finish(),
    )
    .unwrap();
    apply(
        &root,
        &TarBuf::new()
            .file("was-dir", 0o644, b"now a file")
            .dir("was-file", 0o755)
            .dir("stays/", 0o755)
            .finish(),
    )
    .unwrap();
    assert_eq!(fs::read(root.join("was-dir")).unwrap(), b"now a file");
    assert!(lmeta(root.join("was-file")).is_dir());
    // Directory over directory: contents kept, new mode taken.
    assert!(root.join("stays/child").exists());
    assert_eq!(lmeta(root.join("stays")).mode() & 0o7777, 0o755);
}

#[test]
fn a_file_under_a_file_is_an_error() {
    let (_t, root) = setup();
    let tar = TarBuf::new()
        .file("f", 0o644, b"")
        .file("f/x", 0o644, b"")
        .finish();
    let e = apply(&root, &tar).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
}
