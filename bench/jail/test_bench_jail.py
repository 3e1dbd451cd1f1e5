"""Unit tests of the jail benchmark's pure logic and report, on made-up rows:
no daemon, no VM.

Run: .venv/bin/python -m pytest bench/jail
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_jail as bj  # noqa: E402


def test_segment_order_is_abba():
    assert bj.segment_order(1) == ["jailed", "unjailed"]
    assert bj.segment_order(2) == ["jailed", "unjailed", "unjailed", "jailed"]
    order = bj.segment_order(3)
    assert order.count("jailed") == order.count("unjailed") == 3


def rows_fixture():
    rows = []
    for i, (j, u) in enumerate([(110, 100), (120, 100), (130, 100)]):
        rows.append({"case": "spawn", "side": "jailed", "run": i, "total_ms": j,
                     "server_total_ms": j - 10})
        rows.append({"case": "spawn", "side": "unjailed", "run": i, "total_ms": u,
                     "server_total_ms": u - 10})
    rows += [{"case": "naive_restore", "side": "naive", "run": i, "total_ms": 400.0}
             for i in range(3)]
    rows += [{"case": "memory", "side": s, "run": 0, "pss_kib": k}
             for s, k in (("jailed", 2048), ("unjailed", 1024))]
    return rows


def test_jail_ratios():
    by = {(r["case"], r["metric"]): r for r in bj.jail_ratios(rows_fixture())}
    # cases with no rows at all are left out
    assert set(by) == {("spawn", "total_ms"), ("spawn", "server_total_ms"), ("memory", "pss_kib")}
    s = by[("spawn", "total_ms")]
    assert s["jailed"]["p50"] == 120 and s["unjailed"]["p50"] == 100
    assert s["ratio_p50"] == pytest.approx(1.2)
    assert s["ratio_p90"] == pytest.approx(128 / 100)
    assert s["jailed_vs_naive"] == pytest.approx(120 / 400)
    assert s["unjailed_vs_naive"] == pytest.approx(100 / 400)
    assert by[("spawn", "server_total_ms")]["ratio_p50"] == pytest.approx(110 / 90)
    m = by[("memory", "pss_kib")]
    assert m["ratio_p50"] == pytest.approx(2.0)
    assert math.isnan(m["jailed_vs_naive"])  # no naive memory rows


def test_values_skips_missing():
    rows = [{"case": "cold", "side": "jailed", "total_ms": None},
            {"case": "cold", "side": "jailed", "total_ms": 5.0},
            {"case": "cold", "side": "unjailed", "total_ms": 7.0}]
    assert bj.values(rows, "cold", "jailed", "total_ms") == [5.0]


def test_report_files(tmp_path):
    rows = rows_fixture()
    for r in rows:
        r.setdefault("segment", 0)
        r["other_cpu_cores"] = 0.5 if r["case"] == "memory" else 0.0
    ratios = bj.jail_ratios(rows)
    ctx = {"info": {"version": "9.9.9", "accel": {"kind": "tcg", "reason": "test"},
                    "qemu": {"version": "10.0.2", "path": "/usr/bin/qemu"}},
           "machine": {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2,
                       "mem_gib": 3.5, "kernel": "6.1.0-test", "loadavg": (0.5, 0.25, 0.125)},
           "order": bj.segment_order(2), "revision": "abc123", "others": {},
           "busy_segments": 0, "started": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
           "elapsed": 12.0}
    a = SimpleNamespace(smoke=True, runs=3, cold_runs=2, mem_runs=1, memory=512, settle=1.0,
                        idle=3.0)
    bj.write_results(tmp_path / "RESULTS.md", rows, ratios, ctx, a)
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.startswith("# Jail benchmark") and "SMOKE RUN" in text
    assert "**1.200×**" in text and "**2.000×**" in text
    assert "Accelerator: **tcg**" in text and "10.0.2" in text
    assert "**Shared host:**" in text  # the memory rows were noisy
    bj.plot(ratios, tmp_path / "jail.png")
    assert (tmp_path / "jail.png").stat().st_size > 1000
    bj.rp.write_csv(tmp_path / "jail.csv", rows, bj.FIELDS)
    with open(tmp_path / "jail.csv") as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(rows) and got[0]["side"] == "jailed"


def test_previous_run_is_compared(tmp_path):
    rows = rows_fixture()
    bj.rp.write_csv(tmp_path / "jail.csv", rows, bj.FIELDS)
    (tmp_path / "RESULTS.md").write_text("# x\n\n- Date: 2026-01-01\n- forkvm: 0.1.0, git abc\n")
    prev = bj.read_previous(tmp_path / "jail.csv", tmp_path / "RESULTS.md")
    assert prev["head"] == ["- Date: 2026-01-01", "- forkvm: 0.1.0, git abc"]
    # This run: the jailed spawn twice as slow as before, unjailed the same.
    now = [dict(r, total_ms=r["total_ms"] * 2) if r.get("side") == "jailed"
           and r.get("total_ms") else r for r in rows]
    text = "\n".join(bj.previous_lines(prev, bj.jail_ratios(now)))
    assert "- Previous run's date: 2026-01-01" in text
    line = next(x for x in text.splitlines() if x.startswith("| clone spawn, client wall"))
    assert "**2.000×**" in line and "| 1.200× | 2.400× |" in line
    assert bj.read_previous(tmp_path / "none.csv", tmp_path / "RESULTS.md") is None
    assert bj.previous_lines(None, []) == []
