//! Tests of multi-stage planning and of `COPY --from`'s tar reshaping.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;

use super::*;

fn images(refs: &[&str]) -> BTreeMap<String, BaseImage> {
    refs.iter()
        .map(|r| {
            (
                r.to_string(),
                BaseImage {
                    digest: format!("sha256:{r}"),
                    config: ImageConfig {
                        env: vec![format!("FROM_IMAGE={r}")],
                        ..Default::default()
                    },
                },
            )
        })
        .collect()
}

const THREE: &str = "ARG BASE=deb\n\
    FROM ${BASE} AS Build\n\
    ENV STAGE=build\n\
    WORKDIR /src\n\
    COPY app.txt ./\n\
    RUN make\n\
    FROM tools:1 AS unused\n\
    RUN never\n\
    FROM deb AS test\n\
    COPY --from=build /src/out /test/\n\
    RUN check\n\
    FROM build AS final\n\
    COPY --from=1 /x /y\n\
    COPY --from=test --chmod=700 /test/out /usr/local/bin/app\n\
    COPY --from=helper:2 /bin/tool /usr/local/bin/\n\
    CMD [\"app\"]\n";

#[test]
fn outline_names_the_images_of_the_needed_stages() {
    let o = outline(THREE, &BTreeMap::new(), None).unwrap();
    assert_eq!(o.stages, 4);
    assert_eq!(o.target, 3);
    // `unused` is needed (COPY --from=1), so tools:1 is named.
    assert_eq!(o.images, ["deb", "tools:1", "helper:2"]);
    let o = outline(THREE, &BTreeMap::new(), Some("TEST")).unwrap();
    assert_eq!((o.target, o.images.clone()), (2, vec!["deb".to_string()]));
    let e = outline(THREE, &BTreeMap::new(), Some("nope")).unwrap_err();
    assert!(e.to_string().contains("build, unused, test, final"), "{e}");
    let args = BTreeMap::from([("BASE".to_string(), "alt".to_string())]);
    let o = outline(THREE, &args, Some("build")).unwrap();
    assert_eq!(o.images, ["alt"]);
}

#[test]
fn three_stages_plan_in_order_with_copy_from() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("app.txt"), "x").unwrap();
    let imgs = images(&["deb", "tools:1", "helper:2"]);
    let b = plan_build(THREE, t.path(), &BTreeMap::new(), None, &imgs).unwrap();
    let idx: Vec<usize> = b.stages.iter().map(|s| s.index).collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    assert_eq!(b.stages[0].name.as_deref(), Some("build"));
    assert_eq!(b.stages[3].from, StageFrom::Stage(0));
    assert_eq!(b.root_image(), "deb");
    // The final stage inherits build's config and adds CMD.
    let c = &b.target().config;
    assert!(c.env.contains(&"STAGE=build".to_string()), "{c:?}");
    assert_eq!(c.working_dir.as_deref(), Some("/src"));
    assert_eq!(c.cmd, ["app"]);
    // The test stage starts from the image, not from build.
    assert!(!b.stages[2].config.env.contains(&"STAGE=build".to_string()));
    let kinds: Vec<&StepKind> = b.stages[3].steps.iter().map(|s| &s.kind).collect();
    match kinds[1] {
        StepKind::CopyFrom {
            source,
            source_key,
            srcs,
            dest,
            into_dir,
            chmod,
            ..
        } => {
            assert_eq!(source, &CopySource::Stage(2));
            assert_eq!(source_key, &b.stages[2].final_key);
            assert_eq!(srcs, &["/test/out"]);
            assert_eq!((dest.as_str(), *into_dir), ("/usr/local/bin/app", false));
            assert_eq!(*chmod, Some(0o700));
        }
        k => panic!("{k:?}"),
    }
    match kinds[2] {
        StepKind::CopyFrom {
            source,
            source_key,
            into_dir,
            ..
        } => {
            assert_eq!(source, &CopySource::Image("helper:2".into()));
            assert_eq!(source_key, "sha256:helper:2");
            assert!(*into_dir);
        }
        k => panic!("{k:?}"),
    }
    // The final stage's key chain starts at build's last step.
    let first = &b.stages[3].steps[0];
    assert_ne!(first.cache_key, b.stages[0].final_key);
    // An edit in the test stage changes the final stage's keys (through
    // its source key), not build's.
    let edited = THREE.replace("RUN check", "RUN check2");
    let b2 = plan_build(&edited, t.path(), &BTreeMap::new(), None, &imgs).unwrap();
    assert_eq!(b2.stages[0].final_key, b.stages[0].final_key);
    assert_eq!(
        b2.stages[3].steps[0].cache_key,
        b.stages[3].steps[0].cache_key
    );
    assert_ne!(b2.stages[3].final_key, b.stages[3].final_key);
}

