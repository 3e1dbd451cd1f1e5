"""Time travel through MCP, over both transports: checkpoint (with a tag and
a retention policy), timeline, rewind with an undo point and the undo, and a
rewind to a checkpoint that does not exist. Each run has a sandbox of its
own, made and removed through MCP (a rewind must not disturb the shared one)."""

from __future__ import annotations

import secrets

from conftest import run


def text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(c, tool: str, args: dict) -> dict:
    r = await c.call_tool(tool, args)
    assert not r.is_error, text(r)
    return r.structured_content


async def state(c, sid: str) -> str:
    """Its disk (a file under /root) and its memory (a file in tmpfs, RAM only)."""
    s = await call(c, "run_command", {"sandbox_id": sid, "command": "cat /root/notes.txt /dev/shm/counter; ls /root"})
    assert s["exit_code"] == 0, s
    return s["stdout"]


def test_checkpoint_timeline_and_rewind_round_trip(connect):
    async def body():
        async with connect() as c:
            sid = (await call(c, "create_sandbox", {"image": "default"}))["id"]
            try:
                await call(c, "run_command", {"sandbox_id": sid, "command": "echo draft-1 > /root/notes.txt && echo 1 > /dev/shm/counter"})
                then = await state(c, sid)
                tag = f"mcp-{secrets.token_hex(4)}"
                r = await c.call_tool("checkpoint", {"sandbox_id": sid, "tag": tag, "keep_last": 2})
                assert not r.is_error, text(r)
                cp = r.structured_content["checkpoint"]
                assert (cp["seq"], cp["tag"]) == (1, tag) and cp["checkpoint_id"].startswith("sn-")
                assert f'rewind {{"to": "{tag}"}}' in text(r)

                await call(c, "run_command", {"sandbox_id": sid, "command": "echo draft-2 > /root/notes.txt && touch /root/oops && echo 2 > /dev/shm/counter"})
                now = await state(c, sid)
                assert now != then

                r = await c.call_tool("rewind", {"sandbox_id": sid, "to": tag, "checkpoint_first": True})
                assert not r.is_error, text(r)
                back = r.structured_content
                assert back["to"] == cp["checkpoint_id"] and back["sandbox"]["id"] == sid
                assert back["sandbox"]["state"] == "running" and back["undo"]
                assert f'rewind {{"to": "{back["undo"]}"}} undoes this' in text(r)
                assert await state(c, sid) == then

                t = await call(c, "timeline", {"sandbox_id": sid})
                assert [x["checkpoint_id"] for x in t["checkpoints"]] == [cp["checkpoint_id"], back["undo"]]
                assert t["keep_last"] == 2 and "keep_every" not in t

                await call(c, "rewind", {"sandbox_id": sid, "to": back["undo"]})
                assert await state(c, sid) == now

                # A checkpoint that does not exist: a tool error saying what to do.
                r = await c.call_tool("rewind", {"sandbox_id": sid, "to": "sn-nosuch"})
                assert r.is_error and "not_found" in text(r) and "What to do" in text(r), text(r)
                r = await c.call_tool("checkpoint", {"sandbox_id": sid, "keep_last": 0})
                assert r.is_error and "at least 1" in text(r), text(r)
                assert await state(c, sid) == now
            finally:
                await call(c, "remove_sandbox", {"sandbox_id": sid})

    run(body)
