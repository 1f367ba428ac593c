#!/usr/bin/env bash
# Baseline throughput of `sluice process` against the raw-consume ceiling, in ONE run,
# over loopback only:
#
#   1. builds the release binary; checks that the local Kafka and PostgreSQL are up
#      (starts nothing: it prints the start command and fails);
#   2. produces the synthetic workload once (`sluice workload | sluice produce -`) to a
#      fresh topic prefix `bench-<random>`; records the produce time and the total bytes;
#   3. raw-consume ceiling on that topic: Kafka's consumer-perf-test (fresh group) and
#      `kcat -C -e -o beginning -q > /dev/null`, each draining all N records;
#   4. `sluice process` on SQLite (fresh file) and on PostgreSQL (fresh database), each
#      with a fresh group: polls `sluice offsets show --format json` every 0.5 s until
#      every partition has lag 0 and sysdb_next_offset == high_watermark, then SIGTERM;
#   5. prints a table and writes it as JSON to target/bench/baseline-<date>.json (the
#      replicas' JSON logs are kept beside it as baseline-<date>-sluice-<sysdb>.log).
#
# Usage: scripts/bench-baseline.sh [--records N] [--partitions P] [--dim D]
#            [--collections C] [--ids-per-collection K] [--seed S]
#            [--pin CPUS] [--config FILE] [--phase-timeout SECONDS]
#
#   defaults: 1,000,000 records, 8 partitions, 384 dims, 64 collections, 1000 ids per
#   collection, seed 42, unpinned, sluice's default config, 1200 s per phase.
#   --pin CPUS   run every contender (consumer-perf-test, kcat, sluice process) under
#                `taskset -c CPUS`; the broker, PostgreSQL and the poller stay unpinned.
#   --config     a sluice TOML file ([processor] batch_* etc.) used by `sluice process`.
#
# How things are measured (also written into the JSON):
#   bytes      sum over all records of key length + value length, from
#              `kcat -C -e -f '%K %S\n'` (the same quantity consumer-perf-test counts);
#              MB = 2^20 bytes, like consumer-perf-test. The size of the topic's *.log
#              segment files (batch headers included) is recorded beside it.
#   seconds    consumer-perf-test: its own elapsed time (from its CSV: nMsg.sec) and,
#              separately, the wall time of the whole JVM run; kcat: wall time of the
#              process; sluice: from spawn to the end of the first poll that saw it
#              caught up (an upper bound, poll period 0.5 s + the poll's own run time).
#              `assign_s` = spawn -> first `partition starts` log line (JSON log
#              timestamp); `steady_rec_s` = records / (seconds - assign_s).
#   CPU        utime+stime: of the sluice process from /proc/<pid>/stat at caught-up
#              (before SIGTERM, so shutdown is excluded); of the other tools from
#              /usr/bin/time (whole run, JVM start included). Broker CPU (and PostgreSQL
#              server CPU for the postgres contender) over the same interval are
#              recorded as extra columns, since they do part of the work.
#   peak RSS   VmHWM of the sluice process at caught-up; %M of /usr/bin/time otherwise.
# Everything created (topics, consumer groups, the PostgreSQL database, temp files) is
# removed on exit, also on failure or Ctrl-C.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

RECORDS=1000000
PARTITIONS=8
DIM=384
COLLECTIONS=64
IDS=1000
SEED=42
PIN=""
CONFIG=""
PHASE_TIMEOUT=1200
POLL_S=0.5

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
while (($#)); do
    case "$1" in
    --records) RECORDS="${2:?}"; shift 2 ;;
    --partitions) PARTITIONS="${2:?}"; shift 2 ;;
    --dim) DIM="${2:?}"; shift 2 ;;
    --collections) COLLECTIONS="${2:?}"; shift 2 ;;
    --ids-per-collection) IDS="${2:?}"; shift 2 ;;
    --seed) SEED="${2:?}"; shift 2 ;;
    --pin) PIN="${2:?}"; shift 2 ;;
    --config) CONFIG="$(realpath "${2:?}")"; shift 2 ;;
    --phase-timeout) PHASE_TIMEOUT="${2:?}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
