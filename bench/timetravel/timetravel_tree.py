"""The diff and merge half of bench/timetravel: a tree of --files files in a
git repository the guest commits, branched into --children children that
each change --changed files of their own; `forkvm diff` against `git status`
in the child, `forkvm merge` against `git diff | git apply` by hand.

The guest image (Debian) has git, so the baseline is the real tool in the
guest, with nothing uploaded. Each child appends one line to its files, so
their sizes change; `git status` then hashes those files, and forkvm's diff
decides them by metadata (its `contents_read` is recorded per diff).
"""

from __future__ import annotations

import time

import forkvm_bench as fb

TREE = "/root/tree"
DIRS = 100  # the tree's files are spread over this many directories

# Writes --files files (about 1 KiB of text each) under TREE/dNN/, then
# commits them. Run in the source before the branch.
MAKE_TREE = r"""
import os, sys
root, n, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    os.makedirs(f"{root}/d{d:03}", exist_ok=True)
for i in range(n):
    with open(f"{root}/d{i % dirs:03}/f{i // dirs:05}.txt", "w") as f:
        f.write("".join(f"file {i} line {k}: some text of a source file\n" for k in range(24)))
"""

GIT = "git -c user.email=bench@forkvm -c user.name=bench"
# The repository lives beside the tree, not in it, so that git's own writes
# (a `git status` refreshes the index) are not differences of the tree that
# forkvm's diff would rightly list and git's would not.
# Automatic gc is off: a commit of 10,000 files otherwise starts a detached
# `git gc --auto`, which the branch copies into every child still running,
# so each repacks on its own while the diffs and statuses are measured.
GITENV = f"export GIT_DIR={TREE}.git GIT_WORK_TREE={TREE}; "


def child_files(i: int, changed: int) -> list[str]:
    """The files child `i` changes: `changed` consecutive file numbers
    starting at i × changed, so they spread over every directory and no two
    children share one."""
    return [f"d{j % DIRS:03}/f{j // DIRS:05}.txt" for j in range(i * changed, (i + 1) * changed)]


def timed_sh(sh, d, sid, script, **extra) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = sh(d, sid, script, **extra)
    return fb.ms_since(t0), out


def git_status(sh, d, sid) -> tuple[float, float, int]:
    """`git status --porcelain` in the guest: exec wall, the guest's own
    clock around git (ms), and the number of paths it lists."""
    wall, out = timed_sh(sh, d, sid,
                         f"{GITENV}cd {TREE}; s=$(date +%s%N); git status --porcelain >/tmp/gs; "
                         "e=$(date +%s%N); echo $(( (e - s) / 1000 )) $(wc -l </tmp/gs)")
    us, n = out.split()
    return wall, int(us) / 1000, int(n)


