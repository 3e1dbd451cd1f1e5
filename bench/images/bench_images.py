#!/usr/bin/env python3
"""forkvm images benchmark: import, first exec and pull of a ~1 GiB image.

Run through bench/images/run.sh (it checks the tools, takes the Debian
mirror from the host's apt sources and builds the release binary).

The image is made by real tools, once per run:

* a Debian bookworm rootfs tar from `mmdebstrap --variant=minbase` (cached in
  $FORKVM_ARTIFACTS/cache/, so reruns skip it);
* an OCI layout by `umoci`: that tar as the bottom layer, then 9 layers of
  one incompressible (random) file each (--layer-mib, default 90 MiB): image
  A, ~1 GiB in 10 layers; image B is A's bottom 9 layers plus a different top
  layer of the same size, so it shares ~90% of its bytes with A;
* `skopeo copy oci:… docker-archive:…` for a `docker save` tar of A, and
  `skopeo copy … docker://127.0.0.1:PORT/…` into a real local registry
  (Debian's `docker-registry`, started here, killed by its pid at the end).

Then, N times each, interleaved so that host noise spreads over all cases:

* import      -- `forkvm image import A.tar --name X` (client wall), with an
                 empty blob store (the image and its blobs are removed after
                 each run, so every import is cold);
* first_exec  -- `forkvm run --image X -- /bin/true` right after: the first
                 spawn of an image cold-boots it and makes its boot template;
* pull_a      -- `forkvm image pull` of A with an empty blob store;
* pull_b      -- `forkvm image pull` of B right after (its 9 shared layers are
                 in the store); bytes fetched are the blob store's growth;
* naive_*     -- the baseline, what a user does by hand: `skopeo copy` (of the
                 tar, or from the registry) into a fresh OCI layout, `umoci raw
                 unpack`, `mkfs.ext4 -d` to a file the size forkvm chose; B
                 into a fresh directory (no layer reuse).

One private daemon serves the whole run; its home's `guest` and
`images/default` link to $FORKVM_ARTIFACTS, its blobs and images are its own.
At the end (also on an error or SIGTERM) the registry and the daemon are
stopped by their pids, the host nft table the daemon leaves is deleted, and
the temp directory goes; only the cached rootfs tar stays.

Outputs: results/images.csv, results/RESULTS.md, results/images.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "common"))

import docker_registry as dr  # noqa: E402
import forkvm_bench as fb  # noqa: E402
import report as rp  # noqa: E402

MIN_RUNS = 3
DATA_LAYERS = 9
SUITE, VARIANT = "bookworm", "minbase"
ROOTFS_TAR = f"bench-images-{VARIANT}-{SUITE}.tar"
TOOLS = ("mmdebstrap", "umoci", "skopeo", "docker-registry", "mkfs.ext4")
MiB = 1 << 20
FIELDS = ["case", "run", "total_ms", "copy_ms", "unpack_ms", "mkfs_ms", "install_ms",
          "bytes_fetched", "layers_cached", "disk_bytes", "other_cpu_cores"]
NAIVE_STAGES = ["copy_ms", "unpack_ms", "mkfs_ms"]
# forkvm's stages, from the phases its progress prints: copy is everything
# before unpacking (the upload and hashing of an import, the resolving and
# fetching of a pull), install the publishing of the image and the CLI's exit.
FORKVM_STAGES = NAIVE_STAGES + ["install_ms"]
PHASE_STAGE = {"unpacking": "unpack_ms", "mkfs": "mkfs_ms", "installing": "install_ms"}
PHASE_LINE = re.compile(r"^\[\s*([0-9.]+)s\] ([a-z]+)$")
# (forkvm case, what it is, its baseline case or None)
FIGURES = (
    ("import", "import of the docker-save tar, empty blob store", "naive_import"),
    ("first_exec", "first exec right after (`run --image X -- /bin/true`)", None),
    ("pull_a", "pull A from the registry, empty blob store", "naive_pull_a"),
    ("pull_b", "pull B right after A (9 of its 10 layers present)", "naive_pull_b"),
)
NAIVE = {
    "naive_import": "`skopeo copy docker-archive:A.tar oci:DIR` + `umoci raw unpack` + "
                    "`mkfs.ext4 -d`",
    "naive_pull_a": "`skopeo copy docker://…/A oci:DIR` + `umoci raw unpack` + `mkfs.ext4 -d`",
    "naive_pull_b": "the same for B, into a fresh directory (no layer reuse)",
}


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise fb.BenchError(f"missing tool(s): {', '.join(missing)}; this bench needs them all "
                            "(Debian: apt-get install mmdebstrap umoci skopeo docker-registry "
                            "e2fsprogs)")


sh = rp.timed_run


def tree_bytes(path: Path) -> int:
    """Apparent size of every regular file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def cached_items(progress: str) -> int:
    """How many items a pull's progress lines (the CLI's plain output, not a
    terminal) report as already in the blob store."""
    return sum(1 for line in progress.splitlines() if line.rstrip().endswith(": cached"))


