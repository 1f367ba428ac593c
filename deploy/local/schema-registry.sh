#!/usr/bin/env bash
# Local schema registry (Apicurio Registry, Confluent-compatible API) for development and
# integration tests, on 127.0.0.1 only.
#
#   deploy/local/schema-registry.sh start    start (idempotent), wait until ready
#   deploy/local/schema-registry.sh stop     stop (no-op when stopped)
#   deploy/local/schema-registry.sh status   exit 0 running, 3 not running
#   deploy/local/schema-registry.sh url      print the Confluent API base URL
#   deploy/local/schema-registry.sh logs     print the log file path
#   deploy/local/schema-registry.sh fetch    only fetch and unpack the distribution
#
# Storage is in memory: every start begins empty and schema ids count from 1. The global
# compatibility rule is BACKWARD (a new version must read data written with the previous
# one), as Sluice's schema evolution rules ask.
#
# Environment:
#   SLUICE_REGISTRY_PORT            HTTP port (default 18081); the Confluent API is under
#                                   http://127.0.0.1:PORT/apis/ccompat/v7
#   SLUICE_REGISTRY_MANAGEMENT_PORT Quarkus management port (default HTTP port + 1)
#   SLUICE_REGISTRY_JAVA            java 21+ binary (default: Temurin 25 if installed,
#                                   else `java` on PATH when it is 21+)
#   SLUICE_REGISTRY_HEAP            max heap (default 512m)
#   SLUICE_REGISTRY_START_TIMEOUT   seconds to wait until it answers (default 120)
#   SLUICE_REGISTRY_HOME            state folder (default <repo>/.local/schema-registry)
#   APICURIO_VERSION                override the pinned version below
#
# Each port is its own instance (run/<port>/: pid, registry.log), so a test can start a
# private second instance on another port and stop it without touching the shared one.
# The distribution comes from Maven Central (io.apicurio:apicurio-registry-app:tar.gz:all)
# once, into <home>/<version>/.
set -euo pipefail

APICURIO_VERSION="${APICURIO_VERSION:-3.3.3}"

SLUICE_PROG="schema-registry.sh"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

REG_HOME="${SLUICE_REGISTRY_HOME:-$SLUICE_REPO/.local/schema-registry}"
PORT="${SLUICE_REGISTRY_PORT:-18081}"
[[ "$PORT" =~ ^[0-9]+$ ]] && ((PORT > 0 && PORT < 65535)) || sluice_die "SLUICE_REGISTRY_PORT='$PORT' is not a valid port"
MGMT_PORT="${SLUICE_REGISTRY_MANAGEMENT_PORT:-$((PORT + 1))}"
[[ "$MGMT_PORT" =~ ^[0-9]+$ ]] && ((MGMT_PORT > 0 && MGMT_PORT <= 65535)) || sluice_die "SLUICE_REGISTRY_MANAGEMENT_PORT='$MGMT_PORT' is not a valid port"
DIST="$REG_HOME/$APICURIO_VERSION"
RUN_DIR="$REG_HOME/run/$PORT"
PIDFILE="$RUN_DIR/pid"
LOGFILE="$RUN_DIR/registry.log"
URL="http://127.0.0.1:$PORT/apis/ccompat/v7"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The java to run the registry with: Apicurio 3.3 needs Java 21+.
registry_java() {
    local candidates=() j out ver major
    [[ -n "${SLUICE_REGISTRY_JAVA:-}" ]] && candidates+=("$SLUICE_REGISTRY_JAVA")
    candidates+=(/usr/lib/jvm/temurin-25-jdk-amd64/bin/java /usr/lib/jvm/temurin-21-jdk-amd64/bin/java)
    command -v java >/dev/null 2>&1 && candidates+=("$(command -v java)")
    for j in "${candidates[@]}"; do
        [[ -x "$j" ]] || continue
        out="$("$j" -version 2>&1)" || continue
        ver="$(sed -n 's/.*version "\([^"]*\)".*/\1/p' <<<"$out" | head -n 1)"
        major="${ver%%[.+-]*}"
        if [[ "$major" =~ ^[0-9]+$ ]] && ((major >= 21)); then
            echo "$j"
            return 0
        fi
    done
    sluice_die "Apicurio Registry $APICURIO_VERSION needs Java 21+; none found (looked at: ${candidates[*]}). Fix: install a Java 21+ JDK (e.g. Temurin 25 into /usr/lib/jvm/temurin-25-jdk-amd64) or set SLUICE_REGISTRY_JAVA; with Java 17 only, use APICURIO_VERSION=3.0.9"
}

dist_ready() { [[ -f "$DIST/.fetched" && -f "$DIST/quarkus-run.jar" ]]; }

# Fetch the distribution from Maven Central and unpack it (once; flock against a
# concurrent fetch; a failed fetch leaves no half cache).
ensure_dist() {
    dist_ready && return 0
    sluice_require_mvn
    mkdir -p "$REG_HOME"
    local lockfd
    exec {lockfd}>"$REG_HOME/.fetch.lock"
    flock "$lockfd"
    if dist_ready; then
        exec {lockfd}>&-
        return 0
    fi
    local tmp="$REG_HOME/fetch.tmp.$$" log="$REG_HOME/fetch-$APICURIO_VERSION.log" t0=$SECONDS
    rm -rf "$tmp"
    mkdir -p "$tmp/dist"
    sluice_info "fetching Apicurio Registry $APICURIO_VERSION from Maven Central (one time, ~150 MB; log: $log)..."
    if ! mvn -B dependency:copy -Dartifact="io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all" \
        -DoutputDirectory="$tmp" >"$log" 2>&1; then
        rm -rf "$tmp"
        tail -n 30 "$log" >&2
        sluice_die "Maven could not fetch io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all (log: $log)"
    fi
    tar -xzf "$tmp/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz" -C "$tmp/dist" ||
        { rm -rf "$tmp"; sluice_die "unpacking the Apicurio distribution failed"; }
    [[ -f "$tmp/dist/quarkus-run.jar" ]] || { rm -rf "$tmp"; sluice_die "the distribution has no quarkus-run.jar (see $log)"; }
    rm -rf "$DIST"
    mv "$tmp/dist" "$DIST"
    rm -rf "$tmp"
    echo "apicurio=$APICURIO_VERSION" >"$DIST/.fetched"
    sluice_info "unpacked Apicurio Registry $APICURIO_VERSION into $DIST in $((SECONDS - t0))s"
    exec {lockfd}>&-
}

# PID of this port's instance if it runs (pid file + the process really is it).
running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid cmd
    pid="$(cat "$PIDFILE")"
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmd" == *quarkus-run.jar* && "$cmd" == *"-Dsluice.registry.port=$PORT"* ]] || return 1
    echo "$pid"
}

# The Confluent API answers `GET /subjects` with 200 (bash's /dev/tcp: no curl needed).
ready() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET %s/subjects HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3
        IFS= read -r status <&3 && [[ "$status" == "HTTP/1."?" 200"* ]]' _ "$PORT" "/apis/ccompat/v7" 2>/dev/null
}

