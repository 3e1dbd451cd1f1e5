"""The naive baseline every VM benchmark compares forkvm with: a plain QEMU
full save (``naive_save``: stop, migrate all of RAM and device state to a
file, copy the disk layers) and restore (``naive_restore``: a fresh QEMU from
the source's command line, ``migrate-incoming``, ``cont``, agent pong),
optionally in a network namespace of its own (``netns_with_tap``), and the
naive stop / save / cont pause (``naive_pause``).

Import with ``import naive as nv`` (bench/common on sys.path, as for
``forkvm_bench``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import forkvm_bench as fb


# --------------------------------------------------------------------------
# Naive QEMU full save / restore (the baseline every VM benchmark includes)
# --------------------------------------------------------------------------


class SavedVm:
    """What a naive restore needs: the source's argv, the paths it must
    rewrite, the saved state and a disk matching it."""

    def __init__(self, argv, sbdir, mem_path, name_arg, state, disk, state_bytes, save_ms,
                 caps_reset, max_bandwidth, status="", copied_layers=()):
        self.argv = argv
        self.sbdir = sbdir
        self.mem_path = mem_path
        self.name_arg = name_arg
        self.state = state
        self.disk = disk
        self.state_bytes = state_bytes
        self.save_ms = save_ms
        self.caps_reset = caps_reset          # capabilities that were on and got turned off
        self.max_bandwidth = max_bandwidth    # migration rate limit in force (bytes/s)
        self.status = status                  # the source's run state after the save
        self.copied_layers = list(copied_layers)  # backing layers copied next to `disk`


def _qemu_img_chain(path: str) -> list[dict]:
    r = subprocess.run(["qemu-img", "info", "-U", "--backing-chain", "--output=json", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise fb.BenchError(f"qemu-img info {path}: {r.stderr.strip()}")
    v = json.loads(r.stdout)
    return v if isinstance(v, list) else [v]


def _copy_disk_chain(top: str, home: str, work: str) -> tuple[str, list[str]]:
    """Copy the writable top layer `top` to work/disk.qcow2. Any backing layer
    that belongs to the daemon (under home/sandboxes or home/snapshots: a
    forkvm snapshot's frozen layer) is copied too and the copies are rebased
    onto each other (qemu-img rebase -u), so the naive baseline does not
    depend on forkvm's snapshot store; read-only base images are shared as
    they are. Returns (top copy, backing copies)."""
    owned = [os.path.realpath(os.path.join(home, s)) + os.sep for s in ("sandboxes", "snapshots")]
    chain = _qemu_img_chain(top)
    dst_top = os.path.join(work, "disk.qcow2")
    copies = [dst_top]
    shutil.copyfile(top, dst_top)
    os.chmod(dst_top, 0o644)
    layers = []
    for i, layer in enumerate(chain[1:], start=1):
        fn = os.path.realpath(layer["filename"])
        if not any(fn.startswith(o) for o in owned):
            break  # a shared read-only image: everything below it is too
        dst = os.path.join(work, f"layer{i}.qcow2")
        shutil.copyfile(fn, dst)
        os.chmod(dst, 0o644)
        layers.append(dst)
        copies.append(dst)
        # point the layer above at this copy
        r = subprocess.run(["qemu-img", "rebase", "-u", "-F", layer.get("format", "qcow2"),
                            "-b", dst, copies[-2]], capture_output=True, text=True)
        if r.returncode != 0:
            raise fb.BenchError(f"qemu-img rebase {copies[-2]}: {r.stderr.strip()}")
    return dst_top, layers


def qemu_uid(pid: int) -> int:
    """The (real) uid process `pid` runs as: 0 for an unjailed QEMU."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise fb.BenchError(f"no Uid line in /proc/{pid}/status")


def naive_save(d: "fb.Daemon", sid: str, pid: int, memory: int, work: str) -> SavedVm:
    """Save a running sandbox (RAM + device state) to work/state.bin with a
    plain full QEMU migration, and copy the disk layers that match it.

    The source must be a plain QEMU, i.e. one of an unjailed daemon
    (``save_unjailed_source`` makes one): its command line is replayed by
    ``naive_restore`` and it writes the state where the bench says. A jailed
    QEMU is refused: it sees only its own directories (not `work`), and its
    command line names a tap by a descriptor it inherited from the daemon.

    Every migration capability is turned off first (QEMU's default), in case
    the daemon set any (a forkvm snapshot leaves `x-ignore-shared` on, which
    would leave shared RAM out of the file). Parameters stay at QEMU's
    defaults. The source is left paused ('postmigrate'); the caller deletes
    it (or `cont`s it). The source must own its RAM (`share=on`, not a
    copy-on-write clone) and be a plain running VM."""
    uid = qemu_uid(pid)
    if uid != 0:
        raise fb.BenchError(
            f"the naive baseline's source {sid} (QEMU pid {pid}) runs jailed as uid {uid}: a "
            "jailed QEMU cannot write the state outside its own directory and its command line "
            "cannot be replayed; boot the source on an unjailed daemon "
            "(naive.save_unjailed_source, or a Daemon with FORKVM_NO_JAIL=1)")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    sbdir = d.sandbox_dir(sid)
    state = os.path.join(work, "state.bin")
    if "-incoming" in argv or not any("share=on" in a and "mem-path=" in a for a in argv) \
            or any("readonly=on" in a for a in argv):
        raise fb.BenchError(f"the source is not a plain cold-booted VM: {argv}")
    with fb.Qmp(os.path.join(sbdir, "qmp.sock")) as qmp:
        caps = qmp.execute("query-migrate-capabilities")
        caps_reset = [c["capability"] for c in caps if c["state"]]
        if caps_reset:
            qmp.execute("migrate-set-capabilities", {"capabilities": [
                {"capability": c, "state": False} for c in caps_reset]})
        still_on = [c["capability"] for c in qmp.execute("query-migrate-capabilities")
                    if c["state"]]
        if still_on:
            raise fb.BenchError(f"migration capabilities still on: {still_on}")
        max_bw = qmp.execute("query-migrate-parameters").get("max-bandwidth")
        # The disk the VM writes to now (a forkvm snapshot moves it to a new
        # top layer; the command line still names the original file).
        top = None
        for b in qmp.execute("query-block"):
            ins = b.get("inserted")
            if ins and ins.get("file"):
                top = ins["file"]
                # After blockdev-snapshot-sync QEMU names the top image by a
                # json: description (its backing is an open node); the top
                # layer's own file is its "file" child.
                if top.startswith("json:"):
                    top = json.loads(top[5:])["file"]["filename"]
                break
        if top is None:
            raise fb.BenchError("query-block shows no disk")
        t0 = time.perf_counter()
        qmp.execute("stop")
        qmp.execute("migrate", {"uri": f"file:{state}"})
        fb.wait_migration(qmp, timeout=600)
        save_ms = fb.ms_since(t0)
        status = qmp.execute("query-status")["status"]
    # The migration flushed and inactivated the disk: its layers now match
    # the saved memory.
    disk, layers = _copy_disk_chain(top, d.home, work)
    state_bytes = os.path.getsize(state)
    mem_args = [a for a in argv if "mem-path=" in a]
    if len(mem_args) != 1:
        raise fb.BenchError(f"expected one memory backend with mem-path= in {argv}")
    mem_path = mem_args[0].split("mem-path=", 1)[1].split(",", 1)[0]
    try:
        name_arg = argv[argv.index("-name") + 1]
    except (ValueError, IndexError):
        raise fb.BenchError(f"no -name in the source command line {argv}") from None
    if state_bytes < memory * 2**20 // 64:
        raise fb.BenchError(f"the state file is only {state_bytes} bytes for {memory} MiB of RAM: "
                         "RAM was not saved into it")
    return SavedVm(argv, sbdir, mem_path, name_arg, state, disk, state_bytes, save_ms,
                   caps_reset, max_bw, status, layers)


def save_unjailed_source(binary: str | None, memory: int, settle: float,
                         **create) -> tuple[SavedVm, str, dict]:
    """The naive baseline's source, saved: a private daemon with the jail
    off (``FORKVM_NO_JAIL=1``: QEMU as root in the host's mount namespace,
    as one runs QEMU by hand) cold-boots a `memory` MiB, 1 vCPU sandbox with
    the `create` fields (e.g. ``network="none"``), it is left `settle`
    seconds and saved with ``naive_save`` into <home>/naive; then it is
    deleted and the daemon stopped, keeping its home, which holds the state
    and disk the naive copies restore from. The caller removes the home
    with ``remove_home``. Returns (saved, home, the source's create
    response)."""
    d = fb.Daemon(binary=binary, env={"FORKVM_NO_JAIL": "1"}, keep_home=True)
    try:
        with d:
            src = d.create_cold(memory_mib=memory, cpus=1, **create)
            time.sleep(settle)
            work = os.path.join(d.home, "naive")
            os.mkdir(work)
            saved = naive_save(d, src["id"], src["pid"], memory, work)
            d.delete(src["id"])
    except BaseException:
        if d.home:
            remove_home(d.home)
        raise
    return saved, d.home, src


def remove_home(home: str) -> None:
    """Remove a kept daemon home (``save_unjailed_source``'s) and its guest
    RAM directory in /dev/shm."""
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(fb.run_dir_for_home(home), ignore_errors=True)


def restore_argv(saved: SavedVm, rdir: str, mem: str, name: str) -> tuple[list[str], dict]:
    """The source's argv with every per-instance path replaced."""
    paths = {
        "qmp": os.path.join(rdir, "qmp.sock"),
        "agent": os.path.join(rdir, "agent.sock"),
        "console": os.path.join(rdir, "console.log"),
        "disk": os.path.join(rdir, "disk.qcow2"),
        "log": os.path.join(rdir, "qemu.log"),
    }
    subst = [
        (os.path.join(saved.sbdir, "qmp.sock"), paths["qmp"]),
        (os.path.join(saved.sbdir, "agent.sock"), paths["agent"]),
        (os.path.join(saved.sbdir, "console.log"), paths["console"]),
        (os.path.join(saved.sbdir, "disk.qcow2"), paths["disk"]),
        (saved.mem_path, mem),
    ]
    # The volume port's socket (crate forkvm-volume), in a source new enough
    # to have one: QEMU listens on it, so each copy needs its own.
    optional = [(os.path.join(saved.sbdir, "volumes.sock"), os.path.join(rdir, "volumes.sock"))]
    if any(optional[0][0] in a for a in saved.argv):
        paths["volumes"] = optional[0][1]
        subst += optional
    out = []
    hits = {old: 0 for old, _ in subst}
    for a in saved.argv:
        for old, new in subst:
            if old in a:
                hits[old] += a.count(old)
                a = a.replace(old, new)
        out.append(a)
    missing = [old for old, n in hits.items() if n != 1]
    if missing:
        raise fb.BenchError(f"source command line does not name exactly once: {missing}")
    i = out.index("-name")
    out[i + 1] = f"{name},process={name}"
    leftovers = [a for a in out if saved.sbdir in a]
    if leftovers:
        raise fb.BenchError(f"restore command line still names the source's files: {leftovers}")
    return out + ["-incoming", "defer"], paths


# The link every sandbox with a NIC has in its own namespace (crates/forkvm-net:
# TAP_NAME, TAP_MAC, GATEWAY_ADDR/GUEST_PREFIX).
TAP_NAME = "tap0"
TAP_MAC = "02:fc:00:00:00:01"
TAP_ADDR = "172.16.0.1/30"


def netns_with_tap(name: str) -> None:
    """Create network namespace `name` holding the tap a forkvm sandbox's NIC
    opens, as the daemon's `ns::create` does (lo up; tap0 with the gateway's
    MAC and address, up) but with no uplink: a naive restore of a source that
    has a NIC then finds its tap by name, alone in its own namespace."""
    if os.path.exists(f"/run/netns/{name}"):
        raise fb.BenchError(f"network namespace {name} exists already")
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "-batch", "-"], check=True, capture_output=True,
                       text=True, input=(f"link set lo up\n"
                                         f"tuntap add dev {TAP_NAME} mode tap\n"
                                         f"link set {TAP_NAME} address {TAP_MAC}\n"
                                         f"addr add {TAP_ADDR} dev {TAP_NAME}\n"
                                         f"link set {TAP_NAME} up\n"))
    except subprocess.CalledProcessError as e:
        delete_netns(name)
        raise fb.BenchError(f"cannot set up {TAP_NAME} in namespace {name}: "
                         f"{(e.stderr or '').strip()}") from None


