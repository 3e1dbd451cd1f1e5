"""Unit tests of the volumes benchmark's pure parts (bench/volumes): the
rows made of fsbench.py's JSON, the statistics, the ratios, the verdicts
against the issue's targets and the report; plus one real run of
fsbench.py on the host in a temp dir (small: a second or two). No daemon,
no VM.

Run: .venv/bin/python -m pytest bench/common/test_volumes.py
"""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "volumes"))

import bench_volumes as bv  # noqa: E402

MACHINE = {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2, "mem_gib": 3.5,
           "kernel": "6.1.0-test", "loadavg": (0.5, 0.25, 0.125)}
INFO = {"version": "9.9.9", "accel": {"kind": "tcg", "reason": "no /dev/kvm"},
        "qemu": {"version": "10.0.2", "path": "/usr/bin/qemu-system-x86_64"}}


def result(read_ms, write_ms, op_us):
    """fsbench.py's JSON (ns) with the given parallel times and one value
    for every single op."""
    return {"parallel": {"read": [int(v * 1e6) for v in read_ms],
                         "write": [int(v * 1e6) for v in write_ms]},
            "ops": {op: [int(v * 1e3) for v in op_us] for op in bv.OPS},
            "floor_ns": [100, 300]}


def rows3(vol_read=(40.0, 60.0), vol_write=(150.0,)):
    return (bv.rows_from_result("host", 1, result([10.0, 10.0], [100.0], [1.0, 3.0]))
            + bv.rows_from_result("guest_root", 1, result([20.0], [120.0], [10.0]))
            + bv.rows_from_result("guest_volume", 1, result(vol_read, vol_write, [50.0])))


def args(**kw):
    a = dict(repeats=5, rounds=1, iters=1000, memory=1024, cpus=2, workers=256, files=1024,
             size=4096)
    a.update(kw)
    return SimpleNamespace(**a)


def ctx(**kw):
    c = {"started": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), "elapsed": 100.0,
         "info": INFO, "machine": MACHINE, "revision": "abc123",
         "guest": {"python": "3.11.2", "host_python": "3.11.7"}, "noise": {"host": [0.1]},
         "others": {}, "others_busy": 0, "runs": 3}
    c.update(kw)
    return c


def test_rows_are_microseconds_one_per_sample():
    rows = bv.rows_from_result("host", 2, result([1.5, 2.5], [3.0], [4.0]))
    read = [r for r in rows if r["workload"] == "parallel_read"]
    assert [(r["sample"], r["value_us"], r["round"]) for r in read] == [(0, 1500.0, 2),
                                                                       (1, 2500.0, 2)]
    assert {r["workload"] for r in rows} == set(bv.WORKLOADS)
    assert bv.rows_from_result("host", 1, {"parallel": {"read": [], "write": []},
                                           "ops": {}}) == []


def test_aggregate_and_ratios():
    st = bv.aggregate(rows3())
    assert st["parallel_read"]["host"]["p50"] == 10_000
    assert st["parallel_read"]["guest_volume"]["p50"] == 50_000
    assert st["getattr"]["host"]["p50"] == 2.0
    r = bv.ratios(st, "parallel_read")
    assert (r["vol_host"], r["vol_root"], r["root_host"]) == (5.0, 2.5, 2.0)
    assert math.isnan(bv.ratios(st, "nothing")["vol_host"])
    assert bv.throughput(1024, 512_000) == 2000


def test_verdicts_meet_at_the_goal_and_split_the_reason():
    v = {x["workload"]: x for x in bv.verdicts(bv.aggregate(rows3()))}
    assert v["parallel_read"]["status"] == "met"  # 5.0 <= 5.0
    assert v["parallel_write"]["status"] == "met"  # 1.5 <= 1.5
    v = {x["workload"]: x for x in bv.verdicts(bv.aggregate(rows3((80.0,), (400.0,))))}
    # read: 8× host, root 2× host, volume 4× root (within 5×): the guest is to blame.
    assert v["parallel_read"]["status"] == "missed"
    assert "the miss comes from running the workload in the guest" in v["parallel_read"]["reason"]
    # write: 4× host, root 1.2× host (within), volume 3.33× root: the volume is.
    assert v["parallel_write"]["status"] == "missed"
    assert "the volume path is what misses it" in v["parallel_write"]["reason"]


def test_verdicts_without_a_volume_say_not_measured():
    rows = [r for r in rows3() if r["target"] != "guest_volume"]
    st = bv.aggregate(rows)
    assert [x["status"] for x in bv.verdicts(st)] == ["not measured", "not measured"]
    assert bv.fcvm_comparison(st)["ahead"] is None
    assert bv.fcvm_comparison(bv.aggregate(rows3()))["ahead"] is True  # 5.0 < 7.7


def test_report_has_the_header_the_targets_and_fcvm():
    st = bv.aggregate(rows3())
    text = "\n".join(bv.result_lines(st, ctx(volume_spec="/h:/mnt/v"), args()))
    assert text.startswith("# Volumes benchmark")
    assert "- Accelerator: **tcg** — no /dev/kvm" in text and "10.0.2" in text
    assert "git abc123" in text and "`--volume /h:/mnt/v`" in text
    assert "| parallel_read | ≤ 5.0× | **5.00×** | 2.00× | 2.50× | **met** |" in text
    assert "**ahead** (5.00×)" in text
    assert "| getattr | 2.0 | 2.8 | 10.0 | 10.0 | 50.0 | 50.0 | **25.00×** | 5.00× | 1.05× |" \
        in text
    assert "SMOKE" not in text
    assert "takes p50 **0.05 ms**, against 10 µs for the same lookup" in text
    assert "- Timing floor (the same timed loop around an empty op, p50): host directory " \
        "0.20 µs, guest root disk 0.20 µs, guest volume 0.20 µs;" in text


def test_report_of_a_short_run_without_volumes_says_so():
    st = bv.aggregate([r for r in rows3() if r["target"] != "guest_volume"])
    c = ctx(volume="no --volume flag", noise={"host": [0.9]})
    text = "\n".join(bv.result_lines(st, c, args(repeats=1, iters=50)))
    assert text.startswith("> **SMOKE RUN** (1 parallel repeats < 5, 50 iterations per op < 200)")
    assert "**guest volume not measured:** no --volume flag" in text
    assert "**(busy: timings inflated)**" in text
    assert "| parallel_read | ≤ 5.0× | **–×** | 2.00× | –× | **not measured** |" in text
    assert "One uncached request" not in text


def test_plot_writes_a_png(tmp_path):
    bv.plot(bv.aggregate(rows3()), tmp_path / "v.png")
    assert (tmp_path / "v.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fsbench_runs_and_prints_every_workload(tmp_path):
    p = subprocess.run([sys.executable, str(bv.FSBENCH), "--dir", str(tmp_path), "--workers", "4",
                        "--files", "16", "--repeats", "2", "--iters", "20"],
                       capture_output=True, text=True, check=True)
    res = json.loads(p.stdout)
    assert len(res["parallel"]["read"]) == 2 and len(res["parallel"]["write"]) == 2
    assert set(res["ops"]) == set(bv.OPS) and len(res["floor_ns"]) == 100
    assert len(res["ops"]["getattr"]) == 20 and len(res["ops"]["readdir"]) == 2
    assert list(tmp_path.iterdir()) == []  # cleaned up
    rows = bv.rows_from_result("host", 1, res)
    assert all(r["value_us"] > 0 for r in rows)
