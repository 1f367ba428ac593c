#!/usr/bin/env bash
# Python virtualenv for test helpers (Kafka producers/consumers, Avro encoding).
#
# Usage: deploy/local/python-env.sh
#   Creates (idempotently) $REPO/.local/venv with the pinned packages below and
#   prints the venv's python path on stdout (the ONLY thing on stdout), e.g.
#       PY="$(deploy/local/python-env.sh)" && "$PY" tools/produce.py
#   Progress and errors go to stderr. Re-running is cheap (~0.3s) when the venv is
#   already complete; it is rebuilt if its interpreter is broken (e.g. the pyenv
#   version it was made from was removed).
#
# Environment:
#   SLUICE_PYTHON   interpreter used to create the venv (default: python3 from PATH;
#                   on the dev machine that is a pyenv build under /root/.pyenv)
#
# Files:
#   $REPO/.local/venv/                 the virtualenv
#   $REPO/.local/venv/.sluice-requirements  stamp: the pins it was built with
#   $REPO/.local/python-env.log        pip / venv output of the last build
set -euo pipefail

# Pinned and verified on Debian 12 / CPython 3.11 (x86_64): both install from
# manylinux wheels (--only-binary below), so no compiler or librdkafka-dev is
# needed; confluent-kafka 2.16.1 bundles librdkafka 2.16.0.
REQUIREMENTS=(
  'confluent-kafka==2.16.1'
  'fastavro==1.13.1'
)

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/../.." && pwd))"
LOCAL_DIR="$REPO/.local"
VENV="$LOCAL_DIR/venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.sluice-requirements"
LOGFILE="$LOCAL_DIR/python-env.log"
PYTHON="${SLUICE_PYTHON:-python3}"

log() { printf '[python-env.sh] %s\n' "$*" >&2; }
die() { printf '[python-env.sh] ERROR: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  -h|--help|help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  '') ;;
  *) die "unexpected argument '$1'. Usage: $0" ;;
esac

want_stamp() { printf '%s\n' "${REQUIREMENTS[@]}"; }

venv_ok() {
  [ -x "$VPY" ] || return 1
  [ -f "$STAMP" ] || return 1
  [ "$(cat "$STAMP")" = "$(want_stamp)" ] || return 1
  "$VPY" -c 'import confluent_kafka, fastavro' >/dev/null 2>&1
}

mkdir -p "$LOCAL_DIR"
exec 9>"$LOCAL_DIR/python-env.lock"
if command -v flock >/dev/null; then
  flock -w 600 9 || die "timed out waiting for $LOCAL_DIR/python-env.lock (another python-env.sh still running?)"
fi

if venv_ok; then
  printf '%s\n' "$VPY"
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found on PATH. Fix: apt-get install -y python3 python3-venv (or set SLUICE_PYTHON=/path/to/python3)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' \
  || die "$("$PYTHON" --version 2>&1) is too old (need >= 3.8). Fix: apt-get install -y python3 python3-venv && SLUICE_PYTHON=/usr/bin/python3 $0"

: >"$LOGFILE"
# A venv whose interpreter no longer runs (pyenv version removed, python upgraded)
# cannot be repaired in place: rebuild it.
if [ -e "$VENV" ] && ! "$VPY" -c 'pass' >/dev/null 2>&1; then
  log "existing $VENV is broken (its python does not run); recreating it"
  rm -rf "$VENV"
fi

if [ ! -x "$VPY" ]; then
  log "creating venv $VENV with $(command -v "$PYTHON") ($("$PYTHON" --version 2>&1)) (log: $LOGFILE)"
  if ! "$PYTHON" -m venv "$VENV" >>"$LOGFILE" 2>&1; then
    rm -rf "$VENV"
    tail -n 20 "$LOGFILE" >&2 || true
    die "'$PYTHON -m venv' failed (log: $LOGFILE). Fix: apt-get install -y python3-venv   (if $PYTHON is not /usr/bin/python3, also try: SLUICE_PYTHON=/usr/bin/python3 $0)"
  fi
fi

log "installing ${REQUIREMENTS[*]} (log: $LOGFILE)"
if ! "$VPY" -m pip install --disable-pip-version-check --no-input --only-binary=confluent-kafka,fastavro \
      "${REQUIREMENTS[@]}" >>"$LOGFILE" 2>&1; then
  tail -n 20 "$LOGFILE" >&2 || true
  die "pip install failed (log: $LOGFILE). Fix: check access to PyPI (pip config list; PIP_INDEX_URL), then re-run: $0   (manual: $VPY -m pip install ${REQUIREMENTS[*]})"
fi

if ! "$VPY" -c 'import confluent_kafka, fastavro' >>"$LOGFILE" 2>&1; then
  tail -n 20 "$LOGFILE" >&2 || true
  die "packages installed but 'import confluent_kafka, fastavro' fails (log: $LOGFILE). Fix: rm -rf '$VENV' && $0"
fi
want_stamp >"$STAMP"
log "ready: $("$VPY" -c 'import sys, importlib.metadata as m, confluent_kafka; print("python %d.%d.%d," % sys.version_info[:3], "confluent-kafka", m.version("confluent-kafka") + ", bundled librdkafka", confluent_kafka.libversion()[0] + ", fastavro", m.version("fastavro"))')"
printf '%s\n' "$VPY"