def phase_stages(progress: str, total_ms: float) -> dict:
    """forkvm's stages from the CLI's plain progress lines (`[  1.2s] mkfs`):
    each lasts from its phase's line to the next one's (the last to the end
    of the command), to 0.1 s; all of them, or none when a phase is missing
    or out of order."""
    marks = {}
    for line in progress.splitlines():
        m = PHASE_LINE.match(line.strip())
        if m and m.group(2) in PHASE_STAGE and m.group(2) not in marks:
            marks[m.group(2)] = float(m.group(1)) * 1000
    # The lines have 0.1 s resolution: a mark may round past the end.
    t = [min(marks.get(ph, -1.0), total_ms) for ph in PHASE_STAGE] + [total_ms]
    if len(marks) != len(PHASE_STAGE) or t != sorted(t):
        print("    (forkvm's progress lacks the phases "
              f"{', '.join(PHASE_STAGE)} in order: no stages for this row)", flush=True)
        if os.environ.get("BENCH_IMAGES_DEBUG"):
            print(progress, flush=True)
        return {}
    out = {"copy_ms": t[0]}
    for i, stage in enumerate(PHASE_STAGE.values()):
        out[stage] = t[i + 1] - t[i]
    return out


class Cli:
    """The forkvm CLI against the bench's private daemon."""

    def __init__(self, binary: str, home: str):
        self.binary = binary
        self.home = Path(home)
        self.env = {k: v for k, v in os.environ.items() if k != "FORKVM_URL"}
        self.env["FORKVM_HOME"] = home

    def __call__(self, *args) -> tuple[float, str, str]:
        return sh([self.binary, *args], env=self.env)

    @property
    def blobs(self) -> Path:
        return self.home / "blobs" / "sha256"

    def store_bytes(self) -> int:
        return tree_bytes(self.blobs) if self.blobs.is_dir() else 0

    def disk_bytes(self, name: str) -> int:
        return int(json.loads(self("--json", "image", "inspect", name)[1])["size_bytes"])

    def remove(self, *names: str) -> None:
        """Remove the images (their templates go with them) and every blob,
        so the next import or pull starts from an empty store."""
        self("image", "rm", *names)
        if self.blobs.is_dir():
            for f in self.blobs.iterdir():
                f.unlink()


# --------------------------------------------------------------------------
# Making the images
# --------------------------------------------------------------------------


def rootfs_tar(cache: Path, mirror: str | None) -> Path:
    path = cache / ROOTFS_TAR
    if path.is_file():
        print(f"==> rootfs: {path} (cached, {path.stat().st_size / MiB:.0f} MiB)", flush=True)
        return path
    if not mirror:
        raise fb.BenchError(f"{path} is not cached and no --mirror was given (run.sh passes "
                            "the host's bookworm mirror)")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{ROOTFS_TAR}.tmp-{os.getpid()}"
    print(f"==> mmdebstrap --variant={VARIANT} {SUITE} from {mirror} (1-3 minutes)", flush=True)
    try:
        # unshare mode: a private mount namespace, nothing stays mounted if
        # interrupted; --format: the temp name does not end in .tar.
        ms, _, _ = sh(["mmdebstrap", "--quiet", "--mode=unshare", "--format=tar",
                       f"--variant={VARIANT}", SUITE, tmp, mirror])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"    {path.stat().st_size / MiB:.0f} MiB in {ms / 1000:.0f} s", flush=True)
    return path


