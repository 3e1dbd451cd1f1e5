"""The blocking modules are generated from the asyncio ones
(``sdk/python/scripts/unasync.py``): they must be exactly what the generator
writes today, and the rewrite itself must do what its docstring says."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "unasync.py"


def _unasync():
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_modules_are_current():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_rewrite():
    src = (
        "import asyncio  # async-only\n"
        "# sync-only: import time\n"
        "class AsyncThing:\n"
        '    """Use ``async with AsyncClient() as c: await c.go()``; see AsyncSandbox."""\n'
        "    async def __aenter__(self) -> 'AsyncThing':\n"
        "        await asyncio.sleep(1)\n"
        "        async with self.lock:\n"
        "            async for x in self.items():\n"
        "                await self._http.aclose()\n"
        "        return self\n"
        "    def awaiting(self):  # a name that merely starts with await\n"
        "        return self.AsyncClientish\n"
    )
    out = _unasync().unasync(src)
    assert "import asyncio" not in out and "import time\n" in out
    assert "``with Client() as c: c.go()``; see Sandbox." in out
    assert "def __enter__(self) -> 'AsyncThing':" in out  # only listed names change
    assert "        time.sleep(1)\n" in out
    assert "        with self.lock:\n            for x in self.items():\n" in out
    assert "                self._http.close()\n" in out
    assert "def awaiting(self):" in out and "self.AsyncClientish" in out
    compile(out, "<generated>", "exec")
