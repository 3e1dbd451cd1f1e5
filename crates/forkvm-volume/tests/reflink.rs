//! `copy_tree` on a filesystem that can reflink (XFS with `reflink=1`, made on
//! a loop device here): every file is cloned, not copied, and the clone is
//! independent of its source. `copy` volumes of branch children rely on it
//! for instant copies (docs/volumes.md).

use std::path::Path;
use std::process::Command;

/// A loop-mounted XFS filesystem, unmounted when dropped.
struct Xfs {
    _tmp: tempfile::TempDir,
    mnt: std::path::PathBuf,
}

impl Xfs {
    fn new() -> Xfs {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "this test mounts XFS and must run as root");
        let mkfs = Command::new("mkfs.xfs").arg("-V").output();
        assert!(
            mkfs.is_ok_and(|o| o.status.success()),
            "this test needs mkfs.xfs: run scripts/setup.sh (it installs xfsprogs)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("xfs.img");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(320 << 20).unwrap();
        drop(f);
        let ok = |c: &mut Command| {
            let o = c.output().unwrap();
            assert!(
                o.status.success(),
                "{c:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        ok(Command::new("mkfs.xfs")
            .args(["-q", "-m", "reflink=1"])
            .arg(&img));
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        ok(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt));
        Xfs { _tmp: tmp, mnt }
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).output();
    }
}

fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn copy_tree_reflinks_on_xfs_and_the_copy_is_independent() {
    let x = Xfs::new();
    let src = x.mnt.join("src");
    let big: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    write(&src.join("big.bin"), &big);
    write(&src.join("a/b/small.txt"), b"small\n");
    std::os::unix::fs::symlink("a/b/small.txt", src.join("link")).unwrap();
    let dst = x.mnt.join("dst");
    let stats = forkvm_volume::copy_tree(&src, &dst).unwrap();
    assert!(
        stats.reflinked,
        "XFS with reflink=1 should reflink every file: {stats:?}"
    );
    assert_eq!(stats.files, 2);
    assert_eq!(std::fs::read(dst.join("big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_link(dst.join("link")).unwrap(),
        Path::new("a/b/small.txt")
    );
    // Shared blocks: the copy used (almost) no new space.
    let free = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a zeroed statvfs filled by the call for a valid path.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: c is NUL-terminated and s is a valid out pointer.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
        s.f_bavail * s.f_frsize
    };
    let before = free(&x.mnt);
    let again = x.mnt.join("again");
    forkvm_volume::copy_tree(&src, &again).unwrap();
    let used = before.saturating_sub(free(&x.mnt));
    assert!(used < 1 << 20, "a reflinked 8 MiB copy used {used} bytes");
    // Independent: writing the copy leaves the source as it was.
    write(&dst.join("big.bin"), b"changed");
    assert_eq!(std::fs::read(src.join("big.bin")).unwrap(), big);
}
