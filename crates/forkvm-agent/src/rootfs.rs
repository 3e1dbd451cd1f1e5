//! The `resize_rootfs` request: grow the mounted root ext4 filesystem
//! online to the size of its block device.
//!
//! The host grows a sandbox's disk (a cold boot with an overlay bigger than
//! the image, or a QMP `block_resize` of a clone's disk); virtio-blk tells
//! the guest kernel the new capacity by itself, and the filesystem must
//! then be told to use it:
//!
//! 1. the root device is found from the device number of `/`: its name from
//!    `/sys/dev/block/MAJ:MIN/uevent` (`DEVNAME=`, a node in devtmpfs), else
//!    the source of `/` in `/proc/self/mountinfo`;
//! 2. its size is read with `BLKGETSIZE64`;
//! 3. the filesystem's block count and block size come from the ext4
//!    superblock (1024 bytes at byte 1024 of the device; read through the
//!    device's page cache, which is where ext4 keeps its own copy, so it is
//!    current even while mounted);
//! 4. if the device holds more whole blocks, `EXT4_IOC_RESIZE_FS` on `/`
//!    with the new count has the kernel add block groups online. Without
//!    the `64bit` feature the count is capped at 2^32-1 blocks. The size
//!    reported afterwards is read back from the superblock (the kernel may
//!    leave out a last group too small to hold its own metadata).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use forkvm_agent_protocol::{ERR_INVALID, ERR_IO};

use crate::serve::ReqError;

/// `_IOW('f', 16, __u64)` from `<linux/ext4.h>`.
const EXT4_IOC_RESIZE_FS: libc::Ioctl = 0x4008_6610;
/// `_IOR(0x12, 114, size_t)` from `<linux/fs.h>`.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
const EXT4_SUPER_MAGIC: u16 = 0xEF53;
/// `EXT4_FEATURE_INCOMPAT_64BIT`.
const INCOMPAT_64BIT: u32 = 0x80;
const SUPERBLOCK_OFFSET: u64 = 1024;
const SUPERBLOCK_LEN: usize = 1024;

/// The fields of an ext4 superblock that sizing needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub blocks: u64,
    pub block_size: u64,
    pub is_64bit: bool,
}

impl Superblock {
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.block_size)
    }
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Parse the 1024-byte superblock.
pub fn parse_superblock(b: &[u8]) -> Result<Superblock, String> {
    if b.len() < SUPERBLOCK_LEN {
        return Err(format!(
            "superblock is {} bytes, expected {SUPERBLOCK_LEN}",
            b.len()
        ));
    }
    let magic = u16::from_le_bytes([b[0x38], b[0x39]]);
    if magic != EXT4_SUPER_MAGIC {
        return Err(format!("no ext4 superblock (magic {magic:#06x})"));
    }
    let log = le32(b, 0x18);
    if log > 6 {
        return Err(format!("implausible block size 2^{} bytes", 10 + log));
    }
    let is_64bit = le32(b, 0x60) & INCOMPAT_64BIT != 0;
    let hi = if is_64bit {
        u64::from(le32(b, 0x150))
    } else {
        0
    };
    Ok(Superblock {
        blocks: (hi << 32) | u64::from(le32(b, 0x04)),
        block_size: 1024 << log,
        is_64bit,
    })
}

/// The block count to grow to, or None when the filesystem already uses
/// every whole block of a device of `dev_bytes` (or the device is smaller).
pub fn target_blocks(sb: &Superblock, dev_bytes: u64) -> Option<u64> {
    let mut blocks = dev_bytes / sb.block_size;
    if !sb.is_64bit {
        blocks = blocks.min(u64::from(u32::MAX));
    }
    (blocks > sb.blocks).then_some(blocks)
}

/// The device name in a sysfs `uevent` file.
pub fn uevent_devname(uevent: &str) -> Option<&str> {
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .filter(|n| !n.is_empty() && !n.contains(".."))
}

/// The source of the last mount on `/` with device `maj:min`, from
/// /proc/self/mountinfo ("id parent maj:min root mountpoint opts... -
/// fstype source superopts").
pub fn mountinfo_source(mountinfo: &str, maj: u32, min: u32) -> Option<String> {
    let want = format!("{maj}:{min}");
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let dash = f.iter().position(|&x| x == "-")?;
            (f.get(2) == Some(&want.as_str()) && f.get(4) == Some(&"/"))
                .then(|| f.get(dash + 2).map(|s| s.to_string()))
                .flatten()
        })
        .rfind(|s| s.starts_with("/dev/"))
}

fn io_err(what: String, e: &io::Error) -> ReqError {
    ReqError {
        code: ERR_IO,
        message: format!("{what}: {e}"),
    }
}

