#!/usr/bin/env bash
# Builds the example function components of examples/functions/ (docs/functions.md):
#
#   word_count.wasm    Python, componentize-py
#   norm_guard.wasm    JavaScript, componentize-js (every WASI feature disabled)
#   project_keys.wasm  C, clang's wasm32-wasi target with wasi-libc, bindings by wit-bindgen
#   count_records.wasm C, the same way: the built-in record_counter's logic, for the
#                      benchmark of the component boundary (scripts/bench-wasm.sh)
#
# checks that each one exports sluice:function/guest@1.0.0 and imports nothing but the
# types of its own world (sluice:function/types@1.0.0, which holds no function), and
# prints each one's size and build time.
#
#   scripts/build-functions.sh [OUT_DIR]     # default target/functions
#   scripts/build-functions.sh --check [OUT_DIR]
#       also runs examples/functions/check_components.py: each component against the
#       reference (examples/functions/reference.py), in Node
#
# The toolchains come from deploy/local/wasm-toolchain.sh; a missing one is an error that
# names it. When wit-bindgen is on PATH at the version the bindings were made with, the
# C bindings under examples/functions/c/bindings/ are regenerated into a scratch folder
# and must equal the checked-in ones.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"

check=
if [ "${1:-}" = "--check" ]; then
    check=1
    shift
fi
case "${1:-}" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
OUT="${1:-target/functions}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

WIT="$REPO/schemas/function.wit"
EX="$REPO/examples/functions"
JS_DIR="$EX/js"
JCO="$JS_DIR/node_modules/.bin/jco"
COMPONENTIZE_JS="$JS_DIR/node_modules/.bin/componentize-js"
WIT_BINDGEN_VERSION=0.63.0
FIX="deploy/local/wasm-toolchain.sh"

die() { printf 'build-functions.sh: %s\n' "$*" >&2; exit 1; }

# The tools, each a clear error when missing.
COMPONENTIZE_PY="${SLUICE_COMPONENTIZE_PY:-}"
if [ -z "$COMPONENTIZE_PY" ]; then
    if [ -x "$REPO/.local/wasm-venv/bin/componentize-py" ]; then
        COMPONENTIZE_PY="$REPO/.local/wasm-venv/bin/componentize-py"
    elif command -v componentize-py >/dev/null; then
        COMPONENTIZE_PY="$(command -v componentize-py)"
    else
        die "componentize-py not found. Fix: $FIX   (or: pip install componentize-py==0.25.1)"
    fi
fi
command -v node >/dev/null || die "node not found. Fix: apt-get install -y nodejs npm"
[ -x "$JCO" ] && [ -x "$COMPONENTIZE_JS" ] ||
    die "jco / componentize-js not installed in examples/functions/js. Fix: $FIX   (or: cd examples/functions/js && npm ci)"
command -v clang >/dev/null || die "clang not found. Fix: $FIX   (or: apt-get install -y clang lld wasi-libc libclang-rt-dev-wasm32)"
command -v wasm-ld >/dev/null || die "wasm-ld not found. Fix: $FIX   (or: apt-get install -y lld)"
[ -f /usr/include/wasm32-wasi/stdlib.h ] || [ -n "${WASI_SYSROOT:-}" ] ||
    die "wasi-libc not found (/usr/include/wasm32-wasi). Fix: $FIX   (or: apt-get install -y wasi-libc; elsewhere set WASI_SYSROOT to a wasi-sdk sysroot)"
SYSROOT_FLAGS=()
[ -z "${WASI_SYSROOT:-}" ] || SYSROOT_FLAGS=(--sysroot "$WASI_SYSROOT")

declare -A seconds
timed() { # NAME COMMAND...: runs it, records its wall time
    local name="$1" start end
    shift
    start=$(date +%s%N)
    "$@"
    end=$(date +%s%N)
    seconds[$name]=$(( (end - start) / 1000000000 )).$(( (end - start) / 100000000 % 10 ))
}

build_python() {
    (cd "$EX/python" && "$COMPONENTIZE_PY" -d "$WIT" -w function componentize --stub-wasi word_count -o "$OUT/word_count.wasm" >/dev/null)
}

