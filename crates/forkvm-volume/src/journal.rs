//! The node table journal: what a new server instance needs to understand
//! the nodeids a running guest already holds.
//!
//! The guest kernel names files by nodeid (and file handles); the host
//! server hands those out. A server started for a fork child or after a
//! daemon restart has none of its predecessor's memory, so every change to
//! the node table is appended here and replayed on start.
//!
//! ```text
//!  header (16 bytes)
//!  +------------------+-----------+-------------+
//!  | magic "FKVMVOLJ" | version   | reserved(0) |
//!  | 8 bytes          | u32 LE =1 | u32 LE      |
//!  +------------------+-----------+-------------+
//!  record (19 + n bytes), repeated
//!  +------+---------+---------+----------+-----------+
//!  | kind | nodeid  | arg     | name len | name      |
//!  | u8   | u64 LE  | u64 LE  | u16 LE   | n bytes   |
//!  +------+---------+---------+----------+-----------+
//! ```
//!
//! | kind | meaning                                  | nodeid | arg                         | name     |
//! |------|------------------------------------------|--------|-----------------------------|----------|
//! | 1    | ADD: new node, lookup count 1            | node   | parent                      | its name |
//! | 2    | REF: lookup count += arg                 | node   | increment                   | empty    |
//! | 3    | FORGET: lookup count -= arg, drop at 0   | node   | decrement                   | empty    |
//! | 4    | MOVE: rename                             | node   | new parent                  | new name |
//! | 5    | INIT: negotiated FUSE parameters         | minor  | flags \| max_write << 32    | empty    |
//! | 6    | REMOVE: the name is gone (unlink/rmdir)  | node   | 0                           | empty    |
//!
//! Durability: records are plain `write(2)`s without fsync. The journal must
//! survive a daemon crash (the page cache keeps it), not a host crash (the
//! guest's memory would be gone too). A crash can leave a torn last record:
//! it is ignored on load and cut off so that later appends start clean. A
//! bad magic, a version we do not know, or an unknown kind in the middle of
//! the file is an error: guessing would hand the guest wrong files.
//!
//! Compatibility rule: the version changes when a record changes meaning;
//! new kinds also bump it (an old server must not skip a record it does not
//! understand).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use std::ffi::OsString;

use crate::VolumeError;

pub const MAGIC: &[u8; 8] = b"FKVMVOLJ";
pub const VERSION: u32 = 1;
pub const HEADER: usize = 16;
const RECORD_HEAD: usize = 19;

/// One journal record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Add {
        node: u64,
        parent: u64,
        name: OsString,
    },
    Ref {
        node: u64,
        n: u64,
    },
    Forget {
        node: u64,
        n: u64,
    },
    Move {
        node: u64,
        parent: u64,
        name: OsString,
    },
    Init {
        minor: u32,
        flags: u32,
        max_write: u32,
    },
    Remove {
        node: u64,
    },
}

impl Record {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (kind, node, arg, name): (u8, u64, u64, &[u8]) = match self {
            Record::Add { node, parent, name } => (1, *node, *parent, name.as_bytes()),
            Record::Ref { node, n } => (2, *node, *n, &[]),
            Record::Forget { node, n } => (3, *node, *n, &[]),
            Record::Move { node, parent, name } => (4, *node, *parent, name.as_bytes()),
            Record::Init {
                minor,
                flags,
                max_write,
            } => (
                5,
                *minor as u64,
                *flags as u64 | (*max_write as u64) << 32,
                &[],
            ),
            Record::Remove { node } => (6, *node, 0, &[]),
        };
        out.push(kind);
        out.extend_from_slice(&node.to_le_bytes());
        out.extend_from_slice(&arg.to_le_bytes());
        // Names come from FUSE (at most 1024 bytes by the kernel's rules)
        // or from the host filesystem (at most 255).
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
    }
}

fn header() -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// Decodes a whole journal: the records and the length of the valid prefix
/// (everything before a torn last record).
pub fn decode(buf: &[u8], path: &Path) -> Result<(Vec<Record>, usize), VolumeError> {
    let bad = |why: String| VolumeError::Journal {
        path: path.to_owned(),
        why,
    };
    if buf.len() < HEADER || &buf[..8] != MAGIC {
        return Err(bad("not a volume journal (bad magic)".into()));
    }
    let version = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    if version != VERSION {
        return Err(bad(format!(
            "journal version {version}, this server reads version {VERSION}"
        )));
    }
    let mut at = HEADER;
    let mut recs = Vec::new();
    while buf.len() - at >= RECORD_HEAD {
        let kind = buf[at];
        let node = u64::from_le_bytes(buf[at + 1..at + 9].try_into().unwrap_or_default());
        let arg = u64::from_le_bytes(buf[at + 9..at + 17].try_into().unwrap_or_default());
        let nlen = u16::from_le_bytes([buf[at + 17], buf[at + 18]]) as usize;
        let end = at + RECORD_HEAD + nlen;
        if end > buf.len() {
            break;
        }
        let name = OsString::from_vec(buf[at + RECORD_HEAD..end].to_vec());
        let rec = match kind {
            1 => Record::Add {
                node,
                parent: arg,
                name,
            },
            2 => Record::Ref { node, n: arg },
            3 => Record::Forget { node, n: arg },
            4 => Record::Move {
                node,
                parent: arg,
                name,
            },
            5 => Record::Init {
                minor: node as u32,
                flags: arg as u32,
                max_write: (arg >> 32) as u32,
            },
            6 => Record::Remove { node },
            k => return Err(bad(format!("unknown record kind {k} at byte {at}"))),
        };
        recs.push(rec);
        at = end;
    }
    Ok((recs, at))
}

