//! Tests of the planner: every instruction form, scoping, destinations,
//! the forkvm directives and cache keys.

use super::*;
use crate::archive::ArchiveEntry;
use forkvm_image::meta::ReadyCheck;
use std::fs;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A context with `app.py`, `req.txt`, `src/{a.py,b/c.py}`.
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        fs::create_dir_all(r.join("src/b")).unwrap();
        fs::write(r.join("app.py"), "print('hi')\n").unwrap();
        fs::write(r.join("req.txt"), "flask\n").unwrap();
        fs::write(r.join("src/a.py"), "a\n").unwrap();
        fs::write(r.join("src/b/c.py"), "c\n").unwrap();
        Fixture { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn plan_args(&self, df: &str, args: &[(&str, &str)]) -> Result<Plan, BuildError> {
        let args: BTreeMap<String, String> = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan(df, self.path(), &args, &base())
    }

    fn plan(&self, df: &str) -> Plan {
        self.plan_args(df, &[]).unwrap()
    }

    fn err(&self, df: &str) -> String {
        self.plan_args(df, &[]).unwrap_err().to_string()
    }
}

fn base() -> BaseImage {
    BaseImage {
        digest: "sha256:1111".into(),
        config: ImageConfig {
            env: vec!["PATH=/usr/bin:/bin".into(), "LANG=C".into()],
            cmd: vec!["python3".into()],
            ..Default::default()
        },
    }
}

fn run(s: &Step) -> (&Vec<String>, &BTreeMap<String, String>, &str, Option<&str>) {
    match &s.kind {
        StepKind::Run {
            argv,
            env,
            cwd,
            user,
        } => (argv, env, cwd.as_str(), user.as_deref()),
        k => panic!("not a RUN: {k:?}"),
    }
}

fn copy(s: &Step) -> (&str, Option<&str>, Vec<(String, String)>) {
    match &s.kind {
        StepKind::Copy {
            dest,
            owner,
            archive,
        } => (
            dest.as_str(),
            owner.as_deref(),
            archive.entries.iter().map(describe).collect(),
        ),
        k => panic!("not a COPY: {k:?}"),
    }
}

