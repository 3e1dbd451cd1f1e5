"""Shared helpers for the forkvm benchmarks (standard library only).

Import from a benchmark script with::

    sys.path.insert(0, str(REPO / "bench" / "common"))
    import forkvm_bench as fb

What is here:

* ``UnixHTTPConnection`` / ``Api``: the REST API over the daemon's unix socket;
* ``Daemon``: a private daemon from the test launcher (``forkvm serve
  --ephemeral``), as a context manager that removes every sandbox it created
  and ends the daemon, which removes its home;
* ``Qmp``: a minimal line-delimited QMP client;
* ``agent_ping``: one ping/pong with the guest agent on its unix socket;
* ``kill_and_reap``: SIGKILL one pid we started and wait for it;
* ``mapping_smaps``: smaps figures of one mapping (a clone's private RAM);
* the naive QEMU save/restore baseline is in ``naive.py`` (``import naive as nv``).

Statistics, the machine's description, CSV output and the pieces of every
RESULTS.md are in ``report.py`` (``import report as rp``).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ARTIFACTS = "/var/lib/forkvm"


class BenchError(RuntimeError):
    """A benchmark step failed; the message says which and why."""


# --------------------------------------------------------------------------
# REST API over a unix socket
# --------------------------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX. The host name only fills the Host header."""

    def __init__(self, path: str, timeout: float = 300.0):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


class ApiError(BenchError):
    def __init__(self, method: str, path: str, status: int, body):
        self.status = status
        self.body = body
        err = body.get("error", {}) if isinstance(body, dict) else {}
        code = err.get("code", "?")
        msg = err.get("message", body)
        super().__init__(f"{method} {path} -> HTTP {status} [{code}] {msg}")


class Api:
    """The forkvm REST API. One connection per request (the socket is local,
    so connecting costs microseconds, and no stale keep-alive state can bite)."""

    def __init__(self, socket_path: str, timeout: float = 300.0):
        self.socket_path = socket_path
        self.timeout = timeout

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        return UnixHTTPConnection(self.socket_path, timeout)

    def _headers(self) -> dict:
        return {}

    def request(self, method: str, path: str, body=None, expect=(200, 201, 204),
                timeout: float | None = None):
        conn = self._connect(timeout or self.timeout)
        try:
            headers = self._headers()
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        parsed = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
        if resp.status not in expect:
            raise ApiError(method, path, resp.status, parsed)
        return parsed

    def info(self) -> dict:
        return self.request("GET", "/v1/info")

    def create(self, memory_mib: int = 512, cpus: int = 1, **extra) -> dict:
        return self.request("POST", "/v1/sandboxes",
                            {"memory_mib": memory_mib, "cpus": cpus, **extra}, expect=(201,))

    def delete(self, sid: str) -> None:
        self.request("DELETE", f"/v1/sandboxes/{sid}", expect=(204,))

    def exec(self, sid: str, argv: list[str], **extra) -> dict:
        return self.request("POST", f"/v1/sandboxes/{sid}/exec", {"argv": argv, **extra})

    def list(self) -> list:
        r = self.request("GET", "/v1/sandboxes")
        if isinstance(r, dict):
            for k in ("sandboxes", "items", "data"):
                if isinstance(r.get(k), list):
                    return r[k]
        return r if isinstance(r, list) else []


# --------------------------------------------------------------------------
# Daemon fixture
# --------------------------------------------------------------------------


def run_dir_for_home(home: str) -> Path:
    """Where the daemon puts guest RAM for `home` (mirrors config.rs:
    FNV-1a 64 of the path bytes, low 32 bits in hex)."""
    h = 0xCBF29CE484222325
    for b in os.fsencode(home):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return Path(f"/dev/shm/forkvm-{h & 0xFFFFFFFF:08x}")


