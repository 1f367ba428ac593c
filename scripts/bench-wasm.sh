#!/usr/bin/env bash
# What a WebAssembly function costs on live changes: W1 (384 dims, 64 collections, 8
# partitions) drained into a fresh SQLite sysdb three ways, interleaved round after round:
#
#   none    no function attached;
#   native  the built-in `record_counter` attached to every collection;
#   wasm    the C example `count_records` (examples/functions/c/count_records.c: the same
#           logic, delta for delta) attached to every collection.
#
# Each side has a log of its own with the same records (the same workload seed): its
# functions are attached first and their markers processed (each function `ready`, nothing
# to backfill), then the records are produced while no replica runs, so every record is a
# live change with the function applying. The sysdb as of that point is the side's seed;
# each run drains the side's log from a copy of it (online backup API) with a fresh
# consumer group, from spawn until lag 0. Reported per run: records/s and the replica's
# CPU seconds (user + system, /proc) per million records; per side the medians; and
# wasm against native: the rate ratio, the CPU ratio, and the function's own CPU per
# change in the pipeline (each side's CPU minus the side without a function: the call and
# what the processor does for any function's change). The call alone, without the drains'
# noise: `cargo test --release -p sluice --lib cost_of_the_c_example -- --ignored
# --nocapture`. The input collections' checksums must be equal across the three sides and
# the output collections' between native and wasm.
#
#   scripts/bench-wasm.sh [--records N] [--rounds R] [--pin] [--wasm FILE]
#       defaults: 300,000 records, 5 rounds; --pin runs each replica on CPU 1 (taskset)
#   BENCH_WASM_PERF=SIDE[,SIDE] records a perf profile of those sides' runs; BENCH_WASM_DEBUG=1
#   prints each run's /proc figures and keeps the work directory (both: for a diagnosis)
#
# Needs the release binary (cargo build --release --bin sluice), the example components
# (scripts/build-functions.sh) and a broker (deploy/local/kafka.sh start). The last line is
# `JSON: {...}` for the suite (scripts/bench-suite.sh). Topics are deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
BENCH_TAG=bench-wasm
# shellcheck source=scripts/bench/lib.sh
source "$REPO/scripts/bench/lib.sh"

N=300000
ROUNDS=5
PIN=()
WASM="$REPO/target/functions/count_records.wasm"
BIN="${SLUICE_BIN:-$REPO/target/release/sluice}"
while [[ $# -gt 0 ]]; do
    case "$1" in
    --records) N="${2:?}"; shift 2 ;;
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --pin) PIN=(taskset -c 1); shift ;;
    --wasm) WASM="$(realpath "${2:?}")"; shift 2 ;;
    *) echo "usage: $0 [--records N] [--rounds R] [--pin] [--wasm FILE]" >&2; exit 2 ;;
    esac
done
[[ -x "$BIN" ]] || die "no release binary at $BIN. Fix: cargo build --release --locked --bin sluice"
[[ -f "$WASM" ]] || die "no component at $WASM. Fix: scripts/build-functions.sh"
command -v jq >/dev/null || die "jq not found. Fix: apt-get install -y jq"

export SLUICE_BROKERS=${SLUICE_BROKERS:-127.0.0.1:9092}
export SLUICE_HTTP=
export SLUICE_CONFIG=/dev/null
DIR="$(mktemp -d /tmp/sluice-wasm-XXXXXX)"
RID="$(basename "$DIR" | tr -dc 'a-z0-9' | tail -c 6)"
PARTITIONS=8
WORKLOAD=(workload --collections 64 --dim 384 --ids-per-collection 1000 --seed 7)
SIDES=(none native wasm)
declare -A PREFIX
for s in "${SIDES[@]}"; do PREFIX[$s]="wasmbench-$RID-$s"; done
REPLICA=""

KTOOL="$REPO/deploy/local/kafka-tool.sh" BS="$SLUICE_BROKERS"
cleanup() {
    [[ -z "$REPLICA" ]] || kill -KILL "$REPLICA" 2>/dev/null || true
    for s in "${SIDES[@]}"; do bench_delete_topics "${PREFIX[$s]}\..*"; done
}
trap cleanup EXIT

sl() { # SIDE DB ARGS...: sluice on that side's log and sysdb
    local side="$1" db="$2"
    shift 2
    SLUICE_SYSDB="sqlite://$db" SLUICE_TOPIC_PREFIX="${PREFIX[$side]}" "$BIN" "$@"
}
lag_of() { # SIDE DB GROUP -> total lag, -1 while a partition has no sysdb position yet
    SLUICE_GROUP="$3" sl "$1" "$2" offsets show --format json 2>/dev/null |
        jq 'if length > 0 and all(.[]; .sysdb_next_offset != null) then map(.lag) | add else -1 end' 2>/dev/null ||
        echo -1
}

