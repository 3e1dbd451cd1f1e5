"""Start a test daemon with the one launcher, ``forkvm serve --ephemeral``.

Standard library only: the SDK suite, the compatibility suites (in
``.venv-compat``) and the benchmarks import it by path. See
docs/testing.md ("The test launcher") for what the launcher does; in short:

* it makes a temporary home linking the installed artefacts, takes a network
  pool and jail uid range no other test daemon has, generates a token,
  serves 127.0.0.1 on a free port, and prints one JSON line when ready (or
  exits within its own readiness timeout);
* it ends when its stdin reaches end of file, which the kernel causes however
  this process ends (SIGKILL included), and then removes every sandbox and
  its home. So the pipe is kept open here until :meth:`Launched.stop`.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Optional, Sequence

#: Longest a stop waits for the daemon to remove its sandboxes (the
#: launcher's teardown waits up to 120 s for spawns still in flight).
STOP_WAIT = 180.0


class LaunchError(RuntimeError):
    """The launcher exited without reporting a ready daemon."""


class Launched:
    """A running ephemeral daemon; ``info`` is the launcher's JSON line."""

    def __init__(self, process: subprocess.Popen, info: dict, log: "_Log"):
        self.process = process
        self.info = info
        self._log = log

    @property
    def url(self) -> str:
        return self.info["url"]

    @property
    def token(self) -> str:
        return self.info["token"]

    @property
    def home(self) -> Path:
        return Path(self.info["home"])

    @property
    def socket(self) -> Path:
        return Path(self.info["socket"])

    @property
    def pid(self) -> int:
        return self.info["pid"]

    @property
    def port(self) -> int:
        return self.info["port"]

    def log(self, limit: int = 6000) -> str:
        return self._log.text()[-limit:]

    def stop(self) -> Optional[str]:
        """Close the daemon's stdin, so that it removes every sandbox and its
        home, and wait for it. Returns a problem, if any (it was killed)."""
        problem = None
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            # Its reaper removes what it leaves.
            problem = f"forkvm serve --ephemeral did not end within {STOP_WAIT:.0f} s; killed it"
            self.process.kill()
            self.process.wait()
        return problem


class _Log:
    """The daemon's stderr, read from a pipe into memory by a thread: no
    file is left if this process is killed (the daemon ignores a broken
    pipe)."""

    def __init__(self, pipe):
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            with self._lock:
                self._chunks.append(chunk)
        pipe.close()

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)


def launch(binary: str | os.PathLike, *, args: Sequence[str] = (), env: Optional[dict] = None,
           artifacts: Optional[str | os.PathLike] = None) -> Launched:
    """Start ``binary serve --ephemeral --print-json ARGS`` and wait for its line.

    ``env`` is added to this process's environment (``FORKVM_URL`` and
    ``FORKVM_TOKEN`` are never passed on); ``artifacts`` is where the guest and
    images are linked from (default: the launcher's, ``$FORKVM_ARTIFACTS`` or
    ``$FORKVM_HOME`` or /var/lib/forkvm). The daemon's log (its stderr) is
    kept in memory: :meth:`Launched.log`.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in ("FORKVM_URL", "FORKVM_TOKEN")}
    full_env.update(env or {})
    cmd = [str(binary), "serve", "--ephemeral", "--print-json"]
    if artifacts is not None:
        cmd += ["--artifacts", str(artifacts)]
    cmd += list(args)
    process = subprocess.Popen(cmd, env=full_env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = _Log(process.stderr)
    assert process.stdout is not None
    line = process.stdout.readline()
    process.stdout.close()
    try:
        info = json.loads(line)
    except ValueError:
        process.wait()
        log.wait(5)
        raise LaunchError(f"{' '.join(cmd)} exited with {process.returncode} before it was ready:\n"
                          + log.text()[-6000:])
    return Launched(process, info, log)
