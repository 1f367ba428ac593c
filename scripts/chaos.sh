#!/usr/bin/env bash
# The chaos run: 3 `sluice process` replicas on PostgreSQL killed (-9), frozen
# (SIGSTOP/SIGCONT) and restarted for MINUTES (default 10) while plain (`sluice produce`),
# idempotent and transactional producers (some transactions aborted) write, functions are
# attached and detached and hostile records arrive (garbage, truncated Avro, wrong
# dimension, misrouted, wrong key). Then the materialized state, every function output,
# the DLQ and the positions (lag 0) must equal what the reference model computes from a
# read_committed read of the log, and no partition may have halted.
#
#   scripts/chaos.sh [--minutes N] [--seed S]
#
# It is the integration test `chaos::chaos_on_postgres` (integration-tests/tests/it/chaos.rs,
# which CI runs for 45 s) run for longer; the workload is scripts/chaos/driver.py (Python
# venv from deploy/local/python-env.sh: confluent-kafka, fastavro). The run directory
# (replica logs, manifest.json with the hostile records sent and the figures) is printed at
# the start; re-check a finished run with
#   SLUICE_CHAOS_MANIFEST=/tmp/sluice-it-chaos-.../manifest.json \
#     cargo test -p sluice-integration-tests --test it -- --ignored chaos::check_manifest --nocapture
# Exit status: 0 when every check passes; the failures are listed one per line
# ("chaos check FAILURE: ...") before the test's panic.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=10
seed=1
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (usage: $0 [--minutes N] [--seed S])" >&2; exit 2 ;;
  esac
done
# Start the local services only when nothing answers on their ports (a broker started
# from another checkout is used as it is).
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
answers 9092 || deploy/local/kafka.sh start
answers 55432 || deploy/local/postgres.sh start
deploy/local/python-env.sh >/dev/null
cargo build --locked --bin sluice -p sluice
cargo test --locked -p sluice-integration-tests --test it --no-run
started=$(date +%s)
set +e
SLUICE_CHAOS_SECONDS=$((minutes * 60)) SLUICE_CHAOS_SEED="$seed" \
  cargo test --locked -p sluice-integration-tests --test it -- chaos::chaos_on_postgres --exact --nocapture
rc=$?
set -e
echo "chaos.sh: ${minutes} min of chaos, $(( $(date +%s) - started )) s in all, exit status $rc" >&2
exit $rc
