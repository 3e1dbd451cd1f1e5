"""What every benchmark shares around its measurements: the command line
(the common options, list arguments, the `__main__` entry with its signal
handling and exit codes), the run loop's jailed/unjailed ABBA segments,
statistics (percentiles, p50/p90 summaries, ratios to a baseline), the
description of the machine, CSV output, the RESULTS.md header lines and
tables, and the matplotlib boilerplate for the PNG (standard library only,
matplotlib imported lazily).

Each bench keeps what is specific to it (its cases, its plots, its
conclusions) and builds its files from these pieces, so the header of every
RESULTS.md says the same things the same way: date, forkvm version and git
revision, machine, accelerator, QEMU.
"""

from __future__ import annotations

import csv
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from forkvm_bench import BenchError, ms_since

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def add_common_args(ap, here) -> None:
    """The options every harness takes last: --out (default `here`/results,
    `here` being the bench's directory), --binary (the repo's release build;
    run.sh passes the one it built) and --wait-quiet (for wait_for_quiet_host)."""
    ap.add_argument("--out", default=str(Path(here) / "results"), help="results directory")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before starting, wait up to this long for the host to be quiet "
                         "(other processes using < 0.2 cores over 5 s); 0: only warn")


def int_list(s: str, what: str, ap) -> list[int]:
    """A comma-separated option value as sorted distinct non-negative
    integers; anything else ends the program through `ap.error`."""
    try:
        v = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        ap.error(f"{what} takes a comma-separated list of integers")
    if any(x < 0 for x in v):
        ap.error(f"{what} takes non-negative integers")
    return v


def _interrupt(signum, _frame):
    # A second signal while unwinding must not cut the cleanup short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def run_main(name: str, main, on_signal: str | None = "interrupt") -> None:
    """Run a harness's `main()` as the program and exit with its status.

    `on_signal` says what SIGINT/SIGTERM do: "interrupt" (both raise
    KeyboardInterrupt, which unwinds through the harness's try/finally
    blocks, so sandboxes, QEMU processes, RAM files and the temp home are
    still removed; exit 130), "exit" (SIGTERM, e.g. from `timeout`, unwinds
    as SystemExit 143; Ctrl-C stays Python's default) or None (Python's
    defaults). A BenchError is one line on stderr and exit 1."""
    if on_signal == "interrupt":
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
    elif on_signal == "exit":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    elif on_signal is not None:
        raise ValueError(f"on_signal: {on_signal!r} is not 'interrupt', 'exit' or None")
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)


# --------------------------------------------------------------------------
# Runs: jailed / unjailed segments
# --------------------------------------------------------------------------

JAILED, UNJAILED = "jailed", "unjailed"
JAIL_ORDER = [JAILED, UNJAILED, UNJAILED, JAILED]  # ABBA: drift weighs on both sides alike


def split_runs(total: int, parts: int) -> list[int]:
    """`total` runs over `parts` segments, as even as possible, earlier first."""
    q, r = divmod(total, parts)
    return [q + (i < r) for i in range(parts)]


def timed_run(argv, env=None, timeout: float = 1800.0) -> tuple[float, str, str]:
    """Run a command to completion, stdin closed: (wall ms, stdout, stderr).
    A failure or a timeout raises BenchError with the command and the end of
    its output."""
    argv = [str(a) for a in argv]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"`{shlex.join(argv)}` took more than {timeout:.0f} s") from e
    ms = ms_since(t0)
    if p.returncode != 0:
        out = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise BenchError(f"`{shlex.join(argv)}` exited with {p.returncode}:\n{out}")
    return ms, p.stdout, p.stderr


def jail_env(side: str) -> dict:
    """The daemon's jail setting, always explicit (an inherited FORKVM_NO_JAIL
    must not change what a run is labelled)."""
    return {"FORKVM_NO_JAIL": "1" if side == UNJAILED else "0"}


def process_uid(pid: int) -> int:
    """The real uid a process runs as (from /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise BenchError(f"no Uid line in /proc/{pid}/status")


def check_side_uid(side: str, sb: dict) -> int:
    """A jailed daemon's QEMU runs as a non-root uid, an unjailed one's as
    root; anything else fails the bench (a mislabelled run). Returns the uid
    of sandbox `sb`'s QEMU."""
    uid = process_uid(sb["pid"])
    if (uid == 0) != (side == UNJAILED):
        raise BenchError(f"sandbox {sb.get('id')} of the {side} daemon runs QEMU pid "
                         f"{sb['pid']} as uid {uid}: the jail setting is not what was asked")
    return uid

# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


def percentile(values, p: float) -> float:
    """The p-th percentile (0..100) by linear interpolation between closest
    ranks (numpy's default, statistics.quantiles(method='inclusive'))."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(values) -> dict:
    """n, min, p50, p90, max and mean of the values that are numbers (None
    and NaN are left out; all NaN when nothing is left)."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        return {"n": 0, "min": math.nan, "p50": math.nan, "p90": math.nan, "max": math.nan,
                "mean": math.nan}
    return {"n": len(xs), "min": min(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "max": max(xs), "mean": sum(xs) / len(xs)}


def case_stats(rows, cases, skip=lambda case, stage: False) -> list[tuple[str, str, dict]]:
    """(case, stage, summary) for each (case, stages) in `cases`: the case's
    `total_ms` first, then each stage. A case with no rows is left out, and
    so is a stage with no values or one `skip(case, stage)` is true for."""
    out = []
    for case, stages in cases:
        rs = [r for r in rows if r.get("case") == case]
        if not rs:
            continue
        out.append((case, "total_ms", summarize(r.get("total_ms") for r in rs)))
        for s in stages:
            if skip(case, s):
                continue
            st = summarize(r.get(s) for r in rs)
            if st["n"]:
                out.append((case, s, st))
    return out


def ratio(a: float, b: float) -> float:
    """a / b, NaN when either is missing or b is 0."""
    if a is None or b is None or a != a or b != b or b == 0:
        return math.nan
    return a / b


# --------------------------------------------------------------------------
# Machine description
# --------------------------------------------------------------------------


def machine_info() -> dict:
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        pass
    cpu = fields.get("model name") or platform.processor() or "unknown"
    cpu_detail = ", ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping")
                           if k in fields)
    if "hypervisor" in fields.get("flags", "").split():
        cpu_detail += (", " if cpu_detail else "") + "virtualized (hypervisor flag set)"
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (math.nan,) * 3
    return {
        "cpu_model": cpu,
        "cpu_detail": cpu_detail,
        "cores": os.cpu_count(),
        "mem_gib": mem_kib / (1024 * 1024),
        "kernel": platform.release(),
        "loadavg": load,
    }


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------


def fmt(v, digits: int = 0) -> str:
    """A number with thousands separators, or an en dash for None/NaN."""
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return f"{v:,.{digits}f}"


def write_csv(path: str | Path, rows, fields) -> None:
    """Rows (dicts) as CSV with the given columns; floats with 3 decimals,
    keys not in `fields` left out, missing ones empty."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()
                        if k in fields})


def smoke_banner(what: str, rerun: str) -> list[str]:
    """The block that opens a smoke run's RESULTS.md: `what` says why it is
    one, `rerun` the command that gives real figures (None: no advice)."""
    advice = f"; re-run with `{rerun}` for real figures" if rerun else ""
    return [f"> **SMOKE RUN** ({what}): not a valid result{advice}.", ""]


def date_line(started, elapsed_s: float, minutes: bool = False) -> str:
    took = f"{elapsed_s / 60:.1f} min" if minutes else f"{elapsed_s:.0f} s"
    return f"- Date: {started.strftime('%Y-%m-%d %H:%M:%S %Z')} (run took {took})"


def forkvm_line(info: dict, revision: str, note: str = "") -> str:
    return f"- forkvm: {info.get('version', '?')}, git {revision}{note}"


def machine_text(m: dict) -> str:
    """CPU (details), cores and RAM: the start of every bench's Machine line."""
    return (f"{m['cpu_model']} ({m['cpu_detail']}), {m['cores']} cores, "
            f"{m['mem_gib']:.1f} GiB RAM")


def loadavg_text(m: dict, sep: str = " / ") -> str:
    return sep.join(f"{x:.2f}" for x in m["loadavg"])


def accel_line(info: dict) -> str:
    accel = info.get("accel") or {}
    return f"- Accelerator: **{accel.get('kind', '?')}** — {accel.get('reason', '')}"


def qemu_text(info: dict) -> str:
    qemu = info.get("qemu") or {}
    return f"{qemu.get('version', '?')} ({qemu.get('path', '?')})"