fn describe(e: &ArchiveEntry) -> (String, String) {
    let k = match &e.kind {
        EntryKind::Dir { mode } => format!("dir {mode:o}"),
        EntryKind::File { mode, .. } => format!("file {mode:o}"),
        EntryKind::Symlink { target } => format!("-> {target}"),
        EntryKind::Inline { mode, data } => {
            format!("inline {mode:o} {}", String::from_utf8_lossy(data))
        }
        EntryKind::Extract { compression, .. } => format!("extract {}", compression.name()),
    };
    (e.path.clone(), k)
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn from_forms() {
    let f = Fixture::new();
    assert_eq!(f.plan("FROM python:3.12").base, "python:3.12");
    assert_eq!(f.plan("from python AS build\n").base, "python");
    let p = f.plan("FROM --platform=linux/amd64 x");
    assert_eq!(p.base, "x");
    assert!(p.warnings[0].contains("line 1") && p.warnings[0].contains("--platform"));
    let df = "ARG V=3.11\nARG REG\nFROM ${REG:-docker.io}/python:$V";
    assert_eq!(f.plan(df).base, "docker.io/python:3.11");
    let p = f
        .plan_args(df, &[("V", "3.13"), ("REG", "127.0.0.1:5000")])
        .unwrap();
    assert_eq!(p.base, "127.0.0.1:5000/python:3.13");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(
        base_reference(df, &BTreeMap::new()).unwrap(),
        "docker.io/python:3.11"
    );
    let p = plan(
        "FROM scratch\nCOPY app.py /",
        f.path(),
        &BTreeMap::new(),
        &BaseImage::scratch(),
    )
    .unwrap();
    assert_eq!(p.base, "scratch");
    assert!(p.final_config.env.is_empty());
}

#[test]
fn from_errors() {
    let f = Fixture::new();
    let e = f.err("FROM a\nRUN x\nFROM b AS c");
    assert!(e.contains("line 3") && e.contains("multi-stage"), "{e}");
    let e = f.err("RUN x\nFROM a");
    assert!(
        e.contains("line 1") && e.contains("must start with FROM"),
        "{e}"
    );
    assert!(f.err("# nothing\n").contains("no FROM"));
    assert!(f.err("FROM a b").contains("AS name"));
    assert!(f.err("FROM").contains("line 1"));
    assert!(f.err("FROM --foo=1 a").contains("--foo"));
    assert!(f.err("ARG X\nFROM $X").contains("empty image"));
    assert!(base_reference("ENV A=1\nFROM a", &BTreeMap::new()).is_err());
}

#[test]
fn run_forms_and_environment() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\nARG V=1\nENV LANG=C.UTF-8 HOME=/root\nRUN echo $V \\\n  && true\nRUN [\"/bin/echo\", \"$V\"]\n\
         SHELL [\"/bin/bash\", \"-eu\", \"-c\"]\nRUN ls\nUSER app:app\nWORKDIR /srv\nRUN id",
    );
    assert_eq!(p.steps.len(), 4, "{:?}", p.steps);
    let (argv, env, cwd, user) = run(&p.steps[0]);
    assert_eq!(argv, &["/bin/sh", "-c", "echo $V   && true"]);
    assert_eq!(p.steps[0].text, "RUN echo $V && true");
    assert_eq!(p.steps[0].line, 4);
    assert_eq!(env["V"], "1");
    assert_eq!(env["LANG"], "C.UTF-8");
    assert_eq!(env["PATH"], "/usr/bin:/bin");
    assert_eq!((cwd, user), ("/", None));
    assert_eq!(run(&p.steps[1]).0, &["/bin/echo", "$V"]);
    assert_eq!(run(&p.steps[2]).0, &["/bin/bash", "-eu", "-c", "ls"]);
    let (_, _, cwd, user) = run(&p.steps[3]);
    assert_eq!((cwd, user), ("/srv", Some("app:app")));
    // No PATH in the image: Docker's default.
    let p = plan(
        "FROM scratch\nRUN x",
        f.path(),
        &BTreeMap::new(),
        &BaseImage::scratch(),
    )
    .unwrap();
    assert_eq!(run(&p.steps[0]).1["PATH"], DEFAULT_PATH);
    assert!(f.err("FROM a\nRUN").contains("needs a command"));
    assert!(f.err("FROM a\nRUN []").contains("no command"));
    let e = f.err("FROM a\nRUN --mount=type=cache,target=/x pip install");
    assert!(e.contains("line 2") && e.contains("RUN --mount"), "{e}");
    assert!(f.err("FROM a\nSHELL /bin/bash -c").contains("JSON array"));
    assert!(f.err("FROM a\nSHELL []").contains("JSON array"));
}

#[test]
fn env_forms() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\nENV PATH=/opt/bin:$PATH A=\"x y\" B=${A:-unset}\nENV LEGACY value with  spaces\n\
         ENV LANG=en\nENV Q='$NOT' E=a\\ b EMPTY=",
    );
    let env = p.final_config.env_map();
    assert_eq!(env["PATH"], "/opt/bin:/usr/bin:/bin");
    assert_eq!(env["A"], "x y");
    // Values see the variables from before the instruction.
    assert_eq!(env["B"], "unset");
    assert_eq!(env["LEGACY"], "value with  spaces");
    assert_eq!(env["Q"], "$NOT");
    assert_eq!(env["E"], "a b");
    assert_eq!(env["EMPTY"], "");
    // Replaced in place, order kept.
    assert_eq!(p.final_config.env[0], "PATH=/opt/bin:/usr/bin:/bin");
    assert_eq!(p.final_config.env[1], "LANG=en");
    assert!(p.steps.is_empty());
    assert!(f.err("FROM a\nENV").contains("needs KEY=value"));
    assert!(f.err("FROM a\nENV K").contains("has no value"));
    assert!(f.err("FROM a\nENV A=1 B").contains("KEY=value pairs"));
    assert!(f.err("FROM a\nENV =1").contains("empty key"));
    assert!(f.err("FROM a\nENV A=\"open").contains("line 2"));
    assert!(f
        .err("FROM a\nENV A=\"${B:?must be set}\"")
        .contains("B: must be set"));
}

