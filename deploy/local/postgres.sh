#!/usr/bin/env bash
# Private PostgreSQL cluster for local development and integration tests.
#
# Usage: deploy/local/postgres.sh start|stop|status|url [DBNAME]
#
#   start   install PostgreSQL from Debian packages if missing, initdb a private
#           cluster on first use, start it (pg_ctl -w), create role `sluice`
#           (password `sluice`, LOGIN CREATEDB) and databases `sluice` and
#           `sluice_test` owned by it. TCP connections must give the password
#           (scram-sha-256); the unix socket trusts local OS users (the script's
#           own admin connection). Idempotent: a second start says "already
#           running", brings pg_hba.conf and the settings up to date (reload, no
#           restart: clusters made by older versions of this script, which
#           trusted TCP, are upgraded) and exits 0.
#   stop    pg_ctl -m fast stop; a no-op when not running.
#   status  exit 0 when running, 3 when stopped (same codes as pg_ctl status).
#   url     print postgres://sluice:sluice@127.0.0.1:PORT/sluice_test
#           (or .../DBNAME when given, e.g. `url sluice`).
#
# Environment:
#   SLUICE_PG_PORT       TCP port (default 55432, never clashes with a system cluster on 5432)
#   SLUICE_PG_FSYNC      on|off (default on; `off` makes tests faster, data unsafe on crash)
#   SLUICE_PG_SHARED_BUFFERS  PostgreSQL's buffer cache (default 1GB; the server default,
#                        128MB, is smaller than a W1 benchmark's records table, and every
#                        upsert then reads and writes its page through the kernel: see
#                        docs/operations.md, "PostgreSQL server settings"). Needs a restart:
#                        a start on a running server says so when it differs.
#   SLUICE_PG_DIR        base directory of the cluster (absolute; default $REPO/.local/postgres):
#                        a second, independent cluster, e.g. for a test that stops its server
#                        (with its own SLUICE_PG_PORT).
#   SLUICE_PG_HOST_AUTH  pg_hba method for TCP connections (default scram-sha-256;
#                        `trust` accepts any password) -- applied on every start.
#
# Layout and why it works as root:
#   PostgreSQL refuses to run as root, so
#   initdb/pg_ctl/psql run as the `postgres` OS user via `runuser -u postgres --`.
#   We do NOT use the Debian default cluster (pg_ctlcluster ... main); this cluster
#   is completely independent of it.
#   Preferred base dir: $REPO/.local/postgres (git-ignored), owned by postgres:
#       data/            PGDATA (0700, postgres)
#       run/             unix socket directory
#       log/postgres.log server log (pg_ctl -l)
#   That needs the postgres user to traverse every parent directory of $REPO.
#   If it cannot (e.g. the repo lives under /root, mode 0700), we fall back to
#   /var/tmp/sluice-pg-<sha1(REPO) first 12 hex>/ and leave a symlink
#   $REPO/.local/postgres -> that dir so the files are still easy to find.
#   (/var/tmp rather than /tmp: it survives reboots, so the data persists.)
#   The unix socket path must stay under ~107 bytes; if run/ would be too long
#   the socket goes to the /var/tmp fallback dir instead.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || (cd "$SCRIPT_DIR/../.." && pwd))"

PORT="${SLUICE_PG_PORT:-55432}"
FSYNC="${SLUICE_PG_FSYNC:-on}"
SHARED_BUFFERS="${SLUICE_PG_SHARED_BUFFERS:-1GB}"
HOST_AUTH="${SLUICE_PG_HOST_AUTH:-scram-sha-256}"
PG_USER=sluice
PG_PASSWORD=sluice
DATABASES=(sluice sluice_test)

