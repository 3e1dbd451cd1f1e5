"""Unit tests of the branch-point storage bench's own logic (no VM)."""

import datetime as dt
import importlib.util
import mmap
import os
from pathlib import Path
from types import SimpleNamespace

import report as rp

_path = Path(__file__).resolve().parents[1] / "branchpoint" / "bench_branchpoint.py"
_spec = importlib.util.spec_from_file_location("bench_branchpoint_under_test", _path)
bp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bp)


def test_ram_anon_mib_reads_the_mapping_of_exactly_that_size(tmp_path):
    # Like a clone's guest RAM: a private mapping of a file, of a size no
    # other mapping of this process has; the pages written become anonymous.
    size = 7 * 2**20 + 4096
    f = tmp_path / "ram"
    f.write_bytes(b"")
    os.truncate(f, size)
    with open(f, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE)
    try:
        for off in range(0, 2**20, 4096):
            m[off] = 1
        assert bp.ram_anon_mib(os.getpid(), size) == 1.0
    finally:
        m.close()


def row(fs, mode, private, stored, **kw):
    return dict({"fs": fs, "dirty_mib": 256, "mode": mode, "run": 1, "kind": "diff",
                 "private_mib": private, "stored_mem_mib": stored, "memory_diff_mib": stored,
                 "device_state_mib": 0.1, "disk_layer_mib": 1.0, "pause_ms": 5.0,
                 "naive_mib": 330.0, "head_mib": 330.0}, **kw)


def results(tmp_path, rows, runs=10):
    args = SimpleNamespace(runs=runs, fs=["ext4"], dirty=[256], modes=["full", "live"],
                           naive_runs=3, memory=512)
    ctx = {"info": {"version": "0.1.0"}, "machine": rp.machine_info(),
           "started": dt.datetime.now().astimezone(), "elapsed": 1.0}
    return "\n".join(bp.write_results(tmp_path / "R.md", rows, ctx, args))


def test_the_verdict_follows_the_worst_ratio(tmp_path):
    text = results(tmp_path, [row("ext4", "live", 260, 258), row("ext4", "full", 260, 300)])
    assert "**met**" in text and "1.15×" in text
    text = results(tmp_path, [row("ext4", "live", 260, 258), row("ext4", "full", 200, 300)])
    assert "**missed**" in text and "1.50×" in text
    assert "SMOKE" in results(tmp_path, [row("ext4", "live", 1, 1)], runs=2)
