#!/usr/bin/env python3
"""Produce Confluent-framed log records whose writer schemas live in a schema registry.

Used by integration-tests/tests/it/schema_registry.rs (and shown in docs/producing.md): each
input line names a writer schema (one of the --schema NAME=SUBJECT=PATH given) and the
record to write with it. The schema is registered under SUBJECT (the registry answers with
its id; registering the same schema again returns the same id), the record is encoded with
fastavro (schemaless, i.e. the bare datum) and framed the Confluent way: magic byte 0, the
schema id as 4 bytes big-endian, the datum. That is byte for byte what confluent-kafka's
AvroSerializer writes; it needs no more than the stdlib and fastavro.

With --serializer confluent, confluent-kafka's own SchemaRegistryClient and AvroSerializer
(the `confluent-kafka[avro]` extra) register and frame instead, as docs/producing.md
shows; the subject is still the one given (a subject.name.strategy returning it).

Input (--input FILE, JSON lines): {"schema": NAME, "key": str, "record": {...}} where the
record is the Avro record as a dict (bytes fields as lists of float32 values for
"embedding", which is packed little-endian here).
Output (stdout): one line per record in input order, `partition offset schema_id`.

Usage: produce_with_registry.py --brokers B --topic T --registry URL \
         --schema v1=T-value=schemas/log_record.avsc --input FILE
"""

import argparse
import io
import json
import struct
import sys
import urllib.request

import fastavro
from confluent_kafka import Producer


def register(registry: str, subject: str, schema_text: str) -> int:
    req = urllib.request.Request(
        f"{registry.rstrip('/')}/subjects/{subject}/versions",
        data=json.dumps({"schema": schema_text}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.load(resp)["id"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--registry", default="")
    ap.add_argument("--schema", action="append", default=[], help="NAME=SUBJECT=PATH or NAME=ID=PATH")
    ap.add_argument("--input", required=True)
    ap.add_argument("--serializer", choices=["fastavro", "confluent"], default="fastavro")
    args = ap.parse_args()

    schemas = {}
    serializers = {}
    for spec in args.schema:
        name, subject, path = spec.split("=", 2)
        text = open(path, encoding="utf-8").read()
        if args.serializer == "confluent":
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.schema_registry.avro import AvroSerializer

            client = SchemaRegistryClient({"url": args.registry})
            strategy = (lambda s: lambda ctx, record_name: s)(subject)
            serializers[name] = AvroSerializer(client, text, conf={"subject.name.strategy": strategy})
            continue
        parsed = fastavro.parse_schema(json.loads(text))
        # A number instead of a subject: an id registered before (no registry call).
        schema_id = int(subject) if subject.isdigit() else register(args.registry, subject, text)
        schemas[name] = (schema_id, parsed)

    producer = Producer(
        {
            "bootstrap.servers": args.brokers,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 20000,
        }
    )
    results = {}
    failures = []

    def report(i):
        def on_delivery(err, msg):
            if err is not None:
                failures.append(f"line {i}: {err}")
            else:
                results[i] = (msg.partition(), msg.offset())

        return on_delivery

    lines = [json.loads(line) for line in open(args.input, encoding="utf-8") if line.strip()]
    ids = []
    for i, line in enumerate(lines):
        record = dict(line["record"])
        if isinstance(record.get("embedding"), list):
            record["embedding"] = struct.pack(f"<{len(record['embedding'])}f", *record["embedding"])
        if serializers:
            from confluent_kafka.serialization import MessageField, SerializationContext

            value = serializers[line["schema"]](record, SerializationContext(args.topic, MessageField.VALUE))
            assert value[0] == 0, "Confluent framing"
            schema_id = struct.unpack(">I", value[1:5])[0]
        else:
            schema_id, parsed = schemas[line["schema"]]
            out = io.BytesIO()
            out.write(b"\x00" + struct.pack(">I", schema_id))
            fastavro.schemaless_writer(out, parsed, record)
            value = out.getvalue()
        producer.produce(args.topic, key=line["key"].encode(), value=value, on_delivery=report(i))
        ids.append(schema_id)
        # One at a time: the records keep their input order in the partition.
        producer.flush(20)
    producer.flush(30)
    if failures or len(results) != len(lines):
        print("\n".join(failures) or f"{len(lines) - len(results)} records unconfirmed", file=sys.stderr)
        return 1
    for i in range(len(lines)):
        p, o = results[i]
        print(f"{p} {o} {ids[i]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
