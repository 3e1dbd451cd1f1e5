"""The spawn benchmark's RESULTS.md (with its jail section and method) and
the terminal summary.
"""

from __future__ import annotations

import math
from pathlib import Path

import report as rp
from spawn_cases import (
    DENSITY_TARGET_MIB, MEMORY_TARGET, MIN_RUNS, NAT, NAT_TARGET, NOISY_CORES, SPEED_TARGET,
    fmt,
)
from spawn_stats import density_ok, density_reason, key_figures, mib, p50, stats_rows


def unit_ms(v) -> str:
    return "–" if v is None or v != v else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def jail_section(jrows, rows, ctx, args) -> list[str]:
    """RESULTS.md's "Jail cost": the comparison's table and per-segment p50s."""
    ratios = ctx["jail"]
    if not ratios:
        return ["", "## Jail cost", "", "Not measured (`--no-jail-compare`): every figure "
                "above is jailed; there is no unjailed counterpart in this run."]
    segs = sorted({r["segment"] for r in jrows if r["case"] in ("spawn_cold_pool_off",
                                                                 "spawn_warm_pool")})
    side_of = {r["segment"]: r["jail"] for r in jrows}
    n = {s: sum(1 for r in jrows if r["jail"] == s and r["case"] == "spawn_cold_pool_off")
         for s in (rp.JAILED, rp.UNJAILED)}
    L = ["", "## Jail cost", "",
         "Segments of this run, one private daemon each, one at a time, in this order: "
         + ", ".join(f"{s} {side_of[s]}" for s in segs)
         + " (`FORKVM_NO_JAIL=0` / `=1`), all before the main run; each cold-boots its own "
         f"source and snapshots it as the main run does, then times spawn_cold_pool_off, then "
         f"spawn_warm_pool (pool {args.pool_size}): {n[rp.JAILED]} runs per case jailed and "
         f"{n[rp.UNJAILED]} unjailed in all, split evenly over the segments of each side. Every "
         "clone's QEMU uid was checked: non-root when jailed, root when not. Milliseconds.", ""]
    L += rp.jail_ratio_table(ratios, "naive restore p50", lambda r: unit_ms(r["naive"]["p50"]),
                             unit_ms, lambda v: f"{v:.3f}×")
    L += ["", "Ratios above 1 mean the jail costs time. \"÷ naive\" is each side's p50 over the "
          "naive restore's p50 of the main run (plain QEMU as root, no jail; below 1: forkvm is "
          "faster).", "",
          "Per segment (p50, ms; client wall / server `total_ms`):", "",
          "| segment | daemon | spawn_cold_pool_off | spawn_warm_pool | other cores p50 |",
          "|---:|---|---:|---:|---:|"]
    for sg in segs:
        rs = [r for r in jrows if r["segment"] == sg]
        cell = lambda c, k: rp.summarize(r.get(k) for r in rs if r["case"] == c)["p50"]  # noqa: E731
        oc = rp.summarize(r.get("other_cpu_cores") for r in rs)["p50"]
        L.append(f"| {sg} | {side_of[sg]} | "
                 f"{unit_ms(cell('spawn_cold_pool_off', 'total_ms'))} / "
                 f"{unit_ms(cell('spawn_cold_pool_off', 'server_total_ms'))} | "
                 f"{unit_ms(cell('spawn_warm_pool', 'total_ms'))} / "
                 f"{unit_ms(cell('spawn_warm_pool', 'server_total_ms'))} | {oc:.2f} |")
    spread = {}
    for c in ("spawn_cold_pool_off", "spawn_warm_pool"):
        for side in (rp.JAILED, rp.UNJAILED):
            v = [rp.summarize(r["total_ms"] for r in jrows if r["segment"] == sg
                              and r["case"] == c)["p50"] for sg in segs if side_of[sg] == side]
            if len(v) > 1 and min(v) > 0:
                spread[(c, side)] = max(v) / min(v)
    if spread:
        L += ["", "How far one side's segments differ from each other (client wall p50, larger "
              "over smaller): " + "; ".join(
                  f"{c} {side} {v:.2f}×" for (c, side), v in spread.items())
              + ". A jailed/unjailed ratio within that spread is not a jail cost this run can "
              "resolve from the host's drift."]
    main = {c: p50(rows, c) for c in ("spawn_cold_pool_off", "spawn_warm_pool")}
    L += ["", "The main run's jailed figures of the same cases (its own daemon, after these "
          f"segments, N = {args.runs}): client wall p50 {unit_ms(main['spawn_cold_pool_off'])} "
          f"ms without a pool, {unit_ms(main['spawn_warm_pool'])} ms from the warm pool."]
    return L


