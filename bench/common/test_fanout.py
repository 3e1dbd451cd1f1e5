"""Unit tests of the fan-out benchmark's pure parts (bench/fanout): parsing
/proc/<pid>/stat, spreading the daemon's CPU over the children, the targets'
verdicts and the report, on made-up rows: no daemon, no VM.

Run: .venv/bin/python -m pytest bench/common/test_fanout.py
"""

from __future__ import annotations

import datetime as dt
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "fanout"))

import bench_fanout as bf  # noqa: E402
import fanout_report as fr  # noqa: E402

MACHINE = {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2, "mem_gib": 3.5,
           "kernel": "6.1.0-test", "loadavg": (0.5, 0.25, 0.125)}
INFO = {"version": "9.9.9", "accel": {"kind": "tcg", "reason": "no /dev/kvm"},
        "qemu": {"version": "10.0.2", "path": "/usr/bin/qemu-system-x86_64"}}


def test_parse_proc_stat_counts_fields_after_the_last_parenthesis():
    # comm "qemu (x) y" holds spaces and parentheses
    text = ("1234 (qemu (x) y) S 77 1234 1234 0 -1 4194560 100 0 0 0 "
            "250 50 7 3 20 0 5 0 1000 0 0")
    s = bf.parse_proc_stat(text)
    assert s == {"ppid": 77, "utime": 250, "stime": 50, "cutime": 7, "cstime": 3}


def test_proc_cpu_of_this_process_and_of_a_missing_one():
    c = bf.proc_cpu(os.getpid())
    assert c["own_ms"] >= 0 and c["reaped_ms"] >= 0 and c["ppid"] == os.getppid()
    assert bf.proc_cpu(2**22 + 12345) is None


def test_cpu_shares_spreads_daemon_and_helpers_equally():
    kids = [{"qemu_cpu_ms": 400.0}, {"qemu_cpu_ms": 600.0}, {"qemu_cpu_ms": math.nan},
            {"qemu_cpu_ms": 500.0}]
    s = bf.cpu_shares(kids, daemon_own_ms=80.0, helper_ms=120.0)
    assert s["daemon_cpu_per_child_ms"] == 20 and s["helper_cpu_per_child_ms"] == 30
    assert s["qemu_cpu_ms"] == 1500 and s["qemu_cpu_per_child_ms"] == 500
    assert kids[0]["cpu_total_ms"] == 450 and kids[0]["daemon_cpu_ms"] == 20
    assert "cpu_total_ms" not in kids[2]  # no QEMU figure: no total
    assert math.isnan(bf.cpu_shares([], 1.0, 1.0)["daemon_cpu_per_child_ms"])


def runs_fixture(count=100):
    rows = []
    for i, (b, s) in enumerate([(2500, 4000), (2900, 5000), (3500, 6000)], start=1):
        rows.append({"case": "branch_diff", "run": i, "ok": True, "total_ms": float(b),
                     "call_ms": b - 500.0, "pause_ms": 40.0, "snapshot_ms": 300.0,
                     "spawn_ms": b - 900.0, "exec_phase_ms": 500.0, "first_answer_ms": b - 450.0,
                     "other_cpu_cores": 0.1 * i})
        rows.append({"case": "spawn_count", "run": i, "ok": True, "total_ms": float(s),
                     "call_ms": s - 500.0, "exec_phase_ms": 500.0, "other_cpu_cores": 0.5})
    rows.append({"case": "branch_diff", "run": 4, "ok": False, "total_ms": 10.0,
                 "error": "POST /v1/sandboxes/x/branch -> HTTP 503 [capacity_exceeded] full"})
    rows.append({"case": "naive", "run": 1, "ok": True, "total_ms": 58000.0, "workers": 2,
                 "other_cpu_cores": 0.2})
    return rows