class _Random:
    """A file-like source of `n` incompressible bytes."""

    def __init__(self, n: int):
        self.left = n

    def read(self, size: int = -1) -> bytes:
        size = self.left if size is None or size < 0 else min(size, self.left)
        self.left -= size
        return os.urandom(size)


def data_layer(path: Path, name: str, mib: int) -> None:
    """An uncompressed layer tar holding one random file /opt/bench/NAME."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for d in ("opt", "opt/bench"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1700000000
            t.addfile(ti)
        ti = tarfile.TarInfo(f"opt/bench/{name}")
        ti.size, ti.mode, ti.mtime = mib * MiB, 0o644, 1700000000
        t.addfile(ti, _Random(ti.size))


def manifest(oci: Path, tag: str) -> dict:
    index = json.loads((oci / "index.json").read_text())
    for m in index.get("manifests", []):
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            algo, hexd = m["digest"].split(":", 1)
            return json.loads((oci / "blobs" / algo / hexd).read_text())
    raise fb.BenchError(f"{oci} has no tag {tag!r}")


def make_images(work: Path, rootfs: Path, layer_mib: int) -> dict:
    """The OCI layout with tags a and b, and A as a docker-save tar."""
    oci = work / "oci"
    t0 = time.monotonic()
    print(f"==> umoci: A = rootfs + {DATA_LAYERS} × {layer_mib} MiB random layers; "
          "B = A's bottom 9 + another top", flush=True)
    sh(["umoci", "init", "--layout", oci])
    sh(["umoci", "new", "--image", f"{oci}:wip"])
    sh(["umoci", "raw", "add-layer", "--image", f"{oci}:wip", rootfs])
    layer = work / "layer.tar"
    for k in range(1, DATA_LAYERS + 1):
        tops = [("a", f"layer-{k:02}.bin"), ("b", f"layer-{k:02}b.bin")] \
            if k == DATA_LAYERS else [(None, f"layer-{k:02}.bin")]
        for tag, name in tops:
            data_layer(layer, name, layer_mib)
            sh(["umoci", "raw", "add-layer", "--image", f"{oci}:wip",
                *(["--tag", tag] if tag else []), layer])
            layer.unlink()
        print(f"    layer {k + 1}/{DATA_LAYERS + 1}", flush=True)
    docker_tar = work / "a-docker.tar"
    sh(["skopeo", "copy", "--quiet", f"oci:{oci}:a", f"docker-archive:{docker_tar}:bench/a:latest"])
    a, b = manifest(oci, "a"), manifest(oci, "b")
    la, lb = [x["size"] for x in a["layers"]], [x["size"] for x in b["layers"]]
    shared = sum(x["size"] for x in b["layers"]
                 if x["digest"] in {y["digest"] for y in a["layers"]})
    img = {"oci": oci, "docker_tar": docker_tar, "layers": len(la),
           "rootfs_mib": rootfs.stat().st_size / MiB, "a_bytes": sum(la), "b_bytes": sum(lb),
           "b_shared": shared, "tar_bytes": docker_tar.stat().st_size}
    print(f"    A: {img['layers']} layers, {img['a_bytes'] / MiB:.0f} MiB of layer blobs "
          f"(docker-save tar {img['tar_bytes'] / MiB:.0f} MiB); B shares "
          f"{100 * shared / img['b_bytes']:.0f}% of its bytes with A "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    return img


class Registry(dr.DockerRegistry):
    """The local registry the pull cases fetch from, with a push by skopeo."""

    def push(self, oci: Path, tag: str, repo: str) -> None:
        sh(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{oci}:{tag}",
            f"docker://{self.ref(repo)}"])


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


def naive(case: str, work: Path, src: list[str], disk_bytes: int) -> dict:
    """By hand: skopeo copy into a fresh OCI layout, umoci raw unpack,
    mkfs.ext4 -d into a file of the size forkvm chose."""
    d = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=work))
    try:
        copy, _, _ = sh(["skopeo", "copy", "--quiet", *src, f"oci:{d / 'oci'}:x"])
        fetched = tree_bytes(d / "oci" / "blobs")
        unpack, _, _ = sh(["umoci", "raw", "unpack", "--image", f"{d / 'oci'}:x", d / "rootfs"])
        mkfs, _, _ = sh(["mkfs.ext4", "-q", "-F", "-d", d / "rootfs", d / "root.ext4",
                         f"{disk_bytes // 1024}k"])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"case": case, "total_ms": copy + unpack + mkfs, "copy_ms": copy,
            "unpack_ms": unpack, "mkfs_ms": mkfs, "bytes_fetched": fetched,
            "disk_bytes": disk_bytes}


def measure(case: str, run: int, fn, meter: fb.CpuMeter) -> dict:
    meter.start()
    row = fn()
    row.update(case=case, run=run, other_cpu_cores=meter.other_cores())
    extra = f", {row['bytes_fetched'] / MiB:.0f} MiB fetched" if row.get("bytes_fetched") \
        is not None and case.startswith(("pull", "naive_pull")) else ""
    stages = "" if "mkfs_ms" not in row else " (" + ", ".join(
        f"{s.removesuffix('_ms')} {row[s] / 1000:.1f}" for s in FORKVM_STAGES if s in row) + ")"
    print(f"[run {run}] {case:<13} {row['total_ms'] / 1000:6.1f} s{stages}{extra}", flush=True)
    return row


def one_run(run: int, cli: Cli, reg: Registry, img: dict, work: Path, meter) -> list[dict]:
    rows = []
    imp = f"imp-{run}"

    def do_import():
        ms, _, progress = cli("image", "import", img["docker_tar"], "--name", imp)
        return {"total_ms": ms, **phase_stages(progress, ms)}

    rows.append(measure("import", run, do_import, meter))
    rows[-1]["disk_bytes"] = size = cli.disk_bytes(imp)
    rows.append(measure("first_exec", run, lambda: {
        "total_ms": cli("run", "--image", imp, "--", "/bin/true")[0]}, meter))
    cli.remove(imp)
    rows.append(measure("naive_import", run, lambda: naive(
        "naive_import", work, [f"docker-archive:{img['docker_tar']}"], size), meter))

    sizes = {}
    for case, repo in (("pull_a", "bench/a"), ("pull_b", "bench/b")):
        name = f"{case[-1]}-{run}"

        def do_pull():
            before = cli.store_bytes()
            ms, _, progress = cli("image", "pull", reg.ref(repo), "--name", name)
            return {"total_ms": ms, "bytes_fetched": cli.store_bytes() - before,
                    "layers_cached": cached_items(progress), **phase_stages(progress, ms)}

        rows.append(measure(case, run, do_pull, meter))
        rows[-1]["disk_bytes"] = sizes[case] = cli.disk_bytes(name)
    cli.remove(f"a-{run}", f"b-{run}")
    for case, repo in (("naive_pull_a", "bench/a"), ("naive_pull_b", "bench/b")):
        rows.append(measure(case, run, lambda: naive(
            case, work, ["--src-tls-verify=false", f"docker://{reg.ref(repo)}"],
            sizes[case.removeprefix("naive_")]), meter))
    return rows


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def p(rows, case: str, key: str = "total_ms") -> dict:
    return rp.summarize(r.get(key) for r in rows if r["case"] == case)


def secs(v) -> str:
    return rp.fmt(v / 1000, 1)


def summary_table(rows) -> list[str]:
    L = ["| figure | forkvm p50 (s) | p90 | by hand p50 (s) | p90 | forkvm / by hand (p50) | "
         "fetched: forkvm (MiB) | by hand (MiB) |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, what, base in FIGURES:
        f = p(rows, case)
        n = p(rows, base) if base else None
        ratio = rp.ratio(f["p50"], n["p50"]) if n else float("nan")
        fetched = p(rows, case, "bytes_fetched")["p50"] if case.startswith("pull") else None
        nf = p(rows, base, "bytes_fetched")["p50"] if base and case.startswith("pull") else None
        L.append(f"| {case}: {what} | **{secs(f['p50'])}** | {secs(f['p90'])} | "
                 f"{secs(n['p50']) if n else '–'} | {secs(n['p90']) if n else '–'} | "
                 f"{'**' + format(ratio, '.2f') + '×**' if ratio == ratio else '–'} | "
                 f"{rp.fmt(fetched / MiB if fetched else None)} | "
                 f"{rp.fmt(nf / MiB if nf else None)} |")
    both = [a["total_ms"] + b["total_ms"] for a, b in zip(
        [r for r in rows if r["case"] == "import"], [r for r in rows if r["case"] == "first_exec"])]
    s, n = rp.summarize(both), p(rows, "naive_import")
    L.append(f"| import + first exec | {secs(s['p50'])} | {secs(s['p90'])} | {secs(n['p50'])} | "
             f"{secs(n['p90'])} | {rp.ratio(s['p50'], n['p50']):.2f}× | – | – |")
    return L


def notes(rows, img: dict, profile: str) -> list[str]:
    def med(case, key="total_ms"):
        return p(rows, case, key)["p50"]

    def share(case, stage):
        return f"{100 * rp.ratio(med(case, stage), med(case)):.0f}%"

    def s_(case, key="total_ms"):
        return f"{secs(med(case, key))} s"

    pa, pb = med("pull_a", "bytes_fetched"), med("pull_b", "bytes_fetched")
    b_new = img["b_bytes"] - img["b_shared"]
    L = [
        f"- **Layer reuse**: pull B fetched {rp.fmt(pb / MiB)} MiB, "
        f"{100 * rp.ratio(pb, pa):.0f}% of pull A's {rp.fmt(pa / MiB)} MiB (B's own top layer "
        f"is {b_new / MiB:.0f} MiB), and reported {rp.fmt(med('pull_b', 'layers_cached'))} "
        f"items cached; by hand, B fetches all "
        f"{rp.fmt(med('naive_pull_b', 'bytes_fetched') / MiB)} MiB again. Its fetch stage "
        f"took {s_('pull_b', 'copy_ms')} against A's {s_('pull_a', 'copy_ms')} (p50s).",
        f"- **What dominates** (p50 shares of each total): forkvm pull A — fetch "
        f"{share('pull_a', 'copy_ms')}, unpack {share('pull_a', 'unpack_ms')}, mkfs "
        f"{share('pull_a', 'mkfs_ms')}, install {share('pull_a', 'install_ms')}; forkvm "
        f"import — upload and hashing {share('import', 'copy_ms')}, unpack "
        f"{share('import', 'unpack_ms')}, mkfs {share('import', 'mkfs_ms')}; by hand, pull A — "
        f"`skopeo copy` {share('naive_pull_a', 'copy_ms')}, `umoci raw unpack` "
        f"{share('naive_pull_a', 'unpack_ms')}, `mkfs.ext4 -d` "
        f"{share('naive_pull_a', 'mkfs_ms')}. A pull of B saves only the fetch of the shared "
        "layers: it still unpacks all ~1 GiB of B and makes a new ext4 of it, as the hand "
        "pipeline does.",
        "- The registry is on 127.0.0.1 and every byte is in the page cache, so fetching is "
        "cheap here; over a real network the 90% of B that is not fetched would weigh "
        "much more, and so would forkvm's ratio for pull B.",
        "- Both sides run the same `mkfs.ext4 -d` on a staged rootfs, to a disk of the same "
        "size. forkvm does more on top: every blob is verified against its digest and "
        "fsynced before it is published, the image is fsynced and renamed into place, and "
        "an import first streams the tar to the daemon over its socket (and stores its "
        "layers, uncompressed in a docker-save tar, as blobs). The hand pipeline syncs "
        "nothing and gives an ext4 file that nothing boots yet.",
        "- first_exec is a cold boot of the new image under the accelerator above, the "
        "making of its boot template (a RAM snapshot) and one exec; later spawns restore "
        "from the template (see the spawn bench). It has no by-hand counterpart here; the "
        "last row of the table sets import + first exec against the hand-made ext4.",
    ]
    if profile == "debug":
        L.append("- The forkvm binary is a debug build. Cargo.toml optimises its hashing and "
                 "gzip/zstd crates even there, but not the image code's own tar parsing and "
                 "copying; a release build may unpack faster (not measured here).")
    L.append("- `other_cpu_cores` in the CSV is the CPU other processes on the host used "
             "during each measurement (a QEMU the daemon started counts as other, so "
             "first_exec's is overstated). On this shared 2-core host it is the main source "
             "of spread between runs.")
    return L


def qemu_lines(ctx: dict, runs: int, most: int = 5) -> list[str]:
    """report.py's bullet about other QEMU processes, with at most `most` of
    them listed (a busy host runs dozens)."""
    lines = rp.other_qemu_lines(ctx["others"], ctx["busy"], runs)
    if len(lines) > most + 1:
        lines = lines[:most + 1] + [f"  - … and {len(lines) - most - 1} more"]
    return lines


def write_results(path: Path, rows, img: dict, ctx: dict, args) -> list[str]:
    info, machine = ctx["info"], ctx["machine"]
    L = []
    if args.runs < MIN_RUNS:
        L += rp.smoke_banner(f"{args.runs} runs < {MIN_RUNS}", "bash bench/images/run.sh")
    other = rp.summarize(r.get("other_cpu_cores") for r in rows)
    L += [
        "# Images benchmark: import, first exec and pull of a ~1 GiB image",
        "",
        *rp.header_lines(info, machine, ctx["started"], ctx["elapsed"], rp.git_revision(),
                         f" ({ctx['profile']} build: `{args.binary}`)", minutes=True),
        f"- Tools: {ctx['tools']}",
        f"- Command: `{ctx['command']}` ({args.runs} runs of every figure, interleaved)",
        f"- Image A: {img['layers']} layers — a Debian {SUITE} rootfs from `mmdebstrap "
        f"--variant={VARIANT}` ({img['rootfs_mib']:.0f} MiB tar) and {DATA_LAYERS} layers of "
        f"one {args.layer_mib} MiB random file each, made with `umoci raw add-layer`: "
        f"{img['a_bytes'] / MiB:.0f} MiB of gzip layer blobs, a {img['tar_bytes'] / MiB:.0f} "
        "MiB docker-save tar (`skopeo copy oci:… docker-archive:…`). Image B: A's bottom "
        f"{img['layers'] - 1} layers and another {args.layer_mib} MiB top layer; "
        f"{100 * img['b_shared'] / img['b_bytes']:.0f}% of its bytes are shared with A.",
        "- Registry: Debian's `docker-registry` on 127.0.0.1 (plain HTTP), both images pushed "
        "with `skopeo copy --dest-tls-verify=false`.",
        "- forkvm: one private daemon, `guest/` and `images/default` linked from the "
        "artefacts; between runs the images are removed (`forkvm image rm`) and the blob "
        "store emptied, so import and pull A always start cold. Times are the CLI's wall "
        "time.",
        f"- Baseline (by hand), into a fresh directory each time: {NAIVE['naive_import']} for "
        f"the tar; {NAIVE['naive_pull_a']} from the registry; {NAIVE['naive_pull_b']}. "
        "The ext4 is made the size forkvm chose for the same image.",
        f"- Other processes used {rp.fmt(other['p50'], 2)} cores (p50; max "
        f"{rp.fmt(other['max'], 2)}) of the {machine['cores']} during the measurements.",
        *qemu_lines(ctx, args.runs),
        "",
        "## Results",
        "",
        *summary_table(rows),
        "",
        "Every stage, in ms:",
        "",
        *rp.stats_table(rp.case_stats(rows, [(c, FORKVM_STAGES) for c, _, _ in FIGURES]
                                      + [(c, NAIVE_STAGES) for c in NAIVE]), with_n=True),
        "",
        "## Notes",
        "",
        *notes(rows, img, ctx["profile"]),
        "",
        "Raw rows: `images.csv`; plot: `images.png`.",
    ]
    path.write_text("\n".join(L) + "\n")
    return L


def plot(rows, img: dict, path: Path) -> None:
    plt = rp.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 5.6), gridspec_kw={"width_ratios": [3, 1.3]})
    colours = {"copy_ms": "tab:blue", "unpack_ms": "tab:orange", "mkfs_ms": "tab:green",
               "install_ms": "tab:grey"}
    names = {"copy_ms": "copy / upload / fetch", "unpack_ms": "unpack", "mkfs_ms": "mkfs.ext4",
             "install_ms": "install (forkvm)"}
    bars = []  # (label, case): bottom to top
    for case, _, base in reversed(FIGURES):
        bars += ([(f"by hand ({base})", base)] if base else []) + [(f"forkvm {case}", case)]
    seen = set()
    for y, (_, case) in enumerate(bars):
        left = 0.0
        for st in FORKVM_STAGES:
            v = p(rows, case, st)["p50"] / 1000
            if v == v:
                ax.barh(y, v, left=left, color=colours[st],
                        label=None if st in seen else names[st])
                seen.add(st)
                left += v
        f = p(rows, case)
        if left == 0.0:  # no stages (first_exec): the total alone
            ax.barh(y, f["p50"] / 1000, color="tab:purple", label="boot + template + exec")
        ax.plot([f["p50"] / 1000, f["p90"] / 1000], [y, y], color="black", linewidth=1)
        ax.plot(f["p50"] / 1000, y, "o", color="black", markersize=4,
                label=None if "total" in seen else "total: p50 (dot) to p90 (bar)")
        ax.plot(f["p90"] / 1000, y, "|", color="black", markersize=10)
        seen.add("total")
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set_xlabel("seconds: p50 of each stage, stacked")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)
    ax.set_title("Wall time", fontsize=10)
    cases = ["pull_a", "pull_b"]
    xs = range(len(cases))
    bx.bar([x - 0.2 for x in xs], [p(rows, c, "bytes_fetched")["p50"] / MiB for c in cases],
           0.4, color="tab:purple", label="forkvm")
    bx.bar([x + 0.2 for x in xs], [p(rows, "naive_" + c, "bytes_fetched")["p50"] / MiB
                                   for c in cases], 0.4, color="grey", label="by hand")
    bx.set_xticks(list(xs), ["pull A (cold)", "pull B (after A)"])
    bx.set_ylabel("MiB fetched")
    bx.set_ylim(0, 1.25 * max(p(rows, "naive_pull_a", "bytes_fetched")["p50"] / MiB, 1))
    bx.legend(fontsize=8, loc="upper right")
    bx.set_title("Bytes fetched from the registry", fontsize=10)
    rp.save_figure(fig, path, title=f"~1 GiB image, {img['layers']} layers: forkvm against "
                   "skopeo + umoci + mkfs.ext4 by hand")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def tool_versions() -> str:
    out = []
    for argv in (["umoci", "--version"], ["skopeo", "--version"], ["mmdebstrap", "--version"],
                 ["docker-registry", "--version"]):
        try:
            v = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
            out.append(v.strip().splitlines()[0] if v.strip() else argv[0])
        except (OSError, subprocess.TimeoutExpired):
            out.append(argv[0])
    e2 = subprocess.run(["mkfs.ext4", "-V"], capture_output=True, text=True).stderr.split("\n")[0]
    return "; ".join(out + [e2.strip()])


def drop_host_table(home: str) -> None:
    """Delete the host nft table our daemon made (`inet forkvm-<hash of its
    home>`, see forkvm-net's rules.rs): the daemon leaves it when it stops,
    and the home it belongs to is gone. Only ours: the hash is of our home."""
    name = "forkvm-" + fb.run_dir_for_home(home).name.removeprefix("forkvm-")
    try:
        if subprocess.run(["nft", "list", "table", "inet", name],
                          capture_output=True).returncode == 0:
            subprocess.run(["nft", "delete", "table", "inet", name], capture_output=True)
    except OSError:
        pass  # no nft: the daemon made no table either


def private_artifacts(work: Path, artifacts: Path) -> Path:
    """A directory the daemon's home links to: `guest` -> the artefacts'
    guest/, and an `images/` of the bench's own holding only a link to the
    default image, so what the bench imports never lands in the artefacts."""
    for need in (artifacts / "guest", artifacts / "images" / "default"):
        if not need.is_dir():
            raise fb.BenchError(f"{need} is missing: run scripts/setup.sh (or set "
                                "FORKVM_ARTIFACTS to where the guest artefacts are)")
    mine = work / "artifacts"
    (mine / "images").mkdir(parents=True)
    (mine / "guest").symlink_to(artifacts / "guest")
    (mine / "images" / "default").symlink_to(artifacts / "images" / "default")
    return mine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="repetitions of every figure")
    ap.add_argument("--layer-mib", type=int, default=90, help="size of each random layer")
    ap.add_argument("--out", default=str(HERE / "results"), help="results directory")
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "forkvm"))
    ap.add_argument("--mirror", help="Debian mirror for mmdebstrap (run.sh passes the host's)")
    args = ap.parse_args()
    if args.runs < 1 or args.layer_mib < 1:
        ap.error("--runs and --layer-mib must be positive")
    check_tools()
    args.binary = str(Path(args.binary).resolve())
    artifacts = Path(os.environ.get("FORKVM_ARTIFACTS") or fb.DEFAULT_ARTIFACTS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"started": dt.datetime.now().astimezone(), "machine": rp.machine_info(),
           "tools": tool_versions(), "others": {}, "busy": 0,
           "profile": "debug" if "/debug/" in args.binary else "release",
           "command": "bash bench/images/run.sh " + shlex.join(
               a for a in sys.argv[1:] if not a.startswith("--mirror")
               and a != args.mirror)}
    t0 = time.monotonic()
    rootfs = rootfs_tar(artifacts / "cache", args.mirror)
    rows = []
    # Everything the run makes lives in `work` (on disk: /tmp may be small).
    work = Path(tempfile.mkdtemp(prefix="fvb-images-", dir="/var/tmp"))
    daemon = None
    try:
        img = make_images(work, rootfs, args.layer_mib)
        with Registry(work / "registry") as reg, \
                fb.Daemon(binary=args.binary, artifacts=str(private_artifacts(work, artifacts))) \
                as d:
            daemon = d
            print(f"==> registry on 127.0.0.1:{reg.port}: pushing A and B", flush=True)
            reg.push(img["oci"], "a", "bench/a")
            reg.push(img["oci"], "b", "bench/b")
            ctx["info"] = d.api.info()
            cli = Cli(args.binary, d.home)
            meter = fb.CpuMeter(roots=[d.proc.pid, reg.proc.pid])
            for run in range(1, args.runs + 1):
                others = fb.other_qemu_processes(exclude_substrings=(d.home,))
                ctx["others"].update(others)
                ctx["busy"] += bool(others)
                rows += one_run(run, cli, reg, img, work, meter)
    finally:
        if daemon is not None and daemon.home:
            drop_host_table(daemon.home)
        shutil.rmtree(work, ignore_errors=True)
    ctx["elapsed"] = time.monotonic() - t0
    rp.write_csv(out / "images.csv", rows, FIELDS)
    plot(rows, img, out / "images.png")
    lines = write_results(out / "RESULTS.md", rows, img, ctx, args)
    print("\n".join(lines))
    print(f"\nwrote {out / 'images.csv'}, {out / 'RESULTS.md'}, {out / 'images.png'}")
    return 0


if __name__ == "__main__":
    rp.run_main("bench_images", main, on_signal="exit")
