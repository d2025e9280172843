#!/usr/bin/env bash
# Installs what FreeToken builds with (Debian/Ubuntu packages) and builds it into build/.
# Safe to run again: installed packages and an up-to-date build are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the build and the tests use, by Debian 12 name; Ubuntu 24.04 uses the same names (some in
# universe). Its oneDNN is 3.1, whose API cpu/src/onednn_matmul.cpp also handles.
# - build: cmake ninja-build g++ pkg-config, libdnnl-dev + ocl-icd-opencl-dev (Debian's oneDNN
#   CMake config looks for OpenCL), nlohmann-json3-dev, libgtest-dev libgmock-dev libbenchmark-dev
# - consumer tests: make (C example), binutils (nm for the export check), golang-go, cargo rustc
#   (the Rust bindings at their minimum, 1.63)
# - clang and its runtimes (libFuzzer, ASan, UBSan, TSan): scripts/sanitizers.sh; the metapackage
#   libclang-rt-dev follows the distribution's clang (14 on Debian 12, 18 on Ubuntu 24.04)
# - python3 and python3-numpy/-pip/-setuptools/-wheel: the ft CLI tests and the freetoken Python
#   package's tests (run with /usr/bin/python3)
# - libsimde-dev (headers): test_gguf_avx512_emulated runs the AVX-512 kernels on any x86-64 CPU
# Optional, installed where the distribution has them (their tests skip elsewhere): python3-torch
# (the PyTorch integration's tests; Ubuntu 24.04 does not package it).
packages=(cmake ninja-build g++ make pkg-config libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev binutils golang-go cargo rustc clang libclang-rt-dev
          python3 python3-numpy python3-pip python3-setuptools python3-wheel libsimde-dev)
optional=(python3-torch)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
missing=()
for p in "${packages[@]}" "${optional[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  install=()
  for p in "${missing[@]}"; do
    candidate=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')
    if [[ " ${optional[*]} " == *" $p "* ]] && [[ -z "$candidate" || "$candidate" == "(none)" ]]; then
      echo "setup: $p is not packaged here; the tests that need it skip"
      continue
    fi
    install+=("$p")
  done
  if [ ${#install[@]} -gt 0 ]; then
    echo "setup: installing ${install[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${install[@]}"
  fi
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
