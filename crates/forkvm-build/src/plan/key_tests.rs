//! Cache key tests: stable for the same inputs, chained, and sensitive
//! exactly to what a step does.

use super::*;

const DF: &str =
    "FROM a\nRUN apt-get install x\nCOPY src /src\nWORKDIR /app\nCOPY app.py .\nRUN python3 app.py";

fn keys(p: &Plan) -> Vec<String> {
    p.steps.iter().map(|s| s.cache_key.clone()).collect()
}

/// How many leading keys two plans share.
fn shared(a: &Plan, b: &Plan) -> usize {
    keys(a)
        .iter()
        .zip(keys(b))
        .take_while(|(x, y)| **x == *y)
        .count()
}

#[test]
fn same_inputs_same_keys() {
    let f = Fixture::new();
    let a = f.plan(DF);
    let b = f.plan(DF);
    assert_eq!(keys(&a).len(), 5);
    assert_eq!(keys(&a), keys(&b));
    for k in keys(&a) {
        assert_eq!(k.len(), 64);
        assert!(k.chars().all(|c| c.is_ascii_hexdigit()));
    }
    let mut uniq = keys(&a);
    uniq.dedup();
    assert_eq!(uniq.len(), 5, "every step has its own key");
    // The same context copied elsewhere gives the same keys: host paths
    // are not part of them.
    let g = Fixture::new();
    assert_eq!(keys(&g.plan(DF)), keys(&a));
    // Comments, blank lines, continuations and keyword case do not matter.
    let reformatted = "# hi\nFROM a\n\nrun apt-get install x\nCOPY src \\\n  /src\nWORKDIR /app\nCOPY app.py .\nRUN python3 app.py\n";
    assert_eq!(keys(&f.plan(reformatted)), keys(&a));
    assert_eq!(a.dockerfile_digest.len(), 64);
    assert_ne!(f.plan(reformatted).dockerfile_digest, a.dockerfile_digest);
}

#[test]
fn editing_the_last_step_changes_only_its_key() {
    let f = Fixture::new();
    let a = f.plan(DF);
    let b = f.plan(&DF.replace("RUN python3 app.py", "RUN python3 -u app.py"));
    assert_eq!(shared(&a, &b), 4);
    assert_ne!(keys(&a)[4], keys(&b)[4]);
    // A config-only change just before the last step changes only it.
    let c = f.plan(&DF.replace("RUN python3", "ENV X=1\nRUN python3"));
    assert_eq!(shared(&a, &c), 4);
    // …and one at the end changes no key, only the final config.
    let d = f.plan(&format!("{DF}\nCMD [\"x\"]\nLABEL a=b"));
    assert_eq!(keys(&a), keys(&d));
    assert_ne!(a.final_config, d.final_config);
    // An ARG is in the environment of later RUNs only: WORKDIR and COPY
    // keep their keys.
    let e = f.plan(&DF.replace("WORKDIR", "ARG UNUSED=1\nWORKDIR"));
    assert_eq!(shared(&a, &e), 4);
}

#[test]
fn file_content_not_mtime_decides() {
    let f = Fixture::new();
    let a = f.plan(DF);
    // Rewrite app.py with the same content (new mtime, new inode).
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(f.path().join("app.py"), "print('hi')\n").unwrap();
    let b = f.plan(DF);
    assert_eq!(keys(&a), keys(&b));
    // New content: that COPY and every later step change.
    fs::write(f.path().join("app.py"), "print('bye')\n").unwrap();
    let c = f.plan(DF);
    assert_eq!(shared(&a, &c), 3);
    assert_ne!(keys(&a)[4], keys(&c)[4]);
    // A file under a copied directory counts too, as do its mode and a
    // new empty directory.
    fs::write(f.path().join("src/b/c.py"), "changed\n").unwrap();
    let d = f.plan(DF);
    assert_eq!(shared(&c, &d), 1);
    fs::set_permissions(
        f.path().join("src/a.py"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let e = f.plan(DF);
    assert_eq!(shared(&d, &e), 1);
    fs::create_dir(f.path().join("src/new")).unwrap();
    let g = f.plan(DF);
    assert_eq!(shared(&e, &g), 1);
    // A file .dockerignore excludes does not.
    fs::write(f.path().join(".dockerignore"), "src/*.log\n").unwrap();
    let h = f.plan(DF);
    fs::write(f.path().join("src/x.log"), "noise").unwrap();
    assert_eq!(keys(&h), keys(&f.plan(DF)));
    // A symlink's target counts.
    std::os::unix::fs::symlink("a.py", f.path().join("src/l")).unwrap();
    let i = f.plan(DF);
    fs::remove_file(f.path().join("src/l")).unwrap();
    std::os::unix::fs::symlink("b", f.path().join("src/l")).unwrap();
    assert_eq!(shared(&i, &f.plan(DF)), 1);
}

#[test]
fn base_and_build_args_change_keys() {
    let f = Fixture::new();
    let a = f.plan(DF);
    let other = BaseImage {
        digest: "sha256:2222".into(),
        ..base()
    };
    let b = plan(DF, f.path(), &BTreeMap::new(), &other).unwrap();
    assert_eq!(shared(&a, &b), 0);
    // The base config is part of every step's environment.
    let mut cfg = base();
    cfg.config.env.push("NEW=1".into());
    let c = plan(DF, f.path(), &BTreeMap::new(), &cfg).unwrap();
    assert_eq!(shared(&a, &c), 0);
    let df = "FROM a\nARG V=1\nRUN echo\nRUN echo $V";
    let one = f.plan(df);
    let two = f.plan_args(df, &[("V", "2")]).unwrap();
    assert_eq!(shared(&one, &two), 0, "ARG values are in RUN's environment");
    assert_eq!(keys(&one), keys(&f.plan_args(df, &[("V", "1")]).unwrap()));
}

#[test]
fn owner_mode_dest_and_user_change_keys() {
    let f = Fixture::new();
    let base_df = "FROM a\nRUN x\nCOPY app.py /a/\nRUN y";
    let a = f.plan(base_df);
    for variant in [
        "FROM a\nRUN x\nCOPY --chown=1:1 app.py /a/\nRUN y",
        "FROM a\nRUN x\nCOPY --chmod=700 app.py /a/\nRUN y",
        "FROM a\nRUN x\nCOPY app.py /b/\nRUN y",
        "FROM a\nRUN x\nCOPY app.py /a/z.py\nRUN y",
        "FROM a\nRUN x\nUSER 1\nCOPY app.py /a/\nRUN y",
    ] {
        let b = f.plan(variant);
        assert_eq!(shared(&a, &b), 1, "{variant}");
    }
}
