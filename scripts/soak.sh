#!/usr/bin/env bash
# The long soak: two replicas for MINUTES (default 30) at a steady rate, one killed with
# SIGKILL and restarted every KILL_EVERY seconds (default 180), a function attached
# midway on a collection of a partition the long-lived replica holds; the state must equal
# the reference model and the long-lived replica's RSS must grow less than 10% after
# warm-up (medians of 60 s windows, like for like: same number of partitions held).
# Prints the samples table and the numbers (record them in docs/soak.md); every sample is
# also written as CSV to SAMPLES (default target/soak-samples.csv).
#   scripts/soak.sh [MINUTES] [RATE_PER_SECOND]
# Extra environment for both replicas (e.g. to compare allocator settings):
#   SLUICE_SOAK_REPLICA_ENV=MALLOC_ARENA_MAX=2 scripts/soak.sh 10
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-30}"
rate="${2:-1000}"
deploy/local/kafka.sh start
cargo build --release --locked --bin sluice -p sluice
cargo build --release --locked -p sluice-integration-tests --tests
mkdir -p target
SLUICE_SOAK_SAMPLES="${SAMPLES:-$PWD/target/soak-samples.csv}" \
SLUICE_SOAK_MAX_RSS_GROWTH=10 SLUICE_SOAK_SECONDS=$((minutes * 60)) SLUICE_SOAK_RATE="$rate" SLUICE_SOAK_KILL_EVERY="${KILL_EVERY:-180}" \
    cargo test --release --locked -p sluice-integration-tests --test it -- soak:: --nocapture
