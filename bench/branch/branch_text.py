"""The branch benchmark's prose: why each target passed or failed, full-mode
stalls, the method section and the terminal summary.
"""

from __future__ import annotations


import report as rp
from branch_modes import BRANCH_MODES, MODE_ORDER, NAIVE_TARGET, naive_modes, source_of
from branch_cases import CHAIN_FILE, COUNTER_LOOP
from branch_stats import (
    chain_stats, fmt, fmt_ms, key_figures, p50, parts_text, pause_parts, pstat, sel,
    targets,
)


def reasons(rows, sizes, dirties, ctx, args) -> list[str]:
    out = []
    kf = key_figures(rows, sizes)
    ref = lambda where, s, k="pause_ms": p50(sel(rows, "size", f"qemu_live_{where}", s), k)  # noqa: E731
    floor = p50([r for r in rows if r["mode"] == "stop_cont"])
    if sizes and any(v == v for v in kf["live"].values()):
        out.append(
            "- **Live pause, part by part** (p50s, ms): "
            + "; ".join(f"{s} MiB: {fmt_ms(kf['live'][s])} = "
                        f"{parts_text(pause_parts(sel(rows, 'size', 'live', s)))}"
                        for s in sizes)
            + f". A bare QMP stop + cont pauses the guest {fmt_ms(floor)} ms. The daemon writes "
            "the live save to tmpfs (its run directory) and moves it into the store after "
            "`cont`; the bench's own live save pauses "
            + ", ".join(fmt_ms(ref("shm", s)) for s in sizes)
            + " ms with the file on /dev/shm and "
            + ", ".join(fmt_ms(ref("disk", s)) for s in sizes)
            + " ms with it on the store's filesystem (no disk freeze in either), so forkvm's "
            "live pause should be close to the /dev/shm figure plus its disk freeze.")
    if sizes and any(v == v for v in kf["diff"].values()):
        out.append(
            "- **Diff pause, part by part** (idle clone, p50s, ms): "
            + "; ".join(f"{s} MiB: {fmt_ms(kf['diff'][s])} = "
                        f"{parts_text(pause_parts(sel(rows, 'size', 'diff', s)))}; the clone "
                        f"held {fmt(p50(sel(rows, 'size', 'diff', s), 'clone_private_mib'), 1)}"
                        " MiB private, memory.diff "
                        f"{fmt(p50(sel(rows, 'size', 'diff', s), 'memory_diff_mib'), 1)} MiB"
                        for s in sizes)
            + ". Inside the pause the daemon lists the clone's private pages with one "
            "PAGEMAP_SCAN ioctl over its RAM mapping and reads them with process_vm_readv, on "
            "another thread while QEMU saves the device state and the disk freezes, so that "
            "part overlaps the two before it and is not added into the sum; comparing against "
            "the parent and writing `memory.diff` happen after `cont` (`publish`).")
    if dirties and any(sel(rows, "dirty", "diff")):
        out.append(
            "- **Diff vs dirtied memory** (p50 pause, ms; private MiB read in the pause): "
            + "; ".join(f"D={x}: {fmt_ms(p50(sel(rows, 'dirty', 'diff', dirty=x)))} "
                        f"({fmt(p50(sel(rows, 'dirty', 'diff', dirty=x), 'clone_private_mib'))}"
                        f" MiB, copy_memory "
                        f"{fmt_ms(p50(sel(rows, 'dirty', 'diff', dirty=x), 'copy_memory_ms'))})"
                        for x in dirties)
            + ". What the clone wrote is read while it is stopped, so the diff pause grows with "
            "it; live mode copies dirty memory while the guest runs.")
    if 4096 in sizes:
        nv, nl = kf["naive"][4096], kf["naive_nolimit"][4096]
        out.append(
            f"- **Naive at 4096 MiB** is {fmt_ms(nv)} ms with QEMU's defaults and {fmt_ms(nl)} "
            "ms with the bandwidth cap lifted (booted source; on the clone "
            f"{fmt_ms(kf['naive_clone'][4096])} / {fmt_ms(kf['naive_nolimit_clone'][4096])} ms). "
            "The naive save of an idle guest is cheap: QEMU sends a zero page as a few bytes, "
            "so the state file is only the touched memory "
            f"({fmt(p50(sel(rows, 'size', 'naive', 4096), 'state_file_mib'))} MiB), though it "
            "still reads all of RAM to find the zero pages; QEMU's default bandwidth cap of "
            f"{(ctx.get('qemu_defaults') or {}).get('max-bandwidth', 0) / 2**20:.0f} MiB/s "
            f"throttles the rest. A {NAIVE_TARGET:.0f}× margin needs a branch pause of "
            f"{fmt_ms(nv / NAIVE_TARGET)} ms (defaults) or {fmt_ms(nl / NAIVE_TARGET)} ms (cap "
            "lifted). Full mode copies the whole RAM file inside the pause (`copy_memory`).")
    alloc_rows = [r for r in rows if r["experiment"] == "size" and r["mode"] == "live"
                  and r["run"] == 1]
    if alloc_rows:
        out.append(
            "- **A live branch makes the source's whole RAM file resident.** The booted "
            "source's `share=on` RAM file in /dev/shm went from "
            + ", ".join(f"{fmt(r['ram_file_before_mib'])}→{fmt(r['ram_file_after_mib'])} MiB "
                        f"({r['size_mib']} MiB guest)" for r in alloc_rows)
            + " allocated across the first live branch: the precopy reads every guest page "
            "(zero-page detection), and a read fault on a shared tmpfs mapping allocates the "
            "page. Every later `full` branch then sparse-copies (reads and zero-checks) the "
            "whole file inside its pause.")
    out += full_stalls(rows)
    if dirties:
        hi = max(dirties)
        lv = p50(sel(rows, "dirty", "live", dirty=hi))
        fu = p50(sel(rows, "dirty", "full", dirty=hi))
        df = p50(sel(rows, "dirty", "diff", dirty=hi))
        nv = p50(sel(rows, "dirty", "naive", dirty=hi))
        nl = p50(sel(rows, "dirty", "naive_nolimit", dirty=hi))
        nvc = p50(sel(rows, "dirty", "naive_clone", dirty=hi))
        sh = p50(sel(rows, "dirty", "qemu_live_shm", dirty=hi))
        out.append(
            f"- **With {hi} MiB dirtied** ({args.dirty_memory} MiB guest): live "
            f"{fmt_ms(lv)} ms, full {fmt_ms(fu)} ms, diff {fmt_ms(df)} ms; naive {fmt_ms(nv)} ms "
            f"(cap lifted {fmt_ms(nl)} ms; on the clone {fmt_ms(nvc)} ms): live is "
            f"{rp.ratio(nv, lv):.1f}× / {rp.ratio(nl, lv):.1f}× shorter than naive, diff "
            f"{rp.ratio(nvc, df):.1f}× shorter than naive on its clone. The bench's own live save "
            f"with its file on /dev/shm pauses {fmt_ms(sh)} ms.")
    chain = ctx.get("chain") or {}
    if chain and any(r["experiment"] == "chain" for r in rows):
        flat = chain_stats(rows, "flat")["p50"]
        out.append(
            "- **Spawn vs chain depth** (server total_ms p50): "
            + ", ".join(f"{s['label']} {fmt_ms(chain_stats(rows, s['label'])['p50'])} ms "
                        f"({rp.ratio(chain_stats(rows, s['label'])['p50'], flat):.2f}× flat)"
                        for s in chain.get("snapshots", []))
            + f". Flattening the depth-{args.chain_depth} head took "
            f"{fmt_ms(chain.get('flatten_ms'))} ms.")
    return out


