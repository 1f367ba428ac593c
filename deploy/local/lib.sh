# shellcheck shell=bash
# Shared helpers for the local Apache Kafka scripts. Sourced (not executed) by
# deploy/local/kafka.sh, deploy/local/kafka-tool.sh and scripts/gen-murmur2-vectors.sh.
#
# Everything lives under $SLUICE_KAFKA_HOME (default: <repo>/.local/kafka, git-ignored):
#   <version>/libs/          the broker + tools jars, fetched once from Maven Central
#   <version>/.fetched       marker: the cache is complete (records the pom's checksum)
#   etc/                     generated log4j2 configurations
#   run/brokers-<N>/node-<i> data, server.properties, pid and logs of each node

SLUICE_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SLUICE_LOCAL_DIR="$SLUICE_REPO/deploy/local"
SLUICE_KAFKA_HOME="${SLUICE_KAFKA_HOME:-$SLUICE_REPO/.local/kafka}"

# The pinned version is the KAFKA_VERSION line at the top of kafka.sh (one place to bump).
if [[ -z "${KAFKA_VERSION:-}" ]]; then
    # shellcheck disable=SC2016 # a literal ${...} in the pattern
    KAFKA_VERSION="$(sed -n 's/^KAFKA_VERSION="\${KAFKA_VERSION:-\([0-9][0-9.]*\)}".*/\1/p' \
        "$SLUICE_LOCAL_DIR/kafka.sh" | head -n 1)"
    [[ -n "$KAFKA_VERSION" ]] || {
        echo "error: cannot read the pinned KAFKA_VERSION from $SLUICE_LOCAL_DIR/kafka.sh" >&2
        exit 1
    }
fi
SLUICE_KAFKA_LIBS="$SLUICE_KAFKA_HOME/$KAFKA_VERSION/libs"
SLUICE_KAFKA_POM="$SLUICE_LOCAL_DIR/kafka/pom.xml"
SLUICE_KAFKA_ETC="$SLUICE_KAFKA_HOME/etc"

SLUICE_PROG="${SLUICE_PROG:-$(basename "$0")}"

sluice_die() {
    echo "$SLUICE_PROG: error: $*" >&2
    exit 1
}

sluice_info() {
    echo "$SLUICE_PROG: $*" >&2
}