#[test]
fn arg_scoping() {
    let f = Fixture::new();
    let df =
        "ARG G=global\nARG ONLY_GLOBAL=g\nFROM a\nRUN echo 1\nARG G\nARG L=${G}-local\nARG NOVAL\n\
              ENV L=env-wins\nRUN echo 2\nLABEL g=$G l=$L o=\"$ONLY_GLOBAL\" n=\"$NOVAL\"";
    let p = f.plan(df);
    let env0 = run(&p.steps[0]).1;
    assert!(
        !env0.contains_key("G"),
        "ARG before FROM is not in the stage"
    );
    let env1 = run(&p.steps[1]).1;
    assert_eq!(env1["G"], "global");
    assert_eq!(env1["L"], "env-wins");
    assert!(!env1.contains_key("NOVAL"));
    let l = &p.final_config.labels;
    assert_eq!((l["g"].as_str(), l["l"].as_str()), ("global", "env-wins"));
    assert_eq!((l["o"].as_str(), l["n"].as_str()), ("", ""));
    // ARGs are not part of the image's environment.
    assert!(!p.final_config.env_map().contains_key("G"));
    let p = f
        .plan_args(df, &[("G", "cli"), ("NOVAL", "v"), ("STRAY", "1")])
        .unwrap();
    let env1 = run(&p.steps[1]).1;
    assert_eq!((env1["G"].as_str(), env1["NOVAL"].as_str()), ("cli", "v"));
    assert_eq!(p.final_config.labels["l"], "env-wins");
    assert!(
        p.warnings.iter().any(|w| w.contains("STRAY")),
        "{:?}",
        p.warnings
    );
    assert!(f.err("FROM a\nARG").contains("needs a name"));
    assert!(f.err("FROM a\nARG a-b=1").contains("invalid ARG name"));
}

#[test]
fn workdir_user_label_expose() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\nWORKDIR /app\nWORKDIR sub/../src\nWORKDIR /app\nWORKDIR /tmp\nARG D=/data\nUSER ${U:-1000}\n\
         WORKDIR $D\nLABEL \"com.x.y\"=\"a b\" plain=1\nLABEL legacy spaced value\n\
         EXPOSE 80 8000-8002/TCP 53/udp\nEXPOSE 80/tcp",
    );
    let kinds: Vec<&StepKind> = p.steps.iter().map(|s| &s.kind).collect();
    assert_eq!(
        kinds,
        [
            &StepKind::Mkdir {
                path: "/app".into(),
                owner: None
            },
            &StepKind::Mkdir {
                path: "/app/src".into(),
                owner: None
            },
            &StepKind::Mkdir {
                path: "/data".into(),
                owner: Some("1000".into())
            },
        ]
    );
    let c = &p.final_config;
    assert_eq!(c.working_dir.as_deref(), Some("/data"));
    assert_eq!(c.user.as_deref(), Some("1000"));
    assert_eq!(c.labels["com.x.y"], "a b");
    assert_eq!(c.labels["plain"], "1");
    assert_eq!(c.labels["legacy"], "spaced value");
    assert_eq!(
        c.exposed_ports,
        ["53/udp", "80/tcp", "8000/tcp", "8001/tcp", "8002/tcp"]
    );
    assert_eq!(
        p.steps[1].config_after.working_dir.as_deref(),
        Some("/app/src")
    );
    for bad in [
        "EXPOSE",
        "EXPOSE 0",
        "EXPOSE 70000",
        "EXPOSE 80/icmp",
        "EXPOSE 9-1",
        "EXPOSE 1-5000",
        "EXPOSE x",
    ] {
        let e = f.err(&format!("FROM a\n{bad}"));
        assert!(e.contains("line 2") && e.contains("EXPOSE"), "{bad}: {e}");
    }
    assert!(f.err("FROM a\nUSER").contains("USER needs"));
    assert!(f.err("FROM a\nWORKDIR \"\"").contains("WORKDIR needs"));
}

