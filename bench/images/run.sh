#!/usr/bin/env bash
# Images benchmark: `forkvm image import` of a ~1 GiB docker-save tar and the
# first exec in it, `forkvm image pull` of that image from a local registry
# (cold) and of a second one sharing 90% of its layers, against doing the
# same by hand (skopeo + umoci + mkfs.ext4), in one run.
#
# Usage: bash bench/images/run.sh [--runs N] [--layer-mib MiB] [--out DIR]
#                                 [--binary PATH]
#   --runs N         repetitions of every figure (default 5; fewer is a smoke run)
#   --layer-mib MiB  size of each of the 9 random data layers (default 90)
#   --out DIR        results directory (default bench/images/results)
#   --binary PATH    use this forkvm binary instead of building the release one
# Environment:
#   FORKVM_ARTIFACTS  where guest/, images/default and cache/ live (default
#                     /var/lib/forkvm); the Debian rootfs tar made by
#                     mmdebstrap is cached in its cache/, so reruns skip it
#
# Needs mmdebstrap, umoci, skopeo, docker-registry and mkfs.ext4 (Debian:
# apt-get install mmdebstrap umoci skopeo docker-registry e2fsprogs); fails,
# naming what is missing, without them. Takes the Debian mirror from the
# host's apt sources, as scripts/build-guest.sh does.
# Writes results/images.csv, RESULTS.md, images.png.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

missing=()
for tool in mmdebstrap umoci skopeo docker-registry mkfs.ext4; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if (( ${#missing[@]} )); then
    echo "run.sh: missing tool(s): ${missing[*]}." >&2
    echo "run.sh: this bench needs them all; on Debian: apt-get install mmdebstrap umoci skopeo docker-registry e2fsprogs" >&2
    exit 1
fi

# In a subshell: lib.sh installs traps meant for the setup scripts.
if ! mirror=$(set -euo pipefail; source "$REPO/scripts/lib.sh"; apt_mirror_uri); then
    echo "run.sh: no 'bookworm' entry in the host apt sources to take the Debian mirror from:" \
        "configure one for apt, then re-run" >&2
    exit 1
fi

for arg in "$@"; do
    if [[ $arg == --binary || $arg == --binary=* ]]; then
        # A given binary: no build. The same .venv checks as run_bench.sh.
        PY="$REPO/.venv/bin/python"
        if [[ ! -x "$PY" ]] || ! "$PY" -c 'import matplotlib' 2>/dev/null; then
            echo "run.sh: $REPO/.venv with matplotlib is missing: run scripts/setup.sh" >&2
            exit 1
        fi
        exec "$PY" "$HERE/bench_images.py" --mirror "$mirror" "$@"
    fi
done
exec "$REPO/bench/common/run_bench.sh" "$HERE" bench_images.py --mirror "$mirror" "$@"
