#!/bin/sh
# Installs the build into a scratch prefix, then builds and runs the C example twice: through
# pkg-config (examples/c/Makefile) and through CMake's find_package (examples/cmake).
set -eu
build=$1 src=$2 cc=$3 cmake=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cmake" --install "$build" --prefix "$work/prefix" >/dev/null
libdir=$(ls -d "$work"/prefix/lib*/pkgconfig | head -n1)
libdir=${libdir%/pkgconfig}

export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists freetoken || { echo "pkg-config cannot find freetoken"; exit 1; }
mkdir "$work/pc"
cp "$src/examples/c/decode.c" "$src/examples/c/Makefile" "$work/pc/"
make -s -C "$work/pc" CC="$cc" decode
LD_LIBRARY_PATH="$libdir" "$work/pc/decode"

"$cmake" -S "$src/examples/cmake" -B "$work/cm" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_C_COMPILER="$cc" >/dev/null
"$cmake" --build "$work/cm" >/dev/null
LD_LIBRARY_PATH="$libdir" "$work/cm/decode"
echo "pkg-config and find_package consumers built and ran"
