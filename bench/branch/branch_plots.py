"""The branch benchmark's PNG plots (matplotlib).
"""

from __future__ import annotations

from pathlib import Path

import report as rp
from branch_modes import (
    BRANCH_MODES, CHAIN_TARGET, CHAIN_TARGET_DEPTH, LIVE_TARGET_MS, MODE_LABEL, MODE_STYLE,
    NAIVE_TARGET, naive_modes, source_of,
)
from branch_stats import CHAIN_STAGES, chain_stats, fmt, fmt_ms, p50, pstat, sel


def plot_lines(ax, rows, exp, xkey, xs, modes):
    for mode in modes:
        pts = []
        for x in xs:
            rs = [r for r in rows if r["experiment"] == exp and r["mode"] == mode
                  and r[xkey] == x]
            if rs:
                s = pstat(rs)
                pts.append((x, s["p50"], s["min"], s["max"], s["n"]))
        if not pts:
            continue
        color, marker, ls = MODE_STYLE[mode]
        X = [p[0] for p in pts]
        Y = [p[1] for p in pts]
        ax.errorbar(X, Y, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    color=color, marker=marker, ls=ls, capsize=3, ms=5, lw=1.5,
                    label=f"{MODE_LABEL[mode]} (p50, min–max)")
        if mode in ("live", "full", "diff", "naive"):
            for x, y, *_ in pts:
                ax.annotate(fmt_ms(y), (x, y), textcoords="offset points", xytext=(5, 4),
                            fontsize=7, color=color)


PLOT_MODES = ["naive", "naive_nolimit", "naive_clone", "naive_nolimit_clone", "full",
              "qemu_live_disk", "live", "diff", "qemu_live_shm", "stop_cont"]