for v in RECORDS PARTITIONS DIM COLLECTIONS IDS SEED PHASE_TIMEOUT; do
    is_uint "${!v}" || die "--${v,,} must be a non-negative integer, got '${!v}'"
done
((RECORDS > 0 && PARTITIONS > 0)) || die "--records and --partitions must be > 0"
[[ -z "$CONFIG" || -f "$CONFIG" ]] || die "--config $CONFIG: no such file"

# ------------------------------------------------------------------ prerequisites ----
for tool in cargo kcat jq python3 psql taskset timeout awk; do
    command -v "$tool" >/dev/null || die "'$tool' is missing (Debian: apt-get install -y kcat jq python3 postgresql-client util-linux coreutils)"
done
[[ -x /usr/bin/time ]] || die "/usr/bin/time is missing: apt-get install -y time"

KAFKA_SH="$REPO/deploy/local/kafka.sh"
KTOOL="$REPO/deploy/local/kafka-tool.sh"
PG_SH="$REPO/deploy/local/postgres.sh"
"$KAFKA_SH" status --brokers 1 >/dev/null 2>&1 || die "Kafka is not running: start it with deploy/local/kafka.sh start"
"$PG_SH" status >/dev/null 2>&1 || die "PostgreSQL is not running: start it with deploy/local/postgres.sh start"
BS="$("$KAFKA_SH" bootstrap --brokers 1)"
for hp in ${BS//,/ }; do
    case "${hp%:*}" in
    127.0.0.1 | localhost | '[::1]') ;;
    *) die "bootstrap '$BS' is not loopback; this benchmark runs over loopback only" ;;
    esac
done
PG_ADMIN_URL="$("$PG_SH" url sluice)"
[[ "$PG_ADMIN_URL" == postgres://*@127.0.0.1:* ]] || die "PostgreSQL url '$PG_ADMIN_URL' is not loopback"
BROKER_PID="$(cat "$REPO/.local/kafka/run/brokers-1/node-1/pid" 2>/dev/null || true)"
KAFKA_DATA="$(sed -n 's/^log\.dirs=//p' "$REPO/.local/kafka/run/brokers-1/node-1/server.properties" 2>/dev/null | head -1)"
PG_DATA="$REPO/.local/postgres/data"
PG_POSTMASTER="$(head -1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
CLK_TCK="$(getconf CLK_TCK)"
PIN_CMD=()
[[ -z "$PIN" ]] || PIN_CMD=(taskset -c "$PIN")

now() { date +%s.%N; }
# fsub A B -> A - B with 3 decimals
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
# CPU seconds (utime+stime) of one pid, 0 if gone.
pid_cpu() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }
    # fields after the ") " that closes comm: state is $1, utime $12, stime $13
    awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' <<<"$stat"
}
# CPU seconds of the PostgreSQL server: the postmaster and all its children.
pg_cpu() {
    [[ -n "$PG_POSTMASTER" ]] || { echo 0; return; }
    local total=0 p c
    for p in "$PG_POSTMASTER" $(pgrep -P "$PG_POSTMASTER" || true); do
        c="$(pid_cpu "$p")"
        total="$(awk -v a="$total" -v b="$c" 'BEGIN { printf "%.2f", a + b }')"
    done
    echo "$total"
}
broker_cpu() { if [[ -n "$BROKER_PID" ]]; then pid_cpu "$BROKER_PID"; else echo 0; fi; }

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
LOG_TOPIC="$PREFIX.log"
TOPICS=("$PREFIX.log" "$PREFIX.backfill" "$PREFIX.dlq")
GROUP_CPT="$PREFIX-cpt"
GROUP_SQLITE="$PREFIX-sqlite"
GROUP_PG="$PREFIX-pg"
PG_DB="bench_$RID"
PG_URL="${PG_ADMIN_URL%/*}/$PG_DB"
WORK="$(mktemp -d /tmp/sluice-bench.XXXXXX)"
SQLITE_URL="sqlite://$WORK/sysdb.sqlite"
SLUICE_PID=""

