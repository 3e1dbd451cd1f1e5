"""The tools over both transports: `forkvm mcp` on stdio and the daemon's
/mcp over streamable HTTP, with the official MCP Python SDK."""

from __future__ import annotations

import json

import anyio
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
        ("run_command", {"command": "ls"}, "sandbox_id"),
        ("run_command", {"sandbox_id": "x"}, "give `command`"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "argv": ["ls"]}, "not both"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "bogus": 1}, "unknown field"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "timeout_secs": -1}, "timeout_secs"),
        ("run_python", {"sandbox_id": "x", "code": 5}, "code"),
        ("read_file", {"sandbox_id": "x", "path": "relative.txt"}, "not absolute"),
        ("run_command", {"sandbox_id": "x", "command": "ls", "cwd": "tmp"}, "not absolute"),
        ("write_file", {"sandbox_id": "x", "path": "/a", "content": "!!", "encoding": "base64"}, "base64"),
        ("write_file", {"sandbox_id": "x", "path": "/a", "content": "", "mode": "999"}, "octal"),
        ("list_files", {"sandbox_id": "x", "path": "/", "depth": 0}, "depth"),
        ("branch_sandbox", {"sandbox_id": "x", "count": 100}, "count"),
        ("create_sandbox", {"image": "default", "snapshot": "s"}, "not both"),
        ("create_sandbox", {"memory_mib": "lots"}, "memory_mib"),
        ("remove_sandbox", {"sandbox_id": ""}, "sandbox_id is empty"),
    ],
)
def test_bad_arguments_are_tool_errors_the_model_can_correct(connect, tool, args, words):
    """Missing, mistyped, unknown and out-of-range arguments and relative
    paths are tool results with isError (MCP 2025-11-25: input validation
    errors are tool execution errors), naming what to fix."""

    async def body():
        async with connect() as c:
            r = await c.call_tool(tool, args)
            assert r.is_error, text(r)
            assert words in text(r), text(r)
            assert r.structured_content is None
            assert len((await c.list_tools()).tools) == len(TOOLS)

    run(body)


def test_an_unknown_tool_is_a_protocol_error(connect):
    async def body():
        async with connect() as c:
            with pytest.raises(MCPError) as e:
                await c.call_tool("no_such_tool", {})
            assert e.value.code == INVALID_PARAMS, e.value.message
            assert "unknown tool" in e.value.message and "run_python" in e.value.message

    run(body)


def test_schemas_use_standard_words_only(connect):
    """No `format: uint32` and the like (TypeScript hosts warn about them),
    and optional properties are plain, not `[X, "null"]`."""

    async def body():
        async with connect() as c:
            tools = (await c.list_tools()).tools
        for t in tools:
            for schema in (t.input_schema, t.output_schema):
                s = json.dumps(schema)
                for word in ("uint32", "uint64", "int32", "int64", '"null"'):
                    assert word not in s, f"{t.name}: {word} in {s}"
        by_name = {t.name: t for t in tools}
        assert by_name["create_sandbox"].input_schema["properties"]["memory_mib"]["type"] == "integer"
        assert by_name["run_command"].input_schema["properties"]["cwd"]["type"] == "string"

    run(body)


def test_console_and_files_are_resources(connect, sandbox):
    async def body():
        async with connect() as c:
            listed = (await c.list_resources()).resources
            uris = {str(r.uri) for r in listed}
            console = f"forkvm://sandboxes/{sandbox}/console"
            assert console in uris, uris
            templates = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
            assert templates == {
                "forkvm://sandboxes/{sandbox_id}/console",
                "forkvm://sandboxes/{sandbox_id}/files/{+path}",
            }
            # A clone's console starts empty (its boot was the template's):
            # put a line on it from the guest.
            r = await c.call_tool("run_command", {"sandbox_id": sandbox, "command": "echo forkvm-console-mark > /dev/console"})
            assert not r.is_error and r.structured_content["exit_code"] == 0, text(r)
            r = await c.read_resource(console)
            assert "forkvm-console-mark" in r.contents[0].text, r.contents[0].text[-300:]
            assert r.contents[0].mime_type == "text/plain"
            r = await c.call_tool("write_file", {"sandbox_id": sandbox, "path": "/root/res.txt", "content": "as a resource\n"})
            assert not r.is_error, text(r)
            r = await c.read_resource(f"forkvm://sandboxes/{sandbox}/files/root/res.txt")
            assert r.contents[0].text == "as a resource\n"
            assert r.contents[0].mime_type == "text/plain"
            await c.call_tool("write_file", {"sandbox_id": sandbox, "path": "/root/res.bin", "content": "AP8A", "encoding": "base64"})
            r = await c.read_resource(f"forkvm://sandboxes/{sandbox}/files/root/res.bin")
            assert r.contents[0].blob == "AP8A"
            with pytest.raises(MCPError) as e:
                await c.read_resource(f"forkvm://sandboxes/{sandbox}/files/root/missing")
            assert "missing" in e.value.message
            with pytest.raises(MCPError) as e:
                await c.read_resource("forkvm://sandboxes/sb-nope/console")
            # -32002 until 2025-11-25; protocol 2026-07-28 (this SDK's) says -32602.
            assert e.value.code == (-32602 if c.protocol_version >= "2026" else -32002), e.value
            assert "sb-nope" in e.value.message

    run(body)


def test_progress_reaches_a_client_that_asks_for_it(connect, sandbox):
    async def body():
        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, message))

        async with connect() as c:
            r = await c.call_tool(
                "run_command",
                {"sandbox_id": sandbox, "command": "sleep 12; echo done"},
                progress_callback=on_progress,
            )
        assert not r.is_error, text(r)
        assert r.structured_content["stdout"] == "done\n"
        assert len(seen) >= 2, seen
        assert [p for p, _ in seen] == sorted(p for p, _ in seen)
        assert "run_command still running" in seen[0][1]

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


def test_a_cancelled_call_kills_its_command_in_the_guest(connect, sandbox, request):
    """The SDK abandons the call (a cancel scope): on stdio it sends
    notifications/cancelled, on HTTP it drops the call's stream; either way
    the command is killed in the guest."""
    n = {"stdio": 331, "http": 337}[request.node.callspec.id]
    # The number is put together in the guest, so the scan does not find itself.
    scan = (
        f'n={n // 10}; n="${{n}}{n % 10}"; for d in /proc/[0-9]*; do grep -qF sleep "$d/cmdline" 2>/dev/null '
        '&& grep -qF "$n" "$d/cmdline" 2>/dev/null && echo "${d#/proc/}"; done; true'
    )

    async def body():
        async with connect() as c:
            seen = []

            async def probe():
                await anyio.sleep(2.5)
                async with connect() as c2:
                    r = await c2.call_tool("run_command", {"sandbox_id": sandbox, "command": scan})
                    seen.append(r.structured_content["stdout"].strip())

            async with anyio.create_task_group() as tg:
                tg.start_soon(probe)
                with anyio.move_on_after(6):
                    await c.call_tool("run_command", {"sandbox_id": sandbox, "command": f"sleep {n}; echo never"})
            assert seen and seen[0], f"the command never ran: {seen}"
            left = "?"
            for _ in range(10):
                r = await c.call_tool("run_command", {"sandbox_id": sandbox, "command": scan})
                left = r.structured_content["stdout"].strip()
                if not left:
                    break
                await anyio.sleep(1)
            assert left == "", f"still running in the guest: {left}"

    run(body)
