#!/usr/bin/env bash
# Private Prometheus instance for local development and integration tests.
#
# Usage: deploy/local/prometheus.sh COMMAND
#
#   start                  install Prometheus from Debian packages if missing, render
#                          the config, check it with promtool, start our own instance
#                          in the background and wait until /-/ready answers.
#                          Idempotent: a second start says "already running", exits 0.
#   stop                   SIGTERM (then SIGKILL after 30s); a no-op when stopped.
#   status                 exit 0 when running, 3 when stopped.
#   url                    print http://127.0.0.1:PORT
#   reload                 re-render + check the config, POST /-/reload (after editing
#                          the template or the rules).
#   targets [--name NAME] HOST:PORT...
#                          write $REPO/.local/prometheus/targets/NAME.json (NAME
#                          defaults to "sluice") listing the Sluice replicas to scrape
#                          (job "sluice", path /metrics). No HOST:PORT = empty list.
#                          Works whether or not Prometheus is running; file_sd picks the
#                          change up within seconds. Use distinct --name values for
#                          tests that run concurrently.
#
# Environment:
#   SLUICE_PROM_PORT       listen port on 127.0.0.1 (default 19090; the Debian
#                          package's own service would use 9090 -- we never use it)
#
# Files (all under the git-ignored $REPO/.local/prometheus/):
#   prometheus.yml         rendered from deploy/prometheus/prometheus.local.yml
#   data/                  TSDB (--storage.tsdb.path), retention 2d
#   targets/*.json         file_sd target files (format documented in the template)
#   prometheus.pid         pid of our instance
#   prometheus.log         server log (stdout+stderr)
#   promtool.log           output of the last `promtool check config`
# Rules: deploy/prometheus/rules/*.yml (checked in).
#
# The Debian package installs an init script / systemd unit for a system-wide
# Prometheus on :9090 with /var/lib/prometheus. In containers policy-rc.d usually
# blocks it from starting; either way this script never talks to or relies on it.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/../.." && pwd))"

PORT="${SLUICE_PROM_PORT:-19090}"
LOCAL_DIR="$REPO/.local"
BASE="$LOCAL_DIR/prometheus"
DATA="$BASE/data"
TARGETS_DIR="$BASE/targets"
CONFIG="$BASE/prometheus.yml"
PIDFILE="$BASE/prometheus.pid"
LOGFILE="$BASE/prometheus.log"
PROMTOOL_LOG="$BASE/promtool.log"
TEMPLATE="$REPO/deploy/prometheus/prometheus.local.yml"
RULES_DIR="$REPO/deploy/prometheus/rules"
URL="http://127.0.0.1:$PORT"

log() { printf '[prometheus.sh] %s\n' "$*" >&2; }
die() { printf '[prometheus.sh] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "$PORT" in
  ''|*[!0-9]*) die "SLUICE_PROM_PORT='$PORT' is not a number. Fix: export SLUICE_PROM_PORT=19090" ;;
esac

# ---------------------------------------------------------------- install
ensure_installed() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then return 0; fi
  [ "$(id -u)" = 0 ] || die "prometheus/promtool not installed and we are not root. Fix: sudo apt-get install -y prometheus"
  command -v apt-get >/dev/null || die "prometheus/promtool not installed and apt-get is unavailable. Fix: put prometheus and promtool (>= 2.x) on PATH"
  mkdir -p "$LOCAL_DIR"
  local apt_log="$LOCAL_DIR/apt-prometheus.log"
  # --no-install-recommends: skip prometheus-node-exporter & friends (37 packages
  # instead of a handful, and no extra daemons on hosts with a working init).
  log "prometheus not found; installing: apt-get install -y --no-install-recommends prometheus (log: $apt_log)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >"$apt_log" 2>&1; then
    tail -n 20 "$apt_log" >&2 || true
    die "apt-get install -y prometheus failed (log: $apt_log). Fix: apt-get update && apt-get install -y prometheus"
  fi
  if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    die "apt-get install -y prometheus succeeded but prometheus/promtool are not on PATH (log: $apt_log). Fix: dpkg -L prometheus | grep bin/"
  fi
  # The package's postinst may have started the system service (port 9090).
  # We do not rely on it; just say so, and how to stop it.
  if (exec 3<>/dev/tcp/127.0.0.1/9090) 2>/dev/null; then
    log "note: something (probably the package's system service) listens on :9090; it is not ours and is left alone. To stop it: service prometheus stop"
  fi
}