def copy_netns(saved: SavedVm, tag: str) -> str | None:
    """A network namespace name for one naive copy (``naive_restore``'s
    `netns`) when the source has a NIC: its tap must exist, alone, where the
    copy's QEMU runs. None for a source without one."""
    if not any(a.startswith("tap,") for a in saved.argv):
        return None
    return f"fvb-{os.getpid()}-{tag}"


def delete_netns(name: str) -> None:
    """Delete network namespace `name` (and the tap in it), if it exists."""
    if os.path.exists(f"/run/netns/{name}"):
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _enter_netns(path: str):
    """A preexec_fn that moves the child into the network namespace at
    `path` before it execs, as the daemon starts QEMU (setns in pre_exec)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, clone_newnet) != 0:
                raise OSError(ctypes.get_errno(), f"setns {path}")
        finally:
            os.close(fd)
    return enter


class NaiveVm:
    """One naive-restored QEMU: its process, files and the timed stages."""

    def __init__(self, proc, rdir, mem, paths, log, netns: str | None = None):
        self.proc = proc
        self.rdir = rdir
        self.mem = mem
        self.paths = paths
        self._log = log
        self.netns = netns
        self.timings: dict = {}
        self.pong: dict = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGKILL the QEMU (by its pid), reap it, remove its files (and its
        network namespace, if it has one)."""
        try:
            if self.proc is not None:
                fb.kill_and_reap(self.proc)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            shutil.rmtree(self.rdir, ignore_errors=True)
            try:
                os.unlink(self.mem)
            except FileNotFoundError:
                pass
            if self.netns:
                delete_netns(self.netns)
                self.netns = None


