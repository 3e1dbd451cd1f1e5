"""Tests of the registry bench's pieces that need no VM, registry or daemon:
the offline chunk-size replay, the OCI layout writer, the parsing of the
CLI's phase events, and the report (table, notes, plot) from made-up rows.

Run: .venv/bin/python -m pytest bench/registry
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_registry as br  # noqa: E402
import chunk_sizes as cs  # noqa: E402
import registry_cases as rc  # noqa: E402
import registry_hosts as rh  # noqa: E402
import registry_report as rr  # noqa: E402
import report as rp  # noqa: E402

MiB = 1 << 20


def _write(path: Path, size: int, blocks: dict[int, bytes]) -> Path:
    """A sparse file of `size` bytes with `blocks` (offset -> bytes) written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, b in blocks.items():
            f.seek(off)
            f.write(b)
    return path


def test_chunk_offsets_cover_only_data():
    assert cs.chunk_offsets([(0, 10), (5 * MiB, 5 * MiB + 1)], MiB) == [0, 5 * MiB]
    assert cs.chunk_offsets([(MiB - 1, MiB + 1)], MiB) == [0, MiB]
    assert cs.chunk_offsets([], MiB) == []


def test_analyse_counts_shared_and_new_chunks(tmp_path):
    rnd = [os.urandom(MiB) for _ in range(5)]
    image = _write(tmp_path / "rootfs.ext4", 8 * MiB, {0: rnd[0], 4 * MiB: rnd[1]})
    tmpl = tmp_path / "tmpl"
    _write(tmpl / "memory.img", 4 * MiB, {MiB: rnd[2]})
    _write(tmpl / "manifest.fvs", 10, {0: b"x" * 10})  # not a chunked file
    s1, s2 = tmp_path / "s1", tmp_path / "s2"
    _write(s1 / "memory.diff", 2 * MiB, {0: rnd[3]})
    # S2 repeats one of the image's chunks and has one of its own.
    _write(s2 / "memory.diff", 2 * MiB, {0: rnd[0], MiB: rnd[4]})
    _write(s2 / "device.state", 3 * MiB, {})  # all holes: nothing to send
    r = cs.analyse(image, tmpl, s1, s2, sizes_mib=[1], progress=lambda _: None)
    row = r["rows"][0]
    assert row["s1_blobs"] == 4 and row["s2_after_s1_blobs"] == 1
    assert row["s2_shared_blobs"] == 1
    assert row["s2/device.state_bytes"] == 0
    if r["method"].startswith("uncompressed"):
        assert row["s2_after_s1_bytes"] == MiB
    else:  # random data does not compress
        assert MiB <= row["s2_after_s1_bytes"] < MiB + 4096


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_write_layout_makes_a_one_layer_oci_layout(tmp_path):
    src = tmp_path / "src"
    _write(src / "rootfs.ext4", 64 * MiB, {MiB: b"data"})
    (src / "t").mkdir()
    (src / "t" / "memory.diff").write_bytes(b"m" * 1000)
    stage = rc.stage_tree(tmp_path / "stage", src / "rootfs.ext4", src / "t", src / "t")
    lay = rc.write_layout(tmp_path / "oci", stage, "s1")
    assert lay["tar_bytes"] < 4 * MiB  # --sparse: the holes are not stored
    blob, media, size = rc.layout_layer(tmp_path / "oci", "s1")
    assert media == "application/vnd.oci.image.layer.v1.tar" and blob.stat().st_size == size
    assert blob.name == rh.sha256_file(blob)
    assert json.loads((tmp_path / "oci" / "oci-layout").read_text())["imageLayoutVersion"]
    out = tmp_path / "out"
    out.mkdir()
    rh.sh(["tar", "-xf", blob, "-C", out])
    assert (out / "image" / "rootfs.ext4").stat().st_size == 64 * MiB
    assert (out / "snapshot" / "memory.diff").read_bytes() == b"m" * 1000


