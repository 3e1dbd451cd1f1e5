"""Probe: diff-branch snapshot cost of a clone running a 2 ms hostname poll."""
import http.client, json, socket, sys, time, os

class UConn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=600)
        self.path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)

SOCK = os.environ["FORKVM_HOME"] + "/forkvm.sock"

def req(method, path, body=None, ok=(200, 201, 204)):
    c = UConn(SOCK)
    data = json.dumps(body).encode() if body is not None else None
    c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    r = c.getresponse()
    raw = r.read()
    if r.status not in ok:
        raise SystemExit(f"{method} {path} -> {r.status}: {raw[:400]!r}")
    return json.loads(raw) if raw else None

LOOP = r'''
import socket, time
h0 = socket.gethostname()
open("/tmp/loop.state", "w").write("waiting " + h0)
while socket.gethostname() == h0:
    time.sleep(0.002)
open("/tmp/loop.state", "w").write("changed")
'''

def sh(sid, script, stdin=None):
    b = {"argv": ["sh", "-c", script], "timeout_ms": 60000}
    if stdin is not None:
        b["stdin"] = stdin
    r = req("POST", f"/v1/sandboxes/{sid}/exec", b)
    assert r.get("exit_code") == 0, r
    return r.get("stdout", "")

label = sys.argv[1]
sources = int(sys.argv[2]) if len(sys.argv) > 2 else 3
per = int(sys.argv[3]) if len(sys.argv) > 3 else 4
settle = float(os.environ.get("SETTLE", "3"))
rows = []
busy = None
if os.environ.get("BUSY"):
    busy = req("POST", "/v1/sandboxes", {"memory_mib": 512, "cpus": 1})["id"]
    sh(busy, "cat > /root/loop.py", stdin=LOOP)
    sh(busy, "setsid python3 /root/loop.py >/root/loop.log 2>&1 </dev/null &")
for s in range(sources):
    src = req("POST", "/v1/sandboxes", {"memory_mib": 512, "cpus": 1})
    sid = src["id"]
    sh(sid, "cat > /root/loop.py", stdin=LOOP)
    sh(sid, "setsid python3 /root/loop.py >/root/loop.log 2>&1 </dev/null &")
    time.sleep(settle)
    for k in range(per):
        g = req("GET", f"/v1/sandboxes/{sid}")
        disk = g.get("disk") or {}
        body = {"mode": "diff", "count": 1}
        t = time.time()
        r = req("POST", f"/v1/sandboxes/{sid}/branch", body)
        wall = (time.time() - t) * 1000
        snap = r["snapshot"]
        st = snap.get("timings") or {}
        sz = snap.get("sizes") or {}
        ch = r["children"][0]
        ct = ch.get("timings") or {}
        row = dict(label=label, src=s, k=k, wall=round(wall), pause=r.get("pause_ms"),
                   snapshot_ms=r.get("snapshot_ms"), spawn_ms=r.get("spawn_ms"),
                   save_state=st.get("save_state_ms"), freeze_disk=st.get("freeze_disk_ms"),
                   copy_mem=st.get("copy_memory_ms"), publish=st.get("publish_ms"),
                   snap_total=st.get("total_ms"),
                   diff_mib=round(sz.get("memory_diff_bytes", 0) / 2**20, 1),
                   mem_alloc_mib=round(sz.get("memory_allocated_bytes", 0) / 2**20, 1),
                   streaming_before=disk.get("streaming"), layers_before=disk.get("layers"),
                   prepare=ct.get("prepare_ms"), qemu_start=ct.get("qemu_start_ms"),
                   restore=ct.get("restore_ms"), identity=ct.get("identity_ms"),
                   net_ready=ct.get("network_ready_ms"))
        print(json.dumps(row), flush=True)
        rows.append(row)
        req("DELETE", f"/v1/sandboxes/{ch['id']}")
        req("DELETE", f"/v1/snapshots/{snap['id']}?force=true", ok=(200, 204, 404))
    req("DELETE", f"/v1/sandboxes/{sid}")
if busy:
    req("DELETE", f"/v1/sandboxes/{busy}")
