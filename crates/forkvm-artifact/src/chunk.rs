//! Files as fixed-size chunks: cutting (push) and assembling (pull).
//!
//! A file is read at offsets 0, [`CHUNK`], 2·[`CHUNK`], …; a chunk of zeros
//! only is a hole (not stored, left sparse on assembly), every other one is
//! compressed with zstd at level [`LEVEL`] and named by the SHA-256 of the
//! compressed bytes. zstd's output is a pure function of its input, level and
//! library version, so a chunk's digest is stable across pushes.
//!
//! Fixed offsets, not content-defined boundaries: guest RAM pages and qcow2
//! clusters never shift inside their file, so content-defined chunking would
//! only cost hashing for no extra sharing. `docs/registry.md` has the
//! measured choice of the size.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use sha2::{Digest as _, Sha256};

use crate::format::{sha256_digest, Chunk, FileEntry};

/// The chunk size forkvm writes.
pub const CHUNK: u64 = 4 << 20;
/// The largest chunk a reader accepts (so a hostile config cannot make a
/// pull allocate more).
pub const MAX_CHUNK: u64 = 64 << 20;
/// The block below which assembly does not look for holes (a page).
const BLOCK: usize = 4096;
/// zstd level: level 3 (zstd's default) compresses a booted guest's memory
/// to about a third at several hundred MB/s per core.
pub const LEVEL: i32 = 3;

/// A chunk blob that does not hold what its entry says.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("chunk {digest}: the blob's SHA-256 is {actual}")]
    Digest { digest: String, actual: String },
    #[error("chunk {digest}: {why}")]
    Bad { digest: String, why: String },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{name} assembled to SHA-256 {actual}, expected {expected}")]
    File {
        name: String,
        expected: String,
        actual: String,
    },
}

fn io_err(p: &Path) -> impl Fn(io::Error) -> ChunkError + '_ {
    move |e| ChunkError::Io {
        path: p.display().to_string(),
        source: e,
    }
}

fn is_zero(b: &[u8]) -> bool {
    // memcmp against a zero buffer is vectorised; an iterator is not.
    static ZERO: [u8; 64 << 10] = [0; 64 << 10];
    b.chunks(ZERO.len()).all(|c| c == &ZERO[..c.len()])
}

/// Compress one chunk's bytes.
pub fn compress(data: &[u8]) -> io::Result<Vec<u8>> {
    zstd::bulk::compress(data, LEVEL)
}

/// Cut `path` into chunks of `chunk` bytes (named `name` in the entry),
/// hashing the whole file on the way. `progress(done, total)` sees bytes read.
pub fn index_file(
    path: &Path,
    name: &str,
    chunk: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FileEntry, ChunkError> {
    let f = File::open(path).map_err(io_err(path))?;
    let size = f.metadata().map_err(io_err(path))?.len();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; chunk as usize];
    let mut chunks = Vec::new();
    let mut off = 0u64;
    while off < size {
        let len = chunk.min(size - off);
        let b = &mut buf[..len as usize];
        f.read_exact_at(b, off).map_err(io_err(path))?;
        h.update(&b[..]);
        if !is_zero(b) {
            let z = compress(b).map_err(io_err(path))?;
            chunks.push(Chunk {
                offset: off,
                length: len,
                digest: sha256_digest(&z),
                size: z.len() as u64,
            });
        }
        off += len;
        progress(off, size);
    }
    Ok(FileEntry {
        name: name.to_string(),
        size,
        sha256: format!("{:x}", h.finalize()),
        chunks,
    })
}

/// The compressed blob of chunk `c` of the file at `path`, checked against
/// its digest (the file must not have changed since it was indexed).
pub fn read_chunk(path: &Path, c: &Chunk) -> Result<Vec<u8>, ChunkError> {
    let f = File::open(path).map_err(io_err(path))?;
    let mut b = vec![0u8; c.length as usize];
    f.read_exact_at(&mut b, c.offset).map_err(io_err(path))?;
    let z = compress(&b).map_err(io_err(path))?;
    let actual = sha256_digest(&z);
    if actual != c.digest {
        return Err(ChunkError::Bad {
            digest: c.digest.clone(),
            why: format!(
                "{} changed since it was indexed (the chunk at {} now gives {actual})",
                path.display(),
                c.offset
            ),
        });
    }
    Ok(z)
}

