#!/usr/bin/env bash
# A/B of two `sluice` binaries on one pre-produced W1-shaped log (384 dims, 64
# collections, 8 partitions), each draining it into a fresh SQLite sysdb, alternating
# A B A B ... so that both see the same machine state. Prints records/s per run and the
# median of each side; the same checksum is required of every run.
#
#   scripts/bench-ab.sh BIN_A BIN_B [RECORDS] [ROUNDS]     # defaults: 300000 records, 2 rounds
#
# The same binary with two configurations: AB_CONFIG_A / AB_CONFIG_B name a TOML config
# file for that side (SLUICE_CONFIG). AB_PREFIX reuses a log produced by an earlier run
# (its prefix is printed), so that a series of A/Bs drains the same records (each run
# with a consumer group of its own: a group with committed offsets would start at them).
# In a config file, @RUN@ is replaced by the run's name (a1, b1, a2, ...) and this
# invocation's id: a side that turns the change feed on gives each run a topic of its
# own with `topic_suffix = "changes-@RUN@"` (a fresh sysdb must not meet the progress
# topic of another run, which says its changes were published already); each run's
# `sluice init` with its config creates that topic first.
#
# AB_BACKEND=postgres drains into a fresh PostgreSQL database per run (on the local
# cluster, deploy/local/postgres.sh start; dropped after the run) instead of SQLite.
#
# Needs a broker (deploy/local/kafka.sh start). The consumer is pinned to CPU 1 when
# taskset exists, like the suite's contenders; AB_PIN=0 leaves it free to use every core
# (what a deployment with more than one core sees: the change feed's producers are
# threads of their own).
set -euo pipefail
A=${1:?usage: $0 BIN_A BIN_B [RECORDS] [ROUNDS]}
B=${2:?usage: $0 BIN_A BIN_B [RECORDS] [ROUNDS]}
N=${3:-300000}
ROUNDS=${4:-2}
export SLUICE_BROKERS=${SLUICE_BROKERS:-127.0.0.1:9092}
export SLUICE_HTTP=
dir=$(mktemp -d /tmp/sluice-ab-XXXXXX)
prefix=${AB_PREFIX:-ab-$(basename "$dir" | tr -dc 'a-z0-9' | tail -c 8)}
pin=()
[ "${AB_PIN:-1}" = 0 ] || { command -v taskset >/dev/null && pin=(taskset -c 1); }

if [ -z "${AB_PREFIX:-}" ]; then
    echo "bench-ab: producing $N W1-shaped records into $prefix.log"
    SLUICE_SYSDB="sqlite://$dir/init.db" SLUICE_TOPIC_PREFIX=$prefix "$B" init --partitions 8 >/dev/null 2>&1
    "$B" workload --records "$N" --collections 64 --dim 384 --ids-per-collection 1000 --seed 7 |
        SLUICE_SYSDB="sqlite://$dir/init.db" SLUICE_TOPIC_PREFIX=$prefix "$B" produce - >/dev/null 2>&1
else
    echo "bench-ab: draining the existing $prefix.log ($N records)"
fi

PG_ADMIN=""
if [ "${AB_BACKEND:-sqlite}" = postgres ]; then
    PG_ADMIN=$("$(dirname "$0")/../deploy/local/postgres.sh" url sluice)