cleanup() {
    local rc=$?
    set +e
    if [[ -n "$SLUICE_PID" ]] && kill -0 "$SLUICE_PID" 2>/dev/null; then
        kill -TERM "$SLUICE_PID" 2>/dev/null
        for _ in $(seq 1 40); do kill -0 "$SLUICE_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SLUICE_PID" 2>/dev/null
    fi
    log "cleanup: topics ${TOPICS[*]}, groups $GROUP_CPT $GROUP_SQLITE $GROUP_PG, database $PG_DB, $WORK"
    for t in "${TOPICS[@]}"; do
        timeout 60 "$KTOOL" topics --bootstrap-server "$BS" --delete --if-exists --topic "$t" >/dev/null 2>&1
    done
    timeout 60 "$KTOOL" consumer-groups --bootstrap-server "$BS" --delete \
        --group "$GROUP_CPT" --group "$GROUP_SQLITE" --group "$GROUP_PG" >/dev/null 2>&1
    timeout 60 psql -q -X "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$PG_DB\" WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$WORK"
    log "total wall time $(fsub "$(now)" "$SCRIPT_T0") s (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

export SLUICE_BROKERS="$BS" SLUICE_TOPIC_PREFIX="$PREFIX" SLUICE_HTTP=""
if [[ -n "$CONFIG" ]]; then export SLUICE_CONFIG="$CONFIG"; else unset SLUICE_CONFIG; fi
unset SLUICE_LOG

COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)"
CPU_MODEL="$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
log "prefix $PREFIX, $RECORDS records, $PARTITIONS partitions, dim $DIM, $COLLECTIONS collections, commit $COMMIT, $(nproc) x $CPU_MODEL, pin: ${PIN:-none}"

RESULTS="$WORK/results.tsv" # contender records seconds cpu_s rss_kb assign_s extra_json
: >"$RESULTS"

# ------------------------------------------------------------------ 2. produce ------
log "sluice init --partitions $PARTITIONS (topics + SQLite schema)"
SLUICE_SYSDB="$SQLITE_URL" SLUICE_GROUP="$GROUP_SQLITE" timeout 120 "$SLUICE" init --partitions "$PARTITIONS" >&2

log "producing: sluice workload | sluice produce -"
cat >"$WORK/produce.sh" <<EOF
set -euo pipefail
"$SLUICE" workload --records $RECORDS --collections $COLLECTIONS --dim $DIM --ids-per-collection $IDS --seed $SEED \
  | SLUICE_SYSDB="$SQLITE_URL" "$SLUICE" produce -
EOF
t0="$(now)"
/usr/bin/time -f '%e %U %S %M' -o "$WORK/produce.time" timeout "$PHASE_TIMEOUT" bash "$WORK/produce.sh" 2>"$WORK/produce.log" ||
    { tail -20 "$WORK/produce.log" >&2; die "produce failed"; }
PRODUCE_S="$(fsub "$(now)" "$t0")"
tail -1 "$WORK/produce.log" >&2
read -r _ pu ps pm <"$WORK/produce.time"

log "counting records and bytes with kcat -f '%K %S'"
read -r N_MSGS KEY_BYTES VALUE_BYTES < <(timeout "$PHASE_TIMEOUT" kcat -C -b "$BS" -t "$LOG_TOPIC" -e -o beginning -q -f '%K %S\n' |
    awk '{ n++; if ($1 > 0) k += $1; if ($2 > 0) v += $2 } END { printf "%d %d %d\n", n, k, v }')
