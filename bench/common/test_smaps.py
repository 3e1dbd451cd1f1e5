"""Unit tests of smaps.py: classifying a process's mappings (no VM).

Run: .venv/bin/python -m pytest bench/common/test_smaps.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import smaps  # noqa: E402

MIB = 1 << 20


def mapping(start: int, size: int, perms: str, path: str, pss: int, dirty: int) -> str:
    """One smaps entry as the kernel writes it (KiB figures)."""
    return (f"{start:x}-{start + size:x} {perms} 00000000 fe:00 1234 {path}\n"
            f"Size:           {size // 1024} kB\n"
            f"Rss:            {pss} kB\n"
            f"Pss:            {pss} kB\n"
            f"Private_Dirty:  {dirty} kB\n"
            f"Anonymous:      {dirty} kB\n"
            "VmFlags: rd wr mr mw me ac\n")


SAMPLE = "".join([
    mapping(0x5550_0000_0000, 4 * MIB, "r-xp", "/usr/bin/qemu-system-x86_64", 3000, 0),
    mapping(0x5550_1000_0000, 1 * MIB, "rw-p", "/usr/bin/qemu-system-x86_64", 1024, 1024),
    mapping(0x5550_2000_0000, 8 * MIB, "rw-p", "[heap]", 5600, 5600),
    mapping(0x7f00_0000_0000, 512 * MIB, "rw-p", "/home/f/snapshots/sn-1/memory.img", 5100, 1500),
    mapping(0x7f10_0000_0000, 64 * MIB, "rwxp", "", 9700, 9700),
    mapping(0x7f20_0000_0000, 2 * MIB, "rw-p", "", 2000, 2000),
    mapping(0x7f30_0000_0000, 4096, "r--p", "[vvar]", 0, 0),
    mapping(0x7ffc_0000_0000, 132 * 1024, "rw-p", "[stack]", 120, 120),
    mapping(0x7f40_0000_0000, 2 * MIB, "r--p", "/usr/lib/x86_64-linux-gnu/libc.so.6", 400, 0),
])


def test_every_class_of_a_qemu_like_process():
    got = smaps.classify(SAMPLE, ram_bytes=512 * MIB)
    assert got["guest_ram"] == {"Pss": 5100, "Private_Dirty": 1500}
    assert got["tcg_buffer"] == {"Pss": 9700, "Private_Dirty": 9700}
    assert got["heap"] == {"Pss": 5600, "Private_Dirty": 5600}
    assert got["stack"] == {"Pss": 120, "Private_Dirty": 120}
    assert got["files"] == {"Pss": 3000 + 1024 + 400, "Private_Dirty": 1024}
    assert got["other_anon"] == {"Pss": 2000, "Private_Dirty": 2000}


def test_every_kib_lands_in_exactly_one_class():
    got = smaps.classify(SAMPLE, ram_bytes=512 * MIB)
    assert sum(c["Pss"] for c in got.values()) == 3000 + 1024 + 5600 + 5100 + 9700 + 2000 + 120 + 400


def test_guest_ram_is_the_file_mapping_of_the_ram_size_only():
    # Without the size the memory image is just another file mapping; an
    # anonymous mapping of the RAM's size is not guest RAM either.
    got = smaps.classify(SAMPLE)
    assert got["guest_ram"]["Pss"] == 0
    assert got["files"]["Pss"] == 3000 + 1024 + 5100 + 400
    anon = mapping(0x7f00_0000_0000, 512 * MIB, "rw-p", "", 77, 77)
    assert smaps.classify(anon, 512 * MIB)["other_anon"]["Pss"] == 77


def test_a_path_with_spaces_and_a_deleted_file_are_files():
    text = mapping(0x1000, 4096, "rw-s", "/dev/shm/a b (deleted)", 4, 4)
    assert smaps.classify(text)["files"]["Pss"] == 4


def test_corrupt_input_is_refused():
    with pytest.raises(ValueError, match="before any mapping"):
        smaps.classify("Pss: 4 kB\n")
    # A truncated file (cut mid-entry) keeps what it has; garbage lines are
    # ignored rather than summed.
    cut = SAMPLE[: SAMPLE.index("Private_Dirty:  5600")]
    got = smaps.classify(cut + "garbage line\n", 512 * MIB)
    assert got["heap"] == {"Pss": 5600, "Private_Dirty": 0}
    assert smaps.classify("") == {c: {"Pss": 0, "Private_Dirty": 0} for c in smaps.CLASSES}


def test_add_sums_per_class():
    total: dict = {}
    one = smaps.classify(SAMPLE, 512 * MIB)
    smaps.add(total, one)
    smaps.add(total, one)
    assert total["tcg_buffer"]["Pss"] == 2 * 9700
    assert set(total) == set(smaps.CLASSES)


def test_reads_this_process():
    got = smaps.read(os.getpid())
    assert got["files"]["Pss"] > 0  # the Python binary and its libraries
    assert got["heap"]["Pss"] + got["other_anon"]["Pss"] > 0


def test_describe_lists_every_class_largest_first():
    per = {c: float(i) for i, c in enumerate(smaps.CLASSES)}
    text = smaps.describe(per, {c: 0.5 for c in smaps.CLASSES})
    parts = text.split("; ")
    assert len(parts) == len(smaps.CLASSES)
    assert parts[0].startswith(smaps.LABELS[smaps.CLASSES[-1]])
    assert parts[0].endswith(f"{len(smaps.CLASSES) - 1:.1f} MiB (0.5 private dirty)")
