#!/usr/bin/env bash
# A second, authenticated local Apache Kafka (KRaft, one combined broker+controller node)
# on 127.0.0.1, for testing Sluice against SASL/SCRAM over TLS. Independent of the plain
# broker of deploy/local/kafka.sh (other ports, other folder); shares its jar cache.
#
#   deploy/local/kafka-auth.sh start    generate certificates (once), format (once), start
#                                       (idempotent), wait until an authenticated client
#                                       gets metadata
#   deploy/local/kafka-auth.sh stop     stop (no-op when stopped)
#   deploy/local/kafka-auth.sh status   running/stopped (exit 0 running, 3 not running)
#   deploy/local/kafka-auth.sh env      print what a client needs, as KEY=VALUE lines
#                                       (set -a; eval "$(... env)") + the librdkafka
#                                       settings as comments; writes
#                                       .local/kafka-auth/client.toml ([librdkafka] table)
#   deploy/local/kafka-auth.sh wipe     delete data and certificates (when stopped)
#
# Listeners: SASL_SSL://127.0.0.1:$SLUICE_KAFKA_AUTH_PORT (default 29192), the only one
# clients use: SCRAM-SHA-512 over TLS, also used between brokers (user "admin").
# CONTROLLER://127.0.0.1:$SLUICE_KAFKA_AUTH_CONTROLLER_PORT (default port + 1: below the
# ephemeral port range, which a client connection could otherwise take first),
# PLAINTEXT on loopback (KRaft quorum only; clients cannot use it).
#
# Generated under .local/kafka-auth/ (git-ignored): tls/ca.pem + ca.key (a throwaway CA),
# tls/broker.pem (SAN IP:127.0.0.1, DNS:localhost) + broker.key, tls/broker.p12 (the
# broker's keystore), tls/truststore.p12 (the CA, for Java clients), node/ (data, logs,
# server.properties, pid), admin.properties (Java tools), client.toml (Sluice).
# SCRAM users are created when the storage is formatted (StorageTool --add-scram):
# $SLUICE_KAFKA_AUTH_USER / $SLUICE_KAFKA_AUTH_PASSWORD (default sluice / sluice-secret)
# and the inter-broker user admin. Throwaway secrets for local tests only.
#
# Environment: SLUICE_KAFKA_AUTH_PORT, SLUICE_KAFKA_AUTH_CONTROLLER_PORT,
# SLUICE_KAFKA_AUTH_HOME (default <repo>/.local/kafka-auth), SLUICE_KAFKA_AUTH_USER,
# SLUICE_KAFKA_AUTH_PASSWORD, SLUICE_KAFKA_HEAP (default 512m),
# SLUICE_KAFKA_START_TIMEOUT (default 60), SLUICE_KAFKA_STOP_TIMEOUT (default 30).
set -euo pipefail

SLUICE_PROG="kafka-auth.sh"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

AUTH_HOME="${SLUICE_KAFKA_AUTH_HOME:-$SLUICE_REPO/.local/kafka-auth}"
TLS_DIR="$AUTH_HOME/tls"
NODE_DIR="$AUTH_HOME/node"
STATE="$AUTH_HOME/state.env"
STORE_PASS="sluice-local-store" # keystore/truststore password (throwaway)
ADMIN_USER="admin"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

valid_port() { [[ "$1" =~ ^[0-9]+$ ]] && (($1 > 0 && $1 <= 65535)); }

# Settings: those recorded at format time win (the data is bound to them).
load_state() {
    PORT="${SLUICE_KAFKA_AUTH_PORT:-29192}"
    valid_port "$PORT" || sluice_die "SLUICE_KAFKA_AUTH_PORT='$PORT' is not a valid port"
    CONTROLLER_PORT="${SLUICE_KAFKA_AUTH_CONTROLLER_PORT:-$((PORT + 1))}"
    valid_port "$CONTROLLER_PORT" ||
        sluice_die "controller port '$CONTROLLER_PORT' is not valid: set SLUICE_KAFKA_AUTH_CONTROLLER_PORT"
    USER_NAME="${SLUICE_KAFKA_AUTH_USER:-sluice}"
    USER_PASSWORD="${SLUICE_KAFKA_AUTH_PASSWORD:-sluice-secret}"
    ADMIN_PASSWORD=""
    CLUSTER_ID=""
    FORMATTED=0
    if [[ -f "$STATE" ]]; then
        # shellcheck disable=SC1090
        source "$STATE"
        FORMATTED=1
        if [[ -n "${SLUICE_KAFKA_AUTH_PORT:-}" && "$SLUICE_KAFKA_AUTH_PORT" != "$PORT" ]]; then
            sluice_die "the data in $AUTH_HOME was formatted for port $PORT, not $SLUICE_KAFKA_AUTH_PORT. Use SLUICE_KAFKA_AUTH_PORT=$PORT, or start fresh: $0 stop && $0 wipe"
        fi
    fi
}

