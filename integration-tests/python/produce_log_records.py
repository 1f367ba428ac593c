#!/usr/bin/env python3
"""Write randomized Sluice log records with the Python Avro stack and describe them in JSON.

Used by integration-tests/tests/it/python_interop.rs: a producer in another language
(fastavro + confluent-kafka) writes `schemas/log_record.avsc` datums, and Sluice's
hand-written decoder must read back exactly what was written.

What it writes (deterministic for a given --seed):
- --count plain Avro datums (`fastavro.schemaless_writer`, no framing), covering all five
  operations, embeddings of random dimensions packed as little-endian f32
  (`struct.pack('<%df')`), metadata maps whose values are str / int / float / bool / None,
  unicode ids and documents, absent (defaulted) and explicit-null optional fields, and
  BACKFILL_FN control records carrying {request_id, function_id};
- then one Confluent-framed copy (0x00, 4-byte big-endian schema id, datum) of the first
  record of each operation, with assorted schema ids.
Every message's key is its collection id (UTF-8); the producer uses
`partitioner=murmur2_random`, the Java client's partitioner for keyed records.

The JSON file (--out) lists every message in produce order:
  {"partition", "offset", "key_hex", "framing": "plain"|"confluent", "schema_id",
   "record": {"collection_id", "id", "operation", "embedding": [f32 values] | null,
              "encoding", "metadata": {key: value} | null, "document", "backfill"}}
Embedding values are the f32 values as Python floats (rounded through struct pack/unpack,
so they are exact); metadata values keep their Python types (int, float, bool, None, str),
which JSON preserves (1 vs 1.0).

Usage: produce_log_records.py --brokers B --topic T --schema schemas/log_record.avsc
                              --out expected.json [--count 500] [--seed 7]
"""

import argparse
import io
import json
import random
import struct
import sys
import uuid

import fastavro
from confluent_kafka import Producer

OPERATIONS = ["ADD", "UPDATE", "UPSERT", "DELETE", "BACKFILL_FN"]
# Code point ranges for unicode text: ASCII, Latin-1, Greek, combining marks, Arabic (RTL),
# Hiragana, CJK, astral emoji (4-byte UTF-8, surrogate pairs in JSON).
RANGES = [(0x21, 0x7E), (0xC0, 0xFF), (0x391, 0x3C9), (0x300, 0x36F), (0x627, 0x64A),
          (0x3041, 0x3096), (0x4E00, 0x4FFF), (0x1F300, 0x1F5FF)]
# Framed copies use these schema ids (big-endian on the wire; extremes included).
CONFLUENT_SCHEMA_IDS = [0, 1, 42, 0x01020304, 0xFFFFFFFF]


def text(rng, lo, hi):
    out = []
    for _ in range(rng.randint(lo, hi)):
        a, b = rng.choice(RANGES)
        out.append(chr(rng.randint(a, b)))
    return "".join(out)


