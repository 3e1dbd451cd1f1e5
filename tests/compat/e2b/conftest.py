"""Fixtures for the E2B suite: the unmodified ``e2b`` SDK pointed at a forkvm
daemon by the three variables a user sets (docs/e2b.md).

* ``e2b_env`` builds the E2B-shaped image ``base`` (examples/e2b-base, what
  the SDK asks for when no template is named) in the session daemon unless
  its home already links one (scripts/test-compat.sh builds it once per run
  for both E2B suites), then sets
  ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` to the daemon's TCP listener and
  ``E2B_API_KEY`` to its token.
* ``sandbox`` is one sandbox shared by the tests that only run commands and
  files in it (a boot costs seconds under TCG).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def e2b_env(daemon):
    if not (daemon.home / "images" / "base").exists():
        _build_base(daemon)
    os.environ["E2B_API_URL"] = daemon.url
    os.environ["E2B_SANDBOX_URL"] = daemon.url
    os.environ["E2B_API_KEY"] = daemon.token
    for var in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        os.environ.pop(var, None)
    return daemon


def _build_base(daemon) -> None:
    build = subprocess.run(
        [str(daemon.binary), "image", "build", "-t", "base", str(REPO / "examples" / "e2b-base")],
        env=daemon.env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if build.returncode != 0:
        pytest.fail(
            f"building the E2B base image failed ({build.returncode}):\n"
            f"{build.stdout[-3000:]}\n{build.stderr[-3000:]}\n{daemon.log()}"
        )


@pytest.fixture(scope="session")
def sandbox(e2b_env) -> Iterator[object]:
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=1800)
    try:
        yield sbx
    finally:
        sbx.kill()
