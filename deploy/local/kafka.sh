#!/usr/bin/env bash
# Local Apache Kafka (KRaft) for development and integration tests, on 127.0.0.1 only.
#
#   deploy/local/kafka.sh start  [--brokers 1|3]    start (idempotent), wait until ready
#   deploy/local/kafka.sh stop   [--brokers 1|3]    stop (no-op when stopped)
#   deploy/local/kafka.sh status [--brokers 1|3]    running/stopped per node, with ports
#                                                   (exit 0 running, 3 not running)
#   deploy/local/kafka.sh bootstrap [--brokers 1|3] print the bootstrap servers string
#   deploy/local/kafka.sh logs   [--brokers 1|3]    print the log file paths
#   deploy/local/kafka.sh wipe   [--brokers 1|3]    delete run data (not the jar cache)
#   deploy/local/kafka.sh fetch                     only fetch the jars (one time)
#
# --brokers 1 (default): one combined broker+controller node; every internal topic has
# replication factor 1. --brokers 3: one KRaft controller node and three broker-only
# nodes (ids 1, 2, 3); default.replication.factor=3, min.insync.replicas=2. (Not three
# combined nodes: the last of those to stop loses the quorum and its controlled shutdown
# hangs for 5 minutes.) stop/status/logs/wipe without --brokers act on both clusters;
# bootstrap without --brokers prints the running cluster's (the single broker's if none).
#
# Environment:
#   SLUICE_KAFKA_PORT             first client port (default 9092; 3 brokers: +0, +1, +2)
#   SLUICE_KAFKA_CONTROLLER_PORT  controller port (default client port + 10000 = 19092)
#   SLUICE_KAFKA_HEAP             broker max heap (default 1g; controller-only node: 512m)
#   SLUICE_KAFKA_START_TIMEOUT    seconds to wait for metadata to answer (default 60)
#   SLUICE_KAFKA_STOP_TIMEOUT     seconds to wait after SIGTERM before SIGKILL (default 30)
#   SLUICE_KAFKA_HOME             state folder (default <repo>/.local/kafka)
#   KAFKA_VERSION                 override the pinned version below (needs a new fetch)
#
# The jars come from Maven Central via deploy/local/kafka/pom.xml (see lib.sh). Each
# node's folder .local/kafka/run/brokers-<N>/<node>/ holds server.properties, data/,
# pid and logs/ (server.log, kafka.out).
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"

SLUICE_PROG="kafka.sh"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------- cluster layout ----

# Sets, for the cluster of $1 brokers: BROKERS, RUN_DIR, NODES[] (start order),
# CLIENT_PORTS[] (one per broker) and CONTROLLER_PORT: the ports recorded when its
# storage was formatted, else the ones from the environment (ENV_CLIENT_PORTS[],
# ENV_CONTROLLER_PORT); CLUSTER_ID and FORMAT_KAFKA_VERSION once formatted.
load_cluster() {
    BROKERS="$1"
    RUN_DIR="$SLUICE_KAFKA_HOME/run/brokers-$BROKERS"
    if ((BROKERS == 1)); then
        NODES=(node-1)
    else
        NODES=(controller node-1 node-2 node-3)
    fi
    local base="${SLUICE_KAFKA_PORT:-9092}"
    if ! [[ "$base" =~ ^[0-9]+$ ]] || ((base == 0 || base + BROKERS - 1 > 65535)); then
        sluice_die "SLUICE_KAFKA_PORT='$base' is not a valid port"
    fi
    ENV_CONTROLLER_PORT="${SLUICE_KAFKA_CONTROLLER_PORT:-$((base + 10000))}"
    if ! [[ "$ENV_CONTROLLER_PORT" =~ ^[0-9]+$ ]] || ((ENV_CONTROLLER_PORT == 0 || ENV_CONTROLLER_PORT > 65535)); then
        sluice_die "controller port '$ENV_CONTROLLER_PORT' is not valid: set SLUICE_KAFKA_CONTROLLER_PORT (or a lower SLUICE_KAFKA_PORT)"
    fi
    ENV_CLIENT_PORTS=()
    local i
    for ((i = 0; i < BROKERS; i++)); do ENV_CLIENT_PORTS+=($((base + i))); done
    CLUSTER_ID=""
    FORMAT_KAFKA_VERSION=""
    if [[ -f "$RUN_DIR/cluster.env" ]]; then
        local REC_CLIENT_PORTS="" REC_CONTROLLER_PORT=""
        # shellcheck disable=SC1091
        source "$RUN_DIR/cluster.env"
        read -r -a CLIENT_PORTS <<<"$REC_CLIENT_PORTS"
        CONTROLLER_PORT="$REC_CONTROLLER_PORT"
    else
        CLIENT_PORTS=("${ENV_CLIENT_PORTS[@]}")
        CONTROLLER_PORT="$ENV_CONTROLLER_PORT"
    fi
}

