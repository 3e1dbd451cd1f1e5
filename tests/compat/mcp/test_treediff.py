"""Diff and merge through MCP, over both transports: a sandbox branched into
two children (branch_sandbox) that each edit a small project; diff lists the
first child's changes (patches only when asked), merge applies them to the
source, a second child that conflicts is refused with nothing changed and
with what to do, a dry run lists the conflict, and strategy "text" merges
both edits. Each run has a sandbox of its own, made and removed through MCP."""

from __future__ import annotations

from conftest import run

PROJ = "/root/proj"


def text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(c, tool: str, args: dict) -> dict:
    r = await c.call_tool(tool, args)
    assert not r.is_error, text(r)
    return r.structured_content


async def sh(c, sid: str, command: str) -> str:
    s = await call(c, "run_command", {"sandbox_id": sid, "command": command})
    assert s["exit_code"] == 0, s
    return s["stdout"]


def test_diff_and_merge_round_trip(connect):
    async def body():
        async with connect() as c:
            sid = (await call(c, "create_sandbox", {"image": "default"}))["id"]
            made = [sid]
            try:
                await sh(c, sid, f"mkdir -p {PROJ} && printf 'one\\ntwo\\nthree\\n' > {PROJ}/a.txt && echo bye > {PROJ}/b.txt")
                branch = await call(c, "branch_sandbox", {"sandbox_id": sid, "count": 2})
                winner, other = branch["children"]
                made += branch["children"]
                await sh(c, winner, f"cd {PROJ} && sed -i s/one/ONE/ a.txt && rm b.txt && echo hi > new.txt")
                await sh(c, other, f"sed -i s/three/THREE/ {PROJ}/a.txt")

                r = await c.call_tool("diff", {"a": sid, "b": winner, "path": PROJ})
                assert not r.is_error, text(r)
                d = r.structured_content
                assert (d["total"], d["added"], d["deleted"], d["modified"]) == (3, 1, 1, 1), d
                assert [(x["path"], x["change"]) for x in d["changes"]] == [
                    (f"{PROJ}/a.txt", "modified"),
                    (f"{PROJ}/b.txt", "deleted"),
                    (f"{PROJ}/new.txt", "added"),
                ]
                assert all("patch" not in x for x in d["changes"]) and "@@" not in text(r)
                assert f"C {PROJ}/a.txt" in text(r) and f"D {PROJ}/b.txt" in text(r), text(r)
                d = await call(c, "diff", {"a": sid, "b": winner, "path": PROJ, "patches": True, "limit": 1})
                assert d["changes"][0]["path"] == f"{PROJ}/a.txt" and "+ONE" in d["changes"][0]["patch"]
                assert d["not_listed"] == 2 and d["not_listed_by_dir"] == [{"dir": PROJ, "changes": 2}]

                m = await call(c, "merge", {"sandbox_id": winner, "into": sid, "path": PROJ})
                assert m["applied"] == 3 and not m["dry_run"] and m["base"] == branch["snapshot_id"], m
                assert (await call(c, "diff", {"a": sid, "b": winner, "path": PROJ}))["total"] == 0

                # The other edited a.txt too: refused, nothing changed, and it says what to do.
                before = await sh(c, sid, f"cat {PROJ}/a.txt")
                r = await c.call_tool("merge", {"sandbox_id": other, "into": sid, "path": PROJ})
                assert r.is_error and "nothing was changed" in text(r) and f"{PROJ}/a.txt" in text(r), text(r)
                assert "dry_run" in text(r) and "strategy" in text(r), text(r)
                assert await sh(c, sid, f"cat {PROJ}/a.txt") == before
                plan = await call(c, "merge", {"sandbox_id": other, "into": sid, "path": PROJ, "dry_run": True})
                assert [x["path"] for x in plan["conflicts"]] == [f"{PROJ}/a.txt"], plan
                assert await sh(c, sid, f"cat {PROJ}/a.txt") == before
                m = await call(c, "merge", {"sandbox_id": other, "into": sid, "path": PROJ, "strategy": "text"})
                assert [x["path"] for x in m["settled"]] == [f"{PROJ}/a.txt"], m
                assert await sh(c, sid, f"cat {PROJ}/a.txt") == "ONE\ntwo\nTHREE\n"

                # Bad input: a tool error, or an invalid-params error, saying what to do.
                r = await c.call_tool("diff", {"a": sid, "b": "sb-nosuch"})
                assert r.is_error and "not_found" in text(r) and "What to do" in text(r), text(r)
            finally:
                for s in reversed(made):
                    await c.call_tool("remove_sandbox", {"sandbox_id": s})
                await call(c, "list_sandboxes", {})

    run(body)