def header_lines(info: dict, machine: dict, started, elapsed_s: float, revision: str,
                 note: str = "", minutes: bool = False) -> list[str]:
    """The header bullets most RESULTS.md files open with: date and run
    time, forkvm version and git revision (`note` appended), the machine
    with its kernel and load average, the accelerator and QEMU."""
    return [date_line(started, elapsed_s, minutes),
            forkvm_line(info, revision, note),
            f"- Machine: {machine_text(machine)}; Linux {machine['kernel']}; load average at "
            f"start {loadavg_text(machine)}",
            accel_line(info),
            f"- QEMU: {qemu_text(info)}"]


def other_qemu_lines(others: dict[int, str], busy: int, of: int, what: str = "runs") -> list[str]:
    """The bullet about QEMU processes this bench did not start: `busy` of
    the `of` measured `what` started while one was alive."""
    if not others:
        return ["- No other QEMU process was running on the host (checked before each run)."]
    return ([f"- **Host not quiet:** QEMU processes not started by this bench were alive when "
             f"{busy} of the {of} measured {what} started (sampled before each "
             "run; idle or waiting ones cost little, see the line above for what they used):"]
            + [f"  - pid {p}: `{c[:110]}`" for p, c in sorted(others.items())])


def stats_table(stats, with_n: bool = False,
                total_label=lambda case: "**total (client wall)**") -> list[str]:
    """A markdown table of (case, stage, summary): min, p50, p90, max (and n),
    with each case's total in bold (its stage named by `total_label(case)`)."""
    n_head, n_rule = (" n |", "---:|") if with_n else ("", "")
    L = [f"| case | stage |{n_head} min | p50 | p90 | max |",
         f"|---|---|{n_rule}---:|---:|---:|---:|"]
    for c, k, s in stats:
        stage = total_label(c) if k == "total_ms" else k.removesuffix("_ms")
        b = "**" if k == "total_ms" else ""
        n = f" {s['n']} |" if with_n else ""
        L.append(f"| {c} | {stage} |{n} {fmt(s['min'])} | {b}{fmt(s['p50'])}{b} | "
                 f"{b}{fmt(s['p90'])}{b} | {fmt(s['max'])} |")
    return L


def jail_ratio_table(ratios, naive_head: str, naive_cell, ms, vs_naive) -> list[str]:
    """The jail comparison's markdown table: per metric (a dict with label,
    the jailed and unjailed summaries, ratio_p50/p90 and each side's ratio
    to the naive baseline) jailed and unjailed p50/p90 (`ms` formats them),
    the ratios, the naive column (`naive_head`, `naive_cell(r)`) and each
    side over naive (`vs_naive` formats them)."""
    L = ["| metric | jailed p50 | jailed p90 | unjailed p50 | unjailed p90 | **ratio p50** "
         f"(jailed ÷ unjailed) | ratio p90 | {naive_head} | jailed ÷ naive | "
         "unjailed ÷ naive |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ratios:
        j, u = r[JAILED], r[UNJAILED]
        L.append(f"| {r['label']} | {ms(j['p50'])} | {ms(j['p90'])} | "
                 f"{ms(u['p50'])} | {ms(u['p90'])} | **{r['ratio_p50']:.3f}×** | "
                 f"{r['ratio_p90']:.3f}× | {naive_cell(r)} | "
                 f"{vs_naive(r['jailed_vs_naive'])} | {vs_naive(r['unjailed_vs_naive'])} |")
    return L


def stats_text(stats, case_width: int = 15, with_n: bool = False) -> list[str]:
    """The same figures as `stats_table`, as aligned lines for the terminal."""
    n = f"{'n':>4}" if with_n else ""
    out = [f"{'case':<{case_width}}{'stage':<17}{n}{'min':>9}{'p50':>9}{'p90':>9}{'max':>9}"]
    for c, k, s in stats:
        n = f"{s['n']:>4}" if with_n else ""
        out.append(f"{c:<{case_width}}{k.removesuffix('_ms'):<17}{n}{fmt(s['min']):>9}"
                   f"{fmt(s['p50']):>9}{fmt(s['p90']):>9}{fmt(s['max']):>9}")
    return out


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | Path, dpi: int = 100, title: str | None = None,
                rect=None, **title_kw) -> None:
    """Title (small, as a suptitle; `title_kw` go to suptitle), lay out
    (within `rect`, if given), write the PNG, free the figure."""
    if title:
        fig.suptitle(title, **{"fontsize": 10, **title_kw})
    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
