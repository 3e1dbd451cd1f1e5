"""Unit tests of naive.py's parts that need no VM: rewriting a source's QEMU
command line for a naive copy, the copy's network namespace, and the refusal
of a jailed source.

Run: .venv/bin/python -m pytest bench/common/test_naive.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import forkvm_bench as fb  # noqa: E402
import naive as nv  # noqa: E402

SB = "/h/sandboxes/sb-1"


def saved(volumes: bool) -> nv.SavedVm:
    argv = ["/usr/bin/qemu-system-x86_64", "-name", "forkvm-sb-1,process=forkvm-sb-1",
            "-object", "memory-backend-file,id=mem,mem-path=/dev/shm/x/sb-1.mem,share=on",
            "-qmp", f"unix:{SB}/qmp.sock,server=on,wait=off",
            "-chardev", f"socket,id=agent,path={SB}/agent.sock,server=on,wait=off",
            "-serial", f"file:{SB}/console.log",
            "-drive", f"file={SB}/disk.qcow2,if=none,id=root"]
    if volumes:
        argv += ["-chardev", f"socket,id=volumes,path={SB}/volumes.sock,server=on,wait=off"]
    return nv.SavedVm(argv, SB, "/dev/shm/x/sb-1.mem", "forkvm-sb-1", "/w/state.bin",
                      "/w/disk.qcow2", 1, 1.0, [], 0)


@pytest.mark.parametrize("volumes", [False, True])
def test_restore_argv_rewrites_every_per_instance_path(volumes):
    argv, paths = nv.restore_argv(saved(volumes), "/r/1", "/dev/shm/y/1.mem", "copy-1")
    line = " ".join(argv)
    assert SB not in line and "/dev/shm/x/" not in line
    assert argv[-2:] == ["-incoming", "defer"]
    assert argv[argv.index("-name") + 1] == "copy-1,process=copy-1"
    assert ("/r/1/volumes.sock" in line) == volumes == ("volumes" in paths)
    assert paths["qmp"] == "/r/1/qmp.sock" and "/r/1/disk.qcow2" in line


def test_restore_argv_refuses_a_path_it_cannot_place():
    s = saved(False)
    s.argv = [a for a in s.argv if "agent.sock" not in a]
    with pytest.raises(fb.BenchError, match="does not name exactly once"):
        nv.restore_argv(s, "/r/1", "/dev/shm/y/1.mem", "copy-1")


def test_copy_netns_only_for_a_source_with_a_nic():
    s = saved(False)
    assert nv.copy_netns(s, "r1") is None
    s.argv += ["-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no"]
    name = nv.copy_netns(s, "r1")
    assert name.startswith("fvb-") and name.endswith("-r1")


def test_naive_save_refuses_a_jailed_source():
    """A QEMU that does not run as root (as a jailed one, here a `sleep` as
    nobody) is refused before anything is saved, naming the way out."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (to start a process as another uid)")
    p = subprocess.Popen(["sleep", "30"], user=65534)
    try:
        assert nv.qemu_uid(p.pid) == 65534
        with pytest.raises(fb.BenchError, match="runs jailed as uid 65534.*FORKVM_NO_JAIL=1"):
            nv.naive_save(None, "sb-1", p.pid, 512, "/nonexistent")
    finally:
        p.kill()
        p.wait()
    assert nv.qemu_uid(os.getpid()) == 0
