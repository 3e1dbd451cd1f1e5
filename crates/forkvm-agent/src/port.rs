//! Finding and opening the channel to the host.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::PORT_NAME;

use crate::serve::EofPolicy;

/// Env var naming a file or unix socket to use instead of the virtio port
/// (for running the agent on a development machine).
pub const PORT_ENV: &str = "FORKVM_AGENT_PORT";
const VIRTIO_PORTS: &str = "/sys/class/virtio-ports";

/// Where the host is.
#[derive(Debug, Clone)]
pub enum PortSpec {
    /// A virtio-serial port device, e.g. `/dev/vport1p1`.
    Virtio(PathBuf),
    /// A path from [`PORT_ENV`]: a unix socket to connect to, or any file
    /// (character device, FIFO...) to open read-write.
    Path(PathBuf),
}

/// An open channel: separate handles for reading and writing (dups of one
/// open file), so the read loop and the writer never share a handle.
pub struct Conn {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    pub eof: EofPolicy,
}

/// Look in a sysfs `virtio-ports` directory for the port named `name` and
/// return its device node name (e.g. `vport1p1`).
pub fn find_virtio_port(sys_dir: &Path, name: &str) -> Option<String> {
    let entries = fs::read_dir(sys_dir).ok()?;
    for entry in entries.flatten() {
        let Ok(content) = fs::read_to_string(entry.path().join("name")) else {
            continue;
        };
        if content.trim_end_matches(['\n', '\0']) == name {
            if let Some(dev) = entry.file_name().to_str() {
                return Some(dev.to_string());
            }
        }
    }
    None
}

/// Decide where the host is: [`PORT_ENV`] if set, else wait up to `timeout`
/// for the virtio port to appear (its driver binds asynchronously).
pub fn locate(timeout: Duration) -> io::Result<PortSpec> {
    if let Some(p) = std::env::var_os(PORT_ENV).filter(|p| !p.is_empty()) {
        return Ok(PortSpec::Path(PathBuf::from(p)));
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(dev) = find_virtio_port(Path::new(VIRTIO_PORTS), PORT_NAME) {
            let path = Path::new("/dev").join(dev);
            // devtmpfs creates the node asynchronously too.
            if path.exists() {
                return Ok(PortSpec::Virtio(path));
            }
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no virtio-serial port named {PORT_NAME} in {VIRTIO_PORTS}"),
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Open the channel once.
pub fn open(spec: &PortSpec) -> io::Result<Conn> {
    let (path, eof) = match spec {
        PortSpec::Virtio(p) => (p, EofPolicy::Retry),
        PortSpec::Path(p) => {
            if fs::metadata(p)?.file_type().is_socket() {
                let s = UnixStream::connect(p)?;
                return Ok(Conn {
                    reader: Box::new(s.try_clone()?),
                    writer: Box::new(s),
                    eof: EofPolicy::Return,
                });
            }
            (p, EofPolicy::Retry)
        }
    };
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    Ok(Conn {
        reader: Box::new(f.try_clone()?),
        writer: Box::new(f),
        eof,
    })
}

/// Open the channel, retrying for up to `timeout` (a port can be briefly
/// busy or absent while being re-plugged; a socket while its server restarts).
pub fn open_retrying(spec: &PortSpec, timeout: Duration) -> io::Result<Conn> {
    let deadline = Instant::now() + timeout;
    loop {
        match open(spec) {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;

    #[test]
    fn finds_the_named_port() {
        let d = temp_dir("vports");
        for (dev, name) in [
            ("vport0p0", "org.qemu.guest_agent.0\n"),
            ("vport1p1", "org.forkvm.agent.0\n"),
        ] {
            fs::create_dir_all(d.join(dev)).unwrap();
            fs::write(d.join(dev).join("name"), name).unwrap();
        }
        fs::create_dir_all(d.join("vport2p0")).unwrap(); // no name file
        assert_eq!(find_virtio_port(&d, PORT_NAME).as_deref(), Some("vport1p1"));
        assert_eq!(find_virtio_port(&d, "org.example.other"), None);
        assert_eq!(find_virtio_port(&d.join("missing"), PORT_NAME), None);
        fs::remove_dir_all(&d).unwrap();
    }
}