def naive_restore(saved: SavedVm, rdir: str, mem: str, name: str,
                  agent_timeout: float = 120.0, netns: str | None = None) -> NaiveVm:
    """Start a fresh QEMU from the saved source's command line (new sockets,
    a fresh copy of the saved disk, a new share=on RAM file `mem`), load the
    state with `migrate-incoming`, `cont`, and wait for the agent's pong.

    With `netns`, that network namespace is made first (``netns_with_tap``:
    the tap a source with a NIC names, no uplink) and QEMU starts inside it;
    ``stop()`` deletes it.

    The returned VM is running; its ``timings`` hold ``total_ms`` (QEMU spawn
    until the pong) and the stages ``qemu_start_ms`` (spawn until QMP
    answered), ``load_ms``, ``cont_ms``, ``agent_ms``, plus ``disk_copy_ms``
    (and, with `netns`, ``netns_ms``), both before the clock starts. The
    caller must ``stop()`` it; on failure it is stopped here."""
    os.mkdir(rdir)
    argv, paths = restore_argv(saved, rdir, mem, name)
    t = time.perf_counter()
    shutil.copyfile(saved.disk, paths["disk"])  # the disk must match the memory
    disk_copy_ms = fb.ms_since(t)
    log = open(paths["log"], "wb")
    vm = NaiveVm(None, rdir, mem, paths, log)
    try:
        extra: dict = {}
        netns_ms = None
        if netns:
            t = time.perf_counter()
            netns_with_tap(netns)
            vm.netns = netns
            netns_ms = fb.ms_since(t)
            extra["preexec_fn"] = _enter_netns(f"/run/netns/{netns}")
        t0 = time.perf_counter()
        vm.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, **extra)
        try:
            qmp = fb.Qmp(paths["qmp"], timeout=60, proc=vm.proc)
        except fb.QmpError as e:
            raise fb.BenchError(f"{e}; QEMU log:\n{fb.tail(paths['log'])}") from None
        with qmp:
            t_qmp = time.perf_counter()
            qmp.execute("migrate-incoming", {"uri": f"file:{saved.state}"})
            deadline = time.monotonic() + 600
            while True:
                st = qmp.execute("query-status")["status"]
                if st != "inmigrate":
                    break
                if vm.proc.poll() is not None or time.monotonic() > deadline:
                    raise fb.BenchError(f"restore stuck in inmigrate; QEMU log:\n{fb.tail(paths['log'])}")
                time.sleep(0.005)
            mig = qmp.execute("query-migrate")
            if mig.get("status") != "completed":
                raise fb.BenchError(f"incoming migration ended as {mig}")
            t_loaded = time.perf_counter()
            qmp.execute("cont")
            t_cont = time.perf_counter()
            if qmp.execute("query-status")["status"] != "running":
                raise fb.BenchError("restored VM is not running after cont")
            vm.pong = fb.agent_ping(paths["agent"], timeout=agent_timeout)
            t_pong = time.perf_counter()
        vm.timings = {
            "total_ms": (t_pong - t0) * 1000,
            "qemu_start_ms": (t_qmp - t0) * 1000, "load_ms": (t_loaded - t_qmp) * 1000,
            "cont_ms": (t_cont - t_loaded) * 1000, "agent_ms": (t_pong - t_cont) * 1000,
            "disk_copy_ms": disk_copy_ms,
        }
        if netns_ms is not None:
            vm.timings["netns_ms"] = netns_ms
        return vm
    except BaseException:
        vm.stop()
        raise