#[test]
fn entrypoint_and_cmd() {
    let f = Fixture::new();
    // The base's CMD is kept until ENTRYPOINT resets it.
    assert_eq!(f.plan("FROM a").final_config.cmd, ["python3"]);
    let c = f.plan("FROM a\nENTRYPOINT [\"srv\", \"-v\"]").final_config;
    assert_eq!(
        (c.entrypoint, c.cmd),
        (vec!["srv".to_string(), "-v".into()], vec![])
    );
    let c = f
        .plan("FROM a\nCMD [\"--port\", \"80\"]\nENTRYPOINT srv --x")
        .final_config;
    assert_eq!(c.entrypoint, ["/bin/sh", "-c", "srv --x"]);
    assert_eq!(c.cmd, ["--port", "80"]);
    let c = f.plan("FROM a\nCMD echo $HOME\nCMD []").final_config;
    assert!(c.cmd.is_empty());
    let c = f.plan("FROM a\nCMD [ -f x ] && y").final_config;
    assert_eq!(c.cmd, ["/bin/sh", "-c", "[ -f x ] && y"]);
    assert!(f.err("FROM a\nCMD").contains("needs a command"));
}

#[test]
fn ignored_and_unknown_instructions() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\nMAINTAINER me\nSTOPSIGNAL SIGTERM\nHEALTHCHECK CMD true\nVOLUME /data\nONBUILD RUN x\nRUN y",
    );
    assert_eq!(p.warnings.len(), 5, "{:?}", p.warnings);
    assert!(
        p.warnings[2].starts_with("line 4: HEALTHCHECK") && p.warnings[2].contains("forkvm:ready")
    );
    assert_eq!(p.steps.len(), 1);
    let e = f.err("FROM a\nRUN x\nFROBNICATE y");
    assert!(
        e.contains("line 3") && e.contains("unknown instruction FROBNICATE"),
        "{e}"
    );
}

#[test]
fn copy_destinations() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\nCOPY app.py /opt/app/\nCOPY app.py /opt/app/main.py\nCOPY app.py /usr/local/bin\n\
         WORKDIR /w\nCOPY req.txt .\nCOPY req.txt r2\nCOPY src /code\nCOPY src/ dest/\nCOPY app.py req.txt ./\n\
         COPY app.py /w\nCOPY [\"src/b\", \"/opt/app/b\"]\nCOPY src/*.py src/b/*.py /py/\nCOPY app.py /code",
    );
    let got: Vec<(&str, Vec<(String, String)>)> = p
        .steps
        .iter()
        .filter(|s| matches!(s.kind, StepKind::Copy { .. }))
        .map(|s| {
            let (d, _, e) = copy(s);
            (d, e)
        })
        .collect();
    let f644 = "file 644";
    let want: Vec<(&str, Vec<(String, String)>)> = vec![
        ("/opt/app", pairs(&[("app.py", f644)])),
        ("/opt/app", pairs(&[("main.py", f644)])),
        ("/usr/local/bin", pairs(&[("app.py", f644)])),
        ("/w", pairs(&[("req.txt", f644)])),
        ("/w", pairs(&[("r2", f644)])),
        (
            "/code",
            pairs(&[("a.py", f644), ("b", "dir 755"), ("b/c.py", f644)]),
        ),
        (
            "/w/dest",
            pairs(&[("a.py", f644), ("b", "dir 755"), ("b/c.py", f644)]),
        ),
        ("/w", pairs(&[("app.py", f644), ("req.txt", f644)])),
        ("/w", pairs(&[("app.py", f644)])),
        ("/opt/app/b", pairs(&[("c.py", f644)])),
        ("/py", pairs(&[("a.py", f644), ("c.py", f644)])),
        // /code is known to be a directory since the COPY above made it.
        ("/code", pairs(&[("app.py", f644)])),
    ];
    assert_eq!(got, want);
    // After FROM scratch nothing but / is known to exist.
    let p = plan(
        "FROM scratch\nCOPY app.py /usr/local/bin",
        f.path(),
        &BTreeMap::new(),
        &BaseImage::scratch(),
    )
    .unwrap();
    assert_eq!(copy(&p.steps[0]).0, "/usr/local");
    assert_eq!(copy(&p.steps[0]).2, pairs(&[("bin", f644)]));
}

