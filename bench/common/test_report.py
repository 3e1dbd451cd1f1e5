"""Unit tests of the benches' shared report tail (pure logic: no daemon, no
VM). Run by `make test`: `.venv/bin/python -m pytest bench/common`."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import report  # noqa: E402

INFO = {"version": "0.1.0", "accel": {"kind": "tcg", "reason": "no vmx/svm"},
        "qemu": {"version": "QEMU emulator version 10.0.2", "path": "qemu-system-x86_64"}}
MACHINE = {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2, "mem_gib": 23.5,
           "kernel": "6.1.0", "loadavg": (0.5, 0.25, 0.125)}
STARTED = dt.datetime(2026, 11, 25, 3, 0, 0, tzinfo=dt.timezone.utc)


def test_environment_lines_name_machine_accelerator_and_qemu():
    lines = report.environment_lines(STARTED, 75, INFO, MACHINE, revision="abc123",
                                     qemu_note="; note")
    text = "\n".join(lines)
    assert lines[0] == "- Date: 2026-11-25 03:00:00 UTC (run took 75 s)"
    assert "git abc123" in text
    assert "Test CPU (family 6), 2 cores, 23.5 GiB RAM, no swap; Linux 6.1.0" in text
    assert "0.50 / 0.25 / 0.12" in text
    assert "**tcg** — no vmx/svm" in text
    assert lines[-1] == "- QEMU: QEMU emulator version 10.0.2 (qemu-system-x86_64); note"
    # Long runs are given in minutes; swap is named when there is some.
    long = report.environment_lines(STARTED, 1116, INFO, MACHINE, revision="x", swap_kib=2 << 20)
    assert "(run took 18.6 min)" in long[0]
    assert "2048 MiB swap" in long[2]


def test_smoke_banner_only_for_smoke_runs():
    assert report.smoke_banner(False, "N=2", "bash bench/x/run.sh") == []
    banner = report.smoke_banner(True, "N=2 < 10", "bash bench/x/run.sh")
    assert banner[0].startswith("> **SMOKE RUN** (N=2 < 10)") and banner[-1] == ""


def test_save_figure_writes_a_png(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    out = tmp_path / "x.png"
    report.save_figure(fig, out, "a title", dpi=50)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.get_fignums(), "the figure was not closed"


def test_write_markdown_ends_with_one_newline(tmp_path):
    p = tmp_path / "R.md"
    report.write_markdown(p, ["# t", "", "x", ""])
    assert p.read_text() == "# t\n\nx\n"


@pytest.fixture
def keep_signals():
    import signal
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("outcome, code", [(0, 0), (3, 3), ("bench", 1), ("interrupt", 130)])
def test_run_main_exit_codes(outcome, code, capsys, keep_signals):
    def main():
        if outcome == "bench":
            raise fb.BenchError("no daemon")
        if outcome == "interrupt":
            raise KeyboardInterrupt()
        return outcome
    with pytest.raises(SystemExit) as e:
        report.run_main("bench_x", main)
    assert e.value.code == code
    if outcome == "bench":
        assert "bench_x: error: no daemon" in capsys.readouterr().err


@pytest.mark.parametrize("bench", ["boot", "spawn", "branch", "load", "network", "chain"])
def test_every_bench_imports(bench):
    # A refactor of the shared tail must not leave a harness that fails to load.
    path = HERE.parent / bench / f"bench_{bench}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{bench}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.main)


def test_the_boot_loop_module_imports():
    sys.path.insert(0, str(HERE.parent / "boot"))
    spec = importlib.util.spec_from_file_location("boot_loop", HERE.parent / "boot" / "boot_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.run) and "error" in mod.FIELDS
