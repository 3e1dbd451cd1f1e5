//! Daemon configuration and the on-disk layout of `$FORKVM_HOME`.
//!
//! ```text
//! $FORKVM_HOME/                      (default /var/lib/forkvm)
//!   forkvm.sock                      the API socket (0600)
//!   daemon.lock                      flock held by the running daemon
//!   state.db                         SQLite state (see db.rs)
//!   guest/vmlinux                    ELF kernel for PVH boot      } built by
//!   guest/initramfs.img              modules + the guest agent   } scripts/setup.sh
//!   images/<name>/rootfs.ext4        read-only root image (see docs/images.md)
//!   images/<name>/image.json         its metadata
//!   blobs/sha256/<hex>               image layers, configs, manifests by digest
//!   uploads/                         archives and build contexts being received
//!   certs.d/<host[:port]>/*.crt      CAs of private registries
//!   sandboxes/<id>/disk.qcow2        copy-on-write root disk
//!   sandboxes/<id>/{qmp,agent,volumes}.sock  QEMU sockets
//!   sandboxes/<id>/console.log       the serial console
//!   sandboxes/<id>/qemu.log          QEMU's own stderr
//!   sandboxes/<id>/qemu.pid          QEMU's pid and start time (finds orphans after a crash)
//!   snapshots/<id>/                  published snapshots (see forkvm-store)
//!   volume-data/<id>/                a sandbox's volume state, node journals and copies
//!   volumes/<name>/                  named volumes (docs/volumes.md)
//! /dev/shm/forkvm-<hash of home>/<id>.mem   guest RAM (RAM-backed)
//! /dev/shm/forkvm-<hash of home>/<id>.d/    RAM-backed scratch a live snapshot streams to
//! $FORKVM_HOME/jail-root/            empty; a jailed QEMU's root is mounted on it (crate::jail)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use forkvm_api::Limits;
use forkvm_qemu::Accel;

/// `serve --jail-uids` by default: far above the uids and subuid ranges
/// distributions hand out.
pub const DEFAULT_UIDS: (u32, u32) = (2_000_000, 1_000_000);

/// Everything the daemon needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    pub home: PathBuf,
    /// The unix socket to serve on.
    pub socket: PathBuf,
    /// Also serve on TCP (requires `token`).
    pub tcp: Option<SocketAddr>,
    pub token: Option<String>,
    /// `--accel` override.
    pub accel: Option<Accel>,
    pub qemu: PathBuf,
    /// Directory for guest RAM files.
    pub run_dir: PathBuf,
    pub limits: Limits,
    /// How long a boot may take before the spawn fails.
    pub boot_timeout_secs: u64,
    /// Warm-pool size for new boot templates.
    pub default_pool_size: u32,
    /// The uplink address pool (`--net-pool`).
    pub net_pool: String,
    /// A branch point younger than this is never collected by the
    /// background collector or a plain prune (`--gc-grace`).
    pub gc_grace: Duration,
    /// How often the background collector runs (`--gc-interval`); `None`
    /// turns it off.
    pub gc_interval: Option<Duration>,
    /// A running sandbox whose disk reads through more layers than this after
    /// a snapshot has them streamed into its top (`--disk-chain-max`); 0
    /// never streams (see crate::compact).
    pub disk_chain_max: u32,
    /// Registries pulls may use (`host[:port]`); empty: any
    /// (`--allowed-registries`).
    pub allowed_registries: Vec<String>,
    /// Confine every QEMU (crate::jail); off with `serve --no-jail`.
    pub jail: bool,
    /// The uids (first, count) jailed QEMUs run as (`--jail-uids`).
    pub jail_uids: (u32, u32),
    /// The memory sandboxes may use in all, MiB (`--memory-commit-mib`;
    /// see crate::admission).
    pub memory_commit_mib: u64,
    /// New work is refused below this much free disk (`--disk-reserve-mib`).
    pub disk_reserve_mib: u64,
    /// This daemon's node name in a cluster (`--node`, checked by
    /// [`crate::util::check_node_name`]): new sandbox and snapshot ids carry
    /// it, so a cluster's gateway finds an id's node without a table.
    pub node: Option<String>,
}