/// Check a fetched blob against chunk `c` and decompress it.
pub fn unpack(blob: &[u8], c: &Chunk) -> Result<Vec<u8>, ChunkError> {
    let actual = sha256_digest(blob);
    if actual != c.digest {
        return Err(ChunkError::Digest {
            digest: c.digest.clone(),
            actual,
        });
    }
    let bad = |why: String| ChunkError::Bad {
        digest: c.digest.clone(),
        why,
    };
    // The capacity bounds the output: a blob that inflates past its length
    // is refused, not followed.
    let data = zstd::bulk::decompress(blob, c.length as usize)
        .map_err(|e| bad(format!("does not decompress: {e}")))?;
    if data.len() as u64 != c.length {
        return Err(bad(format!(
            "decompresses to {} bytes, expected {}",
            data.len(),
            c.length
        )));
    }
    Ok(data)
}

/// A file being assembled from chunks: created at its full size (holes
/// where no chunk goes), written at each chunk's offset.
pub struct Assembler {
    file: File,
    path: std::path::PathBuf,
    entry: FileEntry,
}

impl Assembler {
    pub fn create(path: &Path, entry: &FileEntry) -> Result<Assembler, ChunkError> {
        let file = File::options()
            .write(true)
            .read(true)
            .create_new(true)
            .open(path)
            .map_err(io_err(path))?;
        file.set_len(entry.size).map_err(io_err(path))?;
        Ok(Assembler {
            file,
            path: path.to_path_buf(),
            entry: entry.clone(),
        })
    }

    /// Write chunk `c` (already checked by [`unpack`]). Runs of zero
    /// blocks are skipped, so the file stays as sparse as the source's
    /// (a guest's memory image is mostly holes even inside a chunk).
    pub fn write(&self, c: &Chunk, data: &[u8]) -> Result<(), ChunkError> {
        let mut at = 0;
        while at < data.len() {
            // Skip zero blocks, then write the run of non-zero ones.
            while at < data.len() && is_zero(&data[at..(at + BLOCK).min(data.len())]) {
                at += BLOCK;
            }
            let start = at;
            while at < data.len() && !is_zero(&data[at..(at + BLOCK).min(data.len())]) {
                at += BLOCK;
            }
            if start < data.len() {
                self.file
                    .write_all_at(&data[start..at.min(data.len())], c.offset + start as u64)
                    .map_err(io_err(&self.path))?;
            }
        }
        Ok(())
    }

    /// Fsync and check the whole file against the entry's SHA-256.
    pub fn finish(self) -> Result<(), ChunkError> {
        self.file.sync_all().map_err(io_err(&self.path))?;
        let actual = hash_file(&self.path)?;
        if actual != self.entry.sha256 {
            return Err(ChunkError::File {
                name: self.entry.name.clone(),
                expected: self.entry.sha256.clone(),
                actual,
            });
        }
        Ok(())
    }
}

