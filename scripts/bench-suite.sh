#!/usr/bin/env bash
# The benchmark suite, in one command, on the local single broker (tables, goals, JSON
# and an SVG chart of the run in target/bench/):
#
#   scripts/bench-suite.sh            # full run (about 25 minutes on the 2-core dev
#                                     # machine, the cold builds from a fresh clone included)
#   scripts/bench-suite.sh --quick    # every phase at 1/10 size: a smoke test (~5 minutes)
#
# Phases (each prints its wall time; the report ends with every goal, met or missed):
#   setup     deploy/local/deps.sh; starts Kafka (1 broker) and PostgreSQL if they are not
#             running (and stops them again at exit); builds `cargo build --release --bin
#             sluice` and the Kafka Streams peer (`mvn package`) side by side.
#   W1..W5    per workload: `sluice init` on fresh topics; pre-produces the log once
#             (`sluice workload | sluice produce -`); counts records and key+value bytes
#             (kcat); then drains that same topic with each contender, one at a time:
#               - raw-consume ceiling: Kafka's consumer-perf-test and `kcat -C -e`
#                 (W1, W2, W3);
#               - `sluice process` on SQLite (fresh file) and on PostgreSQL (fresh db);
#               - the Kafka Streams peer (bench/kafka-streams-peer, exactly_once_v2,
#                 RocksDB) on W1, W2, W3;
#             and compares the final-state checksums (`sluice checksum` on both sysdbs,
#             the peer's own line): any difference fails the suite.
#               W1  1M records, 384-dim embeddings, 64 collections (70% upsert, 20% update,
#                   10% delete; 1,000 ids per collection), 8 partitions
#               W2  125k records of 1536 dims (scaled: about half of W1's bytes)
#               W3  500k small records: no embedding, 3 metadata keys, a short document
#               W4  500k W1-shaped records over 80,000 collections (10,000 per partition),
#                   1 id per collection (~80k live ids, like W1's 64k); Sluice only
#               W5  500k W1-shaped records over 8 collections (one per partition) whose
#                   sysdbs are pre-seeded with SQL to 1.25M records each (10M rows; seeded
#                   rows are small: no embedding), the log's ids drawn from all 1.25M
#                   (scaled: collections of 1.25M, not 10M; Sluice only). Its two sysdbs
#                   are compared by a SQL digest of the stored rows (sysdb_digest), not
#                   `sluice checksum` (a minute per sysdb at 10M rows)
#             (W3-W5 at 500k records and W2 at 125k keep the whole run near 25 minutes;
#             the W4/W5 goals compare steady records/s, independent of the run length)
#   latency   after W1: Sluice (SQLite, then PostgreSQL) and the peer each run caught up on
#             a fresh topic while a paced producer (sluice.peer.tools.Replay, CPU 0, linger
#             5 ms: the clients' default) copies W1's records into it at 50% of that
#             contender's W1 steady records/s (first record -> caught up) for 3 + 20 s;
#             produce-to-materialized p50/p99 of the records stamped in the last 20 s (the
#             whole run's figures are kept beside them as "whole_run"/"all_"): the paced
#             producer is a JVM that starts sending at full rate on the broker's core, and
#             in its first second it falls behind its own schedule with records that
#             already carry their CreateTime (measured: with the topic set to
#             LogAppendTime, the broker received 9.5-12.5k instead of 28k records in that
#             second, and 42-48k in the next). Sluice then runs a second time on a topic
#             stamped with LogAppendTime: broker append -> materialized, its own share
#             without the producer's and the broker's delays (printed beside the goals,
#             which stay on CreateTime; SQLite only). Sluice: per record, the JSON-log time
#             of the "batch committed" line of the batch holding its offset (debug, logged
#             right after the sysdb commit) minus the record's CreateTime (kcat %T); the
#             sluice_end_to_end_latency_seconds histogram, interpolated within buckets, is
#             printed beside it. Peer: a read_committed consumer of its records changelog
#             (sluice.peer.tools.LatencyProbe): receive time minus the record's timestamp
#             (Streams keeps the input record's timestamp; under exactly_once_v2 the change
#             becomes visible when the transaction commits).
#   backfill  scripts/bench-backfill.sh --backends sqlite --no-statistics --repeats 15 --pin
#             on this run's broker: 300,000 records (--quick: 30,000, one repeat) into one
#             collection, materialized; record_counter attached with a replica running
#             (records / (attach -> finished)); then a live backlog of 4/5 of that drained
#             without a function, with the function ready, and with a backfill running,
#             15 times, interleaved (the drop on the same records: the median, with its
#             95% interval). With 2 CPUs or more each replica runs on CPU 1 and the
#             broker and the script on CPU 0. Its rows join this run's JSON and goals.
#             After record_counter the C component of its logic
#             (examples/functions/c/count_records.c) is backfilled too (function "wasm").
#   wasm      scripts/bench-wasm.sh --pin: 300,000 W1 records (--quick: 30,000, one round)
#             drained with no function, with record_counter on each of the 64 collections,
#             and with the C component of the same logic, 5 rounds interleaved: records/s,
#             CPU-s per 1M, and the function's own CPU per change (each side's minus the
#             side without a function). The goal: the component's <= 1.5x the native one's.
#   reads     after W1: scripts/bench-reads.sh --pin on this run's broker (its header): 300,000
#             W1-shaped records (--quick: 30,000, one repeat) drained on SQLite alone and
#             with 100 readers waiting on tokens (HTTP `at_least`), 3 times interleaved: the
#             drain rate's drop against the spread of the drain alone; then the time from a
#             write's acknowledgement (`POST .../records`) to its token read answering, p50
#             / p99, at half the W1 SQLite rate of this run.
#   changefeed after W1: the change feed's cost (docs/changes.md). scripts/bench-ab.sh on W1's
#             log with one binary, A with the feed off and B with `[changelog] enabled` (each
#             B run publishing to a topic of its own), 3 rounds interleaved (--quick: 1), on
#             SQLite and on PostgreSQL: records/s to lag 0 and, for B, nothing left
#             unpublished. The goal: B >= 0.8x A on each backend.
#   recovery  Sluice (SQLite) caught up under the paced load at 50%, kill -9, restart at
#             once: restart -> first "batch committed" log line (or, without it, the
#             sysdb position moving, polled every 50 ms), with the default
#             configuration (the dead member holds its partitions until
#             session.timeout.ms, 45 s) and with static membership ([kafka]
#             instance_id, i.e. group.instance.id). Rebuild from offset 0 per 1M
#             records = W1 drain time scaled to 1M records.
#   page      a full run (not --quick, every workload and phase, the peer on W1-W3 with
#             the JVM's defaults, no --no-page) whose checksums all match becomes the
#             latest run of BENCHMARKS.md: its JSON and chart are copied into docs/bench/
#             as suite-<UTC date>-<commit>.json/.svg (-dirty appended for a dirty
#             worktree), `scripts/bench/report.py --write-page BENCHMARKS.md` writes the
#             run's facts and goal table between the page's suite-table markers (the
#             prose around them stays), and the previous suite-*.json/.svg in docs/bench/
#             are removed (git keeps them; docs/bench/history.md is the diary). Commit the
#             three files. Any other run leaves the page and docs/bench/ alone.
#
# Pinning (stated in the output and the JSON): with >= 2 CPUs, the broker JVM, the
# PostgreSQL server (postmaster and children) and this script with everything it runs
# besides the contender (pollers, paced producer, latency probe) on CPU 0, the contender
# under `taskset -c 1` during each measured phase. Producing, seeding and checksums use all
# CPUs (not measured). Affinities are restored on exit.
#
# How contenders are measured:
#   seconds   sluice: spawn -> first poll (every 0.2 s, straight from the sysdb's
#             partitions table) that sees every partition's next_offset at the end of
#             the log. peer: JVM start -> its own poll (every 0.1 s) of the group's
#             committed offsets reaching the end offsets. consumer-perf-test: its own
#             timer (nMsg / nMsg.sec); kcat: process wall time.
#   CPU       sluice: utime+stime from /proc/<pid>/stat at caught-up; peer: the JVM's
#             process CPU time at caught-up (in-process); tools: /usr/bin/time. Broker
#             CPU over the run, and PostgreSQL server CPU for the PostgreSQL contender,
#             are extra columns (they do part of the work).
#   peak RSS  VmHWM at caught-up (sluice from /proc, the peer of itself); tools: %M.
#             For sluice also the largest RssAnon seen at its position polls (every
#             POLL_S): VmHWM counts the pages of the SQLite file it memory-maps (page
#             cache, shared and reclaimable); RssAnon is the memory it allocates.
#   MB        key + value bytes (kcat %K %S), MB = 2^20 bytes.
#
# Usage: scripts/bench-suite.sh [--quick] [--workloads W1,W2,...] [--peer-workloads LIST]
#            [--no-latency] [--no-reads] [--no-changefeed] [--no-recovery] [--no-backfill] [--no-wasm]
#            [--peer-jvm-opts "OPTS"] [--keep]
#            [--phase-timeout SECONDS] [--no-page]
#   --workloads       which of W1..W5 to run (default all; latency/recovery need W1)
#   --peer-workloads  where the peer runs too (default W1,W2,W3; W4 is left out for time;
#                     W5 is refused: its seeded state exists only in the sysdbs)
#   --peer-jvm-opts   JVM options for the peer (default: none, the JVM's defaults)
#   --keep            keep the work folder (/tmp/sluice-suite.*) with every log
#   --no-page         a full run that leaves BENCHMARKS.md and docs/bench/ as they are
# Output: tables per workload, the goals, per-phase wall times; JSON in
# target/bench/suite-<date>.json, contender logs in target/bench/suite-<date>/; after a
# full run, BENCHMARKS.md and docs/bench/ (the page phase above).
# Exit status: non-zero if anything fails or any two checksums of a workload differ.
# Everything created (topics, groups, databases, temp files) is removed on exit, also on
# failure or Ctrl-C.
# shellcheck disable=SC2046 # $(sluice_env ...) expands to NAME=VALUE words without spaces
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
BENCH_TAG=suite
# shellcheck source=scripts/bench/lib.sh
source "$REPO/scripts/bench/lib.sh"

