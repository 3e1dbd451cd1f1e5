//! Tests of [`super::make_ext4`]: a tree made by applying a layer, turned
//! into ext4 and read back with `debugfs` (e2fsprogs, as mkfs.ext4).

use std::fs;

use tar::EntryType;

use super::*;
use crate::testutil::{cap_net_bind_service, debugfs, TarBuf};
use crate::unpack::{apply_layer, Compression};

#[test]
fn ext4_keeps_modes_links_devices_and_capabilities() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("root");
    fs::create_dir(&src).unwrap();
    let long = format!("{}/{}", "d".repeat(120), "f".repeat(150));
    let tar = TarBuf::new()
        .file("usr/bin/su", 0o4755, b"su")
        .pax(&[(
            "SCHILY.xattr.security.capability",
            &cap_net_bind_service()[..],
        )])
        .file("usr/bin/ping", 0o755, b"ping")
        .hardlink("usr/bin/su2", "usr/bin/su")
        .symlink("bin", "usr/bin")
        .device("dev/null", EntryType::Char, 1, 3)
        .file_owned(&long, 0o600, 1000, 1000, b"deep")
        .dir("tmp", 0o1777)
        .finish();
    apply_layer(&src, &tar[..], Compression::Auto).unwrap();
    let img = t.path().join("rootfs.ext4");
    let size = make_ext4(&src, &img, None).unwrap();
    assert_eq!(fs::metadata(&img).unwrap().len(), size);
    // Nothing but the image is left beside it.
    let names: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let su = debugfs(&img, "stat /usr/bin/su");
    assert!(su.contains("Mode:  04755"), "{su}");
    assert!(su.contains("Links: 2"), "{su}");
    let ino = |s: &str| {
        s.split_whitespace()
            .nth(1)
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert_eq!(ino(&su), ino(&debugfs(&img, "stat /usr/bin/su2")));
    let caps = debugfs(&img, "ea_list /usr/bin/ping");
    assert!(
        caps.contains("security.capability (20) = 01 00 00 02 00 04 00 00"),
        "{caps}"
    );
    let null = debugfs(&img, "stat /dev/null");
    assert!(
        null.contains("character special") && null.contains("Device major/minor number: 01:03"),
        "{null}"
    );
    let bin = debugfs(&img, "stat /bin");
    assert!(
        bin.contains("Type: symlink") && bin.contains("usr/bin"),
        "{bin}"
    );
    let deep = debugfs(&img, &format!("stat /{long}"));
    assert!(
        deep.contains("User:  1000") && deep.contains("Mode:  0600"),
        "{deep}"
    );
    assert!(debugfs(&img, "stat /tmp").contains("Mode:  01777"));
    let root = debugfs(&img, "stat /");
    assert!(
        root.contains("User:     0") && root.contains("Mode:  0755"),
        "{root}"
    );
    assert!(debugfs(&img, "cat /usr/bin/ping").contains("ping"));
    // No /lost+found (mke2fs's) in an image, and the filesystem is clean
    // without it.
    assert!(!debugfs(&img, "ls /").contains("lost+found"));
    let fsck = std::process::Command::new(find_tool("e2fsck").expect("e2fsck (e2fsprogs)"))
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    assert!(fsck.status.success(), "{fsck:?}");
}

/// A tree with its own `lost+found` keeps it.
#[test]
fn a_tree_s_own_lost_found_is_kept() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("root");
    fs::create_dir_all(src.join("lost+found")).unwrap();
    fs::write(src.join("lost+found/note"), "mine").unwrap();
    let img = t.path().join("rootfs.ext4");
    make_ext4(&src, &img, None).unwrap();
    assert!(debugfs(&img, "cat /lost+found/note").contains("mine"));
}

#[test]
fn size_rule_minimum_and_requests() {
    let c = Content {
        bytes: 100 * MIB,
        inodes: 1000,
    };
    assert_eq!(auto_size(c), 381 * MIB);
    let min = minimum_size(c);
    assert!(min > 100 * MIB && min < 160 * MIB, "{min}");
    assert_eq!(min % MIB, 0);
    // Many small files need inodes beyond the default ratio.
    let many = Content {
        bytes: 10 * MIB,
        inodes: 1_000_000,
    };
    assert!(inode_count(auto_size(many), many) > 1_000_000);

    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("root");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("blob"), vec![1u8; 3 << 20]).unwrap();
    let img = t.path().join("r.ext4");
    let e = make_ext4(&src, &img, Some(8 * MIB)).unwrap_err();
    let ImageError::DiskTooSmall { minimum, .. } = e else {
        panic!("{e}")
    };
    assert!(e_msg_has_minimum(minimum));
    assert!(!img.exists());
    // The minimum itself works, and so does a bigger size.
    let got = make_ext4(&src, &img, Some(minimum)).unwrap();
    assert!(
        got <= minimum && got + 128 * MIB > minimum,
        "{got} {minimum}"
    );
    let big = 640 * MIB;
    assert_eq!(make_ext4(&src, &img, Some(big)).unwrap(), big);
    assert_eq!(fs::metadata(&img).unwrap().len(), big);
    assert!(debugfs(&img, "stat /blob").contains("Size: 3145728"));
}

fn e_msg_has_minimum(minimum: u64) -> bool {
    let e = ImageError::DiskTooSmall {
        requested: 1,
        minimum,
    };
    e.to_string().contains(&minimum.to_string())
}
