"""The E2B-shaped ``base`` image (examples/e2b-base) has what E2B's base
template has and agent code assumes: passwordless ``sudo`` for ``user``,
``git``, and ``python`` beside ``python3``. Driven by the unmodified ``e2b``
SDK; the tools come from forkvm's ``default`` image, built on the host
(scripts/build-guest.sh), so no guest reached a network for them."""

from __future__ import annotations


def test_user_has_passwordless_sudo(sandbox):
    r = sandbox.commands.run("sudo -n true && sudo -n id -u && id -un")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == ["0", "user"]


def test_git_is_installed(sandbox):
    r = sandbox.commands.run("git --version")
    assert r.stdout.startswith("git version "), r.stdout


def test_python_and_python3_are_the_same_python(sandbox):
    r = sandbox.commands.run("python --version; python3 --version")
    lines = r.stdout.split("\n")
    assert lines[0].startswith("Python 3."), r.stdout
    assert lines[0] == lines[1], r.stdout
