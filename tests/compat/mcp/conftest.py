"""Fixtures of the MCP suite: clients over both transports, and one booted
sandbox the tests share (a boot under TCG takes seconds; a test that needs a
sandbox of its own creates and removes it through MCP).

The sandbox is made and removed over plain REST, so a failure of the MCP
side shows in the tests, not in their set-up.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Iterator

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {
    "create_sandbox",
    "run_command",
    "run_python",
    "read_file",
    "write_file",
    "list_files",
    "branch_sandbox",
    "snapshot_sandbox",
    "list_sandboxes",
    "remove_sandbox",
    "checkpoint",
    "timeline",
    "rewind",
    "diff",
    "merge",
}


def run(fn, *args):
    """Run an async test body (the suite needs no async pytest plugin)."""
    return anyio.run(fn, *args)


@asynccontextmanager
async def stdio_client(daemon) -> AsyncIterator[Client]:
    """`forkvm mcp` as a subprocess, reaching the daemon by FORKVM_URL."""
    params = StdioServerParameters(command=str(daemon.binary), args=["mcp"], env=daemon.env())
    async with Client(params, read_timeout_seconds=300) as c:
        yield c


@asynccontextmanager
async def http_client(daemon, token: str | None = None) -> AsyncIterator[Client]:
    """The daemon's /mcp over TCP, with the bearer token."""
    headers = {"Authorization": f"Bearer {token or daemon.token}"}
    transport = streamable_http_client(
        f"{daemon.url}/mcp", http_client=create_mcp_http_client(headers=headers)
    )
    async with Client(transport, read_timeout_seconds=300) as c:
        yield c


@pytest.fixture(params=["stdio", "http"])
def connect(request, daemon):
    """A client factory for each transport: tests run once over each."""
    if request.param == "stdio":
        return lambda: stdio_client(daemon)
    return lambda: http_client(daemon)


@pytest.fixture(scope="session")
def sandbox(daemon) -> Iterator[str]:
    """One running sandbox of image `default` for the whole suite."""
    with daemon.http() as http:
        r = http.post("/v1/sandboxes", json={"image": "default"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            yield sid
        finally:
            http.delete(f"/v1/sandboxes/{sid}")
