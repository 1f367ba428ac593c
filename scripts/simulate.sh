#!/usr/bin/env bash
# The position protocol under deterministic simulation (src/processor/simulation/): the
# real router, workers and commit path on a SQLite sysdb against a simulated broker, one
# seed per world (docs/chaos.md, "The deterministic simulation").
#
# Usage: scripts/simulate.sh --seeds N [--from S]   # run seeds S..S+N, print the shortest failing one
#        scripts/simulate.sh --seed S               # replay one seed and print its log
#   --mistake a|b|c|d|e switch a known mistake on in every replica: (a) the group commit
#                       before the sysdb commit, (b) start from the group offset, (c) no
#                       compare-and-set, (d) a transaction marker counted as a record,
#                       (e) a revoke confirmed before its partitions' workers stopped
#   --replay            with --seeds: run each seed twice and compare the traces (and logs)
#   --release           the optimized build (the default is the debug build, as in CI)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
usage() { sed -n '5,13p' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --seeds) export SLUICE_SIM_SEEDS="$2"; shift 2 ;;
        --from) export SLUICE_SIM_FROM="$2"; shift 2 ;;
        --seed) export SLUICE_SIM_SEED="$2"; shift 2 ;;
        --mistake) export SLUICE_SIM_MISTAKE="$2"; shift 2 ;;
        --replay) export SLUICE_SIM_REPLAY=1; shift ;;
        --release) profile=(--release); shift ;;
        *) usage ;;
    esac
done
if [ -z "${SLUICE_SIM_SEEDS:-}" ] && [ -z "${SLUICE_SIM_SEED:-}" ]; then
    usage
fi
exec cargo test "${profile[@]}" -p sluice --lib -- --ignored --exact --nocapture \
    processor::simulation::tests::simulate
