#!/usr/bin/env bash
# Prints the gtest filter that leaves out the tests labelled `timing` in the ctest build folder $1
# (e.g. -ProfileGpu.GatherAndOverlappedFigures:Hybrid.AdaptiveFractionConverges), for runs of a
# test binary outside ctest whose clocks are not the test's (compute-sanitizer).
set -euo pipefail
# ctest names parameterised tests "Prefix/Suite.Name/param  # GetParam() = ...": the gtest name
# is the part before the comment.
names=$(ctest --test-dir "${1:?usage: timing-filter.sh BUILD_DIR}" -N -L timing |
  sed -n 's/^ *Test *#[0-9]*: //p' | sed 's/  # GetParam() = .*//' | paste -sd: -)
echo "-${names}"
