"""A local OCI registry for the benchmarks that push and pull images or
snapshots (bench/images, bench/registry): Debian's `docker-registry` on a
free 127.0.0.1 port, its data and log in a directory of the bench's, killed
by the pid it started on exit. Standard library only.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import forkvm_bench as fb


class DockerRegistry:
    """`docker-registry serve` with its config, data and log in `root`; a
    context manager that returns once `GET /v2/` answers."""

    def __init__(self, root: Path, startup_timeout: float = 30.0):
        self.root = root
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self):
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
        deadline = time.monotonic() + self.startup_timeout
        while True:
            self.check()
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2):
                    return self
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise fb.BenchError(f"docker-registry did not answer within "
                                        f"{self.startup_timeout:.0f} s:\n" + fb.tail(str(self.log)))
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            fb.kill_and_reap(self.proc)
            self.proc = None

    def check(self) -> None:
        """Fail the bench if the registry has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise fb.BenchError(f"docker-registry (pid {self.proc.pid}) exited with "
                                f"{self.proc.returncode}:\n" + fb.tail(str(self.log)))

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ref(self, repo: str, tag: str = "latest") -> str:
        return f"{self.host}/{repo}:{tag}"
