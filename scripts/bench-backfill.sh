#!/usr/bin/env bash
# Backfill benchmark (issue "functions", item 6), in ONE run over loopback, for SQLite and
# then PostgreSQL:
#
#   1. builds the release binary; checks that the local Kafka and PostgreSQL are up
#      (starts nothing: it prints the start command and fails);
#   2. produces N records into ONE collection `big-0` (`sluice workload --collections 1
#      --ids-per-collection N`, default operation mix, so the live count ends below N:
#      the backfill covers `backfill_total` records, reported) to a fresh topic prefix
#      `bench-<random>` shared by both backends;
#   3. per backend: a replica with `--roles processor` materializes it (fresh sysdb,
#      fresh group; time to lag 0 is reported too); the sysdb is then copied twice per
#      repeat (SQLite: online backup API; PostgreSQL: CREATE DATABASE ... TEMPLATE) for
#      the live runs (a) and (b) below;
#   4. backfill rate, per backend: a replica with all roles runs on the original sysdb;
#      `sluice functions attach big-0 --function record_counter` (then `statistics`,
#      unless --no-statistics); seconds = attach start -> the replica's `backfill
#      finished` log line (cross-checked by polling `functions list` for `ready`);
#      rate = backfill_total / seconds. The worker's own elapsed time (backfill started
#      -> finished) is reported beside it. With --no-statistics the sysdb is then copied
#      once per repeat for the live run (r) below (record_counter attached and ready);
#   5. live throughput without and with a backfill: on copy (b), `record_counter` is
#      attached while no replica runs (its marker lands right after big-0's records);
#      then M live records are produced once (M*(P-1)/P into 64 collections `live-*`,
#      M/P into big-0 itself: updates, upserts, deletes of its ids); then per backend
#        (a) a replica (all roles, fresh group) on copy (a): no function -> no backfill;
#        (r) (with --no-statistics) a replica (all roles, fresh group) on copy (r): the
#            function is ready, so live batches of big-0 compute its outputs and nothing
#            is backfilled;
#        (b) a replica (all roles, fresh group) on copy (b): it reads the marker first,
#            so the backfill of big-0 starts right away and runs while the backlog drains;
#      (a), (r), (b) run in turn, --repeats times (each run on its own copy);
#      each timed from spawn until every partition's sysdb position reaches its high
#      watermark, read from the replica's own /metrics every 50 ms (one poller process;
#      `offsets show` confirms it after). `steady` rates exclude the time to the first
#      partition assignment. Every poll is kept in the JSON (`samples`: per-partition
#      sysdb positions), and the time each partition caught up is reported, the big-0
#      partition apart. For (b) the function's status at caught-up, the fraction of the
#      drain during which the backfill ran (worker log times) and the live rate between
#      the polls taken while the worker ran are reported, and the drop: that rate against
#      the rate at which (a) applied the same log records (interpolated from its
#      samples; the rate changes along a drain, so a whole-run average would compare
#      unlike stretches), and the same against (r): what the backfill costs beyond the
#      function's own live cost; then it waits for `ready`. Over repeats, the drops are
#      reported per repeat and as their median (the summary's figures), with a
#      distribution-free 95% interval of the median from 6 repeats on;
#   6. prints a table per backend with the goals (backfill >= 300k records/s on SQLite, the
#      worker's own rate: attach -> finished adds ~0.5 s of CLI start and marker trip;
#      live throughput drop <= 10%) and writes JSON to target/bench/backfill-<date>.json
#      (replica logs beside it as backfill-<date>-<backend>-<phase>.log).
#
# Usage: scripts/bench-backfill.sh [--records N] [--live-records M] [--partitions P]
#            [--dim D] [--seed S] [--config FILE | --scan-interval-ms MS]
#            [--no-statistics] [--wasm FILE [--wasm-params JSON]] [--backends LIST] [--repeats K]
#            [--pin] [--phase-timeout SECONDS]
#
#   defaults: 1,000,000 records, M = N/5, 8 partitions, 384 dims, seed 42, 1200 s per
#   phase; sluice's default config ([backfill] chunk_size 1000, concurrency 2, pause_ms 0)
#   except [backfill] scan_interval_ms = 250 (sluice: 5000), see below.
#   --config FILE         a sluice TOML file ([backfill], [processor]) used by every
#                         replica, verbatim (no scan_interval_ms override).
#   --scan-interval-ms MS the override without --config; 0 = sluice's default.
#   --wasm FILE           after the built-ins, attach this WebAssembly component too (step 4
#                         only: its backfill rate, row function "wasm"), with --wasm-params
#                         (default {}), e.g. target/functions/project_keys.wasm with
#                         '{"keep": ["genre"]}' (scripts/build-functions.sh builds it).
#   --repeats K           the live runs (a), (r), (b) K times each, interleaved (default 1):
#                         one run of each differs from the next by more than the 10% goal
#   --pin                 each replica on CPU 1; the broker, this script and what it starts
#                         (pollers, CLI, producers) on CPU 0; affinities restored at exit
#   --backends LIST       sqlite,postgres (default) or one of them; PostgreSQL need not
#                         run when it is left out (scripts/bench-suite.sh runs sqlite).
#   Why the override: the processor produces a backfill task *before* the batch that
#   accepts the marker commits, so a worker that consumes the task at once can still see
#   the function `awaiting_marker` and skip it; the backfill then starts at the next
#   sysdb scan, up to scan_interval_ms later (the `pickup s` column shows it). With 5 s the
#   backfill would start after most of a live backlog has drained.
# Everything created (topics, consumer groups, PostgreSQL databases, temp files) is
# removed on exit, also on failure or Ctrl-C.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

RECORDS=1000000
LIVE=""
PARTITIONS=8
DIM=384
SEED=42
CONFIG=""
SCAN_MS=250
SCAN_SET=0
STATISTICS=1
WASM=""
WASM_PARAMS='{}'
REPEATS=1
PIN=0
PHASE_TIMEOUT=1200
POLL_S=0.5
FN_POLL_S=0.2
LIVE_POLL_S=0.05
LIVE_COLLECTIONS=64
LIVE_IDS=1000
BIG="big-0"
BACKENDS="sqlite,postgres"

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
while (($#)); do
    case "$1" in
    --records) RECORDS="${2:?}"; shift 2 ;;
    --live-records) LIVE="${2:?}"; shift 2 ;;
    --partitions) PARTITIONS="${2:?}"; shift 2 ;;
    --dim) DIM="${2:?}"; shift 2 ;;
    --seed) SEED="${2:?}"; shift 2 ;;
    --config) CONFIG="$(realpath "${2:?}")"; shift 2 ;;
    --scan-interval-ms) SCAN_MS="${2:?}"; SCAN_SET=1; shift 2 ;;
    --no-statistics) STATISTICS=0; shift ;;
    --wasm) WASM="$(realpath "${2:?}")"; shift 2 ;;
    --wasm-params) WASM_PARAMS="${2:?}"; shift 2 ;;
    --repeats) REPEATS="${2:?}"; shift 2 ;;
    --pin) PIN=1; shift ;;
    --backends) BACKENDS="${2:?}"; shift 2 ;;
    --phase-timeout) PHASE_TIMEOUT="${2:?}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n "$LIVE" ]] || LIVE=$((RECORDS / 5))
for v in RECORDS LIVE PARTITIONS DIM SEED PHASE_TIMEOUT SCAN_MS REPEATS; do
    is_uint "${!v}" || die "--${v,,} must be a non-negative integer, got '${!v}'"
