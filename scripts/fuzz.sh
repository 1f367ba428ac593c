#!/usr/bin/env bash
# Fuzz Sluice's hostile-input surfaces with cargo-fuzz (libFuzzer), each target for a
# stated time, and print executions and the outcome per target.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      default 60
#   FUZZ_TARGETS="jsonl_line" scripts/fuzz.sh 30
#
# Targets (fuzz/fuzz_targets/):
#   decode_log_record   bytes -> record::codec::decode and borrowed::decode_ref (same answer; round trip, validate = validate_ref)
#   jsonl_line          bytes -> UTF-8 -> cli::jsonl::parse_line (the `sluice produce` input)
#   http_records_body   bytes -> record::items::parse_body + parse_items (POST .../records)
#   decode_differential bytes -> codec::decode vs apache-avro's generic decode of
#                       schemas/log_record.avsc: the same record or both an error (two
#                       known apache-avro leniencies are counted in the log, not failures;
#                       see the target's header)
#
# Needs the nightly toolchain and cargo-fuzz (installed here when missing). The crate is
# built once with `cargo +nightly fuzz build -s none`: optimized, with debug assertions
# and overflow checks (cargo-fuzz's defaults), without AddressSanitizer: with ASan,
# cargo-fuzz also compiles the C dependencies with -fsanitize=address, and the bundled
# librdkafka's configure then fails its link checks against that zstd. (The code under
# test is safe Rust except one `set_len`, guarded by a debug assertion.) Each run starts
# from the checked-in seeds (fuzz/seeds/<target>; decode_differential uses
# decode_log_record's), valid encodings written by
# fuzz/examples/gen_seeds.rs) plus the corpus grown by earlier runs (fuzz/corpus/<target>,
# git-ignored). A crash, a panic, a timeout (> 10 s per input), one allocation over 256 MB
# or an RSS over 2 GB is a failure: the reproducer is written to fuzz/artifacts/<target>/
# (replay: cd fuzz && cargo +nightly fuzz run -s none <target> <file>) and the script exits 1
# after running the remaining targets. Logs: fuzz/artifacts/<target>.log; the table:
# fuzz/artifacts/summary.txt.
set -euo pipefail

SECS="${1:-60}"
[[ "$SECS" =~ ^[0-9]+$ && "$SECS" -gt 0 ]] || { echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ="$ROOT/fuzz"
read -r -a TARGETS <<<"${FUZZ_TARGETS:-decode_log_record jsonl_line http_records_body decode_differential}"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz.sh: installing the nightly toolchain" >&2
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz
fi

cd "$FUZZ"
echo "== building fuzz targets (cargo +nightly fuzz build -s none)"
mkdir -p "$FUZZ/artifacts"
build_log="$FUZZ/artifacts/build.log"
build_start=$(date +%s)
if ! cargo +nightly fuzz build -s none >"$build_log" 2>&1; then
    # The cause is at the end; the head is cargo's progress lines.
    echo "fuzz.sh: the last 60 lines of $build_log:" >&2
    tail -n 60 "$build_log" >&2
    df -h "$FUZZ" >&2 || true
    echo "fuzz.sh: the fuzz targets did not build (whole log: $build_log)" >&2
    exit 1
fi
echo "== built in $(( $(date +%s) - build_start ))s"

# The seeds are checked in; the generator must still build and write exactly them, so a
# change to the record types cannot leave it behind (a stable build of the example).
echo "== the checked-in seeds are what fuzz/examples/gen_seeds.rs writes"
# Written under the artifacts (replaced on every run), so a mismatch can be looked at.
seeds_now="$FUZZ/artifacts/gen_seeds"
rm -rf "$seeds_now" && mkdir -p "$seeds_now"
if ! cargo run -q --example gen_seeds -- "$seeds_now" >"$FUZZ/artifacts/gen_seeds.log" 2>&1; then
    tail -n 40 "$FUZZ/artifacts/gen_seeds.log" >&2
    echo "fuzz.sh: fuzz/examples/gen_seeds.rs did not build or run (log: $FUZZ/artifacts/gen_seeds.log)" >&2
    exit 1
fi
if ! diff -r "$FUZZ/seeds" "$seeds_now" >&2; then
    echo "fuzz.sh: fuzz/seeds differs from what gen_seeds writes (into $seeds_now); regenerate them (cd fuzz && cargo run --example gen_seeds) and commit" >&2
    exit 1
fi
rm -rf "$seeds_now"

SUMMARY="$FUZZ/artifacts/summary.txt"
failed=()
printf '\n%-20s %8s %14s %10s %8s  %s\n' TARGET SECONDS EXECS EXECS/S CORPUS OUTCOME > "$SUMMARY"
for t in "${TARGETS[@]}"; do
    mkdir -p "$FUZZ/corpus/$t" "$FUZZ/artifacts/$t"
    log="$FUZZ/artifacts/$t.log"
    echo "== $t: ${SECS}s (log: $log)"
    set +e
    # The differential target starts from the decoder's seeds (valid encodings).
    seeds="$FUZZ/seeds/$t"
    [[ "$t" == decode_differential ]] && seeds="$FUZZ/seeds/decode_log_record"
    cargo +nightly fuzz run -s none "$t" "$FUZZ/corpus/$t" "$seeds" -- \
        -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
        -max_len=16384 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
    corpus=$(find "$FUZZ/corpus/$t" -type f | wc -l)
    if [[ $rc -eq 0 ]]; then
        outcome="ok, no crash"
    else
        artifact=$(grep -o 'Test unit written to [^ ]*' "$log" | tail -n1 | sed 's/Test unit written to //')
        outcome="FAILED (exit $rc) ${artifact:-see log}"
        failed+=("$t")
        grep -E 'panicked|ERROR: libFuzzer|SUMMARY' "$log" | head -n 5 >&2 || true
    fi
    printf '%-20s %8s %14s %10s %8s  %s\n' "$t" "$SECS" "${execs:-?}" "${rate:-?}" "$corpus" "$outcome" >> "$SUMMARY"
    tail -n 1 "$SUMMARY"
done

cat "$SUMMARY"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz.sh: crashes in: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: no crash in ${#TARGETS[@]} targets x ${SECS}s"
