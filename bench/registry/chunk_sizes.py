#!/usr/bin/env python3
"""What a snapshot push would send for other chunk sizes (offline, no daemon).

forkvm cuts every file of a push at fixed offsets into chunks of
forkvm_artifact::chunk::CHUNK bytes (4 MiB), leaves out all-zero chunks,
compresses each other one with zstd level 3 and names it by the SHA-256 of
the compressed bytes; the registry skips a blob it already has. This module
replays that for chunk sizes of 1, 2, 4, 8 and 16 MiB over the files of two
snapshots of one template, S1 and S2:

* ``s1``: everything a push of S1 to an empty registry sends (the image's
  root disk, the template link, S1's link), distinct chunks once;
* ``s2_after_s1``: what a push of S2 sends afterwards (its chunks that are
  not among S1's: the image and the template are skipped).

Compression: with the ``zstandard`` module when it is importable, else with
the ``zstd`` command line tool (``zstd -3 --no-check --stream-size=N``: the
same library and level as forkvm's ``zstd::bulk::compress``; the frames
differ by a few header bytes at most). Without either, the bytes counted
are the uncompressed non-zero distinct chunks, and the result says so
(``method``). Chunks are deduplicated by the SHA-256 of their raw bytes
(zstd is deterministic, so equal raw chunks give equal blobs).

Holes are skipped with SEEK_DATA/SEEK_HOLE, so a 2 GiB sparse root disk
costs only what it holds.

Standalone: ``chunk_sizes.py --image ROOTFS --template DIR --s1 DIR --s2 DIR``
(each DIR a snapshot directory: its memory.img or memory.diff,
device.state and disk.qcow2 are read).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MiB = 1 << 20
SIZES_MIB = (1, 2, 4, 8, 16)
LEVEL = 3
# The files of a snapshot link that a push sends (manifest.fvs travels
# inside the link's config, not as chunks).
LINK_FILES = ("memory.img", "memory.diff", "device.state", "disk.qcow2")


def compressor():
    """(name, function bytes -> compressed length, or None for raw)."""
    try:
        import zstandard  # noqa: PLC0415

        def z(data: bytes) -> int:
            # A fresh compressor per call: ZstdCompressor is not thread-safe.
            return len(zstandard.ZstdCompressor(level=LEVEL, write_checksum=False)
                       .compress(data))

        return f"zstd level {LEVEL} (python zstandard {zstandard.__version__})", z
    except ImportError:
        pass
    exe = shutil.which("zstd")
    if exe:
        ver = subprocess.run([exe, "-V"], capture_output=True, text=True).stdout.strip()

        def z(data: bytes) -> int:
            p = subprocess.run([exe, f"-{LEVEL}", "-q", "-c", "--no-check",
                                f"--stream-size={len(data)}"], input=data,
                               capture_output=True, check=True)
            return len(p.stdout)

        short = ver.split(",")[0].strip("* ") if ver else "zstd"
        return f"zstd level {LEVEL} (`zstd` CLI: {short})", z
    return "uncompressed (no zstandard module and no zstd tool: raw bytes of distinct " \
           "non-zero chunks)", None


def data_ranges(f, size: int):
    """(start, end) of the data extents of an open file (SEEK_DATA/SEEK_HOLE);
    the whole file when the filesystem cannot say."""
    fd = f.fileno()
    try:
        out, off = [], 0
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after off
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, min(end, size)))
            off = end
        return out
    except (OSError, AttributeError):
        return [(0, size)]


def chunk_offsets(ranges, chunk: int):
    """Offsets of the chunks (fixed grid of `chunk` bytes) that overlap data."""
    seen = []
    for start, end in ranges:
        first = start // chunk
        last = (end - 1) // chunk
        for i in range(first, last + 1):
            if not seen or seen[-1] < i:
                seen.append(i)
    return [i * chunk for i in seen]


def file_chunks(path: Path, chunk: int):
    """Yield (raw SHA-256, raw bytes) of each non-zero chunk of `path`."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        for off in chunk_offsets(data_ranges(f, size), chunk):
            f.seek(off)
            b = f.read(min(chunk, size - off))
            if not b or b.count(0) == len(b):
                continue  # a hole: not stored
            yield hashlib.sha256(b).digest(), b


def link_files(d: Path) -> list[Path]:
    return [d / n for n in LINK_FILES if (d / n).is_file()]


def analyse(image: Path, template: Path, s1: Path, s2: Path, sizes_mib=SIZES_MIB,
            progress=print, workers: int | None = None) -> dict:
    """Bytes and blobs of a push of S1 (cold) and of S2 after it, per chunk
    size; also S2's link alone per file. Returns {"method": str, "rows": [...]}."""
    method, z = compressor()
    groups = {"image": [image], "template": link_files(template), "s1": link_files(s1),
              "s2": link_files(s2)}
    rows = []
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for mib in sizes_mib:
            chunk = mib * MiB
            csize: dict[bytes, int] = {}  # raw digest -> compressed size
            members: dict[str, set] = {}
            per_file: dict[str, set] = {}
            pending = {}
            for g, files in groups.items():
                members[g] = set()
                for p in files:
                    key = f"{g}/{p.name}"
                    per_file[key] = set()
                    for h, b in file_chunks(p, chunk):
                        members[g].add(h)
                        per_file[key].add(h)
                        if h not in csize and h not in pending:
                            pending[h] = pool.submit(z, b) if z else len(b)
                        if len(pending) >= 8:  # bound the raw bytes held in memory
                            for k, v in pending.items():
                                csize[k] = v.result() if z else v
                            pending.clear()
            for k, v in pending.items():
                csize[k] = v.result() if z else v
            s1_set = members["image"] | members["template"] | members["s1"]
            s2_set = members["image"] | members["template"] | members["s2"]
            new = s2_set - s1_set
            row = {
                "chunk_mib": mib,
                "s1_bytes": sum(csize[h] for h in s1_set), "s1_blobs": len(s1_set),
                "s2_after_s1_bytes": sum(csize[h] for h in new),
                "s2_after_s1_blobs": len(new),
                "s2_shared_blobs": len(members["s2"] & s1_set),
            }
            for key, hs in per_file.items():
                if key.startswith("s2/"):
                    row[f"{key}_bytes"] = sum(csize[h] for h in hs - s1_set)
            rows.append(row)
            progress(f"    chunk {mib:>2} MiB: push S1 {row['s1_bytes'] / MiB:7.1f} MiB in "
                     f"{row['s1_blobs']:>4} blobs; S2 after S1 "
                     f"{row['s2_after_s1_bytes'] / MiB:6.1f} MiB in "
                     f"{row['s2_after_s1_blobs']:>4} blobs")
    return {"method": method, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", type=Path, required=True, help="the image's rootfs.ext4")
    ap.add_argument("--template", type=Path, required=True, help="the template's snapshot dir")
    ap.add_argument("--s1", type=Path, required=True, help="S1's snapshot dir")
    ap.add_argument("--s2", type=Path, required=True, help="S2's snapshot dir")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES_MIB)), help="chunk sizes, MiB")
    a = ap.parse_args()
    r = analyse(a.image, a.template, a.s1, a.s2,
                sizes_mib=[int(x) for x in a.sizes.split(",")])
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
