#!/usr/bin/env bash
# Smoke test of the Kafka Streams peer (bench/kafka-streams-peer) against Sluice, on a
# small topic over loopback:
#
#   1. builds the peer's shaded jar (mvn package) and target/debug/sluice (cargo build);
#      checks that the local Kafka is up (starts nothing: prints the start command);
#   2. `sluice init` on a fresh topic prefix `peer-smoke-<random>` (P partitions);
#   3. produces a small log that exercises every rule of docs/design.md section 5:
#        - `sluice workload` (upsert/update/delete), shuffled with extra JSON lines:
#          ADD of live and absent ids, UPDATE that removes keys with null / adds
#          booleans / carries no embedding or document, DELETE of absent ids, records of
#          another dimension (UPSERT and DELETE: dimension_mismatch), a collection without
#          embeddings, a collection whose dimension is fixed by a later ADD (a DELETE with
#          an embedding does not fix it), non-ASCII ids/keys/documents whose UTF-8 byte
#          order differs from UTF-16 order, -0.0, empty document, empty metadata;
#        - hand-made Avro messages through kcat: BACKFILL_FN markers (valid, without
#          payload), a backfill payload on a data operation, undecodable values (negative
#          length, truncated, trailing bytes, empty), a key that is not the collection id,
#          and one record sent to every partition (all but its murmur2 home are misrouted);
#        - more JSON lines after those (the markers sit mid-log);
#   4. runs the peer (fresh app id, state dir in the temp folder) and prints its line
#      `records=<N> sha256=<hex>` and its throughput line;
#   5. runs `sluice process` on the same topic with a fresh SQLite sysdb and group until
#      every partition has lag 0 (polls `sluice offsets show --format json`), SIGTERM;
#      then `sluice checksum` (if this binary has the subcommand) and compares.
#
# Exits non-zero if anything fails or if both checksums exist and differ.
#
# Usage: scripts/bench-peer-smoke.sh [--records N] [--partitions P] [--dim D]
#            [--collections C] [--ids-per-collection K] [--seed S] [--threads T]
#            [--keep]
#   defaults: 20,000 workload records (plus ~3,000 extras), 4 partitions, dim 16,
#   8 collections, 500 ids per collection, seed 7, peer threads = its default.
#   --keep   keep the temp folder (peer state, both sysdbs, logs), topics and groups.
# Everything created (topics, the peer's changelog topics, groups, temp files) is
# removed on exit, also on failure or Ctrl-C.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"

RECORDS=20000
PARTITIONS=4
DIM=16
COLLECTIONS=8
IDS=500
SEED=7
THREADS=""
KEEP=false
PHASE_TIMEOUT=600

log() { printf '[peer-smoke %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[peer-smoke] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while (($#)); do
    case "$1" in
    --records) RECORDS="${2:?}"; shift 2 ;;
    --partitions) PARTITIONS="${2:?}"; shift 2 ;;
    --dim) DIM="${2:?}"; shift 2 ;;
    --collections) COLLECTIONS="${2:?}"; shift 2 ;;
    --ids-per-collection) IDS="${2:?}"; shift 2 ;;
    --seed) SEED="${2:?}"; shift 2 ;;
    --threads) THREADS="${2:?}"; shift 2 ;;
    --keep) KEEP=true; shift ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
for v in RECORDS PARTITIONS DIM COLLECTIONS IDS SEED; do
    is_uint "${!v}" || die "--${v,,} must be a non-negative integer, got '${!v}'"
done
((RECORDS > 0 && PARTITIONS > 0 && DIM > 0 && COLLECTIONS > 0 && IDS > 0)) ||
    die "--records, --partitions, --dim, --collections and --ids-per-collection must be > 0"
[[ -z "$THREADS" ]] || is_uint "$THREADS" || die "--threads must be a positive integer"

# ------------------------------------------------------------------ prerequisites ----
for tool in java mvn cargo jq kcat python3 timeout; do
    command -v "$tool" >/dev/null || die "'$tool' is missing"
