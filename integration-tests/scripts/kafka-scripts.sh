#!/usr/bin/env bash
# Checks the local Kafka scripts' contract: a second start is a no-op, stop works, and a
# three-broker cluster creates topics with replication factor 3. Uses ports 29092-29094
# (controller 29095, below the ephemeral port range), the same as the 3-broker
# integration tests, so that it runs beside the single test broker on 9092.
set -euo pipefail
cd "$(dirname "$0")/../.."
export SLUICE_KAFKA_PORT=29092 SLUICE_KAFKA_CONTROLLER_PORT=29095
k=deploy/local/kafka.sh
cleanup() { $k stop --brokers 3 >/dev/null 2>&1 || true; $k wipe --brokers 3 >/dev/null 2>&1 || true; }
trap cleanup EXIT
$k start --brokers 3
out="$($k start --brokers 3 2>&1)"
grep -qi "already running" <<<"$out" || { echo "FAIL: second start did not say it is already running: $out"; exit 1; }
bs="$($k bootstrap --brokers 3)"
topic="scripts-check-$RANDOM"
deploy/local/kafka-tool.sh topics --bootstrap-server "$bs" --create --topic "$topic" --partitions 3 >/dev/null
desc="$(deploy/local/kafka-tool.sh topics --bootstrap-server "$bs" --describe --topic "$topic" 2>/dev/null)"
grep -q "ReplicationFactor: 3" <<<"$desc" || { echo "FAIL: topic is not replicated 3 times: $desc"; exit 1; }
$k stop --brokers 3
$k stop --brokers 3
echo "kafka scripts: 3 passed, 0 failed"
