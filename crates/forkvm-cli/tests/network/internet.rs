//! "The internet" of the network tests: a network namespace the test
//! creates, joined to the host by a veth pair, with Python servers
//! listening inside it.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::wait_until;

/// A namespace standing in for the outside world.
pub struct Internet {
    ns: String,
    host_if: String,
    /// The server's address (inside the namespace).
    pub addr: String,
    /// The host's address on the link (sandbox egress is masqueraded to it).
    pub host_addr: String,
    dir: std::path::PathBuf,
    servers: Vec<Child>,
}

/// An HTTP server: `GET /hello` answers `hello from the internet`, any
/// other path echoes `seen <path>`; every request is logged with its path.
const HTTP_SERVER: &str = r#"
import http.server, sys
log = open(sys.argv[2], "a", buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        log.write(self.path + "\n")
        body = b"hello from the internet\n" if self.path == "/hello" else ("seen %s\n" % self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], 8080), H).serve_forever()
"#;

/// A line server on port 9000: logs and echoes every line it receives.
const LINE_SERVER: &str = r#"
import socketserver, sys
log = open(sys.argv[2], "a", buffering=1)
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            log.write(line.decode().strip() + "\n")
            self.wfile.write(b"echo " + line)
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
S((sys.argv[1], 9000), H).serve_forever()
"#;

impl Internet {
    fn create() -> Internet {
        let pid = std::process::id();
        let x = pid % 200 + 20;
        // The directory comes first and `me` exists before the first `ip`
        // command: if any step below panics, unwinding drops `me`, and its
        // Drop removes whatever was made so far (namespace, veth, directory).
        // The directory is named after our pid (not a random TempDir name) so
        // that a leftover from a killed run can be traced to a dead pid.
        let dir = std::path::PathBuf::from(format!("/tmp/fvt-inet-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create the test's internet directory");
        let mut me = Internet {
            ns: format!("fvt-inet-{pid}"),
            host_if: format!("fvti{}", pid % 100_000_000),
            addr: format!("10.250.{x}.2"),
            host_addr: format!("10.250.{x}.1"),
            dir,
            servers: Vec::new(),
        };
        let run = |args: &[&str]| {
            let o = Command::new("ip").args(args).output().expect("ip");
            assert!(
                o.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        run(&["netns", "add", &me.ns]);
        run(&[
            "link",
            "add",
            &me.host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &me.ns,
        ]);
        run(&[
            "addr",
            "add",
            &format!("{}/24", me.host_addr),
            "dev",
            &me.host_if,
        ]);
        run(&["link", "set", &me.host_if, "up"]);
        run(&[
            "-n",
            &me.ns,
            "addr",
            "add",
            &format!("{}/24", me.addr),
            "dev",
            "eth0",
        ]);
        run(&["-n", &me.ns, "link", "set", "eth0", "up"]);
        run(&["-n", &me.ns, "link", "set", "lo", "up"]);
        me.serve("inet_http.py", HTTP_SERVER, "http.log");
        me.serve("inet_line.py", LINE_SERVER, "line.log");
        for port in [8080, 9000] {
            let a = format!("{}:{port}", me.addr);
            assert!(
                wait_until(Duration::from_secs(20), || TcpStream::connect(&a).is_ok()),
                "the test's server on {a} did not start: {}",
                std::fs::read_to_string(me.dir.join("inet_http.py.err")).unwrap_or_default()
                    + &std::fs::read_to_string(me.dir.join("inet_line.py.err")).unwrap_or_default()
            );
        }
        me
    }

    fn serve(&mut self, file: &str, program: &str, log: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, program).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "python3"])
            .arg(&path)
            .arg(&self.addr)
            .arg(self.dir.join(log))
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join(format!("{file}.err"))).unwrap())
            .spawn()
            .expect("start a server in the test namespace");
        self.servers.push(child);
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}:8080{path}", self.addr)
    }
}

impl Internet {
    /// Stop the servers and remove the namespace, the veth pair and the
    /// directory. Takes `&self` because the shared instance lives in a static,
    /// which is never dropped: `drop_internet` calls this at process exit.
    fn teardown(&self) {
        for c in &self.servers {
            let pid = c.id() as i32;
            // SAFETY: signalling and reaping a child this test started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        // Anything else still running in the namespace was started by a
        // server of ours; it would keep the namespace busy.
        if let Ok(o) = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output()
        {
            for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                if let Ok(p) = p.parse::<i32>() {
                    // SAFETY: signalling a process in the namespace this test made.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Covers an `Internet` that never reached the static: `create` panicking
/// half-way unwinds through here.
impl Drop for Internet {
    fn drop(&mut self) {
        self.teardown();
    }
}

static INTERNET: OnceLock<Internet> = OnceLock::new();

pub fn internet() -> &'static Internet {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let i = INTERNET.get_or_init(Internet::create);
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" function with atexit.
        unsafe { libc::atexit(drop_internet) };
    });
    i
}

/// At process exit (the test harness calls exit() whether tests passed or
/// panicked), tear the shared namespace, servers and directory down.
extern "C" fn drop_internet() {
    if let Some(i) = INTERNET.get() {
        i.teardown();
    }
}
