//! Which disk layers the live chains go through, for layer collection
//! ([`crate::manager::Manager::collect_layers`]).
//!
//! Each root (a sandbox's disk file, a published snapshot's layer) is
//! followed through the backing files its qcow2 headers name
//! ([`forkvm_qemu::qcow2`], no process per chain). One chain that cannot be
//! read does not stop the collection of the whole home:
//!
//! * a chain **broken** at a link, because the file a header names is
//!   missing or a header is not valid qcow2, is cut there: the layers up to
//!   the break are kept, the chain is reported (with the sandbox or
//!   snapshot it belongs to), and the rest of the home is collected.
//!   Nothing beyond the break can be read through it by anyone, QEMU and
//!   `qemu-img` included, so deleting it cannot break it further;
//! * a chain that **cannot be read right now** (any other I/O error: too
//!   many open files, EIO) might go through anything: nothing is deleted in
//!   that pass, and the next pass tries again.

use std::collections::HashSet;
use std::path::PathBuf;

use forkvm_qemu::qcow2::{self, Qcow2Error};

/// A root of layer collection and what it belongs to (a sandbox or
/// snapshot id, for the report).
pub struct Root {
    pub owner: String,
    pub file: PathBuf,
}

/// A chain that could not be followed to its base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub owner: String,
    pub file: PathBuf,
    pub why: String,
}

/// What the roots' chains go through.
#[derive(Debug, Default)]
pub struct Referenced {
    pub files: HashSet<PathBuf>,
    /// Chains cut at a missing or corrupt link: collected around.
    pub broken: Vec<Unreadable>,
    /// A chain that could not be read for another reason: delete nothing.
    pub unsure: Option<Unreadable>,
}