done
((RECORDS > 0 && LIVE >= PARTITIONS && PARTITIONS > 0 && REPEATS > 0)) || die "--records, --partitions, --repeats must be > 0 and --live-records >= partitions"
[[ -z "$CONFIG" || -f "$CONFIG" ]] || die "--config $CONFIG: no such file"
[[ -z "$CONFIG" ]] || ((SCAN_SET == 0)) || die "--scan-interval-ms and --config exclude each other: set [backfill] scan_interval_ms in the file"
case "$BACKENDS" in
sqlite | postgres | sqlite,postgres) ;;
*) die "--backends must be sqlite, postgres or sqlite,postgres, got '$BACKENDS'" ;;
esac
BACKEND_LIST=(${BACKENDS//,/ })
LIVE_SAME=$((LIVE / PARTITIONS))
LIVE_OTHER=$((LIVE - LIVE_SAME))

# ------------------------------------------------------------------ prerequisites ----
for tool in cargo kcat jq python3 psql timeout awk; do
    command -v "$tool" >/dev/null || die "'$tool' is missing (Debian: apt-get install -y kcat jq python3 postgresql-client coreutils)"
done

KAFKA_SH="$REPO/deploy/local/kafka.sh"
KTOOL="$REPO/deploy/local/kafka-tool.sh"
PG_SH="$REPO/deploy/local/postgres.sh"
"$KAFKA_SH" status --brokers 1 >/dev/null 2>&1 || die "Kafka is not running: start it with deploy/local/kafka.sh start"
PG_ADMIN_URL=""
if [[ ",$BACKENDS," == *,postgres,* ]]; then
    "$PG_SH" status >/dev/null 2>&1 || die "PostgreSQL is not running: start it with deploy/local/postgres.sh start"
    PG_ADMIN_URL="$("$PG_SH" url sluice)"
    [[ "$PG_ADMIN_URL" == postgres://*@127.0.0.1:* ]] || die "PostgreSQL url '$PG_ADMIN_URL' is not loopback"
fi
BS="$("$KAFKA_SH" bootstrap --brokers 1)"
for hp in ${BS//,/ }; do
    case "${hp%:*}" in
    127.0.0.1 | localhost | '[::1]') ;;
    *) die "bootstrap '$BS' is not loopback; this benchmark runs over loopback only" ;;
    esac
done
CLK_TCK="$(getconf CLK_TCK)"

now() { date +%s.%N; }
# fsub A B -> A - B with 3 decimals
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
# CPU seconds (utime+stime) of one pid, 0 if gone.
pid_cpu() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }
    awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' <<<"$stat"
}
# iso_epoch 2026-11-30T18:21:06.294932Z -> 1796062866.294932000 ("" stays "")
iso_epoch() { [[ -z "$1" ]] || date -d "$1" +%s.%N; }

SCRIPT_T0="$(now)"
RUN_DATE="$(date +%Y%m%d-%H%M%S)"

# ------------------------------------------------------------------ 1. build --------
log "building the release binary (cargo may wait for a lock held by another build)"
cargo build --release --bin sluice >&2
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps 2>/dev/null | jq -r .target_directory)"
SLUICE="$TARGET_DIR/release/sluice"
[[ -x "$SLUICE" ]] || die "no binary at $SLUICE after the build"

# ------------------------------------------------------------------ fresh names -----
RID="$(od -An -N4 -tx4 /dev/urandom | tr -d ' \n')"
PREFIX="bench-$RID"
TOPICS=("$PREFIX.log" "$PREFIX.backfill" "$PREFIX.dlq")
WORK="$(mktemp -d /tmp/sluice-bench-backfill.XXXXXX)"
OUT_DIR="$REPO/target/bench"
GROUPS_MADE=() # every consumer group a replica may have created (+ its .backfill group)
DBS_MADE=()    # every PostgreSQL database created
REPLICA_PID=""

