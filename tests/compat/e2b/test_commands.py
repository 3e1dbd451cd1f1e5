"""Commands through the unmodified ``e2b`` SDK: envd's ``process.Process``
service as forkvm serves it (foreground and background runs, stdin, connect,
list, kill, env vars, cwd, users, exit codes)."""

from __future__ import annotations

import time

import pytest
from e2b import CommandExitException


def _pids(sandbox) -> list[int]:
    return [p.pid for p in sandbox.commands.list()]


def _wait_gone(sandbox, pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while pid in _pids(sandbox):
        assert time.monotonic() < deadline, f"process {pid} is still listed"
        time.sleep(0.3)


def test_foreground_run_streams_stdout_and_stderr_to_callbacks(sandbox):
    out: list[str] = []
    err: list[str] = []
    r = sandbox.commands.run(
        "echo hello; echo oops >&2; echo bye", on_stdout=out.append, on_stderr=err.append
    )
    assert r.exit_code == 0
    assert r.stdout == "hello\nbye\n"
    assert r.stderr == "oops\n"
    assert "".join(out) == "hello\nbye\n"
    assert "".join(err) == "oops\n"


def test_nonzero_exit_raises_command_exit_exception(sandbox):
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo partial; echo why >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n"
    assert e.value.stderr == "why\n"


def test_env_vars_and_cwd(sandbox):
    r = sandbox.commands.run('echo "$FOO-$BAR"; pwd', envs={"FOO": "foo", "BAR": "b a r"}, cwd="/tmp")
    assert r.stdout == "foo-b a r\n/tmp\n"
    # A relative cwd is under the user's home.
    sandbox.commands.run("mkdir -p /home/user/sub")
    assert sandbox.commands.run("pwd", cwd="sub").stdout == "/home/user/sub\n"


def test_users(sandbox):
    # No user named: envd's default, here the image's User (E2B's `user`).
    assert sandbox.commands.run("whoami").stdout == "user\n"
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"


def test_background_then_kill(sandbox):
    h = sandbox.commands.run("sleep 600", background=True)
    assert h.pid in _pids(sandbox)
    assert h.kill() is True
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code != 0
    _wait_gone(sandbox, h.pid)
    # Killing what is gone says so instead of raising.
    assert sandbox.commands.kill(h.pid) is False


def test_send_stdin_and_close_stdin(sandbox):
    h = sandbox.commands.run("read line; echo got:$line", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "hi there\n")
    assert h.wait().stdout == "got:hi there\n"

    cat = sandbox.commands.run("cat", background=True, stdin=True)
    cat.send_stdin("abc")
    cat.send_stdin(b"def")
    cat.close_stdin()
    assert cat.wait().stdout == "abcdef"


def test_stream_input(sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(h.pid, ["one ", b"two ", "three"])
    h.close_stdin()
    assert h.wait().stdout == "one two three"


def test_connect_to_a_running_command(sandbox):
    h = sandbox.commands.run("echo first; sleep 3; echo second", background=True)
    time.sleep(1)
    h.disconnect()
    again = sandbox.commands.connect(h.pid)
    r = again.wait()
    # The attach replays what was printed before it, then follows live.
    assert r.stdout == "first\nsecond\n"


def test_list_shows_running_commands(sandbox):
    h = sandbox.commands.run("sleep 600", background=True, envs={"MARK": "listed"}, cwd="/tmp")
    try:
        [p] = [p for p in sandbox.commands.list() if p.pid == h.pid]
        assert p.cmd == "/bin/bash"
        assert p.args == ["-l", "-c", "sleep 600"]
        assert p.envs.get("MARK") == "listed"
        assert p.cwd == "/tmp"
    finally:
        h.kill()
