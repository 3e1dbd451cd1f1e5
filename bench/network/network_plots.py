"""The network benchmark's figures per series and its PNG plot (matplotlib).
"""

from __future__ import annotations

import math
from pathlib import Path

import report as rp
from network_host import NAIVE, NOISY_CORES
from network_iperf import IPERF_CASES


def vals(rows, series, key, kind="egress"):
    return [r[key] for r in rows if r.get("kind") == kind and r.get("series") == series
            and r.get(key) is not None]


def p(rows, series, key, q, kind="egress"):
    v = vals(rows, series, key, kind)
    return rp.percentile(v, q) if v else math.nan


LABELS = {
    "diff": "forkvm diff\n(wait net)",
    "diff_nowait": "forkvm diff\nno wait net",
    "live": "forkvm live\n(wait net)",
    "live_nowait": "forkvm live\nno wait net",
    NAIVE: "naive QEMU\nsave/restore",
}


def write_plot(path: Path, rows, series_list, title: str) -> None:
    plt = rp.pyplot()

    order = [s for s in series_list + [NAIVE] if vals(rows, s, "resume_to_egress_ms")]
    fig, (ax, axr, ax2) = plt.subplots(1, 3, figsize=(19, 6.4),
                                       gridspec_kw={"width_ratios": [1.3, 1.3, 1]})
    for a, key, ylabel, ttl in (
            (ax, "resume_to_egress_ms", "child resume → first request at the server (ms)",
             "resume → first successful egress (the metric)"),
            (axr, "request_to_egress_ms", "request → first request at the server (ms)",
             "from the fork request (forkvm: POST branch; naive: stop + save + restore)")):
        data = [vals(rows, s, key) for s in order]
        if not data:
            continue
        a.boxplot(data, widths=0.5, showfliers=False,
                  medianprops={"color": "tab:red", "linewidth": 2})
        for i, (s, ys) in enumerate(zip(order, data), start=1):
            rs = [r for r in rows if r.get("kind") == "egress" and r.get("series") == s
                  and r.get(key) is not None]
            xs = [i + (j - (len(ys) - 1) / 2) * (0.35 / max(len(ys), 1)) for j in range(len(ys))]
            a.scatter(xs, ys, s=14, alpha=0.8, zorder=3,
                      color=["tab:orange" if (r.get("other_cpu_cores") or 0) > NOISY_CORES
                             else ("tab:gray" if s == NAIVE else "tab:blue") for r in rs])
            m50, m90 = rp.percentile(ys, 50), rp.percentile(ys, 90)
            a.annotate(f"p50 {m50:,.0f}\np90 {m90:,.0f}", (i + 0.28, m50), fontsize=7,
                       color="tab:red", va="center")
        a.set_xticks(range(1, len(order) + 1), [LABELS.get(s, s) for s in order], fontsize=8)
        a.set_ylim(0, max(max(x) for x in data) * 1.12)
        a.set_ylabel(ylabel)
        a.set_title(f"{ttl}\n(orange dots: other processes > {NOISY_CORES} cores)", fontsize=9)
        a.grid(axis="y", alpha=0.3)

    cases = [c for c in IPERF_CASES if vals(rows, c[0], "mbit_s", "iperf")]
    for i, (series, direction, _) in enumerate(cases):
        ys = vals(rows, series, "mbit_s", "iperf")
        m = sum(ys) / len(ys)
        col = "tab:gray" if series.startswith("ceiling") else "tab:green"
        ax2.barh(i, m, color=col, alpha=0.6)
        ax2.scatter(ys, [i] * len(ys), color="black", s=12, zorder=3)
        ax2.annotate(f" {m:,.0f}", (max(ys), i), va="center", fontsize=8)
    ax2.set_yticks(range(len(cases)), [c[1] for c in cases], fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlabel("iperf3 TCP throughput (Mbit/s; bar = mean, dots = runs)")
    ax2.set_title("throughput (gray: no VM, the ceiling)", fontsize=9)
    ax2.grid(axis="x", alpha=0.3)
    rp.save_figure(fig, path, dpi=120, title=title)