class Daemon:
    """A private daemon started by the one test launcher, ``forkvm serve
    --ephemeral`` (tests/launch/forkvm_launch.py, docs/testing.md).

    Its home is a temporary directory under ``home_parent`` linking the
    installed artefacts ($FORKVM_ARTIFACTS, default /var/lib/forkvm). On exit
    every sandbox created through ``create`` is deleted and the daemon ends
    (the end of its stdin), removing whatever is left and its home; it does
    so too if this process is killed. With ``keep_home`` the home is a
    ``--session-home`` that is kept: the daemon is stopped with SIGTERM.
    The launcher has one readiness timeout of its own (``startup_timeout`` is
    kept for callers and ignored).
    """

    def __init__(self, binary: str | Path | None = None, artifacts: str | None = None,
                 startup_timeout: float = 60.0, keep_home: bool = False,
                 delete_wait: float = 120.0, env: dict | None = None,
                 home_parent: str = "/tmp"):
        self.binary = str(binary or REPO / "target" / "release" / "forkvm")
        self.artifacts = artifacts or os.environ.get("FORKVM_ARTIFACTS") or DEFAULT_ARTIFACTS
        self.startup_timeout = startup_timeout
        self.keep_home = keep_home
        self.delete_wait = delete_wait
        self.env = dict(env or {})  # set for the daemon on top of ours, e.g. FORKVM_NO_JAIL
        # Where the home is made: a short path (the socket's name must fit
        # in 108 bytes), on the filesystem a bench wants the store on.
        self.home_parent = home_parent
        self.home: str | None = None
        self.proc: subprocess.Popen | None = None
        self.api: Api | None = None
        self.sandboxes: set[str] = set()
        self.has_templates: bool | None = None  # learnt by create_cold
        self._launched = None
        self._log = None  # a subclass's own log file, if it starts the daemon itself

    # -- lifecycle --
    def __enter__(self) -> "Daemon":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def socket_path(self) -> str:
        return os.path.join(self.home, "forkvm.sock")

    @property
    def log_path(self) -> str:
        """A subclass's own start() logs here; the launcher keeps its log in
        memory (``log_tail``)."""
        return os.path.join(self.home, "daemon.log")

    def start(self) -> None:
        import sys
        sys.path.insert(0, str(REPO / "tests" / "launch"))
        import forkvm_launch

        if not (Path(self.artifacts) / "guest").is_dir():
            raise BenchError(f"{Path(self.artifacts) / 'guest'} is missing: run scripts/setup.sh "
                             "(or set FORKVM_ARTIFACTS to where the guest artefacts are)")
        if not os.access(self.binary, os.X_OK):
            raise BenchError(f"{self.binary} not found: cargo build --release -p forkvm-cli")
        args = ["--home-parent", self.home_parent]
        if self.keep_home:
            args = ["--session-home", tempfile.mkdtemp(prefix="fvb-", dir=self.home_parent)]
        try:
            self._launched = forkvm_launch.launch(self.binary, args=args, env=self.env,
                                                  artifacts=self.artifacts)
        except forkvm_launch.LaunchError as e:
            raise BenchError(str(e)) from None
        self.proc = self._launched.process
        self.home = str(self._launched.home)
        self.api = Api(self.socket_path)

    def log_tail(self, n: int = 30) -> str:
        if self._launched is not None:
            return "\n".join(self._launched.log(1 << 20).splitlines()[-n:])
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except (OSError, TypeError):
            return "(no daemon log)"

    def stop(self) -> None:
        """Delete every sandbox, stop the daemon, remove the home. Safe to call
        after a partial start or an interrupted request."""
        errors = []
        if self.proc is not None and self.proc.poll() is None and self.api is not None:
            # The home is private, so every sandbox the daemon knows is ours,
            # including one whose POST was interrupted before its id came back.
            ids = set(self.sandboxes)
            try:
                ids |= {s["id"] for s in self.api.list() if isinstance(s, dict) and "id" in s}
            except Exception as e:  # noqa: BLE001 - best-effort cleanup
                errors.append(f"GET /v1/sandboxes: {e}")
            for sid in sorted(ids):
                # A sandbox that is still booting answers 409 until its spawn
                # returns; wait for that (bounded) rather than orphan it.
                deadline = time.monotonic() + self.delete_wait
                while True:
                    try:
                        self.api.delete(sid)
                        break
                    except ApiError as e:
                        if e.status == 409 and time.monotonic() < deadline:
                            time.sleep(0.2)
                            continue
                        if e.status != 404:
                            errors.append(str(e))
                        break
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"DELETE {sid}: {e}")
                        break
            self.sandboxes.clear()
        if self._launched is not None:
            if self.keep_home and self.proc.poll() is None:
                # A session home outlives SIGTERM (the end of stdin would
                # delete it).
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    errors.append("forkvm serve ignored SIGTERM for 30 s; sent SIGKILL")
                    self.proc.kill()
                    self.proc.wait()
            problem = self._launched.stop()
            if problem:
                errors.append(problem)
            self._launched = None
            self.proc = None
        elif self.proc is not None:
            # Started by a subclass's own start() (bench/load's LoadDaemon),
            # not by the launcher.
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    errors.append("forkvm serve ignored SIGTERM for 30 s; sent SIGKILL")
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
        if self.home:
            # A QEMU that still names our home would be a launcher bug:
            # report it and kill it, by its pid.
            for pid in qemu_pids_mentioning(self.home):
                errors.append(f"killed leftover QEMU pid {pid}")
                kill_pid_and_wait(pid)
            if not self.keep_home:
                shutil.rmtree(self.home, ignore_errors=True)
                shutil.rmtree(run_dir_for_home(self.home), ignore_errors=True)
        if errors:
            print("cleanup:\n  " + "\n  ".join(errors), flush=True)

    # -- sandboxes --
    def create(self, **kw) -> dict:
        sb = self.api.create(**kw)
        self.sandboxes.add(sb["id"])
        return sb

    def create_cold(self, memory_mib: int = 512, cpus: int = 1, **extra) -> dict:
        """Spawn a sandbox by a cold boot. A daemon with boot templates
        restores from a template by default, so `use_template: false` is sent;
        a daemon that predates templates rejects the field (request bodies deny
        unknown fields) and always cold-boots, so it is then left out.
        ``self.has_templates`` records which kind of daemon this is. Raises
        when the response shows a restore instead of a boot. ``extra`` fields
        (e.g. ``network="none"``) go into the request body as they are."""
        if self.has_templates is not False:
            try:
                sb = self.create(memory_mib=memory_mib, cpus=cpus, use_template=False, **extra)
                self.has_templates = True
            except ApiError as e:
                if self.has_templates is None and e.status in (400, 422) \
                        and "use_template" in str(e):
                    self.has_templates = False
                    sb = self.create(memory_mib=memory_mib, cpus=cpus, **extra)
                else:
                    raise
        else:
            sb = self.create(memory_mib=memory_mib, cpus=cpus, **extra)
        t = sb.get("timings") or {}
        if t.get("restore_ms") is not None or sb.get("snapshot") or not t.get("boot_ms"):
            raise BenchError(f"sandbox {sb.get('id')} was not cold-booted: {sb}")
        return sb

    def delete(self, sid: str) -> None:
        self.api.delete(sid)
        self.sandboxes.discard(sid)

    def sandbox_dir(self, sid: str) -> str:
        return os.path.join(self.home, "sandboxes", sid)


