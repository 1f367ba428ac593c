#!/usr/bin/env bash
# Reads beside a paced load (issue 42, item 2): does a client paging through records
# disturb the processor? One `sluice` binary, SQLite sysdb, A/B interleaved A B A B ...:
#   A  `sluice process` caught up on a fresh topic while a paced producer writes W1's
#      records into it at a fixed rate (default 22,000 records/s, about half of the W1
#      drain rate on one pinned core of the 2-core dev machine) for a warm-up plus a
#      measured window (default 3 + 20 s);
#   B  the same, plus a reader client paging through every collection with
#      GET /api/v1/collections/{id}/records?limit=1000&after=... in a tight loop for the
#      whole paced run (scripts/bench/read_ab.py reader; its pages/s and records/s after
#      the warm-up are printed, and its page times and CPU).
# Per run: end-to-end latency p50/p99 of the records stamped after the warm-up, exactly
# like the suite's latency phase (scripts/bench/latency.py: the replica's debug JSON log
# line "batch committed" of the batch holding each record's offset minus the record's
# CreateTime from kcat); the sysdb commit duration p50/p99 (and mean) from the replica's
# sluice_sysdb_commit_duration_seconds histogram, the difference of two /metrics scrapes
# (after the warm-up, and at caught-up), interpolated within buckets like latency.py
# does (buckets 0.5, 1, 2.5, 5, 10, 25 ms ...: a p99 is only as sharp as its bucket);
# the writer's own work from its log (sluice::sysdb at debug: records-delta merges, WAL
# restart checkpoints, whole run); the replica's CPU seconds from pacing start to
# caught-up, beside the busy seconds of CPU 1 and CPU 0 (/proc/stat) over the same
# window: CPU 1 busy beyond the replica's own is something else on its core (the machine
# is shared; a run where that exceeds a tenth of its time is flagged NOISY). Every run must end caught up (`sluice offsets show`: lag 0 on every
# partition). The summary prints the median and the spread (min-max) of each side, and
# whether each B median lies within A's spread.
#
#   scripts/bench-read-ab.sh BIN [--rounds 4] [--rate 22000] [--warmup 3] [--seconds 20]
#                                [--page 1000] [--reader-pause-ms 0] [--keep]
#
# --reader-pause-ms N: the reader sleeps N ms after each page instead of asking for the
# next at once (a lighter reader, to tell CPU sharing from waiting on the writer).
#
# The records come from a W1-shaped source topic produced once per invocation (`sluice
# workload --collections 64 --dim 384 --ids-per-collection 1000 --seed 42 | sluice
# produce -`, 8 partitions, rate x (warm-up + seconds) records), copied by the suite's
# paced producer (sluice.peer.tools.Replay of bench/kafka-streams-peer, built with
# `mvn package` if its jar is missing; linger 5 ms; fresh CreateTimes). Each run has
# fresh topics, a fresh SQLite file and a consumer group of its own; its sysdb and
# topics are dropped once it is measured (--keep keeps the work folder with the logs and
# scrapes, and the source topic).
#
# Needs a broker (deploy/local/kafka.sh start). Pinning (with >= 2 CPUs): the replica
# under `taskset -c 1`; the broker JVM, the paced producer, the reader, kcat and this
# script on CPU 0 (the broker's affinity is restored at exit). Producing the source is
# unpinned. Everything created (work folder, topics, groups) is removed at exit when the
# script passes; after a failure it is kept and named.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
BENCH_TAG=read-ab
# shellcheck source=scripts/bench/lib.sh
source "$REPO/scripts/bench/lib.sh"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 && "$1" != -* ]] || usage
BIN="$(realpath "$1")"
shift
ROUNDS=4 RATE=22000 WARMUP_S=3 SECONDS_M=20 PAGE=1000 PAUSE_MS=0 KEEP=false
while (($#)); do
    case "$1" in
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --rate) RATE="${2:?}"; shift 2 ;;
    --warmup) WARMUP_S="${2:?}"; shift 2 ;;
    --seconds) SECONDS_M="${2:?}"; shift 2 ;;
    --page) PAGE="${2:?}"; shift 2 ;;
    --reader-pause-ms) PAUSE_MS="${2:?}"; shift 2 ;;
    --keep) KEEP=true; shift ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