BS="" BROKER_PID="" PG_DATA="" KTOOL="" PG_ADMIN_URL="" SLUICE="" JAR=""
QUICK=false
WORKLOADS="W1,W2,W3,W4,W5"
PEER_WORKLOADS="W1,W2,W3"
RAW_WORKLOADS="W1,W2,W3"
DO_LATENCY=true
DO_READS=true
DO_CHANGEFEED=true
DO_RECOVERY=true
DO_BACKFILL=true
DO_WASM=true
PEER_JVM_OPTS=""
KEEP=false
NO_PAGE=false
PHASE_TIMEOUT=900
PARTITIONS=8
SEED=42
POLL_S=0.2

ORIG_ARGS="$*"
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
    case "$1" in
    --quick) QUICK=true; shift ;;
    --workloads) WORKLOADS="${2:?}"; shift 2 ;;
    --peer-workloads) PEER_WORKLOADS="${2?}"; shift 2 ;;
    --no-latency) DO_LATENCY=false; shift ;;
    --no-reads) DO_READS=false; shift ;;
    --no-changefeed) DO_CHANGEFEED=false; shift ;;
    --no-recovery) DO_RECOVERY=false; shift ;;
    --no-backfill) DO_BACKFILL=false; shift ;;
    --no-wasm) DO_WASM=false; shift ;;
    --peer-jvm-opts) PEER_JVM_OPTS="${2?}"; shift 2 ;;
    --keep) KEEP=true; shift ;;
    --phase-timeout) PHASE_TIMEOUT="${2:?}"; shift 2 ;;
    --no-page) NO_PAGE=true; shift ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
is_uint "$PHASE_TIMEOUT" || die "--phase-timeout must be a number of seconds"
in_list() { [[ ",$2," == *",$1,"* ]]; }
for w in ${WORKLOADS//,/ }; do [[ "$w" =~ ^W[1-5]$ ]] || die "--workloads: unknown workload '$w'"; done
if ! in_list W1 "$WORKLOADS"; then DO_LATENCY=false; DO_READS=false; DO_CHANGEFEED=false; DO_RECOVERY=false; fi
! in_list W5 "$PEER_WORKLOADS" || die "--peer-workloads: the peer cannot run W5 (its seeded state exists only in the sysdbs)"
# Why this run will not become BENCHMARKS.md's latest run ("" = it will, if its checksums match).
PAGE_SKIP=""
$NO_PAGE && PAGE_SKIP="--no-page"
$QUICK && PAGE_SKIP="--quick"
for w in W1 W2 W3 W4 W5; do in_list "$w" "$WORKLOADS" || PAGE_SKIP="not every workload"; done
for w in W1 W2 W3; do in_list "$w" "$PEER_WORKLOADS" || PAGE_SKIP="the peer not on W1-W3"; done
$DO_LATENCY && $DO_READS && $DO_CHANGEFEED && $DO_RECOVERY && $DO_BACKFILL && $DO_WASM || PAGE_SKIP="not every phase"
[[ -z "$PEER_JVM_OPTS" ]] || PAGE_SKIP="--peer-jvm-opts"

# Sizes: records dim collections ids_per_collection seeded_rows_per_collection
SCALE=1
$QUICK && SCALE=10
wl_params() {
    local r d c i s=0
    case "$1" in
    W1) r=1000000 d=384 c=64 i=1000 ;;
    W2) r=125000 d=1536 c=64 i=1000 ;;
    W3) r=500000 d=0 c=64 i=1000 ;;
    W4) r=500000 d=384 c=80000 i=1 ;;
    W5) r=500000 d=384 c=8 i=1250000 s=1250000 ;;
    esac
    WL_RECORDS=$((r / SCALE)) WL_DIM=$d WL_IDS=$i WL_SEEDED=$((s / SCALE))
    [[ "$1" == W4 ]] && c=$((c / SCALE))
    [[ "$1" == W5 ]] && WL_IDS=$((i / SCALE))
    WL_COLLECTIONS=$c
}
LAT_SECONDS=20
# The live drop beside a backfill: single repeats on this class of machine spread by 20-70
# points (docs/bench/history.md), so the goal's figure is the median of 15, whose 95% interval
# (order statistics 4 and 12) is reported beside it; about 12 s per repeat.
BACKFILL_REPEATS=15
# Paced before the measured 20 s and left out of the latency figures (kept as "whole_run"):
# the paced producer's own warm-up (see the header).
LAT_WARMUP_S=3
RECOVERY_WARM_S=5
$QUICK && LAT_SECONDS=6 && LAT_WARMUP_S=1 && BACKFILL_REPEATS=1

SCRIPT_T0="$(now)"
RUN_DATE="$(date +%Y%m%d-%H%M%S)"
RID="$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
BASE="suite-$RID"
WORK="$(mktemp -d /tmp/sluice-suite.XXXXXX)"
OUT_DIR="$REPO/target/bench"
LOG_DIR="$OUT_DIR/suite-$RUN_DATE"
RESULTS="$WORK/results.jsonl"
PHASES="$WORK/phases.tsv"
: >"$RESULTS"
: >"$PHASES"
BG_PIDS=()
PG_DBS=()
PG_URL="" # set by pg_create
STARTED_KAFKA=false
STARTED_PG=false
NCPU="$(nproc)"
ALL_CPUS="0-$((NCPU - 1))"
if ((NCPU >= 2)); then
    SERVICE_CPU=0 CONTENDER_CPU=1
    PINNING="broker JVM, PostgreSQL server (postmaster and children) and the suite's own processes (pollers, paced producer, latency probe) on CPU 0; each contender under taskset -c 1 while measured (the backfill phase: bench-backfill.sh --pin); producing, seeding and checksums unpinned"
else
    SERVICE_CPU="" CONTENDER_CPU=""
    PINNING="nothing pinned (1 CPU)"
fi
CONTENDER_PIN=()
[[ -z "$CONTENDER_CPU" ]] || CONTENDER_PIN=(taskset -c "$CONTENDER_CPU")
UNPINNED=(taskset -c "$ALL_CPUS")

# ------------------------------------------------------------------ phases ----------
PHASE_NAME=""
PHASE_T0=""
phase() { # phase NAME: ends the current phase (if any) and starts NAME ("" = none)
    if [[ -n "$PHASE_NAME" ]]; then
        local s
        s="$(fsub "$(now)" "$PHASE_T0")"
        printf '%s\t%s\n' "$PHASE_NAME" "$s" >>"$PHASES"
        log "phase '$PHASE_NAME' took $s s"
    fi
    PHASE_NAME="$1"
    PHASE_T0="$(now)"
    [[ -z "$1" ]] || log "=== phase $1"
}
# result JSON-OBJECT: one measurement line
result() { printf '%s\n' "$1" >>"$RESULTS"; }

measured_begin() { [[ -z "$SERVICE_CPU" ]] || bench_pin_services "$SERVICE_CPU"; }
measured_end() { [[ -z "$SERVICE_CPU" ]] || bench_restore_affinity; }