/// An open journal, appended to as the table changes.
pub struct Journal {
    file: File,
    buf: Vec<u8>,
    /// Bytes in the file, to know when to compact.
    pub len: u64,
}

impl Journal {
    /// Opens `path`, creating it with a header when missing, and returns
    /// its records. A torn tail is cut off.
    pub fn open(path: &Path) -> Result<(Journal, Vec<Record>), VolumeError> {
        let io_err = |e: io::Error| VolumeError::Io {
            what: format!("journal {}", path.display()),
            source: e,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err)?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).map_err(io_err)?;
        let (recs, len) = if buf.is_empty() {
            file.write_all(&header()).map_err(io_err)?;
            (Vec::new(), HEADER)
        } else {
            let (recs, good) = decode(&buf, path)?;
            if good < buf.len() {
                file.set_len(good as u64).map_err(io_err)?;
            }
            (recs, good)
        };
        // Append mode from here: every record is one write at the end.
        drop(file);
        let file = OpenOptions::new().append(true).open(path).map_err(io_err)?;
        Ok((
            Journal {
                file,
                buf: Vec::new(),
                len: len as u64,
            },
            recs,
        ))
    }

    /// Appends one record with a single write.
    pub fn append(&mut self, rec: &Record) -> io::Result<()> {
        self.buf.clear();
        rec.encode(&mut self.buf);
        self.len += self.buf.len() as u64;
        self.file.write_all(&self.buf)
    }
}

/// Writes `recs` as a complete journal at `dst`, atomically (tmp + rename).
pub fn write_all(dst: &Path, recs: &[Record]) -> Result<(), VolumeError> {
    let mut bytes = header().to_vec();
    for r in recs {
        r.encode(&mut bytes);
    }
    let tmp = dst.with_extension(format!("tmp-{}", std::process::id()));
    let res = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, dst));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(|e| VolumeError::Io {
        what: format!("writing journal {}", dst.display()),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Init {
                minor: 31,
                flags: 0x1234,
                max_write: 1 << 20,
            },
            Record::Add {
                node: 2,
                parent: 1,
                name: "a".into(),
            },
            Record::Ref { node: 2, n: 3 },
            Record::Move {
                node: 2,
                parent: 1,
                name: "b".into(),
            },
            Record::Forget { node: 2, n: 1 },
            Record::Remove { node: 2 },
        ]
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        {
            let (mut j, recs) = Journal::open(&p).unwrap();
            assert!(recs.is_empty());
            for r in sample() {
                j.append(&r).unwrap();
            }
        }
        let (_, recs) = Journal::open(&p).unwrap();
        assert_eq!(recs, sample());
        write_all(&dir.path().join("k"), &sample()).unwrap();
        assert_eq!(Journal::open(&dir.path().join("k")).unwrap().1, sample());
    }

    #[test]
    fn truncated_tail_is_ignored_and_cut() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        write_all(&p, &sample()).unwrap();
        let full = std::fs::read(&p).unwrap();
        for cut in 1..RECORD_HEAD + 1 {
            std::fs::write(&p, &full[..full.len() - cut]).unwrap();
            let (mut j, recs) = Journal::open(&p).unwrap();
            assert_eq!(recs, sample()[..sample().len() - 1], "cut {cut}");
            // Appending after a cut tail yields a clean journal.
            j.append(&Record::Remove { node: 2 }).unwrap();
            drop(j);
            assert_eq!(Journal::open(&p).unwrap().1, sample());
        }
    }

    #[test]
    fn bad_magic_version_and_kind_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        write_all(&p, &sample()).unwrap();
        let good = std::fs::read(&p).unwrap();

        let mut b = good.clone();
        b[0] = b'X';
        assert!(decode(&b, &p).unwrap_err().to_string().contains("magic"));
        let mut b = good.clone();
        b[8] = 9;
        assert!(decode(&b, &p).unwrap_err().to_string().contains("version"));
        let mut b = good.clone();
        b[HEADER] = 77;
        assert!(decode(&b, &p).unwrap_err().to_string().contains("kind"));
        assert!(decode(&good[..5], &p).is_err());
    }
}