for v in ROUNDS RATE WARMUP_S SECONDS_M PAGE PAUSE_MS; do is_uint "${!v}" || die "$v must be a whole number"; done
[[ -x "$BIN" ]] || die "no executable at $BIN"
for tool in java mvn kcat jq python3 sqlite3 taskset curl; do command -v "$tool" >/dev/null || die "'$tool' is missing"; done

PARTITIONS=8
NCPU="$(nproc)"
PIN=() SERVICE_CPU=""
if ((NCPU >= 2)); then PIN=(taskset -c 1) SERVICE_CPU=0; fi
RID="$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
BASE="readab-$RID"
WORK="$(mktemp -d /tmp/sluice-readab.XXXXXX)"
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
BG_PIDS=()
PASSED=false

"$REPO/deploy/local/kafka.sh" status --brokers 1 >/dev/null 2>&1 || die "no broker running: deploy/local/kafka.sh start"
bench_services_init
[[ -n "$BROKER_PID" ]] || log "WARNING: no broker pid file: the broker is not pinned"
export SLUICE_BROKERS="$BS" SLUICE_HTTP=""
unset SLUICE_CONFIG SLUICE_LOG SLUICE_GROUP SLUICE_SYSDB SLUICE_TOPIC_PREFIX

stop_pid() { # stop_pid PID [GRACE_S]: SIGTERM, then SIGKILL
    local pid="$1" grace="${2:-20}" i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 4; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$? p
    set +e
    trap - INT TERM
    for p in "${BG_PIDS[@]}"; do stop_pid "$p" 10; done
    bench_restore_affinity
    if $PASSED && ! $KEEP; then
        bench_delete_topics "$BASE-.*"
        mapfile -t groups < <(timeout 60 "$KTOOL" consumer-groups --bootstrap-server "$BS" --list 2>/dev/null | grep "^$BASE-" || true)
        bench_delete_groups "${groups[@]}"
        rm -rf "$WORK"
    else
        log "kept: work folder $WORK (logs, scrapes, sysdbs), topics $BASE-*, consumer groups $BASE-*"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ setup -----------
JAR="$REPO/bench/kafka-streams-peer/target/kafka-streams-peer.jar"
if [[ ! -f "$JAR" ]]; then
    log "building the paced producer (mvn package in bench/kafka-streams-peer)"
    mvn -q -f "$REPO/bench/kafka-streams-peer/pom.xml" package >"$WORK/mvn.log" 2>&1 || { tail -30 "$WORK/mvn.log" >&2; die "mvn package failed"; }
fi
REPLAY=(java -cp "$JAR" sluice.peer.tools.Replay --bootstrap "$BS")
sluice_env() { echo "SLUICE_TOPIC_PREFIX=$1" "SLUICE_SYSDB=$2" "SLUICE_GROUP=$3"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# wait_log FILE REGEX COUNT TIMEOUT_S [PID]: until FILE has COUNT lines matching REGEX
wait_log() {
    local f="$1" re="$2" n="$3" deadline pid="${5:-}" seen
    deadline=$(($(date +%s) + $4))
    while :; do
        seen=$(grep -c -E -e "$re" "$f" 2>/dev/null || true)
        ((${seen:-0} >= n)) && return 0
        [[ -z "$pid" ]] || kill -0 "$pid" 2>/dev/null || return 1
        (($(date +%s) <= deadline)) || return 1
        sleep 0.05
    done
}

SRC_N=$((RATE * (WARMUP_S + SECONDS_M)))
SRC="$BASE-src"
log "run $BASE: $("$BIN" --version), $NCPU CPUs, $ROUNDS rounds of A (no reader) and B (reader, limit $PAGE, pause $PAUSE_MS ms) at $RATE records/s for $WARMUP_S + $SECONDS_M s"
log "producing $SRC_N W1-shaped records into $SRC.log (unpinned)"
env $(sluice_env "$SRC" "sqlite://$WORK/src.db" "$SRC") "$BIN" init --partitions "$PARTITIONS" >/dev/null 2>&1 || die "init of the source failed"
"$BIN" workload --records "$SRC_N" --collections 64 --dim 384 --ids-per-collection 1000 --seed 42 |
    env $(sluice_env "$SRC" "sqlite://$WORK/src.db" "$SRC") "$BIN" produce - >"$WORK/produce.log" 2>&1 ||
    { tail -20 "$WORK/produce.log" >&2; die "producing the source failed"; }

# From here on this script and everything it starts run on CPU 0, the replica on CPU 1.
if [[ -n "$SERVICE_CPU" ]]; then
    taskset -p -c "$SERVICE_CPU" $$ >/dev/null
    if [[ -n "$BROKER_PID" ]]; then
        _save_affinity "$BROKER_PID"
        taskset -a -p -c "$SERVICE_CPU" "$BROKER_PID" >/dev/null 2>&1 || log "WARNING: cannot pin the broker to CPU $SERVICE_CPU"
    fi
    log "pinning: replica on CPU 1; broker, paced producer, reader, kcat and this script on CPU 0"
fi

# cpu_busy: busy seconds (user, nice, system, irq, softirq) of CPU 0 and CPU 1 so far, from
# /proc/stat: over a run, CPU 1's minus the replica's own is what else ran on its core.
cpu_busy() {
    awk -v t="$CLK_TCK" '$1 == "cpu0" || $1 == "cpu1" { printf "%.2f ", ($2 + $3 + $4 + $7 + $8) / t }' /proc/stat
}

# ------------------------------------------------------------------ one run ---------
# run VARIANT NAME: one paced run (B: with the reader); appends its JSON to RESULTS and
# prints its line.
run() {
    local variant="$1" name="$2"
    local prefix="$BASE-$name" url="sqlite://$WORK/$name.db" logf="$WORK/$name.log" port
    port="$(free_port)"
    env $(sluice_env "$prefix" "$url" "$prefix") timeout 300 "$BIN" init --partitions "$PARTITIONS" >/dev/null 2>&1 || die "$name: init failed"
    env $(sluice_env "$prefix" "$url" "$prefix") SLUICE_HTTP="127.0.0.1:$port" SLUICE_LOG="info,rdkafka=warn,sluice::processor=debug,sluice::sysdb=debug" \
        "${PIN[@]}" "$BIN" --log-format json process 2>"$logf" &
    local pid=$!
    BG_PIDS+=("$pid")
    wait_log "$logf" '"partition starts"' "$PARTITIONS" 60 "$pid" || { tail -20 "$logf" >&2; die "$name: the replica did not start"; }
    curl -fsS -o /dev/null "http://127.0.0.1:$port/metrics" || die "$name: no admin API on port $port"

    "${REPLAY[@]}" --from "$SRC.log" --to "$prefix.log" --rate "$RATE" --seconds "$((WARMUP_S + SECONDS_M))" \
        >"$WORK/$name-replay.out" 2>"$WORK/$name-replay.err" &
    local rp=$!
    BG_PIDS+=("$rp")
    wait_log "$WORK/$name-replay.err" 'pacing starts' 1 180 "$rp" || { cat "$WORK/$name-replay.err" >&2; die "$name: the paced producer did not start"; }
    local c0 b0 t0 s0 rd=""
    c0="$(pid_cpu "$pid")" b0="$(broker_cpu)" t0="$(now)" s0="$(cpu_busy)"
    if [[ "$variant" == B ]]; then
        python3 "$REPO/scripts/bench/read_ab.py" reader --url "http://127.0.0.1:$port" --limit "$PAGE" --warmup-s "$WARMUP_S" --pause-ms "$PAUSE_MS" \
            --stop-file "$WORK/$name.stop" >"$WORK/$name-reader.json" 2>"$WORK/$name-reader.err" &
        rd=$!
        BG_PIDS+=("$rd")
    fi
    sleep "$WARMUP_S"
    curl -fsS "http://127.0.0.1:$port/metrics" >"$WORK/$name.m0" || die "$name: cannot scrape /metrics after the warm-up"
    wait "$rp" || { cat "$WORK/$name-replay.err" >&2; die "$name: the paced producer failed"; }
    local paced_s
    paced_s="$(fsub "$(now)" "$t0")"
    if [[ -n "$rd" ]]; then
        touch "$WORK/$name.stop"
        wait "$rd" || { cat "$WORK/$name-reader.err" "$WORK/$name-reader.json" >&2; die "$name: the reader failed"; }
    fi
    local sent deadline=$(($(date +%s) + 120))
    sent="$(sed -n 's/.*sent=\([0-9]*\).*/\1/p' "$WORK/$name-replay.out")"
    until [[ "$(sysdb_position "$url" "$prefix.log")" == "$PARTITIONS $sent" ]]; do
        (($(date +%s) < deadline)) || die "$name: the replica did not catch up with the $sent paced records"
        sleep 0.1
    done
    curl -fsS "http://127.0.0.1:$port/metrics" >"$WORK/$name.m1" || die "$name: cannot scrape /metrics at caught-up"
    local c1 b1 s1
    c1="$(pid_cpu "$pid")" b1="$(broker_cpu)" s1="$(cpu_busy)"
    env $(sluice_env "$prefix" "$url" "$prefix") timeout 60 "$BIN" offsets show --format json >"$WORK/$name-offsets.json" 2>/dev/null &&
        jq -e --argjson n "$sent" '(map(.high_watermark) | add) == $n and all(.[]; .lag == 0 and .sysdb_next_offset == .high_watermark)' \
            "$WORK/$name-offsets.json" >/dev/null || { cat "$WORK/$name-offsets.json" >&2; die "$name: not caught up (lag > 0) by sluice offsets show"; }
    local rc=0
    kill -TERM "$pid"
    wait "$pid" || rc=$?
    ((rc == 0)) || die "$name: the replica exited with $rc after SIGTERM (log $logf)"
    grep -q '"level":"ERROR"' "$logf" && die "$name: ERROR lines in $logf"

    timeout 120 kcat -C -b "$BS" -t "$prefix.log" -e -o beginning -q -f '%p %o %T\n' >"$WORK/$name.ts"
    python3 "$REPO/scripts/bench/latency.py" --log "$logf" --timestamps "$WORK/$name.ts" --topic "$prefix.log" \
        --metrics "$WORK/$name.m1" --warmup-ms "$((WARMUP_S * 1000))" >"$WORK/$name-latency.json" ||
        die "$name: latency.py found no per-record latencies (or unmatched records): $(cat "$WORK/$name-latency.json")"
    python3 "$REPO/scripts/bench/read_ab.py" hist --before "$WORK/$name.m0" --after "$WORK/$name.m1" >"$WORK/$name-commit.json" ||
        die "$name: no commits in the commit histogram"
    python3 "$REPO/scripts/bench/read_ab.py" sqlite-events --log "$logf" >"$WORK/$name-sqlite.json"
    local reader='{}'
    [[ -z "$rd" ]] || reader="$(cat "$WORK/$name-reader.json")"
    jq -c -n --arg v "$variant" --arg name "$name" --argjson sent "$sent" --slurpfile lat "$WORK/$name-latency.json" \
        --slurpfile com "$WORK/$name-commit.json" --slurpfile ev "$WORK/$name-sqlite.json" --argjson rd "$reader" --arg cpu "$(fsub "$c1" "$c0")" \
        --arg bcpu "$(fsub "$b1" "$b0")" --arg paced "$paced_s" --argjson rate "$RATE" \
        --arg busy0 "$(fsub "${s1%% *}" "${s0%% *}")" --arg busy1 "$(fsub "$(cut -d' ' -f2 <<<"$s1")" "$(cut -d' ' -f2 <<<"$s0")")" \
        '{variant: $v, run: $name, rate: $rate, records: $sent, paced_s: ($paced|tonumber),
          e2e_p50_ms: $lat[0].p50_ms, e2e_p99_ms: $lat[0].p99_ms, e2e_n: $lat[0].n, e2e_whole_run: $lat[0].whole_run,
          e2e_histogram: $lat[0].histogram, records_per_batch: $lat[0].records_per_batch,
          commit_p50_ms: $com[0].p50_ms, commit_p99_ms: $com[0].p99_ms, commit_mean_ms: $com[0].mean_ms, commits: $com[0].count,
          merges_ms: $ev[0].merges.sum_ms, sqlite_events: $ev[0],
          cpu_s: ($cpu|tonumber), broker_cpu_s: ($bcpu|tonumber),
          cpu0_busy_s: ($busy0|tonumber), cpu1_busy_s: ($busy1|tonumber), cpu1_other_s: (($busy1|tonumber) - ($cpu|tonumber))}
         + (if $v == "B" then {reader_pages_per_s: $rd.steady_pages_per_s, reader_records_per_s: $rd.steady_records_per_s, reader_cpu_s: $rd.cpu_s, reader: $rd} else {} end)' \
        >>"$RESULTS"
    tail -1 "$RESULTS" | jq -r '"run \(.run): e2e p50 \(.e2e_p50_ms) p99 \(.e2e_p99_ms) ms (\(.e2e_n) records); commit p50 \(.commit_p50_ms) p99 \(.commit_p99_ms) mean \(.commit_mean_ms) ms (\(.commits) commits; delta merges \(.sqlite_events.merges.n) in \(.merges_ms) ms, WAL restarts \(.sqlite_events.wal_restarts.n) max \(.sqlite_events.wal_restarts.max_ms) ms); replica CPU \(.cpu_s) s (CPU 1 busy \(.cpu1_busy_s) s, CPU 0 \(.cpu0_busy_s) s); lag 0"
        + (if .cpu1_other_s > 0.1 * .paced_s then " [NOISY: \(.cpu1_other_s) s of other work on CPU 1]" else "" end)
        + (if .variant == "B" then "; reader after the warm-up \(.reader.steady_pages_per_s) pages/s, \(.reader.steady_records_per_s) records/s (whole run \(.reader.pages_per_s) pages/s), page p50 \(.reader.page_p50_ms) p99 \(.reader.page_p99_ms) ms, CPU \(.reader.cpu_s) s" else "" end)'
    # Each run's sysdb and topic hold the paced records (~1.7 kB each): dropped once measured.
    rm -f "$WORK/$name.db" "$WORK/$name.db-wal" "$WORK/$name.db-shm" "$WORK/$name.ts"
    bench_delete_topics "$prefix\\..*"
}

for i in $(seq 1 "$ROUNDS"); do
    run A "a$i"
    run B "b$i"
done
python3 "$REPO/scripts/bench/read_ab.py" summary --results "$RESULTS"
noisy="$(jq -s 'map(select(.cpu1_other_s > 0.1 * .paced_s)) | length' "$RESULTS")"
((noisy == 0)) || log "WARNING: $noisy runs shared CPU 1 with other work for more than a tenth of their time (NOISY above): the machine was not quiet"
log "$ROUNDS rounds at $RATE records/s, $WARMUP_S + $SECONDS_M s; every run ended caught up (lag 0)"
PASSED=true
