#!/bin/sh
# Installs the build into a prefix and moves the prefix elsewhere (install_prefix.sh), checks the
# installed licence, then,
# without LD_LIBRARY_PATH: runs the installed ft (its run path is $ORIGIN/../lib), and builds and
# runs the C example twice, through pkg-config (examples/c/Makefile, run path from pkg-config's
# libdir) and through CMake's find_package (examples/cmake; CMake records the imported library's
# folder as the build run path).
set -eu
build=$1 src=$2 cc=$3 cmake=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/abi/install_prefix.sh"

# The licence travels with the install and is named by both package descriptions.
cmp -s "$src/LICENSE" "$prefix/share/doc/freetoken/LICENSE" || { echo "LICENSE is not installed"; exit 1; }
[ "$(sed -n 's/^License: //p' "$PKG_CONFIG_PATH/freetoken.pc")" = MIT ] ||
  { echo "freetoken.pc names no MIT licence"; exit 1; }
grep -q 'freetoken_LICENSE "MIT"' "$(dirname "$PKG_CONFIG_PATH")"/cmake/freetoken/freetokenConfig.cmake ||
  { echo "the CMake package names no licence"; exit 1; }

"$prefix/bin/ft" --help >/dev/null
"$prefix/bin/ft" info >/dev/null || { echo "the installed ft does not run from the moved prefix"; exit 1; }

mkdir "$work/pc"
cp "$src/examples/c/decode.c" "$src/examples/c/Makefile" "$work/pc/"
make -s -C "$work/pc" CC="$cc" decode
"$work/pc/decode"

"$cmake" -S "$src/examples/cmake" -B "$work/cm" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" >/dev/null
"$cmake" --build "$work/cm" >/dev/null
"$work/cm/decode"
echo "ft, pkg-config and find_package consumers ran from a moved prefix without LD_LIBRARY_PATH"
