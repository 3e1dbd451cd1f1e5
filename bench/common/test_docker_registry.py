"""The local registry rig (docker_registry.py) that bench/images and
bench/registry push to and pull from: it answers, names refs on its port,
notices its own death and leaves no process behind. Needs `docker-registry`
(scripts/setup.sh installs it).

Run: .venv/bin/python -m pytest bench/common/test_docker_registry.py
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import docker_registry as dr  # noqa: E402
import forkvm_bench as fb  # noqa: E402


def test_registry_answers_and_is_gone_after_exit(tmp_path):
    assert shutil.which("docker-registry"), "docker-registry is missing: run scripts/setup.sh"
    with dr.DockerRegistry(tmp_path / "reg") as reg:
        with urllib.request.urlopen(f"http://{reg.host}/v2/", timeout=10) as r:
            assert r.status == 200
        assert reg.ref("a/b") == f"127.0.0.1:{reg.port}/a/b:latest"
        assert reg.ref("a", "s1").endswith("/a:s1")
        pid = reg.proc.pid
        reg.check()
        # As if it had crashed. Wait for the exit status: a killed Go program's
        # leader is a zombie before its other threads are gone, and only then
        # can its parent collect it.
        reg.proc.kill()
        reg.proc.wait(timeout=30)
        with pytest.raises(fb.BenchError, match=f"docker-registry \\(pid {pid}\\) exited"):
            reg.check()
    assert not os.path.exists(f"/proc/{pid}")
    assert "delete:\n    enabled: false" in (tmp_path / "reg" / "config.yml").read_text()
