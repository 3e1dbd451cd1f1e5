"""The spawn benchmark's PNG plot (matplotlib).
"""

from __future__ import annotations

from pathlib import Path

import report as rp
from spawn_cases import LABELS, NAT, NOISY_CORES
from spawn_stats import p50


def write_plot(path: Path, rows, mem_rows, title: str, burst_size: int) -> None:
    from matplotlib.lines import Line2D
    plt = rp.pyplot()

    cases = ["spawn_cold_pool_off", "spawn_warm_pool", NAT, "naive_restore", f"burst{burst_size}"]
    fig = plt.figure(figsize=(18, 9.5))
    gs = fig.add_gridspec(2, 5, height_ratios=[1, 1.05])
    noisy_any = False
    for i, c in enumerate(cases):
        ax = fig.add_subplot(gs[0, i])
        rs = [r for r in rows if r["case"] == c]
        ys = [r["total_ms"] for r in rs]
        if not ys:
            ax.set_axis_off()
            continue
        ax.boxplot([ys], widths=0.5, showfliers=False,
                   medianprops={"color": "tab:red", "linewidth": 2})
        xs = [1 + (j - (len(ys) - 1) / 2) * (0.35 / max(len(ys), 1)) for j in range(len(ys))]
        noisy = [(r.get("other_cpu_cores") or 0) > NOISY_CORES for r in rs]
        noisy_any |= any(noisy)
        ax.scatter(xs, ys, s=16, alpha=0.8, zorder=3,
                   color=["tab:orange" if n else "tab:blue" for n in noisy])
        m = rp.percentile(ys, 50)
        ax.axhline(m, color="tab:red", ls=":", lw=1)
        ax.annotate(f"p50 {m:,.0f} ms", (1.3, m), va="bottom", ha="center", color="tab:red",
                    fontsize=9)
        label = LABELS.get(c) or (f"burst: {burst_size} clones in one POST\n(POST → 201, wall)")
        ax.set_xticks([1], [label], fontsize=8)
        ax.set_ylim(0, max(ys) * 1.15)
        ax.set_ylabel("wall time (ms)" if i == 0 else "")
        ax.set_title(f"{c} (N={len(ys)})", fontsize=8.5)
        ax.grid(axis="y", alpha=0.3)
    if noisy_any:
        fig.axes[0].legend(handles=[
            Line2D([], [], marker="o", ls="", color="tab:blue", label="quiet host"),
            Line2D([], [], marker="o", ls="", color="tab:orange",
                   label=f"others > {NOISY_CORES} cores"),
        ], fontsize=7, loc="lower left")

    # Memory: total vs number of VMs.
    ax = fig.add_subplot(gs[1, 0:2])
    fk = sorted((r for r in mem_rows if r["kind"] == "forkvm"), key=lambda r: r["k"])
    nv = sorted((r for r in mem_rows if r["kind"] == "naive" and r["measured"] == "yes"),
                key=lambda r: r["k"])
    ext = [r for r in mem_rows if r["kind"] == "naive" and r["measured"] != "yes"]
    gib = lambda kib: kib / 2**20  # noqa: E731
    if fk:
        ax.plot([r["k"] for r in fk], [gib(r["pss_kib"]) for r in fk], "o-", color="tab:blue",
                label="forkvm clones: Σ PSS")
        for r in fk:
            ax.annotate(f"{gib(r['pss_kib']):.2f} GiB", (r["k"], gib(r["pss_kib"])),
                        textcoords="offset points", xytext=(4, -12), fontsize=8, color="tab:blue")
    if nv:
        ax.plot([r["k"] for r in nv], [gib(r["total_kib"]) for r in nv], "s-", color="tab:red",
                label="naive copies: Σ (PSS − shmem) + RAM files")
        for r in nv:
            ax.annotate(f"{gib(r['total_kib']):.1f} GiB", (r["k"], gib(r["total_kib"])),
                        textcoords="offset points", xytext=(-6, 8), ha="right", fontsize=8,
                        color="tab:red")
    if ext and nv:
        e = ext[0]
        ax.plot([nv[-1]["k"], e["k"]], [gib(nv[-1]["total_kib"]), gib(e["total_kib"])], "s--",
                color="tab:red", mfc="white", markevery=[1],
                label="naive copies, extrapolated (not enough RAM)")
        ax.annotate(f"{gib(e['total_kib']):.1f} GiB (extrap.)", (e["k"], gib(e["total_kib"])),
                    textcoords="offset points", xytext=(-40, 6), fontsize=8, color="tab:red")
    ks = sorted({r["k"] for r in mem_rows})
    if ks:
        per_vm = mem_rows[0]["theoretical_kib"] / mem_rows[0]["k"]
        ax.plot([0] + ks, [0] + [gib(k * per_vm) for k in ks], ":", color="gray",
                label="K × guest RAM (theoretical)")
    ax.set_xlabel("number of VMs (K)")
    ax.set_ylabel("memory (GiB)")
    ax.set_title("Memory of K idle VMs (after the idle period)", fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")

    # Stage p50s, stacked.
    ax2 = fig.add_subplot(gs[1, 2:5])
    stacks = [
        ("clone, no pool", "spawn_cold_pool_off",
         [("prepare", "prepare_ms"), ("QEMU start→QMP", "qemu_start_ms"),
          ("load device state + cont", "restore_ms"),
          ("agent identity + clock", "identity_ms")]),
        ("clone, warm pool", "spawn_warm_pool",
         [("load device state + cont", "restore_ms"),
          ("agent identity + clock", "identity_ms")]),
        ("clone, warm pool,\nnat + wait", NAT,
         [("network set-up (uplink, rules)", "network_ms"),
          ("load device state + cont", "restore_ms"),
          ("agent identity + clock", "identity_ms"),
          ("network probe (ready − identity)", "probe")]),
        ("naive restore", "naive_restore",
         [("QEMU start→QMP", "qemu_start_ms"), ("load state file (all RAM)", "load_ms"),
          ("cont", "cont_ms"), ("agent ping", "agent_ms")]),
    ]
    colors = {"prepare": "tab:gray", "QEMU start→QMP": "tab:orange",
              "load device state + cont": "tab:olive", "load state file (all RAM)": "tab:green",
              "cont": "tab:purple", "agent identity + clock": "tab:cyan",
              "agent ping": "tab:blue", "network set-up (uplink, rules)": "tab:brown",
              "network probe (ready − identity)": "tab:pink"}
    seen = set()
    for i, (_, case, parts) in enumerate(stacks):
        bottom = 0.0
        for name, key in parts:
            if key == "probe":  # network_ready_ms runs from the resume: it includes identity
                v = rp.percentile([r["network_ready_ms"] - r["identity_ms"] for r in rows
                                   if r["case"] == case and r.get("network_ready_ms") is not None
                                   and r.get("identity_ms") is not None], 50)
            else:
                v = p50(rows, case, key)
            if v != v:
                continue
            ax2.bar(i, v, bottom=bottom, color=colors[name], width=0.6,
                    label=name if name not in seen else None)
            seen.add(name)
            bottom += v
        ax2.annotate(f"{bottom:,.0f}", (i, bottom), ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(range(len(stacks)), [s[0] for s in stacks], fontsize=9)
    ax2.set_ylabel("p50 per stage (ms)")
    ax2.set_title("Where the time goes (server/QMP stage p50s, stacked)", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(axis="y", alpha=0.3)
    rp.save_figure(fig, path, dpi=100, title=title)
