#!/usr/bin/env bash
# The main job: build, then `ft run` on MODEL (a Hugging Face checkpoint directory) or, without
# one, on a generated synthetic Qwen3-MoE-like checkpoint. Extra arguments go to `ft run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${FT_BUILD_DIR:-build}/tools/ft/ft" run "$@"
