#!/usr/bin/env bash
# The toolchains that build the example function components (scripts/build-functions.sh,
# docs/functions.md), installed idempotently:
#
#   - Debian: clang, lld, wasi-libc and compiler-rt's wasm32 builtins (the C example);
#   - PyPI: componentize-py (the Python example), in the venv $REPO/.local/wasm-venv;
#   - the npm registry: componentize-js and jco (the JavaScript example; jco also makes
#     the C example's component and lists every component's imports), by `npm ci` in
#     examples/functions/js from its package-lock.json;
#   - the Rust crate registry, only with --wit-bindgen: wit-bindgen-cli (C only), to regenerate the
#     C bindings checked in under examples/functions/c/bindings/ (a `cargo install` of
#     about six CPU-minutes, too long for every CI run; the build does not need it).
#
# Usage: deploy/local/wasm-toolchain.sh [--wit-bindgen]
#   Progress and errors on stderr; re-running is cheap (~1 s) when everything is there.
#   Prints the venv's componentize-py path on stdout (the ONLY thing on stdout).
#
# Environment:
#   SLUICE_PYTHON   interpreter used to create the venv (default: python3 from PATH)
#
# Files:
#   $REPO/.local/wasm-venv/                     the virtualenv with componentize-py
#   $REPO/.local/wasm-venv/.sluice-requirements stamp: the pins it was built with
#   $REPO/.local/wasm-toolchain.log             apt / pip / npm / cargo output of the last run
#   examples/functions/js/node_modules/         npm ci (git-ignored)
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
WIT_BINDGEN_VERSION=0.63.0
APT_PACKAGES=(clang lld wasi-libc libclang-rt-dev-wasm32)

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/../.." && pwd))"
LOCAL_DIR="$REPO/.local"
VENV="$LOCAL_DIR/wasm-venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.sluice-requirements"
LOGFILE="$LOCAL_DIR/wasm-toolchain.log"
JS_DIR="$REPO/examples/functions/js"
PYTHON="${SLUICE_PYTHON:-python3}"

log() { printf '[wasm-toolchain.sh] %s\n' "$*" >&2; }
die() { printf '[wasm-toolchain.sh] ERROR: %s\n' "$*" >&2; exit 1; }

wit_bindgen=
case "${1:-}" in
  -h|--help|help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  --wit-bindgen) wit_bindgen=1 ;;
  '') ;;
  *) die "unexpected argument '$1'. Usage: $0 [--wit-bindgen]" ;;
esac

mkdir -p "$LOCAL_DIR"
exec 9>"$LOCAL_DIR/wasm-toolchain.lock"
if command -v flock >/dev/null; then
  flock -w 600 9 || die "timed out waiting for $LOCAL_DIR/wasm-toolchain.lock (another wasm-toolchain.sh still running?)"
fi
: >"$LOGFILE"

# 1. Debian packages: clang's wasm32 target, the linker, the C library and the builtins.
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
need=()
for p in "${APT_PACKAGES[@]}"; do
  have_pkg "$p" || need+=("$p")
done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get. Fix: install clang, lld, wasi-libc and compiler-rt's wasm32 builtins with your package manager"
  log "installing ${need[*]} (log: $LOGFILE)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends "${need[@]}" >>"$LOGFILE" 2>&1; then
    apt-get update >>"$LOGFILE" 2>&1 || true
    apt-get install -y --no-install-recommends "${need[@]}" >>"$LOGFILE" 2>&1 ||
      { tail -n 20 "$LOGFILE" >&2; die "apt-get install ${need[*]} failed (log: $LOGFILE). Fix: apt-get update && apt-get install -y ${need[*]}"; }
  fi
fi