cmd_start() {
    if running_pid >/dev/null; then
        echo "schema registry (Apicurio $APICURIO_VERSION) is already running: $URL"
        return 0
    fi
    local java p
    java="$(registry_java)"
    for p in "$PORT" "$MGMT_PORT"; do
        port_open "$p" && sluice_die "port 127.0.0.1:$p is already in use; choose another: SLUICE_REGISTRY_PORT=... (HTTP) / SLUICE_REGISTRY_MANAGEMENT_PORT=..."
    done
    ensure_dist
    mkdir -p "$RUN_DIR"
    rm -f "$PIDFILE"
    # setsid: the registry survives the shell that started it; the child writes its own
    # pid, then execs java, so the pid file is exact. Started straight from this shell
    # (no subshell left waiting on java and holding the caller's stdout open).
    cd "$DIST"
    # shellcheck disable=SC2016 # expanded by the child shell
    QUARKUS_HTTP_PORT="$PORT" QUARKUS_HTTP_HOST=127.0.0.1 \
        QUARKUS_MANAGEMENT_PORT="$MGMT_PORT" QUARKUS_MANAGEMENT_HOST=127.0.0.1 \
        APICURIO_RULES_GLOBAL_COMPATIBILITY=BACKWARD \
        setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
        nohup "$java" "-Xmx${SLUICE_REGISTRY_HEAP:-512m}" -Djava.awt.headless=true \
        "-Dsluice.registry.port=$PORT" -jar quarkus-run.jar \
        >"$LOGFILE" 2>&1 </dev/null &
    local k pid
    for ((k = 0; k < 50; k++)); do
        [[ -s "$PIDFILE" ]] && break
        sleep 0.1
    done
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [[ -n "$pid" ]] || sluice_die "the registry did not start (log: $LOGFILE)"
    local timeout="${SLUICE_REGISTRY_START_TIMEOUT:-120}" deadline=$((SECONDS + ${SLUICE_REGISTRY_START_TIMEOUT:-120}))
    until ready; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$LOGFILE" >&2 || true
            rm -f "$PIDFILE"
            sluice_die "the registry exited during start-up (log: $LOGFILE)"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 30 "$LOGFILE" >&2 || true
            sluice_die "the registry (pid $pid) did not answer $URL/subjects within ${timeout}s (log: $LOGFILE). Fix: $0 stop && $0 start"
        fi
        sleep 0.5
    done
    echo "schema registry (Apicurio $APICURIO_VERSION) started: $URL (pid $pid, log $LOGFILE)"
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PIDFILE"
        echo "schema registry on port $PORT is not running"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local k
    for ((k = 0; k < 300; k++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        sluice_info "the registry (pid $pid) did not stop within 30s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    echo "schema registry on port $PORT stopped"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        if ready; then
            echo "schema registry running: $URL (pid $pid)"
        else
            echo "schema registry starting or not answering: $URL (pid $pid)"
        fi
        return 0
    fi
    echo "schema registry on port $PORT is not running"
    return 3
}

case "${1:-help}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) echo "$URL" ;;
logs) echo "$LOGFILE" ;;
fetch)
    ensure_dist
    echo "$DIST"
    ;;
help | -h | --help) usage ;;
*) sluice_die "unknown command '$1' (usage: deploy/local/schema-registry.sh start|stop|status|url|logs|fetch)" ;;
esac
