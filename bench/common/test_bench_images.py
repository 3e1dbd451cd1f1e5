"""Unit tests of the images bench's parsing and report (bench/images/
bench_images.py), on made-up CLI output and rows: no daemon, no registry.

Run: .venv/bin/python -m pytest bench/common/test_bench_images.py
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "images"))

import bench_images as bi  # noqa: E402

MiB = 1 << 20
MACHINE = {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2, "mem_gib": 3.5,
           "kernel": "6.1.0-test", "loadavg": (0.5, 0.25, 0.125)}
INFO = {"version": "9.9.9", "accel": {"kind": "tcg", "reason": "no /dev/kvm"},
        "qemu": {"version": "10.0.2", "path": "/usr/bin/qemu-system-x86_64"}}
PULL = """[   0.0s] resolving
[   0.1s] fetching
[   0.1s]   sha256:aaaa: cached
  bbbbbbbbbbbb: 90.0 MiB / 90.0 MiB (100%)
[   1.5s] unpacking
         layer 1/10: 6946 files, 1131 dirs, 657 links, 0 whiteouts, 164015302 bytes
[   9.0s] mkfs
[  10.2s] installing
"""


def test_phase_stages_split_the_wall_time_at_the_phase_lines():
    st = bi.phase_stages(PULL, 10_300.0)
    assert st == {"copy_ms": 1500.0, "unpack_ms": 7500.0, "mkfs_ms": 1200.0,
                  "install_ms": 100.0}
    # A mark rounded (0.1 s) past the measured end is clamped to it.
    assert bi.phase_stages(PULL, 10_180.0)["install_ms"] == 0


def test_phase_stages_give_nothing_for_missing_or_disordered_phases(capsys):
    assert bi.phase_stages("[   1.0s] unpacking\n[   2.0s] installing\n", 3000.0) == {}
    swapped = "[   2.0s] unpacking\n[   1.0s] mkfs\n[   3.0s] installing\n"
    assert bi.phase_stages(swapped, 4000.0) == {}
    assert bi.phase_stages("garbage\n[x] mkfs\n", 1.0) == {}
    assert "no stages for this row" in capsys.readouterr().out


def test_cached_items_count_the_cached_lines_only():
    assert bi.cached_items(PULL) == 1
    assert bi.cached_items("") == 0


def rows():
    out = []
    for run in (1, 2, 3):
        k = 1000.0 * run
        out += [
            {"case": "import", "run": run, "total_ms": 20_000 + k, "copy_ms": 2000.0,
             "unpack_ms": 14_000 + k, "mkfs_ms": 3900.0, "install_ms": 100.0},
            {"case": "first_exec", "run": run, "total_ms": 4000 + k},
            {"case": "pull_a", "run": run, "total_ms": 22_000 + k, "copy_ms": 4000.0,
             "unpack_ms": 14_000 + k, "mkfs_ms": 3900.0, "install_ms": 100.0,
             "bytes_fetched": 900 * MiB, "layers_cached": 0},
            {"case": "pull_b", "run": run, "total_ms": 19_000 + k, "copy_ms": 1000.0,
             "unpack_ms": 14_000 + k, "mkfs_ms": 3900.0, "install_ms": 100.0,
             "bytes_fetched": 91 * MiB, "layers_cached": 9},
        ]
        for case in ("naive_import", "naive_pull_a", "naive_pull_b"):
            out.append({"case": case, "run": run, "total_ms": 25_000 + k, "copy_ms": 3000.0,
                        "unpack_ms": 17_000 + k, "mkfs_ms": 5000.0,
                        "bytes_fetched": 900 * MiB})
    return out


IMG = {"layers": 10, "rootfs_mib": 162.0, "a_bytes": 900 * MiB, "b_bytes": 900 * MiB,
       "b_shared": 810 * MiB, "tar_bytes": 1000 * MiB}


def test_summary_table_sets_each_figure_against_its_baseline():
    t = bi.summary_table(rows())
    imp = next(line for line in t if line.startswith("| import:"))
    # p50 22.0 s against 27.0 s by hand.
    assert "| **22.0** |" in imp and "| 27.0 |" in imp and "**0.81×**" in imp
    first = next(line for line in t if line.startswith("| first_exec:"))
    assert first.count("| – |") >= 3
    pull_b = next(line for line in t if line.startswith("| pull_b:"))
    assert pull_b.endswith("| 91 | 900 |")
    assert t[-1].startswith("| import + first exec | 28.0 |")


def test_results_and_plot_are_written(tmp_path):
    ctx = {"info": INFO, "machine": MACHINE, "elapsed": 600.0, "profile": "debug",
           "started": dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), "tools": "t",
           "others": {}, "busy": 0, "command": "bash bench/images/run.sh --runs 3"}
    args = SimpleNamespace(runs=3, layer_mib=90, binary="/x/debug/forkvm")
    bi.write_results(tmp_path / "RESULTS.md", rows(), IMG, ctx, args)
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.startswith("# Images benchmark")
    assert "- Accelerator: **tcg**" in text and "10.0.2" in text
    assert "pull B fetched 91 MiB, 10% of pull A's 900 MiB" in text
    assert "is a debug build" in text
    assert "| naive_pull_b | mkfs | 3 |" in text
    bi.plot(rows(), IMG, tmp_path / "images.png")
    assert (tmp_path / "images.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    smoke = SimpleNamespace(runs=1, layer_mib=4, binary="/x/release/forkvm")
    bi.write_results(tmp_path / "s.md", rows(), IMG, dict(ctx, profile="release"), smoke)
    assert (tmp_path / "s.md").read_text().startswith("> **SMOKE RUN** (1 runs < 3)")


def test_a_missing_tool_fails_naming_it(monkeypatch):
    real = shutil.which
    monkeypatch.setattr(bi.shutil, "which",
                        lambda t: None if t == "docker-registry" else real(t) or "/x")
    with pytest.raises(bi.fb.BenchError, match="missing tool.*docker-registry.*apt-get install"):
        bi.check_tools()