/// Hex SHA-256 of a file.
pub fn hash_file(p: &Path) -> Result<String, ChunkError> {
    let f = File::open(p).map_err(io_err(p))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off).map_err(io_err(p))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(format!("{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("f");
        let f = File::create(&p).unwrap();
        // 10 chunks of 64 KiB: data, hole, data, … and a short tail.
        f.set_len(10 * 65536 + 100).unwrap();
        for i in [0u64, 2, 5, 9] {
            f.write_all_at(&vec![i as u8 + 1; 65536], i * 65536)
                .unwrap();
        }
        f.write_all_at(&[7u8; 100], 10 * 65536).unwrap();
        p
    }

    #[test]
    fn holes_are_skipped_and_a_file_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let e = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        assert_eq!(e.size, 10 * 65536 + 100);
        let offs: Vec<u64> = e.chunks.iter().map(|c| c.offset).collect();
        assert_eq!(offs, vec![0, 2 * 65536, 5 * 65536, 9 * 65536, 10 * 65536]);
        assert_eq!(e.chunks.last().unwrap().length, 100);
        assert_eq!(e.sha256, hash_file(&p).unwrap());
        e.check("test").unwrap();
        let out = d.path().join("g");
        let a = Assembler::create(&out, &e).unwrap();
        for c in &e.chunks {
            let blob = read_chunk(&p, c).unwrap();
            a.write(c, &unpack(&blob, c).unwrap()).unwrap();
        }
        a.finish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(&out).unwrap());
    }

    #[test]
    fn zero_pages_inside_a_chunk_stay_holes() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let f = File::create(&p).unwrap();
        f.set_len(4 << 20).unwrap();
        // One page of data in a 4 MiB chunk.
        f.write_all_at(&[9u8; 4096], 1 << 20).unwrap();
        let e = index_file(&p, "f", 4 << 20, &mut |_, _| {}).unwrap();
        assert_eq!(e.chunks.len(), 1);
        let out = d.path().join("g");
        let a = Assembler::create(&out, &e).unwrap();
        let c = &e.chunks[0];
        a.write(c, &unpack(&read_chunk(&p, c).unwrap(), c).unwrap())
            .unwrap();
        a.finish().unwrap();
        let blocks = std::fs::metadata(&out).unwrap().blocks() * 512;
        assert!(blocks <= 64 << 10, "{blocks} bytes allocated for one page");
    }

    #[test]
    fn equal_content_gives_equal_blobs() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let a = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        let b = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        assert_eq!(a, b);
        // chunks 0 and 2 differ in content; one byte changes one digest.
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .write_all_at(&[0xff], 2 * 65536 + 5)
            .unwrap();
        let c = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        let diff: Vec<usize> = (0..a.chunks.len())
            .filter(|&i| a.chunks[i] != c.chunks[i])
            .collect();
        assert_eq!(diff, vec![1]);
    }

    #[test]
    fn corrupt_blobs_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let e = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        let c = &e.chunks[0];
        let mut blob = read_chunk(&p, c).unwrap();
        let mid = blob.len() / 2;
        blob[mid] ^= 1;
        assert!(matches!(unpack(&blob, c), Err(ChunkError::Digest { .. })));
        // A blob that matches its digest but inflates to another length.
        let other = compress(&[1u8; 1000]).unwrap();
        let lying = Chunk {
            digest: sha256_digest(&other),
            size: other.len() as u64,
            ..c.clone()
        };
        assert!(matches!(
            unpack(&other, &lying),
            Err(ChunkError::Bad { .. })
        ));
        // Not zstd at all.
        let junk = b"not zstd".to_vec();
        let j = Chunk {
            digest: sha256_digest(&junk),
            size: 8,
            ..c.clone()
        };
        assert!(matches!(unpack(&junk, &j), Err(ChunkError::Bad { .. })));
    }

    #[test]
    fn a_wrong_assembly_is_caught_by_the_file_hash() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let mut e = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        // Drop a chunk: the file assembles with a hole where data was.
        e.chunks.remove(1);
        let out = d.path().join("g");
        let a = Assembler::create(&out, &e).unwrap();
        for c in &e.chunks {
            a.write(c, &unpack(&read_chunk(&p, c).unwrap(), c).unwrap())
                .unwrap();
        }
        assert!(matches!(a.finish(), Err(ChunkError::File { .. })));
    }

    #[test]
    fn a_file_changed_after_indexing_is_refused_at_send() {
        let d = tempfile::tempdir().unwrap();
        let p = sample(d.path());
        let e = index_file(&p, "f", 65536, &mut |_, _| {}).unwrap();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .write_all_at(&[0xee], 3)
            .unwrap();
        assert!(read_chunk(&p, &e.chunks[0]).is_err());
    }
}
