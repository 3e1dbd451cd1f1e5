"""The registry benchmark's tables, notes, RESULTS.md and PNG plot
(matplotlib).
"""

from __future__ import annotations

from pathlib import Path

import report as rp
from registry_hosts import BASELINE, FIGURES, MIN_RUNS, MiB, NET_POOL_B, STAGES


def p(rows, case: str, key: str = "total_ms") -> dict:
    return rp.summarize(r.get(key) for r in rows if r["case"] == case)


def secs(v) -> str:
    return rp.fmt(v / 1000, 1)


def mib(v) -> str:
    return rp.fmt(None if v is None else v / MiB, 1)


def summary_table(rows) -> list[str]:
    L = ["| figure | forkvm p50 (s) | p90 | skopeo p50 (s) | p90 | forkvm / skopeo (p50) | "
         "MiB forkvm | MiB skopeo |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, what, base in FIGURES:
        f, n = p(rows, case), p(rows, base)
        ratio = rp.ratio(f["p50"], n["p50"])
        L.append(f"| {case}: {what} | **{secs(f['p50'])}** | {secs(f['p90'])} | "
                 f"{secs(n['p50'])} | {secs(n['p90'])} | "
                 f"{'**' + format(ratio, '.2f') + '×**' if ratio == ratio else '–'} | "
                 f"{mib(p(rows, case, 'bytes')['p50'])} | {mib(p(rows, base, 'bytes')['p50'])} |")
    return L


def detail_table(rows) -> list[str]:
    L = ["| case | blobs | skipped (blobs / MiB) | links (skipped or cached) | image | "
         "stored in registry (MiB) | HTTP requests (`GET /v2/` pings) |",
         "|---|---:|---:|---:|---|---:|---:|"]
    for case, _, _ in FIGURES:
        rs = [r for r in rows if r["case"] == case]
        if not rs:
            continue
        img = {r.get("image_sent") for r in rs}
        word = "sent" if "push" in case else "fetched"
        L.append(f"| {case} | {rp.fmt(p(rows, case, 'blobs')['p50'])} | "
                 f"{rp.fmt(p(rows, case, 'blobs_skipped')['p50'])} / "
                 f"{mib(p(rows, case, 'bytes_skipped')['p50'])} | "
                 f"{rp.fmt(p(rows, case, 'links')['p50'])} "
                 f"({rp.fmt(p(rows, case, 'links_skipped')['p50'])}) | "
                 f"{word if img == {1} else 'not ' + word if img == {0} else 'mixed'} | "
                 f"{mib(p(rows, case, 'registry_bytes')['p50'])} | "
                 f"{rp.fmt(p(rows, case, 'requests')['p50'])} "
                 f"({rp.fmt(p(rows, case, 'pings')['p50'])}) |")
    for case in BASELINE:
        if "push" in case:
            L.append(f"| {case} | 2 (layer + config) | – | – | in the layer | "
                     f"{mib(p(rows, case, 'registry_bytes')['p50'])} | "
                     f"{rp.fmt(p(rows, case, 'requests')['p50'])} "
                     f"({rp.fmt(p(rows, case, 'pings')['p50'])}) |")
        else:
            L.append(f"| {case} | 2 | – | – | in the layer | – | "
                     f"{rp.fmt(p(rows, case, 'requests')['p50'])} "
                     f"({rp.fmt(p(rows, case, 'pings')['p50'])}) |")
    return L


def per_blob_requests(rows) -> float:
    """HTTP requests per blob sent in run 1's cold push (HEAD, upload in
    POST + PATCH + PUT, each after a `GET /v2/` ping; manifests on top)."""
    m = next((r for r in rows if r["run"] == 1 and r["case"] == "push_s1"), None)
    return rp.ratio(m and m.get("requests"), m and m.get("blobs"))


def chunk_table(ch: dict, rows) -> list[str]:
    if not ch:
        return ["Not measured in this run (`--no-chunk-sizes`)."]
    files = sorted(k for k in ch["rows"][0] if k.startswith("s2/") and k.endswith("_bytes"))
    head = " | ".join(f"S2 {k[3:-6]} (MiB)" for k in files)
    per = per_blob_requests(rows)
    L = [f"| chunk | push S1 cold (MiB) | blobs | HTTP requests (est.) | push S2 after S1 (MiB) "
         f"| blobs | {head} |",
         "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(files)]
    for r in ch["rows"]:
        b = "**" if r["chunk_mib"] == 4 else ""
        L.append(f"| {b}{r['chunk_mib']} MiB{b} | {b}{mib(r['s1_bytes'])}{b} | "
                 f"{r['s1_blobs']:,} | {rp.fmt(r['s1_blobs'] * per)} | "
                 f"{b}{mib(r['s2_after_s1_bytes'])}{b} | {r['s2_after_s1_blobs']:,} | "
                 + " | ".join(mib(r[k]) for k in files) + " |")
    four = next((r for r in ch["rows"] if r["chunk_mib"] == 4), None)
    r1 = [r for r in rows if r["run"] == 1]
    m1 = next((r for r in r1 if r["case"] == "push_s1"), None)
    m2 = next((r for r in r1 if r["case"] == "push_s2"), None)
    if four and m1 and m2:
        L += ["", f"Check against run 1's real pushes (4 MiB chunks; these also count the "
              f"configs and manifests): push S1 sent {mib(m1['bytes'])} MiB in {m1['blobs']} "
              f"blobs (computed: {mib(four['s1_bytes'])} MiB in {four['s1_blobs']} chunks); "
              f"push S2 sent {mib(m2['bytes'])} MiB in {m2['blobs']} blobs (computed: "
              f"{mib(four['s2_after_s1_bytes'])} MiB in {four['s2_after_s1_blobs']} chunks). "
              f"HTTP requests (est.): the chunks times the {per:.1f} requests per blob sent "
              "that run 1's cold push made (HEAD, then POST, PATCH and PUT, each after a "
              "`GET /v2/` ping)."]
    return L


def chunk_notes(ch: dict) -> list[str]:
    rs = {r["chunk_mib"]: r for r in (ch or {}).get("rows", [])}
    if not {1, 4, 16} <= set(rs):
        return []
    a, f, z = rs[1], rs[4], rs[16]

    def pct(x, y):
        return f"{100 * (x / y - 1):+.1f}%"

    return [
        f"The bytes hardly depend on the chunk size in this workload: from 1 to 16 MiB a cold "
        f"push changes by {pct(z['s1_bytes'], a['s1_bytes'])} (larger chunks compress a little "
        f"better; all-zero ranges are left out at any size, and zeros inside a chunk compress "
        f"to almost nothing) and S2 after S1 by {pct(z['s2_after_s1_bytes'], a['s2_after_s1_bytes'])}"
        f". What S2 shares with S1 (the image, the template) it shares as whole files, and "
        f"what it does not share is new data at every grain, so a smaller chunk finds no "
        f"more sharing. The number of blobs, and of requests, falls as 1/size: "
        f"{a['s1_blobs']:,} blobs at 1 MiB, {f['s1_blobs']:,} at 4 MiB, {z['s1_blobs']:,} at "
        f"16 MiB. 4 MiB takes most of that fall ({f['s1_blobs'] / a['s1_blobs']:.0%} of the "
        f"1 MiB count, {pct(f['s1_bytes'], a['s1_bytes'])} bytes) while keeping the unit a "
        "pull fetches, verifies and retries small, and the waste when one page changes in a "
        "full memory image or a root disk (a 4 MiB blob, compressed) bounded; sharing at a "
        "finer grain than this workload has (two images differing in a few files, two "
        "flattened snapshots of one source) would favour the smaller sizes, and these figures "
        "do not measure it.",
    ]


def notes(rows, ctx) -> list[str]:
    def med(case, key="total_ms"):
        return p(rows, case, key)["p50"]

    def rng(xs) -> str:
        return "–" if not xs else f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}"

    pulls = [r for r in rows if r["case"].startswith("pull")]
    L = [
        f"- **Dedup across snapshots.** Pushed to the same repository, S2 sent "
        f"{mib(med('push_s2', 'bytes'))} MiB against S1's {mib(med('push_s1', 'bytes'))} MiB: "
        f"the image and the template link were found (one manifest HEAD each) and skipped, and "
        f"what was sent is S2's own link (its {ctx['data_mib']} MiB of random data is both in "
        f"the guest's page cache, so in memory.diff, and, after `sync`, in its disk layer). "
        f"skopeo sends its one big layer again: {mib(med('skopeo_push_s2', 'bytes'))} MiB. "
        f"On B, pull S2 fetched {mib(med('pull_s2', 'bytes'))} MiB (B had the image and the "
        f"template from pull S1) against skopeo's {mib(med('skopeo_pull_s2', 'bytes'))} MiB.",
        f"- **Another repository gets no dedup.** Pushed to `bench/s2` instead, S2 sent "
        f"{mib(med('push_s2_repo', 'bytes'))} MiB, the whole chain again: a registry answers "
        "blob and manifest HEADs per repository, and forkvm's push neither tries a "
        "cross-repository mount (`POST /v2/<name>/blobs/uploads/?mount=<digest>&from=<repo>`) "
        "nor remembers where it pushed before. The registry's storage is content-addressed, so "
        f"it stored {mib(med('push_s2_repo', 'registry_bytes'))} MiB more, but every byte "
        "went over the wire.",
        f"- **Where a cold push goes**: chunking {secs(med('push_s1', 'prepare_ms'))} s and "
        f"upload {secs(med('push_s1', 'transfer_ms'))} s (p50s), against "
        f"{secs(med('skopeo_push_s1', 'prepare_ms'))} s of `tar --sparse` + layout and "
        f"{secs(med('skopeo_push_s1', 'transfer_ms'))} s of `skopeo copy`. Chunking reads "
        "every byte of every file, holes included (`index_file` in "
        "crates/forkvm-artifact/src/chunk.rs reads each chunk up to the file's size, tests it "
        "for zeros and feeds it to the whole-file SHA-256 a link lists): about 2.5 GiB for the "
        "root disk and the template's memory image, which hold about 0.4 GiB of data, where "
        "`tar --sparse` finds the data with SEEK_DATA/SEEK_HOLE (from the code; not timed "
        "apart here). The upload compresses again "
        "each chunk it sends (`read_chunk` in crates/forkvm-artifact/src/push.rs: the cached "
        "chunk list keeps digests, not blobs), so a cold push zstd-compresses every chunk "
        f"twice, and push_s2_repo, whose chunk lists were all cached, still took "
        f"{secs(med('push_s2_repo'))} s. Every registry request is preceded by a `GET /v2/` "
        f"ping ({rp.fmt(med('push_s1', 'pings'))} of push S1's "
        f"{rp.fmt(med('push_s1', 'requests'))} requests; skopeo: "
        f"{rp.fmt(med('skopeo_push_s1', 'pings'))} of "
        f"{rp.fmt(med('skopeo_push_s1', 'requests'))}); on loopback they cost little, over a "
        "WAN each is a round trip.",
        f"- **Where a pull goes.** A pull checks every chunk against its digest, fsyncs every "
        f"assembled file and checks it against its SHA-256, re-reading it whole (`Assembler::"
        f"finish`): for pull S1 that is 2.5 GiB, mostly holes, and its fetch + check took "
        f"{secs(med('pull_s1', 'transfer_ms'))} s against {secs(med('skopeo_pull_s1', 'transfer_ms'))}"
        f" s for `skopeo copy` of the gzip layer (whose untar then took "
        f"{secs(med('skopeo_pull_s1', 'finish_ms'))} s). Pull S2 spent {secs(med('pull_s2', 'prepare_ms'))}"
        f" s of its {secs(med('pull_s2'))} s before fetching anything, resolving and finding "
        "that B already has the image: `matching_image` (crates/forkvm-engine/src/registry/"
        "import.rs) finds the root disk's SHA-256 in the digest cache, where the pull that "
        "installed it put it (before commit f84c7b9 it hashed the 2 GiB disk again: 2.0 s).",
        f"- **Ready to use.** A forkvm pull ends with the snapshot published in B's store "
        f"(every chunk and file checked, files fsynced); the first spawn from it then took "
        f"{secs(med('pull_s1', 'spawn_ms'))} s (S1) and {secs(med('pull_s2', 'spawn_ms'))} s "
        "(S2), p50, and /root/buf's SHA-256 in that sandbox matched A's in "
        f"{sum(1 for r in pulls if r.get('sha_ok') == 1)} of {len(pulls)} spawns. The skopeo "
        "pull ends with the files untarred (not fsynced; checked: the layer digest by skopeo, "
        "and here, outside the timing, every file's size and memory.diff's SHA-256); nothing "
        "can spawn from them yet. Its untar is mostly single-threaded gunzip.",
        f"- **Compression**: forkvm sends zstd level 3 chunks; skopeo gzips the uncompressed "
        f"tar layer on the way (the registry stores `{ctx.get('skopeo_media', '?')}`), with "
        "containers/image's parallel gzip. `tar --sparse` stores only the data of the sparse "
        "files (root disk, template memory), as forkvm leaves out its all-zero chunks, so "
        "neither side sends the 2 GiB disk's or the 512 MiB memory image's holes.",
        (f"- **Daemon threads in sandbox namespaces: none.** Until commit a5df302 every "
         "spawn left a daemon thread in the sandbox's network namespace (a setns on a tokio "
         "pool thread), and a registry request from it got `connection refused`. The bench "
         "counts such threads after every spawn and before every timed transfer: "
         f"{rng(ctx['stray_spawn'])} after the spawns, {rng(ctx['stray'])} when transfers "
         "were due.") if not any(ctx["stray_spawn"]) and not any(ctx["stray"]) else
        (f"- **A forkvm bug the bench worked around.** Daemon A had {rng(ctx['stray_spawn'])} "
         f"thread(s) in a sandbox's network namespace right after each spawn and "
         f"{rng(ctx['stray'])} when its transfers were due (the setns-on-a-pool-thread bug "
         "of forkvm-net before commit a5df302): a registry request from one gets "
         "`connection refused`. The bench restarted A's daemon on the same home after the "
         "snapshots (the chunk cache is on disk, so nothing measured changes)."),
        "- The registry is on 127.0.0.1 and the files are in the page cache: transfers cost "
        "CPU (compression, hashing, the registry's own hashing and writes), not network. Over "
        "a real link the bytes column weighs more, in forkvm's favour wherever it sends less.",
        "- `other_cpu_cores` in the CSV is the CPU other processes used during each "
        "measurement (our daemons with their helpers, the registry, skopeo and tar count as "
        "ours).",
    ]
    return L


def write_results(path: Path, rows, ctx: dict, args) -> list[str]:
    info, machine = ctx["info"], ctx["machine"]
    L = []
    if args.runs < MIN_RUNS:
        L += rp.smoke_banner(f"{args.runs} run(s) < {MIN_RUNS}", "bash bench/registry/run.sh")
    other = rp.summarize(r.get("other_cpu_cores") for r in rows)
    ch = ctx.get("chunks")
    quiet = ctx.get("quiet")
    L += [
        "# Registry benchmark: snapshot push and pull, against tar + skopeo",
        "",
        *rp.header_lines(info, machine, ctx["started"], ctx["elapsed"], rp.git_revision(),
                         f" ({ctx['profile']} build: `{args.binary}`)", minutes=True),
        f"- Tools: {ctx['tools']}",
        f"- Command: `{ctx['command']}` ({args.runs} run{'' if args.runs == 1 else 's'}; each with a fresh registry and fresh "
        "daemon homes, so every first push and pull is cold)",
        f"- Snapshots: on daemon A, two {args.memory} MiB, 1 vCPU sandboxes (`network: none`) "
        f"from the boot template of the `default` image, each wrote {args.data_mib} MiB from "
        "/dev/urandom to /root/buf and ran `sync`, then `forkvm snapshot` (S1, S2: `diff` "
        "snapshots whose parent is the template). A push sends the chain: the image's root "
        "disk (2 GiB sparse), the template link (memory.img, 512 MiB sparse; device.state; "
        "disk.qcow2) and the snapshot's link (memory.diff, device.state, disk.qcow2), in 4 MiB "
        "zstd chunks.",
        "- Registry: Debian's `docker-registry` on 127.0.0.1 (plain HTTP, filesystem storage "
        "in a temp dir), new for each run. Daemon B has its own home with an empty `images/`, "
        f"`FORKVM_NET_POOL={NET_POOL_B}`; A's home links the artefacts' `guest/` and `images/`.",
        "- forkvm times are the CLI's wall time (`forkvm --json snapshot push|pull`); the "
        "stages come from its NDJSON phase events (push: chunking until `pushing to`, then "
        "upload; pull: `resolving`, fetch and check until `publishing`, publish).",
        f"- Baseline (skopeo), same run, same files: {BASELINE['skopeo_push_s1']}; "
        f"{BASELINE['skopeo_pull_s1']}; S2 likewise. The layer is GNU `tar --sparse "
        "--dereference` of `image/rootfs.ext4`, `template/*` and `snapshot/*` (manifest.fvs "
        "included), uncompressed in an OCI layout written by bench_registry.py; skopeo "
        "compresses it with gzip when pushing. The forkvm and skopeo blocks alternate order "
        "between runs.",
        f"- Other processes used {rp.fmt(other['p50'], 2)} cores (p50; max "
        f"{rp.fmt(other['max'], 2)}) of the {machine['cores']} during the measurements"
        + (f"; before starting, the bench waited for a quiet host and measured "
           f"{quiet:.2f} cores" if quiet is not None else "") + ".",
        *qemu_lines(ctx, args.runs),
        "",
        "## Results",
        "",
        *summary_table(rows),
        "",
        "skopeo's pull time includes untarring the layer (the files ready to use); its "
        "`skopeo copy` alone is in the stage table below. MiB: what went over the wire "
        "(forkvm's `bytes_sent`/`bytes_fetched`; skopeo's layer + config + manifest, or the "
        "blobs it wrote).",
        "",
        *detail_table(rows),
        "",
        "Every stage, in ms (prepare: chunking for a forkvm push, resolving for a pull, tar + "
        "OCI layout for skopeo; transfer: upload or fetch, with checks; finish: forkvm's "
        "publish, or untar):",
        "",
        *rp.stats_table(rp.case_stats(rows, [(c, STAGES + ["spawn_ms"]) for c, _, _ in FIGURES]
                                      + [(c, STAGES) for c in BASELINE]), with_n=True),
        "",
        "## Chunk size",
        "",
        "What a push would send for other chunk sizes, computed offline over run 1's files "
        f"(chunk_sizes.py; compression: {ch['method'] if ch else '–'}). Every file is cut at "
        "fixed offsets, all-zero chunks are left out, equal chunks are sent once; \"push S2 "
        "after S1\" counts S2's chunks that S1's push did not send.",
        "",
        *chunk_table(ch, rows),
        "",
        *chunk_notes(ch),
        "",
        "## Notes",
        "",
        *notes(rows, ctx),
        "",
        "Raw rows: `registry.csv`, `chunk_sizes.csv`; plot: `registry.png`.",
    ]
    path.write_text("\n".join(L) + "\n")
    return L


def qemu_lines(ctx: dict, runs: int, most: int = 5) -> list[str]:
    lines = rp.other_qemu_lines(ctx["others"], ctx["busy"], runs)
    if len(lines) > most + 1:
        lines = lines[:most + 1] + [f"  - … and {len(lines) - most - 1} more"]
    return lines


def plot(rows, ctx: dict, path: Path) -> None:
    plt = rp.pyplot()
    ch = ctx.get("chunks")
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6),
                             gridspec_kw={"width_ratios": [3, 1.6, 1.4]})
    ax, bx, cx = axes
    colours = {"prepare_ms": "tab:blue", "transfer_ms": "tab:orange", "finish_ms": "tab:green"}
    names = {"prepare_ms": "prepare (chunking / resolve)",
             "transfer_ms": "transfer (upload / fetch)", "finish_ms": "finish (publish / untar)"}
    bars = []
    for case, _, base in reversed(FIGURES):
        bars += [(f"skopeo: {base.removeprefix('skopeo_')}", base), (f"forkvm: {case}", case)]
    seen = set()
    for y, (_, case) in enumerate(bars):
        left = 0.0
        for st in STAGES:
            v = p(rows, case, st)["p50"] / 1000
            if v == v:
                sk = case.startswith("skopeo")
                ax.barh(y, v, left=left, color=colours[st],
                        label=None if st in seen or sk else names[st],
                        hatch="//" if sk else None, edgecolor="white")
                if not sk:
                    seen.add(st)
                left += v
        f = p(rows, case)
        ax.plot([f["p50"] / 1000, f["p90"] / 1000], [y, y], color="black", linewidth=1)
        ax.plot(f["p50"] / 1000, y, "o", color="black", markersize=4,
                label=None if "total" in seen else "total: p50 (dot) to p90 (bar)")
        ax.plot(f["p90"] / 1000, y, "|", color="black", markersize=10)
        seen.add("total")
    ax.barh([0], [0], color="lightgrey", hatch="//", edgecolor="white",
            label="skopeo (hatched): tar + layout, skopeo copy, untar")
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set_xlabel("seconds: p50 of each stage, stacked")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8)
    ax.set_title("Wall time", fontsize=10)
    cases = [c for c, _, _ in FIGURES]
    xs = range(len(cases))
    bx.bar([x - 0.2 for x in xs], [p(rows, c, "bytes")["p50"] / MiB for c in cases], 0.4,
           color="tab:purple", label="forkvm")
    bx.bar([x + 0.2 for x in xs], [p(rows, b, "bytes")["p50"] / MiB for _, _, b in FIGURES],
           0.4, color="grey", label="skopeo")
    bx.set_xticks(list(xs), [c.replace("_", "\n", 1) for c in cases], fontsize=8)
    bx.set_ylabel("MiB sent / fetched (p50)")
    bx.legend(fontsize=8)
    bx.set_title("Bytes over the wire", fontsize=10)
    if ch:
        sizes = [r["chunk_mib"] for r in ch["rows"]]
        xs = range(len(sizes))
        cx.bar([x - 0.2 for x in xs], [r["s1_bytes"] / MiB for r in ch["rows"]], 0.4,
               color="tab:blue", label="push S1 cold")
        cx.bar([x + 0.2 for x in xs], [r["s2_after_s1_bytes"] / MiB for r in ch["rows"]], 0.4,
               color="tab:orange", label="push S2 after S1")
        cx.set_xticks(list(xs), [f"{s} MiB" for s in sizes], fontsize=8)
        cx.set_ylabel("MiB sent (computed)")
        c2 = cx.twinx()
        c2.plot(list(xs), [r["s1_blobs"] for r in ch["rows"]], "o-", color="black",
                label="blobs, push S1")
        c2.set_ylabel("blobs in the cold push")
        c2.set_ylim(0, max(r["s1_blobs"] for r in ch["rows"]) * 1.15)
        h1, l1 = cx.get_legend_handles_labels()
        h2, l2 = c2.get_legend_handles_labels()
        cx.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center")
        cx.set_ylim(0, max(r["s1_bytes"] for r in ch["rows"]) / MiB * 1.35)
        cx.set_title("Chunk size (offline)", fontsize=10)
    else:
        cx.axis("off")
    rp.save_figure(fig, path, title="Snapshot push/pull through a local registry: forkvm "
                   "against tar + skopeo")