# Java 17+ on PATH; $1 = jdk: javac is needed too, jre: java is enough.
sluice_require_java() {
    local need="$1" out ver major
    command -v java >/dev/null 2>&1 ||
        sluice_die "java not found on PATH (Java 17+ is required). Fix: apt-get install -y openjdk-17-jdk-headless"
    out="$(java -version 2>&1)" || sluice_die "'java -version' failed: $out"
    ver="$(sed -n 's/.*version "\([^"]*\)".*/\1/p' <<<"$out" | head -n 1)"
    [[ -n "$ver" ]] || sluice_die "cannot parse the output of 'java -version': $out"
    if [[ "$ver" == 1.* ]]; then
        major="$(cut -d. -f2 <<<"$ver")"
    else
        major="${ver%%[.+-]*}"
    fi
    [[ "$major" =~ ^[0-9]+$ ]] || sluice_die "cannot parse the Java version '$ver'"
    if ((major < 17)); then
        sluice_die "Java $ver found ($(command -v java)), Kafka $KAFKA_VERSION needs Java 17+. Fix: apt-get install -y openjdk-17-jdk-headless && update-alternatives --config java"
    fi
    if [[ "$need" == jdk ]]; then
        command -v javac >/dev/null 2>&1 ||
            sluice_die "javac not found on PATH (a Java 17+ JDK is required, not only a JRE). Fix: apt-get install -y openjdk-17-jdk-headless"
    fi
}

sluice_require_mvn() {
    command -v mvn >/dev/null 2>&1 ||
        sluice_die "mvn not found on PATH (Maven fetches the Kafka jars from Maven Central). Fix: apt-get install -y maven"
}

# Checksum of the pom: a changed pom invalidates the jar cache.
sluice_kafka_pom_sum() {
    sha256sum "$SLUICE_KAFKA_POM" | cut -d' ' -f1
}

sluice_kafka_jars_ready() {
    local marker="$SLUICE_KAFKA_HOME/$KAFKA_VERSION/.fetched"
    [[ -f "$marker" && -d "$SLUICE_KAFKA_LIBS" ]] || return 1
    [[ "$(cat "$marker")" == "kafka=$KAFKA_VERSION pom=$(sluice_kafka_pom_sum)" ]]
}

# Fetch the jars of Kafka $KAFKA_VERSION into $SLUICE_KAFKA_LIBS unless the cache is
# complete. Safe to run concurrently (flock), and a failed fetch leaves no half cache.
sluice_kafka_ensure_jars() {
    sluice_kafka_jars_ready && return 0
    sluice_require_java jre
    sluice_require_mvn
    [[ -f "$SLUICE_KAFKA_POM" ]] || sluice_die "missing $SLUICE_KAFKA_POM"
    local vdir="$SLUICE_KAFKA_HOME/$KAFKA_VERSION"
    mkdir -p "$vdir"
    local lockfd
    if command -v flock >/dev/null 2>&1; then
        exec {lockfd}>"$vdir/.fetch.lock"
        flock "$lockfd"
        if sluice_kafka_jars_ready; then # another process fetched meanwhile
            exec {lockfd}>&-
            return 0
        fi
    fi
    local tmp="$vdir/libs.tmp.$$" log="$vdir/fetch.log" t0=$SECONDS
    rm -rf "$tmp"
    sluice_info "fetching the Apache Kafka $KAFKA_VERSION jars from Maven Central (one time; log: $log)..."
    if ! mvn -B -f "$SLUICE_KAFKA_POM" -Dkafka.version="$KAFKA_VERSION" -Dkafka.libs="$tmp" \
        dependency:copy-dependencies >"$log" 2>&1; then
        rm -rf "$tmp"
        tail -n 30 "$log" >&2
        sluice_die "Maven could not fetch the Kafka $KAFKA_VERSION jars (full log: $log). Check that Maven Central is reachable (proxy settings in ~/.m2/settings.xml), then retry: mvn -B -f $SLUICE_KAFKA_POM -Dkafka.version=$KAFKA_VERSION dependency:copy-dependencies"
    fi
    local jar
    for jar in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar" \
        "kafka-tools-$KAFKA_VERSION.jar" "kafka-storage-$KAFKA_VERSION.jar" \
        "kafka-server-$KAFKA_VERSION.jar"; do
        [[ -f "$tmp/$jar" ]] || {
            rm -rf "$tmp"
            sluice_die "the fetch did not produce $jar (see $log)"
        }
    done
    rm -rf "$SLUICE_KAFKA_LIBS"
    mv "$tmp" "$SLUICE_KAFKA_LIBS"
    echo "kafka=$KAFKA_VERSION pom=$(sluice_kafka_pom_sum)" >"$vdir/.fetched"
    sluice_info "fetched $(find "$SLUICE_KAFKA_LIBS" -name '*.jar' | wc -l) jars into $SLUICE_KAFKA_LIBS in $((SECONDS - t0))s"
    [[ -n "${lockfd:-}" ]] && exec {lockfd}>&-
    return 0
}

# Write $2 to file $1 atomically, only when the content changes.
sluice_write_file() {
    local path="$1" content="$2"
    if [[ -f "$path" ]] && [[ "$(cat "$path")" == "$content" ]]; then
        return 0
    fi
    mkdir -p "$(dirname "$path")"
    printf '%s\n' "$content" >"$path.tmp.$$"
    mv "$path.tmp.$$" "$path"
}

# log4j2 configurations: the broker logs to ${kafka.logs.dir}/server.log (rolled at
# 100 MB, 3 kept); CLI tools log warnings and errors to stderr.
# shellcheck disable=SC2016 # ${sys:...} is log4j2 syntax
sluice_kafka_write_log4j2() {
    sluice_write_file "$SLUICE_KAFKA_ETC/log4j2-server.xml" '<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by deploy/local/lib.sh -->
<Configuration status="warn">
  <Appenders>
    <RollingFile name="server" fileName="${sys:kafka.logs.dir}/server.log"
                 filePattern="${sys:kafka.logs.dir}/server.log.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="100 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="server"/></Root>
    <Logger name="kafka.request.logger" level="warn"/>
    <Logger name="org.apache.kafka.clients.NetworkClient" level="warn"/>
  </Loggers>
</Configuration>'
    sluice_write_file "$SLUICE_KAFKA_ETC/log4j2-tools.xml" '<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by deploy/local/lib.sh -->
<Configuration status="warn">
  <Appenders>
    <Console name="stderr" target="SYSTEM_ERR">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="warn"><AppenderRef ref="stderr"/></Root>
  </Loggers>
</Configuration>'
}

# Run a Kafka CLI class in the foreground (stdin/stdout/stderr inherited). Extra JVM
# options: SLUICE_KAFKA_TOOL_OPTS (default heap 512 MiB).
sluice_kafka_run_tool() {
    local class="$1"
    shift
    sluice_kafka_ensure_jars
    sluice_kafka_write_log4j2
    local -a opts
    read -r -a opts <<<"${SLUICE_KAFKA_TOOL_OPTS:--Xmx512m}"
    java "${opts[@]}" -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$SLUICE_KAFKA_ETC/log4j2-tools.xml" \
        -cp "$SLUICE_KAFKA_LIBS/*" "$class" "$@"
}
