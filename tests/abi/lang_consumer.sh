#!/bin/sh
# Installs the build into a prefix and moves the prefix elsewhere (install_prefix.sh), then, the
# way a downstream user does and without LD_LIBRARY_PATH:
#   rust:          builds and runs examples/rust (path dependencies on bindings/rust) with
#                  `cargo build --offline --release`; its build.rs sets the run path
#   rust-bindings: `cargo test --offline --all-features` of bindings/rust (freetoken-sys and
#                  freetoken: unit, integration, doc and compile-fail tests)
#   go:            builds and runs examples/go (replace directive to bindings/go/freetoken),
#                  run path through CGO_LDFLAGS from pkg-config's libdir
#   go-bindings:   `go vet` and `go test` of bindings/go/freetoken
# Usage: lang_consumer.sh MODE BUILD_DIR SOURCE_DIR CMAKE TOOL [CC]
# TOOL is cargo (Debian's: rustc from the same folder is used, so rust-version 1.63 is what is
# tested on Debian 12) or go. Build outputs stay under BUILD_DIR/abi-MODE; nothing is fetched.
set -eu
mode=$1 build=$2 src=$3 cmake=$4 tool=$5 cc=${6:-cc}
work="$build/abi-$mode"
. "$src/tests/abi/install_prefix.sh"
tooldir=$(dirname "$tool")
PATH="$tooldir:$PATH" # the cargo's own rustc, the go's own toolchain
export PATH

case $mode in
rust|rust-bindings)
  unset FREETOKEN_LIB_DIR RUSTFLAGS # this is about the pkg-config path and build.rs run paths
  [ -x "$tooldir/rustc" ] && RUSTC="$tooldir/rustc" && export RUSTC
  "${RUSTC:-rustc}" --version
  if [ "$mode" = rust ]; then
    "$tool" build --offline --release --quiet --manifest-path "$src/examples/rust/Cargo.toml" \
      --target-dir "$work/target"
    "$work/target/release/decode"
  else
    "$tool" test --offline --quiet --workspace --all-features --manifest-path "$src/bindings/rust/Cargo.toml" \
      --target-dir "$work/target"
  fi
  ;;
go|go-bindings)
  export GOPROXY=off GOTOOLCHAIN=local GOFLAGS= GO111MODULE=on CGO_ENABLED=1 CC="$cc"
  export GOCACHE="$work/gocache" GOPATH="$work/gopath"
  # Go's cache does not hash headers outside the package, so the installed header's checksum
  # goes into the cgo flags: a changed header rebuilds.
  sum=$(cksum < "$prefix/include/freetoken.h" | cut -d' ' -f1)
  export CGO_CFLAGS="-O2 -g -DFT_HEADER_CKSUM=$sum"
  export CGO_LDFLAGS="-O2 -g -Wl,-rpath,$libdir"
  "$tool" version
  if [ "$mode" = go ]; then
    (cd "$src/examples/go" && "$tool" vet . && "$tool" build -o "$work/decode" .)
    "$work/decode"
  else
    (cd "$src/bindings/go/freetoken" && "$tool" vet . && "$tool" test -count=1 .)
  fi
  ;;
*)
  echo "unknown mode '$mode'"; exit 2
  ;;
esac
echo "$mode: built through pkg-config from a moved prefix and ran without LD_LIBRARY_PATH"
