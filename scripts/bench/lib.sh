# shellcheck shell=bash
# Shared helpers of the benchmark scripts (sourced, not executed): logging, clocks, CPU
# and memory readings from /proc, CPU affinity of the local services, sysdb positions,
# and cleanup of Kafka topics and groups.
#
# The sourcing script sets REPO (the repository root) and BENCH_TAG (log prefix) first;
# bench_services_init sets BS, KAFKA_SH, KTOOL, PG_SH, BROKER_PID, PG_DATA.

BENCH_TAG="${BENCH_TAG:-bench}"
CLK_TCK="$(getconf CLK_TCK)"

log() { printf '[%s %s] %s\n' "$BENCH_TAG" "$(date +%T)" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$BENCH_TAG" "$*" >&2; exit 1; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

now() { date +%s.%N; }
# fsub A B -> A - B; fadd A B -> A + B (3 decimals)
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
fadd() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a + b }'; }
# iso8601 (a JSON log timestamp) -> epoch seconds with fraction
iso_epoch() { date -d "$1" +%s.%N; }

# CPU seconds (utime+stime) of one pid, 0 if gone.
pid_cpu() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }
    # fields after the ") " that closes comm: state is $1, utime $12, stime $13
    awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' <<<"$stat"
}
# VmHWM (peak RSS) of one pid in kB, 0 if gone.
pid_hwm_kb() { awk '/^VmHWM:/ { print $2; f = 1 } END { if (!f) print 0 }' "/proc/$1/status" 2>/dev/null || echo 0; }

bench_services_init() {
    KAFKA_SH="$REPO/deploy/local/kafka.sh"
    KTOOL="$REPO/deploy/local/kafka-tool.sh"
    # shellcheck disable=SC2034 # used by the sourcing scripts
    PG_SH="$REPO/deploy/local/postgres.sh"
    BS="$("$KAFKA_SH" bootstrap --brokers 1)"
    local hp
    for hp in ${BS//,/ }; do
        case "${hp%:*}" in
        127.0.0.1 | localhost | '[::1]') ;;
        *) die "bootstrap '$BS' is not loopback; benchmarks run over loopback only" ;;
        esac
    done
    BROKER_PID="$(cat "${SLUICE_KAFKA_HOME:-$REPO/.local/kafka}/run/brokers-1/node-1/pid" 2>/dev/null || true)"
    [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null || BROKER_PID=""
    PG_DATA="$REPO/.local/postgres/data"
}

broker_cpu() { if [[ -n "${BROKER_PID:-}" ]]; then pid_cpu "$BROKER_PID"; else echo 0; fi; }
pg_postmaster() { head -1 "$PG_DATA/postmaster.pid" 2>/dev/null || true; }
# The PostgreSQL server: the postmaster and its children (backends, background workers).
pg_pids() {
    local pm
    pm="$(pg_postmaster)"
    [[ -n "$pm" ]] || return 0
    echo "$pm"
    pgrep -P "$pm" 2>/dev/null || true
}
# CPU seconds of the PostgreSQL server processes alive now (exited backends are not
# counted: take readings while the contender's connections are open).
pg_cpu() {
    local total=0 p
    for p in $(pg_pids); do
        total="$(awk -v a="$total" -v b="$(pid_cpu "$p")" 'BEGIN { printf "%.2f", a + b }')"
    done
    echo "$total"
}

# ------------------------------------------------------------------ CPU affinity ----
# bench_pin_services CPUS: every thread of the broker JVM and of the PostgreSQL server
# (postmaster + children; new backends inherit the postmaster's mask) onto CPUS. The
# masks found the first time are saved; bench_restore_affinity puts them back.
declare -gA BENCH_SAVED_AFFINITY=()
_save_affinity() {
    local pid="$1" mask
    [[ -n "${BENCH_SAVED_AFFINITY[$pid]:-}" ]] && return 0
    mask="$(taskset -p "$pid" 2>/dev/null | awk '{ print $NF }')" || return 0
    [[ -n "$mask" ]] && BENCH_SAVED_AFFINITY[$pid]="$mask"
}
bench_pin_services() {
    local cpus="$1" p
    for p in ${BROKER_PID:-} $(pg_pids); do
        kill -0 "$p" 2>/dev/null || continue
        _save_affinity "$p"
        taskset -a -p -c "$cpus" "$p" >/dev/null 2>&1 || log "WARNING: cannot pin pid $p to CPU $cpus"
    done
}
# Back to the saved masks (the broker and the postmaster), and every current PostgreSQL
# child to the postmaster's.
bench_restore_affinity() {
    local p mask pm
    for p in "${!BENCH_SAVED_AFFINITY[@]}"; do
        mask="${BENCH_SAVED_AFFINITY[$p]}"
        kill -0 "$p" 2>/dev/null && taskset -a -p "$mask" "$p" >/dev/null 2>&1
    done
    pm="$(pg_postmaster)"
    if [[ -n "$pm" && -n "${BENCH_SAVED_AFFINITY[$pm]:-}" ]]; then
        for p in $(pgrep -P "$pm" 2>/dev/null); do
            taskset -a -p "${BENCH_SAVED_AFFINITY[$pm]}" "$p" >/dev/null 2>&1
        done
    fi
}

# ------------------------------------------------------------------ sysdb positions -
# sysdb_position URL TOPIC -> "ROWS SUM": partitions rows of TOPIC and the sum of their
# next_offset, read straight from the sysdb (SQLite read-only / psql), cheap enough to
# poll every 0.1 s. Prints "0 0" when the table does not answer yet.
sysdb_position() {
    local url="$1" topic="$2" out sql
    sql="SELECT count(*), coalesce(sum(next_offset), 0) FROM partitions WHERE topic = '$topic'"
    case "$url" in
    sqlite://*) out="$(sqlite3 -readonly -separator ' ' "${url#sqlite://}" "$sql" 2>/dev/null)" ;;
    postgres://* | postgresql://*) out="$(psql -X -q -A -t -F ' ' "$url" -c "$sql" 2>/dev/null)" ;;
    *) die "sysdb_position: unsupported url $url" ;;
    esac
    [[ "$out" =~ ^[0-9]+\ [0-9]+$ ]] && echo "$out" || echo "0 0"
}

# ------------------------------------------------------------------ Kafka cleanup ---
# Topics may be given as regexes (kafka-topics --delete accepts them).
bench_delete_topics() {
    local t
    for t in "$@"; do
        timeout 60 "$KTOOL" topics --bootstrap-server "$BS" --delete --if-exists --topic "$t" >/dev/null 2>&1 || true
    done
}
bench_delete_groups() {
    (($#)) || return 0
    local args=() g
    for g in "$@"; do args+=(--group "$g"); done
    timeout 60 "$KTOOL" consumer-groups --bootstrap-server "$BS" --delete "${args[@]}" >/dev/null 2>&1 || true
}