# --------------------------------------------------------------------------
# Pauses: QMP event timestamps and the naive stop / save / cont baseline
# --------------------------------------------------------------------------


def event_time_ms(ev: dict) -> float:
    """A QMP event's timestamp (QEMU's CLOCK_REALTIME) in ms since the epoch,
    comparable with time.time() * 1000."""
    ts = ev["timestamp"]
    return ts["seconds"] * 1000.0 + ts["microseconds"] / 1000.0


def pause_from_events(events: list[dict]) -> float | None:
    """Milliseconds between the last STOP event and the RESUME that follows
    it (how long the vCPUs were stopped, as QEMU saw it), or None if either
    is missing. This is how the daemon measures `pause_ms`."""
    stop = None
    pause = None
    for ev in events:
        if ev.get("event") == "STOP":
            stop = event_time_ms(ev)
        elif ev.get("event") == "RESUME" and stop is not None:
            pause = event_time_ms(ev) - stop
            stop = None
    return pause


def migration_settings(qmp: "fb.Qmp", params=("max-bandwidth", "downtime-limit")) -> tuple:
    """(capabilities that are on, {parameter: value}) of a VM, to put back later."""
    caps_on = [c["capability"] for c in qmp.execute("query-migrate-capabilities") if c["state"]]
    p = qmp.execute("query-migrate-parameters")
    return caps_on, {k: p.get(k) for k in params}


