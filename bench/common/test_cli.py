"""Unit tests of the command-line and run-loop pieces every harness shares
(report.py): the common options, list options, the `__main__` entry's exit
codes and signal handling, and the jailed/unjailed segments. No daemon, no VM.

Run: .venv/bin/python -m pytest bench/common/test_cli.py
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402


def test_add_common_args_defaults():
    ap = argparse.ArgumentParser()
    rp.add_common_args(ap, HERE.parent / "fanout")
    a = ap.parse_args([])
    assert a.out == str(HERE.parent / "fanout" / "results") and a.wait_quiet == 0
    assert a.binary == str(HERE.parents[1] / "target" / "release" / "forkvm")
    assert ap.parse_args(["--wait-quiet", "30"]).wait_quiet == 30.0


def test_int_list_sorts_and_drops_repeats_and_blanks():
    ap = argparse.ArgumentParser()
    assert rp.int_list("4096, 512,,512,0", "--sizes", ap) == [0, 512, 4096]
    assert rp.int_list("", "--sizes", ap) == []


@pytest.mark.parametrize("value,message", [("1,x", "comma-separated list of integers"),
                                           ("3,-1", "non-negative integers")])
def test_int_list_rejects_bad_values_through_the_parser(value, message, capsys):
    ap = argparse.ArgumentParser(prog="bench_t")
    with pytest.raises(SystemExit) as e:
        rp.int_list(value, "--sizes", ap)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--sizes takes" in err and message in err


@pytest.mark.parametrize("total,parts,want", [(20, 2, [10, 10]), (5, 2, [3, 2]), (3, 2, [2, 1]),
                                              (1, 2, [1, 0]), (7, 3, [3, 2, 2]), (0, 4, [0] * 4)])
def test_split_runs(total, parts, want):
    assert rp.split_runs(total, parts) == want
    assert sum(rp.split_runs(total, parts)) == total


def test_jail_order_is_abba_and_env_always_explicit():
    assert rp.JAIL_ORDER == [rp.JAILED, rp.UNJAILED, rp.UNJAILED, rp.JAILED]
    assert rp.jail_env(rp.JAILED) == {"FORKVM_NO_JAIL": "0"}
    assert rp.jail_env(rp.UNJAILED) == {"FORKVM_NO_JAIL": "1"}


def test_check_side_uid_fails_a_mislabelled_process():
    me = {"id": "sb-t", "pid": os.getpid()}
    right, wrong = (rp.UNJAILED, rp.JAILED) if os.getuid() == 0 else (rp.JAILED, rp.UNJAILED)
    assert rp.check_side_uid(right, me) == os.getuid() == rp.process_uid(os.getpid())
    with pytest.raises(fb.BenchError, match="the jail setting is not what was asked"):
        rp.check_side_uid(wrong, me)


def test_process_uid_of_a_gone_pid_is_an_error():
    with pytest.raises(OSError):
        rp.process_uid(2**22 + 7)  # above pid_max's default limit


def test_run_main_rejects_an_unknown_signal_mode():
    with pytest.raises(ValueError, match="on_signal"):
        rp.run_main("bench_t", lambda: 0, on_signal="ignore")


def run_harness(tmp_path: Path, body: str, on_signal: str | None, sig=None):
    """A throwaway harness whose main() runs `body`, entered through
    run_main; with `sig`, the signal is sent once main() says it started."""
    script = tmp_path / "bench_t.py"
    lines = ["import sys, time", f"sys.path.insert(0, {str(HERE)!r})",
             "import forkvm_bench as fb", "import report as rp", "", "def main():"]
    lines += ["    " + line for line in textwrap.dedent(body).strip("\n").splitlines()]
    lines += ["", f"rp.run_main('bench_t', main, on_signal={on_signal!r})"]
    script.write_text("\n".join(lines) + "\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if sig is not None:
        assert p.stdout.readline() == "started\n"
        p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


# A main() that says it started, waits, and says when its cleanup ran.
SLEEPER = """
    try:
        print("started", flush=True)
        time.sleep(30)  # the signal ends this long before the test's 60 s
    finally:
        print("cleaned up", flush=True)
"""


def test_run_main_exits_with_main_status(tmp_path):
    assert run_harness(tmp_path, "return 3", None)[0] == 3


def test_run_main_turns_a_bench_error_into_one_line_and_exit_1(tmp_path):
    code, _, err = run_harness(tmp_path, "raise fb.BenchError('no /dev/kvm')", "interrupt")
    assert code == 1 and err == "bench_t: error: no /dev/kvm\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_main_interrupt_unwinds_through_finally(tmp_path, sig):
    code, out, err = run_harness(tmp_path, SLEEPER, "interrupt", sig)
    assert (code, out, err) == (130, "cleaned up\n", "bench_t: interrupted\n")


def test_run_main_exit_mode_unwinds_sigterm_as_143(tmp_path):
    code, out, err = run_harness(tmp_path, SLEEPER, "exit", signal.SIGTERM)
    assert (code, out, err) == (143, "cleaned up\n", "")


def test_timed_run_returns_wall_time_and_both_streams():
    ms, out, err = rp.timed_run(["sh", "-c", "echo out; echo err >&2", Path("x")])
    assert out == "out\n" and err == "err\n" and 0 <= ms < 30_000


def test_timed_run_failure_names_the_command_and_its_last_lines():
    script = "for i in $(seq 1 20); do echo line$i; done; exit 3"
    with pytest.raises(fb.BenchError) as e:
        rp.timed_run(["sh", "-c", script])
    msg = str(e.value)
    assert "exited with 3" in msg and "line20" in msg and "line6\n" in msg
    assert "line5\n" not in msg  # only the last 15 lines


def test_timed_run_timeout_is_a_bench_error():
    with pytest.raises(fb.BenchError, match="took more than 0 s"):
        rp.timed_run(["sleep", "5"], timeout=0.2)