((N_MSGS == RECORDS)) || die "the log topic holds $N_MSGS records, expected $RECORDS"
TOTAL_BYTES=$((KEY_BYTES + VALUE_BYTES))
SEGMENT_BYTES=0
if [[ -n "$KAFKA_DATA" ]]; then
    # *.log segment files only (the .index/.timeindex files are preallocated, sparse)
    SEGMENT_BYTES="$(find "$KAFKA_DATA" -path "$KAFKA_DATA/$LOG_TOPIC-*" -name '*.log' -printf '%s\n' 2>/dev/null |
        awk '{ s += $1 } END { printf "%d\n", s }')"
fi
log "$N_MSGS records, $TOTAL_BYTES bytes key+value (keys $KEY_BYTES), log segments on disk $SEGMENT_BYTES bytes, produced in $PRODUCE_S s"
printf 'produce (workload|sluice produce)\t%s\t%s\t%s\t%s\t\t{}\n' "$RECORDS" "$PRODUCE_S" \
    "$(awk -v a="$pu" -v b="$ps" 'BEGIN { printf "%.2f", a + b }')" "$pm" >>"$RESULTS"

# ------------------------------------------------------------------ 3. raw ceiling --
log "consumer-perf-test --messages $RECORDS --group $GROUP_CPT"
t0="$(now)"
/usr/bin/time -f '%e %U %S %M' -o "$WORK/cpt.time" timeout "$PHASE_TIMEOUT" "${PIN_CMD[@]}" "$KTOOL" consumer-perf-test \
    --bootstrap-server "$BS" --topic "$LOG_TOPIC" --messages "$RECORDS" --group "$GROUP_CPT" --timeout 60000 \
    >"$WORK/cpt.out" 2>"$WORK/cpt.err" || { cat "$WORK/cpt.out" "$WORK/cpt.err" >&2; die "consumer-perf-test failed"; }
CPT_WALL="$(fsub "$(now)" "$t0")"
cat "$WORK/cpt.out" >&2
# start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
# rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
CPT_LINE="$(grep -E '^[0-9]{4}-' "$WORK/cpt.out" | tail -1)"
[[ -n "$CPT_LINE" ]] || die "cannot parse consumer-perf-test output"
IFS=',' read -r _ _ CPT_MB CPT_MBS CPT_N CPT_NS CPT_REB CPT_FETCH_MS CPT_FMBS CPT_FNS <<<"$CPT_LINE"
CPT_N="${CPT_N// /}"
((CPT_N >= RECORDS)) || die "consumer-perf-test consumed $CPT_N records, expected $RECORDS"
CPT_S="$(awk -v n="$CPT_N" -v r="$CPT_NS" 'BEGIN { printf "%.3f", n / r }')"
read -r _ cu cs cm <"$WORK/cpt.time"
printf 'kafka consumer-perf-test\t%s\t%s\t%s\t%s\t\t%s\n' "$CPT_N" "$CPT_S" \
    "$(awk -v a="$cu" -v b="$cs" 'BEGIN { printf "%.2f", a + b }')" "$cm" \
    "$(jq -cn --arg mb "$CPT_MB" --arg mbs "$CPT_MBS" --arg ns "$CPT_NS" --arg reb "$CPT_REB" --arg fms "$CPT_FETCH_MS" \
        --arg fmbs "$CPT_FMBS" --arg fns "$CPT_FNS" --arg wall "$CPT_WALL" \
        '{data_consumed_mb: ($mb|tonumber), mb_sec: ($mbs|tonumber), nmsg_sec: ($ns|tonumber), rebalance_ms: ($reb|tonumber),
          fetch_ms: ($fms|tonumber), fetch_mb_sec: ($fmbs|tonumber), fetch_nmsg_sec: ($fns|tonumber), jvm_wall_s: ($wall|tonumber),
          note: "seconds = data.consumed.in.nMsg / nMsg.sec (its own timer, group join included, JVM start excluded)"}')" >>"$RESULTS"