# drop_db NAME: drop a PostgreSQL database, retried. WITH (FORCE) fails for a non-superuser
# while an autovacuum worker is in the database ("must be a member of the role whose
# process is being terminated"); a plain DROP cancels autovacuum itself, so alternate the two.
drop_db() {
    local i
    for i in 1 2 3 4 5 6; do
        if ((i % 2)); then
            timeout 60 psql -q -X "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$1\" WITH (FORCE)" >"$WORK/drop.err" 2>&1 && return 0
        else
            timeout 60 psql -q -X "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$1\"" >"$WORK/drop.err" 2>&1 && return 0
        fi
        ((i < 6)) || log "WARNING: could not drop database $1: $(tail -1 "$WORK/drop.err")"
        sleep 1
    done
}
cleanup() {
    local rc=$?
    set +e
    if [[ -n "$REPLICA_PID" ]] && kill -0 "$REPLICA_PID" 2>/dev/null; then
        kill -TERM "$REPLICA_PID" 2>/dev/null
        for _ in $(seq 1 40); do kill -0 "$REPLICA_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$REPLICA_PID" 2>/dev/null
    fi
    log "cleanup: topics ${TOPICS[*]}, ${#GROUPS_MADE[@]} groups, databases ${DBS_MADE[*]:-none}, $WORK"
    for t in "${TOPICS[@]}"; do
        timeout 60 "$KTOOL" topics --bootstrap-server "$BS" --delete --if-exists --topic "$t" >/dev/null 2>&1
    done
    if ((${#GROUPS_MADE[@]})); then
        local gargs=() g
        for g in "${GROUPS_MADE[@]}"; do gargs+=(--group "$g" --group "$g.backfill"); done
        timeout 120 "$KTOOL" consumer-groups --bootstrap-server "$BS" --delete "${gargs[@]}" >/dev/null 2>&1
    fi
    local db
    for db in "${DBS_MADE[@]}"; do drop_db "$db"; done
    rm -rf "$WORK"
    if [[ -n "${BROKER_MASKS:-}" ]]; then
        local pm
        for pm in $BROKER_MASKS; do taskset -a -p "${pm#*=}" "${pm%=*}" >/dev/null 2>&1; done
    fi
    log "total wall time $(fsub "$(now)" "$SCRIPT_T0") s (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
REPLICA_PIN=()
BROKER_MASKS=""
NCPU="$(nproc --all)" # the machine's CPUs, whatever this process's own affinity
PINNING="nothing pinned: broker, PostgreSQL, the pollers and the replica share all $NCPU CPUs"
if ((PIN)); then
    ((NCPU >= 2)) || die "--pin needs 2 CPUs or more"
    for bp in $(pgrep -f 'kafka\.Kafka '); do
        BROKER_MASKS+=" $bp=$(taskset -p "$bp" | awk '{ print $NF }')"
        taskset -a -p -c 0 "$bp" >/dev/null || die "cannot pin the broker (pid $bp) to CPU 0"
    done
    [[ -n "$BROKER_MASKS" ]] || die "--pin: no broker process (kafka.Kafka) found"
    taskset -p -c 0 $$ >/dev/null
    REPLICA_PIN=(taskset -c 1)
    PINNING="each replica on CPU 1; the broker JVM, this script and what it starts (pollers, CLI, producers) on CPU 0; PostgreSQL not pinned"
fi
trap 'exit 130' INT
trap 'exit 143' TERM

export SLUICE_BROKERS="$BS" SLUICE_TOPIC_PREFIX="$PREFIX" SLUICE_HTTP=""
CONFIG_DESC="${CONFIG:-sluice defaults}"
if [[ -z "$CONFIG" ]] && ((SCAN_MS > 0)); then
    CONFIG="$WORK/sluice.toml"
    printf '[backfill]\nscan_interval_ms = %d\n' "$SCAN_MS" >"$CONFIG"
    CONFIG_DESC="sluice defaults except [backfill] scan_interval_ms = $SCAN_MS"
fi
if [[ -n "$CONFIG" ]]; then export SLUICE_CONFIG="$CONFIG"; else unset SLUICE_CONFIG; fi
unset SLUICE_LOG

COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)"
CPU_MODEL="$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
log "prefix $PREFIX, $RECORDS records into $BIG, $LIVE live records ($LIVE_SAME into $BIG), $PARTITIONS partitions, dim $DIM, commit $COMMIT, $NCPU x $CPU_MODEL, config: $CONFIG_DESC; $PINNING"

RESULTS="$WORK/results.jsonl" # one JSON object per measurement
: >"$RESULTS"
mkdir -p "$OUT_DIR"

# sl URL GROUP ARGS...: the sluice CLI against one environment (sysdb + group); its stderr
# (PostgreSQL NOTICEs on every connect) goes to $WORK/cli.err, shown only on failure
sl() {
    local url="$1" group="$2" rc=0
    shift 2
    SLUICE_SYSDB="$url" SLUICE_GROUP="$group" timeout 120 "$SLUICE" "$@" 2>"$WORK/cli.err" || rc=$?
    if ((rc != 0)); then
        echo "sluice $* failed (exit $rc):" >&2
        tail -20 "$WORK/cli.err" >&2
    fi
    return "$rc"
}
sqlite_url() { echo "sqlite://$WORK/$1.sqlite"; }
pg_url() { echo "${PG_ADMIN_URL%/*}/$1"; }
# new_env BACKEND NAME -> ENV_URL: a fresh, empty sysdb (not in $(...): DBS_MADE must survive)
new_env() {
    if [[ "$1" == sqlite ]]; then
        ENV_URL="$(sqlite_url "$2")"
    else
        local db="bench_${RID}_$2"
        DBS_MADE+=("$db")
        timeout 60 psql -q -X -v ON_ERROR_STOP=1 "$PG_ADMIN_URL" -c "CREATE DATABASE \"$db\"" >&2
        ENV_URL="$(pg_url "$db")"
    fi
}
# copy_env BACKEND FROM_NAME TO_NAME -> ENV_URL: a copy (no replica may be running)
copy_env() {
    if [[ "$1" == sqlite ]]; then
        python3 - "$WORK/$2.sqlite" "$WORK/$3.sqlite" <<'EOF'
import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close(); src.close()
EOF
        ENV_URL="$(sqlite_url "$3")"
    else
        local from="bench_${RID}_$2" to="bench_${RID}_$3" i
        DBS_MADE+=("$to")
        for i in $(seq 1 30); do
            # the template may still have a closing session of the stopped replica
            timeout 60 psql -q -X -v ON_ERROR_STOP=1 "$PG_ADMIN_URL" \
                -c "CREATE DATABASE \"$to\" TEMPLATE \"$from\"" >"$WORK/copy.err" 2>&1 && break
            ((i < 30)) || { cat "$WORK/copy.err" >&2; die "cannot copy database $from"; }
            sleep 1
        done
        ENV_URL="$(pg_url "$to")"
    fi
}

# drop_copy BACKEND NAME: remove a copy once its run is over (no replica may be running):
# with many repeats the copies of a large sysdb would otherwise fill the disk
drop_copy() {
    if [[ "$1" == sqlite ]]; then
        rm -f "$WORK/$2.sqlite" "$WORK/$2.sqlite-wal" "$WORK/$2.sqlite-shm"
    else
        drop_db "bench_${RID}_$2"
    fi
}

# offsets_json URL GROUP
offsets_json() { sl "$1" "$2" offsets show --format json; }
# caught_up OFFSETS_JSON -> 0 when every partition has lag 0 and sysdb == high watermark
caught_up() {
    jq -e --argjson p "$PARTITIONS" \
        'length == $p and all(.[]; .lag == 0 and .sysdb_next_offset == .high_watermark)' <<<"$1" >/dev/null
}
sysdb_sum() { jq '[.[].sysdb_next_offset // 0] | add' <<<"$1"; }
hw_sum() { jq '[.[].high_watermark] | add' <<<"$1"; }
# fn_json URL GROUP ID -> the function's row of `functions list --format json` ({} if none)
fn_json() {
    sl "$1" "$2" functions list --format json |
        jq -c --arg id "$3" '(map(select(.id == $id)) | .[0]) // {}'
}
big_live_count() {
    sl "$1" "$2" collections list --format json | jq --arg c "$BIG" '(map(select(.id == $c)) | .[0].records) // 0'
}
# log_ts LOGFILE MESSAGE_PREFIX [FUNCTION_ID] -> epoch of the first matching JSON log line
log_ts() {
    local ts
    ts="$(jq -r --arg m "$2" --arg f "${3:-}" \
        'select((.fields.message // "") | startswith($m)) | select($f == "" or .fields.function == $f) | .timestamp' \
        "$1" 2>/dev/null | head -1)"
    iso_epoch "$ts"
}
log_field() { # LOGFILE MESSAGE_PREFIX FUNCTION_ID FIELD
    jq -r --arg m "$2" --arg f "$3" --arg k "$4" \
        'select((.fields.message // "") | startswith($m)) | select(.fields.function == $f) | .fields[$k]' \
        "$1" 2>/dev/null | head -1
}
rel() { if [[ -n "$1" && -n "$2" ]]; then fsub "$1" "$2"; else echo null; fi; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# metrics_positions -> "P=NEXT ..." of the running replica's sysdb positions (its /metrics;
# a partition appears once assigned), empty while the endpoint is not up yet
metrics_positions() {
    curl -fsS --max-time 2 "http://127.0.0.1:$REPLICA_PORT/metrics" 2>/dev/null |
        sed -n 's/^sluice_partition_sysdb_next_offset{partition="\([0-9]*\)"} \([0-9.e+]*\)$/\1=\2/p' | tr '\n' ' ' || true
}
# start_replica TAG URL GROUP ROLES: spawn `sluice process`, JSON log in $WORK/TAG.log
start_replica() {
    local tag="$1" url="$2" group="$3" roles="$4"
    REPLICA_LOG="$WORK/$tag.log"
    GROUPS_MADE+=("$group")
    REPLICA_PORT="$(free_port)"
    REPLICA_T0="$(now)"
    SLUICE_SYSDB="$url" SLUICE_GROUP="$group" SLUICE_HTTP="127.0.0.1:$REPLICA_PORT" \
        "${REPLICA_PIN[@]}" "$SLUICE" --log-format json process --roles "$roles" 2>"$REPLICA_LOG" &
    REPLICA_PID=$!
    REPLICA_TAG="$tag"
}
replica_alive() {
    kill -0 "$REPLICA_PID" 2>/dev/null && return 0
    tail -30 "$REPLICA_LOG" >&2
    die "sluice process ($REPLICA_TAG) exited unexpectedly (log tail above)"
}
# stop_replica -> sets STOP_RC, STOP_S; keeps the log as target/bench/backfill-<date>-TAG.log
stop_replica() {
    local ts
    ts="$(now)"
    STOP_RC=0
    kill -TERM "$REPLICA_PID"
    for _ in $(seq 1 120); do kill -0 "$REPLICA_PID" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$REPLICA_PID" 2>/dev/null; then
        tail -20 "$REPLICA_LOG" >&2
        kill -KILL "$REPLICA_PID" 2>/dev/null || true
        wait "$REPLICA_PID" 2>/dev/null || true
        REPLICA_PID=""
        die "sluice process ($REPLICA_TAG) did not exit within 30 s of SIGTERM (log tail above)"
    fi
    wait "$REPLICA_PID" || STOP_RC=$?
    STOP_S="$(fsub "$(now)" "$ts")"
    REPLICA_PID=""
    cp "$REPLICA_LOG" "$OUT_DIR/backfill-$RUN_DATE-$REPLICA_TAG.log"
    ((STOP_RC == 0)) || { tail -20 "$REPLICA_LOG" >&2; log "WARNING: sluice process ($REPLICA_TAG) exited with $STOP_RC after SIGTERM"; }
    local errors warns
    errors="$(jq -c 'select(.level == "ERROR")' "$REPLICA_LOG" 2>/dev/null | wc -l)"
    warns="$(jq -c 'select(.level == "WARN")' "$REPLICA_LOG" 2>/dev/null | wc -l)"
    LOG_COUNTS="$(jq -cn --argjson e "$errors" --argjson w "$warns" --argjson rc "$STOP_RC" --arg s "$STOP_S" \
        '{error_log_lines: $e, warn_log_lines: $w, exit_code: $rc, shutdown_s: ($s|tonumber)}')"
    if ((errors + warns > 0)); then
        log "$REPLICA_TAG: $errors ERROR / $warns WARN log lines (first 5):"
        jq -c 'select(.level == "ERROR" or .level == "WARN") | {level, fields}' "$REPLICA_LOG" | head -5 >&2
    fi
}
# wait_caught_up URL GROUP: poll until caught up; sets CAUGHT_T, CAUGHT_OFFSETS, POLLS
wait_caught_up() {
    local url="$1" group="$2" out deadline
    deadline="$(awk -v t="$(now)" -v d="$PHASE_TIMEOUT" 'BEGIN { printf "%d", t + d }')"
    POLLS=0
    while :; do
        replica_alive
        POLLS=$((POLLS + 1))
        if out="$(offsets_json "$url" "$group")" && caught_up "$out"; then
            CAUGHT_T="$(now)"
            CAUGHT_OFFSETS="$out"
            return 0
        fi
        if (($(date +%s) > deadline)); then
            sl "$url" "$group" offsets show >&2 || true
            tail -30 "$REPLICA_LOG" >&2
            die "sluice process ($REPLICA_TAG) did not catch up within $PHASE_TIMEOUT s"
        fi
        sleep "$POLL_S"
    done
}
# wait_log MESSAGE_PREFIX COUNT: until the replica log has COUNT lines with that message
wait_log() {
    local deadline
    deadline="$(awk -v t="$(now)" 'BEGIN { printf "%d", t + 120 }')"
    until (($(jq -r '.fields.message // ""' "$REPLICA_LOG" 2>/dev/null | grep -c "^$1") >= $2)); do
        replica_alive
        (($(date +%s) <= deadline)) || die "no '$1' log line ($REPLICA_TAG) within 120 s"
        sleep 0.1
    done
}
# attach URL GROUP FUNCTION OUTPUT -> prints the function id
attach() {
    local out
    if [[ "$3" == wasm ]]; then
        out="$(sl "$1" "$2" functions attach "$BIG" --wasm "$WASM" --params "$WASM_PARAMS" --output "$4" --format json)" || die "functions attach --wasm $WASM failed"
    else
        out="$(sl "$1" "$2" functions attach "$BIG" --function "$3" --output "$4" --format json)" || die "functions attach $3 failed"
    fi
    log "attach $3: $out"
    [[ "$(jq -r .marker <<<"$out")" == published ]] || die "the marker of $3 was not published: $out"
    jq -r .function_id <<<"$out"
}

# ------------------------------------------------------------------ 2. produce N ----
SQLITE_MAIN="$(sqlite_url main)" # also the sysdb of `init` and `produce` (topic partition count)
log "sluice init --partitions $PARTITIONS (topics + SQLite schema)"
sl "$SQLITE_MAIN" "$PREFIX-sqlite-main" init --partitions "$PARTITIONS" >&2

log "producing $RECORDS records into $BIG: sluice workload --collections 1 --ids-per-collection $RECORDS | sluice produce -"
t0="$(now)"
# shellcheck disable=SC2016 # expanded by the inner bash
timeout "$PHASE_TIMEOUT" bash -c 'set -euo pipefail
    "$1" workload --records "$2" --collections 1 --collection-prefix big- --ids-per-collection "$2" --dim "$3" --seed "$4" |
        SLUICE_SYSDB="$5" "$1" produce -' _ "$SLUICE" "$RECORDS" "$DIM" "$SEED" "$SQLITE_MAIN" 2>"$WORK/produce.log" ||
    { tail -20 "$WORK/produce.log" >&2; die "produce failed"; }
PRODUCE_S="$(fsub "$(now)" "$t0")"
log "produced in $PRODUCE_S s: $(tail -1 "$WORK/produce.log")"

# ------------------------------------------------------------------ 3-4. per backend -
declare -A URL_A URL_B URL_R FN_B # by "BACKEND REPEAT"
for backend in "${BACKEND_LIST[@]}"; do
    new_env "$backend" main
    main_url="$ENV_URL"
    group="$PREFIX-$backend-main"
    sl "$main_url" "$group" init --partitions "$PARTITIONS" >&2

    # -- materialize N with --roles processor
    log "$backend: materializing $BIG with sluice process --roles processor"
    start_replica "$backend-materialize" "$main_url" "$group" processor
    wait_caught_up "$main_url" "$group"
    secs="$(fsub "$CAUGHT_T" "$REPLICA_T0")"
    cpu="$(pid_cpu "$REPLICA_PID")"
    n_log="$(hw_sum "$CAUGHT_OFFSETS")"
    stop_replica
    live="$(big_live_count "$main_url" "$group")"
    log "$backend: materialized $n_log log records in $secs s ($POLLS polls), CPU $cpu s; $BIG holds $live live records"
    jq -cn --arg b "$backend" --argjson n "$n_log" --arg s "$secs" --arg cpu "$cpu" --argjson live "$live" --argjson lc "$LOG_COUNTS" \
        '{backend: $b, kind: "materialize", log_records: $n, seconds: ($s|tonumber), records_per_s: ($n / ($s|tonumber) | round),
          cpu_s: ($cpu|tonumber), live_records: $live, note: "sluice process --roles processor, spawn -> lag 0 (poll 0.5 s)"} + $lc' >>"$RESULTS"

    # -- copies for the live runs, before any function exists
    for i in $(seq 1 "$REPEATS"); do
        copy_env "$backend" main "live-a$i"
        URL_A[$backend $i]="$ENV_URL"
        copy_env "$backend" main "live-b$i"
        URL_B[$backend $i]="$ENV_URL"
    done

    # -- backfill rate, all roles
    start_replica "$backend-backfill" "$main_url" "$group" processor,backfill,relay
    wait_log "partition starts" "$PARTITIONS"
    wait_log "backfill worker started" 1
    wait_caught_up "$main_url" "$group"
    sleep 1
    fns=(record_counter)
    if ((STATISTICS)); then fns+=(statistics); fi
    if [[ -n "$WASM" ]]; then fns+=(wasm); fi
    for fn in "${fns[@]}"; do
        live="$(big_live_count "$main_url" "$group")"
        log "$backend: attaching $fn to $BIG ($live live records) with a replica running all roles"
        t_attach="$(now)"
        fid="$(attach "$main_url" "$group" "$fn" "$BIG-$fn")"
        t_attached="$(now)"
        deadline="$(awk -v t="$(now)" -v d="$PHASE_TIMEOUT" 'BEGIN { printf "%d", t + d }')"
        polls=0
        while :; do
            replica_alive
            polls=$((polls + 1))
            row="$(fn_json "$main_url" "$group" "$fid")"
            [[ "$(jq -r '.status // ""' <<<"$row")" == ready ]] && break
            (($(date +%s) <= deadline)) || { log "$row"; die "$backend: $fn not ready within $PHASE_TIMEOUT s"; }
            sleep "$FN_POLL_S"
        done
        t_ready_poll="$(now)"
        t_marker="$(log_ts "$REPLICA_LOG" "backfill marker processed" "$fid")"
        t_started="$(log_ts "$REPLICA_LOG" "backfill started" "$fid")"
        t_finished="$(log_ts "$REPLICA_LOG" "backfill finished" "$fid")"
        elapsed_ms="$(log_field "$REPLICA_LOG" "backfill finished" "$fid" elapsed_ms)"
        [[ -n "$t_finished" ]] || die "$backend: $fn is ready but this replica logged no 'backfill finished' line"
        total="$(jq '.backfill_total // 0' <<<"$row")"
        done_="$(jq '.backfill_done' <<<"$row")"
        secs="$(fsub "$t_finished" "$t_attach")"
        log "$backend: $fn backfilled $total records ($live live): attach -> finished $secs s (poll saw ready after $(fsub "$t_ready_poll" "$t_attach") s), worker ${elapsed_ms} ms"
        ((total == live)) || log "WARNING: backfill_total $total != live records of $BIG $live"
        jq -cn --arg b "$backend" --arg fn "$fn" --arg id "$fid" --argjson total "$total" --argjson bdone "$done_" --argjson live "$live" \
            --arg s "$secs" --arg poll "$(fsub "$t_ready_poll" "$t_attach")" --arg cli "$(fsub "$t_attached" "$t_attach")" \
            --argjson marker "$(rel "$t_marker" "$t_attach")" --argjson started "$(rel "$t_started" "$t_attach")" \
            --argjson ems "${elapsed_ms:-null}" --argjson polls "$polls" \
            '{backend: $b, kind: "backfill", function: $fn, function_id: $id, backfill_total: $total, backfill_done: $bdone,
              live_records_at_attach: $live, seconds: ($s|tonumber), records_per_s: ($total / ($s|tonumber) | round),
              worker_elapsed_s: (if $ems then $ems / 1000 else null end),
              worker_records_per_s: (if $ems and $ems > 0 then ($total * 1000 / $ems | round) else null end),
              attach_cli_s: ($cli|tonumber), marker_processed_at_s: $marker, worker_started_at_s: $started,
              ready_seen_by_poll_at_s: ($poll|tonumber), polls: $polls,
              note: "seconds = attach start -> the replica log line backfill finished; worker = backfill started -> finished"}' >>"$RESULTS"
    done
    stop_replica
    jq -c --argjson lc "$LOG_COUNTS" 'if .kind == "backfill" and .backend == "'"$backend"'" then . + {replica: $lc} else . end' \
        "$RESULTS" >"$RESULTS.tmp" && mv "$RESULTS.tmp" "$RESULTS"
    backfill_lines="$(jq -c 'select((.fields.message // "") | test("^backfill (started|finished)|no longer backfilling|backfill step failed")) | {timestamp, fields}' "$REPLICA_LOG")"
    log "$backend: backfill log lines of the replica:"$'\n'"$backfill_lines"

    # -- copies for the live runs (r): record_counter attached and ready (with --no-statistics
    # it is main's only function, as in (b)); a live batch then computes its outputs, and
    # nothing is backfilled
    if ((STATISTICS == 0)); then
        for i in $(seq 1 "$REPEATS"); do
            copy_env "$backend" main "live-r$i"
            URL_R[$backend $i]="$ENV_URL"
        done
    fi

    # -- the function of live run (b), attached while no replica runs: marker right after big-0's records
    for i in $(seq 1 "$REPEATS"); do
        FN_B[$backend $i]="$(attach "${URL_B[$backend $i]}" "$PREFIX-$backend-live-b$i" record_counter "$BIG-record_counter")"
    done
done

# ------------------------------------------------------------------ 5. live backlog -
log "producing $LIVE live records: $LIVE_OTHER into $LIVE_COLLECTIONS collections live-*, $LIVE_SAME into $BIG"
t0="$(now)"
# shellcheck disable=SC2016 # expanded by the inner bash
timeout "$PHASE_TIMEOUT" bash -c 'set -euo pipefail
    { "$1" workload --records "$2" --collections "$3" --collection-prefix live- --ids-per-collection "$4" --dim "$5" --seed "$6"
      "$1" workload --records "$7" --collections 1 --collection-prefix big- --ids-per-collection "$8" --dim "$5" --seed "$9"
    } | SLUICE_SYSDB="${10}" "$1" produce -' _ "$SLUICE" "$LIVE_OTHER" "$LIVE_COLLECTIONS" "$LIVE_IDS" "$DIM" "$((SEED + 1))" \
    "$LIVE_SAME" "$RECORDS" "$((SEED + 2))" "$SQLITE_MAIN" 2>"$WORK/produce-live.log" ||
    { tail -20 "$WORK/produce-live.log" >&2; die "produce of the live records failed"; }
LIVE_PRODUCE_S="$(fsub "$(now)" "$t0")"
log "produced in $LIVE_PRODUCE_S s: $(tail -1 "$WORK/produce-live.log")"

# run_live BACKEND MODE(a|b|r) REPEAT URL [FUNCTION_ID]
run_live() {
    local backend="$1" mode="$2" repeat="$3" url="$4" fid="${5:-}" group="$PREFIX-$1-live-$2$3"
    local pre pos0 hw0 drain samples="$WORK/$backend-live-$mode.samples" row='{}' out t
    pre="$(offsets_json "$url" "$group")" || die "offsets show failed"
    pos0="$(sysdb_sum "$pre")"
    hw0="$(hw_sum "$pre")"
    drain=$((hw0 - pos0))
    local what="(no function)"
    [[ -n "$fid" ]] && what="while $BIG backfills into record_counter $fid"
    [[ "$mode" == r ]] && what="(record_counter attached and ready)"
    log "$backend ($mode$repeat): draining $drain log records $what"
    : >"$samples"
    # per-partition high watermarks: nothing is produced while the backlog drains
    local hws
    hws="$(jq -c 'map({key: (.partition|tostring), value: .high_watermark}) | from_entries' <<<"$pre")"
    start_replica "$backend-live-$mode$repeat" "$url" "$group" processor,backfill,relay
    # The replica's own /metrics, every LIVE_POLL_S, from one poller process (a scrape
    # costs a few ms; a CLI poll costs a process and a Kafka client, and a process per
    # poll would compete with the replica), so the drain's end is known to ~LIVE_POLL_S.
    local polls
    polls="$(python3 - "$hws" "$REPLICA_PORT" "$REPLICA_PID" "$PHASE_TIMEOUT" "$LIVE_POLL_S" "$samples" <<'EOF'
import json, os, re, sys, time, urllib.request
hw, port, pid, timeout, every, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
keys = sorted(hw, key=int)
pat = re.compile(r'^sluice_partition_sysdb_next_offset\{partition="(\d+)"\} (\S+)$', re.M)
deadline, polls = time.time() + timeout, 0
with open(out, "a") as f:
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit("the replica exited")
        polls += 1
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            text = None
        t = time.time()
        if text is not None:
            pos = {p: int(float(v)) for p, v in pat.findall(text)}
            parts = [pos.get(p, -1) for p in keys]
            if pos:
                f.write(json.dumps({"t": t, "sysdb": sum(max(x, 0) for x in parts), "parts": parts, "hw": [hw[p] for p in keys]}) + "\n")
                f.flush()
            if all(x == hw[p] for x, p in zip(parts, keys)):
                print(polls)
                sys.exit(0)
        if t > deadline:
            sys.exit(f"not caught up within {timeout} s")
        time.sleep(every)
EOF
)" || {
        sl "$url" "$group" offsets show >&2 || true
        tail -30 "$REPLICA_LOG" >&2
        die "sluice process ($REPLICA_TAG) did not catch up (see above)"
    }
    # the CLI agrees (sysdb == high watermark == group offset lag 0 on every partition)
    local check
    for _ in $(seq 1 100); do
        check="$(offsets_json "$url" "$group")" && caught_up "$check" && break
        sleep 0.1
    done
    caught_up "$check" || { sl "$url" "$group" offsets show >&2 || true; die "$backend ($mode$repeat): /metrics said caught up, offsets show does not"; }
    if [[ -n "$fid" ]]; then
        row="$(fn_json "$url" "$group" "$fid")"
        jq -c '{status: .status, done: .backfill_done, total: .backfill_total}' <<<"$row" >"$WORK/at-caught-up.json"
    fi
    local t1 cpu secs t_assign big_part
    big_part="$(sl "$url" "$group" collections list --format json | jq --arg c "$BIG" '(map(select(.id == $c)) | .[0].partition) // -1')"
    t1="$(jq -r .t <<<"$(tail -1 "$samples")")"
    cpu="$(pid_cpu "$REPLICA_PID")"
    secs="$(fsub "$t1" "$REPLICA_T0")"
    t_assign="$(log_ts "$REPLICA_LOG" "partition starts")"
    local at_caught='{}' t_ready="" t_marker="" t_started="" t_finished="" elapsed_ms=""
    if [[ -n "$fid" ]]; then
        at_caught="$(cat "$WORK/at-caught-up.json")"
        log "$backend ($mode$repeat): caught up after $secs s; function at that moment: $at_caught; waiting for ready"
        local deadline
        deadline="$(awk -v t="$(now)" -v d="$PHASE_TIMEOUT" 'BEGIN { printf "%d", t + d }')"
        while :; do
            replica_alive
            row="$(fn_json "$url" "$group" "$fid")"
            [[ "$(jq -r '.status // ""' <<<"$row")" == ready ]] && break
            (($(date +%s) <= deadline)) || { log "$row"; die "$backend ($mode$repeat): function not ready within $PHASE_TIMEOUT s"; }
            sleep "$FN_POLL_S"
        done
        t_ready="$(now)"
        t_marker="$(log_ts "$REPLICA_LOG" "backfill marker processed" "$fid")"
        t_started="$(log_ts "$REPLICA_LOG" "backfill started" "$fid")"
        t_finished="$(log_ts "$REPLICA_LOG" "backfill finished" "$fid")"
        elapsed_ms="$(log_field "$REPLICA_LOG" "backfill finished" "$fid" elapsed_ms)"
        row="$(fn_json "$url" "$group" "$fid")"
    fi
    stop_replica
    log "$backend ($mode$repeat): caught up in $secs s (first assignment at $(rel "$t_assign" "$REPLICA_T0") s, $polls polls), CPU $cpu s"
    python3 - "$samples" >>"$RESULTS" <<EOF
import json, sys
samples = [json.loads(l) for l in open(sys.argv[1])]
def f(x): return None if x in ("", "null") else float(x)
t0, t1, assign = f("$REPLICA_T0"), f("$t1"), f("$t_assign")
drain, secs = $drain, t1 - t0
r = {"backend": "$backend", "kind": "live_ready" if "$mode" == "r" else "live", "with_backfill": "$mode" == "b",
     "mode": "$mode", "repeat": $repeat, "records": drain, "seconds": round(secs, 3),
     "records_per_s": round(drain / secs), "cpu_s": float("$cpu"), "polls": $polls}
# when each partition reached its high watermark (first poll that saw it), big-0's apart
big = $big_part
done_at = {}
for smp in samples:
    for p, (o, h) in enumerate(zip(smp["parts"], smp["hw"])):
        if o == h and p not in done_at:
            done_at[p] = round(smp["t"] - t0, 3)
r["big_partition"] = big
r["big_partition_caught_up_at_s"] = done_at.get(big)
others = [v for p, v in done_at.items() if p != big]
r["other_partitions_caught_up_at_s"] = max(others) if others else None
r["samples"] = [{"t": round(x["t"] - t0, 3), "sysdb": x["sysdb"], "parts": x["parts"]} for x in samples]
if assign is not None:
    r["assign_s"] = round(assign - t0, 3)
    r["steady_records_per_s"] = round(drain / (t1 - assign))
if "$fid":
    row = json.loads('''$row''')
    marker, started, finished, ready = f("$t_marker"), f("$t_started"), f("$t_finished"), f("$t_ready")
    r["function_id"] = "$fid"
    r["backfill_total"] = row.get("backfill_total")
    r["backfill_at_caught_up"] = json.loads('''$at_caught''')
    rel = lambda x: None if x is None else round(x - t0, 3)
    r["backfill_marker_processed_at_s"] = rel(marker)
    r["backfill_started_at_s"] = rel(started)
    r["backfill_finished_at_s"] = rel(finished)
    r["ready_seen_by_poll_at_s"] = rel(ready)
    if "$elapsed_ms":
        r["backfill_worker_elapsed_s"] = int("$elapsed_ms") / 1000
        if row.get("backfill_total"):
            r["backfill_worker_records_per_s"] = round(row["backfill_total"] * 1000 / int("$elapsed_ms"))
    # the part of the drain (first assignment -> caught up) during which the backfill ran
    lo = assign if assign is not None else t0
    if started is not None:
        end = finished if finished is not None else t1
        r["backfill_overlap_of_drain"] = round(max(0.0, min(end, t1) - max(started, lo)) / (t1 - lo), 3)
    # live rate between the first and the last poll while the worker ran (log times)
    bf = [s for s in samples if started is not None and s["t"] >= started and (finished is None or s["t"] <= finished)]
    if len(bf) >= 2 and bf[-1]["t"] > bf[0]["t"]:
        r["live_records_per_s_while_backfilling"] = round((bf[-1]["sysdb"] - bf[0]["sysdb"]) / (bf[-1]["t"] - bf[0]["t"]))
        r["while_backfilling_window_s"] = round(bf[-1]["t"] - bf[0]["t"], 3)
        r["while_backfilling_sysdb"] = [bf[0]["sysdb"], bf[-1]["sysdb"]]
r.update(json.loads('''$LOG_COUNTS'''))
print(json.dumps(r))
EOF
    if [[ -n "$fid" ]]; then
        log "$backend ($mode$repeat): backfill log lines:"$'\n'"$(jq -c 'select((.fields.message // "") | test("^backfill (marker|started|finished|task)|no longer backfilling|backfill step failed")) | {timestamp, fields}' "$REPLICA_LOG")"
    fi
}