if [ -n "${SLUICE_PG_DIR:-}" ]; then
  case "$SLUICE_PG_DIR" in
    /*) ;;
    *) printf '[postgres.sh] ERROR: SLUICE_PG_DIR=%s must be an absolute path\n' "$SLUICE_PG_DIR" >&2; exit 1 ;;
  esac
  LINK_BASE="${SLUICE_PG_DIR%/}"
  LOCAL_DIR="$(dirname "$LINK_BASE")"
  REPO_HASH="$(printf '%s' "$LINK_BASE" | sha1sum | cut -c1-12)"
else
  LOCAL_DIR="$REPO/.local"
  LINK_BASE="$LOCAL_DIR/postgres"
  REPO_HASH="$(printf '%s' "$REPO" | sha1sum | cut -c1-12)"
fi
FALLBACK_BASE="/var/tmp/sluice-pg-$REPO_HASH"

log() { printf '[postgres.sh] %s\n' "$*" >&2; }
die() { printf '[postgres.sh] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "$PORT" in
  ''|*[!0-9]*) die "SLUICE_PG_PORT='$PORT' is not a number. Fix: export SLUICE_PG_PORT=55432" ;;
esac
case "$FSYNC" in
  on|off) ;;
  *) die "SLUICE_PG_FSYNC='$FSYNC' must be on or off. Fix: export SLUICE_PG_FSYNC=on" ;;
esac
[[ "$SHARED_BUFFERS" =~ ^[0-9]+(kB|MB|GB)?$ ]] ||
  die "SLUICE_PG_SHARED_BUFFERS='$SHARED_BUFFERS' is not a size like 1GB or 256MB. Fix: export SLUICE_PG_SHARED_BUFFERS=1GB"
case "$HOST_AUTH" in
  scram-sha-256|md5|password|trust|reject) ;;
  *) die "SLUICE_PG_HOST_AUTH='$HOST_AUTH' is not a pg_hba method this script supports (scram-sha-256, md5, password, trust, reject). Fix: unset SLUICE_PG_HOST_AUTH" ;;
esac

url() {
  local db="${1:-sluice_test}"
  printf 'postgres://%s:%s@127.0.0.1:%s/%s\n' "$PG_USER" "$PG_PASSWORD" "$PORT" "$db"
}

# ---------------------------------------------------------------- binaries
find_bindir() {
  # Highest installed major version (sort -V also copes with old "9.6").
  local p
  p="$(printf '%s\n' /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n1)"
  if [ -x "$p" ]; then printf '%s' "$(dirname "$p")"; fi
}

ensure_installed() {
  BINDIR="$(find_bindir)"
  if [ -n "$BINDIR" ]; then return 0; fi
  [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres) and we are not root. Fix: sudo apt-get install -y postgresql"
  command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is unavailable. Fix: install PostgreSQL server binaries so /usr/lib/postgresql/<ver>/bin/postgres exists"
  mkdir -p "$LOCAL_DIR"
  local apt_log="$LOCAL_DIR/apt-postgresql.log"
  log "PostgreSQL not found; installing: apt-get install -y postgresql (log: $apt_log)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >"$apt_log" 2>&1; then
    tail -n 20 "$apt_log" >&2 || true
    die "apt-get install -y postgresql failed (log: $apt_log). Fix: apt-get update && apt-get install -y postgresql"
  fi
  BINDIR="$(find_bindir)"
  [ -n "$BINDIR" ] || die "apt-get install -y postgresql succeeded but /usr/lib/postgresql/*/bin/postgres is still missing (log: $apt_log). Fix: apt-get install -y postgresql-15"
}

ensure_prereqs() {
  command -v runuser >/dev/null || die "runuser not found. Fix: apt-get install -y util-linux"
  id postgres >/dev/null 2>&1 || die "OS user 'postgres' does not exist. Fix: apt-get install --reinstall -y postgresql-common"
  if [ "$(id -u)" != 0 ]; then
    die "this script must run as root (it switches to the postgres user with runuser). Fix: sudo $0 ${CMD:-start}"
  fi
}

# cd / first: postgres cannot always enter the caller's cwd (noisy warnings)
as_pg() { (cd / && runuser -u postgres -- "$@"); }