pid_of_broker() {
    local pid cmd
    [[ -f "$NODE_DIR/pid" ]] || return 1
    pid="$(cat "$NODE_DIR/pid")"
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmd" == *kafka.Kafka* && "$cmd" == *"$NODE_DIR/server.properties"* ]] || return 1
    echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ------------------------------------------------------------------ certificates ----

gen_certs() {
    if [[ -f "$TLS_DIR/ca.pem" && -f "$TLS_DIR/broker.p12" && -f "$TLS_DIR/truststore.p12" ]]; then
        return 0
    fi
    command -v openssl >/dev/null 2>&1 ||
        sluice_die "openssl not found on PATH (it generates the test certificates). Fix: apt-get install -y openssl"
    command -v keytool >/dev/null 2>&1 ||
        sluice_die "keytool not found on PATH (it writes the Java truststore; comes with the JDK). Fix: apt-get install -y openjdk-17-jdk-headless"
    rm -rf "$TLS_DIR"
    mkdir -p "$TLS_DIR"
    chmod 700 "$TLS_DIR"
    local log="$AUTH_HOME/certs.log"
    sluice_info "generating a throwaway CA and the broker certificate in $TLS_DIR"
    {
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=Sluice local test CA" \
            -keyout "$TLS_DIR/ca.key" -out "$TLS_DIR/ca.pem" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" &&
            openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
                -keyout "$TLS_DIR/broker.key" -out "$TLS_DIR/broker.csr" &&
            printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
                "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" \
                >"$TLS_DIR/broker.ext" &&
            openssl x509 -req -in "$TLS_DIR/broker.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
                -CAcreateserial -days 3650 -sha256 -extfile "$TLS_DIR/broker.ext" -out "$TLS_DIR/broker.pem" &&
            openssl pkcs12 -export -name broker -in "$TLS_DIR/broker.pem" -inkey "$TLS_DIR/broker.key" \
                -certfile "$TLS_DIR/ca.pem" -out "$TLS_DIR/broker.p12" -passout "pass:$STORE_PASS" &&
            keytool -importcert -noprompt -alias sluice-local-ca -file "$TLS_DIR/ca.pem" \
                -keystore "$TLS_DIR/truststore.p12" -storetype PKCS12 -storepass "$STORE_PASS"
    } >"$log" 2>&1 || {
        cat "$log" >&2
        rm -rf "$TLS_DIR"
        sluice_die "generating the certificates failed (log: $log)"
    }
    rm -f "$TLS_DIR/broker.csr" "$TLS_DIR/broker.ext"
    chmod 600 "$TLS_DIR"/*.key
}

# ------------------------------------------------------------------ configuration ----

jaas() { # $1 user, $2 password
    echo "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$1\" password=\"$2\";"
}

write_server_properties() {
    mkdir -p "$NODE_DIR/data" "$NODE_DIR/logs"
    sluice_write_file "$NODE_DIR/server.properties" "# Generated by deploy/local/kafka-auth.sh on each start: edit the script, not this file.
# Apache Kafka $KAFKA_VERSION, KRaft, one combined node; clients: SASL_SSL + SCRAM-SHA-512.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=SASL_SSL://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=SASL_SSL://127.0.0.1:$PORT
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$(jaas "$ADMIN_USER" "$ADMIN_PASSWORD")
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/broker.p12
ssl.keystore.password=$STORE_PASS
ssl.key.password=$STORE_PASS
ssl.truststore.type=PKCS12
ssl.truststore.location=$TLS_DIR/truststore.p12
ssl.truststore.password=$STORE_PASS
ssl.client.auth=none
log.dirs=$NODE_DIR/data

num.partitions=1
auto.create.topics.enable=false
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0"
    # Java tools (readiness check, kafka-tool style commands) as the admin user.
    sluice_write_file "$AUTH_HOME/admin.properties" "# Generated by deploy/local/kafka-auth.sh: Java client settings of the admin user.
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=$(jaas "$ADMIN_USER" "$ADMIN_PASSWORD")
ssl.truststore.type=PKCS12
ssl.truststore.location=$TLS_DIR/truststore.p12
ssl.truststore.password=$STORE_PASS"
    chmod 600 "$NODE_DIR/server.properties" "$AUTH_HOME/admin.properties"
}

write_client_toml() {
    sluice_write_file "$AUTH_HOME/client.toml" "# Generated by deploy/local/kafka-auth.sh: Sluice settings for the authenticated local broker.
# Use: SLUICE_BROKERS=127.0.0.1:$PORT sluice --config $AUTH_HOME/client.toml ...
# (SLUICE_SASL_USERNAME / SLUICE_SASL_PASSWORD override the credentials below.)
[librdkafka]
\"security.protocol\" = \"SASL_SSL\"
\"sasl.mechanisms\" = \"SCRAM-SHA-512\"
\"sasl.username\" = \"$USER_NAME\"
\"sasl.password\" = \"$USER_PASSWORD\"
\"ssl.ca.location\" = \"$TLS_DIR/ca.pem\""
    chmod 600 "$AUTH_HOME/client.toml"
}

format_storage() {
    [[ -f "$NODE_DIR/data/meta.properties" && "$FORMATTED" == 1 ]] && return 0
    rm -rf "$NODE_DIR/data"
    CLUSTER_ID="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    ADMIN_PASSWORD="admin-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    write_server_properties
    sluice_info "formatting the KRaft storage (cluster id $CLUSTER_ID) with SCRAM users '$USER_NAME' and '$ADMIN_USER'"
    if ! sluice_kafka_run_tool kafka.tools.StorageTool format --cluster-id "$CLUSTER_ID" \
        --config "$NODE_DIR/server.properties" --standalone \
        --add-scram "SCRAM-SHA-512=[name=$ADMIN_USER,password=$ADMIN_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=$USER_NAME,password=$USER_PASSWORD]" \
        >"$AUTH_HOME/format.log" 2>&1; then
        cat "$AUTH_HOME/format.log" >&2
        sluice_die "formatting the storage failed (log: $AUTH_HOME/format.log). To start over: $0 wipe"
    fi
    sluice_write_file "$STATE" "# Written by deploy/local/kafka-auth.sh when the storage was formatted.
CLUSTER_ID=$CLUSTER_ID
PORT=$PORT
CONTROLLER_PORT=$CONTROLLER_PORT
USER_NAME='$USER_NAME'
USER_PASSWORD='$USER_PASSWORD'
ADMIN_PASSWORD='$ADMIN_PASSWORD'"
    chmod 600 "$STATE"
    FORMATTED=1
}

# ----------------------------------------------------------------------- commands ----

wait_ready() {
    local timeout="${SLUICE_KAFKA_START_TIMEOUT:-60}" deadline out last=""
    deadline=$((SECONDS + timeout))
    while :; do
        if ! pid_of_broker >/dev/null; then
            tail -n 30 "$NODE_DIR/logs/server.log" "$NODE_DIR/logs/kafka.out" >&2 2>/dev/null || true
            sluice_die "the broker exited during start-up; logs: $NODE_DIR/logs/server.log $NODE_DIR/logs/kafka.out"
        fi
        if port_open "$PORT"; then
            if out="$(timeout 30 "${BASH_SOURCE[0]}" __tool org.apache.kafka.tools.BrokerApiVersionsCommand \
                --bootstrap-server "127.0.0.1:$PORT" --command-config "$AUTH_HOME/admin.properties" 2>&1)"; then
                grep -qE '^127\.0\.0\.1:[0-9]+ \(id: 1 rack: ' <<<"$out" && return 0
                last="the metadata does not list the broker yet"
            else
                last="$(tail -n 3 <<<"$out")"
            fi
        else
            last="port $PORT not listening yet"
        fi
        ((SECONDS < deadline)) ||
            sluice_die "the authenticated broker did not answer within ${timeout}s ($last). Logs: $NODE_DIR/logs/server.log $NODE_DIR/logs/kafka.out"
        sleep 1
    done
}

cmd_start() {
    load_state
    if pid_of_broker >/dev/null; then
        write_client_toml
        echo "Kafka $KAFKA_VERSION (SASL_SSL/SCRAM-SHA-512) is already running: 127.0.0.1:$PORT"
        return 0
    fi
    sluice_require_java jre
    local p who
    for p in "$PORT" "$CONTROLLER_PORT"; do
        if port_open "$p"; then
            who=""
            command -v ss >/dev/null 2>&1 && who="$(ss -Htlnp "sport = :$p" 2>/dev/null | head -n 1 | tr -s ' ' || true)"
            sluice_die "port 127.0.0.1:$p is already in use${who:+ ($who)}. Free it, or choose other ports: SLUICE_KAFKA_AUTH_PORT=... SLUICE_KAFKA_AUTH_CONTROLLER_PORT=... (after $0 wipe if already formatted)"
        fi
    done
    mkdir -p "$AUTH_HOME"
    chmod 700 "$AUTH_HOME"
    sluice_kafka_ensure_jars
    sluice_kafka_write_log4j2
    gen_certs
    format_storage
    write_server_properties
    write_client_toml
    local t0=$SECONDS
    rm -f "$NODE_DIR/pid"
    # shellcheck disable=SC2016 # expanded by the child shell
    setsid bash -c 'echo $$ >"$1/pid"; shift; exec "$@"' _ "$NODE_DIR" \
        nohup java "-Xmx${SLUICE_KAFKA_HEAP:-512m}" -Xms128m -server -XX:+UseG1GC \
        -Djava.awt.headless=true -Dkafka.logs.dir="$NODE_DIR/logs" \
        -Dlog4j2.configurationFile="$SLUICE_KAFKA_ETC/log4j2-server.xml" \
        -cp "$SLUICE_KAFKA_LIBS/*" kafka.Kafka "$NODE_DIR/server.properties" \
        >"$NODE_DIR/logs/kafka.out" 2>&1 </dev/null &
    local k
    for ((k = 0; k < 50; k++)); do
        [[ -s "$NODE_DIR/pid" ]] && break
        sleep 0.1
    done
    [[ -s "$NODE_DIR/pid" ]] || sluice_die "the broker did not start (see $NODE_DIR/logs/kafka.out)"
    sluice_info "started the broker (pid $(cat "$NODE_DIR/pid")): SASL_SSL 127.0.0.1:$PORT, controller 127.0.0.1:$CONTROLLER_PORT; waiting for an authenticated metadata request..."
    wait_ready
    echo "Kafka $KAFKA_VERSION (SASL_SSL/SCRAM-SHA-512) ready in $((SECONDS - t0))s: 127.0.0.1:$PORT"
    echo "client settings: $0 env   logs: $NODE_DIR/logs/server.log"
}

cmd_stop() {
    local pid
    if ! pid="$(pid_of_broker)"; then
        rm -f "$NODE_DIR/pid"
        echo "Kafka (SASL_SSL) is not running"
        return 0
    fi
    local t0=$SECONDS timeout="${SLUICE_KAFKA_STOP_TIMEOUT:-30}"
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS - t0 >= timeout)); then
            sluice_info "warning: still running ${timeout}s after SIGTERM, sending SIGKILL to $pid"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 1
            break
        fi
        sleep 0.25
    done
    rm -f "$NODE_DIR/pid"
    echo "Kafka (SASL_SSL) stopped in $((SECONDS - t0))s"
}

cmd_status() {
    load_state
    local pid
    if pid="$(pid_of_broker)"; then
        local state="running (pid $pid)"
        port_open "$PORT" || state+=", port not listening yet"
        echo "Kafka (SASL_SSL/SCRAM-SHA-512, $AUTH_HOME): $state  client 127.0.0.1:$PORT  controller 127.0.0.1:$CONTROLLER_PORT"
        return 0
    fi
    echo "Kafka (SASL_SSL/SCRAM-SHA-512, $AUTH_HOME): stopped  client 127.0.0.1:$PORT"
    return 3
}

cmd_env() {
    load_state
    [[ -f "$TLS_DIR/ca.pem" && "$FORMATTED" == 1 ]] ||
        sluice_die "no certificates or users yet in $AUTH_HOME: run $0 start first"
    write_client_toml
    cat <<EOF
SLUICE_BROKERS=127.0.0.1:$PORT
SLUICE_SASL_USERNAME=$USER_NAME
SLUICE_SASL_PASSWORD=$USER_PASSWORD
SLUICE_KAFKA_AUTH_CA=$TLS_DIR/ca.pem
SLUICE_KAFKA_AUTH_CLIENT_TOML=$AUTH_HOME/client.toml
# librdkafka settings (the [librdkafka] table of $AUTH_HOME/client.toml):
#   security.protocol=SASL_SSL
#   sasl.mechanisms=SCRAM-SHA-512
#   sasl.username=$USER_NAME
#   sasl.password=$USER_PASSWORD
#   ssl.ca.location=$TLS_DIR/ca.pem
# Use: set -a; eval "\$($0 env)"; set +a; sluice --config \$SLUICE_KAFKA_AUTH_CLIENT_TOML ...
EOF
}

cmd_wipe() {
    if pid_of_broker >/dev/null; then
        sluice_die "the authenticated broker is running; stop it first: $0 stop"
    fi
    if [[ -d "$AUTH_HOME" ]]; then
        rm -rf "$AUTH_HOME"
        echo "removed $AUTH_HOME"
    else
        echo "nothing to remove ($AUTH_HOME does not exist)"
    fi
}

main() {
    local cmd="${1:-}"
    [[ -n "$cmd" ]] || {
        usage >&2
        exit 2
    }
    shift
    case "$cmd" in
    __tool) sluice_kafka_run_tool "$@" ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    wipe) cmd_wipe ;;
    -h | --help | help) usage ;;
    *) sluice_die "unknown command '$cmd' (usage: deploy/local/kafka-auth.sh start|stop|status|env|wipe)" ;;
    esac
}

main "$@"