# The collections W1 writes to, from the same generator (names do not depend on N).
mapfile -t COLLECTIONS < <("$BIN" "${WORKLOAD[@]}" --records 20000 | jq -r .collection | sort -u)
[[ ${#COLLECTIONS[@]} == 64 ]] || die "expected 64 collections from the workload, got ${#COLLECTIONS[@]}"

# ------------------------------------------------------------------ seeds ----
seed() { # SIDE
    local side="$1" db="$DIR/$1.seed.db" c out
    sl "$side" "$db" init --partitions "$PARTITIONS" >"$DIR/$side.init.log" 2>&1 || die "init ($side) failed: $DIR/$side.init.log"
    if [[ "$side" != none ]]; then
        for c in "${COLLECTIONS[@]}"; do
            if [[ "$side" == native ]]; then
                out="$(sl "$side" "$db" functions attach "$c" --function record_counter --output "$c-count" --format json 2>>"$DIR/$side.attach.log")"
            else
                out="$(sl "$side" "$db" functions attach "$c" --wasm "$WASM" --output "$c-count" --format json 2>>"$DIR/$side.attach.log")"
            fi || die "attach to $c ($side) failed: $DIR/$side.attach.log"
            [[ "$(jq -r .marker <<<"$out")" == published ]] || die "the marker of $c ($side) was not published: $out"
        done
        # The markers are processed and the (empty) backfills done: every function ready.
        # (the binary itself in the background, not through `sl`: a function would run in a
        # subshell, and the TERM below would stop the subshell and leave the replica running)
        env SLUICE_GROUP="seed-$RID-$side" SLUICE_SYSDB="sqlite://$db" SLUICE_TOPIC_PREFIX="${PREFIX[$side]}" \
            "$BIN" process >"$DIR/$side.seed.log" 2>&1 &
        REPLICA=$!
        local deadline=$((SECONDS + 180))
        until [[ "$(sl "$side" "$db" functions list --format json | jq '[.[] | select(.status == "ready")] | length')" == 64 ]]; do
            kill -0 "$REPLICA" 2>/dev/null || die "the seed replica ($side) exited: $DIR/$side.seed.log"
            ((SECONDS < deadline)) || die "the functions ($side) were not ready within 180 s: $DIR/$side.seed.log"
            sleep 0.5
        done
        kill -TERM "$REPLICA"
        wait "$REPLICA" || true
        REPLICA=""
    fi
    "$BIN" "${WORKLOAD[@]}" --records "$N" | sl "$side" "$db" produce - >"$DIR/$side.produce.log" 2>&1 ||
        die "produce ($side) failed: $DIR/$side.produce.log"
}
for s in "${SIDES[@]}"; do
    log "seeding '$s': init, attach to 64 collections, $N records into ${PREFIX[$s]}.log"
    seed "$s"
done

# ------------------------------------------------------------------ runs ----
drain() { # SIDE RUN -> "records/s cpu_s_per_1M"
    local side="$1" run="$2" db="$DIR/$2.db" group="wasmbench-$RID-$2" start end cpu
    python3 -c 'import sqlite3, sys; s = sqlite3.connect(sys.argv[1]); d = sqlite3.connect(sys.argv[2]); s.backup(d); d.close()' \
        "$DIR/$side.seed.db" "$db"
    start=$(date +%s.%N)
    SLUICE_GROUP="$group" "${PIN[@]}" env SLUICE_SYSDB="sqlite://$db" SLUICE_TOPIC_PREFIX="${PREFIX[$side]}" \
        "$BIN" process >"$DIR/$run.log" 2>&1 &
    REPLICA=$!
    local perf=""
    if [[ -n "${BENCH_WASM_PERF:-}" && ",$BENCH_WASM_PERF," == *",$side,"* ]]; then # a profile of those sides' runs
        perf record -F 499 -g -p "$REPLICA" -o "$DIR/$run.perf.data" >/dev/null 2>&1 &
        perf=$!
    fi
    while :; do
        sleep 0.5
        [[ "$(lag_of "$side" "$db" "$group")" == 0 ]] && break
        kill -0 "$REPLICA" 2>/dev/null || die "run $run exited: $DIR/$run.log"
    done
    end=$(date +%s.%N)
    cpu="$(pid_cpu "$REPLICA")"
    [[ -z "$perf" ]] || { kill -INT "$perf"; wait "$perf" || true; }
    [[ -z "${BENCH_WASM_DEBUG:-}" ]] || { echo "debug $run: pid $REPLICA $(cat /proc/$REPLICA/stat | cut -d" " -f1-2,14-17)" >&2; }
    kill -TERM "$REPLICA"
    wait "$REPLICA" || true
    REPLICA=""
    # The input collections' checksum (every side), the output records (native, wasm): id
    # and metadata, not the version offset, which follows batch boundaries.
    {
        echo "inputs $(sl "$side" "$db" checksum)"
        if [[ "$side" != none ]]; then
            for c in "${COLLECTIONS[@]}"; do
                sl "$side" "$db" records "$c-count" --format jsonl | jq -c --arg c "$c" '{c: $c, id, metadata}'
            done
        fi
    } >"$DIR/$run.sums"
    rm -f "$db" "$db-wal" "$db-shm"
    python3 -c "import sys; n, s, c = $N, $end - $start, $cpu; print(f'{n / s:.0f} {c * 1e6 / n:.2f}')"
}

declare -A RATE CPU
for r in $(seq 1 "$ROUNDS"); do
    for s in "${SIDES[@]}"; do
        read -r rate cpu < <(drain "$s" "$s$r")
        RATE[$s]+="$rate "
        CPU[$s]+="$cpu "
        log "round $r, $s: $rate records/s, $cpu CPU-s per 1M records"
    done
done

# ------------------------------------------------------------------ checks ----
for run in "$DIR"/*.sums; do
    [[ "$(head -n 1 "$run")" == "$(head -n 1 "$DIR/none1.sums")" ]] || die "input collections differ: $run against none1"
done
for r in $(seq 1 "$ROUNDS"); do
    [[ "$(wc -l <"$DIR/native$r.sums")" == 65 ]] || die "native$r has not 64 output records: $DIR/native$r.sums"
    cmp -s "$DIR/native$r.sums" "$DIR/wasm$r.sums" ||
        die "the outputs of native$r and wasm$r differ: diff $DIR/native$r.sums $DIR/wasm$r.sums"
done
log "checksums: the inputs equal on every side, the outputs of native and wasm equal in every round"

python3 - "$N" "$ROUNDS" "${RATE[none]}" "${RATE[native]}" "${RATE[wasm]}" "${CPU[none]}" "${CPU[native]}" "${CPU[wasm]}" <<'EOF'
import json, statistics, sys
n, rounds = int(sys.argv[1]), int(sys.argv[2])
rate = {s: [float(x) for x in sys.argv[3 + i].split()] for i, s in enumerate(("none", "native", "wasm"))}
cpu = {s: [float(x) for x in sys.argv[6 + i].split()] for i, s in enumerate(("none", "native", "wasm"))}
med = lambda xs: statistics.median(xs)
row = {
    "records": n,
    "rounds": rounds,
    "backend": "sqlite",
    "records_per_s": rate,
    "cpu_s_per_1m": cpu,
    "median_records_per_s": {s: med(v) for s, v in rate.items()},
    "median_cpu_s_per_1m": {s: med(v) for s, v in cpu.items()},
}
m = row["median_cpu_s_per_1m"]
row["rate_ratio_wasm_vs_native"] = round(row["median_records_per_s"]["wasm"] / row["median_records_per_s"]["native"], 3)
row["cpu_ratio_wasm_vs_native"] = round(m["wasm"] / m["native"], 3)
# The function's own CPU per change: each side's CPU minus the side without a function.
fn_native = (m["native"] - m["none"]) / 1e6 * 1e6  # us per change = CPU-s per 1M
fn_wasm = (m["wasm"] - m["none"]) / 1e6 * 1e6
row["function_us_per_change"] = {"native": round(fn_native, 3), "wasm": round(fn_wasm, 3)}
row["function_cost_ratio"] = round(fn_wasm / fn_native, 2) if fn_native > 0 else None
# The same per round (each round's three runs ran one after the other): the spread.
row["function_cost_ratio_rounds"] = [
    round((w - z) / (nv - z), 2) if nv > z else None for z, nv, w in zip(cpu["none"], cpu["native"], cpu["wasm"])
]
print("%-8s %16s %20s" % ("side", "records/s (med)", "CPU-s per 1M (med)"))
for s in ("none", "native", "wasm"):
    print("%-8s %16.0f %20.2f" % (s, row["median_records_per_s"][s], m[s]))
print("wasm vs native: rate %.3fx, CPU %.3fx; the function's own CPU per change: native %.2f us, wasm %.2f us%s"
      % (row["rate_ratio_wasm_vs_native"], row["cpu_ratio_wasm_vs_native"], fn_native, fn_wasm,
         "" if row["function_cost_ratio"] is None else ", %.2fx (goal <= 1.5x)" % row["function_cost_ratio"]))
print("per round, the function's own cost wasm/native: %s" % ", ".join("-" if r is None else "%.2fx" % r for r in row["function_cost_ratio_rounds"]))
print("JSON: " + json.dumps(row))
EOF
[[ -n "${BENCH_WASM_DEBUG:-}" ]] && { log "kept $DIR (the topics are deleted)"; exit 0; }
rm -rf "$DIR"
