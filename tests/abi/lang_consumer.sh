#!/bin/sh
# Installs the build into a prefix under the build directory, then builds and runs one of the
# examples the way its users build it, through pkg-config:
#   rust: examples/rust with `cargo build --offline --release` (build.rs runs pkg-config)
#   go:   examples/go with `go build` (#cgo pkg-config: freetoken), standard library only
# Usage: lang_consumer.sh rust|go BUILD_DIR SOURCE_DIR CMAKE TOOL [CC]
# Build outputs stay under BUILD_DIR/abi-<lang>, so reruns are incremental; nothing is fetched.
set -eu
lang=$1 build=$2 src=$3 cmake=$4 tool=$5 cc=${6:-cc}
work="$build/abi-$lang"
rm -rf "$work/prefix"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" >/dev/null
libdir=$(ls -d "$work"/prefix/lib*/pkgconfig | head -n1)
libdir=${libdir%/pkgconfig}
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists freetoken || { echo "pkg-config cannot find freetoken"; exit 1; }
PATH="$(dirname "$tool"):$PATH" # rustup's cargo finds its rustc there
export PATH

case $lang in
rust)
  # FREETOKEN_LIB_DIR would bypass pkg-config; this test is about the pkg-config path.
  unset FREETOKEN_LIB_DIR
  "$tool" build --offline --release --quiet --manifest-path "$src/examples/rust/Cargo.toml" \
    --target-dir "$work/target"
  exe="$work/target/release/decode"
  ;;
go)
  export GOPROXY=off GOTOOLCHAIN=local GOFLAGS= GO111MODULE=on CGO_ENABLED=1 CC="$cc"
  export GOCACHE="$work/gocache" GOPATH="$work/gopath"
  # Go's cache does not hash headers outside the package, so the installed header's checksum
  # goes into the cgo flags: a changed header rebuilds the example.
  sum=$(cksum < "$work/prefix/include/freetoken.h" | cut -d' ' -f1)
  export CGO_CFLAGS="-O2 -g -DFT_HEADER_CKSUM=$sum"
  (cd "$src/examples/go" && "$tool" build -o "$work/decode" .)
  exe="$work/decode"
  ;;
*)
  echo "unknown consumer '$lang'"; exit 2
  ;;
esac
LD_LIBRARY_PATH="$libdir" "$exe"
echo "$lang consumer built through pkg-config and ran"
