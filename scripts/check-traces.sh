#!/usr/bin/env bash
# The OTLP trace export against a real collector: builds Jaeger all-in-one from the Go
# module proxy on first use (about 17 minutes on a cold machine, which is why
# scripts/test.sh does not run this), starts it on loopback, and runs the trace tests of
# integration-tests/tests/it/traces.rs. Kafka must be running (deploy/local/kafka.sh start).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/local/jaeger.sh start
trap 'deploy/local/jaeger.sh stop >/dev/null 2>&1 || true' EXIT
cargo build --locked --bin sluice
CI="${CI:-true}" cargo test --locked -p sluice-integration-tests --test it -- --ignored traces::