/// The block device holding the filesystem mounted at `mount`.
fn device_of(mount: &Path) -> Result<PathBuf, ReqError> {
    let st = std::fs::metadata(mount)
        .map_err(|e| io_err(format!("cannot stat {}", mount.display()), &e))?;
    let (maj, min) = (libc::major(st.dev()), libc::minor(st.dev()));
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/uevent"));
    if let Some(name) = uevent.as_deref().ok().and_then(uevent_devname) {
        let p = Path::new("/dev").join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo_source(&mountinfo, maj, min)
        .map(PathBuf::from)
        .ok_or_else(|| ReqError {
            code: ERR_IO,
            message: format!(
                "cannot find the block device of {} (device {maj}:{min})",
                mount.display()
            ),
        })
}

fn read_superblock(dev: &File, shown: &str) -> Result<Superblock, ReqError> {
    let mut b = vec![0u8; SUPERBLOCK_LEN];
    dev.read_exact_at(&mut b, SUPERBLOCK_OFFSET)
        .map_err(|e| io_err(format!("cannot read the superblock of {shown}"), &e))?;
    parse_superblock(&b).map_err(|m| ReqError {
        code: ERR_INVALID,
        message: format!("{shown}: {m}"),
    })
}

fn device_bytes(dev: &File, shown: &str) -> Result<u64, ReqError> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at `size` for the duration of the call; the fd belongs to `dev`.
    if unsafe { libc::ioctl(dev.as_raw_fd(), BLKGETSIZE64, &mut size) } == -1 {
        return Err(io_err(
            format!("cannot get the size of {shown}"),
            &io::Error::last_os_error(),
        ));
    }
    Ok(size)
}

/// Grow the ext4 filesystem mounted at `mount`, on `device`, to the
/// device's size. Returns the sizes before and after, in bytes.
pub fn resize(mount: &Path, device: &Path) -> Result<(u64, u64), ReqError> {
    let shown = device.display().to_string();
    let dev = File::open(device).map_err(|e| io_err(format!("cannot open {shown}"), &e))?;
    let old = read_superblock(&dev, &shown)?;
    let Some(blocks) = target_blocks(&old, device_bytes(&dev, &shown)?) else {
        return Ok((old.bytes(), old.bytes()));
    };
    let dir =
        File::open(mount).map_err(|e| io_err(format!("cannot open {}", mount.display()), &e))?;
    // SAFETY: EXT4_IOC_RESIZE_FS reads one u64 through the pointer, which
    // points at `blocks` for the duration of the call; the fd belongs to
    // `dir`.
    if unsafe { libc::ioctl(dir.as_raw_fd(), EXT4_IOC_RESIZE_FS, &blocks) } == -1 {
        return Err(io_err(
            format!(
                "cannot grow the filesystem on {shown} from {} to {blocks} blocks",
                old.blocks
            ),
            &io::Error::last_os_error(),
        ));
    }
    let new = read_superblock(&dev, &shown)?;
    Ok((old.bytes(), new.bytes()))
}

