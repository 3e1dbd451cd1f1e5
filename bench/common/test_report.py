"""Unit tests of the shared report tail (report.py) and of the boot loop's
report (bench/boot/boot_loop.py), on made-up rows: no daemon, no VM.

Run: .venv/bin/python -m pytest bench/common/test_report.py
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "boot"))

import boot_loop  # noqa: E402
import report as rp  # noqa: E402

MACHINE = {"cpu_model": "Test CPU", "cpu_detail": "family 6", "cores": 2, "mem_gib": 3.5,
           "kernel": "6.1.0-test", "loadavg": (0.5, 0.25, 0.125)}
INFO = {"version": "9.9.9", "accel": {"kind": "tcg", "reason": "no /dev/kvm"},
        "qemu": {"version": "8.2.2", "path": "/usr/bin/qemu-system-x86_64"}}


def test_percentile_interpolates_between_ranks():
    assert rp.percentile([10, 20, 30, 40], 50) == 25
    assert rp.percentile([40, 10, 30, 20], 90) == 37  # order does not matter
    assert rp.percentile([7], 90) == 7
    assert math.isnan(rp.percentile([], 50))


def test_summarize_leaves_out_missing_values():
    s = rp.summarize([3, None, float("nan"), 1, 2])
    assert (s["n"], s["min"], s["p50"], s["max"], s["mean"]) == (3, 1, 2, 3, 2)
    assert rp.summarize([None])["n"] == 0


def test_case_stats_puts_the_total_first_and_skips_what_is_empty():
    rows = [{"case": "a", "total_ms": 10.0, "x_ms": 1.0},
            {"case": "a", "total_ms": 30.0, "x_ms": 3.0, "y_ms": None},
            {"case": "b", "total_ms": 5.0}]
    st = rp.case_stats(rows, [("a", ["x_ms", "y_ms"]), ("b", ["x_ms"]), ("c", ["x_ms"])])
    assert [(c, k) for c, k, _ in st] == [("a", "total_ms"), ("a", "x_ms"), ("b", "total_ms")]
    assert st[0][2]["p50"] == 20
    skipped = rp.case_stats(rows, [("a", ["x_ms"])], skip=lambda c, s: s == "x_ms")
    assert [(c, k) for c, k, _ in skipped] == [("a", "total_ms")]


def test_ratio_and_fmt_handle_missing_figures():
    assert rp.ratio(6, 3) == 2
    assert math.isnan(rp.ratio(1, 0)) and math.isnan(rp.ratio(None, 2))
    assert rp.fmt(1234.5) == "1,234" and rp.fmt(1.25, 1) == "1.2"
    assert rp.fmt(None) == "–" and rp.fmt(float("nan")) == "–"


def test_write_csv_keeps_the_columns_and_rounds_floats(tmp_path):
    p = tmp_path / "x.csv"
    rp.write_csv(p, [{"a": 1.23456, "b": "text, with comma", "extra": 1}, {"a": 2}],
                 ["a", "b"])
    with open(p, newline="") as f:
        got = list(csv.reader(f))
    assert got == [["a", "b"], ["1.235", "text, with comma"], ["2", ""]]


def test_header_lines_name_the_machine_accelerator_and_qemu():
    started = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    assert rp.date_line(started, 95) == "- Date: 2024-05-01 12:00:00 UTC (run took 95 s)"
    assert rp.date_line(started, 90, minutes=True).endswith("(run took 1.5 min)")
    assert rp.forkvm_line(INFO, "abc123", " (x)") == "- forkvm: 9.9.9, git abc123 (x)"
    assert rp.machine_text(MACHINE) == "Test CPU (family 6), 2 cores, 3.5 GiB RAM"
    assert rp.loadavg_text(MACHINE) == "0.50 / 0.25 / 0.12"
    assert rp.accel_line(INFO) == "- Accelerator: **tcg** — no /dev/kvm"
    assert rp.qemu_text(INFO) == "8.2.2 (/usr/bin/qemu-system-x86_64)"
    assert rp.qemu_text({}) == "? (?)"


def test_header_lines_are_the_five_bullets_in_order():
    started = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    assert rp.header_lines(INFO, MACHINE, started, 90, "abc123", " (release)", minutes=True) == [
        "- Date: 2024-05-01 12:00:00 UTC (run took 1.5 min)",
        "- forkvm: 9.9.9, git abc123 (release)",
        "- Machine: Test CPU (family 6), 2 cores, 3.5 GiB RAM; Linux 6.1.0-test; load average "
        "at start 0.50 / 0.25 / 0.12",
        "- Accelerator: **tcg** — no /dev/kvm",
        "- QEMU: 8.2.2 (/usr/bin/qemu-system-x86_64)",
    ]
    assert rp.header_lines(INFO, MACHINE, started, 95, "r")[:2] == [
        "- Date: 2024-05-01 12:00:00 UTC (run took 95 s)", "- forkvm: 9.9.9, git r"]


def test_smoke_banner_and_other_qemu_lines():
    assert rp.smoke_banner("N=2 < 10", "bash x.sh") == [
        "> **SMOKE RUN** (N=2 < 10): not a valid result; re-run with `bash x.sh` for real "
        "figures.", ""]
    assert rp.smoke_banner("why", None)[0] == "> **SMOKE RUN** (why): not a valid result."
    assert rp.other_qemu_lines({}, 0, 4)[0].startswith("- No other QEMU process")
    lines = rp.other_qemu_lines({42: "qemu-system-x86_64 -name other"}, 3, 4)
    assert "3 of the 4 measured runs" in lines[0]
    assert lines[1] == "  - pid 42: `qemu-system-x86_64 -name other`"


def test_stats_table_and_text_show_the_same_figures():
    st = rp.case_stats([{"case": "c", "total_ms": v, "s_ms": v / 2} for v in (100.0, 300.0)],
                       [("c", ["s_ms"])])
    md = rp.stats_table(st, with_n=True)
    assert md[0] == "| case | stage | n | min | p50 | p90 | max |"
    assert md[2] == "| c | **total (client wall)** | 2 | 100 | **200** | **280** | 300 |"
    assert md[3] == "| c | s | 2 | 50 | 100 | 140 | 150 |"
    assert len(rp.stats_table(st)[2].split("|")) == len(md[2].split("|")) - 1
    text = rp.stats_text(st)
    assert text[1].split() == ["c", "total", "100", "200", "280", "300"]


def test_save_figure_writes_a_png(tmp_path):
    plt = rp.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    rp.save_figure(fig, tmp_path / "f.png", title="t")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the boot loop's report --

def loop_rows():
    ok = [{"attempt": i, "started_at": "t", "ok": 1, "failed_step": "", "error": "",
           "total_ms": 1000.0 * i, "boot_ms": 900.0 * i, "exec_ms": 10.0} for i in (1, 2, 4)]
    bad = {"attempt": 3, "started_at": "t", "ok": 0, "failed_step": "spawn",
           "error": "ApiError: the VM died while booting: x. Last console lines:\nKernel panic"}
    return ok[:2] + [bad] + ok[2:]


def test_loop_summary_counts_and_takes_percentiles_of_the_boots_that_worked():
    s = boot_loop.loop_summary(loop_rows())
    assert (s["attempted"], s["ok"], s["failed"]) == (4, 3, 1)
    assert s["total"]["n"] == 3 and s["total"]["p50"] == 2000
    assert boot_loop.loop_summary([])["failed"] == 0


def test_loop_progress_lines():
    rows = loop_rows()
    assert boot_loop.progress(rows[0], 4, 1, 0).startswith("[boot 1/4] ok")
    line = boot_loop.progress(rows[2], 4, 2, 1)
    assert "FAIL at spawn: ApiError: the VM died while booting" in line
    assert "Kernel panic" not in line and line.endswith("[2 ok, 1 failed]")


def test_loop_results_report_failures_with_their_message(tmp_path):
    args = SimpleNamespace(smoke=True, memory=512)
    ctx = {"info": INFO, "machine": MACHINE, "revision": "abc123", "elapsed": 60.0,
           "started": dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc),
           "command": "bash bench/boot/run.sh --loop 4 --smoke"}
    boot_loop.write_loop_results(tmp_path / "LOOP.md", loop_rows(), ctx, args)
    text = (tmp_path / "LOOP.md").read_text()
    assert text.startswith("> **SMOKE RUN** (4 boots < 200)")
    assert "**FAIL**: 4 attempted, **3 ok, 1 failed**" in text
    assert "- Accelerator: **tcg**" in text and "8.2.2" in text and "git abc123" in text
    assert "| **POST → 201 (client wall)** | 3 | 1,000 | 2,000 |" in text
    assert "### Attempt 3 (t), at spawn" in text and "Kernel panic" in text
    boot_loop.write_loop_plot(tmp_path / "loop.png", loop_rows(), "t")
    assert (tmp_path / "loop.png").stat().st_size > 0


def test_loop_results_pass_only_with_enough_boots_and_no_failure(tmp_path):
    ctx = {"info": INFO, "machine": MACHINE, "revision": "r", "elapsed": 1.0,
           "started": dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), "command": "c"}
    ok = [r for r in loop_rows() if r["ok"]]
    boot_loop.write_loop_results(tmp_path / "a.md", ok, ctx, SimpleNamespace(smoke=True,
                                                                             memory=512))
    assert "**no verdict (too few boots)**" in (tmp_path / "a.md").read_text()
    many = [dict(ok[0], attempt=i) for i in range(1, boot_loop.LOOP_MIN + 1)]
    boot_loop.write_loop_results(tmp_path / "b.md", many, ctx, SimpleNamespace(smoke=False,
                                                                               memory=512))
    text = (tmp_path / "b.md").read_text()
    assert text.startswith("# Boot loop") and "**PASS**: 200 attempted" in text
    assert "## Failures\n\nNone." in text


@pytest.mark.parametrize("bench", ["boot", "spawn", "branch", "load", "network", "chain", "images",
                                   "jail", "volumes", "fanout", "branchpoint", "registry",
                                   "cluster", "timetravel"])
def test_every_bench_loads(bench):
    # A change to the shared code must not leave a harness that fails to load.
    import importlib.util
    path = Path(__file__).resolve().parents[1] / bench / f"bench_{bench}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{bench}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert callable(mod.main)


def test_no_bench_source_is_over_800_lines():
    # Big harnesses are split into sibling modules by what they hold
    # (docs/benchmarks.md); the shared pieces live here in bench/common.
    bench = Path(__file__).resolve().parents[1]
    long = {str(p.relative_to(bench)): n for p in bench.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 800}
    assert not long, f"split these into modules of at most 800 lines: {long}"


def test_jail_ratio_table_rows_and_naive_column():
    def summ(p50, p90):
        return {"n": 2, "p50": p50, "p90": p90}

    ratios = [{"label": "spawn", rp.JAILED: summ(12.0, 13.5), rp.UNJAILED: summ(10.0, 11.0),
               "naive": summ(500.0, 520.0), "ratio_p50": 1.2, "ratio_p90": 13.5 / 11,
               "jailed_vs_naive": 0.024, "unjailed_vs_naive": 0.02}]
    L = rp.jail_ratio_table(ratios, "naive p50", lambda r: rp.fmt(r["naive"]["p50"]),
                            lambda v: rp.fmt(v, 1), lambda v: f"{v:.3f}×")
    assert L[0].startswith("| metric | jailed p50 | jailed p90 | unjailed p50 |")
    assert "| naive p50 | jailed ÷ naive | unjailed ÷ naive |" in L[0]
    assert L[1].count("|") == L[0].count("|") == 11
    assert L[2] == ("| spawn | 12.0 | 13.5 | 10.0 | 11.0 | **1.200×** | 1.227× | 500 | "
                    "0.024× | 0.020× |")
    assert rp.jail_ratio_table([], "naive p50", str, str, str) == L[:2]
