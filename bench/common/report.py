"""The tail every benchmark shares: the environment block at the top of its
RESULTS.md, saving its plots, and running its ``main`` so that Ctrl-C and
SIGTERM still clean up.

Each bench keeps what is its own (its tables, targets and notes); what a
reader compares between benches (when, which commit, which machine,
accelerator and QEMU) is written the same way by all of them.
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from pathlib import Path
from typing import Callable, NoReturn

import forkvm_bench as fb


def environment_lines(started: dt.datetime, elapsed_s: float, info: dict, machine: dict,
                      revision: str | None = None, qemu_note: str = "",
                      swap_kib: int | None = None) -> list[str]:
    """The bullet list that opens every RESULTS.md: date and duration, the
    forkvm version and git revision, the machine, the load at start, the
    accelerator with the daemon's reason, and the QEMU version (with
    ``qemu_note`` appended, for benches that depend on a QEMU default)."""
    accel, qemu = info.get("accel", {}), info.get("qemu", {})
    took = f"{elapsed_s:.0f} s" if elapsed_s < 600 else f"{elapsed_s / 60:.1f} min"
    rev = revision or fb.git_revision()
    swap = "no swap" if not swap_kib else f"{swap_kib // 1024} MiB swap"
    return [
        f"- Date: {started.strftime('%Y-%m-%d %H:%M:%S %Z')} (run took {took})",
        f"- forkvm: {info.get('version', '?')}, git {rev}",
        f"- Machine: {machine['cpu_model']} ({machine['cpu_detail']}), {machine['cores']} cores, "
        f"{machine['mem_gib']:.1f} GiB RAM, {swap}; Linux {machine['kernel']}",
        "- Load average at start: " + " / ".join(f"{x:.2f}" for x in machine["loadavg"]),
        f"- Accelerator: **{accel.get('kind', '?')}** — {accel.get('reason', '')}",
        f"- QEMU: {qemu.get('version', '?')} ({qemu.get('path', '?')})" + qemu_note,
    ]


def smoke_banner(smoke: bool, what: str, rerun: str) -> list[str]:
    """The warning a smoke run's RESULTS.md starts with."""
    if not smoke:
        return []
    return [f"> **SMOKE RUN** ({what}): not a valid result; re-run with `{rerun}` for real "
            "figures.", ""]


def save_figure(fig, path: str | Path, title: str | None = None, dpi: int = 100,
                rect=None, **title_kw) -> None:
    """Title (``fig.suptitle``, 10 pt unless ``title_kw`` says otherwise), lay
    out (within ``rect`` if given), write as PNG and free the figure."""
    import matplotlib.pyplot as plt
    if title is not None:
        fig.suptitle(title, **{"fontsize": 10, **title_kw})
    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def write_markdown(path: str | Path, lines: list[str]) -> None:
    Path(path).write_text("\n".join(lines).rstrip("\n") + "\n")


def _interrupt(signum, _frame):
    # Once: a second Ctrl-C must not cut the clean-up short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def run_main(name: str, main: Callable[[], int]) -> NoReturn:
    """Run a bench's ``main`` and exit with its status: 1 with the message on
    a BenchError, 130 when interrupted. Ctrl-C and SIGTERM unwind through the
    benches' try/finally blocks, so every sandbox, snapshot, QEMU process,
    namespace, RAM file and temp home they made is still removed."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except fb.BenchError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