#[test]
fn copy_flags_and_errors() {
    let f = Fixture::new();
    let p = f.plan("FROM a\nARG O=app\nCOPY --chown=$O:$O --chmod=0750 --link src /s");
    let (_, owner, entries) = copy(&p.steps[0]);
    assert_eq!(owner, Some("app:app"));
    assert_eq!(
        entries,
        pairs(&[
            ("a.py", "file 750"),
            ("b", "dir 750"),
            ("b/c.py", "file 750")
        ])
    );
    let cases = [
        ("COPY --from=build /x /y", "COPY --from"),
        ("COPY --parents a /y/", "COPY --parents"),
        ("COPY --chmod=u+x app.py /y", "octal"),
        ("COPY --chmod=99999 app.py /y", "octal"),
        ("COPY --chown app.py /y", "needs a value"),
        ("COPY app.py", "source and a destination"),
        ("COPY app.py \"\"", "empty destination"),
        ("COPY app.py req.txt /y", "ending in '/'"),
        ("COPY *.py *.txt /y", "ending in '/'"),
        ("COPY nope.txt /y", "\"nope.txt\" not found"),
        ("COPY ../etc/passwd /y", "outside the build context"),
        ("ADD https://127.0.0.1/x.tgz /y/", "ADD of the URL"),
        ("ADD git@127.0.0.1:r.git /y/", "ADD of the URL"),
        ("ADD --checksum=sha256:00 app.py /y/", "ADD --checksum"),
    ];
    for (ins, want) in cases {
        let e = f.err(&format!("FROM a\n\n{ins}"));
        assert!(e.contains("line 3") && e.contains(want), "{ins}: {e}");
    }
}

fn write_tgz(path: &Path) {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    b.append_data(&mut h, "inner/x", &b"hi"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    fs::write(path, gz.finish().unwrap()).unwrap();
}

#[test]
fn add_extracts_local_archives() {
    let f = Fixture::new();
    write_tgz(&f.path().join("bundle.tar.gz"));
    let p =
        f.plan("FROM a\nADD bundle.tar.gz /opt\nADD app.py /opt/x.py\nCOPY bundle.tar.gz /opt/");
    assert_eq!(copy(&p.steps[0]).0, "/opt");
    assert_eq!(copy(&p.steps[0]).2, pairs(&[("", "extract gzip")]));
    // Not an archive: ADD copies like COPY.
    assert_eq!(copy(&p.steps[1]).2, pairs(&[("x.py", "file 644")]));
    // COPY never extracts.
    assert_eq!(copy(&p.steps[2]).2, pairs(&[("bundle.tar.gz", "file 644")]));
    let StepKind::Copy { archive, .. } = &p.steps[0].kind else {
        panic!()
    };
    let bytes = archive.write_tar(Vec::new()).unwrap();
    let mut ar = tar::Archive::new(&bytes[..]);
    let names: Vec<String> = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["inner/x"]);
}

#[test]
fn copy_step_writes_its_tar() {
    let f = Fixture::new();
    // COPY keeps the context's mtimes (as Docker does).
    let when = |s: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
    for (path, t) in [("src/a.py", 1_600_000_001), ("src/b/c.py", 1_600_000_002)] {
        let h = fs::File::options()
            .write(true)
            .open(f.path().join(path))
            .unwrap();
        h.set_modified(when(t)).unwrap();
    }
    fs::File::open(f.path().join("src/b"))
        .unwrap()
        .set_modified(when(1_600_000_003))
        .unwrap();
    let app_mtime = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(f.path().join("app.py")).unwrap().mtime() as u64
    };
    let p = f.plan("FROM a\nCOPY --chmod=600 src app.py /app/");
    let StepKind::Copy { archive, dest, .. } = &p.steps[0].kind else {
        panic!()
    };
    assert_eq!(dest, "/app");
    let bytes = archive.write_tar(Vec::new()).unwrap();
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut got = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let mut s = String::new();
        std::io::Read::read_to_string(&mut e, &mut s).unwrap();
        let h = e.header();
        got.push((
            e.path().unwrap().to_string_lossy().into_owned(),
            h.mode().unwrap(),
            h.mtime().unwrap(),
            s,
        ));
    }
    let want: Vec<(String, u32, u64, String)> = vec![
        ("a.py".into(), 0o600, 1_600_000_001, "a\n".into()),
        ("b".into(), 0o600, 1_600_000_003, String::new()),
        ("b/c.py".into(), 0o600, 1_600_000_002, "c\n".into()),
        ("app.py".into(), 0o600, app_mtime, "print('hi')\n".into()),
    ];
    assert_eq!(got, want);
}

