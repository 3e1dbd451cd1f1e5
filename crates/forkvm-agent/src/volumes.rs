//! Volumes in the guest: FUSE mounts whose requests travel to the host.
//!
//! The agent does not interpret the filesystem: it mounts `/dev/fuse` at each
//! guest path and hands the descriptors to the relay
//! ([`forkvm_agent_protocol::volume`]), which moves raw FUSE requests and
//! replies over the volume port to the daemon. One relay serves every volume
//! of the guest; it starts with the first mount and lives as long as the
//! guest (a snapshot copies it, mid-flight requests included, into clones).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::volume::{mount_fuse, Relay};
use forkvm_agent_protocol::{VolumeMountSpec, ERR_INVALID, ERR_IO, VOLUME_PORT_NAME as PORT_NAME};

use crate::serve::ReqError;

use crate::port::find_virtio_port;

static RELAY: Mutex<Option<Relay>> = Mutex::new(None);

fn io_err(what: String) -> ReqError {
    ReqError {
        code: ERR_IO,
        message: what,
    }
}

/// The volume port's device node. The port exists from boot on machines
/// that have it; a missing one means the sandbox predates volumes.
fn port_path() -> Result<PathBuf, ReqError> {
    let t0 = Instant::now();
    loop {
        if let Some(dev) = find_virtio_port(Path::new("/sys/class/virtio-ports"), PORT_NAME) {
            return Ok(Path::new("/dev").join(dev));
        }
        if t0.elapsed() > Duration::from_secs(2) {
            return Err(io_err(format!(
                "this guest has no volume port ({PORT_NAME}): its machine was made before \
                 volumes existed; spawn it from an image or a newer snapshot"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Mount every volume, or none: a failure unmounts what this call mounted.
pub fn mount(volumes: &[VolumeMountSpec]) -> Result<(), ReqError> {
    for v in volumes {
        if !v.path.starts_with('/') || v.path == "/" {
            return Err(ReqError {
                code: ERR_INVALID,
                message: format!("volume path {:?} must be absolute and not /", v.path),
            });
        }
    }
    let mut relay = RELAY.lock().unwrap_or_else(|p| p.into_inner());
    if relay.is_none() {
        let path = port_path()?;
        let port = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err(format!("cannot open {}: {e}", path.display())))?;
        *relay = Some(
            Relay::start(port)
                .map_err(|e| io_err(format!("cannot start the volume relay: {e}")))?,
        );
    }
    let Some(r) = relay.as_ref() else {
        return Err(io_err("the volume relay is gone".into()));
    };
    let mut done: Vec<&str> = Vec::new();
    for v in volumes {
        match mount_fuse(Path::new(&v.path), v.read_only)
            .and_then(|fuse| r.add_mount(v.index, fuse))
        {
            Ok(()) => done.push(&v.path),
            Err(e) => {
                for p in done {
                    crate::sys::umount_detach(p);
                }
                return Err(io_err(format!("cannot mount volume at {}: {e}", v.path)));
            }
        }
    }
    crate::log(&format!("mounted {} volume(s)", volumes.len()));
    Ok(())
}