# --------------------------------------------------------------------------
# QMP
# --------------------------------------------------------------------------


def _connect_unix(path: str, deadline: float) -> socket.socket:
    """Connect to a unix socket, retrying until `deadline` (monotonic)."""
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


class QmpError(BenchError):
    pass


class Qmp:
    """A minimal synchronous QMP client. Events are collected in ``events``."""

    def __init__(self, path: str, timeout: float = 30.0, proc: subprocess.Popen | None = None):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = _connect_unix(path, min(deadline, time.monotonic() + 0.05))
                break
            except OSError:
                if proc is not None and proc.poll() is not None:
                    raise QmpError(f"QEMU exited ({proc.returncode}) before QMP answered")
                if time.monotonic() > deadline:
                    raise QmpError(f"QMP socket {path} did not accept within {timeout}s")
        self.sock.settimeout(timeout)
        self.file = self.sock.makefile("rb")
        self.events: list[dict] = []
        self._id = 0
        greeting = self._read()
        if "QMP" not in greeting:
            raise QmpError(f"unexpected QMP greeting {greeting}")
        self.execute("qmp_capabilities")

    def _read(self) -> dict:
        line = self.file.readline()
        if not line:
            raise QmpError("QMP connection closed")
        return json.loads(line)

    def execute(self, cmd: str, args: dict | None = None):
        self._id += 1
        msg = {"execute": cmd, "id": self._id}
        if args is not None:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            r = self._read()
            if "event" in r:
                self.events.append(r)
                continue
            if r.get("id") != self._id:
                continue
            if "error" in r:
                raise QmpError(f"{cmd}: {r['error'].get('class')}: {r['error'].get('desc')}")
            return r.get("return")

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_migration(qmp: Qmp, timeout: float = 600.0, poll: float = 0.005) -> dict:
    """Poll query-migrate until `completed`; raise on `failed`/`cancelled`."""
    deadline = time.monotonic() + timeout
    while True:
        r = qmp.execute("query-migrate")
        st = r.get("status")
        if st == "completed":
            return r
        if st in ("failed", "cancelled"):
            raise QmpError(f"migration {st}: {r.get('error-desc', r)}")
        if time.monotonic() > deadline:
            raise QmpError(f"migration still {st} after {timeout}s")
        time.sleep(poll)