#[test]
fn forkvm_directives() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\n# forkvm:start [\"srv\", \"--port\", \"8080\"]\n# forkvm:ready port=8080\nCMD x",
    );
    assert_eq!(
        p.start,
        Some(StartSpec {
            command: vec!["srv".into(), "--port".into(), "8080".into()],
            ready: Some(ReadyCheck::Port { port: 8080 }),
            ready_timeout_secs: 60,
        })
    );
    let p = f.plan("FROM a\nCMD [\"python3\", \"app.py\"]\n# forkvm:ready timeout=120 [\"curl\", \"-f\", \"127.0.0.1\"]");
    let s = p.start.unwrap();
    assert_eq!(s.command, ["python3", "app.py"]);
    assert_eq!(
        s.ready,
        Some(ReadyCheck::Command {
            command: vec!["curl".into(), "-f".into(), "127.0.0.1".into()]
        })
    );
    assert_eq!(s.ready_timeout_secs, 120);
    let s = f
        .plan("FROM a\n# forkvm:start redis-server --save ''\n# forkvm:ready redis-cli ping")
        .start
        .unwrap();
    assert_eq!(s.command, ["/bin/sh", "-c", "redis-server --save ''"]);
    assert_eq!(
        s.ready,
        Some(ReadyCheck::Command {
            command: vec!["/bin/sh".into(), "-c".into(), "redis-cli ping".into()]
        })
    );
    let s = f
        .plan("FROM a\nENTRYPOINT [\"e\"]\nCMD [\"c\"]\n# forkvm:start")
        .start
        .unwrap();
    assert_eq!(
        (s.command, s.ready),
        (vec!["e".to_string(), "c".into()], None)
    );
    assert_eq!(f.plan("FROM a").start, None);
    let cases = [
        ("# forkvm:strat x", "line 2", "unknown directive"),
        ("# forkvm:start a\n# forkvm:start b", "line 3", "twice"),
        ("# forkvm:start []", "line 2", "no command"),
        ("# forkvm:ready", "line 2", "port=N or a command"),
        ("# forkvm:ready port=0", "line 2", "not a port"),
        ("# forkvm:ready port=80 curl x", "line 2", "not both"),
        (
            "# forkvm:ready timeout=-1 port=80",
            "line 2",
            "whole seconds",
        ),
        ("# forkvm:ready []", "line 2", "no command"),
        (
            "CMD []\n# forkvm:ready port=80",
            "line 3",
            "nothing to start",
        ),
    ];
    for (d, line, want) in cases {
        let e = f.err(&format!("FROM a\n{d}"));
        assert!(e.contains(line) && e.contains(want), "{d}: {e}");
    }
}

#[path = "key_tests.rs"]
mod key_tests;

#[test]
fn heredocs_in_run_and_copy() {
    let f = Fixture::new();
    let p = f.plan(
        "FROM a\nENV WHO=world\nRUN <<EOF\necho one\necho $WHO\nEOF\n\
         RUN python3 - <<'PY' > /out\nprint(1)\nPY\n\
         COPY --chmod=600 <<A <<\"B\" /etc/conf/\nhello $WHO\nA\nraw $WHO\nB\n\
         COPY <<EOF /etc/motd\nmotd\nEOF\n",
    );
    // A lone heredoc: its body is the shell script.
    assert_eq!(
        run(&p.steps[0]).0,
        &["/bin/sh", "-c", "echo one\necho $WHO"]
    );
    // A command with a heredoc: the shell gets all of it.
    assert_eq!(
        run(&p.steps[1]).0,
        &["/bin/sh", "-c", "python3 - <<'PY' > /out\nprint(1)\nPY"]
    );
    // COPY: files named after the markers, substituted unless quoted.
    let (dest, _, entries) = copy(&p.steps[2]);
    assert_eq!(dest, "/etc/conf");
    assert_eq!(
        entries,
        pairs(&[
            ("A", "inline 600 hello world\n"),
            ("B", "inline 600 raw $WHO\n")
        ])
    );
    let (dest, _, entries) = copy(&p.steps[3]);
    assert_eq!(
        (dest, entries),
        ("/etc", pairs(&[("motd", "inline 644 motd\n")]))
    );
    let e = f.err("FROM a\nRUN <<EOF\n#!/usr/bin/python3\nprint(1)\nEOF");
    assert!(
        e.contains("#! line") && e.contains("RUN python3 <<EOF"),
        "{e}"
    );
}