# ------------------------------------------------------------------ cleanup ---------
stop_pid() { # stop_pid PID [GRACE_S]: SIGTERM, then SIGKILL
    local pid="$1" grace="${2:-20}" i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 4; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    set +e
    trap - INT TERM
    phase ""
    local p
    for p in "${BG_PIDS[@]}"; do stop_pid "$p" 10; done
    measured_end
    if [[ -n "${BS:-}" ]]; then
        log "cleanup: topics $BASE-*, groups $BASE-*, databases ${PG_DBS[*]:-none}"
        bench_delete_topics "$BASE-.*"
        mapfile -t groups < <(timeout 60 "$KTOOL" consumer-groups --bootstrap-server "$BS" --list 2>/dev/null | grep "^$BASE-" || true)
        bench_delete_groups "${groups[@]}"
        for p in "${PG_DBS[@]}"; do
            timeout 60 psql -q -X "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$p\" WITH (FORCE)" >/dev/null 2>&1
        done
    fi
    [[ -f "$WORK/started-kafka" ]] && STARTED_KAFKA=true
    [[ -f "$WORK/started-pg" ]] && STARTED_PG=true
    $STARTED_KAFKA && { log "stopping the Kafka broker this run started"; "$REPO/deploy/local/kafka.sh" stop --brokers 1 >/dev/null 2>&1; }
    $STARTED_PG && { log "stopping the PostgreSQL cluster this run started"; "$REPO/deploy/local/postgres.sh" stop >/dev/null 2>&1; }
    if $KEEP; then log "kept $WORK"; else rm -rf "$WORK"; fi
    log "total wall time $(fsub "$(now)" "$SCRIPT_T0") s (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ setup -----------
phase "setup: dependencies"
"$REPO/deploy/local/deps.sh"
for tool in cargo java mvn kcat jq python3 psql sqlite3 taskset timeout awk curl; do
    command -v "$tool" >/dev/null || die "'$tool' is missing (Debian: apt-get install -y kcat jq python3 postgresql-client sqlite3 util-linux coreutils curl)"
done
[[ -x /usr/bin/time ]] || die "/usr/bin/time is missing: apt-get install -y time"

# Services (started here only if not running, and then stopped at exit), the release
# build and the peer's build, all at once.
phase "setup: services + builds (cargo release, mvn package), in parallel"
(
    set -e
    if ! "$REPO/deploy/local/kafka.sh" status --brokers 1 >/dev/null 2>&1; then
        touch "$WORK/started-kafka"
        "$REPO/deploy/local/kafka.sh" start --brokers 1
    fi
    if ! "$REPO/deploy/local/postgres.sh" status >/dev/null 2>&1; then
        touch "$WORK/started-pg"
        "$REPO/deploy/local/postgres.sh" start
    fi
) >"$WORK/services.log" 2>&1 &
SERVICES_PID=$!
BG_PIDS+=("$SERVICES_PID")
PEER_DIR="$REPO/bench/kafka-streams-peer"
JAR="$PEER_DIR/target/kafka-streams-peer.jar"
(
    t0="$(now)"
    mvn -q -f "$PEER_DIR/pom.xml" package >"$WORK/mvn.log" 2>&1
    echo "$? $(fsub "$(now)" "$t0")" >"$WORK/mvn.rc"
) &
MVN_PID=$!
BG_PIDS+=("$MVN_PID")
if $DO_BACKFILL || $DO_WASM; then
    # The C example components the backfill and wasm phases attach (the toolchains first)
    (
        "$REPO/deploy/local/wasm-toolchain.sh" >/dev/null && "$REPO/scripts/build-functions.sh"
        echo "$?" >"$WORK/functions.rc"
    ) >"$WORK/functions.log" 2>&1 &
    FUNCTIONS_PID=$!
    BG_PIDS+=("$FUNCTIONS_PID")
fi
t0="$(now)"
cargo build --release --bin sluice >&2 || die "cargo build --release --bin sluice failed"
CARGO_S="$(fsub "$(now)" "$t0")"
wait "$MVN_PID" || true
read -r MVN_RC MVN_S <"$WORK/mvn.rc" || die "the mvn build did not finish"
((MVN_RC == 0)) || { tail -40 "$WORK/mvn.log" >&2; die "mvn package failed"; }
[[ -f "$JAR" ]] || die "no peer jar at $JAR"
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps 2>/dev/null | jq -r .target_directory)"
SLUICE="$TARGET_DIR/release/sluice"
[[ -x "$SLUICE" ]] || die "no binary at $SLUICE"
log "cargo build $CARGO_S s, mvn package $MVN_S s"
SERVICES_RC=0
wait "$SERVICES_PID" || SERVICES_RC=$?
[[ -f "$WORK/started-kafka" ]] && STARTED_KAFKA=true
[[ -f "$WORK/started-pg" ]] && STARTED_PG=true
((SERVICES_RC == 0)) || { cat "$WORK/services.log" >&2; die "starting Kafka / PostgreSQL failed (log above)"; }
$STARTED_KAFKA && log "started the Kafka broker (deploy/local/kafka.sh start); it is stopped at exit"
$STARTED_PG && log "started PostgreSQL (deploy/local/postgres.sh start); it is stopped at exit"
bench_services_init
PG_ADMIN_URL="$("$PG_SH" url sluice)"
[[ "$PG_ADMIN_URL" == postgres://*@127.0.0.1:* ]] || die "PostgreSQL url '$PG_ADMIN_URL' is not loopback"
[[ -n "$BROKER_PID" ]] || log "WARNING: no broker pid file: the broker is neither pinned nor measured"

# From here on, this script and everything it starts run on CPU 0 unless told otherwise.
[[ -z "$SERVICE_CPU" ]] || taskset -p -c "$SERVICE_CPU" $$ >/dev/null

export SLUICE_BROKERS="$BS" SLUICE_HTTP=""
unset SLUICE_CONFIG SLUICE_LOG SLUICE_GROUP SLUICE_SYSDB SLUICE_TOPIC_PREFIX
COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)"
CPU_MODEL="$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
mkdir -p "$LOG_DIR"
log "run $BASE, commit $COMMIT$($DIRTY && echo ' (dirty)'), $NCPU x $CPU_MODEL, quick=$QUICK"
log "pinning: $PINNING"
if [[ -z "$PAGE_SKIP" ]]; then log "a full run: at the end it becomes BENCHMARKS.md's latest run (--no-page: not)"
else log "BENCHMARKS.md and docs/bench/ stay as they are ($PAGE_SKIP)"; fi

# ------------------------------------------------------------------ helpers ---------
# The paced producer (runs on CPU 0 with this script); its PID is java's.
REPLAY=(java -cp "$JAR" sluice.peer.tools.Replay --bootstrap "$BS")
# sluice_env PREFIX SYSDB GROUP: the environment of one sluice contender
sluice_env() { echo "SLUICE_TOPIC_PREFIX=$1" "SLUICE_SYSDB=$2" "SLUICE_GROUP=$3"; }

# pg_create NAME: create the database and register it for the cleanup; its URL is left in
# PG_URL (not printed: a command substitution's subshell would drop the registration)
pg_create() {
    timeout 60 psql -q -X -v ON_ERROR_STOP=1 "$PG_ADMIN_URL" -c "CREATE DATABASE \"$1\"" >&2 || die "createdb $1 failed"
    PG_DBS+=("$1")
    PG_URL="${PG_ADMIN_URL%/*}/$1"
}
pg_drop() {
    timeout 120 psql -q -X "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$1\" WITH (FORCE)" >/dev/null 2>&1 || true
}

# wait_log FILE REGEX COUNT TIMEOUT_S [PID]: until FILE has COUNT lines matching REGEX
wait_log() {
    local f="$1" re="$2" n="$3" deadline pid="${5:-}" seen
    deadline=$(($(date +%s) + $4))
    while :; do
        # Nothing printed while FILE does not exist yet: count that as 0 lines.
        seen=$(grep -c -E -e "$re" "$f" 2>/dev/null || true)
        ((${seen:-0} >= n)) && return 0
        [[ -z "$pid" ]] || kill -0 "$pid" 2>/dev/null || return 1
        (($(date +%s) <= deadline)) || return 1
        sleep 0.05
    done
}

# drain_sluice W NAME URL PREFIX TOTAL: one `sluice process` from offset 0 to caught-up
drain_sluice() {
    local w="$1" name="$2" url="$3" prefix="$4" total="$5"
    local topic="$prefix.log" group="$prefix-$name" logf="$WORK/$w-sluice-$name.log"
    log "$w: sluice process on $name (group $group)"
    env $(sluice_env "$prefix" "$url" "$group") timeout 300 "$SLUICE" init --partitions "$PARTITIONS" >/dev/null 2>&1 ||
        die "sluice init on $name failed"
    measured_begin
    local b0 p0 t0 t1="" pid deadline polls=0 pos anon anon_max=0
    b0="$(broker_cpu)"
    p0="$(pg_cpu)"
    t0="$(now)"
    env $(sluice_env "$prefix" "$url" "$group") "${CONTENDER_PIN[@]}" "$SLUICE" --log-format json process 2>"$logf" &
    pid=$!
    BG_PIDS+=("$pid")
    deadline=$(($(date +%s) + PHASE_TIMEOUT))
    while :; do
        kill -0 "$pid" 2>/dev/null || { tail -30 "$logf" >&2; die "$w: sluice process ($name) exited before catching up"; }
        polls=$((polls + 1))
        anon="$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)"
        ((${anon:-0} <= anon_max)) || anon_max="$anon"
        pos="$(sysdb_position "$url" "$topic")"
        if [[ "$pos" == "$PARTITIONS $total" ]]; then t1="$(now)"; break; fi
        if (($(date +%s) > deadline)); then
            tail -30 "$logf" >&2
            die "$w: sluice process ($name) did not catch up within $PHASE_TIMEOUT s (position $pos of $total)"
        fi
        sleep "$POLL_S"
    done
    local cpu rss b1 p1
    cpu="$(pid_cpu "$pid")"
    rss="$(pid_hwm_kb "$pid")"
    b1="$(broker_cpu)"
    p1="$(pg_cpu)"
    measured_end
    local lag_ok=true
    env $(sluice_env "$prefix" "$url" "$group") timeout 60 "$SLUICE" offsets show --format json >"$WORK/offsets.json" 2>/dev/null &&
        jq -e --argjson n "$total" '(map(.high_watermark) | add) == $n and all(.[]; .lag == 0 and .sysdb_next_offset == .high_watermark)' \
            "$WORK/offsets.json" >/dev/null || lag_ok=false
    $lag_ok || { cat "$WORK/offsets.json" >&2; die "$w: sluice offsets show disagrees with the sysdb poll ($name)"; }
    local rc=0 ts stop_s
    ts="$(now)"
    kill -TERM "$pid"
    wait "$pid" || rc=$?
    stop_s="$(fsub "$(now)" "$ts")"
    local secs assign_ts assign_s=null errors warns dlq
    secs="$(fsub "$t1" "$t0")"
    assign_ts="$(jq -r 'select(.fields.message == "partition starts") | .timestamp' "$logf" 2>/dev/null | head -1)"
    [[ -z "$assign_ts" ]] || assign_s="$(fsub "$(iso_epoch "$assign_ts")" "$t0")"
    errors="$(grep -c '"level":"ERROR"' "$logf" || true)"
    warns="$(grep -c '"level":"WARN"' "$logf" || true)"
    ((errors == 0)) || { log "$w $name: ERROR log lines:"; grep '"level":"ERROR"' "$logf" | head -5 >&2; }
    dlq="$(timeout 120 kcat -C -b "$BS" -t "$prefix.dlq" -e -o beginning -q -f 'x\n' 2>/dev/null | wc -l)"
    cp "$logf" "$LOG_DIR/"
    log "$w: sluice/$name caught up in $secs s (assigned at $assign_s s, $polls polls), CPU $cpu s, peak RSS $rss kB, broker CPU $(fsub "$b1" "$b0") s, exit $rc after $stop_s s, $errors ERROR / $warns WARN lines, DLQ $dlq"
    ((rc == 0)) || log "WARNING: $w sluice/$name exited with $rc after SIGTERM"
    result "$(jq -cn --arg w "$w" --arg c "sluice-$name" --argjson n "$total" --arg s "$secs" --arg cpu "$cpu" \
        --argjson rss "$rss" --arg a "$assign_s" --arg b "$(fsub "$b1" "$b0")" --arg p "$(fsub "$p1" "$p0")" \
        --argjson rc "$rc" --argjson e "$errors" --argjson dlq "$dlq" --argjson polls "$polls" --argjson anon "$anon_max" \
        '{kind: "drain", workload: $w, contender: $c, records: $n, seconds: ($s|tonumber), cpu_s: ($cpu|tonumber),
          rss_kb: $rss, rss_anon_max_kb: $anon, assign_s: ($a|tonumber? // null), broker_cpu_s: ($b|tonumber), exit_code: $rc,
          error_log_lines: $e, dlq_records: $dlq, polls: $polls}
         + (if $c == "sluice-postgres" then {postgres_server_cpu_s: ($p|tonumber)} else {} end)')"
    # the maximum rate, for the latency and recovery phases: records / (caught up - assigned)
    LAST_RATE="$(awk -v n="$total" -v s="$secs" -v a="$assign_s" 'BEGIN { if (a == "null") a = 0; printf "%.0f", n / (s - a) }')"
}

# drain_peer W PREFIX TOTAL
drain_peer() {
    local w="$1" prefix="$2" total="$3"
    local app="$prefix-peer" out="$WORK/$w-peer.out" err="$WORK/$w-peer.err"
    log "$w: the Kafka Streams peer (app id $app)"
    measured_begin
    local b0 t0 rc=0
    b0="$(broker_cpu)"
    t0="$(now)"
    # shellcheck disable=SC2086 # PEER_JVM_OPTS is a list of options
    "${CONTENDER_PIN[@]}" java $PEER_JVM_OPTS -jar "$JAR" --bootstrap "$BS" --topic "$prefix.log" --app-id "$app" \
        --state-dir "$WORK/peer-state-$w" --cleanup --timeout-s "$PHASE_TIMEOUT" >"$out" 2>"$err" || rc=$?
    local wall b1
    wall="$(fsub "$(now)" "$t0")"
    b1="$(broker_cpu)"
    measured_end
    cp "$err" "$LOG_DIR/$w-peer.log"
    ((rc == 0)) || { tail -40 "$err" >&2; die "$w: the peer failed (exit $rc)"; }
    local line sum
    line="$(grep -o 'peer-caught-up: .*' "$err" | tail -1)"
    sum="$(grep -E '^records=[0-9]+ sha256=[0-9a-f]{64}$' "$out" || true)"
    [[ -n "$line" && -n "$sum" ]] || { tail -20 "$err" >&2; die "$w: no result lines from the peer"; }
    local kv
    kv="$(tr ' ' '\n' <<<"${line#peer-caught-up: }" | awk -F= 'NF == 2 { printf "%s\"%s\": %s", (n++ ? ", " : "{"), $1, $2 } END { print "}" }')"
    log "$w: peer $line; $sum; run wall $wall s"
    grep -E 'processed [0-9]+ messages' "$err" | sed 's/^/  /' >&2 || true
    result "$(jq -cn --arg w "$w" --argjson n "$total" --argjson kv "$kv" --arg sum "$sum" --arg wall "$wall" \
        --arg b "$(fsub "$b1" "$b0")" --arg opts "$PEER_JVM_OPTS" \
        '{kind: "drain", workload: $w, contender: "peer", records: $n, seconds: $kv.jvm_start_to_caught_up_s,
          cpu_s: $kv.cpu_s, rss_kb: $kv.rss_hwm_kb, assign_s: ($kv.jvm_start_to_caught_up_s - $kv.first_record_to_caught_up_s),
          broker_cpu_s: ($b|tonumber), broker_cpu_note: "JVM start to exit (checksum and close included)",
          checksum: $sum, run_wall_s: ($wall|tonumber), jvm_opts: $opts, peer: $kv}')"
    LAST_RATE="$(awk -v n="$total" -v s="$(jq -r .first_record_to_caught_up_s <<<"$kv")" 'BEGIN { printf "%.0f", n / s }')"
}

# raw_ceiling W TOPIC TOTAL: consumer-perf-test and kcat on the contender CPU
raw_ceiling() {
    local w="$1" topic="$2" total="$3" group="$BASE-${1,,}-cpt"
    log "$w: consumer-perf-test --messages $total"
    measured_begin
    local t0 b0 b1
    b0="$(broker_cpu)"
    t0="$(now)"
    /usr/bin/time -f '%e %U %S %M' -o "$WORK/cpt.time" timeout "$PHASE_TIMEOUT" "${CONTENDER_PIN[@]}" "$KTOOL" consumer-perf-test \
        --bootstrap-server "$BS" --topic "$topic" --messages "$total" --group "$group" --timeout 60000 \
        >"$WORK/cpt.out" 2>"$WORK/cpt.err" || { cat "$WORK/cpt.out" "$WORK/cpt.err" >&2; die "consumer-perf-test failed"; }
    local wall
    wall="$(fsub "$(now)" "$t0")"
    b1="$(broker_cpu)"
    measured_end
    local line mbs n ns
    line="$(grep -E '^[0-9]{4}-' "$WORK/cpt.out" | tail -1)"
    [[ -n "$line" ]] || { cat "$WORK/cpt.out" >&2; die "cannot parse consumer-perf-test output"; }
    IFS=',' read -r _ _ _ mbs n ns _ <<<"$line"
    n="${n// /}"
    ((n >= total)) || die "consumer-perf-test consumed $n records, expected $total"
    local cu cs cm
    read -r _ cu cs cm <"$WORK/cpt.time"
    result "$(jq -cn --arg w "$w" --argjson n "$n" --arg s "$(awk -v n="$n" -v r="$ns" 'BEGIN { printf "%.3f", n / r }')" \
        --arg cpu "$(fadd "$cu" "$cs")" --argjson rss "$cm" --arg wall "$wall" --arg b "$(fsub "$b1" "$b0")" \
        '{kind: "drain", workload: $w, contender: "consumer-perf-test", records: $n, seconds: ($s|tonumber),
          cpu_s: ($cpu|tonumber), rss_kb: $rss, broker_cpu_s: ($b|tonumber), jvm_wall_s: ($wall|tonumber),
          note: "seconds = its own timer (nMsg / nMsg.sec, group join included, JVM start excluded); CPU and RSS of the whole JVM run"}')"
    log "$w: consumer-perf-test $n records at $ns records/s ($mbs MB/s by its count), JVM wall $wall s"

    log "$w: kcat -C -e -o beginning -q > /dev/null"
    measured_begin
    b0="$(broker_cpu)"
    t0="$(now)"
    /usr/bin/time -f '%e %U %S %M' -o "$WORK/kcat.time" timeout "$PHASE_TIMEOUT" "${CONTENDER_PIN[@]}" \
        kcat -C -b "$BS" -t "$topic" -e -o beginning -q >/dev/null 2>"$WORK/kcat.err" || { cat "$WORK/kcat.err" >&2; die "kcat failed"; }
    wall="$(fsub "$(now)" "$t0")"
    b1="$(broker_cpu)"
    measured_end
    read -r _ cu cs cm <"$WORK/kcat.time"
    result "$(jq -cn --arg w "$w" --argjson n "$total" --arg s "$wall" --arg cpu "$(fadd "$cu" "$cs")" --argjson rss "$cm" \
        --arg b "$(fsub "$b1" "$b0")" \
        '{kind: "drain", workload: $w, contender: "kcat", records: $n, seconds: ($s|tonumber), cpu_s: ($cpu|tonumber),
          rss_kb: $rss, broker_cpu_s: ($b|tonumber), note: "kcat -C -e -o beginning -q > /dev/null; seconds = process wall time"}')"
    log "$w: kcat drained in $wall s"
}