# --------------------------------------------------------------------------
# Guest agent
# --------------------------------------------------------------------------

AGENT_MAGIC = b"FVA1"


def agent_frame(header: dict, payload: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return AGENT_MAGIC + struct.pack("<II", len(h), len(payload)) + h + payload


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("agent socket closed")
        buf += chunk
    return bytes(buf)


def agent_ping(path: str, timeout: float = 120.0, resend: float = 2.0,
               first_id: int = 1_000_000) -> dict:
    """Connect to the agent socket and ping until a pong arrives; return it.

    As the daemon does, a ping is re-sent every `resend` seconds in case the
    guest dropped one while opening its port; any pong for one of our ids
    counts, and frames for other ids (replies queued for an earlier host
    connection) are skipped.
    """
    deadline = time.monotonic() + timeout
    s = _connect_unix(path, deadline)
    try:
        sent = set()
        next_id = first_id
        next_send = 0.0
        while True:
            now = time.monotonic()
            if now > deadline:
                raise BenchError(f"agent on {path} did not answer a ping within {timeout}s")
            if now >= next_send:
                s.sendall(agent_frame({"type": "ping", "id": next_id}))
                sent.add(next_id)
                next_id += 1
                next_send = now + resend
            s.settimeout(max(0.001, min(next_send, deadline) - time.monotonic()))
            try:
                prefix = _recv_exact(s, 12)
            except socket.timeout:
                continue
            s.settimeout(10)
            if prefix[:4] != AGENT_MAGIC:
                raise BenchError(f"bad agent frame magic {prefix[:4]!r}")
            hlen, plen = struct.unpack("<II", prefix[4:])
            header = json.loads(_recv_exact(s, hlen))
            if plen:
                _recv_exact(s, plen)
            if header.get("type") == "pong" and header.get("id") in sent:
                return header
    finally:
        s.close()


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


def qemu_pids_mentioning(needle: str) -> list[int]:
    """Pids of QEMU processes whose command line contains `needle`."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]).startswith(b"qemu-system") and \
                os.fsencode(needle) in b" ".join(argv):
            pids.append(int(d))
    return pids


def kill_pid_and_wait(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL one pid (not our child, so poll /proc until it is gone)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return  # dead; its parent reaps it
        except (OSError, IndexError):
            return
        time.sleep(0.02)


def kill_and_reap(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGKILL a process we started (by its pid) and wait for it."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)


class CpuMeter:
    """How much CPU *other* processes used over an interval, in cores.

    Host busy time comes from /proc/stat (everything but idle and iowait); our
    own time is this process and the daemon with all their descendants,
    living (utime+stime) or reaped (the parent's cutime+cstime). The
    difference, divided by the wall time, is the average number of cores that
    something else on the host kept busy: on a quiet host it is near 0; under
    TCG a competing VM takes up to a whole core from the guest being timed.
    """

    def __init__(self, roots=()):
        self.roots = [os.getpid(), *roots]
        self.hz = os.sysconf("SC_CLK_TCK")
        self._start = None

    @staticmethod
    def _host_busy() -> int:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal (guest is in user)
        return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)

    def _ours(self) -> int:
        stats = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # rest[1] = ppid; rest[11..14] = utime stime cutime cstime
            stats[int(d)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        total, todo, seen = 0, [p for p in self.roots if p in stats], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
        return total

    def start(self) -> None:
        self._start = (time.monotonic(), self._host_busy(), self._ours())

    def other_cores(self) -> float:
        t0, h0, o0 = self._start
        dt = time.monotonic() - t0
        if dt <= 0:
            return 0.0
        other = (self._host_busy() - h0) - (self._ours() - o0)
        return max(0.0, other / self.hz / dt)


# --------------------------------------------------------------------------
# Other processes on the host
# --------------------------------------------------------------------------


def other_qemu_processes(exclude_substrings=()) -> dict[int, str]:
    """QEMU processes on the host that we did not start (they compete for CPU
    and skew timings): pid -> start of the command line. A process whose
    command line contains one of `exclude_substrings` (our temp home, our RAM
    dir) is ours and left out."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if not argv or not os.path.basename(argv[0]).startswith(b"qemu-system"):
            continue
        line = b" ".join(argv).decode(errors="replace")
        if any(x and x in line for x in exclude_substrings):
            continue
        out[int(d)] = line[:160]
    return out


def warn_other_qemus(seen: dict[int, str], exclude_substrings=()) -> bool:
    """Check for QEMU processes we did not start (`other_qemu_processes`) and
    warn about those not in `seen` yet; add them all to `seen` (pid -> command
    line). Returns whether any is running now, for a bench's count of the runs
    that started on a busy host."""
    now = other_qemu_processes(exclude_substrings=exclude_substrings)
    new = {p: c for p, c in now.items() if p not in seen}
    if new:
        print("warning: QEMU processes not started by this bench are running; they compete "
              "for CPU and skew the timings:\n  "
              + "\n  ".join(f"{p}: {c}" for p, c in new.items()), flush=True)
    seen.update(now)
    return bool(now)


# --------------------------------------------------------------------------
# Small helpers shared by the benchmark scripts
# --------------------------------------------------------------------------


def ms_since(t0: float) -> float:
    """Milliseconds since `t0` (a time.perf_counter() value)."""
    return (time.perf_counter() - t0) * 1000.0


def tail(path: str, n: int = 20) -> str:
    """The last `n` lines of a log file, for error messages."""
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_for_quiet_host(max_wait: float, threshold: float = 0.2, window: float = 5.0,
                        roots=()) -> float:
    """Wait up to `max_wait` s until processes other than ours (this process
    and `roots` with their descendants) keep fewer than `threshold` cores
    busy over `window` s. Prints what it sees; returns the last measurement."""
    deadline = time.monotonic() + max_wait
    while True:
        m = CpuMeter(roots=roots)
        m.start()
        time.sleep(window)
        busy = m.other_cores()
        if busy < threshold:
            print(f"host is quiet: other processes used {busy:.2f} cores over {window:.0f} s",
                  flush=True)
            return busy
        if time.monotonic() >= deadline:
            print(f"warning: the host is busy (other processes use {busy:.2f} cores); timings "
                  "will be inflated" + ("" if max_wait else " (use --wait-quiet SECONDS to wait)"),
                  flush=True)
            return busy
        print(f"waiting for a quiet host: other processes use {busy:.2f} cores", flush=True)
        time.sleep(10)


# --------------------------------------------------------------------------
# Memory accounting
# --------------------------------------------------------------------------


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup as {field: KiB} (Rss, Pss, Pss_Anon,
    Pss_File, Pss_Shmem, Private_Dirty, ...). Empty if the process is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[0].endswith(":") and parts[2] == "kB":
                    out[parts[0][:-1]] = int(parts[1])
    except OSError:
        pass
    return out


def mapping_smaps(pid: int, path: str | Path, length: int) -> dict[str, int]:
    """The /proc/<pid>/smaps fields ({field: KiB}) of the mapping of `path`
    that is exactly `length` bytes long (e.g. a clone's guest RAM, a private
    mapping of a snapshot's memory image: its `Anonymous` KiB are the pages
    the clone wrote). Empty if there is no such mapping or the process is gone."""
    want = os.fsencode(str(path))
    out: dict[str, int] = {}
    found = False
    try:
        with open(f"/proc/{pid}/smaps", "rb") as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if b"-" in parts[0] and not parts[0].endswith(b":"):
                    if found:
                        break  # the next mapping starts
                    lo, _, hi = parts[0].partition(b"-")
                    try:
                        size = int(hi, 16) - int(lo, 16)
                    except ValueError:
                        continue
                    found = size == length and len(parts) >= 6 and parts[5] == want
                elif found and len(parts) >= 3 and parts[2] == b"kB":
                    out[parts[0][:-1].decode()] = int(parts[1])
    except OSError:
        return {}
    return out


def meminfo() -> dict[str, int]:
    """/proc/meminfo as {field: KiB}."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            parts = v.split()
            if parts:
                out[k.strip()] = int(parts[0])
    return out


def allocated_bytes(path: str | Path) -> int:
    """Bytes actually allocated to a file (st_blocks * 512; on tmpfs, the
    shmem pages it holds). 0 if it does not exist."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def allocated_bytes_tree(path: str | Path) -> int:
    """allocated_bytes summed over every regular file under `path`."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_blocks * 512
    return total
