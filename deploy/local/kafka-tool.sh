#!/usr/bin/env bash
# Run an Apache Kafka CLI tool from the locally cached jars (fetched on first use, see
# lib.sh). Same tools as the bin/kafka-*.sh scripts of the Kafka distribution.
#
#   deploy/local/kafka-tool.sh NAME [ARGS...]
#   deploy/local/kafka-tool.sh list               names and classes
#   deploy/local/kafka-tool.sh some.java.Class [ARGS...]   any class on the classpath
#
# Examples:
#   BS=$(deploy/local/kafka.sh bootstrap)
#   deploy/local/kafka-tool.sh topics --bootstrap-server "$BS" --create --topic t --partitions 3
#   deploy/local/kafka-tool.sh topics --bootstrap-server "$BS" --describe --topic t
#   deploy/local/kafka-tool.sh consumer-groups --bootstrap-server "$BS" --describe --all-groups
#   deploy/local/kafka-tool.sh get-offsets --bootstrap-server "$BS" --topic t
#
# JVM options: SLUICE_KAFKA_TOOL_OPTS (default -Xmx512m).
set -euo pipefail

SLUICE_PROG="kafka-tool.sh"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# NAME -> main class, for the pinned Kafka version (checked against its jars).
TOOLS=(
    "topics                org.apache.kafka.tools.TopicCommand"
    "consumer-groups       org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
    "consumer-perf-test    org.apache.kafka.tools.ConsumerPerformance"
    "producer-perf-test    org.apache.kafka.tools.ProducerPerformance"
    "get-offsets           org.apache.kafka.tools.GetOffsetShell"
    "console-producer      org.apache.kafka.tools.ConsoleProducer"
    "console-consumer      org.apache.kafka.tools.consumer.ConsoleConsumer"
    "broker-api-versions   org.apache.kafka.tools.BrokerApiVersionsCommand"
    "metadata-quorum       org.apache.kafka.tools.MetadataQuorumCommand"
    "delete-records        org.apache.kafka.tools.DeleteRecordsCommand"
    "leader-election       org.apache.kafka.tools.LeaderElectionCommand"
    "reassign-partitions   org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
    "transactions          org.apache.kafka.tools.TransactionsCommand"
    "configs               kafka.admin.ConfigCommand"
    "storage               kafka.tools.StorageTool"
    "dump-log              kafka.tools.DumpLogSegments"
)

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    echo "Tools:"
    printf '  %s\n' "${TOOLS[@]}"
}

main() {
    local name="${1:-}"
    case "$name" in
    "" | -h | --help | help)
        usage
        [[ -n "$name" ]] || exit 2
        return 0
        ;;
    list)
        printf '%s\n' "${TOOLS[@]}"
        return 0
        ;;
    esac
    shift
    local entry class=""
    for entry in "${TOOLS[@]}"; do
        if [[ "${entry%% *}" == "$name" ]]; then
            class="$(awk '{print $2}' <<<"$entry")"
            break
        fi
    done
    if [[ -z "$class" ]]; then
        [[ "$name" == *.* ]] || sluice_die "unknown tool '$name'; known: $(printf '%s\n' "${TOOLS[@]}" | awk '{print $1}' | tr '\n' ' ')(or a fully qualified class name)"
        class="$name"
    fi
    sluice_require_java jre
    sluice_kafka_ensure_jars
    sluice_kafka_write_log4j2
    local -a opts
    read -r -a opts <<<"${SLUICE_KAFKA_TOOL_OPTS:--Xmx512m}"
    exec java "${opts[@]}" -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$SLUICE_KAFKA_ETC/log4j2-tools.xml" \
        -cp "$SLUICE_KAFKA_LIBS/*" "$class" "$@"
}

main "$@"
