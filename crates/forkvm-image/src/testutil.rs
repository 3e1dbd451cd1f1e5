//! Test helpers: layer tars built in memory, including malformed ones the
//! `tar` crate's builder would refuse to write (names with `..`, absolute
//! names), raw PAX records, and compressed copies.

use std::io::Write;

use tar::{EntryType, Header};

/// Builds a tar in memory.
pub struct TarBuf {
    b: tar::Builder<Vec<u8>>,
}

impl Default for TarBuf {
    fn default() -> Self {
        Self::new()
    }
}

fn header(etype: EntryType, mode: u32, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(etype);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_600_000_000);
    h
}

impl TarBuf {
    pub fn new() -> Self {
        TarBuf {
            b: tar::Builder::new(Vec::new()),
        }
    }

    pub fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        let mut h = header(EntryType::Directory, mode, 0);
        self.b.append_data(&mut h, name, &[][..]).unwrap();
        self
    }

    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.file_owned(name, mode, 0, 0, data)
    }

    pub fn file_owned(
        &mut self,
        name: &str,
        mode: u32,
        uid: u64,
        gid: u64,
        data: &[u8],
    ) -> &mut Self {
        let mut h = header(EntryType::Regular, mode, data.len() as u64);
        h.set_uid(uid);
        h.set_gid(gid);
        self.b.append_data(&mut h, name, data).unwrap();
        self
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        let mut h = header(EntryType::Symlink, 0o777, 0);
        self.b.append_link(&mut h, name, target).unwrap();
        self
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        let mut h = header(EntryType::Link, 0o644, 0);
        self.b.append_link(&mut h, name, target).unwrap();
        self
    }

    pub fn device(&mut self, name: &str, etype: EntryType, major: u32, minor: u32) -> &mut Self {
        let mut h = header(etype, 0o666, 0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        self.b.append_data(&mut h, name, &[][..]).unwrap();
        self
    }

    /// A PAX extended header for the next entry.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (k, v) in records {
            // "<len> <key>=<value>\n", the length counting itself.
            let body = 3 + k.len() + v.len();
            let mut len = body + 1;
            while len != body + len.to_string().len() {
                len = body + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} {k}=").as_bytes());
            data.extend_from_slice(v);
            data.push(b'\n');
        }
        let mut h = header(EntryType::XHeader, 0o644, data.len() as u64);
        h.as_old_mut().name[..10].copy_from_slice(b"PaxHeaders");
        h.set_cksum();
        self.b.append(&h, &data[..]).unwrap();
        self
    }

    /// An entry whose name (and link name) bytes are written as given,
    /// unchecked: for names the builder refuses.
    pub fn raw(&mut self, name: &[u8], etype: EntryType, link: &[u8], data: &[u8]) -> &mut Self {
        let mut h = header(etype, 0o644, data.len() as u64);
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.b, tar::Builder::new(Vec::new()));
        b.into_inner().unwrap()
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 1).unwrap()
}

/// A vfs_cap_data v2 value granting CAP_NET_BIND_SERVICE (10), effective:
/// what `setcap cap_net_bind_service+ep` writes.
pub fn cap_net_bind_service() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0x0200_0001u32.to_le_bytes()); // revision 2 | effective
    v.extend_from_slice(&(1u32 << 10).to_le_bytes()); // permitted, low word
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, low word
    v.extend_from_slice(&0u32.to_le_bytes()); // permitted, high word
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, high word
    v
}

/// Run a debugfs request on an ext4 image; fails the test if debugfs
/// (e2fsprogs) is missing.
pub fn debugfs(img: &std::path::Path, req: &str) -> String {
    let tool = crate::ext4::find_tool("debugfs")
        .unwrap_or_else(|| panic!("debugfs (e2fsprogs) is missing: run scripts/setup.sh"));
    let o = std::process::Command::new(tool)
        .args(["-R", req])
        .arg(img)
        .output()
        .unwrap();
    assert!(o.status.success(), "debugfs -R {req:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}