# w5_layout PREFIX_VAR: picks a collection prefix whose 8 collections land on 8 distinct
# partitions (murmur2, the Java client's) and prints "prefix p0 p1 ... p7".
w5_layout() {
    python3 "$REPO/scripts/bench/murmur2.py" layout "$1" "$2"
}

# seed_w5 SQLITE_FILE PG_URL COLLECTION_PREFIX N_PER_COLLECTION P0 P1 ...
seed_w5() {
    local file="$1" pg="$2" cprefix="$3" n="$4"
    shift 4
    local values="" i=0 p ms
    ms="$(date +%s%3N)"
    for p in "$@"; do
        values+="${values:+, }('$cprefix$i', $p)"
        i=$((i + 1))
    done
    # Small rows (no embedding); ids are the workload's: printf 'id-%06d' (at least 6
    # digits). collections.record_count = the seeded rows; log_position -1: none of them
    # came from the log; last_offset -1 likewise. SQLite keeps a record's embedding and
    # document in the value log `record_values` (src/sysdb/sqlite/values.rs), and
    # `value_log` counts the values' bytes (13: 'seeded record'), all of them live.
    cat >"$WORK/seed-sqlite.sql" <<EOF
PRAGMA cache_size = -262144;
BEGIN;
INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)
  SELECT c.column1, c.column2, NULL, -1, $n, $ms FROM (VALUES $values) AS c;
INSERT INTO record_values (collection_id, id, embedding, document)
  SELECT c.column1, printf('id-%06d', s.value), NULL, 'seeded record'
  FROM (VALUES $values) AS c, generate_series(0, $((n - 1))) AS s;
INSERT INTO records (collection_id, id, metadata, last_offset, value, value_bytes)
  SELECT collection_id, id, '{"seeded":true}', -1, seq, 13 FROM record_values ORDER BY seq;
UPDATE value_log SET log_bytes = log_bytes + 13 * (SELECT count(*) FROM records),
                     live_bytes = live_bytes + 13 * (SELECT count(*) FROM records);
COMMIT;
EOF
    # PostgreSQL: the primary key is dropped for the bulk insert and added back (same
    # name, same columns: the schema `sluice init` made), then VACUUM ANALYZE so that
    # autovacuum does not visit the 10M fresh rows during the measured drain.
    cat >"$WORK/seed-pg.sql" <<EOF
SET maintenance_work_mem = '512MB';
BEGIN;
ALTER TABLE records DROP CONSTRAINT records_pkey;
INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)
  SELECT c.id, c.p, NULL, -1, $n, $ms FROM (VALUES $values) AS c(id, p);
INSERT INTO records (collection_id, id, embedding, metadata, document, last_offset)
  SELECT c.id, 'id-' || CASE WHEN s < 1000000 THEN lpad(s::text, 6, '0') ELSE s::text END, NULL, '{"seeded":true}', 'seeded record', -1
  FROM (VALUES $values) AS c(id, p), generate_series(0, $((n - 1))) AS s;
ALTER TABLE records ADD CONSTRAINT records_pkey PRIMARY KEY (collection_id, id);
COMMIT;
VACUUM ANALYZE records;
VACUUM ANALYZE collections;
EOF
    local t0 s1 s2
    t0="$(now)"
    "${UNPINNED[@]}" sqlite3 -bail "$file" <"$WORK/seed-sqlite.sql" >&2 &
    s1=$!
    "${UNPINNED[@]}" psql -q -X -v ON_ERROR_STOP=1 "$pg" -f "$WORK/seed-pg.sql" >&2 &
    s2=$!
    wait "$s1" || return 1
    log "W5: seeded SQLite in $(fsub "$(now)" "$t0") s"
    wait "$s2" || return 1
    log "W5: seeded PostgreSQL (and VACUUM ANALYZE) in $(fsub "$(now)" "$t0") s"
}

