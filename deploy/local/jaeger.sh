#!/usr/bin/env bash
# Private Jaeger (v2 all-in-one) for local development and the trace tests: an OTLP
# collector with in-memory storage and the query API, on the loopback interface only.
#
# Usage: deploy/local/jaeger.sh COMMAND
#
#   start     build Jaeger from the Go module proxy on first use (pinned version, into
#             $REPO/.local/bin/jaeger; needs `go`), render the config, start our own
#             instance in the background and wait until the query API answers.
#             Idempotent: a second start says "already running", exits 0.
#   stop      SIGTERM (then SIGKILL after 30s); a no-op when stopped.
#   status    exit 0 when running, 3 when stopped.
#   url       print the query API base, http://127.0.0.1:QUERY_PORT
#             (traces: $URL/api/traces?service=sluice)
#   otlp      print the OTLP/HTTP endpoint, http://127.0.0.1:OTLP_HTTP_PORT (what
#             `telemetry.otlp_endpoint` / SLUICE_TELEMETRY__OTLP_ENDPOINT takes)
#   install   only build the binary (prints how long it took).
#
# Environment:
#   SLUICE_JAEGER_OTLP_HTTP_PORT   OTLP/HTTP receiver (default 4318)
#   SLUICE_JAEGER_OTLP_GRPC_PORT   OTLP/gRPC receiver (default 4317)
#   SLUICE_JAEGER_QUERY_PORT       query API and UI (default 16686)
#   SLUICE_JAEGER_QUERY_GRPC_PORT  query gRPC API (default 16685)
#
# Files (all under the git-ignored $REPO/.local/):
#   bin/jaeger, bin/jaeger.version   the binary and the version it was built from
#   jaeger/config.yaml               rendered config (memory storage, loopback ports)
#   jaeger/jaeger.pid, jaeger.log    pid and server log
#   jaeger/build.log                 output of the last build
#   jaeger/gomod, jaeger/gocache     Go module and build caches of the build
#
# The build: `go install github.com/jaegertracing/jaeger/cmd/jaeger@VERSION` is refused
# by Go (the module's go.mod has a replace directive), so the script downloads the module
# from the proxy (`go mod download`) and builds ./cmd/jaeger inside a copy of it. Traces
# live in memory only: a restart forgets them.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/../.." && pwd))"

JAEGER_VERSION="v1.76.0"
JAEGER_MODULE="github.com/jaegertracing/jaeger"
OTLP_HTTP_PORT="${SLUICE_JAEGER_OTLP_HTTP_PORT:-4318}"
OTLP_GRPC_PORT="${SLUICE_JAEGER_OTLP_GRPC_PORT:-4317}"
QUERY_PORT="${SLUICE_JAEGER_QUERY_PORT:-16686}"
QUERY_GRPC_PORT="${SLUICE_JAEGER_QUERY_GRPC_PORT:-16685}"
LOCAL_DIR="$REPO/.local"
BIN="$LOCAL_DIR/bin/jaeger"
STAMP="$LOCAL_DIR/bin/jaeger.version"
BASE="$LOCAL_DIR/jaeger"
CONFIG="$BASE/config.yaml"
PIDFILE="$BASE/jaeger.pid"
LOGFILE="$BASE/jaeger.log"
BUILD_LOG="$BASE/build.log"
URL="http://127.0.0.1:$QUERY_PORT"
OTLP_URL="http://127.0.0.1:$OTLP_HTTP_PORT"

log() { printf '[jaeger.sh] %s\n' "$*" >&2; }
die() { printf '[jaeger.sh] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

for p in "$OTLP_HTTP_PORT" "$OTLP_GRPC_PORT" "$QUERY_PORT" "$QUERY_GRPC_PORT"; do
  case "$p" in
    ''|*[!0-9]*) die "port '$p' is not a number. Fix: export SLUICE_JAEGER_*_PORT to a number" ;;
  esac
done

# ---------------------------------------------------------------- install
installed() { [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null || true)" = "$JAEGER_VERSION" ]; }

cmd_install() {
  if installed; then return 0; fi
  command -v go >/dev/null || die "go not found (needed once, to build Jaeger $JAEGER_VERSION). Fix: install Go >= 1.24 and re-run: $0 start"
  mkdir -p "$LOCAL_DIR/bin" "$BASE"
  export GOMODCACHE="$BASE/gomod" GOCACHE="$BASE/gocache" GOFLAGS="${GOFLAGS:-} -mod=readonly"
  local started src dir
  started=$(date +%s)
  log "building Jaeger $JAEGER_VERSION from the Go module proxy (several minutes the first time; log: $BUILD_LOG)"
  : >"$BUILD_LOG"
  dir="$(go mod download -json "$JAEGER_MODULE@$JAEGER_VERSION" 2>>"$BUILD_LOG" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    tail -n 20 "$BUILD_LOG" >&2
    die "go mod download $JAEGER_MODULE@$JAEGER_VERSION failed (log: $BUILD_LOG). Fix: check GOPROXY / network, then: $0 install"
  fi
  src="$BASE/src-$JAEGER_VERSION"
  rm -rf "$src"
  cp -r "$dir" "$src"
  chmod -R u+w "$src"
  if ! (cd "$src" && go build -trimpath -o "$BIN.tmp" ./cmd/jaeger) >>"$BUILD_LOG" 2>&1; then
    tail -n 30 "$BUILD_LOG" >&2
    die "go build of Jaeger $JAEGER_VERSION failed (log: $BUILD_LOG). If it needs a newer Go: GOTOOLCHAIN=go1.27.3 $0 install"
  fi
  mv -f "$BIN.tmp" "$BIN"
  printf '%s\n' "$JAEGER_VERSION" >"$STAMP"
  log "built $BIN ($JAEGER_VERSION) in $(( $(date +%s) - started ))s"
}

# ---------------------------------------------------------------- state
read_pid() {
  [ -f "$PIDFILE" ] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  case "$pid" in ''|*[!0-9]*) return 1 ;; esac
  printf '%s' "$pid"
}