/// `serve --disk-reserve-mib` by default.
pub const DEFAULT_DISK_RESERVE_MIB: u64 = 512;

/// `serve --memory-commit-mib` by default: the host's RAM less what the
/// host itself needs (a tenth, at least 512 MiB).
pub fn default_memory_commit_mib(host_mib: u64) -> u64 {
    host_mib.saturating_sub((host_mib / 10).max(512)).max(256)
}

/// `serve --gc-grace` by default: ten minutes, long enough for a client to
/// spawn from, tag or pin a branch point it just made.
pub const DEFAULT_GC_GRACE_SECS: u64 = 600;
/// `serve --disk-chain-max` by default: stream after every snapshot, so a
/// source's chain is one layer when each snapshot starts.
pub const DEFAULT_DISK_CHAIN_MAX: u32 = 1;
/// `serve --gc-interval` by default.
pub const DEFAULT_GC_INTERVAL_SECS: u64 = 60;

impl Config {
    /// Defaults for a data directory.
    pub fn for_home(home: &Path) -> Config {
        let host_mib = crate::util::host_memory_mib();
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        Config {
            home: home.to_path_buf(),
            socket: home.join(forkvm_api::SOCKET_NAME),
            tcp: None,
            token: None,
            accel: None,
            qemu: forkvm_qemu::process::qemu_binary(),
            run_dir: default_run_dir(home),
            limits: Limits {
                max_memory_mib: host_mib.clamp(256, 65_536) as u32,
                max_cpus: (cpus * 2).clamp(1, 64),
                max_sandboxes: 1000,
                max_exec_output_bytes: 64 << 20,
                max_exec_timeout_ms: 24 * 3600 * 1000,
                // The agent protocol carries a file in one frame.
                max_file_bytes: u64::from(forkvm_agent_protocol::MAX_PAYLOAD),
                max_request_bytes: 96 << 20,
                // Each request is a task and maybe a QEMU operation; a
                // bounded number keeps a flood from exhausting fds.
                max_concurrent_requests: 256,
                request_body_timeout_ms: 60_000,
            },
            boot_timeout_secs: 180,
            default_pool_size: 0,
            net_pool: forkvm_net::DEFAULT_POOL.to_string(),
            gc_grace: Duration::from_secs(DEFAULT_GC_GRACE_SECS),
            gc_interval: Some(Duration::from_secs(DEFAULT_GC_INTERVAL_SECS)),
            disk_chain_max: DEFAULT_DISK_CHAIN_MAX,
            allowed_registries: Vec::new(),
            memory_commit_mib: default_memory_commit_mib(host_mib),
            disk_reserve_mib: DEFAULT_DISK_RESERVE_MIB,
            jail: true,
            jail_uids: DEFAULT_UIDS,
            node: None,
        }
    }

    pub fn guest_dir(&self) -> PathBuf {
        self.home.join("guest")
    }
    pub fn kernel(&self) -> PathBuf {
        self.guest_dir().join("vmlinux")
    }
    pub fn initrd(&self) -> PathBuf {
        self.guest_dir().join("initramfs.img")
    }
    pub fn images_dir(&self) -> PathBuf {
        self.home.join("images")
    }
    /// The dashboard's built files (`scripts/setup.sh` installs them):
    /// `$FORKVM_UI_DIR`, else `<home>/ui`, else a `ui` beside the guest
    /// artefacts `<home>/guest` links to (as test homes do).
    pub fn ui_dir(&self) -> PathBuf {
        if let Some(d) = std::env::var_os("FORKVM_UI_DIR").filter(|v| !v.is_empty()) {
            return PathBuf::from(d);
        }
        let own = self.home.join("ui");
        if own.exists() {
            return own;
        }
        std::fs::canonicalize(self.guest_dir())
            .ok()
            .and_then(|g| g.parent().map(|p| p.join("ui")))
            .unwrap_or(own)
    }
    pub fn image_rootfs(&self, name: &str) -> PathBuf {
        self.images_dir().join(name).join("rootfs.ext4")
    }
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.home.join("sandboxes")
    }
    pub fn snapshots_dir(&self) -> PathBuf {
        self.home.join("snapshots")
    }
    pub fn db_path(&self) -> PathBuf {
        self.home.join("state.db")
    }

    /// The names of the images that have a root filesystem.
    pub fn images(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.images_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("rootfs.ext4").is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        v.sort();
        v
    }

    /// Paths of one sandbox.
    pub fn sandbox_paths(&self, id: &str) -> SandboxPaths {
        let dir = self.sandboxes_dir().join(id);
        SandboxPaths {
            disk: dir.join("disk.qcow2"),
            qmp: dir.join("qmp.sock"),
            agent: dir.join("agent.sock"),
            volumes_sock: dir.join("volumes.sock"),
            // Outside the directory a jailed QEMU may write: only the
            // daemon touches volume files (docs/volumes.md).
            volumes: self.home.join("volume-data").join(id),
            console: dir.join("console.log"),
            qemu_log: dir.join("qemu.log"),
            mem: self.run_dir.join(format!("{id}.mem")),
            shm: self.run_dir.join(format!("{id}.d")),
            dir,
        }
    }
}