# sysdb_digest URL: W5's comparison of the two sysdbs (10M rows: `sluice checksum`
# would take a minute per sysdb). sha256 of: aggregates over every record (count, sum of
# last_offset, embeddings, byte lengths), every collections row, and every record the log
# touched (last_offset >= 0) in full -- the stored bytes, which both backends write
# identically (src/sysdb/stored_fields.rs) -- ordered by (collection_id, id) in byte order.
sysdb_digest() {
    local url="$1"
    local agg="SELECT count(*), coalesce(sum(last_offset), 0), count(embedding), coalesce(sum(length(embedding)), 0),
                      coalesce(sum(length(metadata)), 0), coalesce(sum(length(document)), 0) FROM records"
    local colls="SELECT id, partition, coalesce(dimension, -1), log_position, record_count FROM collections ORDER BY id"
    local touched="SELECT collection_id, id, coalesce(EMB, '-'), coalesce(metadata, '-'), coalesce(document, '-'), last_offset
                   FROM records WHERE last_offset >= 0 ORDER BY collection_id, id"
    case "$url" in
    sqlite://*)
        # SQLite: whole records are the current ones (a key's newest row in the records
        # delta, else `records`; src/sysdb/sqlite/values.rs) joined with their values. The
        # rows of `records` without a delta row are an anti-join (SQLite builds an automatic
        # index): a row-value NOT IN (subquery) scanned the delta once per row, 338 s on
        # W5's 10M rows against 35 s with an empty delta.
        local whole="(WITH d AS (SELECT collection_id, id, metadata, last_offset, value,
                          row_number() OVER (PARTITION BY collection_id, id ORDER BY seq DESC) AS newest FROM record_delta),
                      cur AS (SELECT collection_id, id, metadata, last_offset, value FROM d WHERE newest = 1 AND last_offset IS NOT NULL
                          UNION ALL SELECT r.collection_id, r.id, r.metadata, r.last_offset, r.value FROM records r
                          LEFT JOIN d k ON k.newest = 1 AND k.collection_id = r.collection_id AND k.id = r.id
                          WHERE k.id IS NULL)
                      SELECT r.collection_id, r.id, v.embedding, r.metadata, v.document, r.last_offset
                      FROM cur r LEFT JOIN record_values v ON v.seq = r.value)"
        agg="${agg/FROM records/FROM $whole}" touched="${touched/FROM records/FROM $whole}"
        sqlite3 -readonly -separator $'\t' "${url#sqlite://}" "$agg; $colls; ${touched/EMB/hex(embedding)}" ;;
    *)
        local hexemb="upper(encode(embedding, 'hex'))"
        printf '\\set FETCH_COUNT 20000\n%s;\n%s;\n%s;\n' "$agg" "$colls" "${touched/EMB/$hexemb}" |
            psql -X -q -A -t -F $'\t' -v ON_ERROR_STOP=1 "$url" ;;
    esac | sha256sum | cut -c1-64
}

declare -A WL_TOPIC=() WL_RATE=() WL_TOTAL=()
CHECKSUM_FAILURES=()

run_workload() {
    local w="$1"
    wl_params "$w"
    local prefix="$BASE-${w,,}" total="$WL_RECORDS"
    local topic="$prefix.log" sqlite_file="$WORK/$w-sqlite.db"
    local sqlite_url="sqlite://$sqlite_file" pg_url cprefix="collection-" layout=()
    WL_TOPIC[$w]="$topic"
    phase "$w: init and produce"
    env $(sluice_env "$prefix" "$sqlite_url" "$prefix-sqlite") timeout 300 "$SLUICE" init --partitions "$PARTITIONS" >/dev/null 2>&1 ||
        die "sluice init ($w) failed"
    pg_create "suite_${RID}_${w,,}"
    pg_url="$PG_URL"
    env $(sluice_env "$prefix" "$pg_url" "$prefix-postgres") timeout 300 "$SLUICE" init --partitions "$PARTITIONS" >/dev/null 2>&1 ||
        die "sluice init ($w, postgres) failed"
    local seed_pid=""
    if [[ "$w" == W5 ]]; then
        read -r -a layout <<<"$(w5_layout "$WL_COLLECTIONS" "$PARTITIONS")"
        cprefix="${layout[0]}"
        log "W5: collections $cprefix{0..$((WL_COLLECTIONS - 1))} on partitions ${layout[*]:1}; seeding ${WL_SEEDED} records each into both sysdbs while producing"
        seed_w5 "$sqlite_file" "$pg_url" "$cprefix" "$WL_SEEDED" "${layout[@]:1}" &
        seed_pid=$!
        BG_PIDS+=("$seed_pid")
    fi
    log "$w: producing $total records (dim $WL_DIM, $WL_COLLECTIONS collections, $WL_IDS ids per collection)"
    local t0
    t0="$(now)"
    "${UNPINNED[@]}" bash -c "set -o pipefail; '$SLUICE' workload --records $total --collections $WL_COLLECTIONS --dim $WL_DIM \
        --ids-per-collection $WL_IDS --seed $SEED --collection-prefix '$cprefix' \
        | SLUICE_TOPIC_PREFIX='$prefix' SLUICE_SYSDB='sqlite://$WORK/produce.db' '$SLUICE' produce -" 2>"$WORK/$w-produce.log" ||
        { tail -20 "$WORK/$w-produce.log" >&2; die "$w: produce failed"; }
    local produce_s
    produce_s="$(fsub "$(now)" "$t0")"
    log "$w: $(tail -1 "$WORK/$w-produce.log") in $produce_s s"

    phase "$w: count bytes"
    local n kb vb
    "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" kcat -C -b "$BS" -t "$topic" -e -o beginning -q -f '%K %S %p %k\n' |
        awk '{ n++; if ($1 > 0) k += $1; if ($2 > 0) v += $2; if (!(($4) in seen)) { seen[$4] = 1; print $4, $3 > "'"$WORK/$w-keys.txt"'" } }
             END { printf "%d %d %d\n", n, k, v }' >"$WORK/$w-count.txt"
    read -r n kb vb <"$WORK/$w-count.txt"
    ((n == total)) || die "$w: the log topic holds $n records, expected $total"
    WL_TOTAL[$w]="$n"
    local bytes=$((kb + vb))
    if [[ "$w" == W5 ]]; then
        python3 "$REPO/scripts/bench/murmur2.py" check "$PARTITIONS" <"$WORK/$w-keys.txt" ||
            die "W5: the murmur2 partitions of the seeded collections disagree with the topic"
    fi
    log "$w: $n records, $bytes bytes key+value ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MB), $(wc -l <"$WORK/$w-keys.txt") collections"
    result "$(jq -cn --arg w "$w" --argjson n "$n" --argjson b "$bytes" --argjson k "$kb" --argjson d "$WL_DIM" \
        --argjson c "$WL_COLLECTIONS" --argjson i "$WL_IDS" --argjson seeded "$WL_SEEDED" --arg ps "$produce_s" \
        --arg cp "$cprefix" --arg t "$topic" --argjson quick "$QUICK" \
        '{kind: "workload", workload: $w, records: $n, bytes: $b, key_bytes: $k, dim: $d, collections: $c,
          ids_per_collection: $i, seeded_records_per_collection: $seeded, collection_prefix: $cp, topic: $t,
          produce_s: ($ps|tonumber), quick: $quick}')"
    if [[ -n "$seed_pid" ]]; then
        phase "W5: seeding (remainder)"
        wait "$seed_pid" || die "W5: seeding failed"
        local rows
        rows="$(sqlite3 -readonly "$sqlite_file" 'SELECT count(*) FROM records')"
        log "W5: SQLite records table holds $rows rows"
    fi

    if in_list "$w" "$RAW_WORKLOADS"; then
        phase "$w: raw ceiling (consumer-perf-test, kcat)"
        raw_ceiling "$w" "$topic" "$total"
    fi

    phase "$w: sluice (SQLite)"
    drain_sluice "$w" sqlite "$sqlite_url" "$prefix" "$total"
    WL_RATE[${w}_sqlite]="$LAST_RATE"

    phase "$w: sluice (PostgreSQL)"
    drain_sluice "$w" postgres "$pg_url" "$prefix" "$total"
    WL_RATE[${w}_postgres]="$LAST_RATE"

    if in_list "$w" "$PEER_WORKLOADS"; then
        phase "$w: Kafka Streams peer"
        drain_peer "$w" "$prefix" "$total"
        WL_RATE[${w}_peer]="$LAST_RATE"
    fi

    # Both sysdbs' checksums at once (not measured, all CPUs). W5 (10M rows): the SQL
    # digest of sysdb_digest instead of `sluice checksum`.
    phase "$w: checksums"
    local cs_t0 c1 c2
    cs_t0="$(now)"
    if [[ "$w" == W5 ]]; then
        sysdb_digest "$sqlite_url" >"$WORK/$w-sqlite.sum" 2>"$WORK/$w-sqlite.sum.err" &
        c1=$!
        sysdb_digest "$pg_url" >"$WORK/$w-postgres.sum" 2>"$WORK/$w-postgres.sum.err" &
        c2=$!
    else
        env $(sluice_env "$prefix" "$sqlite_url" "$prefix-sqlite") "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" "$SLUICE" checksum \
            >"$WORK/$w-sqlite.sum" 2>"$WORK/$w-sqlite.sum.err" &
        c1=$!
        env $(sluice_env "$prefix" "$pg_url" "$prefix-postgres") "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" "$SLUICE" checksum \
            >"$WORK/$w-postgres.sum" 2>"$WORK/$w-postgres.sum.err" &
        c2=$!
    fi
    local rc1=0 rc2=0
    wait "$c1" || rc1=$?
    wait "$c2" || rc2=$?
    if ((rc1 != 0)) || [[ ! -s "$WORK/$w-sqlite.sum" ]]; then cat "$WORK/$w-sqlite.sum.err" >&2; die "$w: checksum (SQLite) failed"; fi
    if ((rc2 != 0)) || [[ ! -s "$WORK/$w-postgres.sum" ]]; then cat "$WORK/$w-postgres.sum.err" >&2; die "$w: checksum (PostgreSQL) failed"; fi
    [[ ! -s "$WORK/$w-sqlite.sum.err" && ! -s "$WORK/$w-postgres.sum.err" ]] || [[ "$w" != W5 ]] ||
        { cat "$WORK/$w-sqlite.sum.err" "$WORK/$w-postgres.sum.err" >&2; die "$w: digest queries failed"; }
    log "$w: checksums of both sysdbs in $(fsub "$(now)" "$cs_t0") s$([[ "$w" == W5 ]] && echo ' (SQL digest)')"
    local sums=("sluice-sqlite=$(cat "$WORK/$w-sqlite.sum")" "sluice-postgres=$(cat "$WORK/$w-postgres.sum")")
    if in_list "$w" "$PEER_WORKLOADS"; then
        sums+=("peer=$(jq -r 'select(.workload == "'"$w"'" and .contender == "peer") | .checksum' "$RESULTS" | tail -1)")
    fi
    rm -f "$sqlite_file" "$sqlite_file-wal" "$sqlite_file-shm"
    pg_drop "suite_${RID}_${w,,}"

    local first="${sums[0]#*=}" s same=true
    for s in "${sums[@]}"; do [[ "${s#*=}" == "$first" ]] || same=false; done
    if $same; then
        log "$w: checksums MATCH across ${#sums[@]} contenders: $first"
    else
        log "$w: checksums DIFFER: ${sums[*]}"
        CHECKSUM_FAILURES+=("$w: ${sums[*]}")
    fi
    result "$(jq -cn --arg w "$w" --argjson same "$same" --arg m "$([[ "$w" == W5 ]] && echo "sha256 of the stored rows (SQL digest, see sysdb_digest)" || echo "sluice checksum / the peer's records=N sha256=HEX")" \
        --args '{kind: "checksums", workload: $w, match: $same, method: $m, values: $ARGS.positional}' "${sums[@]}")"
    if [[ "$w" != W1 ]]; then
        bench_delete_topics "$prefix\\..*"
    fi
}

