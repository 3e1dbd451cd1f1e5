"""The registry benchmark's cases: one forkvm push or pull with its phases,
the tar + OCI layout + skopeo baseline, and one run of every case.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import chunk_sizes as cs
import forkvm_bench as fb
from registry_hosts import (
    Host, MiB, NET_POOL_B, Registry, STAGES, STAGE_NAMES, drop_host_table, kind,
    private_artifacts, sh, sha256_file, stray_threads, tree_bytes,
)


def transfer(d: Host, args: list[str], label: str) -> tuple[float, list, dict]:
    """`forkvm --json snapshot ARGS` (a push or a pull): (wall ms, [(ms,
    phase)], the result of the last event). Phases and a progress line every
    10 s go to the terminal."""
    env = d.env_cli()
    argv = [d.binary, "--json", "snapshot", *args]
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=err, text=True)
        phases, result, error, last_print, last_prog = [], None, None, 0.0, None
        first_work = None  # the first progress or cached event
        for line in p.stdout:
            now = fb.ms_since(t0)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            t = ev.get("type")
            if t == "phase":
                phases.append((now, ev["phase"]))
                print(f"      [{now / 1000:6.1f} s] {ev['phase']}", flush=True)
                last_print = now
            elif t == "progress":
                last_prog = ev
                first_work = now if first_work is None else first_work
                if now - last_print > 10_000:
                    tot = ev.get("total")
                    pct = f" {100 * ev['done'] / tot:.0f}%" if tot else ""
                    print(f"      [{now / 1000:6.1f} s] {ev['item']}{pct}", flush=True)
                    last_print = now
            elif t == "cached":
                first_work = now if first_work is None else first_work
            elif t in ("pushed", "pulled"):
                result = ev["result"]
            elif t == "error":
                error = ev.get("error")
        rc = p.wait()
        ms = fb.ms_since(t0)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if rc != 0 or result is None:
        raise fb.BenchError(f"{label}: `{shlex.join(argv)}` exited with {rc}: "
                            f"{error or stderr.strip()[-2000:]} (last progress: {last_prog})")
    phases.append((first_work, "(first progress or cached event)"))
    return ms, phases, result


def push_row(ms: float, phases, r: dict) -> dict:
    up = next((t for t, ph in phases if t is not None and ph.startswith("pushing to")), None)
    return {"total_ms": ms, "prepare_ms": up, "transfer_ms": None if up is None else ms - up,
            "daemon_ms": r["total_ms"], "bytes": r["bytes_sent"], "blobs": r["blobs_sent"],
            "blobs_skipped": r["blobs_skipped"], "bytes_skipped": r["bytes_skipped"],
            "links": r["links"], "links_skipped": r["links_skipped"],
            "image_sent": int(bool(r["image_sent"]))}


def pull_row(ms: float, phases, r: dict) -> dict:
    # resolve: until the first progress or cached event, or the first phase
    # after `resolving` (the index, the configs, the compatibility check).
    res = min([t for t, ph in phases if t is not None and not ph.startswith("resolving")
               and ph != "publishing"] or [0.0])
    pub = next((t for t, ph in phases if ph == "publishing"), None)
    return {"total_ms": ms, "prepare_ms": res,
            "transfer_ms": None if pub is None else pub - res,
            "finish_ms": None if pub is None else ms - pub, "daemon_ms": r["total_ms"],
            "bytes": r["bytes_fetched"], "blobs": r["blobs_fetched"], "links": r["links"],
            "links_skipped": r["links_cached"], "image_sent": int(bool(r["image_created"]))}


def stage_tree(dst: Path, rootfs: Path, template: Path, snap: Path) -> Path:
    """A directory of symlinks: image/rootfs.ext4, template/*, snapshot/*
    (`tar -h` archives what they point to)."""
    for sub, src in (("template", template), ("snapshot", snap)):
        (dst / sub).mkdir(parents=True)
        for f in sorted(src.iterdir()):
            if f.is_file():
                (dst / sub / f.name).symlink_to(f)
    (dst / "image").mkdir()
    (dst / "image" / "rootfs.ext4").symlink_to(rootfs)
    return dst


def write_layout(layout: Path, stage: Path, tag: str) -> dict:
    """An OCI image layout with one uncompressed layer: GNU `tar --sparse`
    of `stage`, hashed here, plus a minimal config, manifest and index."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    tmp = blobs / ".layer.tar"
    tar_ms, _ = sh(["tar", "--sparse", "--dereference", "-cf", tmp, "-C", stage,
                    "image", "template", "snapshot"])
    t0 = time.perf_counter()
    digest = sha256_file(tmp)
    size = tmp.stat().st_size
    tmp.rename(blobs / digest)

    def put(obj) -> tuple[str, int]:
        b = json.dumps(obj, separators=(",", ":")).encode()
        h = hashlib.sha256(b).hexdigest()
        (blobs / h).write_bytes(b)
        return f"sha256:{h}", len(b)

    cfg_d, cfg_n = put({"architecture": "amd64", "os": "linux",
                        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
                        "config": {}})
    man_d, man_n = put({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": cfg_d, "size": cfg_n},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{digest}", "size": size}]})
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": man_d, "size": man_n,
                       "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"tar_ms": tar_ms, "layout_ms": fb.ms_since(t0), "tar_bytes": size}


def layout_layer(layout: Path, tag: str) -> tuple[Path, str, int]:
    """(path, media type, size) of the single layer of `layout`:`tag`."""
    index = json.loads((layout / "index.json").read_text())
    for m in index.get("manifests", []):
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            man = json.loads((layout / "blobs" / "sha256" /
                              m["digest"].split(":", 1)[1]).read_text())
            layer = man["layers"][0]
            return (layout / "blobs" / "sha256" / layer["digest"].split(":", 1)[1],
                    layer["mediaType"], layer["size"])
    raise fb.BenchError(f"{layout} has no tag {tag!r}")


def skopeo_push(reg: Registry, work: Path, name: str, rootfs: Path, template: Path,
                snap: Path) -> dict:
    d = work / f"skopeo-{name}"
    stage = stage_tree(d / "stage", rootfs, template, snap)
    t0 = time.perf_counter()
    lay = write_layout(d / "oci", stage, name)
    prepare = fb.ms_since(t0)
    before, (rq0, pg0) = reg.stored_bytes(), reg.access_counts()
    copy, _ = sh(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{d / 'oci'}:{name}",
                  f"docker://{reg.host}/base/{name}:v1"])
    rq1, pg1 = reg.access_counts()
    man = reg.manifest(f"base/{name}", "v1")
    layer = man["layers"][0]
    shutil.rmtree(d / "oci")  # the source of the copy is no longer needed
    return {"total_ms": prepare + copy, "prepare_ms": prepare, "transfer_ms": copy,
            "bytes": layer["size"] + man["config"]["size"] + man["_size"],
            "registry_bytes": reg.stored_bytes() - before, "blobs": 2, "requests": rq1 - rq0,
            "pings": pg1 - pg0, "layer_bytes": lay["tar_bytes"],
            "_media": layer["mediaType"], "_tar_ms": lay["tar_ms"]}


def skopeo_pull(reg: Registry, work: Path, name: str, src_files: dict[str, Path]) -> dict:
    d = work / f"skopeo-pull-{name}"
    d.mkdir()
    rq0, pg0 = reg.access_counts()
    copy, _ = sh(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                  f"docker://{reg.host}/base/{name}:v1", f"oci:{d / 'oci'}:{name}"])
    rq1, pg1 = reg.access_counts()
    fetched = tree_bytes(d / "oci" / "blobs")
    blob, media, _ = layout_layer(d / "oci", name)
    z = ["-z"] if media.endswith("gzip") else ["--zstd"] if media.endswith("zstd") else []
    out = d / "files"
    out.mkdir()
    untar, _ = sh(["tar", "-x", *z, "-f", blob, "-C", out])
    # Outside the timing: what came back is what was sent.
    for rel, src in src_files.items():
        got = out / rel
        if not got.is_file() or got.stat().st_size != src.stat().st_size:
            raise fb.BenchError(f"skopeo pull of {name}: {rel} is missing or has the wrong size")
    mem = "snapshot/memory.diff"
    ok = sha256_file(out / mem) == sha256_file(src_files[mem]) if mem in src_files else None
    shutil.rmtree(d)
    return {"total_ms": copy + untar, "transfer_ms": copy, "finish_ms": untar,
            "bytes": fetched, "blobs": 2, "requests": rq1 - rq0, "pings": pg1 - pg0,
            "sha_ok": None if ok is None else int(ok)}


def measure(case: str, run: int, fn, meter: fb.CpuMeter, reg: Registry) -> dict:
    reg.check()
    print(f"[run {run}] {case} …", flush=True)
    meter.start()
    row = fn()
    row.update(case=case, run=run, other_cpu_cores=meter.other_cores())
    extra = []
    if row.get("bytes") is not None:
        extra.append(f"{row['bytes'] / MiB:.1f} MiB {'sent' if 'push' in case else 'fetched'}")
    if row.get("blobs") is not None and not case.startswith("skopeo"):
        extra.append(f"{row['blobs']} blobs" + (f" ({row['blobs_skipped']} skipped)"
                                                if row.get("blobs_skipped") else ""))
    st = [f"{n} {row[s] / 1000:.1f}" for s, n in zip(STAGES, STAGE_NAMES[kind(case)])
          if n and row.get(s) is not None]
    print(f"[run {run}] {case:<15} {row['total_ms'] / 1000:6.1f} s"
          + (f" ({', '.join(st)})" if st else "") + (f"; {', '.join(extra)}" if extra else ""),
          flush=True)
    return row


def forkvm_block(run, a: Host, b: Host, reg: Registry, snaps, sums, meter) -> list[dict]:
    rows = []
    for case, snap, ref in (("push_s1", snaps["s1"], "bench/s1:v1"),
                            ("push_s2", snaps["s2"], "bench/s1:v2"),
                            ("push_s2_repo", snaps["s2"], "bench/s2:v1")):
        def do_push():
            a.guard(case)
            before, (rq0, pg0) = reg.stored_bytes(), reg.access_counts()
            ms, phases, r = transfer(a, ["push", snap, f"{reg.host}/{ref}"], case)
            rq1, pg1 = reg.access_counts()
            return {**push_row(ms, phases, r), "registry_bytes": reg.stored_bytes() - before,
                    "requests": rq1 - rq0, "pings": pg1 - pg0}
        rows.append(measure(case, run, do_push, meter, reg))
    pulled = {}
    for case, name, ref in (("pull_s1", "s1", "bench/s1:v1"), ("pull_s2", "s2", "bench/s2:v1")):
        def do_pull():
            b.guard(case)
            rq0, pg0 = reg.access_counts()
            ms, phases, r = transfer(b, ["pull", f"{reg.host}/{ref}", "--tag", name], case)
            rq1, pg1 = reg.access_counts()
            pulled[name] = r["snapshot"]["id"]
            return {**pull_row(ms, phases, r), "requests": rq1 - rq0, "pings": pg1 - pg0}
        rows.append(measure(case, run, do_pull, meter, reg))
    # Correctness, after every pull (a spawn leaves B with a stray thread).
    for case, name in (("pull_s1", "s1"), ("pull_s2", "s2")):
        t0 = time.perf_counter()
        sb = b.api.request("POST", "/v1/sandboxes", {"snapshot": pulled[name], "network": "none"},
                           expect=(201,))
        b.sandboxes.add(sb["id"])
        spawn_ms = fb.ms_since(t0)
        r = b.api.exec(sb["id"], ["sha256sum", "/root/buf"])
        got = (r.get("stdout") or "").split()[:1]
        ok = got == [sums[name]]
        b.delete(sb["id"])
        row = next(x for x in rows if x["case"] == case)
        row.update(spawn_ms=spawn_ms, sha_ok=int(ok))
        print(f"[run {run}] B: spawn from pulled {name} {spawn_ms / 1000:.1f} s, /root/buf "
              f"SHA-256 {'matches' if ok else 'DIFFERS from'} A's", flush=True)
        if not ok:
            raise fb.BenchError(f"run {run}: /root/buf in a sandbox of pulled {name} has "
                                f"SHA-256 {got}, A wrote {sums[name]} ({r})")
    return rows


def baseline_block(run, a: Host, reg: Registry, work: Path, snaps, template, meter) -> list:
    rows = []
    rootfs = (Path(a.home) / "images" / "default" / "rootfs.ext4").resolve()
    media = set()
    for name in ("s1", "s2"):
        def do_push():
            return skopeo_push(reg, work, name, rootfs, a.snapshot_dir(template),
                               a.snapshot_dir(snaps[name]))
        rows.append(measure(f"skopeo_push_{name}", run, do_push, meter, reg))
        media.add(rows[-1].pop("_media"))
        rows[-1].pop("_tar_ms")
    for name in ("s1", "s2"):
        src = {"image/rootfs.ext4": rootfs}
        for sub, sid in (("template", template), ("snapshot", snaps[name])):
            for f in a.snapshot_dir(sid).iterdir():
                if f.is_file():
                    src[f"{sub}/{f.name}"] = f
        rows.append(measure(f"skopeo_pull_{name}", run,
                            lambda: skopeo_pull(reg, work, name, src), meter, reg))
        if rows[-1].get("sha_ok") == 0:
            raise fb.BenchError(f"run {run}: the skopeo round trip changed {name}'s memory.diff")
    shutil.rmtree(work / "skopeo-s1", ignore_errors=True)
    shutil.rmtree(work / "skopeo-s2", ignore_errors=True)
    for r in rows:
        r["_media"] = ",".join(sorted(media))
    return rows


def one_run(run: int, args, ctx: dict, artifacts: Path) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix=f"fvb-registry-{run}-", dir="/var/tmp"))
    rows, homes = [], []
    try:
        with Registry(work / "registry") as reg, \
                Host(binary=args.binary, artifacts=str(artifacts), home_parent="/var/tmp") as a, \
                Host(binary=args.binary, artifacts=str(private_artifacts(work, artifacts)),
                     home_parent="/var/tmp", env={"FORKVM_NET_POOL": NET_POOL_B}) as b:
            homes = [a.home, b.home]
            ctx.setdefault("info", a.api.info())
            others = fb.other_qemu_processes(exclude_substrings=(a.home, b.home))
            ctx["others"].update(others)
            ctx["busy"] += bool(others)
            print(f"==> run {run}/{args.runs}: registry on {reg.host}; A {a.home}, B {b.home}",
                  flush=True)
            snaps, sums = {}, {}
            for name in ("s1", "s2"):
                t0 = time.perf_counter()
                sb = a.create(memory_mib=args.memory, network="none")
                ctx["stray_spawn"].append(len(stray_threads(a.proc.pid)))
                r = a.api.exec(sb["id"], ["sh", "-c", f"head -c {args.data_mib}M /dev/urandom "
                                          "> /root/buf && sync && sha256sum /root/buf"])
                if r.get("exit_code") != 0:
                    raise fb.BenchError(f"writing /root/buf in {sb['id']} failed: {r}")
                sums[name] = r["stdout"].split()[0]
                snap = json.loads(a.cli("--json", "snapshot", sb["id"], "--tag", name))
                snaps[name] = snap["id"]
                a.delete(sb["id"])
                print(f"[run {run}] A: {name} = {snap['id']} ({snap['kind']}, parent "
                      f"{snap.get('parent')}; memory.diff "
                      f"{snap['sizes'].get('memory_diff_bytes', 0) / MiB:.0f} MiB, disk layer "
                      f"{snap['sizes'].get('disk_bytes', 0) / MiB:.0f} MiB) in "
                      f"{fb.ms_since(t0) / 1000:.1f} s", flush=True)
            template = json.loads(a.cli("--json", "snapshot", "inspect", snaps["s1"]))["parent"]
            p2 = json.loads(a.cli("--json", "snapshot", "inspect", snaps["s2"]))["parent"]
            if not template or p2 != template:
                raise fb.BenchError(f"S1 and S2 should both be diffs of the boot template: "
                                    f"parents {template} and {p2}")
            stray = stray_threads(a.proc.pid)
            ctx["stray"].append(len(stray))
            # A daemon from before the netns fix (see stray_threads) keeps
            # such threads: a new daemon process on the same home has none.
            if stray or any(ctx["stray_spawn"][-2:]):
                print(f"[run {run}] A: daemon threads in a sandbox's network namespace: "
                      f"{', '.join(map(str, ctx['stray_spawn'][-2:]))} right after the spawns, "
                      f"{len(stray)} now; restarting A's daemon on the same home", flush=True)
                a.restart()
            meter = fb.CpuMeter(roots=[a.proc.pid, b.proc.pid, reg.proc.pid])
            blocks = [lambda: forkvm_block(run, a, b, reg, snaps, sums, meter),
                      lambda: baseline_block(run, a, reg, work, snaps, template, meter)]
            if run % 2 == 0:
                blocks.reverse()
            for blk in blocks:
                rows += blk()
            if run == 1 and not args.no_chunk_sizes:
                print(f"[run {run}] chunk sizes {', '.join(map(str, cs.SIZES_MIB))} MiB, "
                      "offline over A's files (not timed)", flush=True)
                rootfs = (Path(a.home) / "images" / "default" / "rootfs.ext4").resolve()
                ctx["chunks"] = cs.analyse(rootfs, a.snapshot_dir(template),
                                           a.snapshot_dir(snaps["s1"]),
                                           a.snapshot_dir(snaps["s2"]))
    finally:
        for h in homes:
            drop_host_table(h)
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        media = r.pop("_media", None)
        if media:
            ctx["skopeo_media"] = media
    return rows
