//! Shared helpers for the VM integration tests: a real daemon (the `forkvm`
//! binary under test) with its own data directory, the real QEMU and the
//! guest artefacts built by `scripts/setup.sh`.
//!
//! Every daemon is started by the one test launcher, `forkvm serve
//! --ephemeral` (see [`Daemon`]).
//!
//! These tests are `#[ignore]`d so that plain `cargo test` runs only unit
//! tests on a machine without QEMU; `make test` runs them with
//! `--include-ignored`. When QEMU or the artefacts are missing they fail with
//! a message saying how to fix it — they never pass silently.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_forkvm");

/// Where the guest artefacts live (`$FORKVM_ARTIFACTS` or `/var/lib/forkvm`).
pub fn artifacts() -> PathBuf {
    std::env::var_os("FORKVM_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/forkvm"))
}

/// Fail loudly unless QEMU and the guest artefacts are present.
pub fn require_vm_prereqs() {
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    assert!(
        qemu.is_ok_and(|o| o.status.success()),
        "these tests need qemu-system-x86_64 (>= 10): run scripts/setup.sh (make test does)"
    );
    let a = artifacts();
    for f in [
        "guest/vmlinux",
        "guest/initramfs.img",
        "images/default/rootfs.ext4",
    ] {
        assert!(
            a.join(f).is_file(),
            "these tests need {}: run scripts/setup.sh (make test does)",
            a.join(f).display()
        );
    }
}