# ------------------------------------------------------------------ latency ---------
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# paced TO RATE SECONDS CONTENDER_PID NAME: the paced producer (W1's records into TO, on
# CPU 0), in the foreground. Sets SENT and LOAD (JSON: utilisation over the pacing
# window of CPU 0 -- broker + paced producer -- and of the contender, in CPUs).
paced() {
    local to="$1" rate="$2" secs="$3" pid="$4" name="$5"
    local out="$WORK/$name-replay.out" err="$WORK/$name-replay.err"
    "${REPLAY[@]}" --from "${WL_TOPIC[W1]}" --to "$to" --rate "$rate" --seconds "$secs" >"$out" 2>"$err" &
    local rp=$!
    BG_PIDS+=("$rp")
    wait_log "$err" 'pacing starts' 1 180 "$rp" || { cat "$err" >&2; die "$name: the paced producer did not start"; }
    local b0 c0 t0
    b0="$(broker_cpu)" c0="$(pid_cpu "$pid")" t0="$(now)"
    wait "$rp" || { cat "$err" >&2; die "$name: the paced producer failed"; }
    local b1 c1 w r
    b1="$(broker_cpu)" c1="$(pid_cpu "$pid")" w="$(fsub "$(now)" "$t0")"
    log "$name: $(cat "$out")"
    SENT="$(sed -n 's/.*sent=\([0-9]*\).*/\1/p' "$out")"
    r="$(sed -n 's/.*pacing_cpu_s=\([0-9.]*\).*/\1/p' "$out")"
    LOAD="$(awk -v w="$w" -v b="$(fsub "$b1" "$b0")" -v r="${r:-0}" -v c="$(fsub "$c1" "$c0")" \
        'BEGIN { printf "{\"wall_s\": %.2f, \"broker_cpu\": %.2f, \"producer_cpu\": %.2f, \"cpu0\": %.2f, \"contender_cpu\": %.2f}\n",
                 w, b / w, r / w, (b + r) / w, c / w }')"
}

# reads_phase RATE: the read benchmark on this run's broker; its row joins RESULTS
reads_phase() {
    local rate="$1" n=300000 repeats=3 out="$LOG_DIR/reads.log" json pin=()
    $QUICK && n=30000 repeats=1
    [[ -z "$CONTENDER_CPU" ]] || pin=(--pin)
    "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" "$REPO/scripts/bench-reads.sh" --records "$n" --repeats "$repeats" --rate "$rate" "${pin[@]}" \
        >"$out" 2>&1 || { tail -30 "$out" >&2; die "reads phase failed (log: $out)"; }
    json="$(sed -n 's/^JSON: //p' "$out" | tail -1)"
    [[ -s "$json" ]] || die "reads phase: no JSON named in $out"
    jq -c '{kind: "reads"} + .' "$json" >>"$RESULTS"
    grep -E 'drain alone|produce -> read at' "$out" >&2 || true
}

# changefeed_phase BACKEND: the feed off (A) against on (B) on W1's log; its row joins RESULTS
changefeed_phase() {
    local backend="$1" rounds=3 out="$LOG_DIR/changefeed-$1.log" json
    $QUICK && rounds=1
    printf '[changelog]\nenabled = true\ntopic_suffix = "changes-@RUN@"\n' >"$WORK/changefeed-on.toml"
    SLUICE_BROKERS="$BS" AB_PREFIX="$BASE-w1" AB_BACKEND="$backend" AB_CONFIG_B="$WORK/changefeed-on.toml" \
        "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" "$REPO/scripts/bench-ab.sh" "$SLUICE" "$SLUICE" "${WL_TOTAL[W1]}" "$rounds" \
        >"$out" 2>&1 || { tail -30 "$out" >&2; die "changefeed phase ($backend) failed (log: $out)"; }
    json="$(sed -n 's/^JSON: //p' "$out" | tail -1)"
    [[ -n "$json" ]] || die "changefeed phase ($backend): no JSON line in $out"
    jq -c '{kind: "changefeed"} + .' <<<"$json" >>"$RESULTS"
    grep -E '^bench-ab: A ' "$out" >&2 || true
}

# latency_sluice RATE [append|create] [sqlite|postgres]: with "append", the topic stamps
# its records with LogAppendTime, so the figures run from the broker's append to the
# commit: Sluice's own share, without the paced producer's delays (result kind
# "latency_log_append"). The sysdb is SQLite unless "postgres" is given.
latency_sluice() {
    local rate="$1" mode="${2:-create}" backend="${3:-sqlite}" name=lat-sluice kind=latency method=""
    if [[ "$mode" == append ]]; then
        name=lat-sluice-append kind=latency_log_append
        # kcat's %T is then the broker's append time, not the producer's CreateTime
        method="per record: 'batch committed' log time of its batch - LogAppendTime (the broker's append)"
    fi
    [[ "$backend" == postgres ]] && name="$name-pg"
    local prefix="$BASE-$name"
    local url="sqlite://$WORK/$name.db" group="$prefix-$backend" logf="$WORK/$name.log" port
    if [[ "$backend" == postgres ]]; then
        pg_create "suite_${RID}_${name//-/_}"
        url="$PG_URL"
    fi
    port="$(free_port)"
    env $(sluice_env "$prefix" "$url" "$group") timeout 300 "$SLUICE" init --partitions "$PARTITIONS" >/dev/null 2>&1 || die "init (latency) failed"
    if [[ "$mode" == append ]]; then
        timeout 60 "$KTOOL" configs --bootstrap-server "$BS" --alter --entity-type topics --entity-name "$prefix.log" \
            --add-config message.timestamp.type=LogAppendTime >/dev/null || die "latency: cannot set LogAppendTime on $prefix.log"
    fi
    measured_begin
    env $(sluice_env "$prefix" "$url" "$group") SLUICE_HTTP="127.0.0.1:$port" SLUICE_LOG="info,rdkafka=warn,sluice::processor=debug" \
        "${CONTENDER_PIN[@]}" "$SLUICE" --log-format json process 2>"$logf" &
    local pid=$!
    BG_PIDS+=("$pid")
    wait_log "$logf" '"partition starts"' "$PARTITIONS" 60 "$pid" || { tail -20 "$logf" >&2; die "latency: sluice did not start"; }
    log "latency: sluice ($backend) running; paced producer at $rate records/s for $LAT_WARMUP_S + $LAT_SECONDS s"
    paced "$prefix.log" "$rate" "$((LAT_WARMUP_S + LAT_SECONDS))" "$pid" "$name"
    local sent="$SENT" load="$LOAD"
    local deadline=$(($(date +%s) + 120))
    until [[ "$(sysdb_position "$url" "$prefix.log")" == "$PARTITIONS $sent" ]]; do
        (($(date +%s) < deadline)) || die "latency: sluice did not catch up with the $sent paced records"
        sleep 0.1
    done
    curl -fsS "http://127.0.0.1:$port/metrics" >"$WORK/$name.metrics" || log "WARNING: cannot scrape /metrics"
    local cpu
    cpu="$(pid_cpu "$pid")"
    measured_end
    stop_pid "$pid" 30
    cp "$logf" "$LOG_DIR/"
    timeout 120 kcat -C -b "$BS" -t "$prefix.log" -e -o beginning -q -f '%p %o %T\n' >"$WORK/$name.ts"
    python3 "$REPO/scripts/bench/latency.py" --log "$logf" --timestamps "$WORK/$name.ts" --topic "$prefix.log" \
        --metrics "$WORK/$name.metrics" --warmup-ms "$((LAT_WARMUP_S * 1000))" >"$WORK/$name.json" ||
        log "WARNING: latency: no per-record latencies from the log (no 'batch committed' debug lines?); the histogram's are used"
    log "latency ($mode time): sluice ($backend) $(jq -c . "$WORK/$name.json")"
    result "$(jq -c --arg r "$rate" --argjson sent "$sent" --argjson s "$LAT_SECONDS" --argjson w "$LAT_WARMUP_S" --arg cpu "$cpu" --argjson load "$load" --arg kind "$kind" --arg m "$method" \
        --arg c "sluice-$backend" \
        '{kind: $kind, contender: $c, rate: ($r|tonumber), records: $sent, seconds: $s, warmup_s: $w, cpu_s: ($cpu|tonumber),
          load: $load} + . + (if $m == "" then {} else {method: $m} end)' "$WORK/$name.json")"
    bench_delete_topics "$prefix\\..*"
    [[ "$backend" != postgres ]] || pg_drop "suite_${RID}_${name//-/_}"
}

