# Sourced by consumers.sh and lang_consumer.sh: installs the build into WORK/staged, then moves
# the tree to WORK/prefix, so everything after runs from an install prefix that was moved (run
# paths must come from where the tree is now, not from where it was installed). Sets prefix,
# libdir (absolute, no ..), PKG_CONFIG_PATH; unsets LD_LIBRARY_PATH.
# Needs: build, work, cmake.
rm -rf "$work/staged" "$work/prefix"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/staged" >/dev/null
mv "$work/staged" "$work/prefix"
prefix=$work/prefix
unset LD_LIBRARY_PATH
PKG_CONFIG_PATH=$(ls -d "$prefix"/lib*/pkgconfig | head -n1)
export PKG_CONFIG_PATH
pkg-config --exists freetoken || { echo "pkg-config cannot find freetoken in $PKG_CONFIG_PATH"; exit 1; }
libdir=$(cd "$(pkg-config --variable=libdir freetoken)" && pwd)
