#!/usr/bin/env bash
# The read benchmark (docs/reading.md), on the local broker, SQLite sysdb:
#
#   1. builds the release binary; needs the local Kafka up (starts nothing: it prints the
#      start command and fails);
#   2. produces N W1-shaped records (384 dims, 64 collections of 1,000 ids; 70% upsert,
#      20% update, 10% delete) into a fresh topic of 8 partitions, once;
#   3. the cost of waiting readers: drains that topic from offset 0 with a replica (fresh
#      SQLite file, fresh group, HTTP on) alone (a) and with W readers waiting on it (b),
#      --repeats times, interleaved (a b a b ...). The W readers (scripts/bench/reads.py
#      waiters, 100 by default) each wait through `GET /api/v1/collections/C?at_least=`
#      for 20 offsets spread over one partition, one after the other, so W reads wait at
#      every moment of the drain and are woken by its commits. Time: spawn -> the first
#      poll (every 0.2 s) of the sysdb that finds every partition at the end of the log;
#      the rate is N / that time. The cost: median (b) rate against median (a) rate, with
#      the spread of (a) between repeats beside it;
#   4. produce -> read: a replica caught up on the topic while `sluice produce` adds W1
#      records paced at --rate records/s (default half the median (a) rate: the suite's
#      paced load), and a probe (reads.py probe) that every 50 ms writes one record
#      through `POST /api/v1/collections/read-probe/records` and reads its collection with
#      the answer's token (`GET ...?at_least=TOKEN`): the time from the POST's answer (the
#      produce acknowledged) to the GET's answer, p50 / p90 / p99 over 20 s after 3 s of
#      warm-up. Every GET must answer 200.
#
# With --pin and 2 CPUs or more the replica runs on CPU 1 (taskset), the broker, the
# producer and the clients on CPU 0.
#
# Usage: scripts/bench-reads.sh [--records N] [--waiters W] [--repeats K] [--rate R] [--pin]
#   defaults: 300,000 records, 100 waiters, 3 repeats.
# Output: the figures, and JSON in target/bench/reads-<date>.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
BENCH_TAG=reads
# shellcheck source=scripts/bench/lib.sh
source "$REPO/scripts/bench/lib.sh"

RECORDS=300000 WAITERS=100 REPEATS=3 RATE="" PIN=false PARTITIONS=8
while (($#)); do
    case "$1" in
    --records) RECORDS="${2:?}"; shift 2 ;;
    --waiters) WAITERS="${2:?}"; shift 2 ;;
    --repeats) REPEATS="${2:?}"; shift 2 ;;
    --rate) RATE="${2:?}"; shift 2 ;;
    --pin) PIN=true; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
for v in "$RECORDS" "$WAITERS" "$REPEATS"; do is_uint "$v" || die "not a number: $v"; done

bench_services_init
(exec 3<>/dev/tcp/127.0.0.1/"${BS##*:}") 2>/dev/null || die "no broker at $BS: start it with deploy/local/kafka.sh start"
log "building the release binary"
cargo build --release --locked --bin sluice >/dev/null 2>&1 || die "cargo build --release failed"
SLUICE="$REPO/target/release/sluice"
READS=(python3 "$REPO/scripts/bench/reads.py")
PIN_REPLICA=() PIN_TOOLS=()
if $PIN && (($(nproc) >= 2)); then PIN_REPLICA=(taskset -c 1) PIN_TOOLS=(taskset -c 0); fi

