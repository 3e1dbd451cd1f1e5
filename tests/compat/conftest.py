"""The daemon the compatibility suites drive, shared by the E2B and MCP suites.

These suites run in ``.venv-compat``, which holds the unmodified client SDKs
(``e2b``, ``mcp``) pinned in ``tests/compat/requirements.txt`` and not the
forkvm SDK, so the daemon is started and cleaned up over plain HTTP here.

The session starts one daemon of its own with the one test launcher,
``$FORKVM_BIN serve --ephemeral`` (default binary
``<repo>/target/debug/forkvm``; tests/launch/forkvm_launch.py and
docs/testing.md): a temporary home linking the guest and each image of
``$FORKVM_IMAGES_HOME`` (default ``/var/lib/forkvm``; scripts/test-compat.sh
points it at a directory that also holds the ``base`` image it built once for
the run), its unix socket, and TCP on a free loopback port behind a random
token. At the end, or if pytest is killed, the daemon removes every sandbox
and its home.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "launch"))
import forkvm_launch  # noqa: E402


@dataclass
class Daemon:
    """A running ``forkvm serve --ephemeral`` of this session."""

    binary: Path
    launched: forkvm_launch.Launched

    @property
    def home(self) -> Path:
        return self.launched.home

    @property
    def token(self) -> str:
        return self.launched.token

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the TCP listener (REST, E2B, /mcp)."""
        return self.launched.url

    @property
    def process(self):
        return self.launched.process

    @property
    def socket(self) -> Path:
        return self.launched.socket

    def http(self) -> httpx.Client:
        """A client of the REST API over TCP, with the token."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=300
        )

    def env(self) -> dict:
        """Environment for a ``forkvm`` subprocess that should use this daemon."""
        return dict(os.environ, FORKVM_URL=f"unix://{self.socket}", FORKVM_HOME=str(self.home))

    def log(self) -> str:
        return self.launched.log(6000)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    binary = Path(os.environ.get("FORKVM_BIN", REPO / "target" / "debug" / "forkvm"))
    if not binary.exists():
        pytest.exit(f"no forkvm binary at {binary}: run cargo build or set FORKVM_BIN", returncode=2)
    images_home = Path(os.environ.get("FORKVM_IMAGES_HOME", "/var/lib/forkvm"))
    try:
        launched = forkvm_launch.launch(binary, artifacts=images_home)
    except forkvm_launch.LaunchError as e:
        pytest.exit(str(e), returncode=2)
    d = Daemon(binary=binary, launched=launched)
    try:
        yield d
    finally:
        problem = launched.stop()
        if problem:
            print(f"compat: {problem}")