node_dir() { echo "$RUN_DIR/$1"; }

# Client port of node $1 (none for the controller-only node).
node_client_port() {
    [[ "$1" == node-* ]] && echo "${CLIENT_PORTS[$((${1#node-} - 1))]}"
}

# Controller port of node $1 (none for a broker-only node).
node_controller_port() {
    if [[ "$1" == controller ]] || ((BROKERS == 1)); then echo "$CONTROLLER_PORT"; fi
}

node_ports_text() {
    local c k
    c="$(node_client_port "$1" || true)"
    k="$(node_controller_port "$1")"
    echo "${c:+client 127.0.0.1:$c}${c:+${k:+  }}${k:+controller 127.0.0.1:$k}"
}

plural() { if (($1 == 1)); then echo "$1 broker"; else echo "$1 brokers"; fi; }
cluster_name() { if (($1 == 1)); then echo "single-broker"; else echo "$1-broker"; fi; }

bootstrap_string() {
    local out="" p
    for p in "${CLIENT_PORTS[@]}"; do out+="${out:+,}127.0.0.1:$p"; done
    echo "$out"
}

# PID of node $1 if it is running (pid file + the process really is that node).
node_pid() {
    local dir pid cmd
    dir="$(node_dir "$1")"
    [[ -f "$dir/pid" ]] || return 1
    pid="$(cat "$dir/pid")"
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    # A node that was just started passes through two exec calls (bash -> nohup -> java);
    # while the kernel swaps a process's image its cmdline reads empty for a moment, which
    # is not an exit. Read again briefly before judging.
    local k
    for ((k = 0; k < 40; k++)); do
        cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
        [[ -n "$cmd" ]] && break
        sleep 0.05
    done
    [[ "$cmd" == *kafka.Kafka* && "$cmd" == *"$dir/server.properties"* ]] || return 1
    echo "$pid"
}