build_js() {
    # componentize-js's own CLI: jco 1.35.0's `jco componentize` cannot read a WIT path
    # here (its bundled preview2-shim has no filesystem preopen). The five features are
    # all of them (`jco componentize --disable all`).
    (cd "$JS_DIR" && "$COMPONENTIZE_JS" norm_guard.js --wit "$WIT" --world-name function \
        --disable stdio random clocks http fetch-event --out "$OUT/norm_guard.wasm" >/dev/null)
}

build_c() { # NAME: examples/functions/c/NAME.c -> NAME.wasm
    local name="$1" tmp
    tmp="$(mktemp -d)"
    # A core module with no entry point (no _start, so no WASI start-up code) whose exports
    # are the world's, with the component type section of the bindings; jco (wasm-tools'
    # `component new`) wraps it into a component.
    clang --target=wasm32-wasi "${SYSROOT_FLAGS[@]}" -O2 -std=c11 -Wall -Wextra -Werror \
        -nostartfiles -Wl,--no-entry -Wl,--strip-debug \
        -I "$EX/c/bindings" \
        "$EX/c/$name.c" "$EX/c/bindings/function.c" "$EX/c/bindings/function_component_type.o" \
        -o "$tmp/$name.core.wasm"
    "$JCO" new "$tmp/$name.core.wasm" -o "$OUT/$name.wasm" >/dev/null
    rm -rf "$tmp"
}

# Checked-in C bindings equal what wit-bindgen makes of the WIT (when it is here).
check_c_bindings() {
    if [ "$(wit-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WIT_BINDGEN_VERSION" ]; then
        echo "build-functions.sh: wit-bindgen $WIT_BINDGEN_VERSION not on PATH: the checked-in C bindings are used as they are (regenerate: $FIX --wit-bindgen, then examples/functions/c/regenerate-bindings.sh)" >&2
        return 0
    fi
    local tmp
    tmp="$(mktemp -d)"
    local said
    said="$(wit-bindgen c "$WIT" --world function --out-dir "$tmp" 2>&1)" || die "wit-bindgen c failed: $said"
    if ! diff -r "$tmp" "$EX/c/bindings" >/dev/null; then
        diff -r "$tmp" "$EX/c/bindings" | head -n 20 >&2 || true
        rm -rf "$tmp"
        die "examples/functions/c/bindings/ differ from what wit-bindgen $WIT_BINDGEN_VERSION makes of schemas/function.wit. Fix: examples/functions/c/regenerate-bindings.sh"
    fi
    rm -rf "$tmp"
    echo "build-functions.sh: the C bindings equal wit-bindgen $WIT_BINDGEN_VERSION's output for schemas/function.wit" >&2
}

# Imports nothing but the types of the world; exports guest.
check_world() {
    local wasm="$1" wit imports
    wit="$("$JCO" wit "$wasm")" || die "$(basename "$wasm"): jco wit cannot read it"
    imports="$(grep -E '^[[:space:]]*import ' <<<"$wit" | grep -vxE '[[:space:]]*import sluice:function/types@1\.0\.0;' || true)"
    [ -z "$imports" ] || die "$(basename "$wasm") imports something besides its world's types: $(tr -s ' \n' ' ' <<<"$imports")"
    grep -qxE '[[:space:]]*export sluice:function/guest@1\.0\.0;' <<<"$wit" ||
        die "$(basename "$wasm") does not export sluice:function/guest@1.0.0"
}

check_c_bindings
timed word_count.wasm build_python
timed norm_guard.wasm build_js
timed project_keys.wasm build_c project_keys
timed count_records.wasm build_c count_records

printf '%-18s %12s %8s  %s\n' component bytes build imports
for f in word_count.wasm norm_guard.wasm project_keys.wasm count_records.wasm; do
    check_world "$OUT/$f"
    printf '%-18s %12s %7ss  %s\n' "$f" "$(stat -c %s "$OUT/$f")" "${seconds[$f]}" "none (only the types of sluice:function/types@1.0.0)"
done
echo "build-functions.sh: built into $OUT ($(basename "$COMPONENTIZE_PY") $("$COMPONENTIZE_PY" --version | awk '{print $2}'), jco $("$JCO" --version), $(clang --version | head -n 1))"

if [ -n "$check" ]; then
    python3 "$EX/check_components.py" "$OUT"
fi
