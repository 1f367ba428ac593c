#!/usr/bin/env bash
# The long soak: two replicas for MINUTES (default 30) at a steady rate, one killed with
# SIGKILL and restarted every KILL_EVERY seconds (default 180), a function attached
# midway; the state must equal the reference model and the long-lived replica's RSS must
# grow less than 10% after warm-up. Prints the numbers (record them in docs/soak.md).
#   scripts/soak.sh [MINUTES] [RATE_PER_SECOND]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-30}"
rate="${2:-1000}"
deploy/local/kafka.sh start
cargo build --release --locked --bin sluice -p sluice
cargo build --release --locked -p sluice-integration-tests --tests
SLUICE_SOAK_MAX_RSS_GROWTH=10 SLUICE_SOAK_SECONDS=$((minutes * 60)) SLUICE_SOAK_RATE="$rate" SLUICE_SOAK_KILL_EVERY="${KILL_EVERY:-180}" \
    cargo test --release --locked -p sluice-integration-tests --test soak -- --nocapture