def full_stalls(rows, factor: float = 3.0) -> list[str]:
    """Full-mode branches of the size experiment whose `copy_memory` took more
    than `factor` × the p50 of their size: stalls while writing memory.img."""
    hits = []
    for size in sorted({r["size_mib"] for r in rows if r["experiment"] == "size"}):
        rs = sel(rows, "size", "full", size)
        med = p50(rs, "copy_memory_ms")
        hits += [(r, med) for r in rs if med == med and r["copy_memory_ms"] > factor * med]
    if not hits:
        return []
    return [
        "- **Full-mode stalls.** "
        + "; ".join(f"{r['size_mib']} MiB run {r['run']}: pause {fmt_ms(r['pause_ms'])} ms, of "
                    f"which `copy_memory` {fmt_ms(r['copy_memory_ms'])} ms (p50 of that size "
                    f"{fmt_ms(med)} ms; RAM file {fmt(r['ram_file_before_mib'])} MiB allocated)"
                    for r, med in hits)
        + ". Full mode writes `memory.img` into the store on disk while the source is "
        "stopped, so a write that waits on the page cache's writeback lands in the pause; "
        "these runs are in the p90/max columns."]


def method_text(args) -> list[str]:
    return [
        "One private daemon (`forkvm serve`, release build) in a temp home under /tmp whose "
        "`guest` and `images` are symlinks to the installed artefacts; everything in one run. "
        "Percentiles use linear interpolation between closest ranks (numpy's default). No run "
        "is discarded.",
        "",
        "**forkvm branches**: `POST /v1/sandboxes/{id}/branch {\"mode\": \"live\"|\"full\"|"
        "\"diff\", \"count\": 0}`, one at a time; `pause_ms` is the daemon's, from QEMU's STOP "
        "and RESUME event timestamps (how long the source's vCPUs were stopped). The other "
        "columns are the snapshot's server `timings` and the response's `snapshot_ms`/"
        "`total_ms`; `wall_ms` is the client's time until the 201. The snapshot must be `live` "
        "(live), `shared` (full, booted source) or `diff` at depth 1 (diff, clone source). "
        "Right after each live/full branch the bench reads `query-migrate` on the source's QMP "
        "socket for QEMU's own `downtime`, RAM sent and dirty-sync count (a diff saves device "
        "state with `xen-save-devices-state`, not a migration), and stats the booted source's "
        "RAM file in /dev/shm before and after; before each diff branch it reads the clone's "
        "private RAM (the `Anonymous` KiB of its QEMU's mapping of the base memory image, from "
        "/proc/<pid>/smaps). In the size and dirty experiments each snapshot is deleted "
        "(`DELETE /v1/snapshots/{id}?force=true`) right after; live and full alternate full, "
        "live, full, … on the booted source, then the diff branches run on the clone.",
        "",
        "**naive** (the baseline): over the source's QMP socket, every migration capability "
        "turned off (forkvm leaves `x-ignore-shared` or `mapped-ram` on), `max-bandwidth` and "
        "`downtime-limit` set to QEMU's defaults (read from the freshly booted source, before "
        "any branch), then `stop`, `migrate {\"uri\": \"file:<source dir>/naive-state.bin\"}` "
        "(all RAM and device state, to the same filesystem as the store), `query-migrate` "
        "polled every 1 ms until `completed`, `cont`. The pause is STOP→RESUME from QEMU's "
        "event timestamps, exactly as the daemon measures (the client clock from sending "
        "`stop` to the `cont` reply is in `clock_ms`; it is used only if an event is missing, "
        "and `pause_source` says so). **naive_nolimit** is the same with `max-bandwidth` "
        "lifted to 64 GiB/s, as forkvm's live mode sets it. Capabilities and parameters are "
        "put back afterwards and the state file removed. The naive runs come after the "
        "branches of a source, alternating the two variants; `naive_clone` / "
        "`naive_nolimit_clone` are the same on the clone source, after its diff branches.",
        "",
        "**References** (not forkvm): `stop_cont` is QMP `stop` then `cont` with nothing in "
        "between (the floor). `qemu_live_disk`/`qemu_live_shm` run the live save forkvm's "
        "live mode runs (capability `mapped-ram` on and the others off, `downtime-limit` 5 ms, "
        "`max-bandwidth` 64 GiB/s, `migrate` to a file, `query-migrate` polled every 1 ms) "
        "from the bench, with the file in the source's own directory in the daemon home (same "
        "filesystem as the store) or in its RAM scratch directory on /dev/shm, then `cont` at once (no disk freeze, no hashing).",
        "",
        f"**size**: for each size a booted source (`POST /v1/sandboxes {{\"memory_mib\": M, "
        f"\"cpus\": 1, \"use_template\": false}}`) rests {args.settle:.0f} s; its base snapshot "
        f"is taken; then {args.floor_runs} × stop_cont; {args.runs} × (full, live); "
        f"{args.ref_runs} × (qemu_live_disk, qemu_live_shm); the naive pairs; once in the "
        "whole run a diff branch of it (the fallback check); it is deleted. Then the clone is "
        f"spawned from the base, rests {args.settle:.0f} s: {args.runs} × diff, "
        f"{min(args.naive_runs, args.clone_naive_runs)} × (naive_clone, naive_nolimit_clone); "
        "clone and base are deleted.",
        "",
        f"**dirty**: for each D a fresh {args.dirty_memory} MiB booted source; its base is "
        "taken before anything is filled; a guest `python3 -c` started with `setsid` in the "
        "background allocates `bytearray(os.urandom(1 MiB)) * D` and, once filled, reports "
        f"through a file and sleeps; the bench checks its VmRSS, waits {args.settle:.0f} s, then "
        f"{args.dirty_runs} × (full, live), {args.dirty_ref_runs} × (qemu_live_disk, "
        f"qemu_live_shm), {args.dirty_naive_runs} × (naive, naive_nolimit); deleted. Then the "
        "clone: spawned from the base, the same fill, the same wait, "
        f"{args.dirty_runs} × diff, {args.dirty_naive_runs} × (naive_clone, naive_nolimit_clone).",
        "",
        f"**consecutive**: one {args.consecutive_memory} MiB booted source runs "
        f"`{COUNTER_LOOP}` (started with setsid in the background); its base is taken with the "
        f"loop running. Counter read, {args.counter_gap:.0f} s, read; {args.consecutive} live "
        "branches back to back (each call starts as soon as the previous one has returned; the "
        f"snapshots are kept until the block ends); read at once, {args.counter_gap:.0f} s, "
        "read; the block's snapshots deleted; the same with full. Then on the clone (whose "
        "loop carries on from the base) the same with diff. Each source must keep counting.",
        "",
        f"**chain**: a {args.chain_memory} MiB booted source rests, its `shared` snapshot is "
        f"depth 0, it is deleted. For k = 1..{args.chain_depth}: spawn from the head (no rest), "
        f"fill {args.chain_dirty} MiB as in **dirty**, write `{CHAIN_FILE.format(k='k')}` and "
        "`sync`, `branch {\"mode\": \"diff\", \"count\": 0}` (must be `diff` at depth k), delete "
        "the clone. `POST /v1/snapshots/{head}/flatten` (must be `shared`, no parent). Every "
        "snapshot must have `pool_size` 0. Then "
        f"{args.chain_runs} rounds: one `POST /v1/sandboxes {{\"snapshot\": id, \"count\": 1}}` "
        "per snapshot, order rotated by one each round, `from_pool` must be false, the child "
        "deleted after each (in round 1 it is first checked to see the files of links 1..k).",
        "",
        "**Host noise**: around every measurement, the CPU time of everything on the host "
        "except this bench and the daemon with their descendants (guests included) is "
        "summed from /proc, divided by the wall time (`other_cpu_cores` in the CSV).",
    ]


