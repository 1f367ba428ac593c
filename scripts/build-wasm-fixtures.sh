#!/usr/bin/env bash
# Builds the test fixture components of the WebAssembly host from their source,
# testdata/wasm/fixture.py, with componentize-py (pinned: 0.25.1), into OUT_DIR
# (default: target/wasm-fixtures). Nothing built is checked in.
#
#   fixture.wasm       --stub-wasi: imports nothing (the one the tests attach)
#   fixture-wasi.wasm  without --stub-wasi: imports WASI (a clock among others), refused
#   fixture-v2.wasm    against a copy of schemas/function.wit at version 2.0.0, refused
#
# Idempotent: a stamp (the hash of the source, the world and the tool's version) skips
# the build when nothing changed. Called by the tests that need the fixtures
# (src/functions/wasm/tests.rs, integration-tests/tests/it/wasm_functions.rs).
# Exit 3 when componentize-py is missing (with CI set the tests then fail, never skip).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=${1:-target/wasm-fixtures}
mkdir -p "$out"
out=$(cd "$out" && pwd)
tool=${SLUICE_COMPONENTIZE_PY:-}
if [ -z "$tool" ]; then
    if command -v componentize-py >/dev/null 2>&1; then
        tool=componentize-py
    elif [ -x "$repo/.local/wasm-venv/bin/componentize-py" ]; then
        # deploy/local/wasm-toolchain.sh's venv (the test command installs it first)
        tool="$repo/.local/wasm-venv/bin/componentize-py"
    elif [ -x "$repo/.local/venv/bin/componentize-py" ]; then
        tool="$repo/.local/venv/bin/componentize-py"
    else
        echo "build-wasm-fixtures.sh: componentize-py not found: deploy/local/wasm-toolchain.sh installs it (or: pip install componentize-py==0.25.1)" >&2
        exit 3
    fi
fi
version=$("$tool" --version 2>&1 | head -n 1)
stamp=$( (cat testdata/wasm/fixture.py schemas/function.wit; echo "$version") | sha256sum | cut -d' ' -f1)
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] \
    && [ -f "$out/fixture.wasm" ] && [ -f "$out/fixture-wasi.wasm" ] && [ -f "$out/fixture-v2.wasm" ]; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp testdata/wasm/fixture.py "$work/fixture.py"
sed 's/^package sluice:function@1\.0\.0;/package sluice:function@2.0.0;/' schemas/function.wit >"$work/function-v2.wit"
grep -q '@2.0.0;' "$work/function-v2.wit" || { echo "build-wasm-fixtures.sh: the world's version line moved" >&2; exit 1; }
cd "$work"
"$tool" -d "$repo/schemas/function.wit" -w function componentize --stub-wasi fixture -o "$out/fixture.wasm" >&2
"$tool" -d "$repo/schemas/function.wit" -w function componentize fixture -o "$out/fixture-wasi.wasm" >&2
"$tool" -d "$work/function-v2.wit" -w function componentize --stub-wasi fixture -o "$out/fixture-v2.wasm" >&2
echo "$stamp" >"$out/stamp"