def f32(x):
    """The nearest f32 of x, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def embedding(rng):
    dim = rng.choice([1, 2, 3, 4, 8, 16, rng.randint(1, 64), rng.randint(100, 300)])
    specials = [0.0, -0.0, 1.0, -1.0, 3.4028234663852886e38, 1.1754943508222875e-38,
                1e-40, 1.401298464324817e-45, 0.1]
    values = []
    for _ in range(dim):
        r = rng.random()
        if r < 0.05:
            values.append(rng.choice(specials))
        elif r < 0.15:
            values.append(rng.uniform(-1e30, 1e30))
        else:
            values.append(rng.uniform(-1.0, 1.0))
    values = [f32(v) for v in values]
    packed = struct.pack("<%df" % dim, *values)
    assert list(struct.unpack("<%df" % dim, packed)) == values
    return packed, values


def meta_value(rng):
    kind = rng.choice(["str", "int", "float", "bool", "none"])
    if kind == "str":
        return rng.choice(["", text(rng, 1, 12), "plain-ascii"])
    if kind == "int":
        return rng.choice([0, 1, -1, rng.randint(-1000, 1000), rng.randint(-2**63, 2**63 - 1),
                           2**63 - 1, -2**63, 2**31, -2**31 - 1])
    if kind == "float":
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random(), 0.0, -0.0, 3.0, 0.1,
                           5e-324, 1.7976931348623157e308, -2.5e-300, float(2**53)])
    if kind == "bool":
        return rng.random() < 0.5
    return None


def metadata(rng):
    r = rng.random()
    if r < 0.1:
        return {}
    m = {}
    for _ in range(rng.randint(1, 7)):
        key = rng.choice(["", "tag", "score", "count", "flag", text(rng, 1, 8)])
        m[key] = meta_value(rng)
    return m


def record_id(rng):
    return rng.choice([str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                       text(rng, 1, 20), "r%d" % rng.randint(0, 50)])


def make_record(rng, collection_id, operation):
    """Returns (datum for fastavro, JSON description of the same record)."""
    datum = {"collection_id": collection_id, "operation": operation}
    desc = {"collection_id": collection_id, "operation": operation, "encoding": "FLOAT32",
            "embedding": None, "metadata": None, "document": None, "backfill": None}

    # Optional fields: absent (schema default null), explicit None, or a value.
    def optional(name, make, p_value):
        r = rng.random()
        if r < p_value:
            wire, described = make()
            datum[name] = wire
            desc[name] = described
        elif r < p_value + (1 - p_value) / 2:
            datum[name] = None
        # else: absent, fastavro writes the default (null)

    if operation == "BACKFILL_FN":
        datum["id"] = desc["id"] = rng.choice(["", record_id(rng)])
        ref = {"request_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
               "function_id": rng.choice([str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                                          "fn-" + text(rng, 1, 10)])}
        datum["backfill"] = ref
        desc["backfill"] = dict(ref)
    else:
        datum["id"] = desc["id"] = record_id(rng)
        p = 0.1 if operation == "DELETE" else 0.75
        optional("embedding", lambda: embedding(rng), p)
        optional("metadata", lambda: (lambda m: (m, dict(m)))(metadata(rng)), p)
        optional("document", lambda: (lambda d: (d, d))(rng.choice(["", text(rng, 1, 80), "nul\x00inside"])), p)
        if rng.random() < 0.2:
            datum["backfill"] = None
    if rng.random() < 0.5:
        datum["encoding"] = "FLOAT32"  # else the schema default
    return datum, desc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--schema", required=True, help="path of schemas/log_record.avsc")
    ap.add_argument("--out", required=True, help="JSON description of what was written")
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    schema = fastavro.schema.load_schema(args.schema)
    collections = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(6)]
    collections += ["colección-ñ", "コレクション", "emoji-🦀-coll", "e\u0301-combining", text(rng, 3, 10)]

    messages = []  # (key bytes, value bytes, description)
    first_of = {}
    for i in range(args.count):
        # The first five cover every operation; then a weighted mix.
        op = OPERATIONS[i] if i < len(OPERATIONS) else rng.choices(OPERATIONS, weights=[30, 20, 25, 15, 10])[0]
        cid = rng.choice(collections)
        datum, desc = make_record(rng, cid, op)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, datum)
        messages.append((cid.encode(), buf.getvalue(), {"framing": "plain", "schema_id": None, "record": desc}))
        first_of.setdefault(op, len(messages) - 1)
    for op, schema_id in zip(OPERATIONS, CONFLUENT_SCHEMA_IDS):
        key, datum_bytes, d = messages[first_of[op]]
        framed = b"\x00" + struct.pack(">I", schema_id) + datum_bytes
        messages.append((key, framed, {"framing": "confluent", "schema_id": schema_id, "record": d["record"]}))

    producer = Producer({
        "bootstrap.servers": args.brokers,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "linger.ms": 5,
        "message.timeout.ms": 20000,
    })
    failures = []

    def reporter(desc):
        def on_delivery(err, msg):
            if err is not None:
                failures.append(f"{msg.key()!r}: {err}")
            else:
                desc["partition"] = msg.partition()
                desc["offset"] = msg.offset()
        return on_delivery

    for key, value, desc in messages:
        desc["key_hex"] = key.hex()
        while True:
            try:
                producer.produce(args.topic, key=key, value=value, on_delivery=reporter(desc))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(30)
    if remaining or failures:
        print(f"{remaining} undelivered; failures: {failures}", file=sys.stderr)
        return 1
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump([d for _, _, d in messages], f, allow_nan=False, indent=None)
    print(f"wrote {len(messages)} messages to {args.topic}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