latency_peer() {
    local rate="$1" prefix="$BASE-lat-peer"
    local app="$prefix-peer" err="$WORK/latency-peer.err" out="$WORK/latency-peer.out"
    env $(sluice_env "$prefix" "sqlite://$WORK/lat-peer-topics.db" "$prefix-unused") timeout 300 "$SLUICE" init --partitions "$PARTITIONS" >/dev/null 2>&1 ||
        die "init (peer latency) failed"
    rm -f "$WORK/lat-peer.stop" "$WORK/lat-probe.stop"
    measured_begin
    # shellcheck disable=SC2086
    "${CONTENDER_PIN[@]}" java $PEER_JVM_OPTS -jar "$JAR" --bootstrap "$BS" --topic "$prefix.log" --app-id "$app" \
        --state-dir "$WORK/peer-state-lat" --stop-file "$WORK/lat-peer.stop" --cleanup --timeout-s "$PHASE_TIMEOUT" >"$out" 2>"$err" &
    local pid=$!
    BG_PIDS+=("$pid")
    java -cp "$JAR" sluice.peer.tools.LatencyProbe --bootstrap "$BS" --topic "$app-records-changelog" \
        --stop-file "$WORK/lat-probe.stop" --warmup-ms "$((LAT_WARMUP_S * 1000))" >"$WORK/lat-probe.out" 2>"$WORK/lat-probe.err" &
    local probe=$!
    BG_PIDS+=("$probe")
    wait_log "$err" 'state [A-Z_]+ -> RUNNING' 1 120 "$pid" || { tail -20 "$err" >&2; die "latency: the peer did not reach RUNNING"; }
    sleep 1
    log "latency: peer running; paced producer at $rate records/s for $LAT_WARMUP_S + $LAT_SECONDS s"
    paced "$prefix.log" "$rate" "$((LAT_WARMUP_S + LAT_SECONDS))" "$pid" latency-peer
    local sent="$SENT" load="$LOAD"
    touch "$WORK/lat-peer.stop"
    wait_log "$err" 'peer-caught-up:' 1 120 "$pid" || { tail -20 "$err" >&2; die "latency: the peer did not catch up"; }
    touch "$WORK/lat-probe.stop"
    local rc=0
    wait "$pid" || rc=$?
    measured_end
    wait "$probe" || true
    cp "$err" "$LOG_DIR/latency-peer.log"
    ((rc == 0)) || { tail -20 "$err" >&2; die "latency: the peer exited with $rc"; }
    local line kv
    line="$(grep -o 'latency: n=.*' "$WORK/lat-probe.out" || true)"
    [[ -n "$line" ]] || { cat "$WORK/lat-probe.out" "$WORK/lat-probe.err" >&2; die "latency: no result from the probe"; }
    kv="$(tr ' ' '\n' <<<"${line#latency: }" | awk -F= 'NF == 2 { printf "%s\"%s\": %s", (n++ ? ", " : "{"), $1, $2 } END { print "}" }')"
    log "latency: peer $line"
    result "$(jq -cn --arg r "$rate" --argjson sent "$sent" --argjson s "$LAT_SECONDS" --argjson w "$LAT_WARMUP_S" --argjson kv "$kv" --argjson load "$load" \
        '{kind: "latency", contender: "peer", rate: ($r|tonumber), records: $sent, seconds: $s, warmup_s: $w, load: $load,
          method: "read_committed consumer of the records changelog: receive time - record timestamp (input CreateTime)"} + $kv')"
    bench_delete_topics "$prefix\\..*"
}

# ------------------------------------------------------------------ recovery --------
functions_built() { # waits for the example components' build; fails with its log
    [[ -n "${FUNCTIONS_PID:-}" ]] || die "the example components were not built"
    wait "$FUNCTIONS_PID" || true
    [[ "$(cat "$WORK/functions.rc" 2>/dev/null)" == 0 ]] || { tail -20 "$WORK/functions.log" >&2; die "scripts/build-functions.sh failed (log: $WORK/functions.log)"; }
}

# wasm_phase: W1 with no function, record_counter, and the C component of the same logic
# (scripts/bench-wasm.sh); its row joins RESULTS
wasm_phase() {
    local n=300000 rounds=5 out="$LOG_DIR/wasm.log" json pin=()
    $QUICK && n=30000 rounds=1
    [[ -z "$CONTENDER_CPU" ]] || pin=(--pin)
    functions_built
    SLUICE_BROKERS="$BS" SLUICE_BIN="$SLUICE" "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" "$REPO/scripts/bench-wasm.sh" \
        --records "$n" --rounds "$rounds" "${pin[@]}" >"$out" 2>&1 || { tail -30 "$out" >&2; die "wasm phase failed (log: $out)"; }
    json="$(sed -n 's/^JSON: //p' "$out" | tail -1)"
    [[ -n "$json" ]] || die "wasm phase: no JSON line in $out"
    jq -c '{kind: "wasm"} + .' <<<"$json" >>"$RESULTS"
    grep -vE '^(JSON:|\[bench-wasm )' "$out" >&2 || true
}

backfill_phase() { # the backfill benchmark on this run's broker; its rows join RESULTS
    local n=300000 out="$LOG_DIR/backfill.log" json drop extra
    $QUICK && n=30000
    # a live backlog of 4/5 of n: its drain lasts a few seconds, so the backfill runs
    # through a measurable part of it
    # BACKFILL_REPEATS repeats of the live runs: one differs from the next by more than the
    # 10% goal;
    # the replica on its own core, as the other phases pin their contender (measured:
    # pinning does not narrow the spread between repeats on its own)
    local pin=()
    [[ -z "$CONTENDER_CPU" ]] || pin=(--pin)
    # (started on every CPU: it pins its own processes)
    # and after record_counter the C component of its logic (the "wasm" row)
    functions_built
    "${UNPINNED[@]}" timeout "$PHASE_TIMEOUT" "$REPO/scripts/bench-backfill.sh" --records "$n" --live-records "$((n * 4 / 5))" --backends sqlite --no-statistics \
        --wasm "$REPO/target/functions/count_records.wasm" \
        --repeats "$BACKFILL_REPEATS" "${pin[@]}" >"$out" 2>&1 || { tail -30 "$out" >&2; die "backfill phase failed (log: $out)"; }
    json="$(sed -n 's/^JSON: //p' "$out" | tail -1)"
    [[ -s "$json" ]] || die "backfill phase: no JSON named in $out"
    # The goal's drop: the live records applied while the worker ran, against the time
    # the run without a backfill took for those same records (bench-backfill.sh), the
    # median over the repeats; each repeat's, and the ready function's own cost, beside it.
    drop="$(jq '.summary.sqlite.live_drop_pct_same_records // null' "$json")"
    extra="$(jq -c '.summary.sqlite | {repeats, live_drop_pct_same_records_runs, function_ready_cost_pct,
        live_drop_pct_same_records_ci95, function_ready_cost_pct_runs, live_drop_vs_ready_pct, live_drop_vs_ready_pct_runs} | with_entries(select(.value != null))' "$json")"
    jq -c --argjson drop "$drop" --argjson extra "$extra" '.pinning as $pin | .rows[] | select(.kind == "live" or .kind == "live_ready" or (.kind == "backfill" and (.function == "record_counter" or .function == "wasm"))) | del(.samples)
        | if .kind == "backfill" and $drop != null then . + {live_drop_pct: $drop} + $extra else . end
        | if .kind == "backfill" then . + {pinning: $pin} else . end' \
        "$json" >>"$RESULTS"
    sed -n '/^== sqlite ==/,/^JSON:/p' "$out" >&2
}