/// A daemon with a private data directory that shares the built artefacts,
/// started by the one test launcher, `forkvm serve --ephemeral`
/// (docs/testing.md#the-test-launcher). It holds the launcher's stdin: when
/// this process ends, however it ends, the kernel closes that pipe and the
/// daemon removes every sandbox and deletes the home.
pub struct Daemon {
    pub home: PathBuf,
    pub child: Option<Child>,
    pub tcp: Option<(String, String)>,
    /// Extra environment for `forkvm serve` (applied at each (re)start).
    pub env: Vec<(String, String)>,
    /// Soft and hard `RLIMIT_NOFILE` for `forkvm serve`, if set.
    pub nofile: Option<u64>,
    /// `(fd, at)`: the daemon inherits `fd` of the test process as
    /// descriptor `at`, without close-on-exec (as from a careless parent).
    pub pass_fd: Option<(i32, i32)>,
    /// The launcher's JSON line of the running daemon (url, token, pid...).
    pub ready: serde_json::Value,
    /// Our end of the daemon's stdin; closing it ends the daemon.
    stdin: Option<std::process::ChildStdin>,
    /// `--session-home`: the home outlives one daemon process, so a test
    /// can restart the daemon on it (SIGTERM and SIGKILL keep the
    /// sandboxes). Without it the home is the launcher's own temporary one.
    session: bool,
    /// The log of a daemon in the launcher's temporary home: kept in memory
    /// (read from a pipe), so that a killed test leaves no file for it.
    mem_log: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    /// The session home we made (none for a temporary one).
    _dir: Option<tempfile::TempDir>,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(None)
    }

    /// Start with a TCP listener too: `(addr, token)`.
    pub fn start_with(tcp: Option<(String, String)>) -> Daemon {
        Self::start_at(None, tcp)
    }

    /// Start with its data directory at `home` (created here), e.g. on a
    /// small filesystem.
    pub fn start_in(home: &Path) -> Daemon {
        Self::start_at(Some(home), None)
    }

    /// Start in `home` with extra environment for `forkvm serve`.
    pub fn start_in_env(home: &Path, env: &[(&str, &str)]) -> Daemon {
        Self::start_full(Some(home), None, env)
    }

    /// Start with extra environment for `forkvm serve` (kept for restarts).
    pub fn start_env(env: &[(&str, &str)]) -> Daemon {
        Self::start_full(None, None, env)
    }

    /// Start with a TCP listener (`(addr, token)`) and extra environment
    /// for `forkvm serve` (kept for restarts).
    pub fn start_tcp_env(tcp: (String, String), env: &[(&str, &str)]) -> Daemon {
        Self::start_full(None, Some(tcp), env)
    }

    /// Start with a TCP listener and `RLIMIT_NOFILE` set to `nofile` (soft
    /// and hard, so the daemon cannot raise it).
    pub fn start_with_nofile(tcp: (String, String), nofile: u64) -> Daemon {
        let mut d = Self::prepare(None, Some(tcp), &[]);
        d.nofile = Some(nofile);
        d.spawn_process();
        d
    }

    fn start_at(at: Option<&Path>, tcp: Option<(String, String)>) -> Daemon {
        Self::start_full(at, tcp, &[])
    }

    /// Start with the test's descriptor `fd` inherited as `at`.
    pub fn start_passing_fd(fd: i32, at: i32) -> Daemon {
        let mut d = Self::prepare(None, None, &[]);
        d.pass_fd = Some((fd, at));
        d.spawn_process();
        d
    }

    fn start_full(
        at: Option<&Path>,
        tcp: Option<(String, String)>,
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut d = Self::prepare(at, tcp, env);
        d.spawn_process();
        d
    }

    /// A daemon in the launcher's own temporary home (no restarts): a
    /// SIGKILL of the daemon is then cleaned up by the launcher's reaper.
    pub fn start_temporary() -> Daemon {
        let mut d = Self::prepare(None, None, &[]);
        d.session = false;
        d._dir = None; // the launcher makes its own
        d.spawn_process();
        d
    }

    /// The daemon's home and settings, not started yet. The launcher links
    /// the artefacts into it (a test may bring its own `guest`, e.g. a
    /// broken initramfs, before the first start).
    fn prepare(at: Option<&Path>, tcp: Option<(String, String)>, env: &[(&str, &str)]) -> Daemon {
        require_vm_prereqs();
        // Short path: unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("fvt-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let home = match at {
            Some(p) => {
                std::fs::create_dir_all(p).expect("home");
                p.to_path_buf()
            }
            None => dir.path().to_path_buf(),
        };
        Daemon {
            home,
            child: None,
            tcp,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            nofile: None,
            pass_fd: None,
            ready: serde_json::Value::Null,
            stdin: None,
            session: true,
            mem_log: Default::default(),
            _dir: Some(dir),
        }
    }

    /// (Re)start the daemon process on the same home.
    pub fn spawn_process(&mut self) {
        use std::io::BufRead;
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--ephemeral", "--print-json", "--artifacts"])
            .arg(artifacts())
            .env_remove("FORKVM_URL")
            .env_remove("FORKVM_TOKEN")
            .env_remove("FORKVM_HOME")
            // Background collection keeps running (and must never take what
            // a test still uses), but the default 10-minute grace could
            // reap a branch point that a slow test keeps unreferenced on
            // purpose; tests about collection set their own grace.
            .env("FORKVM_GC_GRACE", "86400")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if self.session {
            cmd.arg("--session-home").arg(&self.home);
        }
        if let Some((addr, token)) = &self.tcp {
            cmd.args(["--listen", addr]).env("FORKVM_TOKEN", token);
        }
        // Its log: in a session home, a file there (it goes with the
        // home); a temporary home is the launcher's, so that log is kept in
        // memory.
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        if self.session {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.home.join("daemon.log"))
                .expect("log");
            cmd.stderr(log);
        } else {
            cmd.stderr(Stdio::piped());
        }
        let nofile = self.nofile;
        let pass_fd = self.pass_fd;
        // SAFETY: setrlimit and dup2 are async-signal-safe and touch no
        // memory but the struct on this stack.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if let Some(n) = nofile {
                    let r = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // dup2 leaves the new number without close-on-exec.
                if let Some((fd, at)) = pass_fd {
                    if libc::dup2(fd, at) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("start forkvm serve --ephemeral");
        self.stdin = child.stdin.take();
        if let Some(mut err) = child.stderr.take() {
            let buf = self.mem_log.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut chunk = [0u8; 8192];
                while let Ok(n) = err.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut b) = buf.lock() {
                        b.extend_from_slice(&chunk[..n]);
                    }
                }
            });
        }
        // The launcher prints its line when ready, or exits within its own
        // readiness timeout: no second timeout here.
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let _ = out.read_line(&mut line);
        self.child = Some(child);
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            let st = self.child.as_mut().and_then(|c| c.wait().ok());
            // Let the log reader take the rest.
            std::thread::sleep(Duration::from_millis(200));
            panic!(
                "forkvm serve --ephemeral did not start ({st:?}): {}",
                self.log()
            );
        };
        self.home = PathBuf::from(v["home"].as_str().expect("home"));
        self.ready = v;
    }

    pub fn log(&self) -> String {
        if self.session {
            std::fs::read_to_string(self.home.join("daemon.log")).unwrap_or_default()
        } else {
            let b = self.mem_log.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&b).into_owned()
        }
    }

    /// Stop the daemon process: SIGTERM (graceful; with a session home the
    /// sandboxes keep running for the next daemon) or SIGKILL.
    pub fn stop(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling the daemon process this fixture started.
            unsafe { libc::kill(c.id() as i32, sig) };
            let _ = c.wait();
        }
        // Only now: closing it first would end the daemon with a teardown.
        self.stdin = None;
    }

    /// End the daemon as the end of the run does: close its stdin, so it
    /// removes every sandbox and deletes its home, and wait for that.
    pub fn finish(&mut self) {
        self.stdin = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// A `forkvm` command aimed at this daemon.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("FORKVM_HOME", &self.home)
            .env_remove("FORKVM_URL")
            .env_remove("FORKVM_TOKEN");
        c.stdin(Stdio::null());
        c
    }

    /// Run `forkvm ARGS` and return its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run forkvm")
    }

    /// Run and require success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "forkvm {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).expect("json output")
    }

    pub fn spawn(&self) -> Sandbox<'_> {
        let id = self.ok(&["spawn"]).trim().to_string();
        assert!(id.starts_with("sb-"), "unexpected spawn output {id:?}");
        Sandbox { d: self, id }
    }

    /// A sandbox booted from the image, never cloned from a boot template:
    /// it owns its RAM file, so its snapshots are of the `shared` kind
    /// whatever other tests have cached.
    pub fn spawn_cold(&self) -> Sandbox<'_> {
        let id = self.ok(&["spawn", "--no-template"]).trim().to_string();
        assert!(id.starts_with("sb-"), "unexpected spawn output {id:?}");
        Sandbox { d: self, id }
    }

    pub fn client(&self) -> forkvm_api::Client {
        forkvm_api::Client::new(
            forkvm_api::Target::Unix(self.home.join("forkvm.sock")),
            None,
        )
    }

    pub fn run_dir(&self) -> PathBuf {
        forkvm_daemon::Config::for_home(&self.home).run_dir
    }

    /// Files that a sandbox leaves while it exists (for leak checks).
    pub fn sandbox_files(&self, id: &str) -> Vec<PathBuf> {
        let p = forkvm_daemon::Config::for_home(&self.home).sandbox_paths(id);
        [p.dir, p.mem, p.disk, p.qmp, p.agent]
            .into_iter()
            .filter(|f| f.exists())
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Remove whatever sandboxes are left, then stop the daemon.
        if self.child.is_some() {
            if let Ok(o) = self.cmd().args(["--json", "ps"]).output() {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) {
                    for s in v["sandboxes"].as_array().into_iter().flatten() {
                        if let Some(id) = s["id"].as_str() {
                            let _ = self.cmd().args(["rm", id]).output();
                        }
                    }
                }
            }
        }
        self.finish();
        let rd = self.run_dir();
        let _ = std::fs::remove_dir(rd);
    }
}

