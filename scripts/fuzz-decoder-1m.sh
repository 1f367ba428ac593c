#!/usr/bin/env bash
# Runs 1,000,000 arbitrary, mutated and truncated inputs through the hand-written
# LogRecord decoder (record/src/codec.rs) and fails if any of them panics.
# Prints the count, the wall time and how many inputs ended in each error kind.
#
# Usage: scripts/fuzz-decoder-1m.sh [--release]
#   Default is the dev profile, where integer overflow panics (so an unchecked length
#   addition would be caught); --release runs the optimized build. SLUICE_FUZZ_SEED=<u64>
#   varies the inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
time cargo test "$@" -p sluice-record --lib -- --ignored --exact --nocapture \
    codec::tests::decoder_survives_one_million_arbitrary_inputs