#[test]
fn target_skips_what_it_does_not_need() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("app.txt"), "x").unwrap();
    let imgs = images(&["deb"]);
    let b = plan_build(THREE, t.path(), &BTreeMap::new(), Some("test"), &imgs).unwrap();
    let idx: Vec<usize> = b.stages.iter().map(|s| s.index).collect();
    assert_eq!(idx, [0, 2]);
    assert!(
        b.warnings.iter().any(|w| w.contains("2 stage(s)")),
        "{:?}",
        b.warnings
    );
}

#[test]
fn copy_from_errors() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images(&["deb"]);
    let cases = [
        (
            "FROM deb AS x\nCOPY --from=later /a /b\nFROM deb AS later\nFROM x",
            "names no earlier stage",
        ),
        (
            "FROM deb AS a\nCOPY --from=a /a /b",
            "names no earlier stage",
        ),
        ("FROM deb AS a\nFROM deb\nCOPY --from=a /x* /b/", "wildcard"),
        (
            "FROM deb AS a\nFROM deb\nCOPY --from=a /x /y /b",
            "ending in '/'",
        ),
        (
            "FROM deb AS a\nFROM deb\nCOPY --from=a --keep-git-dir /x /b",
            "COPY --keep-git-dir",
        ),
        ("FROM deb AS 1a\n", "invalid stage name"),
    ];
    for (df, want) in cases {
        let e = plan_build(df, t.path(), &BTreeMap::new(), None, &imgs)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{df}: {e}");
    }
}

/// A tar as the guest's `get_archive` sends it: absolute names without
/// the leading `/`.
fn guest_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(if kind.is_dir() { 0o755 } else { 0o640 });
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_mtime(1_650_000_000);
        h.set_size(data.len() as u64);
        match link {
            Some(l) => b.append_link(&mut h, name, l).unwrap(),
            None => b.append_data(&mut h, name, data).unwrap(),
        }
    };
    add("src/out", tar::EntryType::Directory, b"", None);
    add("src/out/bin", tar::EntryType::Regular, b"ELF", None);
    add("src/out/lib", tar::EntryType::Directory, b"", None);
    add("src/out/lib/x.so", tar::EntryType::Regular, b"so", None);
    add(
        "src/out/lib/y.so",
        tar::EntryType::Link,
        b"",
        Some("src/out/lib/x.so"),
    );
    add("src/out/link", tar::EntryType::Symlink, b"", Some("bin"));
    b.into_inner().unwrap()
}

fn rows(tar: &[u8]) -> Vec<(String, u32, u64, u64, String)> {
    let mut a = tar::Archive::new(tar);
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut s = String::new();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            e.read_to_string(&mut s).unwrap();
            let h = e.header();
            (
                name,
                h.mode().unwrap(),
                h.uid().unwrap(),
                h.mtime().unwrap(),
                link.unwrap_or(s),
            )
        })
        .collect()
}

#[test]
fn reshape_a_directory_and_a_file() {
    let tar = guest_tar();
    // A directory: its contents go into dest, owned by root, mtimes kept.
    let (at, out) = reshape_from(&tar, "/src/out", "/app", false, None).unwrap();
    assert_eq!(at, "/app");
    let r = rows(&out);
    let names: Vec<&str> = r.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ["bin", "lib", "lib/x.so", "lib/y.so", "link"]);
    assert!(r.iter().all(|r| r.2 == 0 && r.3 == 1_650_000_000), "{r:?}");
    assert_eq!(r[3].4, "lib/x.so", "the hardlink follows its target");
    assert_eq!(r[4].4, "bin");
    // A file to a file path: named dest, put in its parent; --chmod.
    let file_tar = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(3);
        h.set_mtime(7);
        b.append_data(&mut h, "src/out/bin", &b"ELF"[..]).unwrap();
        b.into_inner().unwrap()
    };
    let (at, out) = reshape_from(
        &file_tar,
        "/src/out/bin",
        "/usr/local/bin/app",
        false,
        Some(0o700),
    )
    .unwrap();
    assert_eq!(at, "/usr/local/bin");
    assert_eq!(rows(&out), [("app".into(), 0o700, 0, 7, "ELF".into())]);
    // Into a directory: keeps its name.
    let (at, out) = reshape_from(&file_tar, "/src/out/bin", "/opt/", true, None).unwrap();
    assert_eq!((at.as_str(), rows(&out)[0].0.as_str()), ("/opt/", "bin"));
    // Missing, and an entry outside the source.
    let e = reshape_from(&file_tar, "/nope", "/x", false, None).unwrap_err();
    assert!(e.to_string().contains("outside"), "{e}");
    let empty = tar::Builder::new(Vec::new()).into_inner().unwrap();
    let e = reshape_from(&empty, "/nope", "/x", false, None).unwrap_err();
    assert!(e.to_string().contains("not in the source"), "{e}");
}