/// The files of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxPaths {
    pub dir: PathBuf,
    pub disk: PathBuf,
    pub qmp: PathBuf,
    pub agent: PathBuf,
    /// The volume port's socket (QEMU listens on it).
    pub volumes_sock: PathBuf,
    /// The daemon's volume files of this sandbox: its state, node journals
    /// and the private copies of its `copy` volumes.
    pub volumes: PathBuf,
    pub console: PathBuf,
    pub qemu_log: PathBuf,
    pub mem: PathBuf,
    /// RAM-backed scratch space QEMU may write (a live snapshot's stream).
    pub shm: PathBuf,
}

impl SandboxPaths {
    /// Remove what only a running VM needs (RAM, disk, sockets), keeping the
    /// console and QEMU logs so a failed sandbox can still be inspected.
    pub fn remove_runtime(&self) {
        for p in [
            &self.mem,
            &self.disk,
            &self.qmp,
            &self.agent,
            &self.volumes_sock,
        ] {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_dir_all(&self.shm);
    }

    /// Remove the daemon's volume files of the sandbox (its state, journals
    /// and private copies). Separate from [`Self::remove_all`]: a paused
    /// sandbox keeps them, since it serves them again when it resumes.
    pub fn remove_volumes(&self) {
        let _ = std::fs::remove_dir_all(&self.volumes);
    }

    /// Remove everything a VM of the sandbox used (not its volume files).
    pub fn remove_all(&self) {
        self.remove_runtime();
        let _ = std::fs::remove_dir_all(&self.dir);
        // The RAM directory itself stays: removing it when it looked empty
        // raced with sandboxes being created in it (QEMU creates its RAM
        // file there, after the daemon made sure the directory exists).
    }
}

/// Guest RAM lives on /dev/shm (RAM-backed, so the file is as fast as
/// anonymous memory), in a directory unique to the data directory so that
/// two daemons with different homes never collide.
fn default_run_dir(home: &Path) -> PathBuf {
    PathBuf::from(format!("/dev/shm/forkvm-{}", home_hash(home)))
}

/// Eight hex digits naming a data directory in host-wide places (the RAM
/// directory, the host nft table). FNV-1a: stable across runs and Rust
/// versions (unlike DefaultHasher).
pub fn home_hash(home: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in home.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dirs_differ_per_home_and_are_stable() {
        let a = Config::for_home(Path::new("/var/lib/forkvm"));
        let b = Config::for_home(Path::new("/tmp/other"));
        assert_ne!(a.run_dir, b.run_dir);
        assert_eq!(
            a.run_dir,
            Config::for_home(Path::new("/var/lib/forkvm")).run_dir
        );
        let p = a.sandbox_paths("sb-1");
        assert_eq!(p.dir, Path::new("/var/lib/forkvm/sandboxes/sb-1"));
        assert!(p.mem.starts_with(&a.run_dir));
    }
}