log "kcat -C -e -o beginning -q > /dev/null"
t0="$(now)"
/usr/bin/time -f '%e %U %S %M' -o "$WORK/kcat.time" timeout "$PHASE_TIMEOUT" "${PIN_CMD[@]}" \
    kcat -C -b "$BS" -t "$LOG_TOPIC" -e -o beginning -q >/dev/null 2>"$WORK/kcat.err" ||
    { cat "$WORK/kcat.err" >&2; die "kcat failed"; }
KCAT_S="$(fsub "$(now)" "$t0")"
read -r _ ku ks km <"$WORK/kcat.time"
printf 'kcat -C -e > /dev/null\t%s\t%s\t%s\t%s\t\t{}\n' "$RECORDS" "$KCAT_S" \
    "$(awk -v a="$ku" -v b="$ks" 'BEGIN { printf "%.2f", a + b }')" "$km" >>"$RESULTS"

# ------------------------------------------------------------------ 4. sluice -------
# all_caught_up SYSDB GROUP -> 0 when every partition has lag 0 and sysdb == high watermark
# and the high watermarks add up to RECORDS.
all_caught_up() {
    local out
    out="$(SLUICE_SYSDB="$1" SLUICE_GROUP="$2" timeout 30 "$SLUICE" offsets show --format json 2>"$WORK/poll.err")" || return 1
    jq -e --argjson n "$RECORDS" --argjson p "$PARTITIONS" \
        'length == $p and (map(.high_watermark) | add) == $n
         and all(.[]; .lag == 0 and .sysdb_next_offset == .high_watermark)' <<<"$out" >/dev/null
}

