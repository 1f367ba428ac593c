#!/usr/bin/env bash
# The chaos run: `sluice process` replicas killed (-9), frozen (SIGSTOP/SIGCONT, some past
# the session timeout) and restarted, one action (a "cycle") every 1.5-4.5 s, while plain
# (`sluice produce`), idempotent and transactional producers write (some transactions
# aborted, some records with values up to the validation limits, about 1.5 MB each), a
# reader pages through the records over HTTP and `sluice records` in a loop, functions are
# attached and detached and hostile records arrive (garbage, truncated Avro, wrong
# dimension, misrouted, wrong key). Then the materialized state, every function output,
# the DLQ and the positions (lag 0) must equal what the reference model computes from a
# read_committed read of the log, no partition may have halted and no replica may have
# exited by itself (one that fails to start included).
#
#   scripts/chaos.sh [--cycles N | --minutes N] [--backend sqlite|postgres|both]
#                    [--one-at-a-time] [--seed S]
#
# Backends: postgres = 3 replicas on a fresh PostgreSQL database; sqlite = 2 replicas
# sharing one SQLite file. With both (the default) N is split between them (the
# PostgreSQL run gets the odd cycle or minute) and the two runs go at the same time, in
# one test process; --one-at-a-time runs them one after the other instead.
# Default: --cycles 1000 --backend both, so 500 cycles on each backend: about an hour on a
# 2-core machine (SQLite, with two replicas often both down, is the slower), an hour and
# a half one at a time (not for CI, which runs 45 s on PostgreSQL and 30 s on SQLite).
#
# It is the integration tests `chaos::chaos_on_postgres` and `chaos::chaos_on_sqlite`
# (integration-tests/tests/it/chaos.rs) run for longer; the workload is
# scripts/chaos/driver.py (Python venv from deploy/local/python-env.sh: confluent-kafka,
# fastavro). Each run directory (replica logs, manifest.json with the hostile records
# sent and the figures) is printed at its start; re-check a finished run with
#   SLUICE_CHAOS_MANIFEST=/tmp/sluice-it-chaos-.../manifest.json \
#     cargo test -p sluice-integration-tests --test it -- --ignored chaos::check_manifest --nocapture
# Exit status: 0 when every check of every run passes; the failures are listed one per
# line ("chaos check FAILURE: ...") before the test's panic.
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=""
minutes=""
backend=both
together=1
seed=1
usage="usage: $0 [--cycles N | --minutes N] [--backend sqlite|postgres|both] [--one-at-a-time] [--seed S]"
while [ $# -gt 0 ]; do
  case "$1" in
    --cycles) cycles="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --one-at-a-time) together=0; shift ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 ($usage)" >&2; exit 2 ;;
  esac
done
if [ -n "$cycles" ] && [ -n "$minutes" ]; then
  echo "--cycles and --minutes exclude each other ($usage)" >&2; exit 2
fi
[ -n "$cycles" ] || [ -n "$minutes" ] || cycles=1000
case "$backend" in
  postgres) backends=(postgres) ;;
  sqlite) backends=(sqlite) ;;
  both) backends=(postgres sqlite) ;;
  *) echo "--backend is sqlite, postgres or both ($usage)" >&2; exit 2 ;;
esac
# Start the local services only when nothing answers on their ports (a broker started
# from another checkout is used as it is).
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
answers 9092 || deploy/local/kafka.sh start
if [ "$backend" != sqlite ]; then answers 55432 || deploy/local/postgres.sh start; fi
deploy/local/python-env.sh >/dev/null
cargo build --locked --bin sluice -p sluice
cargo test --locked -p sluice-integration-tests --test it --no-run
n=${#backends[@]}
# The share of N of the i-th backend: the first takes the remainder.
share() {
  if [ -n "$cycles" ]; then echo $(( cycles / n + ($1 == 0 ? cycles % n : 0) ))
  else echo $(( minutes / n + ($1 == 0 ? minutes % n : 0) )); fi
}
unit() { if [ -n "$cycles" ]; then echo cycles; else echo min; fi; }
# SLUICE_CHAOS_CYCLES / SLUICE_CHAOS_SECONDS for the i-th backend.
vars() {
  if [ -n "$cycles" ]; then echo "SLUICE_CHAOS_CYCLES=$(share "$1")"
  else echo "SLUICE_CHAOS_SECONDS=$(( $(share "$1") * 60 ))"; fi
}
rc=0
summary=()
if [ "$together" = 1 ] && [ "$n" = 2 ]; then
  # One test process, one test thread per backend. The PostgreSQL and SQLite tests read
  # their own variables (SLUICE_CHAOS_CYCLES_POSTGRES, ..._SQLITE) before the shared ones.
  started=$(date +%s)
  set +e
  env "$(vars 0 | sed 's/=/_POSTGRES=/')" "$(vars 1 | sed 's/=/_SQLITE=/')" \
    SLUICE_CHAOS_SEED="$seed" SLUICE_CHAOS_STALL_SECONDS=30 \
    cargo test --locked -p sluice-integration-tests --test it -- \
    chaos::chaos_on_postgres chaos::chaos_on_sqlite --exact --nocapture --test-threads 2
  rc=$?
  set -e
  summary+=("chaos.sh: postgres $(share 0) $(unit) and sqlite $(share 1) $(unit) of chaos at the same time, $(( $(date +%s) - started )) s in all, exit status $rc")
else
  for i in "${!backends[@]}"; do
    b=${backends[$i]}
    started=$(date +%s)
    set +e
    env "$(vars "$i")" SLUICE_CHAOS_SEED="$seed" SLUICE_CHAOS_STALL_SECONDS=30 \
      cargo test --locked -p sluice-integration-tests --test it -- "chaos::chaos_on_$b" --exact --nocapture
    r=$?
    set -e
    [ "$r" = 0 ] || rc=$r
    summary+=("chaos.sh: $b: $(share "$i") $(unit) of chaos, $(( $(date +%s) - started )) s in all, exit status $r")
  done
fi
printf '%s\n' "${summary[@]}" >&2
exit $rc
