"""RESULTS.md and ui.png of the dashboard render benchmark, from the ui.csv and
meta.json that bench_ui.mjs wrote (see run.sh for what is measured)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import report  # noqa: E402  (bench/common, put on the path just above)

METRICS = [
    ("tree_ms", "tree laid out (navigation start to every node in the DOM and laid out)"),
    ("dom_loaded_ms", "page and script loaded (navigation start to DOMContentLoaded end)"),
    ("ready_ms", "event stream ready (navigation start to its `ready` message)"),
    ("lists_ms", "lists loaded (navigation start to the app's three lists parsed)"),
    ("render_ms", "render (lists parsed to tree laid out: tree model, layout, DOM)"),
    ("layout_ms", "of which the layout (positions of every box and edge)"),
    ("baseline_ms", "baseline: fetch + parse the three lists in the loaded page"),
    ("ratio", "tree ÷ baseline"),
]


def load(out: Path):
    with open(out / "ui.csv", newline="") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    meta = json.loads((out / "meta.json").read_text())
    return rows, meta


def plot(rows, path: Path, title: str) -> None:
    plt = report.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    runs = [int(r["run"]) for r in rows]
    a.plot(runs, [r["tree_ms"] for r in rows], "o-", label="tree laid out")
    a.plot(runs, [r["lists_ms"] for r in rows], "s--", label="lists loaded")
    a.plot(runs, [r["baseline_ms"] for r in rows], "^-", label="baseline (fetch + parse lists)")
    a.set_xlabel("run")
    a.set_ylabel("ms from navigation start (baseline: its own duration)")
    a.set_ylim(bottom=0)
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    st = {k: report.summarize(r[k] for r in rows) for k, _ in METRICS}
    parts = [("page loaded", st["dom_loaded_ms"]["p50"]),
             ("to stream ready", st["ready_ms"]["p50"] - st["dom_loaded_ms"]["p50"]),
             ("to lists loaded", st["lists_ms"]["p50"] - st["ready_ms"]["p50"]),
             ("render", st["render_ms"]["p50"])]
    left = 0.0
    for name, v in parts:
        b.barh(["tree p50"], [v], left=left, label=name)
        left += v
    b.barh(["baseline p50"], [st["baseline_ms"]["p50"]], color="tab:green", label="baseline")
    b.set_xlabel("ms")
    b.legend(fontsize=8)
    b.grid(alpha=0.3, axis="x")
    report.save_figure(fig, path, title=title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="the directory bench_ui.mjs wrote")
    args = ap.parse_args()
    rows, meta = load(args.out)
    tree = meta["tree"]
    info = meta["info"]
    m = report.machine_info()
    st = {k: report.summarize(r[k] for r in rows) for k, _ in METRICS}
    nodes = tree["total"]
    title = f"forkvm dashboard: {nodes}-node tree in headless Chromium, {len(rows)} runs"
    plot(rows, args.out / "ui.png", title)

    started = datetime.fromisoformat(meta["started"].replace("Z", "+00:00"))
    L = [f"# Dashboard: time to show a {nodes}-node branch tree", ""]
    if meta["smoke"]:
        L += report.smoke_banner("fewer nodes or runs than the bench's minimum",
                                 "bash bench/ui/run.sh")
    L += [
        report.date_line(started, meta["elapsed_s"]),
        report.forkvm_line(info, report.git_revision()),
        f"- Machine: {report.machine_text(m)}; Linux {m['kernel']}; load average at the end "
        f"{report.loadavg_text(m)}",
        report.accel_line(info),
        f"- QEMU: {report.qemu_text(info)}",
        f"- Browser: Chromium {meta['chromium']} (Debian), headless, through playwright-core; "
        "viewport 1440×900; a fresh context (cold cache, new login) per run",
        f"- Tree: {tree['images']} image, {tree['snapshots']} snapshots "
        f"({', '.join(f'{v} {k}' for k, v in sorted(tree['kinds'].items()))}; "
        f"{tree['branch_points']} branch points, {tree['flattened']} flattened), "
        f"{tree['sandboxes']} sandboxes ({meta['sources']} sources spawned from the image, "
        f"{meta['children_per_source']} children each); built through the API in "
        f"{tree['build_s']:.0f} s",
        f"- Lists fetched: {report.fmt(rows[0]['list_bytes'] / 1024)} KiB of JSON",
        "",
        "| measure | n | min | p50 | p90 | max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k, label in METRICS:
        s = st[k]
        d = 2 if k == "ratio" else 0
        unit = "×" if k == "ratio" else " ms"
        b = "**" if k in ("tree_ms", "ratio") else ""
        L.append(f"| {label} | {s['n']} | {report.fmt(s['min'], d)}{unit} | "
                 f"{b}{report.fmt(s['p50'], d)}{unit}{b} | {b}{report.fmt(s['p90'], d)}{unit}{b} | "
                 f"{report.fmt(s['max'], d)}{unit} |")
    L += [
        "",
        f"The dashboard shows all {nodes} nodes {report.fmt(st['tree_ms']['p50'])} ms after "
        f"navigation starts (p50; p90 {report.fmt(st['tree_ms']['p90'])} ms), "
        f"{report.fmt(st['ratio']['p50'], 1)}× the time the same page takes to fetch and parse "
        "the raw lists it draws.",
        "",
        "How it is measured: the app sets the performance mark `forkvm:tree-laid-out` (detail: "
        "the number of nodes drawn) once the tree's DOM is in place and the browser has laid it "
        "out (`offsetHeight` read in a layout effect); the run waits for the mark whose count is "
        "the whole tree and takes its time from navigation start, which includes loading the "
        "page and its script, opening the event stream, the three list requests, building the "
        "tree, its layout and the DOM. The marks `forkvm:stream-ready` and `forkvm:lists-loaded` "
        "and the measure `forkvm:layout` split it. Every box is in the DOM with its size and "
        "place; the browser skips laying out the inside of boxes off screen (CSS "
        "`content-visibility: auto`), as it would for a person looking at the page. The baseline runs "
        "next in the same page: `fetch` and `JSON.parse` of `/v1/images`, `/v1/snapshots` and "
        "`/v1/sandboxes`, all three at once, as the app requests them.",
        "",
        "Raw rows: `ui.csv`; run facts: `meta.json`; plot: `ui.png`.",
    ]
    (args.out / "RESULTS.md").write_text("\n".join(L) + "\n")
    print("\n".join(L[L.index("| measure | n | min | p50 | p90 | max |"):]))


if __name__ == "__main__":
    main()
