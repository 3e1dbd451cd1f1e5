//! Unit tests of the store: publication, verification, sweeping and
//! reserved layers.

use super::*;

fn manifest(id: &str, files: &[(&str, &str)]) -> Manifest {
    let mut m = manifest::tests_support::sample();
    m.id = id.into();
    m.artefacts = files
        .iter()
        .map(|(kind, file)| Artefact {
            kind: kind.to_string(),
            file: file.to_string(),
            size: 0,
            allocated: 0,
            sha256: String::new(),
        })
        .collect();
    m
}

fn staged(store: &Store, id: &str) -> Staging {
    let st = store.begin(id).unwrap();
    std::fs::write(st.path(MEMORY), vec![7u8; 10_000]).unwrap();
    std::fs::write(st.path(DEVICE_STATE), b"device state").unwrap();
    st
}

#[test]
fn publish_is_atomic_and_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let st = staged(&store, "sn-a");
    assert!(
        store.ids().is_empty(),
        "a staging snapshot must not be listed"
    );
    let s = store
        .publish(
            st,
            manifest(
                "sn-a",
                &[("memory", MEMORY), ("device_state", DEVICE_STATE)],
            ),
        )
        .unwrap();
    assert_eq!(store.ids(), vec!["sn-a"]);
    let s2 = store.open_snapshot("sn-a").unwrap();
    assert_eq!(s2.digest, s.digest);
    assert_eq!(s2.manifest.artefact("memory").unwrap().size, 10_000);
    store.verify(&s2).unwrap();
    // Files are read-only.
    let mode = std::fs::metadata(s2.path(MEMORY))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o444);
}

#[test]
fn sweep_removes_staging_dirs_and_heads_built_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let _kept = staged(&store, "sn-a");
    let pre = dir.path().join(head::prebuild_name("sn-b"));
    std::fs::write(&pre, b"half a head").unwrap();
    let left = store.sweep();
    assert!(left.is_empty(), "{left:?}");
    assert!(!pre.exists(), "a head file built ahead is swept");
    let rest: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(rest.is_empty(), "staging swept too: {rest:?}");
}

#[test]
fn corrupted_artefacts_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let st = staged(&store, "sn-b");
    let s = store
        .publish(
            st,
            manifest(
                "sn-b",
                &[("memory", MEMORY), ("device_state", DEVICE_STATE)],
            ),
        )
        .unwrap();
    // Flip one byte of the memory image (same size): caught by the
    // digest because the write changed the file's mtime/ctime.
    let p = s.path(MEMORY);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut b = std::fs::read(&p).unwrap();
    b[5000] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let e = store.verify(&s).unwrap_err().to_string();
    assert!(e.contains("memory.img does not match"), "{e}");
    // Truncation is caught by size.
    std::fs::write(&p, &b[..100]).unwrap();
    let e = store.verify(&s).unwrap_err().to_string();
    assert!(e.contains("100 bytes"), "{e}");
    // A deleted artefact.
    std::fs::remove_file(s.path(DEVICE_STATE)).unwrap();
    std::fs::write(&p, vec![7u8; 10_000]).unwrap();
    assert!(store.verify(&s).is_err());
}

