//! A real OCI registry for tests: Debian's `docker-registry` (distribution
//! 2.8) on 127.0.0.1 on a free port, optionally with TLS (a test CA made
//! with openssl) and htpasswd auth (alice:s3cret), filled with `skopeo copy`.
//! Shared by the forkvm-image registry tests and the CLI's image tests
//! (included with `#[path]`); the process is killed by its PID on drop.

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOOLS: &[(&str, &str)] = &[
    ("/usr/bin/docker-registry", "docker-registry"),
    ("/usr/bin/skopeo", "skopeo"),
    ("/usr/bin/umoci", "umoci"),
    ("/usr/bin/htpasswd", "apache2-utils"),
    ("/usr/bin/openssl", "openssl"),
    ("/bin/busybox", "busybox-static"),
];

/// Fail (not skip) when a tool is missing: these tests are the only check of
/// the pull path against a real registry.
pub fn need_tools() {
    for (path, pkg) in TOOLS {
        assert!(
            Path::new(path).exists(),
            "{path} is missing (Debian package {pkg}): run scripts/setup.sh"
        );
    }
}

pub fn run(cmd: &str, args: &[&str], cwd: &Path) {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e} (run scripts/setup.sh)"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct Registry {
    pub child: Child,
    pub host: String,
    pub storage: PathBuf,
    pub log: PathBuf,
    /// Credentials for pushing, when it has htpasswd auth.
    pub creds: Option<String>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Start one under `dir`. With `tls_auth`, it serves https (a cert for
    /// 127.0.0.1 from a test CA, `dir/ca.pem`) and wants alice:s3cret.
    pub fn start(dir: &Path, tls_auth: bool) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let storage = dir.join("registry");
        let mut yml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: forkvm-test\n",
            storage.display()
        );
        if tls_auth {
            make_certs(dir);
            let h = Command::new("htpasswd")
                .args(["-Bbn", "alice", "s3cret"])
                .output()
                .unwrap();
            assert!(h.status.success());
            std::fs::write(dir.join("htpasswd"), &h.stdout).unwrap();
            yml += &format!(
                "  tls:\n    certificate: {d}/srv.pem\n    key: {d}/srv.key\n\
                 auth:\n  htpasswd:\n    realm: forkvm-test\n    path: {d}/htpasswd\n",
                d = dir.display()
            );
        }
        std::fs::write(dir.join("registry.yml"), yml).unwrap();
        let log = dir.join("registry.log");
        let child = Command::new("/usr/bin/docker-registry")
            .args(["serve", "registry.yml"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("registry.err")).unwrap())
            .spawn()
            .expect("starting docker-registry (run scripts/setup.sh)");
        let mut reg = Registry {
            child,
            host: format!("127.0.0.1:{port}"),
            storage,
            log,
            creds: tls_auth.then(|| "alice:s3cret".to_string()),
        };
        let t0 = Instant::now();
        while TcpStream::connect(&reg.host).is_err() {
            let dead = reg.child.try_wait().unwrap();
            if dead.is_some() || t0.elapsed() > Duration::from_secs(20) {
                panic!(
                    "docker-registry did not come up ({dead:?}): {}",
                    std::fs::read_to_string(dir.join("registry.err")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    /// `skopeo copy [--all] oci:oci:TAG docker://HOST/DEST` from `dir`.
    pub fn push(&self, dir: &Path, tag: &str, dest: &str, extra: &[&str]) {
        let to = format!("docker://{}/{dest}", self.host);
        let src = format!("oci:oci:{tag}");
        let mut args = vec!["copy", "--dest-tls-verify=false"];
        if let Some(c) = &self.creds {
            args.extend(["--dest-creds", c]);
        }
        args.extend(extra);
        args.extend([src.as_str(), to.as_str()]);
        run("skopeo", &args, dir);
    }

    /// Blob downloads served since the log was `from` bytes long.
    pub fn blob_gets(&self, from: usize) -> usize {
        // Access-log lines are written as responses complete.
        std::thread::sleep(Duration::from_millis(300));
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log[from.min(log.len())..]
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/sha256:"))
            .count()
    }

    pub fn log_len(&self) -> usize {
        std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize)
    }
}

/// A test CA and a server certificate for IP 127.0.0.1 signed by it.
pub fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut a = vec!["req", "-x509", "-days", "2", "-subj", "/CN=forkvm test CA"];
    a.extend(ec);
    a.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    a.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    a.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    run("openssl", &a, dir);
    let mut a = vec!["req", "-subj", "/CN=127.0.0.1", "-keyout", "srv.key"];
    a.extend(ec);
    a.extend(["-out", "srv.csr"]);
    run("openssl", &a, dir);
    std::fs::write(
        dir.join("srv.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "7",
            "-days",
            "2",
            "-extfile",
            "srv.ext",
            "-out",
            "srv.pem",
        ],
        dir,
    );
}
