"""Unit tests of the cluster benchmark's pure parts (bench/cluster): node
names in ids, the gateway's copy log lines, the order that removes pulled
snapshots, p99 and the ratios, and the report on made-up rows: no daemon,
no VM.

Run: .venv/bin/python -m pytest bench/common/test_cluster.py
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "cluster"))

import bench_cluster as bc  # noqa: E402
import cluster_report as cr  # noqa: E402
import cluster_rig as rig  # noqa: E402

MACHINE = {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2, "mem_gib": 3.5,
           "kernel": "6.1.0-test", "loadavg": (0.5, 0.25, 0.125)}
INFO = {"version": "9.9.9", "accel": {"kind": "tcg", "reason": "no /dev/kvm"},
        "qemu": {"version": "10.0.2", "path": "/usr/bin/qemu-system-x86_64"}}


def test_node_of_reads_the_middle_part_of_a_cluster_id():
    assert rig.node_of("sb-n1-0123456789ab") == "n1"
    assert rig.node_of("sn-solo-0123456789ab") == "solo"
    assert rig.node_of("sb-0123456789ab") is None
    assert rig.per_node(["sb-n2-a", "sb-n1-b", "sb-n2-c", "sb-x"]) == {"?": 1, "n1": 1, "n2": 2}


def test_copy_lines_are_parsed_from_the_gateway_log():
    # The line crates/forkvm-cluster/src/branch.rs logs, with tracing's prefix.
    log = (
        "2026-11-28T01:31:20.1Z  INFO forkvm_cluster::server: listening on 127.0.0.1:9\n"
        "2026-11-28T01:31:27.5Z  INFO forkvm_cluster::branch: snapshot sn-n1-0a1b2c3d4e5f "
        "copied from node n1 to node n3: 2 link(s), 0 already there, 18771234 bytes in "
        "10321 ms\n"
        "2026-11-28T01:31:27.9Z  INFO forkvm_cluster::branch: snapshot sn-n1-0a1b2c3d4e5f "
        "copied from node n1 to node n2: 2 link(s), 1 already there, 1153433 bytes in 812 ms\n")
    got = rig.parse_copy_lines(log)
    assert got == [
        {"id": "sn-n1-0a1b2c3d4e5f", "src": "n1", "dst": "n3", "links": 2, "cached": 0,
         "bytes": 18771234, "ms": 10321},
        {"id": "sn-n1-0a1b2c3d4e5f", "src": "n1", "dst": "n2", "links": 2, "cached": 1,
         "bytes": 1153433, "ms": 812},
    ]
    assert rig.parse_copy_lines("nothing copied here\n") == []


def test_pulled_snapshots_are_removed_children_first():
    # P2 built on P, both on the template T; a sibling chain sharing T.
    order = bc.forget_order([["P2", "P", "T"], ["P", "T"], ["Q", "T"]])
    assert order.index("P2") < order.index("P") < order.index("T")
    assert order.index("Q") < order.index("T")
    assert sorted(order) == ["P", "P2", "Q", "T"]
    # Heads given root-side first still come out leaf first.
    order = bc.forget_order([["P", "T"], ["P2", "P", "T"]])
    assert order == ["P2", "P", "T"]
    assert bc.forget_order([]) == []


def test_summary_has_p99_and_ratios_use_only_runs_that_succeeded():
    s = cr.summary(list(range(1, 101)))
    assert math.isclose(s["p50"], 50.5) and math.isclose(s["p99"], 99.01)
    rows = ([{"case": "gateway", "ms": v} for v in (2.0, 4.0, 6.0)]
            + [{"case": "direct", "ms": v} for v in (1.0, 2.0, 3.0)])
    r = cr.ratios(rows, "r", "gateway", "direct", "ms")
    assert math.isclose(r["r_p50"], 2.0) and math.isclose(r["r_p99"], 2.0)
    rows = [{"case": "a", "ok": 1, "total_ms": 10.0}, {"case": "a", "ok": 0, "total_ms": None},
            {"case": "b", "ok": 1, "total_ms": 5.0}]
    assert math.isclose(cr.ratios(rows, "r", "a", "b")["r_p50"], 2.0)
    assert math.isnan(cr.ratios(rows, "r", "a", "missing")["r_p50"])


def test_command_args_leave_out_the_binary_run_sh_adds():
    assert cr.command_args(["--binary", "/x/forkvm", "--smoke"]) == ["--smoke"]
    assert cr.command_args(["--binary=/x/forkvm", "--runs", "2"]) == ["--runs", "2"]


def test_results_state_every_ratio_and_the_machine(tmp_path):
    req = ([{"case": "gateway", "i": i, "ms": 3.0 + i} for i in range(10)]
           + [{"case": "direct", "i": i, "ms": 2.0 + i} for i in range(10)])
    tr = []
    for rnd in range(2):
        for case, total, b in (("same_node", 600.0, 0), ("cross_warm", 1200.0, 2**20),
                               ("cross_first" if rnd == 0 else "cross_cold", 6000.0 + rnd,
                                18 * 2**20)):
            tr.append({"case": case, "round": rnd, "snapshot": "sn-n1-x", "snapshot_ms": 100.0,
                       "pull_ms": total - 600, "spawn_ms": 300.0, "exec_ms": 300.0,
                       "total_ms": total, "bytes": b, "links": 2, "links_cached": 0})
    br = [{"case": "one_node", "run": 0, "count": 64, "ok": 1, "total_ms": 30000.0,
           "call_ms": 15000.0, "first_ms": 20000.0, "nodes": "solo:64", "copies": 0,
           "copy_bytes": 0, "copy_links": 0, "copy_cached": 0},
          {"case": "three_nodes", "run": 0, "count": 64, "ok": 1, "total_ms": 45000.0,
           "call_ms": 30000.0, "first_ms": 28000.0, "nodes": "n1:22 n2:23 n3:19", "copies": 2,
           "last_by_node": "n1:30.0s n2:45.0s n3:44.0s",
           "copy_bytes": 3 * 2**20, "copy_links": 4, "copy_cached": 2},
          {"case": "three_nodes", "run": 1, "count": 64, "ok": 0, "error": "boom"}]
    args = SimpleNamespace(smoke=False, memory=512, count=64, requests=10, warmup=2, rounds=2,
                           runs=2, rest=5.0)
    text = cr.write_results(
        tmp_path / "RESULTS.md", req, tr, br, args=args, info=INFO, machine=MACHINE,
        started=dt.datetime(2026, 11, 28, tzinfo=dt.timezone.utc), elapsed=600.0, busy=0.1,
        others={}, left=[], per_node_max=23, capacity={"n1": {"memory_commit_mib": 100}},
        argv=["--binary", "/b", "--runs", "2"], noise={"overhead": 0.12})
    assert "Accelerator: **tcg**" in text and "QEMU: 10.0.2" in text and "Test CPU" in text
    assert "`bash bench/cluster/run.sh --runs 2`" in text
    assert "| exec `true` through the gateway | straight to the node | **1.15×**" in text
    assert "template not there | child on the source's node | **10.00×**" in text
    assert "(it chunks its template) | child on the source's node | **10.00×**" in text
    assert "template there | child on the source's node | **2.00×**" in text
    assert "64-way branch over 3 nodes | 64 on one node | **1.50×**" in text
    assert "failed: boom" in text and "n1:22 n2:23 n3:19" in text and "n2:45.0s" in text
    assert "18.0 MiB" in text and "SMOKE" not in text
    assert "overhead phase 0.12" in text
    cr.write_plot(tmp_path / "cluster.png", req, tr, br, args)
    assert (tmp_path / "cluster.png").stat().st_size > 10_000