# run_sluice NAME SYSDB_URL GROUP
run_sluice() {
    local name="$1" url="$2" group="$3" logf="$WORK/sluice-$1.log"
    log "sluice process on $name (group $group)"
    SLUICE_SYSDB="$url" SLUICE_GROUP="$group" timeout 120 "$SLUICE" init --partitions "$PARTITIONS" >&2
    local b0 p0 t0 t1 polls=0
    b0="$(broker_cpu)"
    p0="$(pg_cpu)"
    t0="$(now)"
    SLUICE_SYSDB="$url" SLUICE_GROUP="$group" "${PIN_CMD[@]}" "$SLUICE" --log-format json process 2>"$logf" &
    SLUICE_PID=$!
    local deadline
    deadline="$(awk -v t="$t0" -v d="$PHASE_TIMEOUT" 'BEGIN { printf "%d", t + d }')"
    while :; do
        if ! kill -0 "$SLUICE_PID" 2>/dev/null; then
            tail -30 "$logf" >&2
            die "sluice process ($name) exited before catching up (log tail above)"
        fi
        polls=$((polls + 1))
        if all_caught_up "$url" "$group"; then
            t1="$(now)"
            break
        fi
        if (($(date +%s) > deadline)); then
            SLUICE_SYSDB="$url" SLUICE_GROUP="$group" "$SLUICE" offsets show >&2 || true
            tail -30 "$logf" >&2
            die "sluice process ($name) did not catch up within $PHASE_TIMEOUT s (offsets and log tail above)"
        fi
        sleep "$POLL_S"
    done
    local cpu rss b1 p1
    cpu="$(pid_cpu "$SLUICE_PID")"
    rss="$(awk '/^VmHWM:/ { print $2 }' "/proc/$SLUICE_PID/status")"
    b1="$(broker_cpu)"
    p1="$(pg_cpu)"
    local secs assign_ts assign_s=""
    secs="$(fsub "$t1" "$t0")"
    assign_ts="$(jq -r 'select(.fields.message == "partition starts") | .timestamp' "$logf" 2>/dev/null | head -1)"
    [[ -z "$assign_ts" ]] || assign_s="$(fsub "$(date -d "$assign_ts" +%s.%N)" "$t0")"
    kill -TERM "$SLUICE_PID"
    local ts rc=0 stop_s
    ts="$(now)"
    for _ in $(seq 1 120); do kill -0 "$SLUICE_PID" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$SLUICE_PID" 2>/dev/null; then
        tail -20 "$logf" >&2
        kill -KILL "$SLUICE_PID" 2>/dev/null || true
        wait "$SLUICE_PID" 2>/dev/null || true
        SLUICE_PID=""
        die "sluice process ($name) did not exit within 30 s of SIGTERM (log tail above)"
    fi
    wait "$SLUICE_PID" || rc=$?
    stop_s="$(fsub "$(now)" "$ts")"
    SLUICE_PID=""
    local errors warns materialized dlq
    errors="$(jq -c 'select(.level == "ERROR")' "$logf" 2>/dev/null | wc -l)"
    warns="$(jq -c 'select(.level == "WARN")' "$logf" 2>/dev/null | wc -l)"
    materialized="$(SLUICE_SYSDB="$url" SLUICE_GROUP="$group" timeout 60 "$SLUICE" collections list --format json | jq '[.[].records] | add // 0')"
    dlq="$(timeout 120 kcat -C -b "$BS" -t "$PREFIX.dlq" -e -o beginning -q -f 'x\n' 2>/dev/null | wc -l)"
    ((rc == 0)) || { tail -20 "$logf" >&2; log "WARNING: sluice process ($name) exited with $rc after SIGTERM"; }
    if ((errors > 0)); then
        log "$name: ERROR log lines (first 5):"
        jq -c 'select(.level == "ERROR")' "$logf" | head -5 >&2
    fi
    mkdir -p "$REPO/target/bench"
    cp "$logf" "$REPO/target/bench/baseline-$RUN_DATE-sluice-$name.log"
    log "$name: caught up in $secs s (first assignment at ${assign_s:-?} s, $polls polls), CPU $cpu s, peak RSS $rss kB, exit $rc after ${stop_s} s, $errors ERROR / $warns WARN log lines, $materialized live records, DLQ total $dlq"
    printf 'sluice process (%s)\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$RECORDS" "$secs" "$cpu" "$rss" "$assign_s" \
        "$(jq -cn --arg b "$(fsub "$b1" "$b0")" --arg p "$(fsub "$p1" "$p0")" --arg pg "$name" --argjson rc "$rc" \
            --arg stop "$stop_s" --argjson polls "$polls" --argjson e "$errors" --argjson w "$warns" \
            --argjson m "$materialized" --argjson dlq "$dlq" \
            '{broker_cpu_s: ($b|tonumber), exit_code: $rc, shutdown_s: ($stop|tonumber), polls: $polls,
              error_log_lines: $e, warn_log_lines: $w, live_records: $m, dlq_records_total: $dlq}
             + (if $pg == "postgres" then {postgres_server_cpu_s: ($p|tonumber)} else {} end)')" >>"$RESULTS"
}

run_sluice sqlite "$SQLITE_URL" "$GROUP_SQLITE"

log "createdb $PG_DB"
timeout 60 psql -q -X -v ON_ERROR_STOP=1 "$PG_ADMIN_URL" -c "CREATE DATABASE \"$PG_DB\"" >&2
run_sluice postgres "$PG_URL" "$GROUP_PG"

# ------------------------------------------------------------------ 5. report -------
mkdir -p "$REPO/target/bench"
OUT_JSON="$REPO/target/bench/baseline-$RUN_DATE.json"
SCRIPT_S="$(fsub "$(now)" "$SCRIPT_T0")"
python3 - "$RESULTS" "$OUT_JSON" <<EOF
import json, sys
results, out = sys.argv[1], sys.argv[2]
total_bytes = $TOTAL_BYTES
rows = []
for line in open(results):
    name, n, secs, cpu, rss, assign, extra = line.rstrip("\n").split("\t")
    n, secs, cpu, rss = int(n), float(secs), float(cpu), int(rss)
    r = {"contender": name, "records": n, "seconds": round(secs, 3),
         "records_per_s": round(n / secs, 1), "mb_per_s": round(total_bytes / 2**20 / secs, 2),
         "cpu_s": round(cpu, 2), "cpu_s_per_1m_records": round(cpu * 1e6 / n, 2),
         "peak_rss_mb": round(rss / 1024, 1)}
    if assign:
        r["assign_s"] = float(assign)
        r["steady_records_per_s"] = round(n / (secs - float(assign)), 1)
    r.update(json.loads(extra))
    rows.append(r)
