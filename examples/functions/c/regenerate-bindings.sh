#!/usr/bin/env bash
# Regenerates the C bindings of the example (bindings/) from schemas/function.wit with
# wit-bindgen 0.63.0, the version they were made with (deploy/local/wasm-toolchain.sh
# --wit-bindgen installs it from the Rust crate registry). scripts/build-functions.sh checks, whenever
# that wit-bindgen is on PATH, that the checked-in files equal its output.
set -euo pipefail
cd "$(dirname "$0")"
WIT_BINDGEN_VERSION=0.63.0
have="$(wit-bindgen --version 2>/dev/null | awk '{print $2}')"
[ "$have" = "$WIT_BINDGEN_VERSION" ] ||
    { echo "regenerate-bindings.sh: needs wit-bindgen $WIT_BINDGEN_VERSION (found: ${have:-none}). Fix: deploy/local/wasm-toolchain.sh --wit-bindgen" >&2; exit 1; }
rm -rf bindings
wit-bindgen c ../../../schemas/function.wit --world function --out-dir bindings >/dev/null
ls -l bindings
