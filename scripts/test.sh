#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what is missing, starts the local
# services the tests need (Kafka, PostgreSQL, Prometheus), builds, and runs every test.
# Logs of the services: .local/kafka/run/..., .local/postgres/log/...,
# .local/prometheus/prometheus.log (paths printed).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/local/deps.sh
# Prometheus first: its port (59090) is in the ephemeral range, so bind it before the
# Kafka clients start taking local ports.
deploy/local/prometheus.sh start
deploy/local/kafka.sh start
deploy/local/kafka-auth.sh start # SASL_SSL/SCRAM broker on 29192 (integration-tests/tests/auth_broker.rs)
deploy/local/postgres.sh start
deploy/local/python-env.sh >/dev/null
cargo build --locked --bin sluice
cargo test --locked --workspace --no-fail-fast
integration-tests/scripts/kafka-scripts.sh