/// A sandbox removed when dropped.
pub struct Sandbox<'a> {
    pub d: &'a Daemon,
    pub id: String,
}

impl Sandbox<'_> {
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut a = vec!["exec", self.id.as_str(), "--"];
        a.extend_from_slice(args);
        self.d.run(&a)
    }
    pub fn pid(&self) -> u32 {
        let v = self.d.json(&["inspect", &self.id]);
        v["pid"].as_u64().expect("pid") as u32
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        let _ = self.d.run(&["rm", &self.id]);
    }
}

/// True if a process with this pid exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Poll until `f` is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// One daemon shared by the tests of a binary that do not restart it, in
/// the launcher's temporary home. It is never dropped: when the test
/// process exits (or is killed), the kernel closes the daemon's stdin and
/// the daemon removes its sandboxes and its home. The `atexit` hook closes
/// it early and waits, so a finished test binary has cleaned up.
pub fn shared() -> &'static Daemon {
    static D: OnceLock<Daemon> = OnceLock::new();
    D.get_or_init(|| {
        let d = Daemon::start_temporary();
        let pid = d.child.as_ref().map(|c| c.id()).unwrap_or(0);
        let fd = d
            .stdin
            .as_ref()
            .map(std::os::fd::AsRawFd::as_raw_fd)
            .unwrap_or(-1);
        let _ = SHARED_CLEANUP.set((pid, fd));
        // SAFETY: registering a plain extern "C" function with atexit.
        unsafe { libc::atexit(cleanup_shared) };
        d
    })
}

