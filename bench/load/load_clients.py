"""The load benchmark's clients: one HTTP connection each (`Conn`), per-
client counters (`Stats`) and the `Client` thread that picks operations from
the mix and records one row per request.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import json
import random
import select
import threading
import time
import urllib.parse

import forkvm_bench as fb
from load_census import MODES, SPAWN_FROM_SNAPSHOT, WEIGHTS


class Conn:
    """One keep-alive HTTP/1.1 connection on the unix socket. A connection the
    server closed while idle is noticed (readable at EOF) and reopened before
    the next request is sent; a request is never re-sent."""

    def __init__(self, path: str, timeout: float):
        self.path = path
        self.timeout = timeout
        self.c: fb.UnixHTTPConnection | None = None
        self.opened = 0

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None

    def request(self, method: str, path: str, body: bytes | None, ctype: str | None):
        if self.c is not None and self.c.sock is not None:
            r, _, _ = select.select([self.c.sock], [], [], 0)
            if r:  # EOF (or stray bytes): the server closed it
                self.close()
        if self.c is None:
            self.c = fb.UnixHTTPConnection(self.path, self.timeout)
        if self.c.sock is None:
            self.opened += 1
        headers = {"Content-Type": ctype} if body is not None else {}
        try:
            self.c.request(method, path, body=body, headers=headers)
            resp = self.c.getresponse()
            data = resp.read()
        except BaseException:
            self.close()
            raise
        return resp.status, resp.getheader("Content-Type") or "", data


class Stats:
    """Counters shared by the clients, for the progress line."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: list[dict] = []
        self.by_outcome = collections.Counter()
        self.failures: list[dict] = []
        self.printed_failures = 0