done
KAFKA_SH="$REPO/deploy/local/kafka.sh"
KTOOL="$REPO/deploy/local/kafka-tool.sh"
"$KAFKA_SH" status --brokers 1 >/dev/null 2>&1 || die "Kafka is not running: start it with deploy/local/kafka.sh start"
BS="$("$KAFKA_SH" bootstrap --brokers 1)"

now() { date +%s.%N; }
fsub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }

# ------------------------------------------------------------------ 1. build --------
PEER_DIR="$REPO/bench/kafka-streams-peer"
JAR="$PEER_DIR/target/kafka-streams-peer.jar"
log "building the peer: mvn -q -f bench/kafka-streams-peer/pom.xml package"
t0="$(now)"
mvn -q -f "$PEER_DIR/pom.xml" package >&2 || die "mvn package failed"
MVN_S="$(fsub "$(now)" "$t0")"
[[ -f "$JAR" ]] || die "no jar at $JAR after the build"
log "peer built in $MVN_S s: $JAR ($(du -h "$JAR" | cut -f1))"

log "building sluice: cargo build --bin sluice (may wait for a lock held by another build)"
cargo build --bin sluice >&2 || die "cargo build --bin sluice failed"
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps 2>/dev/null | jq -r .target_directory)"
SLUICE="$TARGET_DIR/debug/sluice"
[[ -x "$SLUICE" ]] || die "no binary at $SLUICE after the build"

# ------------------------------------------------------------------ fresh names -----
RID="$(od -An -N4 -tx4 /dev/urandom | tr -d ' \n')"
PREFIX="peer-smoke-$RID"
TOPIC="$PREFIX.log"
TOPICS=("$PREFIX.log" "$PREFIX.backfill" "$PREFIX.dlq")
APP_ID="$PREFIX-peer"
GROUP_SLUICE="$PREFIX-sluice"
WORK="$(mktemp -d /tmp/peer-smoke.XXXXXX)"
SLUICE_PID=""

