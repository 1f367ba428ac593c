#!/usr/bin/env bash
# Sluice's main job end to end on the embedded default: starts a local Kafka broker,
# creates the topics, runs one `sluice process` replica on a SQLite sysdb, produces a
# demo workload, waits until every partition is materialized, and prints the status.
#
#   scripts/demo.sh [--records N] [--release]
#
# It builds the unoptimized binary of the `demo` profile (Cargo.toml: the dev profile
# without debug info and without the optimized WebAssembly compiler the tests need), the
# quickest to compile from scratch: at the demo's 20,000 records speed is not the point.
# --release builds and runs the optimized binary (what to deploy and benchmark,
# BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
records=20000
profile=dev
while (($#)); do
    case "$1" in
        --records) records="$2"; shift 2 ;;
        --release) profile=release; shift ;;
        *) echo "usage: scripts/demo.sh [--records N] [--release]" >&2; exit 2 ;;
    esac
done
step() { printf '\n== %s\n' "$*"; }

step "installing what the build needs; starting the local Kafka broker while sluice builds"
deploy/local/deps.sh --build
# The broker starts (on a fresh machine: its jars fetched first) beside the build, which is
# most of a first run's time; its output is printed once both are done.
mkdir -p .local/demo
broker_log=.local/demo/broker-start.log
deploy/local/kafka.sh start >"$broker_log" 2>&1 &
broker=$!
if [[ "$profile" == release ]]; then
    step "building sluice (release)"
    cargo build --release --locked --bin sluice
    sluice="${CARGO_TARGET_DIR:-target}/release/sluice"
else
    step "building sluice (demo profile: unoptimized, the quickest first build; --release for speed)"
    cargo build --locked --profile demo --bin sluice
    sluice="${CARGO_TARGET_DIR:-target}/demo/sluice"
fi
step "the local Kafka broker"
if ! wait "$broker"; then
    cat "$broker_log" >&2
    echo "demo.sh: the local Kafka broker did not start (its output above; deploy/local/kafka.sh logs)" >&2
    exit 1
fi
cat "$broker_log"

run_dir=".local/demo/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir"
export SLUICE_BROKERS="$(deploy/local/kafka.sh bootstrap)"
export SLUICE_TOPIC_PREFIX="demo-$(date +%s)"
export SLUICE_GROUP="$SLUICE_TOPIC_PREFIX"
export SLUICE_SYSDB="sqlite://$PWD/$run_dir/sysdb.db"
export SLUICE_HTTP="${SLUICE_HTTP:-127.0.0.1:9464}"

step "sluice init (topics $SLUICE_TOPIC_PREFIX.log/.backfill/.dlq, sysdb $SLUICE_SYSDB)"
$sluice init --partitions 4

step "starting a replica: sluice process (log: $run_dir/process.log)"
$sluice process 2>"$run_dir/process.log" &
replica=$!
trap 'kill -TERM $replica 2>/dev/null || true; wait $replica 2>/dev/null || true' EXIT

step "producing $records log records (16 collections, 64-dim embeddings; 70% upsert, 20% update, 10% delete)"
$sluice workload --records "$records" --collections 16 --dim 64 --ids-per-collection 500 >"$run_dir/workload.jsonl"
time $sluice produce "$run_dir/workload.jsonl"

wait_caught_up() {
for _ in $(seq 1 240); do
    if $sluice offsets show --format json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
sys.exit(0 if rows and all(r["lag"] == 0 and r["sysdb_next_offset"] == r["high_watermark"] for r in rows) else 1)'; then
        break
    fi
    sleep 0.5
done
}
step "waiting until every partition is materialized (lag 0)"
wait_caught_up

step "sluice collections list"
$sluice collections list
step "first 2 records of collection-0: sluice records collection-0"
$sluice records collection-0 --format jsonl | head -2 | cut -c1-200
step "attaching functions to collection-0 (they backfill over its existing records while live processing goes on)"
$sluice functions attach collection-0 --function record_counter --output collection-0-count
$sluice functions attach collection-0 --function statistics --output collection-0-stats
more="$run_dir/more.jsonl"
$sluice workload --records 2000 --collections 16 --dim 64 --ids-per-collection 500 --seed 7 >"$more"
$sluice produce "$more"
for _ in $(seq 1 240); do
    if $sluice functions list --format json | python3 -c '
import json, sys
sys.exit(0 if all(f["status"] == "ready" for f in json.load(sys.stdin)) else 1)'; then
        break
    fi
    sleep 0.5
done
step "sluice functions list"
$sluice functions list
step "sluice records collection-0-count   (record_counter: live records of collection-0)"
$sluice records collection-0-count
step "first 3 records of collection-0-stats   (statistics: records per metadata key/value)"
$sluice records collection-0-stats --format jsonl | head -3
wait_caught_up
# The group offset is committed after the sysdb (at most once a second) and the replica
# reads it back for its gauges every 5 s: wait until the gauges show the last commit, so
# that the metrics below and `offsets show` describe the same moment.
metrics_agree() {
    curl -s "http://$SLUICE_HTTP/metrics" | python3 -c '
import re, sys
v = {}
for line in sys.stdin:
    m = re.match(r"sluice_partition_(sysdb_next_offset|group_offset|lag_records)\{partition=\"(\d+)\"\} (-?\d+)", line)
    if m:
        v.setdefault(m[2], {})[m[1]] = int(m[3])
ok = v and all(p.get("group_offset") == p.get("sysdb_next_offset") and p.get("lag_records") == 0 for p in v.values())
sys.exit(0 if ok else 1)'
}
for _ in $(seq 1 30); do metrics_agree && break; sleep 0.5; done
step "sluice offsets show   (sysdb = authoritative, group = lagging copy, lag = high watermark - sysdb)"
$sluice offsets show
step "metrics: curl http://$SLUICE_HTTP/metrics   (per-partition sysdb, group, lag: the same numbers)"
curl -s "http://$SLUICE_HTTP/metrics" | grep -E '^sluice_partition_(sysdb_next_offset|group_offset|lag_records)' | sort -t'"' -k2,2n -s | head -12 || true
if deploy/local/prometheus.sh status >/dev/null 2>&1; then
    echo "Prometheus is running: $(deploy/local/prometheus.sh url) (add this replica with: deploy/local/prometheus.sh targets $SLUICE_HTTP)"
fi

kill -TERM $replica
wait $replica && echo "replica stopped cleanly (exit 0)"
trap - EXIT
printf '\nsysdb: %s\nreplica log: %s\nKafka logs: deploy/local/kafka.sh logs\n' "$SLUICE_SYSDB" "$run_dir/process.log"