# Running = pid file points at a live jaeger using OUR config (guards against pid reuse).
running_pid() {
  local pid
  pid="$(read_pid)" || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "--config=$CONFIG" || return 1
  printf '%s' "$pid"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ready() { curl -fsS -m 2 "$URL/api/services" >/dev/null 2>&1; }

# ---------------------------------------------------------------- config
render_config() {
  mkdir -p "$BASE"
  cat >"$CONFIG.tmp" <<EOF
# Rendered by deploy/local/jaeger.sh: OTLP receivers, memory storage, query API; loopback only.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:$QUERY_PORT
    grpc:
      endpoint: 127.0.0.1:$QUERY_GRPC_PORT
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$OTLP_GRPC_PORT
      http:
        endpoint: 127.0.0.1:$OTLP_HTTP_PORT

processors:
  batch:
    timeout: 200ms

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF
  mv -f "$CONFIG.tmp" "$CONFIG"
}

# ---------------------------------------------------------------- actions
wait_ready() {
  local pid="$1"
  for _ in $(seq 1 120); do
    if ready; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOGFILE" >&2 || true
      rm -f "$PIDFILE"
      die "jaeger exited during startup (log: $LOGFILE). Fix: read the log (a port in use?), then $0 start"
    fi
    sleep 0.5
  done
  tail -n 30 "$LOGFILE" >&2 || true
  die "jaeger (pid $pid) not ready at $URL/api/services after 60s (log: $LOGFILE). Fix: $0 stop && $0 start"
}

cmd_start() {
  command -v curl >/dev/null || die "curl not found. Fix: apt-get install -y curl"
  cmd_install
  local pid
  if pid="$(running_pid)"; then
    log "already running (pid $pid): query $URL, OTLP/HTTP $OTLP_URL (log: $LOGFILE)"
    wait_ready "$pid"
    return 0
  fi
  rm -f "$PIDFILE"
  for p in "$OTLP_HTTP_PORT" "$OTLP_GRPC_PORT" "$QUERY_PORT" "$QUERY_GRPC_PORT"; do
    if port_in_use "$p"; then
      die "127.0.0.1:$p is already in use by another process. Fix: choose other ports (SLUICE_JAEGER_OTLP_HTTP_PORT, _OTLP_GRPC_PORT, _QUERY_PORT, _QUERY_GRPC_PORT) or stop the other process (ss -ltnp 'sport = :$p')"
    fi
  done
  render_config
  log "starting jaeger $JAEGER_VERSION: query $URL, OTLP/HTTP $OTLP_URL, OTLP/gRPC 127.0.0.1:$OTLP_GRPC_PORT (config: $CONFIG, log: $LOGFILE)"
  printf '\n==== %s start ====\n' "$(date -Is)" >>"$LOGFILE"
  # shellcheck disable=SC2016  # $$ and $1 belong to the inner shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    "$BIN" --config="$CONFIG" \
    </dev/null >>"$LOGFILE" 2>&1 9>&- &
  for _ in $(seq 1 50); do [ -s "$PIDFILE" ] && break; sleep 0.1; done
  pid="$(read_pid)" || die "jaeger did not write $PIDFILE (log: $LOGFILE). Fix: $0 stop && $0 start"
  wait_ready "$pid"
  log "ready (pid $pid): traces at $URL/api/traces?service=sluice"
}

cmd_stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PIDFILE"
    log "not running"
    return 0
  fi
  log "stopping pid $pid (log: $LOGFILE)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; log "stopped"; return 0; }
    sleep 0.5
  done
  log "pid $pid ignored SIGTERM for 30s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  sleep 0.5
  rm -f "$PIDFILE"
  log "stopped (killed)"
}

cmd_status() {
  local pid
  if pid="$(running_pid)"; then
    if ready; then
      log "running (pid $pid): query $URL, OTLP/HTTP $OTLP_URL, ready (log: $LOGFILE)"
    else
      log "running (pid $pid) but $URL/api/services does not answer yet (log: $LOGFILE)"
    fi
    return 0
  fi
  log "stopped (log: $LOGFILE). Fix: $0 start"
  return 3
}

# Serialise start/stop/install (e.g. parallel test setups).
with_lock() {
  mkdir -p "$BASE"
  if command -v flock >/dev/null; then
    exec 9>"$BASE/.lock"
    flock -w 1200 9 || die "timed out waiting for $BASE/.lock (another jaeger.sh still running?)"
  fi
}

CMD="${1:-}"
[ $# -gt 0 ] && shift
case "$CMD" in
  start)   with_lock; cmd_start ;;
  stop)    with_lock; cmd_stop ;;
  status)  cmd_status ;;
  url)     printf '%s\n' "$URL" ;;
  otlp)    printf '%s\n' "$OTLP_URL" ;;
  install) with_lock; cmd_install ;;
  -h|--help|help|'') usage ;;
  *) log "unknown command '$CMD'"; usage ;;
esac
