#!/usr/bin/env bash
# Regenerate testdata/murmur2_vectors.tsv: murmur2 hashes and partitions computed by the
# real Apache Kafka Java client (pinned version, see deploy/local/kafka.sh) for a fixed,
# deterministic set of keys (scripts/Murmur2Vectors.java says which, and the columns).
#
#   scripts/gen-murmur2-vectors.sh            write testdata/murmur2_vectors.tsv
#   scripts/gen-murmur2-vectors.sh --check    regenerate and diff against the checked-in file
#   scripts/gen-murmur2-vectors.sh OUT.tsv    write elsewhere
#
# Needs a JDK 17+ (javac); fetches the Kafka jars on first use (Maven, see deploy/local/lib.sh).
set -euo pipefail

SLUICE_PROG="gen-murmur2-vectors.sh"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/local/lib.sh"

target="$SLUICE_REPO/testdata/murmur2_vectors.tsv"
check=0
case "${1:-}" in
--check) check=1 ;;
-h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
"") ;;
*) target="$1" ;;
esac

sluice_require_java jdk
sluice_kafka_ensure_jars
sluice_kafka_write_log4j2
clients_jar="$SLUICE_KAFKA_LIBS/kafka-clients-$KAFKA_VERSION.jar"
[[ -f "$clients_jar" ]] || sluice_die "missing $clients_jar; refetch with: rm -f $SLUICE_KAFKA_HOME/$KAFKA_VERSION/.fetched && deploy/local/kafka.sh fetch"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
javac -encoding UTF-8 -Xlint:all -Werror -d "$tmp/classes" -cp "$clients_jar" \
    "$SLUICE_REPO/scripts/Murmur2Vectors.java"
java -Dlog4j2.configurationFile="$SLUICE_KAFKA_ETC/log4j2-tools.xml" \
    -cp "$tmp/classes:$SLUICE_KAFKA_LIBS/*" Murmur2Vectors >"$tmp/vectors.tsv"

if ((check)); then
    if diff -u "$target" "$tmp/vectors.tsv"; then
        echo "$target is up to date (Kafka $KAFKA_VERSION)"
    else
        sluice_die "$target differs from what Kafka $KAFKA_VERSION computes; regenerate with: scripts/gen-murmur2-vectors.sh"
    fi
    exit 0
fi
mkdir -p "$(dirname "$target")"
mv "$tmp/vectors.tsv" "$target"
echo "wrote $target: $(($(wc -l <"$target") - 1)) vectors from kafka-clients $KAFKA_VERSION"
