"""Unit tests of forkvm_bench.py's helpers that need no VM.

Run: .venv/bin/python -m pytest bench/common/test_forkvm_bench.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402


def test_warn_other_qemus_warns_once_per_process_and_says_if_any_runs(monkeypatch, capsys):
    found: dict[int, str] = {}
    asked = []

    def fake(exclude_substrings=()):
        asked.append(exclude_substrings)
        return dict(found)

    monkeypatch.setattr(fb, "other_qemu_processes", fake)
    seen: dict[int, str] = {}
    assert fb.warn_other_qemus(seen, exclude_substrings=("/home",)) is False
    assert capsys.readouterr().out == "" and asked == [("/home",)]
    found[7] = "qemu-system-x86_64 -name other"
    assert fb.warn_other_qemus(seen) is True
    out = capsys.readouterr().out
    assert "QEMU processes not started by this bench" in out and "7: qemu-system" in out
    assert seen == {7: "qemu-system-x86_64 -name other"}
    # still running: counted, but not warned about again
    assert fb.warn_other_qemus(seen) is True and capsys.readouterr().out == ""
    found.clear()
    assert fb.warn_other_qemus(seen) is False and 7 in seen