cpt = next(r for r in rows if r["contender"].startswith("kafka consumer-perf-test"))["records_per_s"]
for r in rows:
    r["ratio_vs_cpt"] = round(r["records_per_s"] / cpt, 3)
doc = {
    "commit": "$COMMIT", "worktree_dirty": "$DIRTY" == "true",
    "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
    "machine": {"nproc": $(nproc), "cpu_model": "$CPU_MODEL", "mem_total_kb": $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo),
                "kernel": "$(uname -r)"},
    "pinning": ("contenders under taskset -c $PIN; broker, PostgreSQL and the poller unpinned" if "$PIN" else
                "nothing pinned: broker, PostgreSQL, the 0.5 s poller and the contender share all $(nproc) CPUs"),
    "workload": {"records": $RECORDS, "partitions": $PARTITIONS, "dim": $DIM, "collections": $COLLECTIONS,
                 "ids_per_collection": $IDS, "seed": $SEED, "topic": "$LOG_TOPIC",
                 "bytes_key_plus_value": total_bytes, "key_bytes": $KEY_BYTES, "value_bytes": $VALUE_BYTES,
                 "log_segment_bytes_on_disk": ${SEGMENT_BYTES:-0},
                 "bytes_method": "sum of kcat -f '%K %S' (key + value lengths); MB = 2^20 bytes"},
    "sluice_config": "${CONFIG:-defaults}",
    "kafka": "$BS (1 broker, KRaft, 4.1.1, loopback)", "postgres": "${PG_ADMIN_URL%/*}/<fresh db> (loopback)",
    "script_wall_s_before_cleanup": $SCRIPT_S,
    "rows": rows,
}
json.dump(doc, open(out, "w"), indent=2)
hdr = ["contender", "records", "seconds", "records/s", "MB/s", "CPU-s/1M", "peak RSS MB", "vs cpt", "assign s", "broker CPU-s", "pg CPU-s"]
table = [hdr]
for r in rows:
    table.append([r["contender"], str(r["records"]), f'{r["seconds"]:.2f}', f'{r["records_per_s"]:.0f}', f'{r["mb_per_s"]:.1f}',
                  f'{r["cpu_s_per_1m_records"]:.1f}', f'{r["peak_rss_mb"]:.0f}', f'{r["ratio_vs_cpt"]:.3f}',
                  f'{r["assign_s"]:.2f}' if "assign_s" in r else "", f'{r["broker_cpu_s"]:.1f}' if "broker_cpu_s" in r else "",
                  f'{r["postgres_server_cpu_s"]:.1f}' if "postgres_server_cpu_s" in r else ""])
w = [max(len(row[i]) for row in table) for i in range(len(hdr))]
print(f'commit {doc["commit"]}{" (dirty worktree)" if doc["worktree_dirty"] else ""}, {doc["machine"]["nproc"]} x {doc["machine"]["cpu_model"]}, {doc["pinning"]}')
print(f'workload: {$RECORDS} records, {$PARTITIONS} partitions, dim {$DIM}, {$COLLECTIONS} collections, {total_bytes} bytes key+value ({total_bytes/2**20:.1f} MB)')
for i, row in enumerate(table):
    print("  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(row)))
    if i == 0:
        print("  ".join("-" * x for x in w))
print(f"JSON: {out}")
EOF
