#!/usr/bin/env python3
"""forkvm registry benchmark: snapshot push and pull through an OCI registry.

Run through bench/registry/run.sh (it checks the tools and the .venv, and
builds the release binary unless given --binary).

Each run starts from nothing: a fresh registry (Debian's `docker-registry`
on a free 127.0.0.1 port, filesystem storage in a temp dir) and two fresh
private daemons, A and B, with homes of their own (B with
FORKVM_NET_POOL=10.232.0.0/16; every sandbox has `network: none`). A's
home links `guest` and `images` to the artefacts; B's links `guest` only and
has an empty `images/` of its own, so a pull must fetch the image too.

On A: two 512 MiB sandboxes from the boot template (the first spawn boots
the image and makes the template), each writing --data-mib (64) MiB of
random data to /root/buf (then `sync`), snapshotted (S1, S2: `diff`
snapshots whose parent is the template) and removed. Then, timed (CLI wall;
stages from the NDJSON progress events):

* push_s1      -- `snapshot push S1 REG/bench/s1:v1`: empty registry, empty
                  chunk cache: chunks and sends the image's root disk, the
                  template link and S1's link;
* push_s2      -- `snapshot push S2 REG/bench/s1:v2`: the same repository,
                  so the image and the template link are found and skipped
                  (S2's link is chunked and sent);
* push_s2_repo -- `snapshot push S2 REG/bench/s2:v1`: another repository
                  (chunk lists cached by now);

on B:

* pull_s1      -- `snapshot pull REG/bench/s1:v1`: fetches image, template, S1;
* pull_s2      -- `snapshot pull REG/bench/s2:v1`: only S2's link is missing;
  then B spawns a sandbox from each pulled snapshot and checks the SHA-256 of
  /root/buf against A's (spawn_ms, sha_ok).

The baseline, in the same run, what one does by hand with skopeo: GNU
`tar --sparse` of the same files (the image's rootfs.ext4, the template's
snapshot directory, S1's or S2's), one uncompressed tar layer in an OCI
layout written by this script, `skopeo copy oci:… docker://REG/base/sN:v1`
(skopeo gzips the layer on the way, containers/image's default for a
registry), and back: `skopeo copy docker://… oci:DIR2` into a fresh
directory, then `tar -xzf` of the layer (the files ready to use). The order
of the forkvm block and the baseline block alternates between runs.

Run 1 also replays the chunking offline for chunk sizes 1-16 MiB
(chunk_sizes.py): the bytes and blobs of the cold push of S1, and of S2's
push after it.

Everything is stopped by its pid at the end of each run (also on an error or
SIGTERM): the registry, both daemons (sandboxes removed first); each run's
temp directory goes, and the host nft tables the daemons leave.

Outputs: results/registry.csv, results/chunk_sizes.csv, results/RESULTS.md,
results/registry.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))
sys.path.insert(0, str(HERE))

import chunk_sizes as cs  # noqa: E402
import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402

MIN_RUNS = 3
MiB = 1 << 20
TOOLS = ("docker-registry", "skopeo", "tar", "gzip")
NET_POOL_B = "10.232.0.0/16"
FIELDS = ["case", "run", "total_ms", "prepare_ms", "transfer_ms", "finish_ms", "daemon_ms",
          "bytes", "registry_bytes", "blobs", "blobs_skipped", "bytes_skipped", "links",
          "links_skipped", "image_sent", "requests", "pings", "spawn_ms", "sha_ok",
          "layer_bytes", "other_cpu_cores"]
STAGES = ["prepare_ms", "transfer_ms", "finish_ms"]
# (forkvm case, what it is, its baseline case)
FIGURES = (
    ("push_s1", "push S1, empty registry (cold: chunking included)", "skopeo_push_s1"),
    ("push_s2", "push S2 after S1, same repository (`bench/s1:v2`)", "skopeo_push_s2"),
    ("push_s2_repo", "push S2 after S1, another repository (`bench/s2:v1`)", "skopeo_push_s2"),
    ("pull_s1", "pull S1 on B, nothing there (image + template + S1)", "skopeo_pull_s1"),
    ("pull_s2", "pull S2 on B after S1", "skopeo_pull_s2"),
)
BASELINE = {
    "skopeo_push_s1": "`tar --sparse` + OCI layout + `skopeo copy oci:… docker://…/base/s1:v1`",
    "skopeo_push_s2": "the same for S2 (`base/s2:v1`): one new layer, all of it sent",
    "skopeo_pull_s1": "`skopeo copy docker://…/base/s1:v1 oci:DIR` + `tar -xzf` of the layer",
    "skopeo_pull_s2": "the same for S2, into a fresh directory (nothing reused)",
}
STAGE_NAMES = {
    "push": ("chunking", "upload", None),
    "pull": ("resolve + local checks", "fetch + check", "publish"),
    "skopeo_push": ("tar + layout", "skopeo copy", None),
    "skopeo_pull": (None, "skopeo copy", "untar"),
}
ACCESS = re.compile(r'"(GET|HEAD|PUT|POST|PATCH|DELETE) /v2/(\S*) HTTP')


def kind(case: str) -> str:
    return ("skopeo_" if case.startswith("skopeo") else "") + \
        ("push" if "push" in case else "pull")


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise fb.BenchError(f"missing tool(s): {', '.join(missing)}; this bench needs them all "
                            "(Debian: apt-get install docker-registry skopeo tar gzip)")


def sh(argv, env=None, timeout: float = 1800.0) -> tuple[float, str]:
    """Run a command to completion: (wall ms, stdout); a failure raises with
    the command and the end of its output."""
    argv = [str(a) for a in argv]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise fb.BenchError(f"`{shlex.join(argv)}` took more than {timeout:.0f} s") from e
    ms = fb.ms_since(t0)
    if p.returncode != 0:
        out = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise fb.BenchError(f"`{shlex.join(argv)}` exited with {p.returncode}:\n{out}")
    return ms, p.stdout


def tree_bytes(path: Path) -> int:
    """Apparent size of every regular file under `path` (0 if absent)."""
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(4 * MiB):
            h.update(b)
    return h.hexdigest()


# --------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------


class Registry:
    """Debian's docker-registry on a free 127.0.0.1 port, data in `root`;
    killed by its pid on exit."""

    def __init__(self, root: Path):
        self.root = root
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> "Registry":
        self.root.mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cfg = self.root / "config.yml"
        cfg.write_text("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                       f"    rootdirectory: {self.root / 'data'}\n"
                       "  delete:\n    enabled: false\n"
                       f"http:\n  addr: 127.0.0.1:{self.port}\n")
        self.log = self.root / "registry.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["docker-registry", "serve", str(cfg)],
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            self.check()
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2):
                    return self
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise fb.BenchError("docker-registry did not answer within 30 s:\n"
                                        + fb.tail(str(self.log)))
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            fb.kill_and_reap(self.proc)
            self.proc = None

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise fb.BenchError(f"docker-registry (pid {self.proc.pid}) exited with "
                                f"{self.proc.returncode}:\n" + fb.tail(str(self.log)))

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stored_bytes(self) -> int:
        """Bytes of every blob the registry stores (all repositories)."""
        return tree_bytes(self.root / "data" / "docker" / "registry" / "v2" / "blobs")

    def access_counts(self) -> tuple[int, int]:
        """(HTTP requests served so far, of which `GET /v2/` pings)."""
        n = pings = 0
        with open(self.log, "rb") as f:
            for line in f.read().decode(errors="replace").splitlines():
                m = ACCESS.search(line)
                if m:
                    n += 1
                    pings += m.group(1) == "GET" and m.group(2) == ""
        return n, pings

    def manifest(self, repo: str, tag: str) -> dict:
        req = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/manifests/{tag}",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                               "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
        return {**json.loads(raw), "_size": len(raw)}


# --------------------------------------------------------------------------
# The daemons
# --------------------------------------------------------------------------


def host_netns() -> str:
    return os.readlink("/proc/self/ns/net")


def stray_threads(pid: int) -> list[int]:
    """Threads of process `pid` that are not in the host's network namespace.

    Until commit a5df302, forkvm-net's `set_forwarding` called
    setns(CLONE_NEWNET) on a tokio blocking-pool thread, which tokio kept and
    reused (`block_in_place`, used while a push chunks, could even make it an
    async worker), so a later registry request from it connected inside the
    sandbox's namespace: `connection refused` on 127.0.0.1. The bench checks
    that no such thread is back, and works around one if it is.
    """
    mine = host_netns()
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            if os.readlink(f"/proc/{pid}/task/{t}/ns/net") != mine:
                out.append(int(t))
        except OSError:
            pass
    return out


class Host(fb.Daemon):
    """fb.Daemon with a chosen artefacts dir and a restart on the same home."""

    def start(self) -> None:
        if not (Path(self.artifacts) / "guest").is_dir():
            raise fb.BenchError(f"{self.artifacts}/guest is missing: run scripts/setup.sh (or "
                                "set FORKVM_ARTIFACTS to where the guest artefacts are)")
        if not os.access(self.binary, os.X_OK):
            raise fb.BenchError(f"{self.binary} not found: cargo build --release -p forkvm-cli")
        self.home = tempfile.mkdtemp(prefix="fvb-", dir=self.home_parent)
        for sub in ("guest", "images"):
            os.symlink(Path(self.artifacts) / sub, os.path.join(self.home, sub))
        self._launch()

    def _launch(self) -> None:
        env = dict(os.environ, **self.env, FORKVM_HOME=self.home)
        env.pop("FORKVM_URL", None)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "serve"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.api = fb.Api(self.socket_path)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise fb.BenchError(f"forkvm serve exited with {self.proc.returncode}:\n"
                                    + self.log_tail())
            if os.path.exists(self.socket_path):
                try:
                    self.api.info()
                    return
                except Exception:  # noqa: BLE001 - not up yet (or the old socket)
                    pass
            if time.monotonic() > deadline:
                raise fb.BenchError("forkvm serve did not answer on its socket within "
                                    f"{self.startup_timeout:.0f}s:\n" + self.log_tail())
            time.sleep(0.05)

    def restart(self) -> None:
        """Stop the daemon (SIGTERM to its pid; it has no sandbox left) and
        start a new one on the same home."""
        if self.sandboxes:
            raise fb.BenchError(f"restart with sandboxes left: {sorted(self.sandboxes)}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            fb.kill_and_reap(self.proc)
        self._log.close()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self._launch()

    def env_cli(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "FORKVM_URL"}
        env["FORKVM_HOME"] = self.home
        return env

    def cli(self, *args) -> str:
        return sh([self.binary, *args], env=self.env_cli())[1]

    def snapshot_dir(self, sid: str) -> Path:
        return Path(self.home) / "snapshots" / sid

    def guard(self, what: str) -> None:
        """Refuse to time a transfer that the netns bug would break."""
        if self.proc is None or self.proc.poll() is not None:
            raise fb.BenchError(f"the daemon of {self.home} is not running:\n" + self.log_tail())
        bad = stray_threads(self.proc.pid)
        if bad:
            raise fb.BenchError(
                f"before {what}: daemon pid {self.proc.pid} has thread(s) {bad} in a sandbox's "
                "network namespace (forkvm-net set_forwarding's setns on a reused tokio "
                "thread); a registry request from them gets `connection refused`")


def drop_host_table(home: str) -> None:
    """Delete the host nft table our daemon may leave (`inet forkvm-<hash of
    its home>`); only ours: the hash is of our home."""
    name = "forkvm-" + fb.run_dir_for_home(home).name.removeprefix("forkvm-")
    try:
        if subprocess.run(["nft", "list", "table", "inet", name],
                          capture_output=True).returncode == 0:
            subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True)
    except OSError:
        pass


def private_artifacts(root: Path, artifacts: Path) -> Path:
    """An artefacts dir for B: `guest` -> the real one, an empty `images/`."""
    mine = root / "artifacts-b"
    (mine / "images").mkdir(parents=True)
    (mine / "guest").symlink_to(artifacts / "guest")
    return mine


# --------------------------------------------------------------------------
# forkvm transfers
# --------------------------------------------------------------------------


def transfer(d: Host, args: list[str], label: str) -> tuple[float, list, dict]:
    """`forkvm --json snapshot ARGS` (a push or a pull): (wall ms, [(ms,
    phase)], the result of the last event). Phases and a progress line every
    10 s go to the terminal."""
    env = d.env_cli()
    argv = [d.binary, "--json", "snapshot", *args]
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=err, text=True)
        phases, result, error, last_print, last_prog = [], None, None, 0.0, None
        first_work = None  # the first progress or cached event
        for line in p.stdout:
            now = fb.ms_since(t0)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            t = ev.get("type")
            if t == "phase":
                phases.append((now, ev["phase"]))
                print(f"      [{now / 1000:6.1f} s] {ev['phase']}", flush=True)
                last_print = now
            elif t == "progress":
                last_prog = ev
                first_work = now if first_work is None else first_work
                if now - last_print > 10_000:
                    tot = ev.get("total")
                    pct = f" {100 * ev['done'] / tot:.0f}%" if tot else ""
                    print(f"      [{now / 1000:6.1f} s] {ev['item']}{pct}", flush=True)
                    last_print = now
            elif t == "cached":
                first_work = now if first_work is None else first_work
            elif t in ("pushed", "pulled"):
                result = ev["result"]
            elif t == "error":
                error = ev.get("error")
        rc = p.wait()
        ms = fb.ms_since(t0)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if rc != 0 or result is None:
        raise fb.BenchError(f"{label}: `{shlex.join(argv)}` exited with {rc}: "
                            f"{error or stderr.strip()[-2000:]} (last progress: {last_prog})")
    phases.append((first_work, "(first progress or cached event)"))
    return ms, phases, result


def push_row(ms: float, phases, r: dict) -> dict:
    up = next((t for t, ph in phases if t is not None and ph.startswith("pushing to")), None)
    return {"total_ms": ms, "prepare_ms": up, "transfer_ms": None if up is None else ms - up,
            "daemon_ms": r["total_ms"], "bytes": r["bytes_sent"], "blobs": r["blobs_sent"],
            "blobs_skipped": r["blobs_skipped"], "bytes_skipped": r["bytes_skipped"],
            "links": r["links"], "links_skipped": r["links_skipped"],
            "image_sent": int(bool(r["image_sent"]))}


def pull_row(ms: float, phases, r: dict) -> dict:
    # resolve: until the first progress or cached event, or the first phase
    # after `resolving` (the index, the configs, the compatibility check).
    res = min([t for t, ph in phases if t is not None and not ph.startswith("resolving")
               and ph != "publishing"] or [0.0])
    pub = next((t for t, ph in phases if ph == "publishing"), None)
    return {"total_ms": ms, "prepare_ms": res,
            "transfer_ms": None if pub is None else pub - res,
            "finish_ms": None if pub is None else ms - pub, "daemon_ms": r["total_ms"],
            "bytes": r["bytes_fetched"], "blobs": r["blobs_fetched"], "links": r["links"],
            "links_skipped": r["links_cached"], "image_sent": int(bool(r["image_created"]))}


# --------------------------------------------------------------------------
# The baseline: tar + OCI layout + skopeo
# --------------------------------------------------------------------------


def stage_tree(dst: Path, rootfs: Path, template: Path, snap: Path) -> Path:
    """A directory of symlinks: image/rootfs.ext4, template/*, snapshot/*
    (`tar -h` archives what they point to)."""
    for sub, src in (("template", template), ("snapshot", snap)):
        (dst / sub).mkdir(parents=True)
        for f in sorted(src.iterdir()):
            if f.is_file():
                (dst / sub / f.name).symlink_to(f)
    (dst / "image").mkdir()
    (dst / "image" / "rootfs.ext4").symlink_to(rootfs)
    return dst


def write_layout(layout: Path, stage: Path, tag: str) -> dict:
    """An OCI image layout with one uncompressed layer: GNU `tar --sparse`
    of `stage`, hashed here, plus a minimal config, manifest and index."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    tmp = blobs / ".layer.tar"
    tar_ms, _ = sh(["tar", "--sparse", "--dereference", "-cf", tmp, "-C", stage,
                    "image", "template", "snapshot"])
    t0 = time.perf_counter()
    digest = sha256_file(tmp)
    size = tmp.stat().st_size
    tmp.rename(blobs / digest)

    def put(obj) -> tuple[str, int]:
        b = json.dumps(obj, separators=(",", ":")).encode()
        h = hashlib.sha256(b).hexdigest()
        (blobs / h).write_bytes(b)
        return f"sha256:{h}", len(b)

    cfg_d, cfg_n = put({"architecture": "amd64", "os": "linux",
                        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
                        "config": {}})
    man_d, man_n = put({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cfg_d, "size": cfg_n},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{digest}", "size": size}]})
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": man_d, "size": man_n,
                       "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"tar_ms": tar_ms, "layout_ms": fb.ms_since(t0), "tar_bytes": size}


def layout_layer(layout: Path, tag: str) -> tuple[Path, str, int]:
    """(path, media type, size) of the single layer of `layout`:`tag`."""
    index = json.loads((layout / "index.json").read_text())
    for m in index.get("manifests", []):
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            man = json.loads((layout / "blobs" / "sha256" /
                              m["digest"].split(":", 1)[1]).read_text())
            layer = man["layers"][0]
            return (layout / "blobs" / "sha256" / layer["digest"].split(":", 1)[1],
                    layer["mediaType"], layer["size"])
    raise fb.BenchError(f"{layout} has no tag {tag!r}")


def skopeo_push(reg: Registry, work: Path, name: str, rootfs: Path, template: Path,
                snap: Path) -> dict:
    d = work / f"skopeo-{name}"
    stage = stage_tree(d / "stage", rootfs, template, snap)
    t0 = time.perf_counter()
    lay = write_layout(d / "oci", stage, name)
    prepare = fb.ms_since(t0)
    before, (rq0, pg0) = reg.stored_bytes(), reg.access_counts()
    copy, _ = sh(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{d / 'oci'}:{name}",
                  f"docker://{reg.host}/base/{name}:v1"])
    rq1, pg1 = reg.access_counts()
    man = reg.manifest(f"base/{name}", "v1")
    layer = man["layers"][0]
    shutil.rmtree(d / "oci")  # the source of the copy is no longer needed
    return {"total_ms": prepare + copy, "prepare_ms": prepare, "transfer_ms": copy,
            "bytes": layer["size"] + man["config"]["size"] + man["_size"],
            "registry_bytes": reg.stored_bytes() - before, "blobs": 2, "requests": rq1 - rq0,
            "pings": pg1 - pg0, "layer_bytes": lay["tar_bytes"],
            "_media": layer["mediaType"], "_tar_ms": lay["tar_ms"]}


def skopeo_pull(reg: Registry, work: Path, name: str, src_files: dict[str, Path]) -> dict:
    d = work / f"skopeo-pull-{name}"
    d.mkdir()
    rq0, pg0 = reg.access_counts()
    copy, _ = sh(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                  f"docker://{reg.host}/base/{name}:v1", f"oci:{d / 'oci'}:{name}"])
    rq1, pg1 = reg.access_counts()
    fetched = tree_bytes(d / "oci" / "blobs")
    blob, media, _ = layout_layer(d / "oci", name)
    z = ["-z"] if media.endswith("gzip") else ["--zstd"] if media.endswith("zstd") else []
    out = d / "files"
    out.mkdir()
    untar, _ = sh(["tar", "-x", *z, "-f", blob, "-C", out])
    # Outside the timing: what came back is what was sent.
    for rel, src in src_files.items():
        got = out / rel
        if not got.is_file() or got.stat().st_size != src.stat().st_size:
            raise fb.BenchError(f"skopeo pull of {name}: {rel} is missing or has the wrong size")
    mem = "snapshot/memory.diff"
    ok = sha256_file(out / mem) == sha256_file(src_files[mem]) if mem in src_files else None
    shutil.rmtree(d)
    return {"total_ms": copy + untar, "transfer_ms": copy, "finish_ms": untar,
            "bytes": fetched, "blobs": 2, "requests": rq1 - rq0, "pings": pg1 - pg0,
            "sha_ok": None if ok is None else int(ok)}


# --------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------


def measure(case: str, run: int, fn, meter: fb.CpuMeter, reg: Registry) -> dict:
    reg.check()
    print(f"[run {run}] {case} …", flush=True)
    meter.start()
    row = fn()
    row.update(case=case, run=run, other_cpu_cores=meter.other_cores())
    extra = []
    if row.get("bytes") is not None:
        extra.append(f"{row['bytes'] / MiB:.1f} MiB {'sent' if 'push' in case else 'fetched'}")
    if row.get("blobs") is not None and not case.startswith("skopeo"):
        extra.append(f"{row['blobs']} blobs" + (f" ({row['blobs_skipped']} skipped)"
                                                if row.get("blobs_skipped") else ""))
    st = [f"{n} {row[s] / 1000:.1f}" for s, n in zip(STAGES, STAGE_NAMES[kind(case)])
          if n and row.get(s) is not None]
    print(f"[run {run}] {case:<15} {row['total_ms'] / 1000:6.1f} s"
          + (f" ({', '.join(st)})" if st else "") + (f"; {', '.join(extra)}" if extra else ""),
          flush=True)
    return row


def forkvm_block(run, a: Host, b: Host, reg: Registry, snaps, sums, meter) -> list[dict]:
    rows = []
    for case, snap, ref in (("push_s1", snaps["s1"], "bench/s1:v1"),
                            ("push_s2", snaps["s2"], "bench/s1:v2"),
                            ("push_s2_repo", snaps["s2"], "bench/s2:v1")):
        def do_push():
            a.guard(case)
            before, (rq0, pg0) = reg.stored_bytes(), reg.access_counts()
            ms, phases, r = transfer(a, ["push", snap, f"{reg.host}/{ref}"], case)
            rq1, pg1 = reg.access_counts()
            return {**push_row(ms, phases, r), "registry_bytes": reg.stored_bytes() - before,
                    "requests": rq1 - rq0, "pings": pg1 - pg0}
        rows.append(measure(case, run, do_push, meter, reg))
    pulled = {}
    for case, name, ref in (("pull_s1", "s1", "bench/s1:v1"), ("pull_s2", "s2", "bench/s2:v1")):
        def do_pull():
            b.guard(case)
            rq0, pg0 = reg.access_counts()
            ms, phases, r = transfer(b, ["pull", f"{reg.host}/{ref}", "--tag", name], case)
            rq1, pg1 = reg.access_counts()
            pulled[name] = r["snapshot"]["id"]
            return {**pull_row(ms, phases, r), "requests": rq1 - rq0, "pings": pg1 - pg0}
        rows.append(measure(case, run, do_pull, meter, reg))
    # Correctness, after every pull (a spawn leaves B with a stray thread).
    for case, name in (("pull_s1", "s1"), ("pull_s2", "s2")):
        t0 = time.perf_counter()
        sb = b.api.request("POST", "/v1/sandboxes", {"snapshot": pulled[name], "network": "none"},
                           expect=(201,))
        b.sandboxes.add(sb["id"])
        spawn_ms = fb.ms_since(t0)
        r = b.api.exec(sb["id"], ["sha256sum", "/root/buf"])
        got = (r.get("stdout") or "").split()[:1]
        ok = got == [sums[name]]
        b.delete(sb["id"])
        row = next(x for x in rows if x["case"] == case)
        row.update(spawn_ms=spawn_ms, sha_ok=int(ok))
        print(f"[run {run}] B: spawn from pulled {name} {spawn_ms / 1000:.1f} s, /root/buf "
              f"SHA-256 {'matches' if ok else 'DIFFERS from'} A's", flush=True)
        if not ok:
            raise fb.BenchError(f"run {run}: /root/buf in a sandbox of pulled {name} has "
                                f"SHA-256 {got}, A wrote {sums[name]} ({r})")
    return rows


def baseline_block(run, a: Host, reg: Registry, work: Path, snaps, template, meter) -> list:
    rows = []
    rootfs = (Path(a.home) / "images" / "default" / "rootfs.ext4").resolve()
    media = set()
    for name in ("s1", "s2"):
        def do_push():
            return skopeo_push(reg, work, name, rootfs, a.snapshot_dir(template),
                               a.snapshot_dir(snaps[name]))
        rows.append(measure(f"skopeo_push_{name}", run, do_push, meter, reg))
        media.add(rows[-1].pop("_media"))
        rows[-1].pop("_tar_ms")
    for name in ("s1", "s2"):
        src = {"image/rootfs.ext4": rootfs}
        for sub, sid in (("template", template), ("snapshot", snaps[name])):
            for f in a.snapshot_dir(sid).iterdir():
                if f.is_file():
                    src[f"{sub}/{f.name}"] = f
        rows.append(measure(f"skopeo_pull_{name}", run,
                            lambda: skopeo_pull(reg, work, name, src), meter, reg))
        if rows[-1].get("sha_ok") == 0:
            raise fb.BenchError(f"run {run}: the skopeo round trip changed {name}'s memory.diff")
    shutil.rmtree(work / "skopeo-s1", ignore_errors=True)
    shutil.rmtree(work / "skopeo-s2", ignore_errors=True)
    for r in rows:
        r["_media"] = ",".join(sorted(media))
    return rows


def one_run(run: int, args, ctx: dict, artifacts: Path) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix=f"fvb-registry-{run}-", dir="/var/tmp"))
    rows, homes = [], []
    try:
        with Registry(work / "registry") as reg, \
                Host(binary=args.binary, artifacts=str(artifacts), home_parent="/var/tmp") as a, \
                Host(binary=args.binary, artifacts=str(private_artifacts(work, artifacts)),
                     home_parent="/var/tmp", env={"FORKVM_NET_POOL": NET_POOL_B}) as b:
            homes = [a.home, b.home]
            ctx.setdefault("info", a.api.info())
            others = fb.other_qemu_processes(exclude_substrings=(a.home, b.home))
            ctx["others"].update(others)
            ctx["busy"] += bool(others)
            print(f"==> run {run}/{args.runs}: registry on {reg.host}; A {a.home}, B {b.home}",
                  flush=True)
            snaps, sums = {}, {}
            for name in ("s1", "s2"):
                t0 = time.perf_counter()
                sb = a.create(memory_mib=args.memory, network="none")
                ctx["stray_spawn"].append(len(stray_threads(a.proc.pid)))
                r = a.api.exec(sb["id"], ["sh", "-c", f"head -c {args.data_mib}M /dev/urandom "
                                          "> /root/buf && sync && sha256sum /root/buf"])
                if r.get("exit_code") != 0:
                    raise fb.BenchError(f"writing /root/buf in {sb['id']} failed: {r}")
                sums[name] = r["stdout"].split()[0]
                snap = json.loads(a.cli("--json", "snapshot", sb["id"], "--tag", name))
                snaps[name] = snap["id"]
                a.delete(sb["id"])
                print(f"[run {run}] A: {name} = {snap['id']} ({snap['kind']}, parent "
                      f"{snap.get('parent')}; memory.diff "
                      f"{snap['sizes'].get('memory_diff_bytes', 0) / MiB:.0f} MiB, disk layer "
                      f"{snap['sizes'].get('disk_bytes', 0) / MiB:.0f} MiB) in "
                      f"{fb.ms_since(t0) / 1000:.1f} s", flush=True)
            template = json.loads(a.cli("--json", "snapshot", "inspect", snaps["s1"]))["parent"]
            p2 = json.loads(a.cli("--json", "snapshot", "inspect", snaps["s2"]))["parent"]
            if not template or p2 != template:
                raise fb.BenchError(f"S1 and S2 should both be diffs of the boot template: "
                                    f"parents {template} and {p2}")
            stray = stray_threads(a.proc.pid)
            ctx["stray"].append(len(stray))
            # A daemon from before the netns fix (see stray_threads) keeps
            # such threads: a new daemon process on the same home has none.
            if stray or any(ctx["stray_spawn"][-2:]):
                print(f"[run {run}] A: daemon threads in a sandbox's network namespace: "
                      f"{', '.join(map(str, ctx['stray_spawn'][-2:]))} right after the spawns, "
                      f"{len(stray)} now; restarting A's daemon on the same home", flush=True)
                a.restart()
            meter = fb.CpuMeter(roots=[a.proc.pid, b.proc.pid, reg.proc.pid])
            blocks = [lambda: forkvm_block(run, a, b, reg, snaps, sums, meter),
                      lambda: baseline_block(run, a, reg, work, snaps, template, meter)]
            if run % 2 == 0:
                blocks.reverse()
            for blk in blocks:
                rows += blk()
            if run == 1 and not args.no_chunk_sizes:
                print(f"[run {run}] chunk sizes {', '.join(map(str, cs.SIZES_MIB))} MiB, "
                      "offline over A's files (not timed)", flush=True)
                rootfs = (Path(a.home) / "images" / "default" / "rootfs.ext4").resolve()
                ctx["chunks"] = cs.analyse(rootfs, a.snapshot_dir(template),
                                           a.snapshot_dir(snaps["s1"]),
                                           a.snapshot_dir(snaps["s2"]))
    finally:
        for h in homes:
            drop_host_table(h)
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        media = r.pop("_media", None)
        if media:
            ctx["skopeo_media"] = media
    return rows


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def p(rows, case: str, key: str = "total_ms") -> dict:
    return rp.summarize(r.get(key) for r in rows if r["case"] == case)


def secs(v) -> str:
    return rp.fmt(v / 1000, 1)


def mib(v) -> str:
    return rp.fmt(None if v is None else v / MiB, 1)


def summary_table(rows) -> list[str]:
    L = ["| figure | forkvm p50 (s) | p90 | skopeo p50 (s) | p90 | forkvm / skopeo (p50) | "
         "MiB forkvm | MiB skopeo |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, what, base in FIGURES:
        f, n = p(rows, case), p(rows, base)
        ratio = rp.ratio(f["p50"], n["p50"])
        L.append(f"| {case}: {what} | **{secs(f['p50'])}** | {secs(f['p90'])} | "
                 f"{secs(n['p50'])} | {secs(n['p90'])} | "
                 f"{'**' + format(ratio, '.2f') + '×**' if ratio == ratio else '–'} | "
                 f"{mib(p(rows, case, 'bytes')['p50'])} | {mib(p(rows, base, 'bytes')['p50'])} |")
    return L


def detail_table(rows) -> list[str]:
    L = ["| case | blobs | skipped (blobs / MiB) | links (skipped or cached) | image | "
         "stored in registry (MiB) | HTTP requests (`GET /v2/` pings) |",
         "|---|---:|---:|---:|---|---:|---:|"]
    for case, _, _ in FIGURES:
        rs = [r for r in rows if r["case"] == case]
        if not rs:
            continue
        img = {r.get("image_sent") for r in rs}
        word = "sent" if "push" in case else "fetched"
        L.append(f"| {case} | {rp.fmt(p(rows, case, 'blobs')['p50'])} | "
                 f"{rp.fmt(p(rows, case, 'blobs_skipped')['p50'])} / "
                 f"{mib(p(rows, case, 'bytes_skipped')['p50'])} | "
                 f"{rp.fmt(p(rows, case, 'links')['p50'])} "
                 f"({rp.fmt(p(rows, case, 'links_skipped')['p50'])}) | "
                 f"{word if img == {1} else 'not ' + word if img == {0} else 'mixed'} | "
                 f"{mib(p(rows, case, 'registry_bytes')['p50'])} | "
                 f"{rp.fmt(p(rows, case, 'requests')['p50'])} "
                 f"({rp.fmt(p(rows, case, 'pings')['p50'])}) |")
    for case in BASELINE:
        if "push" in case:
            L.append(f"| {case} | 2 (layer + config) | – | – | in the layer | "
                     f"{mib(p(rows, case, 'registry_bytes')['p50'])} | "
                     f"{rp.fmt(p(rows, case, 'requests')['p50'])} "
                     f"({rp.fmt(p(rows, case, 'pings')['p50'])}) |")
        else:
            L.append(f"| {case} | 2 | – | – | in the layer | – | "
                     f"{rp.fmt(p(rows, case, 'requests')['p50'])} "
                     f"({rp.fmt(p(rows, case, 'pings')['p50'])}) |")
    return L


def per_blob_requests(rows) -> float:
    """HTTP requests per blob sent in run 1's cold push (HEAD, upload in
    POST + PATCH + PUT, each after a `GET /v2/` ping; manifests on top)."""
    m = next((r for r in rows if r["run"] == 1 and r["case"] == "push_s1"), None)
    return rp.ratio(m and m.get("requests"), m and m.get("blobs"))


def chunk_table(ch: dict, rows) -> list[str]:
    if not ch:
        return ["Not measured in this run (`--no-chunk-sizes`)."]
    files = sorted(k for k in ch["rows"][0] if k.startswith("s2/") and k.endswith("_bytes"))
    head = " | ".join(f"S2 {k[3:-6]} (MiB)" for k in files)
    per = per_blob_requests(rows)
    L = [f"| chunk | push S1 cold (MiB) | blobs | HTTP requests (est.) | push S2 after S1 (MiB) "
         f"| blobs | {head} |",
         "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(files)]
    for r in ch["rows"]:
        b = "**" if r["chunk_mib"] == 4 else ""
        L.append(f"| {b}{r['chunk_mib']} MiB{b} | {b}{mib(r['s1_bytes'])}{b} | "
                 f"{r['s1_blobs']:,} | {rp.fmt(r['s1_blobs'] * per)} | "
                 f"{b}{mib(r['s2_after_s1_bytes'])}{b} | {r['s2_after_s1_blobs']:,} | "
                 + " | ".join(mib(r[k]) for k in files) + " |")
    four = next((r for r in ch["rows"] if r["chunk_mib"] == 4), None)
    r1 = [r for r in rows if r["run"] == 1]
    m1 = next((r for r in r1 if r["case"] == "push_s1"), None)
    m2 = next((r for r in r1 if r["case"] == "push_s2"), None)
    if four and m1 and m2:
        L += ["", f"Check against run 1's real pushes (4 MiB chunks; these also count the "
              f"configs and manifests): push S1 sent {mib(m1['bytes'])} MiB in {m1['blobs']} "
              f"blobs (computed: {mib(four['s1_bytes'])} MiB in {four['s1_blobs']} chunks); "
              f"push S2 sent {mib(m2['bytes'])} MiB in {m2['blobs']} blobs (computed: "
              f"{mib(four['s2_after_s1_bytes'])} MiB in {four['s2_after_s1_blobs']} chunks). "
              f"HTTP requests (est.): the chunks times the {per:.1f} requests per blob sent "
              "that run 1's cold push made (HEAD, then POST, PATCH and PUT, each after a "
              "`GET /v2/` ping)."]
    return L


def chunk_notes(ch: dict) -> list[str]:
    rs = {r["chunk_mib"]: r for r in (ch or {}).get("rows", [])}
    if not {1, 4, 16} <= set(rs):
        return []
    a, f, z = rs[1], rs[4], rs[16]

    def pct(x, y):
        return f"{100 * (x / y - 1):+.1f}%"

    return [
        f"The bytes hardly depend on the chunk size in this workload: from 1 to 16 MiB a cold "
        f"push changes by {pct(z['s1_bytes'], a['s1_bytes'])} (larger chunks compress a little "
        f"better; all-zero ranges are left out at any size, and zeros inside a chunk compress "
        f"to almost nothing) and S2 after S1 by {pct(z['s2_after_s1_bytes'], a['s2_after_s1_bytes'])}"
        f". What S2 shares with S1 (the image, the template) it shares as whole files, and "
        f"what it does not share is new data at every grain, so a smaller chunk finds no "
        f"more sharing. The number of blobs, and of requests, falls as 1/size: "
        f"{a['s1_blobs']:,} blobs at 1 MiB, {f['s1_blobs']:,} at 4 MiB, {z['s1_blobs']:,} at "
        f"16 MiB. 4 MiB takes most of that fall ({f['s1_blobs'] / a['s1_blobs']:.0%} of the "
        f"1 MiB count, {pct(f['s1_bytes'], a['s1_bytes'])} bytes) while keeping the unit a "
        "pull fetches, verifies and retries small, and the waste when one page changes in a "
        "full memory image or a root disk (a 4 MiB blob, compressed) bounded; sharing at a "
        "finer grain than this workload has (two images differing in a few files, two "
        "flattened snapshots of one source) would favour the smaller sizes, and these figures "
        "do not measure it.",
    ]


def notes(rows, ctx) -> list[str]:
    def med(case, key="total_ms"):
        return p(rows, case, key)["p50"]

    def rng(xs) -> str:
        return "–" if not xs else f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}"

    pulls = [r for r in rows if r["case"].startswith("pull")]
    L = [
        f"- **Dedup across snapshots.** Pushed to the same repository, S2 sent "
        f"{mib(med('push_s2', 'bytes'))} MiB against S1's {mib(med('push_s1', 'bytes'))} MiB: "
        f"the image and the template link were found (one manifest HEAD each) and skipped, and "
        f"what was sent is S2's own link (its {ctx['data_mib']} MiB of random data is both in "
        f"the guest's page cache, so in memory.diff, and, after `sync`, in its disk layer). "
        f"skopeo sends its one big layer again: {mib(med('skopeo_push_s2', 'bytes'))} MiB. "
        f"On B, pull S2 fetched {mib(med('pull_s2', 'bytes'))} MiB (B had the image and the "
        f"template from pull S1) against skopeo's {mib(med('skopeo_pull_s2', 'bytes'))} MiB.",
        f"- **Another repository gets no dedup.** Pushed to `bench/s2` instead, S2 sent "
        f"{mib(med('push_s2_repo', 'bytes'))} MiB, the whole chain again: a registry answers "
        "blob and manifest HEADs per repository, and forkvm's push neither tries a "
        "cross-repository mount (`POST /v2/<name>/blobs/uploads/?mount=<digest>&from=<repo>`) "
        "nor remembers where it pushed before. The registry's storage is content-addressed, so "
        f"it stored {mib(med('push_s2_repo', 'registry_bytes'))} MiB more, but every byte "
        "went over the wire.",
        f"- **Where a cold push goes**: chunking {secs(med('push_s1', 'prepare_ms'))} s and "
        f"upload {secs(med('push_s1', 'transfer_ms'))} s (p50s), against "
        f"{secs(med('skopeo_push_s1', 'prepare_ms'))} s of `tar --sparse` + layout and "
        f"{secs(med('skopeo_push_s1', 'transfer_ms'))} s of `skopeo copy`. Chunking reads "
        "every byte of every file, holes included (`index_file` in "
        "crates/forkvm-artifact/src/chunk.rs reads each chunk up to the file's size, tests it "
        "for zeros and feeds it to the whole-file SHA-256 a link lists): about 2.5 GiB for the "
        "root disk and the template's memory image, which hold about 0.4 GiB of data, where "
        "`tar --sparse` finds the data with SEEK_DATA/SEEK_HOLE (from the code; not timed "
        "apart here). The upload compresses again "
        "each chunk it sends (`read_chunk` in crates/forkvm-artifact/src/push.rs: the cached "
        "chunk list keeps digests, not blobs), so a cold push zstd-compresses every chunk "
        f"twice, and push_s2_repo, whose chunk lists were all cached, still took "
        f"{secs(med('push_s2_repo'))} s. Every registry request is preceded by a `GET /v2/` "
        f"ping ({rp.fmt(med('push_s1', 'pings'))} of push S1's "
        f"{rp.fmt(med('push_s1', 'requests'))} requests; skopeo: "
        f"{rp.fmt(med('skopeo_push_s1', 'pings'))} of "
        f"{rp.fmt(med('skopeo_push_s1', 'requests'))}); on loopback they cost little, over a "
        "WAN each is a round trip.",
        f"- **Where a pull goes.** A pull checks every chunk against its digest, fsyncs every "
        f"assembled file and checks it against its SHA-256, re-reading it whole (`Assembler::"
        f"finish`): for pull S1 that is 2.5 GiB, mostly holes, and its fetch + check took "
        f"{secs(med('pull_s1', 'transfer_ms'))} s against {secs(med('skopeo_pull_s1', 'transfer_ms'))}"
        f" s for `skopeo copy` of the gzip layer (whose untar then took "
        f"{secs(med('skopeo_pull_s1', 'finish_ms'))} s). Pull S2 spent {secs(med('pull_s2', 'prepare_ms'))}"
        f" s of its {secs(med('pull_s2'))} s before fetching anything, resolving and finding "
        "that B already has the image: `matching_image` (crates/forkvm-daemon/src/registry/"
        "import.rs) finds the root disk's SHA-256 in the digest cache, where the pull that "
        "installed it put it (before commit f84c7b9 it hashed the 2 GiB disk again: 2.0 s).",
        f"- **Ready to use.** A forkvm pull ends with the snapshot published in B's store "
        f"(every chunk and file checked, files fsynced); the first spawn from it then took "
        f"{secs(med('pull_s1', 'spawn_ms'))} s (S1) and {secs(med('pull_s2', 'spawn_ms'))} s "
        "(S2), p50, and /root/buf's SHA-256 in that sandbox matched A's in "
        f"{sum(1 for r in pulls if r.get('sha_ok') == 1)} of {len(pulls)} spawns. The skopeo "
        "pull ends with the files untarred (not fsynced; checked: the layer digest by skopeo, "
        "and here, outside the timing, every file's size and memory.diff's SHA-256); nothing "
        "can spawn from them yet. Its untar is mostly single-threaded gunzip.",
        f"- **Compression**: forkvm sends zstd level 3 chunks; skopeo gzips the uncompressed "
        f"tar layer on the way (the registry stores `{ctx.get('skopeo_media', '?')}`), with "
        "containers/image's parallel gzip. `tar --sparse` stores only the data of the sparse "
        "files (root disk, template memory), as forkvm leaves out its all-zero chunks, so "
        "neither side sends the 2 GiB disk's or the 512 MiB memory image's holes.",
        (f"- **Daemon threads in sandbox namespaces: none.** Until commit a5df302 every "
         "spawn left a daemon thread in the sandbox's network namespace (a setns on a tokio "
         "pool thread), and a registry request from it got `connection refused`. The bench "
         "counts such threads after every spawn and before every timed transfer: "
         f"{rng(ctx['stray_spawn'])} after the spawns, {rng(ctx['stray'])} when transfers "
         "were due.") if not any(ctx["stray_spawn"]) and not any(ctx["stray"]) else
        (f"- **A forkvm bug the bench worked around.** Daemon A had {rng(ctx['stray_spawn'])} "
         f"thread(s) in a sandbox's network namespace right after each spawn and "
         f"{rng(ctx['stray'])} when its transfers were due (the setns-on-a-pool-thread bug "
         "of forkvm-net before commit a5df302): a registry request from one gets "
         "`connection refused`. The bench restarted A's daemon on the same home after the "
         "snapshots (the chunk cache is on disk, so nothing measured changes)."),
        "- The registry is on 127.0.0.1 and the files are in the page cache: transfers cost "
        "CPU (compression, hashing, the registry's own hashing and writes), not network. Over "
        "a real link the bytes column weighs more, in forkvm's favour wherever it sends less.",
        "- `other_cpu_cores` in the CSV is the CPU other processes used during each "
        "measurement (our daemons with their helpers, the registry, skopeo and tar count as "
        "ours).",
    ]
    return L


def write_results(path: Path, rows, ctx: dict, args) -> list[str]:
    info, machine = ctx["info"], ctx["machine"]
    L = []
    if args.runs < MIN_RUNS:
        L += rp.smoke_banner(f"{args.runs} run(s) < {MIN_RUNS}", "bash bench/registry/run.sh")
    other = rp.summarize(r.get("other_cpu_cores") for r in rows)
    ch = ctx.get("chunks")
    quiet = ctx.get("quiet")
    L += [
        "# Registry benchmark: snapshot push and pull, against tar + skopeo",
        "",
        rp.date_line(ctx["started"], ctx["elapsed"], minutes=True),
        rp.forkvm_line(info, rp.git_revision(), f" ({ctx['profile']} build: `{args.binary}`)"),
        f"- Machine: {rp.machine_text(machine)}; Linux {machine['kernel']}; load average at "
        f"start {rp.loadavg_text(machine)}",
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}",
        f"- Tools: {ctx['tools']}",
        f"- Command: `{ctx['command']}` ({args.runs} run{'' if args.runs == 1 else 's'}; each with a fresh registry and fresh "
        "daemon homes, so every first push and pull is cold)",
        f"- Snapshots: on daemon A, two {args.memory} MiB, 1 vCPU sandboxes (`network: none`) "
        f"from the boot template of the `default` image, each wrote {args.data_mib} MiB from "
        "/dev/urandom to /root/buf and ran `sync`, then `forkvm snapshot` (S1, S2: `diff` "
        "snapshots whose parent is the template). A push sends the chain: the image's root "
        "disk (2 GiB sparse), the template link (memory.img, 512 MiB sparse; device.state; "
        "disk.qcow2) and the snapshot's link (memory.diff, device.state, disk.qcow2), in 4 MiB "
        "zstd chunks.",
        "- Registry: Debian's `docker-registry` on 127.0.0.1 (plain HTTP, filesystem storage "
        "in a temp dir), new for each run. Daemon B has its own home with an empty `images/`, "
        f"`FORKVM_NET_POOL={NET_POOL_B}`; A's home links the artefacts' `guest/` and `images/`.",
        "- forkvm times are the CLI's wall time (`forkvm --json snapshot push|pull`); the "
        "stages come from its NDJSON phase events (push: chunking until `pushing to`, then "
        "upload; pull: `resolving`, fetch and check until `publishing`, publish).",
        f"- Baseline (skopeo), same run, same files: {BASELINE['skopeo_push_s1']}; "
        f"{BASELINE['skopeo_pull_s1']}; S2 likewise. The layer is GNU `tar --sparse "
        "--dereference` of `image/rootfs.ext4`, `template/*` and `snapshot/*` (manifest.fvs "
        "included), uncompressed in an OCI layout written by bench_registry.py; skopeo "
        "compresses it with gzip when pushing. The forkvm and skopeo blocks alternate order "
        "between runs.",
        f"- Other processes used {rp.fmt(other['p50'], 2)} cores (p50; max "
        f"{rp.fmt(other['max'], 2)}) of the {machine['cores']} during the measurements"
        + (f"; before starting, the bench waited for a quiet host and measured "
           f"{quiet:.2f} cores" if quiet is not None else "") + ".",
        *qemu_lines(ctx, args.runs),
        "",
        "## Results",
        "",
        *summary_table(rows),
        "",
        "skopeo's pull time includes untarring the layer (the files ready to use); its "
        "`skopeo copy` alone is in the stage table below. MiB: what went over the wire "
        "(forkvm's `bytes_sent`/`bytes_fetched`; skopeo's layer + config + manifest, or the "
        "blobs it wrote).",
        "",
        *detail_table(rows),
        "",
        "Every stage, in ms (prepare: chunking for a forkvm push, resolving for a pull, tar + "
        "OCI layout for skopeo; transfer: upload or fetch, with checks; finish: forkvm's "
        "publish, or untar):",
        "",
        *rp.stats_table(rp.case_stats(rows, [(c, STAGES + ["spawn_ms"]) for c, _, _ in FIGURES]
                                      + [(c, STAGES) for c in BASELINE]), with_n=True),
        "",
        "## Chunk size",
        "",
        "What a push would send for other chunk sizes, computed offline over run 1's files "
        f"(chunk_sizes.py; compression: {ch['method'] if ch else '–'}). Every file is cut at "
        "fixed offsets, all-zero chunks are left out, equal chunks are sent once; \"push S2 "
        "after S1\" counts S2's chunks that S1's push did not send.",
        "",
        *chunk_table(ch, rows),
        "",
        *chunk_notes(ch),
        "",
        "## Notes",
        "",
        *notes(rows, ctx),
        "",
        "Raw rows: `registry.csv`, `chunk_sizes.csv`; plot: `registry.png`.",
    ]
    path.write_text("\n".join(L) + "\n")
    return L


def qemu_lines(ctx: dict, runs: int, most: int = 5) -> list[str]:
    lines = rp.other_qemu_lines(ctx["others"], ctx["busy"], runs)
    if len(lines) > most + 1:
        lines = lines[:most + 1] + [f"  - … and {len(lines) - most - 1} more"]
    return lines


def plot(rows, ctx: dict, path: Path) -> None:
    plt = rp.pyplot()
    ch = ctx.get("chunks")
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6),
                             gridspec_kw={"width_ratios": [3, 1.6, 1.4]})
    ax, bx, cx = axes
    colours = {"prepare_ms": "tab:blue", "transfer_ms": "tab:orange", "finish_ms": "tab:green"}
    names = {"prepare_ms": "prepare (chunking / resolve)",
             "transfer_ms": "transfer (upload / fetch)", "finish_ms": "finish (publish / untar)"}
    bars = []
    for case, _, base in reversed(FIGURES):
        bars += [(f"skopeo: {base.removeprefix('skopeo_')}", base), (f"forkvm: {case}", case)]
    seen = set()
    for y, (_, case) in enumerate(bars):
        left = 0.0
        for st in STAGES:
            v = p(rows, case, st)["p50"] / 1000
            if v == v:
                sk = case.startswith("skopeo")
                ax.barh(y, v, left=left, color=colours[st],
                        label=None if st in seen or sk else names[st],
                        hatch="//" if sk else None, edgecolor="white")
                if not sk:
                    seen.add(st)
                left += v
        f = p(rows, case)
        ax.plot([f["p50"] / 1000, f["p90"] / 1000], [y, y], color="black", linewidth=1)
        ax.plot(f["p50"] / 1000, y, "o", color="black", markersize=4,
                label=None if "total" in seen else "total: p50 (dot) to p90 (bar)")
        ax.plot(f["p90"] / 1000, y, "|", color="black", markersize=10)
        seen.add("total")
    ax.barh([0], [0], color="lightgrey", hatch="//", edgecolor="white",
            label="skopeo (hatched): tar + layout, skopeo copy, untar")
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set_xlabel("seconds: p50 of each stage, stacked")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8)
    ax.set_title("Wall time", fontsize=10)
    cases = [c for c, _, _ in FIGURES]
    xs = range(len(cases))
    bx.bar([x - 0.2 for x in xs], [p(rows, c, "bytes")["p50"] / MiB for c in cases], 0.4,
           color="tab:purple", label="forkvm")
    bx.bar([x + 0.2 for x in xs], [p(rows, b, "bytes")["p50"] / MiB for _, _, b in FIGURES],
           0.4, color="grey", label="skopeo")
    bx.set_xticks(list(xs), [c.replace("_", "\n", 1) for c in cases], fontsize=8)
    bx.set_ylabel("MiB sent / fetched (p50)")
    bx.legend(fontsize=8)
    bx.set_title("Bytes over the wire", fontsize=10)
    if ch:
        sizes = [r["chunk_mib"] for r in ch["rows"]]
        xs = range(len(sizes))
        cx.bar([x - 0.2 for x in xs], [r["s1_bytes"] / MiB for r in ch["rows"]], 0.4,
               color="tab:blue", label="push S1 cold")
        cx.bar([x + 0.2 for x in xs], [r["s2_after_s1_bytes"] / MiB for r in ch["rows"]], 0.4,
               color="tab:orange", label="push S2 after S1")
        cx.set_xticks(list(xs), [f"{s} MiB" for s in sizes], fontsize=8)
        cx.set_ylabel("MiB sent (computed)")
        c2 = cx.twinx()
        c2.plot(list(xs), [r["s1_blobs"] for r in ch["rows"]], "o-", color="black",
                label="blobs, push S1")
        c2.set_ylabel("blobs in the cold push")
        c2.set_ylim(0, max(r["s1_blobs"] for r in ch["rows"]) * 1.15)
        h1, l1 = cx.get_legend_handles_labels()
        h2, l2 = c2.get_legend_handles_labels()
        cx.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center")
        cx.set_ylim(0, max(r["s1_bytes"] for r in ch["rows"]) / MiB * 1.35)
        cx.set_title("Chunk size (offline)", fontsize=10)
    else:
        cx.axis("off")
    rp.save_figure(fig, path, title="Snapshot push/pull through a local registry: forkvm "
                   "against tar + skopeo")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def tool_versions() -> str:
    out = []
    for argv in (["skopeo", "--version"], ["docker-registry", "--version"],
                 ["tar", "--version"], ["zstd", "-V"]):
        try:
            v = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
            out.append(v.strip().splitlines()[0].strip("* ") if v.strip() else argv[0])
        except (OSError, subprocess.TimeoutExpired):
            out.append(argv[0])
    return "; ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="repetitions of every figure")
    ap.add_argument("--memory", type=int, default=512, help="guest RAM in MiB")
    ap.add_argument("--data-mib", type=int, default=64, help="random data each sandbox writes")
    ap.add_argument("--no-chunk-sizes", action="store_true",
                    help="skip the offline chunk-size analysis")
    rp.add_common_args(ap, HERE)
    args = ap.parse_args()
    if args.runs < 1 or args.data_mib < 1:
        ap.error("--runs and --data-mib must be positive")
    check_tools()
    args.binary = str(Path(args.binary).resolve())
    artifacts = Path(os.environ.get("FORKVM_ARTIFACTS") or fb.DEFAULT_ARTIFACTS)
    for need in (artifacts / "guest", artifacts / "images" / "default"):
        if not need.is_dir():
            raise fb.BenchError(f"{need} is missing: run scripts/setup.sh (or set "
                                "FORKVM_ARTIFACTS to where the guest artefacts are)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"machine": rp.machine_info(), "data_mib": args.data_mib, "tools": tool_versions(),
           "others": {}, "busy": 0,
           "stray": [], "stray_spawn": [], "profile": "debug" if "/debug/" in args.binary else "release",
           "command": "bash bench/registry/run.sh " + shlex.join(sys.argv[1:])}
    if args.wait_quiet:
        ctx["quiet"] = fb.wait_for_quiet_host(args.wait_quiet)
        ctx["machine"] = rp.machine_info()  # the load average once the wait is over
    ctx["started"] = dt.datetime.now().astimezone()
    t0 = time.monotonic()
    rows = []
    for run in range(1, args.runs + 1):
        rows += one_run(run, args, ctx, artifacts)
    ctx["elapsed"] = time.monotonic() - t0
    rp.write_csv(out / "registry.csv", rows, FIELDS)
    if ctx.get("chunks"):
        crow = ctx["chunks"]["rows"]
        rp.write_csv(out / "chunk_sizes.csv", crow, list(crow[0].keys()))
    plot(rows, ctx, out / "registry.png")
    lines = write_results(out / "RESULTS.md", rows, ctx, args)
    print("\n".join(lines))
    print(f"\nwrote {out / 'registry.csv'}, {out / 'RESULTS.md'}, {out / 'registry.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_registry", main, on_signal="exit")