# 2. componentize-py in its own venv (the Python example).
venv_ok() {
  [ -x "$VENV/bin/componentize-py" ] || return 1
  [ "$(cat "$STAMP" 2>/dev/null)" = "componentize-py==$COMPONENTIZE_PY_VERSION" ] || return 1
  "$VENV/bin/componentize-py" --version >/dev/null 2>&1
}
if ! venv_ok; then
  command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found on PATH. Fix: apt-get install -y python3 python3-venv (or set SLUICE_PYTHON=/path/to/python3)"
  if [ -e "$VENV" ] && ! "$VPY" -c 'pass' >/dev/null 2>&1; then
    log "existing $VENV is broken (its python does not run); recreating it"
    rm -rf "$VENV"
  fi
  if [ ! -x "$VPY" ]; then
    log "creating venv $VENV with $(command -v "$PYTHON") (log: $LOGFILE)"
    "$PYTHON" -m venv "$VENV" >>"$LOGFILE" 2>&1 ||
      { rm -rf "$VENV"; die "'$PYTHON -m venv' failed (log: $LOGFILE). Fix: apt-get install -y python3-venv"; }
  fi
  log "installing componentize-py==$COMPONENTIZE_PY_VERSION (log: $LOGFILE)"
  "$VPY" -m pip install --disable-pip-version-check --no-input --only-binary=:all: \
      "componentize-py==$COMPONENTIZE_PY_VERSION" >>"$LOGFILE" 2>&1 ||
    { tail -n 20 "$LOGFILE" >&2; die "pip install componentize-py==$COMPONENTIZE_PY_VERSION failed (log: $LOGFILE). Fix: check access to PyPI, then: $VPY -m pip install componentize-py==$COMPONENTIZE_PY_VERSION"; }
  printf 'componentize-py==%s\n' "$COMPONENTIZE_PY_VERSION" >"$STAMP"
fi

# 3. componentize-js and jco, pinned by the example's package-lock.json.
command -v node >/dev/null && command -v npm >/dev/null || die "node and npm not found. Fix: apt-get install -y nodejs npm"
lock_stamp="$JS_DIR/node_modules/.sluice-lock-sha256"
want_lock="$(sha256sum "$JS_DIR/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$lock_stamp" 2>/dev/null)" != "$want_lock" ] || [ ! -x "$JS_DIR/node_modules/.bin/jco" ]; then
  log "npm ci in examples/functions/js (log: $LOGFILE)"
  (cd "$JS_DIR" && npm ci --no-audit --no-fund) >>"$LOGFILE" 2>&1 ||
    { tail -n 20 "$LOGFILE" >&2; die "npm ci failed (log: $LOGFILE). Fix: check access to the npm registry (npm config get registry), then: cd examples/functions/js && npm ci"; }
  printf '%s\n' "$want_lock" >"$lock_stamp"
fi

# 4. wit-bindgen, on demand.
if [ -n "$wit_bindgen" ] && [ "$(wit-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WIT_BINDGEN_VERSION" ]; then
  command -v cargo >/dev/null || die "cargo not found. Install Rust: https://rustup.rs"
  log "cargo install wit-bindgen-cli $WIT_BINDGEN_VERSION (C only; about six CPU-minutes; log: $LOGFILE)"
  cargo install --locked wit-bindgen-cli --version "$WIT_BINDGEN_VERSION" --no-default-features --features c >>"$LOGFILE" 2>&1 ||
    { tail -n 20 "$LOGFILE" >&2; die "cargo install wit-bindgen-cli failed (log: $LOGFILE). Fix: cargo install --locked wit-bindgen-cli --version $WIT_BINDGEN_VERSION --no-default-features --features c"; }
fi

log "ready: $(clang --version | head -n 1), componentize-py $("$VENV/bin/componentize-py" --version | awk '{print $2}'), jco $("$JS_DIR/node_modules/.bin/jco" --version), node $(node --version)$(command -v wit-bindgen >/dev/null && printf ', %s' "$(wit-bindgen --version)")"
printf '%s\n' "$VENV/bin/componentize-py"