/// Check that `/` is ext4, find its device and grow it.
pub fn resize_rootfs() -> Result<(u64, u64), ReqError> {
    let root = Path::new("/");
    // SAFETY: all-zero bytes are a valid statfs (integers only).
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a NUL-terminated literal and `sfs` is writable;
    // both outlive the call.
    if unsafe { libc::statfs(c"/".as_ptr(), &mut sfs) } == -1 {
        return Err(io_err(
            "cannot statfs /".into(),
            &io::Error::last_os_error(),
        ));
    }
    if sfs.f_type as u64 != u64::from(EXT4_SUPER_MAGIC) {
        return Err(ReqError {
            code: ERR_INVALID,
            message: format!(
                "the root filesystem is not ext4 (type {:#x}); only ext4 can be grown",
                sfs.f_type
            ),
        });
    }
    resize(root, &device_of(root)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn superblock(blocks: u64, log: u32, is_64bit: bool) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_LEN];
        b[0x04..0x08].copy_from_slice(&(blocks as u32).to_le_bytes());
        b[0x18..0x1c].copy_from_slice(&log.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&EXT4_SUPER_MAGIC.to_le_bytes());
        if is_64bit {
            b[0x60..0x64].copy_from_slice(&(INCOMPAT_64BIT | 0x2).to_le_bytes());
        }
        b[0x150..0x154].copy_from_slice(&((blocks >> 32) as u32).to_le_bytes());
        b
    }

    #[test]
    fn superblock_fields() {
        let sb = parse_superblock(&superblock(524_288, 2, true)).unwrap();
        assert_eq!(
            sb,
            Superblock {
                blocks: 524_288,
                block_size: 4096,
                is_64bit: true
            }
        );
        assert_eq!(sb.bytes(), 2 << 30);
        let big = parse_superblock(&superblock((1 << 33) + 5, 2, true)).unwrap();
        assert_eq!(big.blocks, (1 << 33) + 5);
        // Without 64bit the high word is not part of the count.
        let small = parse_superblock(&superblock((1 << 33) + 5, 0, false)).unwrap();
        assert_eq!((small.blocks, small.block_size), (5, 1024));
    }

    #[test]
    fn corrupt_superblocks() {
        let mut b = superblock(100, 2, true);
        b[0x38] = 0;
        assert!(parse_superblock(&b)
            .unwrap_err()
            .contains("no ext4 superblock"));
        assert!(parse_superblock(&superblock(100, 9, true))
            .unwrap_err()
            .contains("implausible"));
        assert!(parse_superblock(&[0u8; 100])
            .unwrap_err()
            .contains("100 bytes"));
    }

    #[test]
    fn resize_arithmetic() {
        let sb = Superblock {
            blocks: 524_288,
            block_size: 4096,
            is_64bit: true,
        };
        assert_eq!(target_blocks(&sb, 2 << 30), None, "already full size");
        assert_eq!(
            target_blocks(&sb, (2 << 30) + 4095),
            None,
            "a partial block does not count"
        );
        assert_eq!(
            target_blocks(&sb, 1 << 30),
            None,
            "a smaller device is not a shrink"
        );
        assert_eq!(target_blocks(&sb, 10 << 30), Some(2_621_440));
        assert_eq!(target_blocks(&sb, (10 << 30) + 100), Some(2_621_440));
        let old = Superblock {
            is_64bit: false,
            ..sb
        };
        assert_eq!(
            target_blocks(&old, 32 << 40),
            Some(u64::from(u32::MAX)),
            "capped at 2^32-1"
        );
        let full = Superblock {
            blocks: u64::from(u32::MAX),
            ..old
        };
        assert_eq!(target_blocks(&full, 64 << 40), None);
    }

    #[test]
    fn device_lookup_sources() {
        assert_eq!(
            uevent_devname("MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n"),
            Some("vda")
        );
        assert_eq!(uevent_devname("MAJOR=254\n"), None);
        assert_eq!(uevent_devname("DEVNAME=\n"), None);
        assert_eq!(uevent_devname("DEVNAME=../etc\n"), None);
        let mi = "\
22 1 0:21 / /proc rw,relatime - proc proc rw
25 1 254:0 / / rw,relatime - ext4 /dev/root rw
30 25 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
31 25 0:5 / /dev rw - devtmpfs devtmpfs rw
garbage line
";
        assert_eq!(mountinfo_source(mi, 254, 0).as_deref(), Some("/dev/vda"));
        assert_eq!(mountinfo_source(mi, 254, 1), None);
        assert_eq!(
            mountinfo_source("1 2 0:5 / / rw - tmpfs none rw\n", 0, 5),
            None
        );
    }

    /// Grows a real ext4 on a loop device. Needs root and loop devices:
    /// `cargo test -p forkvm-agent -- --ignored online_resize`.
    #[test]
    #[ignore]
    fn online_resize_of_a_loop_mounted_ext4() {
        use std::process::Command;
        let d = crate::files::tests::temp_dir("resize");
        let img = d.join("fs.img");
        let mnt = d.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let img_s = img.to_str().unwrap();
        run(&["truncate", "-s", "64M", img_s]);
        run(&["mkfs.ext4", "-q", "-F", img_s]);
        let loopdev = run(&["losetup", "-f", "--show", img_s]);
        let mnt_s = mnt.to_str().unwrap();
        let mounted = Command::new("mount")
            .args([&loopdev, mnt_s])
            .status()
            .unwrap()
            .success();
        // Nothing in here may panic: the mount and loop device must go.
        let result = (|| -> Result<_, ReqError> {
            if !mounted {
                return Err(ReqError {
                    code: ERR_IO,
                    message: "mount failed".into(),
                });
            }
            let same = resize(&mnt, Path::new(&loopdev))?;
            let grow = Command::new("truncate")
                .args(["-s", "256M", img_s])
                .status();
            let rescan = Command::new("losetup").args(["-c", &loopdev]).status();
            if !(grow.is_ok_and(|s| s.success()) && rescan.is_ok_and(|s| s.success())) {
                return Err(ReqError {
                    code: ERR_IO,
                    message: "cannot grow the loop device".into(),
                });
            }
            let grown = resize(&mnt, Path::new(&loopdev))?;
            let again = resize(&mnt, Path::new(&loopdev))?;
            Ok((same, grown, again))
        })();
        let _ = Command::new("umount").arg(mnt_s).status();
        let _ = Command::new("losetup").args(["-d", &loopdev]).status();
        std::fs::remove_dir_all(&d).unwrap();
        let (same, grown, again) = match result {
            Err(e) if e.message.contains("Operation not permitted") => {
                eprintln!("skipped: no CAP_SYS_RESOURCE here ({})", e.message);
                return;
            }
            r => r.unwrap(),
        };
        assert_eq!(same, (64 << 20, 64 << 20));
        assert_eq!(grown, (64 << 20, 256 << 20));
        assert_eq!(again, (256 << 20, 256 << 20));
    }
}
