//! Splicing a link out of the middle of a `diff` chain.
//!
//! A checkpoint timeline is a chain of `diff` snapshots, each storing the
//! pages that changed since the one before. Pruning a checkpoint in the
//! middle, `V`, must keep the one above it, `N`, restorable: `N`'s view of
//! RAM is the chain's base with every link up to `N` laid over it. So `V`'s
//! pages move into `N`, except those `N` stores itself (they shadow `V`'s),
//! and `N`'s parent becomes `V`'s parent:
//!
//! ```text
//!   before:  base ── … ── P ── V ── N ── …      N's pages: n
//!   after:   base ── … ── P ──────── N' ── …    N''s pages: n ∪ (v ∖ n)
//! ```
//!
//! `N'` presents exactly the RAM `N` did, so nothing above it changes in
//! content. Its manifest does change (new parent, new memory file), and so
//! does its digest, which the next link recorded. Rather than rewrite every
//! manifest above (one file each, no common commit point), `N'` lists the
//! digests it replaces in [`Manifest::supersedes`]; a child's parent check
//! accepts those ([`Snapshot::answers_to`]).
//!
//! Crash safety, in this order:
//! 1. the merged pages are written to a new file in `N`'s directory, named
//!    `memory.<n>.diff` (never the name the current manifest uses), and
//!    fsynced;
//! 2. the new manifest is written to `manifest.fvs.splice` and renamed over
//!    `manifest.fvs`, then the directory is fsynced: **the commit point**;
//! 3. the old memory file of `N` goes, then `V` is removed like any
//!    snapshot (its disk layer stays: `N`'s layer is backed by it).
//!
//! A crash before 2 leaves `N` and `V` as they were plus a file no manifest
//! names; after 2, `V` is an ordinary snapshot nothing builds on, and `N`'s
//! directory may hold its old memory file. [`Store::tidy_splices`] removes
//! such files at start. A thin disk layer of `N` (one backed by `V`'s) is
//! merged too, between steps 1 and 2, and renamed in after 2
//! ([`crate::splice_disk`]). Otherwise `V`'s layer stays until layer
//! collection finds no chain through it: a qcow2 layer is named by path in
//! the headers above it (see the crate docs).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::memdiff::{self, MemDiff};
use crate::{crash, fsync_dir, hash_file, io, splice_disk, Snapshot, Store, StoreError, MANIFEST};

/// The temporary name of a manifest being replaced.
const MANIFEST_SPLICE: &str = "manifest.fvs.splice";

/// What a splice did.
#[derive(Debug, Clone)]
pub struct Spliced {
    /// `N` as it is now.
    pub next: Snapshot,
    /// Pages of `V` that moved into `N`.
    pub moved_pages: usize,
    /// Pages of `V` that `N` shadowed, freed with `V`.
    pub dropped_pages: usize,
}

fn corrupt(id: &str, why: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        why: why.into(),
    }
}

/// The memory artefact of a diff snapshot.
fn diff_artefact(s: &Snapshot) -> Option<&crate::manifest::Artefact> {
    s.manifest.artefact("memory_diff")
}

/// A file name for `N`'s merged pages that its manifest does not use.
fn fresh_name(dir: &Path, current: &str) -> String {
    (1u32..)
        .map(|n| format!("memory.{n}.diff"))
        .find(|n| n != current && !dir.join(n).exists())
        .expect("a free name")
}

/// Merge `v`'s pages under `n`'s (`n` wins): the union, ascending.
pub fn merge_pages(v: (&[u64], &[u8]), n: (&[u64], &[u8])) -> (Vec<u64>, Vec<u8>, usize, usize) {
    const P: usize = memdiff::PAGE as usize;
    let (mut i, mut j) = (0, 0);
    let (mut pages, mut data) = (Vec::new(), Vec::new());
    let (mut moved, mut dropped) = (0, 0);
    while i < v.0.len() || j < n.0.len() {
        let take_n = j < n.0.len() && (i >= v.0.len() || n.0[j] <= v.0[i]);
        if take_n {
            if i < v.0.len() && v.0[i] == n.0[j] {
                dropped += 1;
                i += 1;
            }
            pages.push(n.0[j]);
            data.extend_from_slice(&n.1[j * P..(j + 1) * P]);
            j += 1;
        } else {
            pages.push(v.0[i]);
            data.extend_from_slice(&v.1[i * P..(i + 1) * P]);
            moved += 1;
            i += 1;
        }
    }
    (pages, data, moved, dropped)
}