#[test]
fn corrupted_manifest_is_detected_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let st = staged(&store, "sn-c");
    let s = store
        .publish(st, manifest("sn-c", &[("memory", MEMORY)]))
        .unwrap();
    let mp = s.path(MANIFEST);
    std::fs::set_permissions(&mp, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut b = std::fs::read(&mp).unwrap();
    b[30] ^= 0x20;
    std::fs::write(&mp, &b).unwrap();
    let e = store.open_snapshot("sn-c").unwrap_err().to_string();
    assert!(e.contains("corrupted") && e.contains("checksum"), "{e}");
    // A manifest copied under another id is refused too.
    std::fs::create_dir(dir.path().join("sn-d")).unwrap();
    std::fs::write(
        dir.path().join("sn-d").join(MANIFEST),
        manifest("sn-c", &[]).encode(),
    )
    .unwrap();
    assert!(store
        .open_snapshot("sn-d")
        .unwrap_err()
        .to_string()
        .contains("names snapshot"));
    assert!(matches!(
        store.open_snapshot("sn-zz"),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn leftovers_of_crashed_writers_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let st = staged(&store, "sn-e");
        std::mem::forget(st); // as if the daemon died mid-write
    }
    assert!(dir.path().join(".tmp-sn-e").exists());
    let store = Store::open(dir.path()).unwrap();
    assert!(!dir.path().join(".tmp-sn-e").exists());
    assert!(store.ids().is_empty());
    // A staging dropped without publish is removed.
    drop(staged(&store, "sn-f"));
    assert!(!dir.path().join(".tmp-sn-f").exists());
}

#[test]
fn remove_makes_it_disappear() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let st = staged(&store, "sn-g");
    std::fs::write(st.path(MEMORY_DIFF), b"pages").unwrap();
    std::fs::write(st.path(DISK), b"layer").unwrap();
    store
        .publish(
            st,
            manifest(
                "sn-g",
                &[
                    ("memory", MEMORY),
                    ("memory_diff", MEMORY_DIFF),
                    ("disk", DISK),
                ],
            ),
        )
        .unwrap();
    // A flattened head (a cache beside the artefacts) and a crashed build.
    for f in [head::HEAD, head::STAMP, head::TMP] {
        std::fs::write(dir.path().join("sn-g").join(f), b"head").unwrap();
    }
    store.remove("sn-g").unwrap();
    assert!(store.ids().is_empty());
    // Everything but the disk layer goes at once (other layers' headers
    // may name it; layer collection deletes it later).
    let left: Vec<String> = std::fs::read_dir(dir.path().join("sn-g"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, [DISK]);
    assert!(matches!(store.remove("sn-g"), Err(StoreError::NotFound(_))));
}

/// A frozen layer reserved at its final path exists from before anything
/// names it until layer collection, whatever happens to its snapshot.
#[test]
fn a_reserved_layer_is_in_place_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let top = dir.path().join("top.qcow2");
    std::fs::write(&top, b"layer").unwrap();
    let layer = |id: &str| dir.path().join(id).join(DISK);

    // Published: the other files join the layer, the manifest last.
    let mut st = staged(&store, "sn-r1");
    let p = store.reserve_layer(&mut st, &top).unwrap();
    assert_eq!(p, layer("sn-r1"));
    assert_eq!(st.path(DISK), p);
    assert!(store.ids().is_empty(), "not listed before publication");
    assert!(
        store.orphan_layers().is_empty(),
        "a reserved layer is no collection candidate"
    );
    let files = [
        ("memory", MEMORY),
        ("device_state", DEVICE_STATE),
        ("disk", DISK),
    ];
    let s = store.publish(st, manifest("sn-r1", &files)).unwrap();
    assert_eq!(store.ids(), vec!["sn-r1"]);
    store.verify(&s).unwrap();
    assert!(!dir.path().join(".tmp-sn-r1").exists());
    assert_eq!(
        std::fs::metadata(&top).unwrap().ino(),
        std::fs::metadata(layer("sn-r1")).unwrap().ino(),
        "the layer is the source's file, linked"
    );

    // A crash after some files moved in: not listed; the restart keeps
    // only the layer, which becomes an ordinary orphan layer.
    let top2 = dir.path().join("top2.qcow2");
    std::fs::write(&top2, b"layer 2").unwrap();
    let mut st = staged(&store, "sn-r2");
    store.reserve_layer(&mut st, &top2).unwrap();
    std::fs::rename(st.path(MEMORY), dir.path().join("sn-r2").join(MEMORY)).unwrap();
    std::mem::forget(st);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.ids(), vec!["sn-r1"]);
    let left: Vec<_> = std::fs::read_dir(dir.path().join("sn-r2"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [DISK], "only the layer survives the sweep");
    assert!(!dir.path().join(".tmp-sn-r2").exists());
    assert_eq!(store.orphan_layers(), vec![dir.path().join("sn-r2")]);

    // Dropped (a failed publish): the layer stays, the rest goes.
    let mut st = staged(&store, "sn-r3");
    store.reserve_layer(&mut st, &top2).unwrap();
    std::fs::write(dir.path().join("sn-r3").join(MEMORY), b"moved").unwrap();
    drop(st);
    assert!(layer("sn-r3").exists());
    assert!(!dir.path().join("sn-r3").join(MEMORY).exists());
    assert!(store.orphan_layers().contains(&dir.path().join("sn-r3")));

    // Discarded (failed before the freeze): nothing left.
    let mut st = staged(&store, "sn-r4");
    store.reserve_layer(&mut st, &top2).unwrap();
    st.discard_layer();
    drop(st);
    assert!(!dir.path().join("sn-r4").exists());
    assert!(top2.exists(), "the source's own file is untouched");
}

