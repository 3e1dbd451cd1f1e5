"""Long calls with the official MCP TypeScript SDK (``sdk_checks.mjs``):
progress keeps a host that resets its timeout on progress waiting past
its 60 s default, and an aborted call's command is killed in the guest."""

from __future__ import annotations

import json
import subprocess

import pytest

from test_conformance import HERE, NODE, _node


@pytest.fixture(scope="module")
def sandbox(daemon):
    with daemon.http() as http:
        r = http.post("/v1/sandboxes", json={"image": "default"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            yield sid
        finally:
            http.delete(f"/v1/sandboxes/{sid}")


def _check(*args: str, env=None, timeout=300) -> dict:
    _node()
    out = subprocess.run(
        [str(NODE), str(HERE / "sdk_checks.mjs"), *args],
        capture_output=True, text=True, timeout=timeout, cwd=HERE, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_progress_keeps_a_resetting_host_waiting_past_60_s(daemon, sandbox):
    r = _check("progress", f"{daemon.url}/mcp", daemon.token, sandbox, "65")
    assert not r["is_error"], r
    assert r["stdout"] == "slept\n", r
    assert r["elapsed_s"] > 60, r
    # One every 5 s.
    assert r["progress"] >= 10, r


def test_a_cancelled_call_kills_its_command_in_the_guest(daemon, sandbox):
    r = _check("cancel", str(daemon.binary), sandbox, env=daemon.env())
    assert r["aborted"] and "gave up" in r["aborted"], r
    assert r["before"], f"the command never ran: {r}"
    assert r["left"] == "", f"still running in the guest: {r}"
