"""Unit tests of bench/timetravel's own logic (no VM): what a kept
checkpoint should store, the trend of the pauses, the children's files, and
RESULTS.md from made-up rows."""

import datetime as dt
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "timetravel"))

import timetravel_report as tr  # noqa: E402
import timetravel_tree as tt  # noqa: E402

ARGS = SimpleNamespace(steps=50, files=10000, hold_mib=256, region_mib=16, step_files=10,
                       keep_last=5, keep_every=10, snapshot_at=[10], naive_runs=1, runs=1,
                       memory=512, children=2, changed=100, diff_runs=1)


def test_written_counts_distinct_slots_and_files_between_kept_checkpoints():
    kept = [{"step": 40}, {"step": 10}, {"step": 49}, {"step": 50}]
    w = tr.written(kept, ARGS)
    assert [c["since"] for c in w] == [0, 10, 40, 49]
    # Before the first: all it holds; 30 steps cover all 16 slots once.
    assert w[0]["written_mib"] == 256 + 10 * 10 * 64 / 1024
    assert w[1]["written_mib"] == 256 + 30 * 10 * 64 / 1024
    assert w[2]["written_mib"] == 9 * 16 + 9 * 10 * 64 / 1024
    assert w[3]["written_mib"] == 16 + 10 * 64 / 1024


def test_slope_of_a_flat_and_a_growing_series():
    assert tr.slope([1, 2, 3, 4], [3.0, 3.0, 3.0, 3.0]) == 0
    assert abs(tr.slope([1, 2, 3, 4], [1.0, 3.0, 5.0, 7.0]) - 2.0) < 1e-12
    assert tr.slope([1], [1.0]) != tr.slope([1], [1.0])  # NaN


def test_children_change_disjoint_files_spread_over_the_directories():
    a, b = tt.child_files(0, 100), tt.child_files(1, 100)
    assert len(set(a)) == len(set(b)) == 100 and not set(a) & set(b)
    assert len({p.split("/")[0] for p in a}) == tt.DIRS
    assert a[0] == "d000/f00000.txt" and b[0] == "d000/f00001.txt"


def test_results_md_from_rows(tmp_path):
    steps = [{"step": n, "checkpoint": f"sn-{n}", "pause_ms": 3.0 + (n == 1) * 20,
              "bytes": (300 if n == 1 else 17) << 20, "kept": n in (10, 50),
              "memory_diff_bytes": 16 << 20, "disk_bytes": n << 19,
              "dir_bytes": 17 << 20, "checkpoint_ms": 500.0, "work_ms": 900.0,
              "step_ms": 1400.0} for n in range(1, 51)]
    ops = ([{"op": "snapshot", "step": 10, "wall_ms": 900.0, "engine_ms": 210.0,
             "bytes": 300 << 20},
            {"op": "naive_save", "step": 50, "wall_ms": 800.0, "engine_ms": 700.0}]
           + [{"op": op, "run": 1, "wall_ms": w, "engine_ms": w - 5, "detail": '{"restore_ms": 80.0}'}
              for op, w in (("rewind", 400.0), ("spawn", 300.0), ("diff", 900.0),
                            ("git_status", 600.0), ("merge", 1000.0), ("git_apply", 500.0))])
    kept = [{"id": "sn-10", "step": 10, "bytes": 300 << 20, "head": False, "sizes": {},
             "dir_bytes": 300 << 20},
            {"id": "sn-50", "step": 50, "bytes": 17 << 20, "head": True, "sizes": {},
             "dir_bytes": 17 << 20}]
    info = {"version": "0", "accel": {"kind": "tcg"}, "qemu": {"version": "10"}}
    machine = {"cpu_model": "cpu", "cpu_detail": "x", "cores": 2, "mem_gib": 1.0,
               "kernel": "6", "loadavg": (0.0, 0.0, 0.0)}
    ctx = {"info": info, "machine": machine, "started": dt.datetime.now().astimezone(),
           "elapsed": 60.0, "others": {}, "build": "release", "kept": kept,
           "timeline": {"bytes": 317 << 20}, "rewind_target": kept[0],
           "tree": {"count": 10000, "git": "git version 2"}}
    L = tr.write_results(tmp_path / "RESULTS.md", steps, ops, ctx, ARGS)
    text = "\n".join(L)
    assert "SMOKE" not in text
    assert "checkpoint pause ÷ full snapshot pause **0.014×**" in text
    assert "last 10 ÷ first 10 pause p50 1.00×" in text
    # Step 1's outlier does not drag the trend (it would drag least squares).
    assert "**+0.000 ms per step**, so **+0.00 ms over the loop, +0 % of the p50 pause**" in text
    assert "target (pause under 5 ms p50 with 256 MiB changed, flat): **met**" in text
    assert "the disk layer 1.0 → 25.0 MiB (slope +0.50 MiB per step)" in text
    assert "| 1 | 900 | 600 | 1.50× |" in text
    assert "spawn ÷ rewind **0.75×**" in text and "restore_ms 80.0" in text
    assert "diff ÷ git status **1.50×**" in text and "git diff + apply **2.00×**" in text
    tr.plot(steps, ops, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_a_rising_pause_is_not_flat():
    xs = list(range(1, 51))
    assert tr.theil_sen(xs, [3.0 + 0.1 * x for x in xs]) == pytest.approx(0.1)
    # A few host hiccups do not make a trend.
    noisy = [3.0 + (40.0 if x in (7, 30, 50) else 0.0) for x in xs]
    assert tr.theil_sen(xs, noisy) == 0.0
    assert tr.slope(xs, noisy) > 0.03  # least squares leans up on them