RID="$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
PREFIX="bench-reads-$RID"
WORK="$(mktemp -d /tmp/sluice-reads.XXXXXX)"
BG=()
cleanup() {
    local p
    for p in "${BG[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    bench_delete_topics "$PREFIX\\..*"
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
senv() { echo "SLUICE_BROKERS=$BS SLUICE_TOPIC_PREFIX=$PREFIX SLUICE_SYSDB=sqlite://$1 SLUICE_GROUP=$PREFIX-$2"; }
# shellcheck disable=SC2046
env $(senv "$WORK/init.db" init) "$SLUICE" init --partitions "$PARTITIONS" >/dev/null
log "producing $RECORDS W1-shaped records into $PREFIX.log"
"$SLUICE" workload --records "$RECORDS" --dim 384 --collections 64 --ids-per-collection 1000 --seed 42 |
    env $(senv "$WORK/init.db" init) "$SLUICE" produce - >/dev/null

# start_replica NAME -> REPLICA_PID, PORT, DB (HTTP up)
start_replica() {
    DB="$WORK/$1.db" PORT="$(free_port)"
    env $(senv "$DB" "$1") SLUICE_HTTP="127.0.0.1:$PORT" "${PIN_REPLICA[@]}" "$SLUICE" process 2>"$WORK/$1.log" &
    REPLICA_PID=$!
    BG+=("$REPLICA_PID")
}
wait_http() {
    local deadline=$(($(date +%s) + 60))
    until curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || { tail -20 "$WORK/$1.log" >&2; die "$1: no HTTP answer"; }
        sleep 0.05
    done
}
wait_caught_up() { # NAME TOTAL -> seconds since T0
    local deadline=$(($(date +%s) + 900))
    until [[ "$(sysdb_position "sqlite://$DB" "$PREFIX.log")" == "$PARTITIONS $2" ]]; do
        kill -0 "$REPLICA_PID" 2>/dev/null || { tail -20 "$WORK/$1.log" >&2; die "$1: the replica exited"; }
        (($(date +%s) < deadline)) || die "$1: not caught up within 900 s"
        sleep 0.2
    done
}
stop_replica() { kill -TERM "$REPLICA_PID"; wait "$REPLICA_PID" || true; }

TOKEN="$(env $(senv "$WORK/init.db" init) "$SLUICE" token latest)"
TOTAL="$RECORDS"
declare -a RATE_A RATE_B
for ((k = 1; k <= REPEATS; k++)); do
    for variant in a b; do
        name="drain-$variant-$k"
        t0="$(now)"
        start_replica "$name"
        wp=""
        if [[ "$variant" == b ]]; then
            wait_http "$name"
            "${PIN_TOOLS[@]}" "${READS[@]}" waiters --port "$PORT" --token "$TOKEN" --waiters "$WAITERS" --collection collection-0 \
                >"$WORK/$name.waiters.json" 2>"$WORK/$name.waiters.err" &
            wp=$!
            BG+=("$wp")
        fi
        wait_caught_up "$name" "$TOTAL"
        secs="$(fsub "$(now)" "$t0")"
        rate="$(awk -v n="$TOTAL" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')"
        extra=""
        if [[ -n "$wp" ]]; then
            wait "$wp" || true
            extra=" waiters: $(cat "$WORK/$name.waiters.json" 2>/dev/null || echo none) $(head -3 "$WORK/$name.waiters.err")"
            [[ "$(jq -r '.errors' "$WORK/$name.waiters.json" 2>/dev/null)" == 0 ]] || die "$name: waiting reads failed:$extra"
        fi
        stop_replica
        log "$name: $TOTAL records in $secs s = $rate records/s$extra"
        if [[ "$variant" == a ]]; then RATE_A+=("$rate"); else RATE_B+=("$rate"); fi
        rm -f "$DB" "$DB"-*
    done
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
MA="$(median "${RATE_A[@]}")" MB="$(median "${RATE_B[@]}")"
MINA="$(printf '%s\n' "${RATE_A[@]}" | sort -n | head -1)" MAXA="$(printf '%s\n' "${RATE_A[@]}" | sort -n | tail -1)"
COST="$(awk -v a="$MA" -v b="$MB" 'BEGIN { printf "%.1f", (a - b) * 100 / a }')"
SPREAD="$(awk -v lo="$MINA" -v hi="$MAXA" -v m="$MA" 'BEGIN { printf "%.1f", (hi - lo) * 100 / m }')"
log "drain alone: ${RATE_A[*]} records/s (median $MA, spread $SPREAD%); with $WAITERS waiting readers: ${RATE_B[*]} (median $MB): cost $COST%"

[[ -n "$RATE" ]] || RATE=$((${MA%.*} / 2))
name=probe
start_replica "$name"
wait_caught_up "$name" "$TOTAL"
wait_http "$name"
log "produce -> read: $name caught up; W1 records paced at $RATE records/s, a probe write + token read every 50 ms"
# shellcheck disable=SC2046
"$SLUICE" workload --records $((RATE * 30)) --dim 384 --collections 64 --ids-per-collection 1000 --seed 7 |
    "${PIN_TOOLS[@]}" "${READS[@]}" pace --rate "$RATE" |
    env $(senv "$WORK/init.db" init) "${PIN_TOOLS[@]}" "$SLUICE" produce - >/dev/null 2>"$WORK/paced.err" &
pp=$!
BG+=("$pp")
sleep 1
"${PIN_TOOLS[@]}" "${READS[@]}" probe --port "$PORT" --seconds 20 --warmup-s 3 >"$WORK/probe.json"
kill "$pp" 2>/dev/null || true
stop_replica
PROBE="$(cat "$WORK/probe.json")"
log "produce -> read at $RATE records/s: $PROBE"
[[ "$(jq -r .errors <<<"$PROBE")" == 0 ]] || die "probe reads failed: $PROBE"

mkdir -p target/bench
OUT="target/bench/reads-$(date -u +%Y-%m-%dT%H%M%SZ).json"
jq -n --arg commit "$(git rev-parse --short HEAD)" --argjson n "$RECORDS" --argjson w "$WAITERS" --argjson pin "$PIN" \
    --arg a "${RATE_A[*]}" --arg b "${RATE_B[*]}" --argjson ma "$MA" --argjson mb "$MB" --argjson cost "$COST" \
    --argjson spread "$SPREAD" --argjson rate "$RATE" --argjson probe "$PROBE" \
    '{commit: $commit, records: $n, waiters: $w, pinned: $pin,
      drain_alone: ($a | split(" ") | map(tonumber)), drain_with_waiters: ($b | split(" ") | map(tonumber)),
      median_alone: $ma, median_with_waiters: $mb, waiter_cost_pct: $cost, spread_alone_pct: $spread,
      produce_to_read: ($probe + {paced_rate: $rate})}' >"$OUT"
echo "JSON: $OUT"