cleanup() {
    local rc=$?
    set +e
    if [[ -n "$SLUICE_PID" ]] && kill -0 "$SLUICE_PID" 2>/dev/null; then
        kill -TERM "$SLUICE_PID" 2>/dev/null
        for _ in $(seq 1 40); do kill -0 "$SLUICE_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SLUICE_PID" 2>/dev/null
    fi
    if $KEEP; then
        log "kept: $WORK, topics ${TOPICS[*]} and $APP_ID-*-changelog, groups $APP_ID $GROUP_SLUICE $GROUP_SLUICE.backfill"
    else
        log "cleanup: topics ${TOPICS[*]} $APP_ID-*, groups $APP_ID $GROUP_SLUICE $GROUP_SLUICE.backfill, $WORK"
        for t in "${TOPICS[@]}"; do
            timeout 60 "$KTOOL" topics --bootstrap-server "$BS" --delete --if-exists --topic "$t" >/dev/null 2>&1
        done
        # the peer deletes its own changelog topics (--cleanup); this catches a failed run
        timeout 60 "$KTOOL" topics --bootstrap-server "$BS" --delete --if-exists --topic "$APP_ID-.*" >/dev/null 2>&1
        timeout 60 "$KTOOL" consumer-groups --bootstrap-server "$BS" --delete \
            --group "$APP_ID" --group "$GROUP_SLUICE" --group "$GROUP_SLUICE.backfill" >/dev/null 2>&1
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

export SLUICE_BROKERS="$BS" SLUICE_TOPIC_PREFIX="$PREFIX" SLUICE_HTTP=""
unset SLUICE_CONFIG SLUICE_LOG SLUICE_GROUP

# ------------------------------------------------------------------ 2. topic --------
log "prefix $PREFIX: sluice init --partitions $PARTITIONS"
SLUICE_SYSDB="sqlite://$WORK/produce.sqlite" timeout 120 "$SLUICE" init --partitions "$PARTITIONS" >&2

# ------------------------------------------------------------------ 3. produce ------
log "workload: $RECORDS records, $COLLECTIONS collections, dim $DIM, $IDS ids per collection, seed $SEED (+ extras)"
timeout 120 "$SLUICE" workload --records "$RECORDS" --collections "$COLLECTIONS" --dim "$DIM" \
    --ids-per-collection "$IDS" --seed "$SEED" >"$WORK/workload.jsonl"

# Extras: partA.jsonl (workload shuffled with extra lines), partB.jsonl, and raw Avro
# messages in raw/ with raw/manifest.tsv (file, key, partition or -1 for murmur2).
PEER_SMOKE_PARTITIONS="$PARTITIONS" python3 - "$WORK" "$COLLECTIONS" "$DIM" "$IDS" "$SEED" <<'PY'
import json, os, random, struct, sys

work, ncoll, dim, nids, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
colls = [f"collection-{c}" for c in range(ncoll)]

def emb(d):
    return [rng.uniform(-1, 1) for _ in range(d)]

def line(coll, id_, op, embedding=None, metadata=None, document=None):
    return json.dumps({"collection": coll, "id": id_, "operation": op, "embedding": embedding,
                       "metadata": metadata, "document": document}, ensure_ascii=False)

def any_id():  # ids beyond the workload's range are never live
    return f"id-{rng.randrange(int(nids * 1.2) + 1):06d}"

extra_a = []
for _ in range(1500):  # ADD: of live ids ignored (add_existing), of absent ids inserted
    c = rng.choice(colls)
    extra_a.append(line(c, any_id(), "add", emb(dim),
                        {"color": rng.choice(["red", "teal"]), "flag": rng.random() < 0.5,
                         "gone": None, "big": 9007199254740993},
                        f"added to {c}"))
for _ in range(400):  # UPDATE: metadata only, null removes a key; absent -> update_missing
    extra_a.append(line(rng.choice(colls), any_id(), "update", None,
                        {"color": None, "flag": True, "zero": -0.0, "tiny": 5e-324}, None))
for _ in range(200):  # UPSERT: document only / empty metadata / empty document
    extra_a.append(line(rng.choice(colls), any_id(), "upsert", None,
                        rng.choice([None, {}]), rng.choice(["", "replaced document"])))
for _ in range(150):  # another dimension: rejected whatever the operation
    op = rng.choice(["upsert", "update", "add", "delete"])
    extra_a.append(line(rng.choice(colls), any_id(), op, emb(dim // 2 or dim + 1), {"x": 1}, "wrong dim"))
for _ in range(150):  # DELETE of ids never written
    extra_a.append(line(rng.choice(colls), f"never-{rng.randrange(10**6)}", "delete"))

# a collection without embeddings; non-ASCII ids and keys whose UTF-8 order != UTF-16 order
odd_ids = ["id-\uff21", "id-\U0001F600", "id-é", "id-e", "id-Z", "id-z", "id-"]
odd_keys = ["\uff21", "\U0001F600", "é", "e", "Z", "z", "k\u00e9y", "key"]
for i in range(300):
    op = rng.choice(["add", "upsert", "upsert", "update", "delete"])
    meta = {k: rng.choice([None, "v\u00e9", 3, -2.5, False, "\U0001F600"]) for k in rng.sample(odd_keys, 3)}
    extra_a.append(line("nodim-\u00e9", rng.choice(odd_ids), op, None, meta, rng.choice([None, "d\u00e9j\u00e0 vu", ""])))

# the dimension is fixed by the first APPLIED embedding: a DELETE (applied or not) never fixes it
late = "late-dim"
extra_a.append(line(late, "a", "upsert", None, {"n": 1}, "no embedding yet"))
extra_a.append(line(late, "a", "delete", emb(5)))        # applied delete, does not fix the dimension
extra_a.append(line(late, "b", "delete", emb(6)))        # ignored (delete_missing)
extra_a.append(line(late, "c", "update", emb(7), {}))     # ignored (update_missing), does not fix it
extra_a.append(line(late, "c", "add", emb(4), {"n": 2}))  # fixes the dimension at 4
extra_a.append(line(late, "d", "upsert", emb(6), {}))     # rejected
extra_a.append(line(late, "c", "upsert", emb(4), {"n": None, "m": "x"}))

workload = open(os.path.join(work, "workload.jsonl")).read().splitlines()
# keep the late-dim story in order, shuffle everything else into the workload
late_lines = [l for l in extra_a if '"late-dim"' in l]
others = [l for l in extra_a if '"late-dim"' not in l]
part_a = workload + others
rng.shuffle(part_a)
pos = sorted(rng.sample(range(len(part_a) + 1), len(late_lines)))
for p, l in reversed(list(zip(pos, late_lines))):
    part_a.insert(p, l)
with open(os.path.join(work, "partA.jsonl"), "w") as f:
    f.write("\n".join(part_a) + "\n")

part_b = []
for _ in range(500):  # after the markers and the bad messages
    c = rng.choice(colls)
    op = rng.choice(["add", "update", "upsert", "delete"])
    part_b.append(line(c, any_id(), op, emb(dim) if op != "delete" else None,
                       {"color": rng.choice(["red", None]), "after": True}, rng.choice([None, "part b"])))
part_b.append(line(late, "c", "add", emb(4)))                    # add_existing
part_b.append(line(late, "e", "upsert", emb(4), {"q": 1.5}, "e"))
with open(os.path.join(work, "partB.jsonl"), "w") as f:
    f.write("\n".join(part_b) + "\n")

# ---- raw Avro (schemas/log_record.avsc, plain binary datum) ----
def zz(n):
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)

def s(x):
    b = x.encode()
    return zz(len(b)) + b

OPS = {"ADD": 0, "UPDATE": 1, "UPSERT": 2, "DELETE": 3, "BACKFILL_FN": 4}

def avro(cid, id_, op, embedding=None, metadata=None, document=None, backfill=None):
    out = s(cid) + s(id_) + zz(OPS[op])
    if embedding is None:
        out += zz(0)
    else:
        b = struct.pack("<%df" % len(embedding), *embedding)
        out += zz(1) + zz(len(b)) + b
    out += zz(0)  # encoding FLOAT32
    if metadata is None:
        out += zz(0)
    else:
        out += zz(1)
        if metadata:
            out += zz(len(metadata))
            for k, v in metadata.items():
                out += s(k)
                if v is None: out += zz(0)
                elif isinstance(v, bool): out += zz(4) + (b"\x01" if v else b"\x00")
                elif isinstance(v, str): out += zz(1) + s(v)
                elif isinstance(v, int): out += zz(2) + zz(v)
                else: out += zz(3) + struct.pack("<d", v)
        out += zz(0)
    out += zz(0) if document is None else zz(1) + s(document)
    out += zz(0) if backfill is None else zz(1) + s(backfill[0]) + s(backfill[1])
    return out

raw = os.path.join(work, "raw")
os.makedirs(raw)
manifest = []
def put(name, key, partition, data):
    with open(os.path.join(raw, name), "wb") as f:
        f.write(data)
    manifest.append(f"{name}\t{key}\t{partition}")

c0 = colls[0]
put("marker", c0, -1, avro(c0, "", "BACKFILL_FN", backfill=("req-smoke", "fn-smoke")))
put("marker-without-payload", c0, -1, avro(c0, "", "BACKFILL_FN"))
put("payload-on-data", c0, -1, avro(c0, "id-000001", "UPSERT", metadata={"x": 1}, backfill=("r", "f")))
put("negative-length", c0, -1, b"garbage")
put("truncated", c0, -1, avro(c0, "id-000002", "UPSERT", document="truncated")[:-5])
put("trailing-bytes", c0, -1, avro(c0, "id-000003", "UPSERT", document="trailing") + b"\x00")
put("embedding-not-multiple-of-4", c0, -1,
    s(c0) + s("id-000004") + zz(OPS["UPSERT"]) + zz(1) + zz(6) + b"\x00" * 6 + zz(0) * 4)
put("empty-id", c0, -1, avro(c0, "", "UPSERT", document="no id"))
put("key-mismatch", colls[1 % len(colls)], -1, avro(c0, "id-000005", "UPSERT", document="wrong key"))
put("valid-raw", c0, -1, avro(c0, "raw-1", "UPSERT", [0.5] * dim,
                              {"s": "x", "l": -7, "d": 0.1, "b": True, "n": None}, "raw"))
# the same record on every partition: all but its murmur2 home are misrouted
for p in range(int(os.environ.get("PEER_SMOKE_PARTITIONS", "1"))):
    put(f"everywhere-{p}", "everywhere", p, avro("everywhere", "one", "UPSERT", None, {"p": p}, "home"))
with open(os.path.join(raw, "manifest.tsv"), "w") as f:
    f.write("\n".join(manifest) + "\n")
print(f"extras: {len(part_a) - len(workload)} lines shuffled into the workload, {len(part_b)} after, "
      f"{len(manifest)} raw messages", file=sys.stderr)
PY
[[ -f "$WORK/raw/manifest.tsv" ]] || die "extras generator failed"

produce_jsonl() {
    SLUICE_SYSDB="sqlite://$WORK/produce.sqlite" timeout "$PHASE_TIMEOUT" "$SLUICE" produce "$1" >&2 2>"$WORK/produce.log" ||
        { tail -20 "$WORK/produce.log" >&2; die "sluice produce $1 failed"; }
}
log "producing part A ($(wc -l <"$WORK/partA.jsonl") lines)"
produce_jsonl "$WORK/partA.jsonl"
log "producing $(wc -l <"$WORK/raw/manifest.tsv") raw messages with kcat (murmur2_random, or an explicit partition)"
while IFS=$'\t' read -r file key part; do
    args=(-P -b "$BS" -t "$TOPIC" -k "$key" -X topic.partitioner=murmur2_random)
    [[ "$part" == -1 ]] || args+=(-p "$part")
    timeout 60 kcat "${args[@]}" "$WORK/raw/$file" || die "kcat could not produce $file"
done <"$WORK/raw/manifest.tsv"
# an empty value (not a tombstone)
printf '%s|\n' "collection-0" | timeout 60 kcat -P -b "$BS" -t "$TOPIC" -K '|' -X topic.partitioner=murmur2_random ||
    die "kcat could not produce the empty value"
log "producing part B ($(wc -l <"$WORK/partB.jsonl") lines)"
produce_jsonl "$WORK/partB.jsonl"

TOTAL="$(timeout 60 "$KTOOL" get-offsets --bootstrap-server "$BS" --topic "$TOPIC" | awk -F: '{ s += $3 } END { print s + 0 }')"
log "$TOPIC holds $TOTAL messages"

# ------------------------------------------------------------------ 4. the peer -----
log "running the Kafka Streams peer (app id $APP_ID)"
peer_args=(--bootstrap "$BS" --topic "$TOPIC" --app-id "$APP_ID" --state-dir "$WORK/peer-state"
    --timeout-s "$PHASE_TIMEOUT")
$KEEP || peer_args+=(--cleanup) # the peer deletes its state, changelog topics and group
[[ -z "$THREADS" ]] || peer_args+=(--threads "$THREADS")
t0="$(now)"
java -jar "$JAR" "${peer_args[@]}" >"$WORK/peer.out" 2>"$WORK/peer.err" ||
    { tail -40 "$WORK/peer.err" >&2; die "the peer failed (log tail above)"; }
PEER_WALL="$(fsub "$(now)" "$t0")"
grep -E 'throughput:|processed ' "$WORK/peer.err" | sed 's/^/  peer: /' >&2 || true
PEER_LINE="$(grep -E '^records=[0-9]+ sha256=[0-9a-f]{64}$' "$WORK/peer.out" || true)"
[[ -n "$PEER_LINE" ]] || { cat "$WORK/peer.out" >&2; die "the peer printed no 'records=N sha256=HEX' line"; }
log "peer run took $PEER_WALL s wall (JVM start to exit)"
echo "peer:   $PEER_LINE"

# ------------------------------------------------------------------ 5. sluice -------
SQLITE_URL="sqlite://$WORK/sluice.sqlite"
export SLUICE_GROUP="$GROUP_SLUICE"
SLUICE_SYSDB="$SQLITE_URL" timeout 120 "$SLUICE" init --partitions "$PARTITIONS" >&2
caught_up() {
    local out
    out="$(SLUICE_SYSDB="$SQLITE_URL" timeout 30 "$SLUICE" offsets show --format json 2>"$WORK/poll.err")" || return 1
    jq -e --argjson n "$TOTAL" --argjson p "$PARTITIONS" \
        'length == $p and (map(.high_watermark) | add) == $n
         and all(.[]; .lag == 0 and .sysdb_next_offset == .high_watermark)' <<<"$out" >/dev/null
}
log "running sluice process (fresh SQLite sysdb, group $GROUP_SLUICE)"
t0="$(now)"
SLUICE_SYSDB="$SQLITE_URL" "$SLUICE" --log-format json process 2>"$WORK/sluice.log" &
SLUICE_PID=$!
deadline=$(($(date +%s) + PHASE_TIMEOUT))
while :; do
    kill -0 "$SLUICE_PID" 2>/dev/null || { tail -30 "$WORK/sluice.log" >&2; die "sluice process exited before catching up"; }
    caught_up && break
    if (($(date +%s) > deadline)); then
        SLUICE_SYSDB="$SQLITE_URL" "$SLUICE" offsets show >&2 || true
        tail -30 "$WORK/sluice.log" >&2
        die "sluice process did not catch up within $PHASE_TIMEOUT s"
    fi
    sleep 0.5
done
SLUICE_S="$(fsub "$(now)" "$t0")"
log "sluice caught up in $SLUICE_S s (spawn -> first poll that saw lag 0; debug build)"
kill -TERM "$SLUICE_PID"
for _ in $(seq 1 120); do kill -0 "$SLUICE_PID" 2>/dev/null || break; sleep 0.25; done
if kill -0 "$SLUICE_PID" 2>/dev/null; then
    kill -KILL "$SLUICE_PID" 2>/dev/null || true
    wait "$SLUICE_PID" 2>/dev/null || true
    SLUICE_PID=""
    die "sluice process did not exit within 30 s of SIGTERM"
fi
rc=0
wait "$SLUICE_PID" || rc=$?
SLUICE_PID=""
((rc == 0)) || { tail -20 "$WORK/sluice.log" >&2; die "sluice process exited with $rc after SIGTERM"; }

SLUICE_LINE=""
if "$SLUICE" checksum --help >/dev/null 2>&1; then
    SLUICE_LINE="$(SLUICE_SYSDB="$SQLITE_URL" timeout 120 "$SLUICE" checksum)" || die "sluice checksum failed"
    echo "sluice: $SLUICE_LINE"
else
    log "this sluice binary has no 'checksum' subcommand: no comparison"
fi

if [[ -n "$SLUICE_LINE" ]]; then
    if [[ "$SLUICE_LINE" == "$PEER_LINE" ]]; then
        log "MATCH: the peer and sluice materialized the same $TOTAL-message log identically"
    else
        die "MISMATCH: peer '$PEER_LINE' vs sluice '$SLUICE_LINE' (run with --keep to inspect $WORK)"
    fi
fi