def tree_ops(d: fb.Daemon, args, ctx: dict, sh) -> list[dict]:
    src = d.create(memory_mib=args.memory, network="none")["id"]
    print(f"[tree] source {src}: {args.files} files, git commit", flush=True)
    make_ms, _ = timed_sh(sh, d, src, f"cat > /tmp/mk.py && python3 /tmp/mk.py {TREE} "
                          f"{args.files} {DIRS}", stdin=MAKE_TREE, timeout_ms=1_800_000)
    commit_ms, _ = timed_sh(sh, d, src, f"{GITENV}cd {TREE} && git init -q && "
                            f"git config gc.auto 0 && git add -A && {GIT} commit -qm base && git status --porcelain | wc -l && sync",
                            timeout_ms=1_800_000)
    ctx["tree"] = {"make_ms": make_ms, "commit_ms": commit_ms,
                   "git": sh(d, src, "git --version").strip(),
                   "count": int(sh(d, src, f"find {TREE} -path {TREE}/.git -prune -o -type f "
                                           "-print | wc -l"))}
    t0 = time.perf_counter()
    b = d.api.request("POST", f"/v1/sandboxes/{src}/branch", {"count": args.children})
    ctx["tree"]["branch_ms"] = fb.ms_since(t0)
    kids = [k["id"] if isinstance(k, dict) else k for k in b["children"]]
    d.sandboxes.update(kids)
    for i, k in enumerate(kids):
        files = " ".join(child_files(i, args.changed))
        sh(d, k, f"cd {TREE} && for f in {files}; do echo 'changed by child {i}' >> $f; done")
    rows = []
    for run in range(args.diff_runs):
        for i, k in enumerate(kids):
            # Alternate which goes first, so neither always meets a cold cache.
            order = ("diff", "git") if (run + i) % 2 == 0 else ("git", "diff")
            for what in order:
                if what == "diff":
                    t0 = time.perf_counter()
                    v = d.api.request("POST", f"/v1/diff/{src}", {"b": k, "path": TREE})
                    wall = fb.ms_since(t0)
                    n = len(v["changes"])
                    if n != args.changed:
                        raise fb.BenchError(
                            f"diff of child {k} found {n} changes, not {args.changed}: "
                            f"{v['stats']}, e.g. {v['changes'][:3]}")
                    rows.append({"op": "diff", "run": run + 1, "wall_ms": wall,
                                 "engine_ms": v["diff_ms"], "count": n,
                                 "entries": v.get("entries"),
                                 "contents_read": v.get("contents_read"), "note": k})
                else:
                    wall, guest_ms, n = git_status(sh, d, k)
                    rows.append({"op": "git_status", "run": run + 1, "wall_ms": wall,
                                 "engine_ms": guest_ms, "count": n, "note": k})
                if n != args.changed:
                    raise fb.BenchError(f"{what} of child {k} found {n} changes, "
                                        f"not {args.changed}")
            print(f"[tree] run {run + 1}: child {i}: diff {rows[-2 if order[0] == 'diff' else -1]['wall_ms']:.0f} ms, "
                  f"git status {rows[-1 if order[0] == 'diff' else -2]['wall_ms']:.0f} ms", flush=True)
    rows += merges(d, src, kids, args, sh)
    return rows


def merges(d: fb.Daemon, src: str, kids: list[str], args, sh) -> list[dict]:
    """Each child's changes into the source: forkvm merge for the even
    children, git diff | git apply for the odd ones (ABAB), each checked by
    the bytes of the child's files in the source and by git's count."""
    rows = []
    for i, k in enumerate(kids):
        files = " ".join(child_files(i, args.changed))
        if i % 2 == 0:
            t0 = time.perf_counter()
            m = d.api.request("POST", f"/v1/sandboxes/{k}/merge", {"into": src, "path": TREE})
            rows.append({"op": "merge", "run": i // 2 + 1, "wall_ms": fb.ms_since(t0),
                         "engine_ms": m["merge_ms"], "count": len(m["applied"]), "note": k})
        else:
            t0 = time.perf_counter()
            patch = sh(d, k, f"{GITENV}cd {TREE} && git diff --binary")
            sh(d, src, f"{GITENV}cd {TREE} && git apply", stdin=patch)
            rows.append({"op": "git_apply", "run": i // 2 + 1, "wall_ms": fb.ms_since(t0),
                         "count": patch.count("\ndiff --git ") + patch.startswith("diff --git "),
                         "bytes": len(patch), "note": k})
        sums = f"cd {TREE} && cat {files} | sha256sum"
        if sh(d, src, sums) != sh(d, k, sums):
            raise fb.BenchError(f"after {rows[-1]['op']} of {k} the source's files differ")
        n = int(sh(d, src, f"{GITENV}cd {TREE} && git status --porcelain | wc -l"))
        if n != args.changed * (i + 1) or rows[-1]["count"] != args.changed:
            raise fb.BenchError(f"after {rows[-1]['op']} of {k}: {rows[-1]['count']} paths "
                                f"applied, git lists {n} changed in the source")
        print(f"[tree] {rows[-1]['op']} of child {i}: {rows[-1]['wall_ms']:.0f} ms", flush=True)
    return rows
