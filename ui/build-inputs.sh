#!/usr/bin/env bash
# Print one hash of everything ui/dist is built from (sources, public files,
# configs, lockfile). scripts/setup-ui.sh stamps it into dist/ after a build;
# scripts/test-ui.sh refuses a dist whose stamp differs (stale assets).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
find src public index.html package.json package-lock.json tsconfig.json vite.config.ts -type f -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
