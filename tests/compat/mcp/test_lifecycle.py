"""Sandbox lifecycle through MCP: create, list, branch, snapshot, remove;
and the bearer token on /mcp."""

from __future__ import annotations

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import TOOLS, http_client, run, stdio_client

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/list",
    "params": {},
}


def text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_create_run_and_remove_over_stdio(daemon):
    async def body():
        async with stdio_client(daemon) as c:
            r = await c.call_tool("create_sandbox", {"image": "default"})
            assert not r.is_error, text(r)
            sid = r.structured_content["id"]
            assert r.structured_content["state"] == "running"
            assert r.structured_content["image"] == "default"
            try:
                r = await c.call_tool("list_sandboxes", {})
                assert sid in [s["id"] for s in r.structured_content["sandboxes"]]
                r = await c.call_tool("run_python", {"sandbox_id": sid, "code": "print('fresh')"})
                assert r.structured_content["stdout"] == "fresh\n"
            finally:
                r = await c.call_tool("remove_sandbox", {"sandbox_id": sid})
            assert not r.is_error, text(r)
            assert r.structured_content == {"removed": sid}
            r = await c.call_tool("list_sandboxes", {})
            assert sid not in [s["id"] for s in r.structured_content["sandboxes"]]
            r = await c.call_tool("remove_sandbox", {"sandbox_id": sid})
            assert r.is_error and "list_sandboxes" in text(r)

    run(body)


def test_branch_into_two_children_that_see_the_parents_file(daemon, sandbox):
    async def body():
        async with http_client(daemon) as c:
            r = await c.call_tool("write_file", {"sandbox_id": sandbox, "path": "/root/branch-me.txt", "content": "parent state"})
            assert not r.is_error, text(r)
            r = await c.call_tool("branch_sandbox", {"sandbox_id": sandbox, "count": 2})
            assert not r.is_error, text(r)
            children = r.structured_content["children"]
            assert len(children) == 2 and sandbox not in children
            assert r.structured_content["snapshot_id"]
            try:
                for i, child in enumerate(children):
                    r = await c.call_tool("read_file", {"sandbox_id": child, "path": "/root/branch-me.txt"})
                    assert not r.is_error, text(r)
                    assert r.structured_content["content"] == "parent state"
                    # Children diverge: each writes its own, the parent keeps its.
                    await c.call_tool("write_file", {"sandbox_id": child, "path": "/root/branch-me.txt", "content": f"child {i}"})
                r = await c.call_tool("read_file", {"sandbox_id": sandbox, "path": "/root/branch-me.txt"})
                assert r.structured_content["content"] == "parent state"
            finally:
                for child in children:
                    r = await c.call_tool("remove_sandbox", {"sandbox_id": child})
                    assert not r.is_error, text(r)

    run(body)


def test_snapshot_then_create_from_it(daemon, sandbox):
    async def body():
        async with stdio_client(daemon) as c:
            await c.call_tool("write_file", {"sandbox_id": sandbox, "path": "/root/snap.txt", "content": "in the snapshot"})
            r = await c.call_tool("snapshot_sandbox", {"sandbox_id": sandbox})
            assert not r.is_error, text(r)
            snap = r.structured_content["snapshot_id"]
            assert r.structured_content["source"] == sandbox
            r = await c.call_tool("create_sandbox", {"snapshot": snap})
            assert not r.is_error, text(r)
            sid = r.structured_content["id"]
            try:
                r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "/root/snap.txt"})
                assert r.structured_content["content"] == "in the snapshot"
            finally:
                await c.call_tool("remove_sandbox", {"sandbox_id": sid})

    run(body)


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token", "Basic abc"])
def test_http_without_the_token_is_401(daemon, auth):
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    r = httpx.post(f"{daemon.url}/mcp", json=INIT, headers=headers, timeout=30)
    assert r.status_code == 401, r.text
    assert "token" in r.json()["error"]["message"]
    assert r.headers["www-authenticate"].startswith("Bearer"), r.headers


def test_the_sdk_with_a_wrong_token_fails_cleanly(daemon):
    async def body():
        async with http_client(daemon, token="wrong") as c:
            await c.list_tools()

    with pytest.raises(BaseException) as e:
        run(body)
    # The SDK raises the failed request inside its task groups: find it.
    errors, seen = [e.value], []
    while errors:
        x = errors.pop()
        seen.append(x)
        errors.extend(getattr(x, "exceptions", ()))
    assert any(isinstance(x, MCPError) for x in seen), repr(e.value)


def test_unix_socket_serves_mcp_without_a_token(daemon, sandbox):
    async def body():
        http = httpx2.AsyncClient(
            transport=httpx2.AsyncHTTPTransport(uds=str(daemon.socket)), timeout=300
        )
        async with Client(streamable_http_client("http://localhost/mcp", http_client=http)) as c:
            assert len((await c.list_tools()).tools) == len(TOOLS)
            r = await c.call_tool("run_command", {"sandbox_id": sandbox, "command": "echo via-socket"})
            assert r.structured_content["stdout"] == "via-socket\n"
        await http.aclose()

    run(body)


@pytest.mark.parametrize(
    "env,words",
    [
        ({"FORKVM_URL": "http://127.0.0.1:9"}, "forkvm serve"),
        ({"FORKVM_TOKEN": "wrong"}, "FORKVM_TOKEN"),
    ],
)
def test_stdio_without_a_usable_daemon_says_so_in_each_call(daemon, env, words):
    """`forkvm mcp` keeps serving when the daemon is unreachable or refuses
    its token: each call is a tool error that says what to do."""

    async def body():
        e = dict(daemon.env(), **env)
        if "FORKVM_TOKEN" in env:
            e["FORKVM_URL"] = daemon.url
        params = StdioServerParameters(command=str(daemon.binary), args=["mcp"], env=e)
        async with Client(params, read_timeout_seconds=60) as c:
            assert len((await c.list_tools()).tools) == len(TOOLS)
            r = await c.call_tool("list_sandboxes", {})
            assert r.is_error
            assert words in text(r), text(r)

    run(body)