/// Follow every root's chain.
pub fn referenced(roots: &[Root]) -> Referenced {
    let mut out = Referenced::default();
    for r in roots {
        let mut cur = r.file.clone();
        let mut seen = 0usize;
        loop {
            let res = qcow2::backing_file(&cur);
            let missing = matches!(&res, Err(Qcow2Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound);
            // A root gone while we looked (a sandbox removed) names nothing.
            if missing && cur == r.file {
                break;
            }
            let unreadable = |why: String| Unreadable {
                owner: r.owner.clone(),
                file: r.file.clone(),
                why,
            };
            match res {
                Ok(next) => {
                    out.files.insert(cur.clone());
                    seen += 1;
                    match next {
                        Some(n) if seen < qcow2::MAX_CHAIN && !out.files.contains(&n) => cur = n,
                        // The base, or a file another chain already took
                        // from here on (or a loop, which ends here too).
                        _ => break,
                    }
                }
                Err(e) if missing => {
                    out.broken
                        .push(unreadable(format!("{} is missing ({e})", cur.display())));
                    break;
                }
                Err(e @ Qcow2Error::Corrupt { .. }) => {
                    out.broken.push(unreadable(e.to_string()));
                    break;
                }
                Err(e) => {
                    if out.unsure.is_none() {
                        out.unsure = Some(unreadable(e.to_string()));
                    }
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal qcow2 header naming `backing`.
    fn qcow2(p: &std::path::Path, backing: Option<&std::path::Path>) {
        let mut h = vec![0u8; 512];
        h[..4].copy_from_slice(qcow2::MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        if let Some(b) = backing {
            let b = b.to_str().unwrap();
            h[8..16].copy_from_slice(&256u64.to_be_bytes());
            h[16..20].copy_from_slice(&(b.len() as u32).to_be_bytes());
            h[256..256 + b.len()].copy_from_slice(b.as_bytes());
        }
        std::fs::write(p, h).unwrap();
    }

    fn root(owner: &str, file: &std::path::Path) -> Root {
        Root {
            owner: owner.into(),
            file: file.to_path_buf(),
        }
    }

    #[test]
    fn a_broken_chain_is_cut_and_reported_and_the_rest_still_counts() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p("base.img"), vec![0u8; 4096]).unwrap();
        qcow2(&p("a.qcow2"), Some(&p("base.img")));
        qcow2(&p("b.qcow2"), Some(&p("a.qcow2")));
        // Names a layer that was never created (the crash of issue 30).
        qcow2(&p("top1.qcow2"), Some(&p("gone.qcow2")));
        // A header that is not valid qcow2 (a version QEMU never wrote).
        let mut bad = vec![0u8; 512];
        bad[..4].copy_from_slice(qcow2::MAGIC);
        bad[4..8].copy_from_slice(&99u32.to_be_bytes());
        std::fs::write(p("mid.qcow2"), bad).unwrap();
        qcow2(&p("top2.qcow2"), Some(&p("mid.qcow2")));
        let r = referenced(&[
            root("sb-broken", &p("top1.qcow2")),
            root("sn-corrupt", &p("top2.qcow2")),
            root("sb-good", &p("b.qcow2")),
            root("sb-removed", &p("no-such-root.qcow2")),
        ]);
        assert!(r.unsure.is_none(), "{:?}", r.unsure);
        let owners: Vec<&str> = r.broken.iter().map(|b| b.owner.as_str()).collect();
        assert_eq!(owners, ["sb-broken", "sn-corrupt"]);
        assert!(r.broken[0].why.contains("gone.qcow2"), "{:?}", r.broken[0]);
        assert!(r.broken[1].why.contains("version"), "{:?}", r.broken[1]);
        // What the broken chains reach before the break is kept, and the
        // good chain counts in full.
        for f in ["top1.qcow2", "top2.qcow2", "b.qcow2", "a.qcow2", "base.img"] {
            assert!(r.files.contains(&p(f)), "{f} not referenced");
        }
        assert!(!r.files.contains(&p("no-such-root.qcow2")));
    }

    #[test]
    fn a_chain_that_cannot_be_read_now_makes_the_pass_unsure() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        qcow2(&p("top.qcow2"), Some(&p("dir.qcow2")));
        // Reading a directory fails with EISDIR: not missing, not corrupt.
        std::fs::create_dir(p("dir.qcow2")).unwrap();
        let r = referenced(&[root("sb-x", &p("top.qcow2"))]);
        let u = r.unsure.expect("an unreadable link makes the pass unsure");
        assert_eq!(u.owner, "sb-x");
        assert!(r.broken.is_empty());
    }

    /// The issue 30 case end to end in the store: one sandbox's chain names
    /// a layer that does not exist; the layer nothing names is still
    /// collected, and the one a good chain names is kept.
    #[test]
    fn one_broken_chain_does_not_stop_collection() {
        let d = tempfile::tempdir().unwrap();
        let store = forkvm_store::Store::open(&d.path().join("snapshots")).unwrap();
        let layer = |id: &str| {
            let dir = store.dir(id);
            std::fs::create_dir_all(&dir).unwrap();
            dir.join(forkvm_store::DISK)
        };
        let base = d.path().join("base.img");
        std::fs::write(&base, vec![0u8; 4096]).unwrap();
        let (kept, unused) = (layer("sn-kept"), layer("sn-unused"));
        qcow2(&kept, Some(&base));
        qcow2(&unused, Some(&base));
        let (good, broken) = (d.path().join("good.qcow2"), d.path().join("broken.qcow2"));
        qcow2(&good, Some(&kept));
        qcow2(
            &broken,
            Some(&store.dir("sn-never").join(forkvm_store::DISK)),
        );
        let candidates = store.orphan_layers();
        assert_eq!(candidates.len(), 2);
        let r = referenced(&[root("sb-broken", &broken), root("sb-good", &good)]);
        assert_eq!(r.broken.len(), 1);
        assert!(r.unsure.is_none());
        let gone = store.collect_layers(&candidates, &r.files);
        assert_eq!(gone, vec![store.dir("sn-unused")]);
        assert!(kept.exists());
    }

    #[test]
    fn loops_end() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        qcow2(&p("x.qcow2"), Some(&p("y.qcow2")));
        qcow2(&p("y.qcow2"), Some(&p("x.qcow2")));
        let r = referenced(&[root("sb-l", &p("x.qcow2"))]);
        assert_eq!(r.files.len(), 2);
    }
}