impl Store {
    /// Splice `victim` out of the chain: its pages move into `next`, whose
    /// parent it must be, and `victim` is removed. Both must be `diff`
    /// snapshots. The caller makes sure nothing else builds on `victim` and
    /// nobody opens either meanwhile.
    pub fn splice_out(&self, victim: &str, next: &str) -> Result<Spliced, StoreError> {
        let v = self.open_snapshot(victim)?;
        let n = self.open_snapshot(next)?;
        match &n.manifest.parent {
            Some(p) if p.id == victim && v.answers_to(&p.manifest_sha256) => {}
            _ => return Err(corrupt(next, format!("its parent is not {victim}"))),
        }
        let (Some(va), Some(na)) = (diff_artefact(&v), diff_artefact(&n)) else {
            return Err(corrupt(
                victim,
                "only a link of a diff chain can be spliced out",
            ));
        };
        let md = |s: &Snapshot, file: &str| {
            MemDiff::open(&s.path(file)).map_err(|e| corrupt(&s.manifest.id, e.to_string()))
        };
        let (vd, nd) = (md(&v, &va.file)?, md(&n, &na.file)?);
        if vd.ram_bytes != nd.ram_bytes {
            return Err(corrupt(next, "its RAM size differs from its parent's"));
        }
        let read = |d: &MemDiff, id: &str| d.read_data().map_err(|e| corrupt(id, e.to_string()));
        let (vbytes, nbytes) = (read(&vd, victim)?, read(&nd, next)?);
        let (pages, data, moved, dropped) = merge_pages((&vd.pages, &vbytes), (&nd.pages, &nbytes));

        // 1. The merged pages, under a name the manifest does not use.
        let name = fresh_name(&n.dir, &na.file);
        let out = n.path(&name);
        memdiff::write(&out, nd.ram_bytes, &pages, &data)
            .map_err(|e| corrupt(next, e.to_string()))?;
        let f = std::fs::File::open(&out).map_err(io(&out))?;
        f.sync_all().map_err(io(&out))?;
        let meta = f.metadata().map_err(io(&out))?;
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o444)).map_err(io(&out))?;
        let sha = hash_file(&out)?;
        self.remember(&out, &sha);
        crash::point("splice.pages_written");
        // 1b. A thin disk layer over V's takes V's clusters (splice_disk).
        let disk = if splice_disk::builds_on(&n, &v)? {
            let d = splice_disk::merge(&n, &v)?;
            self.remember(&d.path, &d.sha256);
            crash::point("splice.disk_merged");
            Some(d)
        } else {
            None
        };

        // 2. The new manifest, renamed over the old one: the commit.
        let mut m = n.manifest.clone();
        m.parent = v.manifest.parent.clone();
        m.supersedes.push(n.digest.clone());
        for a in &mut m.artefacts {
            if a.kind == "memory_diff" {
                a.file = name.clone();
                a.size = std::os::unix::fs::MetadataExt::size(&meta);
                a.allocated = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
                a.sha256 = sha.clone();
            }
            if let (Some(d), "disk") = (&disk, a.kind.as_str()) {
                (a.size, a.allocated, a.sha256) = (d.size, d.allocated, d.sha256.clone());
            }
        }
        let bytes = m.encode();
        let tmp = n.path(MANIFEST_SPLICE);
        {
            let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(&bytes).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o444)).map_err(io(&tmp))?;
        let mp = n.path(MANIFEST);
        std::fs::rename(&tmp, &mp).map_err(io(&mp))?;
        fsync_dir(&n.dir)?;
        crash::point("splice.committed");

        // 3. The merged disk layer takes its name; what nothing names
        // any more goes.
        if disk.is_some() {
            splice_disk::rename_in(&n.dir)?;
        }
        let _ = std::fs::remove_file(n.path(&na.file));
        self.remove(victim)?;
        Ok(Spliced {
            next: Snapshot {
                dir: n.dir.clone(),
                manifest: m,
                digest: crate::manifest::Manifest::digest(&bytes),
            },
            moved_pages: moved,
            dropped_pages: dropped,
        })
    }

    /// Remove what an interrupted splice left in published snapshots: a
    /// manifest that was not renamed in, and memory diffs their manifest
    /// does not name. Returns the files removed.
    pub fn tidy_splices(&self) -> Vec<std::path::PathBuf> {
        let mut gone = Vec::new();
        for id in self.ids() {
            let Ok(s) = self.open_snapshot(&id) else {
                continue;
            };
            let named: Vec<&str> = s
                .manifest
                .artefacts
                .iter()
                .map(|a| a.file.as_str())
                .collect();
            gone.extend(splice_disk::tidy(&s));
            for e in std::fs::read_dir(&s.dir).into_iter().flatten().flatten() {
                let f = e.file_name().to_string_lossy().into_owned();
                let stray_diff = f.starts_with("memory.") && f.ends_with(".diff");
                if (f == MANIFEST_SPLICE || stray_diff) && !named.contains(&f.as_str()) {
                    let p = e.path();
                    if std::fs::remove_file(&p).is_ok() {
                        gone.push(p);
                    }
                }
            }
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::merge_pages;

    fn page(b: u8) -> Vec<u8> {
        vec![b; 4096]
    }

    #[test]
    fn the_next_link_wins_and_the_rest_moves_in_order() {
        let v = (vec![1u64, 3, 5], [page(1), page(3), page(5)].concat());
        let n = (vec![0u64, 3, 6], [page(10), page(33), page(66)].concat());
        let (pages, data, moved, dropped) = merge_pages((&v.0, &v.1), (&n.0, &n.1));
        assert_eq!(pages, vec![0, 1, 3, 5, 6]);
        let firsts: Vec<u8> = data.chunks(4096).map(|c| c[0]).collect();
        assert_eq!(firsts, vec![10, 1, 33, 5, 66]);
        assert_eq!((moved, dropped), (2, 1));
    }

    #[test]
    fn either_side_may_be_empty() {
        let v = (vec![2u64], page(2));
        let (pages, _, moved, dropped) = merge_pages((&v.0, &v.1), (&[], &[]));
        assert_eq!((pages, moved, dropped), (vec![2], 1, 0));
        let (pages, _, moved, dropped) = merge_pages((&[], &[]), (&v.0, &v.1));
        assert_eq!((pages, moved, dropped), (vec![2], 0, 0));
    }
}