def restore_migration_settings(qmp: "fb.Qmp", caps_on, params: dict) -> None:
    """Undo what `migration_settings` recorded: exactly `caps_on` on, and
    the given parameters back to their values."""
    now_on = {c["capability"] for c in qmp.execute("query-migrate-capabilities") if c["state"]}
    want = set(caps_on)
    change = [{"capability": c, "state": c in want} for c in sorted(now_on ^ want)]
    if change:
        qmp.execute("migrate-set-capabilities", {"capabilities": change})
    p = {k: v for k, v in params.items() if v is not None}
    if p:
        qmp.execute("migrate-set-parameters", p)


def migration_stats(m: dict) -> dict:
    """The figures of a completed `query-migrate` worth keeping."""
    ram = m.get("ram") or {}
    return {
        "status": m.get("status"),
        "qemu_total_ms": m.get("total-time"),
        "qemu_downtime_ms": m.get("downtime"),
        "qemu_setup_ms": m.get("setup-time"),
        "ram_transferred_bytes": ram.get("transferred"),
        "ram_normal_pages": ram.get("normal"),
        "ram_zero_pages": ram.get("duplicate"),
        "dirty_sync_count": ram.get("dirty-sync-count"),
    }


def naive_pause(qmp_path: str, state_path: str, params: dict | None = None,
                timeout: float = 600.0) -> dict:
    """The naive way to save a running VM, timed as a pause: `stop`, a plain
    full migration of all RAM and device state to `file:state_path` until
    `completed`, `cont`.

    Every migration capability is turned off first (QEMU's default; forkvm
    leaves `x-ignore-shared` or `mapped-ram` on, which would keep RAM out of
    the file or change its layout) and `params` (e.g. QEMU's defaults for
    `max-bandwidth` and `downtime-limit`) are set; both are put back as they
    were afterwards, and the state file is removed. The VM is resumed
    whatever happens.

    The VM's own QEMU writes `state_path`, so it must be a place that QEMU
    can write: for a jailed QEMU (the daemon's default) its sandbox
    directory, the only writable directory its mount namespace shows
    (docs/security.md); /tmp or a bench's work directory is not there.

    Returns ``pause_ms`` (STOP to RESUME event timestamps, as the daemon
    measures; ``pause_source`` says "events", or "clock" when an event was
    missing and the time from sending `stop` until `cont` returned is used),
    ``clock_ms`` (that client-side time), ``migrate_ms`` (migrate command to
    `completed` seen), ``state_bytes``, the `query-migrate` figures
    (``migration_stats``) and the ``params`` in force."""
    params = dict(params or {})
    with fb.Qmp(qmp_path, timeout=60) as qmp:
        caps_on, old_params = migration_settings(qmp, tuple(params) or ("max-bandwidth",))
        try:
            if caps_on:
                qmp.execute("migrate-set-capabilities", {"capabilities": [
                    {"capability": c, "state": False} for c in caps_on]})
            if params:
                qmp.execute("migrate-set-parameters", params)
            still = [c["capability"] for c in qmp.execute("query-migrate-capabilities")
                     if c["state"]]
            if still:
                raise fb.BenchError(f"migration capabilities still on: {still}")
            in_force = {k: v for k, v in qmp.execute("query-migrate-parameters").items()
                        if k in ("max-bandwidth", "downtime-limit")}
            if qmp.execute("query-status")["status"] != "running":
                raise fb.BenchError("the VM is not running before the naive save")
            qmp.events.clear()
            t0 = time.perf_counter()
            qmp.execute("stop")
            try:
                t1 = time.perf_counter()
                qmp.execute("migrate", {"uri": f"file:{state_path}"})
                m = fb.wait_migration(qmp, timeout=timeout, poll=0.001)
                migrate_ms = fb.ms_since(t1)
            finally:
                st = qmp.execute("query-status")["status"]
                if st != "running":
                    qmp.execute("cont")
                clock_ms = fb.ms_since(t0)
            # Events that arrived with the replies are in qmp.events; one more
            # round trip collects a RESUME that came after the cont reply.
            if qmp.execute("query-status")["status"] != "running":
                raise fb.BenchError("the VM is not running after cont")
            pause = pause_from_events(qmp.events)
            state_bytes = os.path.getsize(state_path)
        finally:
            try:
                restore_migration_settings(qmp, caps_on, old_params)
            finally:
                try:
                    os.unlink(state_path)
                except FileNotFoundError:
                    pass
    return {
        "pause_ms": pause if pause is not None else clock_ms,
        "pause_source": "events" if pause is not None else "clock",
        "clock_ms": clock_ms, "migrate_ms": migrate_ms, "state_bytes": state_bytes,
        "caps_reset": caps_on, "params": in_force, **migration_stats(m),
    }