def write_results(path: Path, rows, mem_rows, ctx: dict, args, jrows=()) -> None:
    info, machine, snap, saved = ctx["info"], ctx["machine"], ctx["snapshot"], ctx["saved"]
    kf = key_figures(rows, mem_rows, max(args.clones))
    burst = f"burst{args.burst_size}"
    L = []
    if args.smoke:
        L += rp.smoke_banner(f"N={args.runs} < {MIN_RUNS}", "bash bench/spawn/run.sh")
    L += [
        "# Spawn benchmark: forkvm clones from a snapshot vs naive QEMU save/restore",
        "",
        rp.date_line(ctx["started"], ctx["elapsed"]),
        rp.forkvm_line(info, rp.git_revision()),
        f"- Machine: {rp.machine_text(machine)}, "
        + (f"{ctx['swap_kib'] // 1024} MiB swap" if ctx.get("swap_kib") else "no swap"),
        f"- Kernel: Linux {machine['kernel']}; load average at start: "
        + rp.loadavg_text(machine),
        rp.accel_line(info),
        f"- QEMU: {rp.qemu_text(info)}",
        f"- Guest: {args.memory} MiB RAM, 1 vCPU, image `default`; source cold-booted with "
        f"`network: none`, settled {args.settle:.0f} s, then snapshotted; its clones are "
        "spawned with `network: none` and the naive copies have no way out either"
        + (" (on this host a `none` sandbox still has its NIC, a tap alone in a network "
           "namespace of its own, with no uplink; each naive copy runs in a namespace of its "
           "own holding the same tap)" if ctx.get("naive_nic") else "")
        + f"; `{NAT}` uses a second source booted with the default network (`nat`)",
        f"- Runs: N = {args.runs} per latency case" + (" (SMOKE)" if args.smoke else "")
        + f"; {args.burst_runs} bursts of {args.burst_size}; memory at K = "
        + ", ".join(str(k) for k in args.clones),
    ]
    seg = ctx.get("naive_segment")
    L += ["- **Jail:** every figure of the main run is **jailed**: its daemon ran with "
          "`FORKVM_NO_JAIL=0`, and every sandbox QEMU (source, clones, pooled, bursts, the "
          "memory clones) was checked to run as a non-root uid (the source's: "
          f"{ctx.get('main_uid')}). The naive baseline is plain QEMU started by the bench as "
          "root (`jail` = unjailed in the CSV); its saved state comes from the source of "
          + (f"unjailed segment {seg} of the jail comparison" if seg else
             "an unjailed daemon started only for that")
          + " (a jailed QEMU cannot write outside its own directories, and its command line "
          "names a tap fd it inherited, so it cannot be replayed). "
          + ("The jail's cost is under **Jail cost** below." if ctx.get("jail") else
             "No jail comparison in this run (`--no-jail-compare`).")]
    oc = {c: rp.summarize(r.get("other_cpu_cores") for r in rows if r["case"] == c)
          for c in ("spawn_cold_pool_off", "spawn_warm_pool", NAT, "naive_restore", burst)}
    timed = [r for r in rows if r["case"] in oc]
    L += ["- Host noise — average cores kept busy by processes other than this bench's, per "
          "timed run (`other_cpu_cores` in spawn.csv): "
          + "; ".join(f"{c} p50 {s['p50']:.2f}, max {s['max']:.2f}" for c, s in oc.items()
                      if s["n"])
          + f" (of {machine['cores']}); {sum((r.get('other_cpu_cores') or 0) > NOISY_CORES for r in timed)}"
          + f" of {len(timed)} runs had more than {NOISY_CORES} (orange in the plot)"]
    busy = rp.summarize(r.get("other_cpu_cores") for r in [*timed, *jrows])
    if busy["n"] and busy["p50"] > NOISY_CORES:
        L += [f"- **Shared host:** other processes kept p50 {busy['p50']:.2f} (max "
              f"{busy['max']:.2f}) of the {machine['cores']} cores busy during the timed runs "
              "(main run and jail comparison), so absolute times are inflated against a quiet "
              "host; the jail comparison's alternating segments weigh that on both sides "
              "alike."]
    if ctx["others"]:
        L += [f"- **Host not quiet:** QEMU processes not started by this bench were alive when "
              f"{ctx['busy_runs']} of the timed runs started:"]
        L += [f"  - pid {p}: `{c[:110]}`" for p, c in sorted(ctx["others"].items())]
    else:
        L += ["- No other QEMU process was running on the host (checked before each timed run "
              "and each memory step)."]

    # Targets
    sp_ok = kf["speedup"] >= SPEED_TARGET
    mem_ok = kf["mem_ratio"] < MEMORY_TARGET
    fk, nv = kf["fk"], kf["nv"]
    K = max(args.clones)
    L += ["", "## Targets", "",
          "| target | result | verdict |", "|---|---|---|",
          f"| warm-pool spawn p50 ≥ {SPEED_TARGET:.0f}× faster than the naive restore p50 "
          "(both without a network) | "
          f"{kf['naive_p50']:,.0f} / {kf['warm_p50']:,.0f} ms = **{kf['speedup']:.2f}×** | "
          f"**{'PASS' if sp_ok else 'MISS'}** |",
          f"| {K} clones < {MEMORY_TARGET:.0%} of the memory of {K} naive copies | "
          + (f"{mib(fk['pss_kib'])} MiB / {mib(nv['total_kib'])} MiB"
             + (" (naive extrapolated)" if nv["measured"] != "yes" else "")
             + f" = **{kf['mem_ratio']:.1%}**" if fk and nv else "not measured")
          + f" | **{'PASS' if mem_ok else 'MISS'}** |",
          f"| default nat warm-pool spawn p50 ≥ {NAT_TARGET:.0f}× faster than the naive restore "
          "p50 (issue 16, target 4) | "
          + (f"{kf['naive_p50']:,.0f} / {kf['nat_p50']:,.0f} ms = **{kf['nat_speedup']:.2f}×** | "
             f"**{'PASS' if kf['nat_speedup'] >= NAT_TARGET else 'MISS'}** |"
             if kf["nat_p50"] == kf["nat_p50"] else "not run | **N/A** |"),
          f"| {K} idle clones ≤ {DENSITY_TARGET_MIB:,} MiB Σ PSS (issue 16, target 6) | "
          + (f"**{mib(fk['pss_kib'])} MiB** ({fk['per_vm_pss_kib'] / 1024:.1f} MiB per clone; "
             f"the target allows {DENSITY_TARGET_MIB / K:.1f}) | "
             f"**{'PASS' if density_ok(fk) else 'MISS'}** |" if fk else "not measured | **N/A** |"),
          ""]
    if kf["nat_p50"] == kf["nat_p50"]:
        L += [f"- The default configuration (nat networking, wait_for_network), `{NAT}`: "
              f"pooled spawn p50 **{kf['nat_p50']:,.0f} ms**, naive restore p50 / that = "
              f"{kf['naive_p50']:,.0f} / {kf['nat_p50']:,.0f} = **{kf['nat_speedup']:.2f}×**. "
              "Not like for like: the naive restore has no network (its NIC has no uplink; it "
              "sets none up and waits for no probe), while this spawn includes the uplink's "
              f"set-up (`network` p50 {p50(rows, NAT, 'network_ms'):,.0f} ms) and, after its "
              "identity, the agent's probe of the gateway (`network_ready` p50 "
              f"{p50(rows, NAT, 'network_ready_ms'):,.0f} ms from the resume, identity "
              "included). Against the no-network warm pool (p50 "
              f"{kf['warm_p50']:,.0f} ms) the default configuration costs "
              f"{kf['nat_p50'] - kf['warm_p50']:+,.0f} ms at the p50."]
    elif ctx.get("nat_skipped"):
        L += [f"- `{NAT}` was not run: {ctx['nat_skipped']}."]
    L += [f"- Clone without a pool: p50 {kf['cold_p50']:,.0f} ms, {kf['cold_speedup']:.2f}× "
          "faster than the naive restore.",
          f"- Burst: one `POST {{\"snapshot\", \"network\": \"none\", \"count\": "
          f"{args.burst_size}}}` p50 "
          f"**{p50(rows, burst):,.0f} ms** wall for {args.burst_size} clones "
          f"(min {fmt(min((r['total_ms'] for r in rows if r['case'] == burst), default=math.nan))}, "
          f"max {fmt(max((r['total_ms'] for r in rows if r['case'] == burst), default=math.nan))}); "
          f"per child server total p50 {p50(rows, burst + '_child'):,.0f} ms."]
    if not sp_ok:
        L += ["", f"**Why the speed target is missed.** {ctx['speed_reason']}"]
    if not mem_ok and fk and nv:
        L += ["", "**Why the memory target is missed.** " + ctx.get("mem_reason", "")]
    if fk:
        L += ["", ("**Why the density target is missed.** " if not density_ok(fk) else
                   "**Where the clones' memory goes.** ") + density_reason(fk, ctx)]

    L += jail_section(list(jrows), rows, ctx, args)

    # Latency table
    L += ["", "## Latency", ""]
    L += rp.stats_table(stats_rows(rows), with_n=True, total_label=lambda c: (
        "**total (server, per child)**" if c == burst + "_child" else "**total (client wall)**"))
    L += ["", f"All times in milliseconds. `{burst}` total is the wall time of one POST for all "
          f"{args.burst_size} clones; `{burst}_child` is each child's own server `total_ms` "
          f"({args.burst_runs} × {args.burst_size} children)."
          + (f" `{NAT}`: `network` is the host-side set-up before the resume (the uplink veth, "
             "its addresses and rules; a pooled process's namespace and tap exist already), "
             "`network_ready` runs from the resume until the agent's probe of the gateway came "
             "back, so it includes `identity`." if any(r["case"] == NAT for r in rows) else "")]
    nn = rp.summarize(r.get("netns_ms") for r in rows if r["case"] == "naive_restore")
    if nn["n"]:
        L += ["", "Each naive restore's network namespace and tap were made before its clock "
              f"started (p50 {nn['p50']:,.0f} ms, max {nn['max']:,.0f} ms; `netns_ms` in "
              "spawn.csv, not in its total), like its disk copy; a forkvm clone without a pool "
              "makes its namespace and tap inside `prepare`."]
    for key, what in (("pool_leftovers", "the bursts"), ("nat_pool_leftovers", "the next case")):
        if ctx.get(key):
            L += ["", f"**Pool off:** after the pool size was set to 0, {ctx[key]} pooled "
                  "QEMU(s) were still being served (a refill in flight when the size dropped "
                  "parks its process anyway, and `GET /v1/info` no longer lists a size-0 pool); "
                  f"they were claimed and deleted before {what} (not timed)."]
    first = ctx.get("first_spawn")
    if first:
        L += ["", f"The very first clone of the snapshot (not in the table; it also verifies the "
              f"snapshot's files once) took {first['total_ms']:,.0f} ms wall "
              f"(server: prepare {fmt(first['prepare_ms'])}, qemu {fmt(first['qemu_start_ms'])}, "
              f"restore {fmt(first['restore_ms'])}, identity {fmt(first['identity_ms'])})."]
    first = ctx.get("nat_first_spawn")
    if first:
        L += ["", f"Likewise the first clone of the nat snapshot took {first['total_ms']:,.0f} ms "
              f"wall (server: prepare {fmt(first['prepare_ms'])}, qemu "
              f"{fmt(first['qemu_start_ms'])}, network {fmt(first['network_ms'])}, restore "
              f"{fmt(first['restore_ms'])}, identity {fmt(first['identity_ms'])}, network_ready "
              f"{fmt(first['network_ready_ms'])})."]

    # Snapshot and naive save
    st, sz = snap.get("timings") or {}, snap.get("sizes") or {}
    L += ["", "## The snapshot and the naive save", "",
          f"- forkvm snapshot (`{snap.get('kind')}`): client wall {ctx['snapshot_wall_ms']:,.0f} ms; "
          f"source paused {fmt(st.get('pause_ms'))} ms (device state {fmt(st.get('save_state_ms'))}, "
          f"disk freeze {fmt(st.get('freeze_disk_ms'))}, RAM copy {fmt(st.get('copy_memory_ms'))}), "
          f"publish {fmt(st.get('publish_ms'))}, server total {fmt(st.get('total_ms'))} ms",
          f"- snapshot sizes: memory.img {sz.get('memory_bytes', 0) / 2**20:.0f} MiB apparent, "
          f"**{sz.get('memory_allocated_bytes', 0) / 2**20:.1f} MiB allocated**; device state "
          f"{sz.get('device_state_bytes', 0) / 1024:.0f} KiB; disk layer "
          f"{sz.get('disk_bytes', 0) / 2**20:.1f} MiB",
          "- naive save of the naive baseline's source (unjailed"
          + (f", segment {ctx['naive_segment']}" if ctx.get("naive_segment") else "")
          + "; booted, settled and snapshotted like the one above) right after its snapshot "
          f"(`stop` + `migrate` to a file until `completed`): {saved.save_ms:,.0f} ms; state file {saved.state_bytes / 2**20:.1f} MiB; "
          + (f"capabilities turned off first: {', '.join(saved.caps_reset)} (the snapshot had "
             "set them)" if saved.caps_reset else "no capability was on")
          + f"; QEMU's default max-bandwidth {(saved.max_bandwidth or 0) / 2**20:.0f} MiB/s"]
    ns = ctx.get("nat_snapshot")
    if ns:
        nst, nsz = ns.get("timings") or {}, ns.get("sizes") or {}
        L += [f"- the nat source's snapshot (`{ns.get('kind')}`, for `{NAT}`): source paused "
              f"{fmt(nst.get('pause_ms'))} ms, server total {fmt(nst.get('total_ms'))} ms; "
              f"memory.img {nsz.get('memory_allocated_bytes', 0) / 2**20:.1f} MiB allocated"]

    # Memory
    L += ["", "## Memory", "",
          "| K | kind | VMs | Σ PSS | Σ RSS | Σ private dirty | Σ Pss_Shmem | Σ RAM files "
          "(/dev/shm) | **total** | per VM total | theoretical K × RAM | MemAvailable drop | "
          "Shmem Δ | Cached Δ |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in mem_rows:
        ext = r["measured"] != "yes"
        tot = r["pss_kib"] if r["kind"] == "forkvm" else r["total_kib"]
        L.append(
            f"| {r['k']} | {r['kind']}{' (extrapolated)' if ext else ''} | {r['vms']} | "
            f"{mib(r['pss_kib'])} | {mib(r['rss_kib'])} | {mib(r['private_dirty_kib'])} | "
            f"{mib(r['pss_shmem_kib'])} | {mib(r['shm_alloc_kib'])} | **{mib(tot)}** | "
            f"{mib(r['per_vm_total_kib'] if r['kind'] == 'naive' else r['per_vm_pss_kib'], 1)} | "
            f"{mib(r['theoretical_kib'])} | "
            + ("–" if ext else mib(r["memavail_drop_kib"])) + " | "
            + ("–" if ext else mib(r["shmem_delta_kib"])) + " | "
            + ("–" if ext else mib(r["cached_delta_kib"])) + " |")
    L += ["", "All figures in MiB. " + ctx["mem_explanation"]]
    notes = [r for r in mem_rows if r.get("note")]
    if notes:
        L += ["", "Notes:"] + [f"- K={r['k']} {r['kind']}: {r['note']}" for r in notes]

    L += ["", "Raw data: `spawn.csv` (one row per timed run, per burst child, plus the snapshot "
          "and the naive save), `memory.csv`. Plot: `spawn.png`.", ""]
    L += ["## Method", ""] + ctx["method"]
    path.write_text("\n".join(L) + "\n")


def method_text(args, burst: str, ctx: dict) -> list[str]:
    nic = ctx.get("naive_nic")
    return [
        "One private daemon (`forkvm serve`, release build) in a temp home whose `guest` and "
        "`images` are symlinks to the installed artefacts; everything in one run. "
        "Percentiles use linear interpolation between closest ranks (numpy's default). "
        "No run is discarded.",
        "",
        f"**Source.** `POST /v1/sandboxes {{\"memory_mib\":{args.memory},\"cpus\":1,"
        "\"use_template\":false,\"network\":\"none\"}` (a cold boot: the sandbox owns its "
        "`share=on` RAM file), "
        f"{args.settle:.0f} s of rest, then `POST /v1/sandboxes/{{id}}/snapshot` (timed; the "
        "source keeps running). **Like for like on the network:** a sandbox without `network` "
        "gets `nat` (its own namespace, a tap NIC, an uplink, and a spawn that waits for a "
        "network probe), which a naive copy of the QEMU command line cannot reproduce, so the "
        "source, every clone of it (each POST says `\"network\":\"none\"`; without it a clone "
        "of this snapshot would get `nat`) and every naive copy run without a network. "
        + ("On this host (networking available) a `none` sandbox still has its virtio-net NIC "
           "on a tap alone in a network namespace of its own, without an uplink; the naive "
           "copies get the same: a namespace per copy with the tap made as the daemon makes it "
           "(`ip netns add`, then lo up, `tap0` with the gateway's MAC and address, up; no "
           "uplink), made before the copy's clock starts, and the copy's QEMU is moved into it "
           "with setns(2) before exec, as the daemon starts QEMU. So both sides have the same "
           "NIC and neither has a way out. " if nic else
           "On this host the source has no NIC, and neither have its clones or the naive "
           "copies. ")
        + "The naive baseline's source is made the same way by an unjailed daemon (see the "
        "Jail line above) and, right after its snapshot, saved the naive way over its QMP "
        "socket: every migration capability turned off (the snapshot leaves `x-ignore-shared` "
        "on, which would keep RAM out of the file), `stop`, `migrate "
        "{\"uri\":\"file:<tmp>/state.bin\"}`, `query-migrate` polled until `completed`. The "
        "disk layers that match the saved RAM are copied (the source's current top layer, and "
        "the snapshot's frozen layer below it, rebased onto the copy, so the baseline does not "
        "read forkvm's store). The source is then DELETEd. One clone is spawned and deleted "
        "before any timing (it verifies the snapshot's files once; reported separately).",
        "",
        "**spawn_cold_pool_off** (N runs, no pool): `total` is the client wall time of "
        "`POST /v1/sandboxes {\"snapshot\":\"<id>\",\"network\":\"none\"}` until the 201, "
        "which the daemon sends once the clone's agent has taken its identity. Stages are the "
        "server's `timings`: `prepare` (sandbox dir, qcow2 overlay"
        + (", the clone's namespace and tap" if nic else "") + "), `qemu_start` (QEMU exec "
        "with `-incoming defer` until QMP answers), `restore` (`migrate-incoming` of the "
        "~95 KB device state + `cont`; RAM is the snapshot's `memory.img` mapped "
        "copy-on-write), `identity` (the agent's socket is connected before `cont`; after it, "
        "the identity request — RNG reseed, clock, hostname, machine-id, instance id — whose "
        "answer also proves the agent alive, then a second clock set), `server_total`. Each "
        "clone is DELETEd after (not timed).",
        "",
        "**naive_restore** (N runs, interleaved with spawn_cold_pool_off: clone 1, restore 1, "
        "clone 2, …, so drift in host load hits both alike): the source's QEMU command line "
        "(from `/proc/<pid>/cmdline`) rewritten for a new instance (new QMP and agent sockets, "
        "console log, a fresh copy of the saved top disk layer — copied before the clock "
        "starts — a new `share=on` RAM file in /dev/shm, a new `-name`) plus `-incoming "
        "defer`" + (", in its own namespace with the tap (see Source)" if nic else "")
        + ". `total` runs from just before the QEMU process is spawned until the guest "
        "agent answers a ping; stages: `qemu_start` (spawn until QMP answers), `load` "
        "(`migrate-incoming {\"uri\":\"file:<state>\"}` until `completed`, polled every 5 ms), "
        "`cont`, `agent` (after `cont` until the pong). The state file is read from the page "
        "cache. The QEMU is SIGKILLed (by pid) and its files (and namespace) removed after each "
        "run. The naive "
        "restore does no identity step (its copies would all share RNG state, hostname and "
        "machine-id); a forkvm spawn does that extra work inside its timing.",
        "",
        f"**spawn_warm_pool** (N runs): `PUT /v1/snapshots/{{id}}/pool {{\"size\":"
        f"{args.pool_size}}}`; before each run `GET /v1/info` is polled until the pool shows "
        f"`ready == size == {args.pool_size}`, then {args.pool_settle:.2f} s of rest (not timed), "
        "then one timed spawn exactly as above; the response must say `from_pool: true` or the "
        "bench fails. The pool refills in the background after each claim, which is why each "
        "run first waits for it. Pool size back to 0 at the end.",
        "",
        f"**{NAT}** (N runs; the default configuration): a second source cold-booted exactly "
        "as above but without `network` (so `nat`: its namespace, tap and uplink), settled "
        f"{args.settle:.0f} s, snapshotted, and DELETEd; one clone spawned and deleted "
        "(untimed, it verifies the files); then a pool of the same size and N runs exactly as "
        "for spawn_warm_pool, but each `POST /v1/sandboxes {\"snapshot\":\"<id>\"}` leaves "
        "`network` and `wait_for_network` at their defaults, so the clone gets `nat` (checked) "
        "and the 201 comes only after the agent's probe of the gateway came back. A pooled "
        "process's namespace and tap exist before the claim; the uplink and its rules are made "
        "at the claim (`network`, before the resume). `network_ready` is the resume until the "
        "probe's answer (so it includes `identity`). The naive restore has no counterpart of "
        "either: its ratio to this case is given for orientation, not as the target. Pool back "
        "to 0 and the snapshot DELETEd (`?force=true`) after the case.",
        "",
        f"**{burst}** ({args.burst_runs} runs, pool 0): the client wall time of one "
        f"`POST /v1/sandboxes {{\"snapshot\":\"<id>\",\"network\":\"none\","
        f"\"count\":{args.burst_size}}}` "
        "(the daemon starts all clones concurrently and answers when every one has taken its "
        f"identity). `{burst}_child` rows are each child's server `total_ms`. All DELETEd after.",
        "",
        f"**Memory.** For each K: one `POST … \"network\":\"none\", \"count\": K`, "
        f"{args.idle:.0f} s idle, then for "
        "each clone `GET /v1/sandboxes/{id}` (its `memory`: `rss_kib`, `pss_kib`, "
        "`private_dirty_kib`, from `/proc/<pid>/smaps_rollup` of its QEMU) summed; the same "
        "file is read directly for the Pss_Anon/Pss_File/Pss_Shmem split. `/proc/meminfo` "
        "(MemAvailable, Shmem, Cached) is read before the spawn and after the idle period as a "
        "cross-check. Then the naive copies: started one after another (each a naive restore "
        "as above, with its own fresh `share=on` RAM file in /dev/shm and its own disk copy"
        + (" and namespace" if nic else "") + "), "
        f"all left running; at each K reached, {args.idle:.0f} s idle, then the same smaps "
        "figures per QEMU plus the blocks allocated to each RAM file. Before each copy the "
        f"bench checks that MemAvailable stays above {args.mem_reserve_mib} MiB "
        "(`--mem-reserve-mib`) after it, and stops adding copies otherwise (the host has no "
        "swap and runs other work); the largest K is then extrapolated linearly from the "
        "per-copy mean, which is exact up to the few MiB of shared QEMU code pages because "
        "nothing else is shared between naive copies. All naive QEMUs are SIGKILLed by pid and "
        "their files removed afterwards.",
    ]


def print_summary(rows, mem_rows, clones_max, jail=()) -> None:
    print("\nSummary (ms)")
    print("\n".join(rp.stats_text(stats_rows(rows), case_width=21, with_n=True)))
    print("\nMemory (MiB)")
    print(f"{'K':>4} {'kind':<22}{'VMs':>5}{'ΣPSS':>9}{'ΣRSS':>9}{'Σdirty':>9}{'RAM files':>10}"
          f"{'total':>9}{'per VM':>8}")
    for r in mem_rows:
        tot = r["pss_kib"] if r["kind"] == "forkvm" else r["total_kib"]
        per = r["per_vm_pss_kib"] if r["kind"] == "forkvm" else r["per_vm_total_kib"]
        kind = r["kind"] + ("" if r["measured"] == "yes" else " (extrapolated)")
        print(f"{r['k']:>4} {kind:<22}{r['vms']:>5}{mib(r['pss_kib']):>9}{mib(r['rss_kib']):>9}"
              f"{mib(r['private_dirty_kib']):>9}{mib(r['shm_alloc_kib']):>10}{mib(tot):>9}"
              f"{mib(per, 1):>8}")
    kf = key_figures(rows, mem_rows, clones_max)
    print(f"\nwarm-pool spawn p50 {kf['warm_p50']:,.0f} ms vs naive restore p50 "
          f"{kf['naive_p50']:,.0f} ms: {kf['speedup']:.2f}× (target ≥ {SPEED_TARGET:.0f}×: "
          f"{'PASS' if kf['speedup'] >= SPEED_TARGET else 'MISS'})")
    if kf["nat_p50"] == kf["nat_p50"]:
        print(f"default configuration (nat, wait_for_network) warm-pool spawn p50 "
              f"{kf['nat_p50']:,.0f} ms: naive restore (no network) / that = "
              f"{kf['nat_speedup']:.2f}×")
    if jail:
        print("\nJail cost (jailed ÷ unjailed, comparison segments; ms)")
        for r in jail:
            j, u = r[rp.JAILED], r[rp.UNJAILED]
            print(f"  {r['label']:<36} jailed {unit_ms(j['p50'])}/{unit_ms(j['p90'])}  unjailed "
                  f"{unit_ms(u['p50'])}/{unit_ms(u['p90'])}  ratio p50 {r['ratio_p50']:.3f}× "
                  f"p90 {r['ratio_p90']:.3f}×  ÷ naive {r['jailed_vs_naive']:.3f}× / "
                  f"{r['unjailed_vs_naive']:.3f}×")
    if kf["fk"] and kf["nv"]:
        print(f"{clones_max} clones Σ PSS {mib(kf['fk']['pss_kib'])} MiB vs {clones_max} naive "
              f"copies {mib(kf['nv']['total_kib'])} MiB"
              + (" (extrapolated)" if kf["nv"]["measured"] != "yes" else "")
              + f": {kf['mem_ratio']:.1%} (target < {MEMORY_TARGET:.0%}: "
              f"{'PASS' if kf['mem_ratio'] < MEMORY_TARGET else 'MISS'})")
    if kf["fk"]:
        print(f"{clones_max} idle clones Σ PSS {mib(kf['fk']['pss_kib'])} MiB (target ≤ "
              f"{DENSITY_TARGET_MIB:,} MiB: {'PASS' if density_ok(kf['fk']) else 'MISS'})")