def children_fixture():
    kids = []
    for case in ("branch_diff", "spawn_count"):
        for i in range(1, 5):
            kids.append({"case": case, "run": 1, "child": i, "answered_ms": 2000.0 + i * 100,
                         "exec_ms": 50.0, "prepare_ms": 10.0, "qemu_start_ms": 80.0,
                         "network_ms": 30.0, "restore_ms": 60.0, "identity_ms": 1500.0,
                         "network_ready_ms": 1700.0, "server_total_ms": 1900.0,
                         "qemu_cpu_ms": 400.0 + i, "daemon_cpu_ms": 19.0, "helper_cpu_ms": 31.0,
                         "cpu_total_ms": 450.0 + i})
    for i in range(1, 5):
        kids.append({"case": "naive", "run": 1, "child": i, "answered_ms": 1000.0 * i,
                     "total_ms": 900.0, "qemu_start_ms": 60.0, "load_ms": 700.0, "cont_ms": 1.0,
                     "agent_ms": 120.0, "disk_copy_ms": 5.0, "netns_ms": 20.0,
                     "qemu_cpu_ms": 800.0, "daemon_cpu_ms": 30.0, "cpu_total_ms": 830.0})
    return kids


def test_key_figures_ratios_and_verdicts():
    kf = fr.key_figures(runs_fixture(), ["diff"], 100)
    assert kf["naive"]["p50"] == 58000
    b = kf["cases"]["branch_diff"]
    assert b["wall"]["p50"] == 2900 and b["wall"]["n"] == 3 and b["failed"] == 1
    assert math.isclose(b["speedup"], 20.0) and b["speed_met"] is True and b["wall_met"] is True
    s = kf["cases"]["spawn_count"]
    assert s["wall_met"] is False and s["speed_met"] is True
    # another count than 100: the wall target is not assessed
    assert fr.key_figures(runs_fixture(), ["diff"], 20)["cases"]["branch_diff"]["wall_met"] is None
    # no naive batch: no ratio, no speed verdict
    no_naive = [r for r in runs_fixture() if r["case"] != "naive"]
    k2 = fr.key_figures(no_naive, ["diff"], 100)["cases"]["branch_diff"]
    assert math.isnan(k2["speedup"]) and k2["speed_met"] is None
    assert fr.verdict(True) == "**met**" and fr.verdict(False) == "**missed**"


def test_results_and_plots_from_made_up_rows(tmp_path):
    args = SimpleNamespace(modes=["diff"], count=100, runs=3, smoke=False, memory=512,
                           settle=5.0, rest=2.0, naive_runs=1)
    ctx = {"info": {**INFO, "capacity": {"memory_commit_mib": 21000}}, "machine": MACHINE,
           "revision": "abc123", "elapsed": 600.0, "command": "bash bench/fanout/run.sh --runs 3",
           "started": dt.datetime(2026, 11, 26, 6, 0, tzinfo=dt.timezone.utc),
           "source_snapshot": "tpl", "source_restore_ms": 50.0, "source_network": "nat",
           "naive_workers": 2, "others": {}, "busy_runs": 0, "leaked": "none",
           "memory_commit_mib": 21000}
    runs, kids = runs_fixture(), children_fixture()
    fr.write_results(tmp_path / "RESULTS.md", runs, kids, ctx, args)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "Reduced run" in text and "SMOKE" not in text
    assert "| branch_diff | 2,900 ms | 3,380 ms | **20.00×** | **met** | **met** | 1 |" in text
    assert "HTTP 503 [capacity_exceeded] full" in text  # the failure's text, exactly
    assert "| branch_diff | CPU: QEMU | 4 |" in text
    assert "**branch_diff**: 452 ms of CPU per child" in text
    fr.write_plots(tmp_path, runs, kids, ["diff"], "t")
    assert (tmp_path / "fanout.png").stat().st_size > 0 and (tmp_path / "cpu.png").stat().st_size > 0
    smoke = SimpleNamespace(**{**vars(args), "smoke": True, "runs": 2, "count": 20})
    fr.write_results(tmp_path / "s.md", runs, kids, ctx, smoke)
    assert (tmp_path / "s.md").read_text().startswith(
        "# Fan-out benchmark") and "SMOKE RUN" in (tmp_path / "s.md").read_text()


def test_cores_busy_is_cpu_over_wall():
    assert fr.cores_busy({"qemu_cpu_ms": 150.0, "daemon_cpu_ms": 30.0, "helper_cpu_ms": 20.0,
                          "total_ms": 100.0}) == 2.0
    assert fr.cores_busy({"qemu_cpu_ms": 50.0, "daemon_cpu_ms": 50.0, "helper_cpu_ms": None,
                          "total_ms": 100.0}) == 1.0
    assert math.isnan(fr.cores_busy({"total_ms": 100.0}))