static SHARED_CLEANUP: OnceLock<(u32, i32)> = OnceLock::new();

/// At process exit (the test harness calls exit()): end the shared daemon
/// by closing its stdin, and wait until it has removed everything.
extern "C" fn cleanup_shared() {
    if let Some((pid, fd)) = SHARED_CLEANUP.get() {
        // SAFETY: the static Daemon is never dropped, so nothing else
        // closes this descriptor.
        unsafe { libc::close(*fd) };
        if *pid != 0 {
            wait_until(Duration::from_secs(150), || !alive(*pid));
        }
    }
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run a shell script in a sandbox; it must succeed.
pub fn sh(d: &Daemon, id: &str, script: &str) -> String {
    d.ok(&["exec", id, "--", "sh", "-c", script])
}

/// Like `sh`, but a failing command just yields its stdout.
pub fn try_sh(d: &Daemon, id: &str, script: &str) -> String {
    String::from_utf8_lossy(&d.run(&["exec", id, "--", "sh", "-c", script]).stdout).into_owned()
}

/// The ids of a list of sandboxes in a JSON response.
pub fn ids(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// Start `program` as a detached background Python process in the sandbox
/// (written to `path` in the guest; its output goes to `log`).
pub fn start_python(d: &Daemon, id: &str, path: &str, log: &str, program: &str) {
    use std::io::Write;
    let script = format!("cat > {path}; setsid python3 {path} >{log} 2>&1 < /dev/null &");
    let mut c = d.cmd();
    c.args(["exec", "-i", id, "--", "sh", "-c", &script])
        .stdin(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(program.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// A small filesystem mounted for a test's data directory; unmounted on drop.
pub struct SmallFs {
    pub mnt: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    pub fn new(mib: u32) -> SmallFs {
        let dir = tempfile::Builder::new()
            .prefix("fvfs-")
            .tempdir_in("/tmp")
            .unwrap();
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let run = |cmd: &str, args: &[&str]| {
            let o = std::process::Command::new(cmd).args(args).output().unwrap();
            assert!(
                o.status.success(),
                "{cmd} {args:?} failed (this test needs root and e2fsprogs): {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        run(
            "truncate",
            &["-s", &format!("{mib}M"), img.to_str().unwrap()],
        );
        run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
        run(
            "mount",
            &["-o", "loop", img.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        SmallFs { mnt, _dir: dir }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
