#!/usr/bin/env python3
"""Fold Sluice's change feed into a copy of the state (docs/changes.md, section 5).

Reads every partition of the changes topic from the beginning up to the high watermarks
it has when the script starts, with isolation.level=read_committed (only committed
changes, each exactly once), and folds the messages in order: a value replaces the
record of its key, a tombstone (no value) removes it. Prints the state as JSON on
stdout: {collection: {record id: {"id", "embedding", "metadata", "document", "offset"}}}.

    python3 fold_changes.py localhost:9092 sluice.changes > state.json
    python3 fold_changes.py localhost:9092 sluice.changes --confluent  # with a schema registry

Needs confluent-kafka and fastavro (deploy/local/python-env.sh installs both).
"""

import argparse
import io
import json
import os
import struct
import sys
import time
import uuid

import fastavro
from confluent_kafka import Consumer, TopicPartition

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas", "change_record.avsc")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bootstrap", help="Kafka bootstrap servers")
    ap.add_argument("topic", help="the changes topic, <topic_prefix>.changes")
    ap.add_argument("--schema", default=SCHEMA, help="schemas/change_record.avsc")
    ap.add_argument("--confluent", action="store_true", help="values carry the 5-byte Confluent header")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before giving up")
    args = ap.parse_args()

    with open(args.schema) as f:
        schema = fastavro.parse_schema(json.load(f))
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            # An assigned reader: it never joins the group nor commits.
            "group.id": "fold-changes-" + uuid.uuid4().hex,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    partitions = consumer.list_topics(args.topic, timeout=10).topics[args.topic].partitions
    ends = {}
    assignment = []
    for p in sorted(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=10)
        if low < high:
            ends[p] = high
            assignment.append(TopicPartition(args.topic, p, low))
    consumer.assign(assignment)

    state = {}
    done = set()
    deadline = time.monotonic() + args.timeout
    while len(done) < len(ends):
        if time.monotonic() > deadline:
            sys.exit(f"read {sorted(done)} of {sorted(ends)} partitions in {args.timeout}s")
        msg = consumer.poll(0.5)
        if msg is None:
            # Transaction markers and aborted records are never delivered: the position
            # steps over them, possibly to the end.
            for tp in consumer.position([TopicPartition(args.topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
            continue
        if msg.error():
            sys.exit(f"consumer error: {msg.error()}")
        if msg.offset() >= ends[msg.partition()]:
            done.add(msg.partition())
            continue
        # The key: collection id, one NUL byte, record id.
        collection, _, record_id = msg.key().partition(b"\0")
        collection, record_id = collection.decode(), record_id.decode()
        value = msg.value()
        if value is None:
            state.get(collection, {}).pop(record_id, None)
        else:
            if args.confluent:
                value = value[5:]
            rec = fastavro.schemaless_reader(io.BytesIO(value), schema)
            emb = rec["embedding"]
            state.setdefault(collection, {})[record_id] = {
                "id": rec["id"],
                "embedding": None if emb is None else list(struct.unpack(f"<{len(emb) // 4}f", emb)),
                "metadata": rec["metadata"] or None,
                "document": rec["document"],
                "offset": rec["offset"],
            }
        if msg.offset() + 1 >= ends[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    json.dump({c: records for c, records in state.items() if records}, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
