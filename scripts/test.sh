#!/usr/bin/env bash
# Build, then run every test (GPU tests skip where no GPU is usable). ctest prints the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd "${FT_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