count_running() {
    local n=0 node
    for node in "${NODES[@]}"; do
        if node_pid "$node" >/dev/null; then n=$((n + 1)); fi
    done
    echo "$n"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ------------------------------------------------------------------ configuration ----

random_kafka_uuid() { # Kafka's Uuid text form: 16 random bytes, base64url, no padding
    local u
    while :; do
        u="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
        [[ "$u" == -* || "$u" == AAAAAAAAAAAAAAAAAAAAA[AQ] ]] || break
    done
    echo "$u"
}

write_server_properties() {
    local node="$1" dir cport kport roles id listeners
    dir="$(node_dir "$node")"
    cport="$(node_client_port "$node" || true)"
    kport="$(node_controller_port "$node")"
    if [[ "$node" == controller ]]; then
        roles=controller id=0
        listeners="CONTROLLER://127.0.0.1:$kport"
    elif ((BROKERS == 1)); then
        roles=broker,controller id=1
        listeners="PLAINTEXT://127.0.0.1:$cport,CONTROLLER://127.0.0.1:$kport"
    else
        roles=broker id="${node#node-}"
        listeners="PLAINTEXT://127.0.0.1:$cport"
    fi
    local rf=1 isr=1
    if ((BROKERS == 3)); then rf=3 isr=2; fi
    local body
    body="# Generated by deploy/local/kafka.sh on each start: edit the script, not this file.
# Apache Kafka $KAFKA_VERSION, KRaft, $node of the $(cluster_name "$BROKERS") cluster.
process.roles=$roles
node.id=$id
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
listeners=$listeners
log.dirs=$dir/data"
    if [[ "$roles" == *broker* ]]; then
        body+="
advertised.listeners=PLAINTEXT://127.0.0.1:$cport
inter.broker.listener.name=PLAINTEXT"
    fi
    # Topic defaults on every node: in KRaft the controller applies the defaults of a
    # CreateTopics request (replication factor, partitions, min.insync.replicas).
    body+="

num.partitions=1
auto.create.topics.enable=false
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0

# Retention enforced within seconds, not minutes (tests of log-start-offset gaps).
log.retention.check.interval.ms=5000
# The files of a deleted topic go after a second, not a minute: the tests delete their
# topics as they end, and some write gigabytes.
file.delete.delay.ms=1000"
    sluice_write_file "$dir/server.properties" "$body"
}

# Format the storage of every node that is not formatted yet (first start).
format_storage() {
    local node dir need=0
    for node in "${NODES[@]}"; do
        [[ -f "$(node_dir "$node")/data/meta.properties" ]] || need=1
    done
    ((need)) || return 0
    if [[ -z "$CLUSTER_ID" ]]; then
        CLUSTER_ID="$(random_kafka_uuid)"
        FORMAT_KAFKA_VERSION="$KAFKA_VERSION"
        mkdir -p "$RUN_DIR"
        sluice_write_file "$RUN_DIR/cluster.env" "# Written by deploy/local/kafka.sh when the storage was formatted.
CLUSTER_ID=$CLUSTER_ID
FORMAT_KAFKA_VERSION=$FORMAT_KAFKA_VERSION
REC_CLIENT_PORTS=\"${CLIENT_PORTS[*]}\"
REC_CONTROLLER_PORT=$CONTROLLER_PORT"
    fi
    for node in "${NODES[@]}"; do
        dir="$(node_dir "$node")"
        [[ -f "$dir/data/meta.properties" ]] && continue
        mkdir -p "$dir/data" "$dir/logs"
        write_server_properties "$node"
        local -a extra=()
        # The (only) controller of each cluster starts a single-voter dynamic quorum.
        [[ -n "$(node_controller_port "$node")" ]] && extra=(--standalone)
        sluice_info "formatting the KRaft storage of $node (cluster id $CLUSTER_ID): $dir/data"
        if ! sluice_kafka_run_tool kafka.tools.StorageTool format --cluster-id "$CLUSTER_ID" \
            --config "$dir/server.properties" "${extra[@]}" >"$dir/format.log" 2>&1; then
            cat "$dir/format.log" >&2
            sluice_die "formatting the storage of $node failed (log: $dir/format.log). To start over: deploy/local/kafka.sh wipe --brokers $BROKERS"
        fi
    done
}

# ----------------------------------------------------------------------- commands ----

start_node() {
    local node="$1" dir heap
    dir="$(node_dir "$node")"
    if [[ "$node" == controller ]]; then heap=512m; else heap="${SLUICE_KAFKA_HEAP:-1g}"; fi
    mkdir -p "$dir/logs"
    rm -f "$dir/pid"
    # setsid: the node survives the shell (and process group) that started it. The
    # child writes its own pid and then execs java, so the pid file is exact.
    # shellcheck disable=SC2016 # expanded by the child shell
    setsid bash -c 'echo $$ >"$1/pid"; shift; exec "$@"' _ "$dir" \
        nohup java "-Xmx$heap" -Xms256m -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -Djava.awt.headless=true \
        -Dkafka.logs.dir="$dir/logs" \
        -Dlog4j2.configurationFile="$SLUICE_KAFKA_ETC/log4j2-server.xml" \
        -cp "$SLUICE_KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" \
        >"$dir/logs/kafka.out" 2>&1 </dev/null &
    local k
    for ((k = 0; k < 50; k++)); do
        [[ -s "$dir/pid" ]] && break
        sleep 0.1
    done
    [[ -s "$dir/pid" ]] || sluice_die "$node did not start (see $dir/logs/kafka.out)"
}

log_paths() {
    local node
    for node in "${NODES[@]}"; do
        echo "$(node_dir "$node")/logs/server.log"
        echo "$(node_dir "$node")/logs/kafka.out"
    done
}

# Ready = every node runs, every client port answers, the metadata lists every broker.
wait_ready() {
    local timeout="${SLUICE_KAFKA_START_TIMEOUT:-60}" deadline node bs out n last="" p
    deadline=$((SECONDS + timeout))
    bs="$(bootstrap_string)"
    while :; do
        for node in "${NODES[@]}"; do
            if ! node_pid "$node" >/dev/null; then
                local dir
                dir="$(node_dir "$node")"
                tail -n 20 "$dir/logs/server.log" "$dir/logs/kafka.out" >&2 2>/dev/null || true
                sluice_die "$node exited during start-up; logs: $dir/logs/server.log $dir/logs/kafka.out"
            fi
        done
        local open=1
        for p in "${CLIENT_PORTS[@]}"; do port_open "$p" || open=0; done
        if ((open)); then
            if out="$(timeout 30 "${BASH_SOURCE[0]}" __tool org.apache.kafka.tools.BrokerApiVersionsCommand \
                --bootstrap-server "$bs" 2>&1)"; then
                n="$(grep -cE '^127\.0\.0\.1:[0-9]+ \(id: [0-9]+ rack: ' <<<"$out" || true)"
                ((n >= BROKERS)) && return 0
                last="the metadata lists $n of $BROKERS brokers"
            else
                last="$(tail -n 3 <<<"$out")"
            fi
        else
            last="client port(s) not listening yet"
        fi
        if ((SECONDS >= deadline)); then
            sluice_die "Kafka did not answer metadata requests within ${timeout}s ($last). Logs: $(log_paths | tr '\n' ' ')"
        fi
        sleep 1
    done
}

# Prints a description of the other cluster of this script if it runs on one of our ports.
other_cluster_conflict() {
    local mine=" ${CLIENT_PORTS[*]} $CONTROLLER_PORT "
    (
        load_cluster $((BROKERS == 1 ? 3 : 1))
        local node p
        for node in "${NODES[@]}"; do
            node_pid "$node" >/dev/null || continue
            for p in $(node_client_port "$node" || true) $(node_controller_port "$node"); do
                if [[ "$mine" == *" $p "* ]]; then
                    echo "the $(cluster_name "$BROKERS") Kafka is running on $(bootstrap_string) (controller port $CONTROLLER_PORT)"
                    exit 0
                fi
            done
        done
    )
}

cmd_start() {
    load_cluster "$1"
    if [[ -f "$RUN_DIR/cluster.env" ]] &&
        [[ "${CLIENT_PORTS[*]} / $CONTROLLER_PORT" != "${ENV_CLIENT_PORTS[*]} / $ENV_CONTROLLER_PORT" ]]; then
        sluice_die "the $(cluster_name "$BROKERS") data in $RUN_DIR was formatted for client ports ${CLIENT_PORTS[*]} and controller port $CONTROLLER_PORT, but the environment asks for ${ENV_CLIENT_PORTS[*]} / $ENV_CONTROLLER_PORT. Either use SLUICE_KAFKA_PORT=${CLIENT_PORTS[0]} SLUICE_KAFKA_CONTROLLER_PORT=$CONTROLLER_PORT, or start fresh: deploy/local/kafka.sh stop --brokers $BROKERS && deploy/local/kafka.sh wipe --brokers $BROKERS"
    fi
    if (($(count_running) == ${#NODES[@]})); then
        echo "Kafka $KAFKA_VERSION ($(plural "$BROKERS")) is already running: $(bootstrap_string)"
        return 0
    fi
    sluice_require_java jre
    local conflict
    conflict="$(other_cluster_conflict)"
    [[ -z "$conflict" ]] || sluice_die "$conflict; its ports overlap. Stop it first (deploy/local/kafka.sh stop) or choose other ports, e.g. SLUICE_KAFKA_PORT=29092 deploy/local/kafka.sh start --brokers $BROKERS"
    local node p
    for node in "${NODES[@]}"; do
        node_pid "$node" >/dev/null && continue
        for p in $(node_client_port "$node" || true) $(node_controller_port "$node"); do
            if port_open "$p"; then
                local who=""
                if command -v ss >/dev/null 2>&1; then
                    who="$(ss -Htlnp "sport = :$p" 2>/dev/null | head -n 1 | tr -s ' ' || true)"
                fi
                sluice_die "port 127.0.0.1:$p is already in use${who:+ ($who)}. Free it, or choose other ports: SLUICE_KAFKA_PORT=... (client), SLUICE_KAFKA_CONTROLLER_PORT=... (controller)"
            fi
        done
    done
    sluice_kafka_ensure_jars
    sluice_kafka_write_log4j2
    format_storage
    if [[ -n "$FORMAT_KAFKA_VERSION" && "$FORMAT_KAFKA_VERSION" != "$KAFKA_VERSION" ]]; then
        sluice_info "warning: this data was formatted by Kafka $FORMAT_KAFKA_VERSION, starting $KAFKA_VERSION"
    fi
    local t0=$SECONDS
    for node in "${NODES[@]}"; do
        node_pid "$node" >/dev/null && continue
        write_server_properties "$node"
        start_node "$node"
        sluice_info "started $node (pid $(cat "$(node_dir "$node")/pid")): $(node_ports_text "$node")"
    done
    sluice_info "waiting for metadata requests to succeed (up to ${SLUICE_KAFKA_START_TIMEOUT:-60}s)..."
    wait_ready
    echo "Kafka $KAFKA_VERSION ($(plural "$BROKERS")) ready in $((SECONDS - t0))s: $(bootstrap_string)"
    echo "logs:"
    log_paths | sed 's/^/  /'
}

# SIGTERM the given nodes together, wait for them to exit, SIGKILL after the timeout.
stop_nodes() {
    local node pid
    local -a pids=() alive=()
    for node in "$@"; do
        if pid="$(node_pid "$node")"; then pids+=("$pid"); fi
    done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local timeout="${SLUICE_KAFKA_STOP_TIMEOUT:-30}" deadline
    deadline=$((SECONDS + timeout))
    while :; do
        alive=()
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive+=("$pid"); fi
        done
        ((${#alive[@]})) || break
        if ((SECONDS >= deadline)); then
            sluice_info "warning: $* still running ${timeout}s after SIGTERM, sending SIGKILL to ${alive[*]}"
            kill -KILL "${alive[@]}" 2>/dev/null || true
            sleep 1
            break
        fi
        sleep 0.25
    done
    for node in "$@"; do rm -f "$(node_dir "$node")/pid"; done
}

cmd_stop() {
    load_cluster "$1"
    if (($(count_running) == 0)); then
        echo "Kafka ($(plural "$BROKERS")) is not running"
        rm -f "$RUN_DIR"/*/pid
        return 0
    fi
    local t0=$SECONDS
    if ((BROKERS == 1)); then
        stop_nodes node-1
    else
        # Brokers first, together, while the controller can still acknowledge their
        # controlled shutdowns; then the controller.
        stop_nodes node-1 node-2 node-3
        stop_nodes controller
    fi
    echo "Kafka ($(plural "$BROKERS")) stopped in $((SECONDS - t0))s"
}

cmd_status() { # returns 0 when every node runs
    load_cluster "$1"
    local node pid n=0 state c
    echo "Kafka, $(plural "$BROKERS") ($RUN_DIR), bootstrap $(bootstrap_string):"
    for node in "${NODES[@]}"; do
        if pid="$(node_pid "$node")"; then
            n=$((n + 1))
            state="running (pid $pid)"
            c="$(node_client_port "$node" || true)"
            if [[ -n "$c" ]] && ! port_open "$c"; then state+=", client port not listening yet"; fi
        else
            state="stopped"
        fi
        printf '  %-10s %-20s %s\n' "$node" "$state" "$(node_ports_text "$node")"
    done
    ((n == ${#NODES[@]}))
}

cmd_wipe() {
    load_cluster "$1"
    if (($(count_running) > 0)); then
        sluice_die "the $(cluster_name "$BROKERS") Kafka is running; stop it first: deploy/local/kafka.sh stop --brokers $BROKERS"
    fi
    if [[ -d "$RUN_DIR" ]]; then
        rm -rf "$RUN_DIR"
        echo "removed $RUN_DIR"
    else
        echo "nothing to remove ($RUN_DIR does not exist)"
    fi
}

main() {
    local cmd="${1:-}"
    if [[ -z "$cmd" ]]; then
        usage >&2
        exit 2
    fi
    shift
    if [[ "$cmd" == __tool ]]; then # internal: run a tool class (used by wait_ready)
        sluice_kafka_run_tool "$@"
        return
    fi
    local brokers=""
    while (($#)); do
        case "$1" in
        --brokers)
            (($# >= 2)) || sluice_die "--brokers needs a value (1 or 3)"
            brokers="$2"
            shift 2
            ;;
        --brokers=*)
            brokers="${1#*=}"
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) sluice_die "unknown argument '$1' (usage: deploy/local/kafka.sh start|stop|status|bootstrap|logs|wipe|fetch [--brokers 1|3])" ;;
        esac
    done
    [[ -z "$brokers" || "$brokers" == 1 || "$brokers" == 3 ]] ||
        sluice_die "--brokers must be 1 or 3, not '$brokers'"
    local -a clusters
    if [[ -n "$brokers" ]]; then clusters=("$brokers"); else clusters=(1 3); fi
    local b rc=3
    case "$cmd" in
    start) cmd_start "${brokers:-1}" ;;
    stop)
        local stopped=0
        for b in "${clusters[@]}"; do
            # Without --brokers, skip a cluster that was never started.
            if [[ -z "$brokers" && ! -d "$SLUICE_KAFKA_HOME/run/brokers-$b" ]]; then continue; fi
            cmd_stop "$b"
            stopped=1
        done
        if ((!stopped)); then echo "Kafka is not running"; fi
        ;;
    status)
        for b in "${clusters[@]}"; do
            # Without --brokers, skip the 3-broker cluster if it was never started.
            if [[ -z "$brokers" && "$b" == 3 && ! -d "$SLUICE_KAFKA_HOME/run/brokers-3" ]]; then continue; fi
            if cmd_status "$b"; then rc=0; fi
        done
        return "$rc"
        ;;
    bootstrap)
        if [[ -n "$brokers" ]]; then
            load_cluster "$brokers"
        else
            load_cluster 3
            if (($(count_running) == 0)); then load_cluster 1; fi
        fi
        bootstrap_string
        ;;
    logs)
        for b in "${clusters[@]}"; do
            load_cluster "$b"
            if [[ -d "$RUN_DIR" ]]; then log_paths; fi
        done
        ;;
    wipe) for b in "${clusters[@]}"; do cmd_wipe "$b"; done ;;
    fetch)
        sluice_kafka_ensure_jars
        echo "$SLUICE_KAFKA_LIBS"
        ;;
    help) usage ;;
    *) sluice_die "unknown command '$cmd' (usage: deploy/local/kafka.sh start|stop|status|bootstrap|logs|wipe|fetch [--brokers 1|3])" ;;
    esac
}

main "$@"
