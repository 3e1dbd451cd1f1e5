"""The tools over both transports: `forkvm mcp` on stdio and the daemon's
/mcp over streamable HTTP, with the official MCP Python SDK."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError

from conftest import TOOLS, run

INVALID_PARAMS = -32602


def text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def test_lists_every_tool_with_a_schema(connect):
    async def body():
        async with connect() as c:
            tools = (await c.list_tools()).tools
        by_name = {t.name: t for t in tools}
        assert set(by_name) == TOOLS
        for t in tools:
            assert t.description and len(t.description) > 30, t.name
            assert t.input_schema["type"] == "object", t.name
            assert t.output_schema and t.output_schema["type"] == "object", t.name
        props = by_name["run_command"].input_schema["properties"]
        assert {"sandbox_id", "command", "argv", "timeout_secs"} <= set(props)
        assert by_name["run_command"].input_schema["required"] == ["sandbox_id"]
        assert set(by_name["run_python"].input_schema["required"]) == {"sandbox_id", "code"}

    run(body)


def test_run_python_and_commands(connect, sandbox):
    async def body():
        async with connect() as c:
            r = await c.call_tool("run_python", {"sandbox_id": sandbox, "code": "import sys\nprint(6 * 7)\nprint('e', file=sys.stderr)"})
            assert not r.is_error, text(r)
            s = r.structured_content
            assert s["exit_code"] == 0 and s["stdout"] == "42\n" and s["stderr"] == "e\n"
            assert "exit code 0" in text(r) and "42" in text(r)

            r = await c.call_tool("run_command", {"sandbox_id": sandbox, "command": "echo out; exit 3"})
            assert not r.is_error, "a non-zero exit is a result, not an error"
            assert r.structured_content["exit_code"] == 3
            assert r.structured_content["stdout"] == "out\n"

            r = await c.call_tool("run_command", {"sandbox_id": sandbox, "argv": ["uname", "-s"]})
            assert r.structured_content["stdout"].strip() == "Linux"

            r = await c.call_tool("run_python", {"sandbox_id": sandbox, "code": "raise ValueError('boom')"})
            assert not r.is_error
            assert r.structured_content["exit_code"] == 1
            assert "ValueError: boom" in r.structured_content["stderr"]

    run(body)


def test_write_read_and_list_files(connect, sandbox, request):
    where = request.node.callspec.id

    async def body():
        async with connect() as c:
            path = f"/root/mcp-{where}/hello.txt"
            r = await c.call_tool("write_file", {"sandbox_id": sandbox, "path": path, "content": "hi from mcp\n"})
            assert not r.is_error, text(r)
            assert r.structured_content == {"path": path, "size": 12}

            r = await c.call_tool("read_file", {"sandbox_id": sandbox, "path": path})
            assert not r.is_error, text(r)
            assert r.structured_content["content"] == "hi from mcp\n"
            assert r.structured_content["encoding"] == "text"
            assert text(r) == "hi from mcp\n"

            # Binary in and out as base64.
            r = await c.call_tool("write_file", {"sandbox_id": sandbox, "path": f"/root/mcp-{where}/b.bin", "content": "AP8A", "encoding": "base64", "mode": "600"})
            assert not r.is_error, text(r)
            r = await c.call_tool("read_file", {"sandbox_id": sandbox, "path": f"/root/mcp-{where}/b.bin"})
            assert r.structured_content["encoding"] == "base64"
            assert r.structured_content["content"] == "AP8A"

            r = await c.call_tool("list_files", {"sandbox_id": sandbox, "path": f"/root/mcp-{where}"})
            assert not r.is_error, text(r)
            entries = {e["name"]: e for e in r.structured_content["entries"]}
            assert set(entries) == {"hello.txt", "b.bin"}
            assert entries["hello.txt"]["kind"] == "file" and entries["hello.txt"]["size"] == 12

            r = await c.call_tool("read_file", {"sandbox_id": sandbox, "path": f"/root/mcp-{where}/missing"})
            assert r.is_error
            assert "read_file failed" in text(r) and "What to do" in text(r)

    run(body)


@pytest.mark.parametrize(
    "tool,args,words",
    [
        ("no_such_tool", {}, "unknown tool"),
        ("run_command", {"command": "ls"}, "sandbox_id"),
        ("run_command", {"sandbox_id": "x"}, "give `command`"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "argv": ["ls"]}, "not both"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "bogus": 1}, "unknown field"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "timeout_secs": -1}, "timeout_secs"),
        ("run_python", {"sandbox_id": "x", "code": 5}, "code"),
        ("read_file", {"sandbox_id": "x", "path": "relative.txt"}, "not absolute"),
        ("write_file", {"sandbox_id": "x", "path": "/a", "content": "!!", "encoding": "base64"}, "base64"),
        ("write_file", {"sandbox_id": "x", "path": "/a", "content": "", "mode": "999"}, "octal"),
        ("list_files", {"sandbox_id": "x", "path": "/", "depth": 0}, "depth"),
        ("branch_sandbox", {"sandbox_id": "x", "count": 100}, "count"),
        ("create_sandbox", {"image": "default", "snapshot": "s"}, "not both"),
        ("remove_sandbox", {"sandbox_id": ""}, "sandbox_id is empty"),
    ],
)
def test_bad_arguments_are_mcp_errors(connect, tool, args, words):
    async def body():
        async with connect() as c:
            with pytest.raises(MCPError) as e:
                await c.call_tool(tool, args)
            assert e.value.code == INVALID_PARAMS, e.value.message
            assert words in e.value.message, e.value.message
            # The server is still there.
            assert len((await c.list_tools()).tools) == len(TOOLS)

    run(body)


def test_unknown_sandbox_is_a_tool_error_saying_what_to_do(connect):
    async def body():
        async with connect() as c:
            r = await c.call_tool("run_command", {"sandbox_id": "sb-doesnotexist", "command": "true"})
            assert r.is_error
            assert "list_sandboxes" in text(r), text(r)
            r = await c.call_tool("create_sandbox", {"image": "no-such-image"})
            assert r.is_error
            assert "no-such-image" in text(r), text(r)

    run(body)
