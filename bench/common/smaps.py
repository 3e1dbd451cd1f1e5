"""Where a QEMU process's memory goes, read from /proc/<pid>/smaps.

``/proc/<pid>/smaps`` lists every mapping of a process: a header line
(``start-end perms offset dev inode [path]``) followed by ``Field: N kB``
lines. :func:`classify` sums the ``Pss`` and ``Private_Dirty`` of each
mapping into the classes below, so a bench can say which part of an idle
clone's memory a density target is missed on (docs/benchmarks.md, "Clone
density"):

* ``guest_ram``: the file mapping exactly as long as the guest's RAM (a
  clone's private copy-on-write mapping of its snapshot's memory image or
  chain head; its written pages are private);
* ``tcg_buffer``: anonymous ``rwx`` mappings, which in QEMU are the TCG
  translation buffer (KVM has none);
* ``heap``: ``[heap]``, glibc's main arena;
* ``stack``: ``[stack]``;
* ``files``: every other file mapping (the QEMU binary, its libraries,
  firmware ROMs read from disk);
* ``other_anon``: every other anonymous mapping (glibc's thread arenas and
  thread stacks, TCG's hash table and softmmu TLBs, device buffers).

Pure parsing in :func:`classify` (unit-tested in test_smaps.py); :func:`read`
opens the file.
"""

from __future__ import annotations

CLASSES = ("guest_ram", "tcg_buffer", "heap", "stack", "files", "other_anon")
FIELDS = ("Pss", "Private_Dirty")


def _kind(header: list[str], ram_bytes: int | None) -> str | None:
    """The class of the mapping whose header line was split into `header`;
    None for a line that is not a header."""
    if len(header) < 5 or "-" not in header[0] or header[0].endswith(":"):
        return None
    lo, _, hi = header[0].partition("-")
    try:
        size = int(hi, 16) - int(lo, 16)
    except ValueError:
        return None
    perms = header[1]
    path = " ".join(header[5:]) if len(header) > 5 else ""
    if path == "[heap]":
        return "heap"
    if path == "[stack]":
        return "stack"
    if path.startswith("/"):
        if ram_bytes is not None and size == ram_bytes:
            return "guest_ram"
        return "files"
    if not path and perms.startswith("rwx"):
        return "tcg_buffer"
    # Anonymous, or a kernel pseudo-mapping ([vdso], [vvar], memfd and
    # deleted files show a path with a leading "/" and are counted above).
    return "other_anon"


def classify(text: str, ram_bytes: int | None = None) -> dict[str, dict[str, int]]:
    """{class: {"Pss": KiB, "Private_Dirty": KiB}} for one smaps text.

    `ram_bytes` is the guest RAM size: the file mapping of exactly that length
    is the guest's RAM. Raises ValueError on a field line before any header
    (not an smaps file)."""
    out = {c: {f: 0 for f in FIELDS} for c in CLASSES}
    cur: str | None = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        kind = _kind(parts, ram_bytes)
        if kind is not None:
            cur = kind
            continue
        if len(parts) >= 3 and parts[0].endswith(":") and parts[2] == "kB":
            if cur is None:
                raise ValueError(f"smaps field before any mapping: {line!r}")
            name = parts[0][:-1]
            if name in FIELDS:
                out[cur][name] += int(parts[1])
    return out


def read(pid: int, ram_bytes: int | None = None) -> dict[str, dict[str, int]]:
    """:func:`classify` of /proc/<pid>/smaps. Raises OSError if the process
    is gone."""
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        return classify(f.read(), ram_bytes)


LABELS = {
    "guest_ram": "guest RAM (its private copy-on-write mapping of the snapshot's memory: the "
                 "pages it wrote, plus its share of the page cache it read)",
    "tcg_buffer": "TCG translation buffer (code translated since the restore, which a "
                  "snapshot does not hold)",
    "heap": "QEMU's main heap",
    "files": "QEMU binary and libraries (their relocated data is private, their code shared)",
    "other_anon": "other anonymous memory (thread arenas and stacks, TCG hash table and TLBs)",
    "stack": "main stack",
}


def describe(pss_mib: dict[str, float], dirty_mib: dict[str, float]) -> str:
    """The classes, largest first, as "label X MiB (Y private dirty)"
    joined by "; " (MiB figures per class, e.g. per clone)."""
    return "; ".join(f"{LABELS[c]} {pss_mib[c]:.1f} MiB ({dirty_mib[c]:.1f} private dirty)"
                     for c in sorted(CLASSES, key=lambda c: -pss_mib[c]))


def add(total: dict[str, dict[str, int]], one: dict[str, dict[str, int]]) -> None:
    """Add `one` (a :func:`classify` result) into `total` in place."""
    for c in CLASSES:
        for f in FIELDS:
            total.setdefault(c, {}).setdefault(f, 0)
            total[c][f] += one.get(c, {}).get(f, 0)