recovery_variant() { # recovery_variant NAME RATE [CONFIG_FILE]
    local variant="$1" rate="$2" config="${3:-}" prefix="$BASE-rec"
    local url="sqlite://$WORK/rec.db" group="$prefix-$variant"
    local la="$WORK/recovery-$variant-a.log" lb="$WORK/recovery-$variant-b.log"
    local cfg_env=()
    [[ -z "$config" ]] || cfg_env=(SLUICE_CONFIG="$config")
    env $(sluice_env "$prefix" "$url" "$group") timeout 300 "$SLUICE" init --partitions "$PARTITIONS" >/dev/null 2>&1 || die "init (recovery) failed"
    measured_begin
    env $(sluice_env "$prefix" "$url" "$group") "${cfg_env[@]}" SLUICE_LOG="info,rdkafka=warn,sluice::processor=debug" \
        "${CONTENDER_PIN[@]}" "$SLUICE" --log-format json process 2>"$la" &
    local a=$!
    BG_PIDS+=("$a")
    wait_log "$la" '"partition starts"' "$PARTITIONS" 90 "$a" || { tail -20 "$la" >&2; die "recovery: sluice did not start"; }
    # the paced load runs through the kill and for a while after the restart
    "${REPLAY[@]}" --from "${WL_TOPIC[W1]}" --to "$prefix.log" --rate "$rate" --seconds "$((RECOVERY_WARM_S + 15))" \
        >"$WORK/rec-$variant-replay.out" 2>"$WORK/rec-$variant-replay.err" &
    local rp=$!
    BG_PIDS+=("$rp")
    wait_log "$WORK/rec-$variant-replay.err" 'pacing starts' 1 180 "$rp" || die "recovery: the paced producer did not start"
    local deadline=$(($(date +%s) + 60))
    until [[ "$(sysdb_position "$url" "$prefix.log")" =~ ^[0-9]+\ [1-9] ]]; do # a first batch committed
        (($(date +%s) < deadline)) || { tail -20 "$la" >&2; die "recovery: no batch before the kill"; }
        sleep 0.1
    done
    sleep "$RECOVERY_WARM_S"
    kill -KILL "$a"
    wait "$a" 2>/dev/null || true
    local before t0
    before="$(sysdb_position "$url" "$prefix.log")" # where the killed replica left it
    t0="$(now)"
    env $(sluice_env "$prefix" "$url" "$group") "${cfg_env[@]}" SLUICE_LOG="info,rdkafka=warn,sluice::processor=debug" \
        "${CONTENDER_PIN[@]}" "$SLUICE" --log-format json process 2>"$lb" &
    local b=$!
    BG_PIDS+=("$b")
    # First committed batch: the sysdb position moving (polled every 50 ms), and the
    # replica's own "batch committed" log line (exact, preferred when present).
    local poll_s="" after
    deadline=$(($(date +%s) + 120))
    while :; do
        after="$(sysdb_position "$url" "$prefix.log")"
        # ("0 0": no answer, e.g. the WAL being recovered: not a reading)
        if [[ "$after" != "$before" && "$after" != "0 0" ]]; then poll_s="$(fsub "$(now)" "$t0")"; break; fi
        kill -0 "$b" 2>/dev/null || break
        (($(date +%s) <= deadline)) || break
        sleep 0.05
    done
    wait_log "$lb" '"batch committed"' 1 5 "$b" || true
    local first_ts assign_ts first_s="" assign_s=null method=log
    first_ts="$(jq -r 'select(.fields.message == "batch committed") | .timestamp' "$lb" 2>/dev/null | head -1)"
    assign_ts="$(jq -r 'select(.fields.message == "partition starts") | .timestamp' "$lb" 2>/dev/null | head -1)"
    [[ -z "$first_ts" ]] || first_s="$(fsub "$(iso_epoch "$first_ts")" "$t0")"
    [[ -z "$assign_ts" ]] || assign_s="$(fsub "$(iso_epoch "$assign_ts")" "$t0")"
    [[ -n "$first_s" ]] || { first_s="$poll_s"; method="sysdb poll (50 ms)"; }
    stop_pid "$rp" 10
    stop_pid "$b" 30
    measured_end
    cp "$la" "$lb" "$LOG_DIR/"
    [[ -n "$first_s" ]] || { tail -20 "$lb" >&2; die "recovery ($variant): no committed batch within 120 s of the restart"; }
    log "recovery ($variant): restart -> partitions assigned $assign_s s, first committed batch $first_s s by the $method (sysdb poll saw it at ${poll_s:-?} s; positions after the kill: $before, then $after)"
    result "$(jq -cn --arg v "$variant" --arg f "$first_s" --arg a "$assign_s" --arg r "$rate" --arg cfg "$([[ -n "$config" ]] && cat "$config")" \
        --arg m "$method" --arg p "${poll_s:-null}" \
        '{kind: "recovery", variant: $v, restart_to_first_batch_s: ($f|tonumber), restart_to_assignment_s: ($a|tonumber? // null),
          method: $m, sysdb_poll_s: ($p|tonumber? // null), rate: ($r|tonumber), config: $cfg}')"
}

# ------------------------------------------------------------------ run -------------
for w in W1 W2 W3 W4 W5; do
    in_list "$w" "$WORKLOADS" || continue
    run_workload "$w"
    if [[ "$w" == W1 ]]; then
        if $DO_LATENCY; then
            phase "latency at 50% load: sluice (SQLite)"
            latency_sluice "$((WL_RATE[W1_sqlite] / 2))"
            phase "latency at 50% load: sluice (SQLite), from the broker's append"
            latency_sluice "$((WL_RATE[W1_sqlite] / 2))" append
            phase "latency at 50% load: sluice (PostgreSQL)"
            latency_sluice "$((WL_RATE[W1_postgres] / 2))" create postgres
            if in_list W1 "$PEER_WORKLOADS"; then
                phase "latency at 50% load: peer"
                latency_peer "$((WL_RATE[W1_peer] / 2))"
            fi
        fi
        if $DO_READS; then
            phase "reads: waiting readers' cost, produce -> token read at 50% load (SQLite)"
            reads_phase "$((WL_RATE[W1_sqlite] / 2))"
        fi
        if $DO_CHANGEFEED; then
            phase "changefeed: W1 with the change feed on against off (SQLite)"
            changefeed_phase sqlite
            phase "changefeed: W1 with the change feed on against off (PostgreSQL)"
            changefeed_phase postgres
        fi
        if $DO_RECOVERY; then
            # Half the W1 rate, but never faster than the W1 log lasts through the kill
            # and the restart (the paced producer replays W1 once; --quick's log is short).
            rec_rate=$((WL_RATE[W1_sqlite] / 2))
            rec_cap=$((WL_TOTAL[W1] / (RECOVERY_WARM_S + 30)))
            ((rec_rate <= rec_cap)) || rec_rate=$rec_cap
            phase "recovery: kill -9, restart (default config)"
            if $QUICK; then
                printf '[kafka]\nsession_timeout_ms = 6000\n' >"$WORK/rec-default.toml"
                recovery_variant default "$rec_rate" "$WORK/rec-default.toml"
            else
                recovery_variant default "$rec_rate"
            fi
            phase "recovery: kill -9, restart (static membership)"
            printf '[kafka]\ninstance_id = "%s-rec-static"\n' "$BASE" >"$WORK/rec-static.toml"
            recovery_variant static "$rec_rate" "$WORK/rec-static.toml"
            bench_delete_topics "$BASE-rec\\..*"
        fi
        bench_delete_topics "$BASE-w1\\..*"
    fi
done
if $DO_BACKFILL; then
    phase "backfill: record_counter on SQLite, alone and beside a live backlog"
    backfill_phase
fi
if $DO_WASM; then
    phase "wasm: W1 with a WebAssembly function against the same logic native (SQLite)"
    wasm_phase
fi
phase ""

# ------------------------------------------------------------------ report ----------
mkdir -p "$OUT_DIR"
OUT_JSON="$OUT_DIR/suite-$RUN_DATE.json"
jq -cn --arg commit "$COMMIT" --argjson dirty "$DIRTY" --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --argjson nproc "$NCPU" --arg cpu "$CPU_MODEL" --argjson mem "$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)" \
    --arg kernel "$(uname -r)" --arg pinning "$PINNING" --argjson quick "$QUICK" --arg bs "$BS" \
    --arg cargo "$CARGO_S" --arg mvn "$MVN_S" --arg total "$(fsub "$(now)" "$SCRIPT_T0")" \
    --arg cmd "scripts/bench-suite.sh${ORIG_ARGS:+ $ORIG_ARGS}" --arg jvm "$PEER_JVM_OPTS" \
    --arg java "$(java -version 2>&1 | head -1)" --arg pg "$(psql -X -A -t "$PG_ADMIN_URL" -c 'show server_version' 2>/dev/null)" \
    '{commit: $commit, worktree_dirty: $dirty, date: $date, command: $cmd, quick: $quick,
      machine: {nproc: $nproc, cpu_model: $cpu, mem_total_kb: $mem, kernel: $kernel},
      pinning: $pinning, kafka: ($bs + " (1 broker, KRaft, 4.1.1, loopback)"), postgres: $pg, java: $java,
      peer_jvm_opts: (if $jvm == "" then "JVM defaults" else $jvm end),
      build_s: {cargo_release: ($cargo|tonumber), mvn_package: ($mvn|tonumber), note: "in parallel"},
      wall_s_before_report: ($total|tonumber)}' >"$WORK/meta.json"
python3 "$REPO/scripts/bench/report.py" --meta "$WORK/meta.json" --results "$RESULTS" --phases "$PHASES" --out "$OUT_JSON"
if python3 "$REPO/scripts/bench/chart.py" "$OUT_JSON" "${OUT_JSON%.json}.svg"; then log "chart: ${OUT_JSON%.json}.svg"; else log "WARNING: the chart (scripts/bench/chart.py) failed"; fi
log "JSON: $OUT_JSON; logs: $LOG_DIR"
if ((${#CHECKSUM_FAILURES[@]})); then
    for f in "${CHECKSUM_FAILURES[@]}"; do log "CHECKSUM MISMATCH $f"; done
    die "checksums differ: the contenders did not materialize the same state"
fi

# ------------------------------------------------------------------ page ------------
# A full run becomes BENCHMARKS.md's latest run (the header: "page").
if [[ -z "$PAGE_SKIP" ]]; then
    PAGE_DIR="$REPO/docs/bench"
    PAGE_NAME="suite-$(jq -r '.date[0:10]' "$OUT_JSON")-$COMMIT"
    $DIRTY && PAGE_NAME+="-dirty"
    mkdir -p "$PAGE_DIR"
    cp "$OUT_JSON" "$PAGE_DIR/$PAGE_NAME.json"
    PAGE_NEW=("$PAGE_DIR/$PAGE_NAME.json")
    PAGE_CHART=()
    if [[ -f "${OUT_JSON%.json}.svg" ]]; then
        cp "${OUT_JSON%.json}.svg" "$PAGE_DIR/$PAGE_NAME.svg"
        PAGE_NEW+=("$PAGE_DIR/$PAGE_NAME.svg")
        PAGE_CHART=(--chart "$PAGE_DIR/$PAGE_NAME.svg")
    fi
    if ! python3 "$REPO/scripts/bench/report.py" --json "$PAGE_DIR/$PAGE_NAME.json" --write-page "$REPO/BENCHMARKS.md" "${PAGE_CHART[@]}" >/dev/null; then
        rm -f "${PAGE_NEW[@]}"
        die "BENCHMARKS.md was not updated (the reason above); the run's JSON: $OUT_JSON"
    fi
    # the previous latest run's files go (git keeps them)
    for f in "$PAGE_DIR"/suite-*.json "$PAGE_DIR"/suite-*.svg; do
        [[ ! -e "$f" || "$f" == "$PAGE_DIR/$PAGE_NAME".json || "$f" == "$PAGE_DIR/$PAGE_NAME".svg ]] || rm -f "$f"
    done
    log "BENCHMARKS.md: this run's facts and goals; docs/bench/$PAGE_NAME.* replace the previous run's files: commit them"
else
    log "BENCHMARKS.md and docs/bench/ left as they are ($PAGE_SKIP)"
fi
