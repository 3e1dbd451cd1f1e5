"""The protocol around the tools, as raw HTTP and raw stdio: Origin and Host
(DNS rebinding), the bearer scheme, OAuth discovery, JSON-RPC faults and
batches, and a dropped HTTP call's command killed in the guest."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from conftest import TOOLS

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}


def post(daemon, body, *, headers=None, token=None, raw=False):
    h = dict(HEADERS, Authorization=f"Bearer {token or daemon.token}")
    h.update(headers or {})
    content = body if raw else json.dumps(body)
    return httpx.post(f"{daemon.url}/mcp", content=content, headers=h, timeout=60)


def answer(r):
    """The JSON-RPC message of a JSON or event-stream answer."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [l[5:].strip() for l in r.text.splitlines() if l.startswith("data:") and l[5:].strip()]
        return json.loads(data[-1])
    return r.json()


def test_the_bearer_scheme_is_case_insensitive(daemon):
    for scheme in ("bearer", "BEARER", "Bearer"):
        r = post(daemon, INIT, headers={"Authorization": f"{scheme} {daemon.token}"})
        assert r.status_code == 200, (scheme, r.status_code, r.text)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "https://evil.example:7070"},
        {"Host": "evil.example"},
        {"Host": "evil.example", "Origin": "http://evil.example"},
    ],
)
def test_a_foreign_origin_or_host_is_forbidden_even_with_the_token(daemon, headers):
    r = post(daemon, INIT, headers=headers)
    assert r.status_code == 403, r.text
    # And before the body is looked at.
    r = post(daemon, "not json", headers=headers, raw=True)
    assert r.status_code == 403, r.text


def test_loopback_origins_are_taken(daemon):
    port = urlparse(daemon.url).port
    for origin in (f"http://127.0.0.1:{port}", "http://localhost:6274", "http://[::1]:3000"):
        r = post(daemon, INIT, headers={"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
    r = post(daemon, INIT, headers={"Host": f"localhost:{port}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "path",
    [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-authorization-server/mcp",
        "/mcp/.well-known/oauth-protected-resource",
        "/mcp/.well-known/oauth-authorization-server",
    ],
)
def test_oauth_discovery_is_a_plain_404(daemon, path):
    """Without the token, as a client probes them: forkvm's 404, not an E2B
    message and not a 401."""
    r = httpx.get(f"{daemon.url}{path}", timeout=30)
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["error"]["code"] == "not_found", body
    assert "Bearer" in body["error"]["message"], body


@pytest.mark.parametrize(
    "body,code",
    [
        ("this is not json", -32700),
        ('{"jsonrpc": "2.0", "id": 1, "method": "ping"', -32700),
        ("{}", -32600),
        ("42", -32600),
        ('{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600),
        ('{"id": 1, "method": "ping"}', -32600),
    ],
)
def test_what_is_not_json_rpc_gets_a_json_rpc_error_and_400(daemon, body, code):
    r = post(daemon, body, raw=True)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == code, r.text


@pytest.mark.parametrize(
    "params",
    [{}, {"name": 5}, {"name": "list_sandboxes", "arguments": [1]}, {"name": "list_sandboxes", "arguments": "x"}],
)
def test_a_tools_call_without_a_name_or_object_arguments_is_invalid_params(daemon, params):
    r = post(
        daemon,
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params},
        headers={"MCP-Protocol-Version": "2025-11-25"},
    )
    m = answer(r)
    assert m["id"] == 7 and m["error"]["code"] == -32602, r.text


def test_batches_under_2025_03_26_and_not_after(daemon):
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {}},
    ]
    r = post(daemon, batch, headers={"MCP-Protocol-Version": "2025-03-26"})
    assert r.status_code == 200, r.text
    got = {m["id"]: m for m in r.json()}
    assert set(got) == {1, 2, 3}, r.text
    assert got[1]["result"] == {}
    assert len(got[2]["result"]["tools"]) == len(TOOLS)
    assert got[3]["error"]["code"] == -32602
    r = post(daemon, batch, headers={"MCP-Protocol-Version": "2025-11-25"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == -32600


def test_stdio_answers_garbage_lines_with_a_parse_error(daemon):
    p = subprocess.Popen(
        [str(daemon.binary), "mcp"], env=daemon.env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        p.stdin.write("this is not json\n")
        p.stdin.write('{"jsonrpc": "2.0", "id": 5}\n')
        p.stdin.write(json.dumps(INIT) + "\n")
        p.stdin.write('{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"arguments": {}}}\n')
        p.stdin.flush()
        lines = [json.loads(p.stdout.readline()) for _ in range(4)]
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    by_id = {}
    for m in lines:
        by_id.setdefault(json.dumps(m.get("id")), []).append(m)
    assert [m["error"]["code"] for m in by_id["null"]] == [-32700], lines
    assert by_id["5"][0]["error"]["code"] == -32600, lines
    assert by_id["1"][0]["result"]["serverInfo"]["name"] == "forkvm", lines
    assert by_id["2"][0]["error"]["code"] == -32602, lines
    assert p.returncode == 0


def test_a_dropped_http_call_kills_its_command_in_the_guest(daemon, sandbox):
    """A stateless endpoint ties a call to its connection: a client that
    goes away (as one does when it aborts) stops the command."""
    call = {
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"sandbox_id": sandbox, "command": "sleep 317; echo never"}},
    }
    h = dict(HEADERS, Authorization=f"Bearer {daemon.token}", **{"MCP-Protocol-Version": "2025-11-25"})

    scan = 'n=31; n="${n}7"; for d in /proc/[0-9]*; do grep -qF sleep "$d/cmdline" 2>/dev/null && grep -qF "$n" "$d/cmdline" 2>/dev/null && echo "${d#/proc/}"; done; true'

    def running() -> str:
        with daemon.http() as http:
            r = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"argv": ["sh", "-c", scan]})
            assert r.status_code == 200, r.text
            return r.json()["stdout"].strip()

    # While the call runs, its command is there (the control)...
    seen = []
    probe = threading.Timer(3, lambda: seen.append(running()))
    probe.start()
    # ...then the client gives up after 6 s (no answer comes before the
    # command ends) and closes its connection.
    with httpx.Client(timeout=httpx.Timeout(60, read=6)) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post(f"{daemon.url}/mcp", content=json.dumps(call), headers=h)
    probe.join()
    assert seen and seen[0], f"the command never ran: {seen}"
    left = "?"
    for _ in range(10):
        left = running()
        if not left:
            break
        time.sleep(1)
    assert left == "", f"still running in the guest: {left}"