class Client(threading.Thread):
    def __init__(self, idx: int, args, socket_path: str, t0: float, end_at: float,
                 stop: threading.Event, stats: Stats, template_id: str | None):
        super().__init__(name=f"client-{idx}", daemon=True)
        self.idx = idx
        self.args = args
        self.conn = Conn(socket_path, args.request_timeout)
        self.t0 = t0
        self.end_at = end_at
        self.stop_ev = stop
        self.stats = stats
        self.template_id = template_id
        self.rng = random.Random(args.seed * 1000 + idx)
        self.sandboxes: list[dict] = []   # {"id", "snapshot"}
        self.snapshots: list[dict] = []   # {"id", "mode", "kind"}, oldest first
        self.phase = "load"
        self.current: tuple[str, float] | None = None
        self.seq = 0
        self.error: str | None = None

    # -- one request --
    def call(self, op: str, method: str, path: str, body=None, raw: bytes | None = None,
             check=None, detail: str = ""):
        """Send one request and record it. Returns (outcome, status, value):
        value is the parsed JSON (or the raw bytes for non-JSON answers)."""
        data, ctype = None, None
        if body is not None:
            data, ctype = json.dumps(body).encode(), "application/json"
        elif raw is not None:
            data, ctype = raw, "application/octet-stream"
        t_start = time.perf_counter()
        self.current = (op, t_start)
        code, message, value = "", "", None
        try:
            status, rtype, payload = self.conn.request(method, path, data, ctype)
        except Exception as e:  # noqa: BLE001 - a connection-level failure
            status, rtype, payload = 0, "", b""
            code, message = "connection_error", f"{type(e).__name__}: {e}"
        latency = (time.perf_counter() - t_start) * 1000.0
        self.current = None
        if payload and rtype.startswith("application/json"):
            try:
                value = json.loads(payload)
            except ValueError:
                value = payload
        else:
            value = payload
        if 200 <= status < 300:
            outcome = "ok"
            if check is not None:
                try:
                    err = check(value)
                except Exception as e:  # noqa: BLE001 - a malformed answer
                    err = f"{type(e).__name__}: {e}"
                if err:
                    outcome, code, message = "failure", "check_failed", err
        else:
            if isinstance(value, dict) and isinstance(value.get("error"), dict):
                code = value["error"].get("code", "")
                message = value["error"].get("message", "")
            elif status:
                code = code or "non_json_error"
                message = message or repr(payload[:300])
            outcome = {409: "conflict", 429: "limit"}.get(status, "failure")
        row = {"client": self.idx, "phase": self.phase, "op": op, "method": method,
               "path": path, "t_start_s": t_start - self.t0, "latency_ms": latency,
               "status": status, "outcome": outcome, "error_code": code,
               "detail": detail, "message": message[:500]}
        with self.stats.lock:
            self.stats.rows.append(row)
            self.stats.by_outcome[outcome] += 1
            if outcome == "failure":
                self.stats.failures.append({
                    **row, "request_body": (body if body is not None
                                            else (f"<{len(raw)} bytes>" if raw else None)),
                    "response_body": (value if isinstance(value, (dict, list))
                                      else repr(value[:1000]) if isinstance(value, bytes)
                                      else value),
                    "wall_time": dt.datetime.now().astimezone().isoformat(timespec="milliseconds"),
                })
                if self.stats.printed_failures < 20:
                    self.stats.printed_failures += 1
                    print(f"  FAILURE client {self.idx} {op}: {method} {path} -> {status} "
                          f"[{code}] {message[:300]}", flush=True)
        return outcome, status, value

    # -- operations --
    def op_spawn(self) -> None:
        snap = None
        ready = self.snapshots
        if ready and self.rng.random() < SPAWN_FROM_SNAPSHOT:
            snap = self.rng.choice(ready)
        if snap is not None:
            body, op = {"snapshot": snap["id"]}, "spawn_snapshot"
        else:
            body, op = {"memory_mib": self.args.memory, "cpus": 1}, "spawn_image"

        def check(v):
            if not isinstance(v, dict) or not v.get("id"):
                return f"no sandbox in the answer: {v!r:.200}"
            if v.get("state") != "running":
                return f"sandbox {v['id']} is {v.get('state')}, not running"
            want = snap["id"] if snap else self.template_id
            if want and v.get("snapshot") != want:
                return (f"sandbox {v['id']} came from {v.get('snapshot')}, expected {want}"
                        + (" (the boot template)" if not snap else ""))
            return None

        _, status, v = self.call(op, "POST", "/v1/sandboxes", body, check=check,
                                 detail=f"from {snap['id']} ({snap['mode']})" if snap else "")
        # Track whatever the daemon made, even if the check failed, so it is removed.
        if 200 <= status < 300 and isinstance(v, dict) and v.get("id"):
            self.sandboxes.append({"id": v["id"], "snapshot": v.get("snapshot")})

    def op_exec(self) -> None:
        sb = self.rng.choice(self.sandboxes)
        self.seq += 1
        token = f"c{self.idx}-{self.seq}-{self.rng.getrandbits(32):08x}"
        want = hashlib.sha256(token.encode()).hexdigest()
        argv = ["python3", "-c",
                "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
                token]

        def check(v):
            if not isinstance(v, dict):
                return f"not an ExecResult: {v!r:.200}"
            if v.get("exit_code") != 0 or v.get("timed_out"):
                return (f"exit_code {v.get('exit_code')} signal {v.get('signal')} timed_out "
                        f"{v.get('timed_out')} stderr {v.get('stderr', '')[-300:]!r}")
            if v.get("stdout", "").strip() != want:
                return f"stdout {v.get('stdout', '')[:200]!r}, expected {want}"
            return None

        self.call("exec", "POST", f"/v1/sandboxes/{sb['id']}/exec",
                  {"argv": argv, "timeout_ms": self.args.exec_timeout_ms}, check=check,
                  detail=sb["id"])

    def op_files(self) -> None:
        sb = self.rng.choice(self.sandboxes)
        self.seq += 1
        size = self.rng.choice([16, 1024, 16 * 1024, 200 * 1024])
        content = self.rng.randbytes(size)
        gpath = f"/tmp/fvload-c{self.idx}-{self.seq}.bin"
        q = urllib.parse.urlencode({"path": gpath, "mode": "644"})

        def check_w(v):
            if not isinstance(v, dict) or v.get("size") != size:
                return f"wrote {size} bytes, the answer says {v!r:.200}"
            return None

        outcome, _, _ = self.call("file_write", "PUT", f"/v1/sandboxes/{sb['id']}/files?{q}",
                                  raw=content, check=check_w, detail=f"{sb['id']} {size} B")
        if outcome != "ok":
            return
        q = urllib.parse.urlencode({"path": gpath})

        def check_r(v):
            if not isinstance(v, bytes):
                return f"not raw bytes: {v!r:.200}"
            if v != content:
                return (f"read {len(v)} bytes (sha256 {hashlib.sha256(v).hexdigest()[:16]}), "
                        f"wrote {size} (sha256 {hashlib.sha256(content).hexdigest()[:16]})")
            return None

        self.call("file_read", "GET", f"/v1/sandboxes/{sb['id']}/files?{q}", check=check_r,
                  detail=f"{sb['id']} {size} B")

    def op_branch(self) -> None:
        sb = self.rng.choice(self.sandboxes)
        mode = self.rng.choice(MODES)
        room = len(self.sandboxes) < self.args.client_sandboxes
        count = self.rng.choice([0, 1]) if room else 0

        def check(v):
            if not isinstance(v, dict) or not isinstance(v.get("snapshot"), dict):
                return f"no BranchResult: {v!r:.200}"
            s = v["snapshot"]
            if s.get("state") != "ready":
                return f"snapshot {s.get('id')} is {s.get('state')} ({s.get('failure')})"
            if v.get("mode") != mode:
                return f"asked mode {mode}, got {v.get('mode')}"
            ch = v.get("children") or []
            if len(ch) != count:
                return f"asked {count} children, got {len(ch)}"
            for c in ch:
                if c.get("state") != "running" or c.get("snapshot") != s.get("id"):
                    return f"child {c.get('id')} is {c.get('state')} from {c.get('snapshot')}"
            return None

        outcome, status, v = self.call(f"branch_{mode}", "POST",
                                       f"/v1/sandboxes/{sb['id']}/branch",
                                       {"mode": mode, "count": count}, check=check,
                                       detail=f"{sb['id']} count={count}")
        if 200 <= status < 300 and isinstance(v, dict):
            s = v.get("snapshot") or {}
            if s.get("id"):
                self.snapshots.append({"id": s["id"], "mode": mode, "kind": s.get("kind")})
            for c in v.get("children") or []:
                if c.get("id"):
                    self.sandboxes.append({"id": c["id"], "snapshot": c.get("snapshot")})

    def rm_snapshot(self, snap: dict) -> str:
        outcome, status, _ = self.call("rm_snapshot", "DELETE", f"/v1/snapshots/{snap['id']}",
                                       detail=f"{snap['id']} ({snap['mode']}/{snap['kind']})")
        if status in (204, 404):  # a 404 is a failure, but the snapshot is gone either way
            self.snapshots.remove(snap)
        return outcome

    def rm_sandbox(self, sb: dict) -> str:
        outcome, status, _ = self.call("rm_sandbox", "DELETE", f"/v1/sandboxes/{sb['id']}",
                                       detail=sb["id"])
        if status in (204, 404):
            self.sandboxes.remove(sb)
        return outcome

    def pick(self) -> str:
        n_sb, n_sn = len(self.sandboxes), len(self.snapshots)
        w = {}
        if n_sb < self.args.client_sandboxes:
            w["spawn"] = WEIGHTS["spawn"]
        if n_sb:
            w["exec"] = WEIGHTS["exec"]
            w["files"] = WEIGHTS["files"]
            w["rm_sandbox"] = WEIGHTS["rm_sandbox"]
            if n_sn < self.args.client_snapshots:
                w["branch"] = WEIGHTS["branch"]
        if n_sn:
            w["rm_snapshot"] = WEIGHTS["rm_snapshot"]
        ops, weights = zip(*w.items())
        return self.rng.choices(ops, weights)[0]

    def run(self) -> None:
        try:
            while time.monotonic() < self.end_at and not self.stop_ev.is_set():
                op = self.pick()
                if op == "spawn":
                    self.op_spawn()
                elif op == "exec":
                    self.op_exec()
                elif op == "files":
                    self.op_files()
                elif op == "branch":
                    self.op_branch()
                elif op == "rm_snapshot":
                    self.rm_snapshot(self.rng.choice(self.snapshots))
                elif op == "rm_sandbox":
                    self.rm_sandbox(self.rng.choice(self.sandboxes))
        except Exception as e:  # noqa: BLE001 - a bench bug: reported, cleanup still runs
            self.error = f"{type(e).__name__}: {e}"
            print(f"client {self.idx}: internal error {self.error}", flush=True)
        finally:
            self.cleanup()
            self.conn.close()

    def cleanup(self) -> None:
        """Remove every sandbox, then every snapshot newest first. A 409
        (still starting, or a dependent left) is retried a few times."""
        self.phase = "cleanup"
        for attempt in range(20):
            for sb in list(self.sandboxes):
                self.rm_sandbox(sb)
            for sn in reversed(list(self.snapshots)):
                self.rm_snapshot(sn)
            if not self.sandboxes and not self.snapshots:
                return
            time.sleep(min(5.0, 0.25 * (attempt + 1)))
        print(f"client {self.idx}: could not remove {[s['id'] for s in self.sandboxes]} "
              f"{[s['id'] for s in self.snapshots]}", flush=True)