# ---------------------------------------------------------------- layout
resolve_base() {
  # Sets BASE, DATA, RUN, LOGDIR, LOGFILE without creating anything.
  if [ -L "$LINK_BASE" ]; then
    BASE="$(readlink -f "$LINK_BASE")"
  else
    BASE="$LINK_BASE"
  fi
  DATA="$BASE/data"
  LOGDIR="$BASE/log"
  LOGFILE="$LOGDIR/postgres.log"
  RUN="$BASE/run"
  # unix socket path limit (sun_path is 108 bytes incl. NUL)
  if [ $(( ${#RUN} + ${#PORT} + 10 )) -gt 100 ]; then
    RUN="$FALLBACK_BASE/run"
  fi
}

prepare_base() {
  mkdir -p "$LOCAL_DIR"
  if [ ! -e "$LINK_BASE" ]; then
    mkdir -p "$LINK_BASE"
    chmod 0755 "$LINK_BASE"
    chown postgres:postgres "$LINK_BASE"
    if ! as_pg test -w "$LINK_BASE"; then
      log "user postgres cannot reach $LINK_BASE (a parent directory is not traversable); using $FALLBACK_BASE instead"
      rmdir "$LINK_BASE"
      mkdir -p "$FALLBACK_BASE"
      chmod 0755 "$FALLBACK_BASE"
      chown postgres:postgres "$FALLBACK_BASE"
      ln -s "$FALLBACK_BASE" "$LINK_BASE"
    fi
  fi
  resolve_base
  as_pg test -w "$BASE" || die "user postgres cannot write $BASE. Fix: rm -rf '$LINK_BASE' (and re-run: $0 start), or chown -R postgres:postgres '$BASE'"
  local d
  for d in "$LOGDIR" "$RUN"; do
    if [ ! -d "$d" ]; then
      mkdir -p "$d"
      chown postgres:postgres "$d"
    fi
    as_pg test -w "$d" || die "user postgres cannot write $d. Fix: chown -R postgres:postgres '$d'"
  done
}

# ---------------------------------------------------------------- state
is_running() {
  # pg_ctl status: 0 running, 3 not running, 4 no/invalid data dir
  [ -n "${BINDIR:-}" ] || return 1
  [ -f "$DATA/PG_VERSION" ] || return 1
  as_pg "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

port_in_use() {
  # true if something accepts TCP connections on 127.0.0.1:$PORT
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

psql_admin() {
  as_pg "$BINDIR/psql" -X -q -h "$RUN" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 "$@"
}

# ---------------------------------------------------------------- actions
init_cluster() {
  if [ -f "$DATA/PG_VERSION" ]; then
    local have want
    have="$(cat "$DATA/PG_VERSION")"
    want="$(basename "$(dirname "$BINDIR")")"
    [ "$have" = "$want" ] || die "$DATA was created by PostgreSQL $have but the installed server is $want. Fix: $0 stop; rm -rf '$DATA'; $0 start   (this deletes the local test data)"
    return 0
  fi
  if [ -d "$DATA" ] && [ -n "$(ls -A "$DATA" 2>/dev/null)" ]; then
    die "$DATA exists, is not empty, but has no PG_VERSION (a failed initdb?). Fix: rm -rf '$DATA' && $0 start"
  fi
  local initdb_log="$LOGDIR/initdb.log"
  log "initialising new cluster in $DATA (log: $initdb_log)"
  if ! as_pg "$BINDIR/initdb" -D "$DATA" -U postgres --encoding=UTF8 --locale=C \
        --auth-local=trust --auth-host="$HOST_AUTH" >"$initdb_log" 2>&1; then
    tail -n 20 "$initdb_log" >&2 || true
    die "initdb failed (log: $initdb_log). Fix: rm -rf '$DATA' && $0 start"
  fi
  # Our settings live in sluice.conf, regenerated on every start (so changing
  # SLUICE_PG_PORT / SLUICE_PG_FSYNC takes effect on the next start).
  printf "\n# Sluice local settings (deploy/local/postgres.sh)\ninclude_if_exists = 'sluice.conf'\n" \
    | as_pg tee -a "$DATA/postgresql.conf" >/dev/null
}

write_conf() {
  as_pg tee "$DATA/sluice.conf" >/dev/null <<EOF
# Generated by deploy/local/postgres.sh on every start -- do not edit.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$RUN'
fsync = $FSYNC
shared_buffers = '$SHARED_BUFFERS'
max_connections = 200
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
password_encryption = 'scram-sha-256'
EOF
}

# pg_hba.conf, rewritten on every start: the unix socket trusts local OS users (the
# admin connection of this script runs as the postgres user), TCP uses $HOST_AUTH.
# Prints "changed" when the file was different (a running server must reload).
write_hba() {
  local want
  want="$(cat <<EOF
# Generated by deploy/local/postgres.sh on every start -- do not edit.
# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     trust
host    all             all             127.0.0.1/32            $HOST_AUTH
host    all             all             ::1/128                 $HOST_AUTH
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            $HOST_AUTH
host    replication     all             ::1/128                 $HOST_AUTH
EOF
)"
  if [ "$(cat "$DATA/pg_hba.conf" 2>/dev/null)" != "$want" ]; then
    printf '%s\n' "$want" | as_pg tee "$DATA/pg_hba.conf" >/dev/null
    echo changed
  fi
}

# Make a running server read pg_hba.conf and sluice.conf again, and check the rules.
reload_conf() {
  local bad
  bad="$(psql_admin -At -c "SELECT pg_reload_conf()" -c "SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL" | tail -n1)"
  [ "$bad" = 0 ] || die "pg_hba.conf has errors after reload ($bad). Fix: read $DATA/pg_hba.conf and the server log $LOGFILE"
}

provision() {
  # role + databases, idempotent
  # The password is hashed with the session's password_encryption: scram, also on a
  # cluster whose stored hash is md5.
  psql_admin <<SQL
SET password_encryption = 'scram-sha-256';
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
  ELSE
    ALTER ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
  END IF;
END
\$\$;
SQL
  local db
  for db in "${DATABASES[@]}"; do
    psql_admin <<SQL
SELECT format('CREATE DATABASE %I OWNER %I', '$db', '$PG_USER')
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$db')
\gexec
ALTER DATABASE $db OWNER TO $PG_USER;
SQL
  done
}

cmd_start() {
  ensure_prereqs
  ensure_installed
  resolve_base
  if is_running; then
    local running_port
    running_port="$(sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true)"
    if [ -n "$running_port" ] && [ "$running_port" != "$PORT" ]; then
      die "already running on port $running_port, but SLUICE_PG_PORT=$PORT. Fix: $0 stop && SLUICE_PG_PORT=$PORT $0 start  (or unset SLUICE_PG_PORT / use $running_port)"
    fi
    log "already running (data: $DATA, log: $LOGFILE)"
    write_conf
    if [ -n "$(write_hba)" ]; then
      log "pg_hba.conf updated (TCP: $HOST_AUTH); reloading"
    fi
    reload_conf
    local pending
    pending="$(psql_admin -At -c "SELECT string_agg(name, ', ') FROM pg_settings WHERE pending_restart")"
    if [ -n "$pending" ]; then
      log "the running server applies these settings only after a restart: $pending. Fix: $0 stop && SLUICE_PG_SHARED_BUFFERS=$SHARED_BUFFERS $0 start"
    fi
    provision
    log "url: $(url)"
    return 0
  fi
  prepare_base
  if port_in_use; then
    die "127.0.0.1:$PORT is already in use by another process (not our cluster in $DATA). Fix: pick another port, e.g. SLUICE_PG_PORT=55433 $0 start, or stop the other process (ss -ltnp 'sport = :$PORT')"
  fi
  init_cluster
  write_conf
  write_hba >/dev/null
  log "starting PostgreSQL ($BINDIR) on 127.0.0.1:$PORT, fsync=$FSYNC, shared_buffers=$SHARED_BUFFERS (log: $LOGFILE)"
  # 9>&- : do not leak the lock fd into the server (it would hold the lock forever)
  if ! as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t 60 start >/dev/null 9>&-; then
    tail -n 30 "$LOGFILE" >&2 || true
    die "pg_ctl start failed (log: $LOGFILE). Fix: read the log; if the data dir is corrupt: $0 stop; rm -rf '$DATA'; $0 start"
  fi
  provision
  log "running (data: $DATA, socket dir: $RUN, log: $LOGFILE)"
  log "url: $(url)"
}

cmd_stop() {
  ensure_prereqs
  BINDIR="$(find_bindir)"
  resolve_base
  if ! is_running; then
    log "not running (data: $DATA)"
    return 0
  fi
  log "stopping (pg_ctl -m fast stop; log: $LOGFILE)"
  if ! as_pg "$BINDIR/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null; then
    tail -n 20 "$LOGFILE" >&2 || true
    die "pg_ctl stop failed (log: $LOGFILE). Fix: runuser -u postgres -- $BINDIR/pg_ctl -D '$DATA' -m immediate stop"
  fi
  log "stopped"
}

cmd_status() {
  ensure_prereqs
  BINDIR="$(find_bindir)"
  resolve_base
  if [ -z "$BINDIR" ]; then
    log "not installed (no /usr/lib/postgresql/*/bin/postgres). Fix: $0 start  (installs via apt-get install -y postgresql)"
    return 3
  fi
  if is_running; then
    log "running: $(url)  (server $BINDIR, data $DATA, log $LOGFILE)"
    return 0
  fi
  log "stopped (data $DATA, log $LOGFILE). Fix: $0 start"
  return 3
}

# Serialise concurrent invocations (e.g. parallel test setups).
with_lock() {
  mkdir -p "$LOCAL_DIR"
  if command -v flock >/dev/null; then
    exec 9>"$LINK_BASE.lock"
    flock -w 120 9 || die "timed out waiting for $LOCAL_DIR/postgres.lock (another postgres.sh still running?)"
  fi
}

CMD="${1:-}"
case "$CMD" in
  start)  with_lock; cmd_start ;;
  stop)   with_lock; cmd_stop ;;
  status) cmd_status ;;
  url)    url "${2:-}" ;;
  -h|--help|help|'') usage ;;
  *) log "unknown command '$CMD'"; usage ;;
esac
