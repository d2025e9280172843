#!/usr/bin/env bash
# Installs what FreeToken builds with (Debian/Ubuntu packages) and builds it into build/.
# Safe to run again: installed packages and an up-to-date build are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's oneDNN CMake config looks for OpenCL, hence ocl-icd-opencl-dev; make builds the
# pkg-config consumer example; clang and its runtimes (libFuzzer, ASan, UBSan, TSan) serve
# scripts/sanitizers.sh.
packages=(cmake ninja-build g++ make pkg-config libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev binutils golang-go clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build=${FT_BUILD_DIR:-build}
# CUDA parts are built when nvcc is found (PATH or /usr/local/cuda). One architecture keeps a
# 2-core build short; release builds list them all (see CMakeLists.txt).
cuda_args=()
if [ -z "${FT_NO_CUDA:-}" ]; then
  nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
  if [ -n "$nvcc" ]; then
    cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${FT_CUDA_ARCHS:-90}")
  fi
else
  cuda_args=(-DFT_WITH_CUDA=OFF)
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" ${FT_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$(nproc)"