def test_push_and_pull_stages_from_phase_events():
    r = {"total_ms": 900, "bytes_sent": 10, "blobs_sent": 2, "blobs_skipped": 1,
         "bytes_skipped": 5, "links": 2, "links_skipped": 1, "image_sent": False}
    row = rc.push_row(1000.0, [(50.0, "chunking"), (400.0, "pushing to x/y:z"),
                               (60.0, "(first progress or cached event)")], r)
    assert row["prepare_ms"] == 400.0 and row["transfer_ms"] == 600.0
    assert row["image_sent"] == 0
    r = {"total_ms": 900, "bytes_fetched": 10, "blobs_fetched": 2, "links": 2,
         "links_cached": 1, "image_created": True}
    row = rc.pull_row(1000.0, [(1.0, "resolving x"), (800.0, "publishing"),
                               (300.0, "(first progress or cached event)")], r)
    assert (row["prepare_ms"], row["transfer_ms"], row["finish_ms"]) == (300.0, 500.0, 200.0)
    row = rc.pull_row(1000.0, [(1.0, "resolving x"), (None, "(first progress or cached event)"),
                               (800.0, "publishing")], r)
    assert row["prepare_ms"] == 0.0


def _rows(runs=3):
    rows = []
    for run in range(1, runs + 1):
        for case, _, base in rh.FIGURES:
            push = "push" in case
            rows.append({"case": case, "run": run, "total_ms": 1000.0 * run,
                         "prepare_ms": 100.0, "transfer_ms": 800.0,
                         "finish_ms": None if push else 100.0, "bytes": 100 * MiB,
                         "registry_bytes": 100 * MiB, "blobs": 30, "blobs_skipped": 0,
                         "bytes_skipped": 0, "links": 2, "links_skipped": 1, "image_sent": 1,
                         "requests": 250, "pings": 125, "spawn_ms": None if push else 900.0,
                         "sha_ok": None if push else 1, "other_cpu_cores": 0.1})
        for case in rh.BASELINE:
            rows.append({"case": case, "run": run, "total_ms": 2000.0, "transfer_ms": 1500.0,
                         "prepare_ms": 500.0 if "push" in case else None,
                         "finish_ms": None if "push" in case else 500.0, "bytes": 200 * MiB,
                         "registry_bytes": 200 * MiB, "requests": 10, "pings": 1,
                         "other_cpu_cores": 0.1})
    return rows


def test_report_and_plot_from_made_up_rows(tmp_path):
    pytest.importorskip("matplotlib")
    rows = _rows()
    chunks = {"method": "zstd level 3 (test)", "rows": [
        {"chunk_mib": m, "s1_bytes": 200 * MiB - m, "s1_blobs": 480 // m,
         "s2_after_s1_bytes": 100 * MiB, "s2_after_s1_blobs": 100 // m, "s2_shared_blobs": 0,
         "s2/memory.diff_bytes": 60 * MiB, "s2/disk.qcow2_bytes": 40 * MiB}
        for m in cs.SIZES_MIB]}
    info = {"version": "0.1.0", "accel": {"kind": "tcg", "reason": "test"},
            "qemu": {"version": "QEMU 10", "path": "qemu-system-x86_64"}}
    ctx = {"info": info, "machine": rp.machine_info(), "tools": "t", "others": {},
           "busy": 0, "stray": [0, 0, 0], "stray_spawn": [1, 1, 1, 1, 1, 1], "data_mib": 64,
           "profile": "release", "command": "bash bench/registry/run.sh", "chunks": chunks,
           "started": dt.datetime.now().astimezone(), "elapsed": 60.0,
           "skopeo_media": "application/vnd.oci.image.layer.v1.tar+gzip"}
    args = SimpleNamespace(runs=3, memory=512, data_mib=64, binary="/x/forkvm")
    lines = rr.write_results(tmp_path / "RESULTS.md", rows, ctx, args)
    text = "\n".join(lines)
    assert "SMOKE" not in text
    assert "| push_s1: push S1" in text and "**1.00×**" in text
    assert "| **4 MiB** |" in text and "zstd level 3 (test)" in text
    assert "Daemon A had 1 thread(s) in a sandbox's network namespace right after each spawn" in text
    quiet = dict(ctx, stray=[0, 0, 0], stray_spawn=[0] * 6)
    text0 = "\n".join(rr.write_results(tmp_path / "RESULTS0.md", rows, quiet, args))
    assert "Daemon threads in sandbox namespaces: none." in text0 and "worked around" not in text0
    rr.plot(rows, ctx, tmp_path / "registry.png")
    assert (tmp_path / "registry.png").stat().st_size > 10_000
    rp.write_csv(tmp_path / "registry.csv", rows, rh.FIELDS)
    assert (tmp_path / "registry.csv").read_text().startswith("case,run,total_ms")


def test_the_harness_loads_and_has_a_main():
    assert callable(br.main)
