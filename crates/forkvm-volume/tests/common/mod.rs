//! Shared harness: a real kernel FUSE mount served by the guest relay and
//! the host server in this process, joined by a socketpair.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use forkvm_agent_protocol::volume::{mount_fuse, Relay};
use forkvm_volume::{serve, ServerHandle, VolumeConfig};

pub const HOST_OWNER: (u32, u32) = (4321, 4322);

/// Fails (never skips) when the host cannot run these tests.
pub fn require_fuse() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the forkvm-volume integration tests mount FUSE and must run as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "the forkvm-volume integration tests need /dev/fuse (modprobe fuse)"
    );
}

pub struct Mount {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub mnt: PathBuf,
    pub relay: Relay,
    pub server: Option<ServerHandle>,
    pub read_only: bool,
}

pub fn config(root: &Path, journal: &Path, read_only: bool) -> VolumeConfig {
    VolumeConfig {
        index: 0,
        root: root.to_owned(),
        read_only,
        journal: journal.to_owned(),
        host_owner: HOST_OWNER,
        guest_owner: (0, 0),
    }
}

impl Mount {
    pub fn new(read_only: bool) -> Mount {
        require_fuse();
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("vol").canonicalize().unwrap_or_else(|_| {
            std::fs::create_dir(tmp.path().join("vol")).expect("mkdir vol");
            tmp.path()
                .join("vol")
                .canonicalize()
                .expect("canonical vol")
        });
        let mnt = tmp.path().join("mnt");
        let (guest, host) = UnixStream::pair().expect("socketpair");
        let relay = Relay::start(File::from(OwnedFd::from(guest))).expect("relay");
        let fuse = mount_fuse(&mnt, read_only).expect("mount fuse");
        relay.add_mount(0, fuse).expect("add mount");
        let server = serve(
            host,
            vec![config(&root, &tmp.path().join("journal"), read_only)],
            "test-sandbox".into(),
        )
        .expect("serve");
        Mount {
            tmp,
            root,
            mnt,
            relay,
            server: Some(server),
            read_only,
        }
    }

    pub fn server(&self) -> &ServerHandle {
        self.server.as_ref().expect("server running")
    }

    /// Simulates a new server instance (fork child, daemon restart): the
    /// current server goes away, the relay gets a new port and a server
    /// started from `journal` on `root` takes over.
    pub fn restart(&mut self, root: &Path, journal: &Path) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        let (guest, host) = UnixStream::pair().expect("socketpair");
        self.relay.reconnect(File::from(OwnedFd::from(guest)));
        self.server = Some(
            serve(
                host,
                vec![config(root, journal, self.read_only)],
                "test-sandbox-2".into(),
            )
            .expect("serve again"),
        );
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn h(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let c = CString::new(self.mnt.as_os_str().as_bytes()).unwrap_or_default();
        // SAFETY: NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

pub fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}
