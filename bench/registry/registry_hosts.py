"""The registry benchmark's fixed parts and its parties: the CSV columns,
figures and baseline cases, the commands it runs (tools, `sh`, file sizes
and digests), the local OCI `Registry` and the two forkvm daemons (`Host`)
that push to and pull from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import docker_registry as dr
import forkvm_bench as fb
import report as rp


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


def check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise fb.BenchError(f"missing tool(s): {', '.join(missing)}; this bench needs them all "
                            "(Debian: apt-get install docker-registry skopeo tar gzip)")


def sh(argv, env=None, timeout: float = 1800.0) -> tuple[float, str]:
    """rp.timed_run without stderr: (wall ms, stdout)."""
    ms, out, _ = rp.timed_run(argv, env, timeout)
    return ms, out


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


class Registry(dr.DockerRegistry):
    """The registry both daemons and skopeo push to and pull from, with what
    it stores and the requests it served."""

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
