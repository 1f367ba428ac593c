#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what is missing, starts the local
# services the tests need (Kafka, PostgreSQL, Prometheus), builds, and runs every test.
# Logs of the services: .local/kafka/run/..., .local/postgres/log/...,
# .local/prometheus/prometheus.log (paths printed).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/local/deps.sh
deploy/local/prometheus.sh start
deploy/local/kafka.sh start
deploy/local/kafka-auth.sh start # SASL_SSL/SCRAM broker on 29192 (integration-tests/tests/auth_broker.rs)
deploy/local/postgres.sh start
deploy/local/python-env.sh >/dev/null
cargo build --locked --bin sluice
cargo test --locked --workspace --no-fail-fast
integration-tests/scripts/kafka-scripts.sh
# Hostile input: each fuzz target for a stated time (SLUICE_FUZZ_SECONDS, default 20 here;
# scripts/fuzz.sh alone defaults to 60).
scripts/fuzz.sh "${SLUICE_FUZZ_SECONDS:-20}"
