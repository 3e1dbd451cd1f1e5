"""Sandbox lifecycle through the unmodified ``e2b`` SDK: create, connect,
list, kill, timeouts, pause and resume, metrics, and fork."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException, SandboxException


def test_create_with_metadata_and_env_vars_then_connect_list_and_kill(e2b_env):
    sbx = Sandbox.create(metadata={"suite": "lifecycle", "n": "1"}, envs={"GREETING": "hi"}, timeout=600)
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"suite": "lifecycle", "n": "1"}
        assert info.template_id == "base"
        assert info.state.value == "running"
        # The env var reaches commands.
        assert sbx.commands.run("echo $GREETING").stdout.strip() == "hi"
        # Commands run as E2B's user, in its home.
        assert sbx.commands.run("whoami; pwd").stdout.split() == ["user", "/home/user"]

        again = Sandbox.connect(sbx.sandbox_id)
        assert again.sandbox_id == sbx.sandbox_id
        assert again.commands.run("echo connected").stdout.strip() == "connected"

        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "lifecycle"})).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        assert listed[0].metadata["n"] == "1"
        assert Sandbox.list(query=SandboxQuery(metadata={"suite": "absent"})).next_items() == []
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False  # already gone
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_list_pages(e2b_env):
    made = [Sandbox.create(metadata={"suite": "paging"}, timeout=600) for _ in range(3)]
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"suite": "paging"}), limit=2)
        first = pager.next_items()
        assert len(first) == 2 and pager.has_next
        second = pager.next_items()
        assert len(second) == 1 and not pager.has_next
        assert {s.sandbox_id for s in first + second} == {s.sandbox_id for s in made}
    finally:
        for s in made:
            s.kill()


def test_set_timeout_ends_the_sandbox(e2b_env):
    sbx = Sandbox.create(timeout=600)
    sbx.set_timeout(2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            Sandbox.get_info(sbx.sandbox_id)
        except NotFoundException:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the sandbox outlived its 2 s timeout by a minute")
    assert not sbx.is_running()


def test_pause_then_connect_keeps_files_and_memory(e2b_env):
    sbx = Sandbox.create(timeout=600)
    try:
        sbx.files.write("/home/user/disk.txt", "on disk")
        sbx.files.write("/tmp/mem.txt", "in memory")  # /tmp is tmpfs: guest RAM
        bg = sbx.commands.run("sleep 3600", background=True)
        assert sbx.pause() is True
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
        assert sbx.pause() is False  # already paused

        back = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
        assert back.files.read("/home/user/disk.txt") == "on disk"
        assert back.files.read("/tmp/mem.txt") == "in memory"
        assert bg.pid in [p.pid for p in back.commands.list()]
    finally:
        sbx.kill()


def test_metrics(e2b_env, sandbox):
    metrics = sandbox.get_metrics()
    assert len(metrics) == 1
    m = metrics[0]
    assert m.cpu_count >= 1
    assert 0 <= m.cpu_used_pct <= 100
    assert 0 < m.mem_used <= m.mem_total
    assert m.disk_total > 0


def test_fork_into_three_children_that_see_files_and_memory(e2b_env):
    parent = Sandbox.create(timeout=600)
    children = []
    try:
        parent.files.write("/home/user/state.txt", "parent file")
        parent.files.write("/tmp/ram.txt", "parent memory")
        # A process whose state lives only in its memory: a counter it prints
        # on request.
        parent.commands.run(
            "python3 -c 'import time\nn=41\nopen(\"/tmp/ready\",\"w\").close()\ntime.sleep(3600)'",
            background=True,
        )
        for _ in range(50):
            if parent.files.exists("/tmp/ready"):
                break
            time.sleep(0.2)
        children = parent.fork(count=3, timeout=600)
        assert len(children) == 3
        ids = {c.sandbox_id for c in children}
        assert len(ids) == 3 and parent.sandbox_id not in ids
        for i, child in enumerate(children):
            assert isinstance(child, Sandbox), child
            assert child.files.read("/home/user/state.txt") == "parent file"
            assert child.files.read("/tmp/ram.txt") == "parent memory"
            # The inherited process runs on in the child.
            assert child.commands.run("pgrep -f 'n=41' >/dev/null && echo alive").stdout.strip() == "alive"
            child.files.write("/home/user/state.txt", f"child {i}")
        # Each child's disk is its own, and the parent's is untouched.
        assert parent.files.read("/home/user/state.txt") == "parent file"
        assert [c.files.read("/home/user/state.txt") for c in children] == ["child 0", "child 1", "child 2"]
    finally:
        for c in children:
            if isinstance(c, Sandbox):
                c.kill()
        parent.kill()


def test_fork_of_a_paused_sandbox_leaves_it_paused(e2b_env):
    # E2B answers 409 here (its infra RFC #3424); forkvm forks the state the
    # pause saved, without resuming the parent.
    parent = Sandbox.create(timeout=600)
    children = []
    try:
        parent.files.write("/home/user/state.txt", "saved by the pause")
        parent.commands.run(
            "python3 -c 'import time\nn=43\nopen(\"/tmp/ready\",\"w\").close()\ntime.sleep(3600)'",
            background=True,
        )
        for _ in range(50):
            if parent.files.exists("/tmp/ready"):
                break
            time.sleep(0.2)
        assert parent.pause() is True
        children = Sandbox.fork(parent.sandbox_id, count=2, timeout=600)
        assert len(children) == 2
        assert Sandbox.get_info(parent.sandbox_id).state.value == "paused"
        for child in children:
            assert isinstance(child, Sandbox), child
            assert child.files.read("/home/user/state.txt") == "saved by the pause"
            assert child.commands.run("pgrep -f 'n=43' >/dev/null && echo alive").stdout.strip() == "alive"
        assert Sandbox.get_info(parent.sandbox_id).state.value == "paused"
    finally:
        for c in children:
            if isinstance(c, Sandbox):
                c.kill()
        Sandbox.kill(parent.sandbox_id)


def test_bad_key_and_bad_template_are_refused(e2b_env):
    with pytest.raises(Exception) as e:
        Sandbox.create(api_key="wrong", timeout=60)
    assert "401" in str(e.value) or "API key" in str(e.value) or "Unauthorized" in str(e.value)
    with pytest.raises(SandboxException) as e:
        Sandbox.create("no-such-template", timeout=60)
    assert "no-such-template" in str(e.value)


def test_envd_needs_the_sandboxs_own_access_token(e2b_env, sandbox):
    url = f"{e2b_env.url}/health"
    h = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
    assert httpx.get(url, headers=h).status_code == 401
    assert httpx.get(url, headers={**h, "X-Access-Token": "nope"}).status_code == 401
    token = sandbox._envd_access_token  # what the control plane handed the SDK
    assert httpx.get(url, headers={**h, "X-Access-Token": token}).status_code in (200, 204)


def test_port_49999_reaches_a_server_in_the_guest(e2b_env, sandbox):
    sandbox.files.write("/home/user/www/hello.txt", "from the guest")
    sandbox.commands.run("cd /home/user/www && python3 -m http.server 49999", background=True)
    h = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49999",
        "X-Access-Token": sandbox._envd_access_token,
    }
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(f"{e2b_env.url}/hello.txt", headers=h, timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 200, r.text
    assert r.text == "from the guest"
    # A port that was not published is refused with what to do.
    r = httpx.get(f"{e2b_env.url}/", headers={**h, "E2b-Sandbox-Port": "8080"}, timeout=10)
    assert r.status_code == 502 and "not published" in r.json()["message"]