# interleaved: (a), (r), (b) of one repeat, then the next
for backend in "${BACKEND_LIST[@]}"; do
    for i in $(seq 1 "$REPEATS"); do
        run_live "$backend" a "$i" "${URL_A[$backend $i]}"
        drop_copy "$backend" "live-a$i"
        if [[ -n "${URL_R[$backend $i]:-}" ]]; then
            run_live "$backend" r "$i" "${URL_R[$backend $i]}"
            drop_copy "$backend" "live-r$i"
        fi
        run_live "$backend" b "$i" "${URL_B[$backend $i]}" "${FN_B[$backend $i]}"
        drop_copy "$backend" "live-b$i"
    done
done

# ------------------------------------------------------------------ 6. report -------
OUT_JSON="$OUT_DIR/backfill-$RUN_DATE.json"
SCRIPT_S="$(fsub "$(now)" "$SCRIPT_T0")"
python3 - "$RESULTS" "$OUT_JSON" <<EOF
import json, math, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
GOAL_BACKFILL_SQLITE, GOAL_DROP = 300_000, 10.0
doc = {
    "commit": "$COMMIT", "worktree_dirty": "$DIRTY" == "true",
    "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
    "machine": {"nproc": $NCPU, "cpu_model": "$CPU_MODEL", "mem_total_kb": $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo),
                "kernel": "$(uname -r)"},
    "pinning": "$PINNING",
    "workload": {"records": $RECORDS, "collection": "$BIG", "ids_per_collection": $RECORDS, "dim": $DIM, "seed": $SEED,
                 "partitions": $PARTITIONS, "produce_s": $PRODUCE_S,
                 "live_records": $LIVE, "live_into_big": $LIVE_SAME, "live_into_others": $LIVE_OTHER,
                 "live_collections": $LIVE_COLLECTIONS, "live_ids_per_collection": $LIVE_IDS, "live_produce_s": $LIVE_PRODUCE_S,
                 "topic": "$PREFIX.log (shared by both backends; each ignores the other's markers)"},
    "sluice_config": "$CONFIG_DESC",
    "kafka": "$BS (1 broker, loopback)", "postgres": "${PG_ADMIN_URL%/*}/<fresh dbs> (loopback)",
    "goals": {"backfill_records_per_s_sqlite_min": GOAL_BACKFILL_SQLITE, "live_throughput_drop_pct_max": GOAL_DROP},
    "script_wall_s_before_cleanup": $SCRIPT_S,
    "rows": rows,
    "summary": {},
}
print(f'commit {doc["commit"]}{" (dirty worktree)" if doc["worktree_dirty"] else ""}, {doc["machine"]["nproc"]} x {doc["machine"]["cpu_model"]}; {doc["pinning"]}')
print(f'workload: {$RECORDS} records into $BIG (dim $DIM, $PARTITIONS partitions), live backlog {$LIVE} ({$LIVE_SAME} into $BIG); config: $CONFIG_DESC')
print(f'goals: backfill >= {GOAL_BACKFILL_SQLITE:,} records/s on SQLite; live throughput drop <= {GOAL_DROP:.0f}%')
for b in "$BACKENDS".split(","):
    mat = next((r for r in rows if r["backend"] == b and r["kind"] == "materialize"), None)
    bfs = [r for r in rows if r["backend"] == b and r["kind"] == "backfill"]
    las = sorted((r for r in rows if r["backend"] == b and r["kind"] == "live" and not r["with_backfill"]), key=lambda r: r["repeat"])
    lbs = sorted((r for r in rows if r["backend"] == b and r["kind"] == "live" and r["with_backfill"]), key=lambda r: r["repeat"])
    lrs = {r["repeat"]: r for r in rows if r["backend"] == b and r["kind"] == "live_ready"}
    s = {}
    print()
    print(f"== {b} ==")
    if mat:
        print(f'materialize ({mat["log_records"]} log records, --roles processor): {mat["seconds"]:.2f} s, {mat["records_per_s"]:,} records/s; {mat["live_records"]:,} live records in $BIG')
    hdr = ["backfill", "records", "seconds", "records/s", "worker s", "worker rec/s", "marker at s", "pickup s", "goal"]
    pick = lambda a, b: f"{a - b:.2f}" if a is not None and b is not None else "?"
    table = [hdr]
    for r in bfs:
        goal = ("met" if (r.get("worker_records_per_s") or r["records_per_s"]) >= GOAL_BACKFILL_SQLITE else "NOT met") if b == "sqlite" else "-"
        table.append([r["function"], f'{r["backfill_total"]:,}', f'{r["seconds"]:.2f}', f'{r["records_per_s"]:,}',
                      f'{r["worker_elapsed_s"]:.2f}' if r.get("worker_elapsed_s") is not None else "?",
                      f'{r["worker_records_per_s"]:,}' if r.get("worker_records_per_s") else "?",
                      f'{r["marker_processed_at_s"]:.2f}' if r.get("marker_processed_at_s") is not None else "?",
                      pick(r.get("worker_started_at_s"), r.get("marker_processed_at_s")), goal])
        s[f'backfill_{r["function"]}_records_per_s'] = r["records_per_s"]
    for lb in lbs:
        table.append([f"record_counter under live load #{lb['repeat']}", f'{lb.get("backfill_total") or 0:,}',
                      f'{lb["backfill_finished_at_s"] - lb["backfill_marker_processed_at_s"]:.2f}' if lb.get("backfill_finished_at_s") is not None and lb.get("backfill_marker_processed_at_s") is not None else "?",
                      f'{round(lb["backfill_total"] / (lb["backfill_finished_at_s"] - lb["backfill_marker_processed_at_s"])):,}' if lb.get("backfill_total") and lb.get("backfill_finished_at_s") is not None and lb.get("backfill_marker_processed_at_s") is not None and lb["backfill_finished_at_s"] > lb["backfill_marker_processed_at_s"] else "?",
                      f'{lb["backfill_worker_elapsed_s"]:.2f}' if lb.get("backfill_worker_elapsed_s") is not None else "?",
                      f'{lb["backfill_worker_records_per_s"]:,}' if lb.get("backfill_worker_records_per_s") else "?",
                      f'{lb["backfill_marker_processed_at_s"]:.2f}' if lb.get("backfill_marker_processed_at_s") is not None else "?",
                      pick(lb.get("backfill_started_at_s"), lb.get("backfill_marker_processed_at_s")), "-"])
    w = [max(len(row[i]) for row in table) for i in range(len(hdr))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(row)))
        if i == 0:
            print("  ".join("-" * x for x in w))
    if bfs:
        print("  seconds: attach start -> the replica's 'backfill finished' line (under live load: marker processed -> finished);"
              " worker: 'backfill started' -> finished;\n  marker at: attach start -> marker processed;"
              " pickup: marker processed -> 'backfill started' (a missed task waits for the next [backfill] scan)")
    if las and lbs:
        # The same stretch of the backlog in each run: the records (b) applied while its
        # worker ran, and how long (a) -- and (r), the function ready -- took for those
        # same records (by interpolation of their samples). The rate changes along a drain
        # (a fresh file grows; the start is slow), so this compares like with like where a
        # steady average would not. Each repeat compares its own (a), (r) and (b).
        def rate_over(run, lo, hi):
            if run is None:
                return None
            sa = [(x["sysdb"], x["t"]) for x in run.get("samples", [])]
            def t_at(v):
                for (v0, t0_), (v1, t1_) in zip(sa, sa[1:]):
                    if v0 <= v <= v1 and v1 > v0:
                        return t0_ + (t1_ - t0_) * (v - v0) / (v1 - v0)
                return None
            ta, tb = t_at(lo), t_at(hi)
            return (hi - lo) / (tb - ta) if ta is not None and tb is not None and tb > ta else None
        pct = lambda x, y: round(100 * (1 - x / y), 1) if x and y else None
        med = lambda xs: round(statistics.median(xs), 1) if xs else None

        def median_ci(xs, level=0.95):
            # Distribution-free interval for the median: the order statistics x(k) and
            # x(n+1-k) for the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at
            # least `level`. None below 6 values (no such k): then the median resolves nothing.
            ys, n, out = sorted(xs), len(xs), None
            for k in range(1, n // 2 + 1):
                if 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n < level:
                    break
                out = [ys[k - 1], ys[n - k]]
            return out
        print()
        hdr = ["live backlog", "records", "seconds", "records/s", "assign s", "steady rec/s", "same records rec/s", "drop %"]
        table = [hdr]
        drops, drops_ready, costs, notes = [], [], [], []
        for lb in lbs:
            k = lb["repeat"]
            la = next((x for x in las if x["repeat"] == k), None)
            lr = lrs.get(k)
            same, drop_of = {}, {}
            if "while_backfilling_sysdb" in lb:
                lo, hi = lb["while_backfilling_sysdb"]
                same = {"a": rate_over(la, lo, hi), "r": rate_over(lr, lo, hi), "b": lb["live_records_per_s_while_backfilling"]}
                d, dr, c = pct(same["b"], same["a"]), pct(same["b"], same["r"]), pct(same["r"], same["a"])
                drop_of = {"b": d, "r": c}
                if d is not None:
                    drops.append(d)
                if dr is not None:
                    drops_ready.append(dr)
                if c is not None:
                    costs.append(c)
                notes.append(f'#{k}: (b) applied log records {lo:,}..{hi:,} while its worker ran ({lb["while_backfilling_window_s"]:.2f} s) at {same["b"]:,}/s; '
                             + (f'(a) the same records at {round(same["a"]):,}/s: drop {d}%' if d is not None else "(a): no rate over them")
                             + (f'; (r) at {round(same["r"]):,}/s: drop against (r) {dr}%, the ready function\'s own cost {c}%' if c is not None else ""))
            else:
                notes.append(f"#{k}: (b)'s worker ran between fewer than two polls: no same-records comparison")
            for name, r, key in (("without backfill (a)", la, "a"), ("function ready (r)", lr, "r"), ("with backfill (b)", lb, "b")):
                if r is None:
                    continue
                v = same.get(key)
                table.append([f"{name} #{k}", f'{r["records"]:,}', f'{r["seconds"]:.2f}', f'{r["records_per_s"]:,}', f'{r.get("assign_s", 0):.2f}',
                              f'{r.get("steady_records_per_s", 0):,}', f"{round(v):,}" if v else "",
                              "" if drop_of.get(key) is None else f"{drop_of[key]}"])
        w = [max(len(row[i]) for row in table) for i in range(len(hdr))]
        for i, row in enumerate(table):
            print("  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(row)))
            if i == 0:
                print("  ".join("-" * x for x in w))
        print("  same records: the rate over the log records (b) applied while its worker ran; drop: against (a) of the same repeat")
        for n in notes:
            print(n)
        for lb in lbs:
            ov = lb.get("backfill_overlap_of_drain")
            at = lb.get("backfill_at_caught_up", {})
            print(f'(b) #{lb["repeat"]}: backfill ran during {100 * ov:.0f}% of the drain (first assignment -> caught up); ' if ov is not None else f'(b) #{lb["repeat"]}: backfill overlap unknown; ', end="")
            print(f'status at caught-up: {at.get("status")} {at.get("done")}/{at.get("total")}; ', end="")
            print(f'backfill started at {lb.get("backfill_started_at_s")} s, finished at {lb.get("backfill_finished_at_s")} s, caught up at {lb["seconds"]} s after spawn')
        for r in las + sorted(lrs.values(), key=lambda r: r["repeat"]) + lbs:
            print(f'({r["mode"]}) #{r["repeat"]}: partition {r["big_partition"]} ($BIG + live) caught up at {r["big_partition_caught_up_at_s"]} s, the other partitions by {r["other_partitions_caught_up_at_s"]} s (first poll that saw each)')
        if drops:
            d, ci = med(drops), median_ci(drops)
            print(f'drop on the same records, median of {len(drops)}: {d}% '
                  + (f'(95% interval of the median {ci[0]}..{ci[1]}%) ' if ci else "(too few repeats for a 95% interval of the median) ")
                  + f'(runs: {", ".join(str(x) for x in drops)}; goal <= {GOAL_DROP:.0f}%: {"met" if d <= GOAL_DROP else "NOT met"})')
            s["live_drop_pct_same_records"] = d
            s["live_drop_pct_same_records_ci95"] = ci
            s["live_drop_pct_same_records_runs"] = drops
            s["live_drop_same_records_goal_met"] = d <= GOAL_DROP
        if costs:
            print(f'of which the ready function\'s own cost, median: {med(costs)}% (runs: {", ".join(str(x) for x in costs)}); '
                  f'the backfill beside it: {med(drops_ready)}% (runs: {", ".join(str(x) for x in drops_ready)})')
            s["function_ready_cost_pct"] = med(costs)
            s["function_ready_cost_pct_runs"] = costs
            s["live_drop_vs_ready_pct"] = med(drops_ready)
            s["live_drop_vs_ready_pct_runs"] = drops_ready
        steady = lambda rs: statistics.median(r.get("steady_records_per_s", r["records_per_s"]) for r in rs)
        whole = lambda rs: statistics.median(r["records_per_s"] for r in rs)
        drop = pct(steady(lbs), steady(las))
        ovs = [r["backfill_overlap_of_drain"] for r in lbs if r.get("backfill_overlap_of_drain") is not None]
        s.update({"repeats": len(lbs),
                  "live_records_per_s_without_backfill": round(steady(las)), "live_records_per_s_with_backfill": round(steady(lbs)),
                  "live_drop_pct": drop, "live_drop_pct_whole_run": pct(whole(lbs), whole(las)),
                  "backfill_overlap_of_drain": statistics.median(ovs) if ovs else None,
                  "live_drop_goal_met": drop is not None and drop <= GOAL_DROP})
    if b == "sqlite" and bfs:
        s["backfill_goal_met"] = (bfs[0].get("worker_records_per_s") or bfs[0]["records_per_s"]) >= GOAL_BACKFILL_SQLITE
    doc["summary"][b] = s
json.dump(doc, open(sys.argv[2], "w"), indent=2)
print()
print(f"JSON: {sys.argv[2]}")
EOF