def write_plots(out: Path, rows, ctx, args, title_base: str) -> list[str]:
    """Writes the PNGs; returns their names."""
    plt = rp.pyplot()

    written = []
    # 1. pause vs size
    sizes = sorted({r["size_mib"] for r in rows if r["experiment"] == "size"})
    if sizes:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 7.5),
                                      gridspec_kw={"width_ratios": [1.5, 1]})
        plot_lines(ax, rows, "size", "size_mib", sizes, PLOT_MODES)
        ax.axhline(LIVE_TARGET_MS, color="tab:blue", ls="--", lw=0.8, alpha=0.6)
        ax.annotate(f"target: live < {LIVE_TARGET_MS:.0f} ms", (sizes[0], LIVE_TARGET_MS),
                    textcoords="offset points", xytext=(0, -11), fontsize=7, color="tab:blue")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_yscale("log")
        ax.set_xlabel("guest memory (MiB), idle guest")
        ax.set_ylabel("source paused (ms, log scale; STOP→RESUME events)")
        ax.set_title("Pause of the source vs guest memory size\n(live/full: booted source; "
                     "diff: its clone from a shared base)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2)
        for mode in BRANCH_MODES:
            color, marker, _ = MODE_STYLE[mode]
            for base, bls in zip(naive_modes(mode), ("-", "--")):
                X, Y = [], []
                for s in sizes:
                    v = rp.ratio(p50(sel(rows, "size", base, s)), p50(sel(rows, "size", mode, s)))
                    if v == v:
                        X.append(s)
                        Y.append(v)
                if X:
                    ax2.plot(X, Y, color=color, marker=marker, ls=bls,
                             label=f"{mode}: {base} p50 ÷ {mode} p50")
        ax2.axhline(NAIVE_TARGET, color="black", ls=":", lw=1)
        ax2.annotate(f"target ≥ {NAIVE_TARGET:.0f}× at 4096 MiB", (sizes[0], NAIVE_TARGET),
                     textcoords="offset points", xytext=(0, 4), fontsize=7)
        ax2.axhline(1, color="gray", lw=0.6)
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(sizes, [str(s) for s in sizes])
        ax2.set_yscale("log")
        ax2.set_xlabel("guest memory (MiB)")
        ax2.set_ylabel("× shorter than the naive pause (log)")
        ax2.set_title("Pause ratio naive ÷ forkvm (naive on the same source)", fontsize=10)
        ax2.grid(alpha=0.3, which="both")
        ax2.legend(fontsize=7)
        rp.save_figure(fig, out / "pause_vs_size.png", dpi=100,
                       title=title_base + f" — N={args.runs} branches per mode and size")
        written.append("pause_vs_size.png")

    # 2. pause vs dirty
    dirties = sorted({r["dirty_mib"] for r in rows if r["experiment"] == "dirty"})
    if dirties:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 7.5),
                                      gridspec_kw={"width_ratios": [1.5, 1]})
        plot_lines(ax, rows, "dirty", "dirty_mib", dirties, PLOT_MODES[:-1])
        ax.axhline(LIVE_TARGET_MS, color="tab:blue", ls="--", lw=0.8, alpha=0.6)
        ax.set_yscale("log")
        ax.set_xticks(dirties, [str(x) for x in dirties])
        ax.set_xlabel(f"memory dirtied and held resident before the branch (MiB), "
                      f"{args.dirty_memory} MiB guest")
        ax.set_ylabel("source paused (ms, log scale)")
        ax.set_title("Pause vs memory dirtied before the branch\n(diff: dirtied in the clone, "
                     "after its spawn)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2)
        # where the pauses go: live reference split, diff's stages
        w = 0.25
        for j, where in enumerate(("disk", "shm")):
            a_, b_ = [], []
            for x in dirties:
                rs = sel(rows, "dirty", f"qemu_live_{where}", dirty=x)
                a_.append(p50(rs, "stop_to_completed_ms"))
                b_.append(p50(rs, "completed_to_resume_ms"))
            idx = [i + (j - 1) * w for i in range(len(dirties))]
            ax2.bar(idx, a_, w, color=MODE_STYLE[f"qemu_live_{where}"][0],
                    label=f"bench live save, file on {'disk' if where == 'disk' else '/dev/shm'}:"
                          " STOP → `completed` visible")
            ax2.bar(idx, b_, w, bottom=a_, color="lightgray", edgecolor="gray",
                    label="`completed` → RESUME (cont)" if j == 0 else None)
        d_ss, d_cm, d_rest = [], [], []
        for x in dirties:
            rs = sel(rows, "dirty", "diff", dirty=x)
            d_ss.append(p50(rs, "save_state_ms"))
            d_cm.append(p50(rs, "copy_memory_ms"))
            d_rest.append(max(0.0, p50(rs) - (d_ss[-1] if d_ss[-1] == d_ss[-1] else 0)
                              - (d_cm[-1] if d_cm[-1] == d_cm[-1] else 0)))
        idx = [i + w for i in range(len(dirties))]
        ax2.bar(idx, d_cm, w, color=MODE_STYLE["diff"][0],
                label="diff: pagemap scan + reading private pages")
        ax2.bar(idx, d_ss, w, bottom=d_cm, color="tan", label="diff: device state")
        ax2.bar(idx, d_rest, w, bottom=[a + b for a, b in zip(d_cm, d_ss)], color="wheat",
                edgecolor="gray", label="diff: rest (disk freeze, stop/cont)")
        ax2.plot(range(len(dirties)), [p50(sel(rows, "dirty", "live", dirty=x))
                                       for x in dirties], "o-", color="tab:blue",
                 label="forkvm live pause p50")
        ax2.set_xticks(range(len(dirties)), [str(x) for x in dirties])
        ax2.set_xlabel("dirtied MiB")
        ax2.set_ylabel("ms")
        ax2.set_title("Where the pauses go (p50)", fontsize=10)
        ax2.grid(axis="y", alpha=0.3)
        ax2.legend(fontsize=7)
        rp.save_figure(fig, out / "pause_vs_dirty.png", dpi=100,
                       title=title_base + f" — {args.dirty_runs} branches per mode and D")
        written.append("pause_vs_dirty.png")

    # 3. consecutive
    cons = [r for r in rows if r["experiment"] == "consecutive" and r["mode"] in BRANCH_MODES]
    if cons:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
        for mode in BRANCH_MODES:
            rs = sorted(sel(rows, "consecutive", mode), key=lambda r: r["run"])
            if not rs:
                continue
            color, marker, _ = MODE_STYLE[mode]
            ax.plot([r["run"] for r in rs], [r["pause_ms"] for r in rs], marker=marker,
                    color=color, label=f"{mode} ({source_of(mode)} source): pause")
            ax2.plot([r["run"] for r in rs], [r["branch_total_ms"] / 1000 for r in rs],
                     marker=marker, color=color, label=f"{mode}: branch total_ms")
        ax.set_yscale("log")
        ax.axhline(LIVE_TARGET_MS, color="tab:blue", ls="--", lw=0.8, alpha=0.6)
        ax.set_xlabel("branch # (back to back, same source)")
        ax.set_xticks(range(1, args.consecutive + 1))
        ax2.set_xticks(range(1, args.consecutive + 1))
        ax.set_ylabel("source paused (ms, log)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        ax.set_title(f"{args.consecutive} consecutive branches of one {args.consecutive_memory} "
                     "MiB source (counter loop running)", fontsize=10)
        ax2.set_xlabel("branch #")
        ax2.set_ylabel("branch total (s)")
        ax2.set_ylim(bottom=0)
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
        txt = "; ".join(f"{ch['mode']}: counter {ch['values'][1]}→{ch['values'][2]}→"
                        f"{ch['values'][3]} ({'advancing' if ch['ok'] else 'STUCK'})"
                        for ch in ctx.get("counter_checks", []))
        ax2.set_title("Time per branch (server total_ms)\n" + txt, fontsize=8)
        rp.save_figure(fig, out / "consecutive.png", dpi=100, title=title_base)
        written.append("consecutive.png")

    # 4. spawn vs chain depth
    chain = ctx.get("chain") or {}
    snaps = [s for s in chain.get("snapshots", [])
             if any(r["experiment"] == "chain" and r["mode"] == s["label"] for r in rows)]
    if snaps:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 6),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
        X = list(range(len(snaps)))
        bottom = [0.0] * len(snaps)
        colors = ["tab:gray", "tab:brown", "tab:blue", "tab:green"]
        for (key, name), col in zip(CHAIN_STAGES, colors):
            vals = [chain_stats(rows, s["label"], key)["p50"] for s in snaps]
            vals = [v if v == v else 0.0 for v in vals]
            ax.bar(X, vals, 0.6, bottom=bottom, color=col, alpha=0.8, label=f"{name} p50")
            bottom = [b + v for b, v in zip(bottom, vals)]
        st = [chain_stats(rows, s["label"]) for s in snaps]
        ax.errorbar(X, [s["p50"] for s in st],
                    yerr=[[s["p50"] - s["min"] for s in st], [s["max"] - s["p50"] for s in st]],
                    fmt="ko", capsize=4, label="total_ms p50 (min–max)")
        ax.scatter(X, [s["p90"] for s in st], marker="_", s=250, color="black", label="p90")
        for x, s in zip(X, st):
            ax.annotate(fmt_ms(s["p50"]), (x, s["p50"]), textcoords="offset points",
                        xytext=(8, 4), fontsize=8)
        ticks = []
        for s in snaps:
            if s["label"] == "flat":
                ticks.append(f"flat\n(flatten of depth {args.chain_depth})")
            elif s["kind"] == "diff":
                ticks.append(f"{s['label']}\n(diff, +{fmt(s['memory_diff_mib'], 0)} MiB)")
            else:
                ticks.append(f"{s['label']}\n(base, {s['kind']})")
        ax.set_xticks(X, ticks, fontsize=8)
        ax.set_ylabel("spawn time (ms; server total_ms)")
        top = max((s["max"] for s in st if s["max"] == s["max"]), default=1.0)
        ax.set_ylim(0, top * 1.45)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        ax.set_title(f"Spawn from a diff chain vs its depth ({args.chain_memory} MiB guest, "
                     f"{args.chain_dirty} MiB + a file changed per link; no pool)", fontsize=10)
        flat = chain_stats(rows, "flat")["p50"]
        ys = [rp.ratio(s["p50"], flat) for s in st]
        ax2.bar(X, [y if y == y else 0 for y in ys], 0.6,
                color=["tab:brown" if s["kind"] == "diff" else "tab:gray" for s in snaps])
        for x, y in zip(X, ys):
            if y == y:
                ax2.annotate(f"{y:.2f}×", (x, y), textcoords="offset points", xytext=(-10, 3),
                             fontsize=8)
        ax2.axhline(CHAIN_TARGET, color="black", ls=":", lw=1)
        ax2.annotate(f"target: depth {CHAIN_TARGET_DEPTH} ≤ {CHAIN_TARGET}× flat",
                     (X[-1] + 0.4, CHAIN_TARGET), textcoords="offset points", xytext=(0, 4),
                     fontsize=7, ha="right")
        ax2.axhline(1, color="gray", lw=0.6)
        ax2.set_xticks(X, [s["label"] for s in snaps], fontsize=8)
        ax2.set_ylabel("total_ms p50 ÷ flat p50")
        ax2.set_title("Spawn time relative to the flattened snapshot", fontsize=10)
        ax2.grid(axis="y", alpha=0.3)
        rp.save_figure(fig, out / "spawn_vs_depth.png", dpi=100,
                       title=title_base + f" — {args.chain_runs} spawns per snapshot, "
                       "order rotated")
        written.append("spawn_vs_depth.png")
    return written