def print_summary(rows, ctx, args) -> None:
    print("\nSummary: pause (ms)")
    print(f"{'experiment':<12}{'x':>6} {'mode':<20}{'source':<8}{'n':>4}{'min':>10}{'p50':>10}"
          f"{'p90':>10}{'max':>10}{'naive/p50':>11}")
    keys = sorted({(r["experiment"], r["size_mib"] if r["experiment"] != "dirty"
                    else r["dirty_mib"]) for r in rows if r["experiment"] in ("size", "dirty")},
                  key=lambda k: (k[0] != "size", k[1]))
    for exp, x in keys:
        xkey = "size_mib" if exp == "size" else "dirty_mib"
        cell = [r for r in rows if r["experiment"] == exp and r[xkey] == x]
        for mode in MODE_ORDER:
            rs = [r for r in cell if r["mode"] == mode]
            if rs:
                s = pstat(rs)
                nv = p50([r for r in cell if r["mode"] == naive_modes(mode)[0]])
                print(f"{exp:<12}{x:>6} {mode:<20}{source_of(mode):<8}{s['n']:>4}"
                      f"{fmt_ms(s['min']):>10}{fmt_ms(s['p50']):>10}{fmt_ms(s['p90']):>10}"
                      f"{fmt_ms(s['max']):>10}{fmt(rp.ratio(nv, s['p50']), 1):>10}×")
    for mode in BRANCH_MODES:
        rs = sel(rows, "consecutive", mode)
        if rs:
            s = pstat(rs)
            print(f"{'consecutive':<12}{rs[0]['size_mib']:>6} {mode:<20}{source_of(mode):<8}"
                  f"{s['n']:>4}{fmt_ms(s['min']):>10}{fmt_ms(s['p50']):>10}"
                  f"{fmt_ms(s['p90']):>10}{fmt_ms(s['max']):>10}")
    snaps = (ctx.get("chain") or {}).get("snapshots", [])
    if any(r["experiment"] == "chain" for r in rows):
        flat = chain_stats(rows, "flat")["p50"]
        print("\nSummary: spawn from a chain (server total_ms)")
        print(f"{'snapshot':<10}{'kind':<8}{'n':>4}{'min':>10}{'p50':>10}{'p90':>10}{'max':>10}"
              f"{'÷ flat':>9}")
        for s in snaps:
            st = chain_stats(rows, s["label"])
            if st["n"]:
                print(f"{s['label']:<10}{s['kind']:<8}{st['n']:>4}{fmt_ms(st['min']):>10}"
                      f"{fmt_ms(st['p50']):>10}{fmt_ms(st['p90']):>10}{fmt_ms(st['max']):>10}"
                      f"{rp.ratio(st['p50'], flat):>8.2f}×")
    if ctx.get("jail"):
        print("\nJail cost (jailed ÷ unjailed, comparison segments; ms)")
        for r in ctx["jail"]:
            j, u = r[rp.JAILED], r[rp.UNJAILED]
            print(f"  {r['label']:<38} jailed {fmt_ms(j['p50'])}/{fmt_ms(j['p90'])}  unjailed "
                  f"{fmt_ms(u['p50'])}/{fmt_ms(u['p90'])}  ratio p50 {r['ratio_p50']:.3f}× "
                  f"p90 {r['ratio_p90']:.3f}×")
    print("\nTargets:")
    for t in targets(rows, ctx, args):
        print(f"  [{t['verdict']}] {t['target']}: {t['figure'].replace('**', '')}")