ensure_tools() {
  command -v curl >/dev/null || die "curl not found. Fix: apt-get install -y curl"
}

# ---------------------------------------------------------------- state
read_pid() {
  [ -f "$PIDFILE" ] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  case "$pid" in ''|*[!0-9]*) return 1 ;; esac
  printf '%s' "$pid"
}

# Running = pid file points at a live prometheus using OUR data dir (guards
# against pid reuse after a crash/reboot).
running_pid() {
  local pid
  pid="$(read_pid)" || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "--storage.tsdb.path=$DATA" || return 1
  printf '%s' "$pid"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

# ---------------------------------------------------------------- config
sed_escape() { printf '%s' "$1" | sed -e 's/[\\&|]/\\&/g'; }

render_config() {
  [ -f "$TEMPLATE" ] || die "config template $TEMPLATE is missing. Fix: git checkout -- deploy/prometheus/prometheus.local.yml"
  [ -d "$RULES_DIR" ] || die "rules dir $RULES_DIR is missing. Fix: git checkout -- deploy/prometheus/rules"
  mkdir -p "$BASE" "$DATA" "$TARGETS_DIR"
  local tmp="$CONFIG.tmp"
  sed -e "s|@TARGETS_DIR@|$(sed_escape "$TARGETS_DIR")|g" \
      -e "s|@RULES_DIR@|$(sed_escape "$RULES_DIR")|g" \
      "$TEMPLATE" >"$tmp"
  if ! promtool check config "$tmp" >"$PROMTOOL_LOG" 2>&1; then
    cat "$PROMTOOL_LOG" >&2
    die "promtool check config failed for the config rendered from $TEMPLATE (log: $PROMTOOL_LOG, rendered file: $tmp). Fix the template or deploy/prometheus/rules/*.yml, then re-run: $0 start"
  fi
  mv -f "$tmp" "$CONFIG"
}

# ---------------------------------------------------------------- actions
wait_ready() {
  local pid="$1"
  for _ in $(seq 1 120); do
    if curl -fsS -m 2 "$URL/-/ready" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOGFILE" >&2 || true
      rm -f "$PIDFILE"
      die "prometheus exited during startup (log: $LOGFILE). Fix: read the log; if the TSDB is corrupt: rm -rf '$DATA' && $0 start"
    fi
    sleep 0.5
  done
  tail -n 30 "$LOGFILE" >&2 || true
  die "prometheus (pid $pid) not ready at $URL/-/ready after 60s (log: $LOGFILE). Fix: $0 stop && $0 start"
}

cmd_start() {
  ensure_installed
  ensure_tools
  local pid
  if pid="$(running_pid)"; then
    log "already running (pid $pid) at $URL (config: $CONFIG, log: $LOGFILE)"
    wait_ready "$pid"
    return 0
  fi
  rm -f "$PIDFILE"
  if port_in_use; then
    die "127.0.0.1:$PORT is already in use by another process. Fix: SLUICE_PROM_PORT=19091 $0 start, or stop the other process (ss -ltnp 'sport = :$PORT')"
  fi
  render_config
  log "starting prometheus $(prometheus --version 2>&1 | awk 'NR==1{print $3}') at $URL (config: $CONFIG, data: $DATA, log: $LOGFILE)"
  {
    printf '\n==== %s start (port %s) ====\n' "$(date -Is)" "$PORT"
  } >>"$LOGFILE"
  # setsid: own session, so the caller's process group / terminal can't kill it.
  # The inner shell writes its own pid (then execs), which stays correct even if
  # setsid had to fork. 9>&- keeps the lock fd out of the daemon.
  # shellcheck disable=SC2016  # $$ and $1 belong to the inner shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    prometheus \
      --config.file="$CONFIG" \
      --storage.tsdb.path="$DATA" \
      --storage.tsdb.retention.time=2d \
      --web.listen-address="127.0.0.1:$PORT" \
      --web.enable-lifecycle \
    </dev/null >>"$LOGFILE" 2>&1 9>&- &
  for _ in $(seq 1 50); do [ -s "$PIDFILE" ] && break; sleep 0.1; done
  pid="$(read_pid)" || die "prometheus did not write $PIDFILE (log: $LOGFILE). Fix: $0 stop && $0 start"
  wait_ready "$pid"
  log "ready (pid $pid) at $URL; targets dir: $TARGETS_DIR"
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
    if curl -fsS -m 2 "$URL/-/ready" >/dev/null 2>&1; then
      log "running (pid $pid) at $URL, ready (config: $CONFIG, log: $LOGFILE)"
    else
      log "running (pid $pid) at $URL but /-/ready does not answer yet (log: $LOGFILE)"
    fi
    return 0
  fi
  log "stopped (log: $LOGFILE). Fix: $0 start"
  return 3
}

cmd_reload() {
  ensure_tools
  local pid
  pid="$(running_pid)" || die "not running. Fix: $0 start"
  render_config
  curl -fsS -m 10 -X POST "$URL/-/reload" >/dev/null \
    || die "POST $URL/-/reload failed (log: $LOGFILE). Fix: $0 stop && $0 start"
  log "reloaded (pid $pid, config: $CONFIG)"
}

cmd_targets() {
  local name=sluice
  if [ "${1:-}" = "--name" ]; then
    [ -n "${2:-}" ] || die "--name needs a value. Example: $0 targets --name it-test 127.0.0.1:9464"
    name="$2"; shift 2
  fi
  case "$name" in
    *[!A-Za-z0-9._-]*|.*) die "invalid --name '$name' (use [A-Za-z0-9._-], not starting with '.'). Example: $0 targets --name it-test 127.0.0.1:9464" ;;
  esac
  local t json="" sep=""
  for t in "$@"; do
    if [[ ! "$t" =~ ^([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$ ]]; then
      die "invalid target '$t' (want HOST:PORT, e.g. 127.0.0.1:9464). Fix: $0 targets 127.0.0.1:9464 127.0.0.1:9465"
    fi
    json+="$sep\"$t\""; sep=", "
  done
  mkdir -p "$TARGETS_DIR"
  local file="$TARGETS_DIR/$name.json" tmp="$TARGETS_DIR/.$name.json.tmp"
  if [ $# -eq 0 ]; then
    printf '[]\n' >"$tmp"
  else
    printf '[\n  {"targets": [%s], "labels": {"targets_file": "%s"}}\n]\n' "$json" "$name" >"$tmp"
  fi
  mv -f "$tmp" "$file"   # atomic: file_sd never sees a half-written file
  log "wrote $file ($# target(s))"
}

# Serialise start/stop/reload (e.g. parallel test setups).
with_lock() {
  mkdir -p "$BASE"
  if command -v flock >/dev/null; then
    exec 9>"$BASE/.lock"
    flock -w 120 9 || die "timed out waiting for $BASE/.lock (another prometheus.sh still running?)"
  fi
}

CMD="${1:-}"
[ $# -gt 0 ] && shift
case "$CMD" in
  start)   with_lock; cmd_start ;;
  stop)    with_lock; cmd_stop ;;
  status)  cmd_status ;;
  url)     printf '%s\n' "$URL" ;;
  reload)  with_lock; cmd_reload ;;
  targets) cmd_targets "$@" ;;
  -h|--help|help|'') usage ;;
  *) log "unknown command '$CMD'"; usage ;;
esac