fi
drain() { # BIN RUN CONFIG -> prints records/s, checks the checksum
    local bin=$1 run=$2 cfg=$3
    local db="sqlite://$dir/$run.db" pgdb="ab_${dir##*-}_$run"
    local start end
    if [ -n "$cfg" ]; then
        sed "s/@RUN@/$run-${dir##*-}/g" "$cfg" >"$dir/$run.toml"
        cfg="$dir/$run.toml"
    fi
    if [ -n "$PG_ADMIN" ]; then
        pgdb=$(echo "$pgdb" | tr 'A-Z' 'a-z')
        psql -q -X -v ON_ERROR_STOP=1 "$PG_ADMIN" -c "CREATE DATABASE \"$pgdb\"" >&2
        db="${PG_ADMIN%/*}/$pgdb"
    fi
    env ${cfg:+SLUICE_CONFIG=$cfg} SLUICE_SYSDB=$db SLUICE_TOPIC_PREFIX=$prefix "$bin" init --partitions 8 >"$dir/$run.init.log" 2>&1 ||
        { echo "bench-ab: init for $run failed; log $dir/$run.init.log" >&2; exit 1; }
    start=$(date +%s.%N)
    env ${cfg:+SLUICE_CONFIG=$cfg} SLUICE_SYSDB=$db SLUICE_TOPIC_PREFIX=$prefix SLUICE_GROUP="$prefix-$run-${dir##*-}" "${pin[@]}" "$bin" process >"$dir/$run.log" 2>&1 &
    local pid=$!
    while :; do
        sleep 0.5
        local lag
        # Each run's own binary reads its sysdb (an older binary's schema is older).
        # Caught up: lag 0 on every partition and, with the change feed on, nothing left
        # unpublished in its outbox (the feed's cost is counted to its end).
        lag=$(env ${cfg:+SLUICE_CONFIG=$cfg} SLUICE_SYSDB=$db SLUICE_TOPIC_PREFIX=$prefix SLUICE_GROUP="$prefix-$run-${dir##*-}" "$bin" offsets show --format json 2>/dev/null |
            python3 -c 'import json,sys; rows=json.load(sys.stdin); print(sum(r["lag"] + (r.get("changelog_unpublished") or 0) for r in rows) if rows and all(r["sysdb_next_offset"] is not None for r in rows) else -1)' 2>/dev/null || echo -1)
        [ "$lag" = 0 ] && break
        kill -0 $pid 2>/dev/null || { echo "bench-ab: $run exited; log $dir/$run.log" >&2; exit 1; }
    done
    end=$(date +%s.%N)
    kill -TERM $pid; wait $pid || true
    local sum
    sum=$(SLUICE_SYSDB=$db SLUICE_TOPIC_PREFIX=$prefix "$bin" checksum)
    echo "$sum" >>"$dir/checksums"
    [ -z "$PG_ADMIN" ] || psql -q -X "$PG_ADMIN" -c "DROP DATABASE IF EXISTS \"$pgdb\" WITH (FORCE)" >/dev/null 2>&1 || true
    python3 -c "print(f'{$N/($end-$start):.0f}')"
}

declare -a ra rb
for i in $(seq 1 "$ROUNDS"); do
    a=$(drain "$A" "a$i" "${AB_CONFIG_A:-}"); echo "run A$i: $a records/s"; ra+=("$a")
    b=$(drain "$B" "b$i" "${AB_CONFIG_B:-}"); echo "run B$i: $b records/s"; rb+=("$b")
done
[ "$(sort -u "$dir/checksums" | wc -l)" = 1 ] || { echo "bench-ab: checksums differ: $(sort -u "$dir/checksums")" >&2; exit 1; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
ma=$(median "${ra[@]}"); mb=$(median "${rb[@]}")
echo "bench-ab: A $A median $ma records/s; B $B median $mb records/s; B/A = $(python3 -c "print(f'{$mb/$ma:.3f}')"); checksums equal"
# One line for scripts (the suite's changefeed phase reads it).
python3 -c "import json,sys; a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]; print('JSON: ' + json.dumps({'records': $N, 'rounds': $ROUNDS, 'backend': '${AB_BACKEND:-sqlite}', 'a_records_per_s': a, 'b_records_per_s': b, 'a_median': $ma, 'b_median': $mb, 'ratio': round($mb / $ma, 3)}))" "${ra[*]}" "${rb[*]}"
# The sysdbs take gigabytes; a failed run keeps them (and its logs) for inspection.
rm -rf "$dir"