#[test]
fn sparse_copy_keeps_holes_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    {
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"hello", 10 << 20).unwrap();
        f.write_all_at(&[0u8; 8192], 20 << 20).unwrap(); // explicit zeros
        f.write_all_at(&[9u8; 5000], (64 << 20) - 5000).unwrap();
    }
    let n = sparse_copy(&src, &dst).unwrap();
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    assert!(n <= 3 * 4096 + 8192, "copied {n} bytes of data");
    let alloc = std::fs::metadata(&dst).unwrap().blocks() * 512;
    assert!(alloc < 1 << 20, "destination is not sparse: {alloc}");
}

/// Publish a diff snapshot `id` over `parent` storing `pages`, each filled
/// with its page number plus `salt`.
fn publish_diff(
    store: &Store,
    id: &str,
    parent: Option<&Snapshot>,
    pages: &[u64],
    salt: u8,
) -> Snapshot {
    let st = store.begin(id).unwrap();
    let data: Vec<u8> = pages
        .iter()
        .flat_map(|&p| vec![p as u8 + salt; 4096])
        .collect();
    memdiff::write(&st.path(MEMORY_DIFF), 64 * 4096, pages, &data).unwrap();
    std::fs::write(st.path(DEVICE_STATE), b"device state").unwrap();
    let mut m = manifest(
        id,
        &[("memory_diff", MEMORY_DIFF), ("device_state", DEVICE_STATE)],
    );
    m.parent = parent.map(|p| ParentRef {
        id: p.manifest.id.clone(),
        manifest_sha256: p.digest.clone(),
    });
    store.publish(st, m).unwrap()
}

#[test]
fn splicing_a_link_out_keeps_the_next_ones_view() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let p = publish_diff(&store, "sn-p", None, &[0], 0);
    let v = publish_diff(&store, "sn-v", Some(&p), &[1, 2, 5], 10);
    let n = publish_diff(&store, "sn-n", Some(&v), &[2, 3], 20);
    let above = publish_diff(&store, "sn-a", Some(&n), &[4], 30);
    let s = store.splice_out("sn-v", "sn-n").unwrap();
    assert_eq!((s.moved_pages, s.dropped_pages), (2, 1));
    assert!(store.open_snapshot("sn-v").is_err(), "the victim is gone");
    let n2 = store.open_snapshot("sn-n").unwrap();
    assert_eq!(n2.manifest.parent.as_ref().unwrap().id, "sn-p");
    assert!(
        n2.answers_to(&n.digest),
        "the old digest is still answered to"
    );
    assert!(!n2.answers_to(&v.digest));
    store.verify(&n2).unwrap();
    let d = memdiff::MemDiff::open(&n2.memory_diff_path()).unwrap();
    assert_eq!(d.pages, [1, 2, 3, 5]);
    let firsts: Vec<u8> = d.read_data().unwrap().chunks(4096).map(|c| c[0]).collect();
    // n's own pages win over v's.
    assert_eq!(firsts, [11, 22, 23, 15]);
    // The link above still names n by its old digest, and n answers.
    assert!(n2.answers_to(&above.manifest.parent.as_ref().unwrap().manifest_sha256));
    // The old file is gone and nothing is left to tidy.
    assert!(!n2.path(MEMORY_DIFF).exists());
    assert!(store.tidy_splices().is_empty());
    // Removing it later removes the file its manifest names.
    store.remove("sn-a").unwrap();
    store.remove("sn-n").unwrap();
    assert!(!dir.path().join("sn-n").exists());
}

#[test]
fn a_splice_refuses_links_that_are_not_parent_and_child() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let p = publish_diff(&store, "sn-p", None, &[0], 0);
    let _v = publish_diff(&store, "sn-v", Some(&p), &[1], 0);
    let _w = publish_diff(&store, "sn-w", Some(&p), &[2], 0);
    assert!(matches!(
        store.splice_out("sn-v", "sn-w"),
        Err(StoreError::Corrupt { .. })
    ));
    // Nothing changed.
    assert_eq!(store.ids(), ["sn-p", "sn-v", "sn-w"]);
    assert!(store.tidy_splices().is_empty());
}

#[test]
fn tidy_removes_what_an_interrupted_splice_left() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let p = publish_diff(&store, "sn-p", None, &[0], 0);
    std::fs::write(p.dir.join("memory.1.diff"), b"half").unwrap();
    std::fs::write(p.dir.join("manifest.fvs.splice"), b"half").unwrap();
    assert_eq!(store.tidy_splices().len(), 2);
    store.verify(&store.open_snapshot("sn-p").unwrap()).unwrap();
}
