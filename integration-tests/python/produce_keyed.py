#!/usr/bin/env python3
"""Produce keyed records with the Python client (confluent-kafka) and report where each landed.

Used by integration-tests/tests/it/partitioner_interop.rs to check that a Python producer
configured with `partitioner=murmur2_random` puts a key on the partition Sluice computes
(`sluice::record::partitioner::partition_for`, the Java client's default partitioner).

Input: one key per line, hex-encoded (so that arbitrary bytes survive), from the file
given with --keys or from stdin. Blank lines are ignored.
Output (stdout): one line per delivery report, `hex_key partition offset`, in delivery
order. Errors go to stderr; the exit status is 1 if any delivery failed.

Usage: produce_keyed.py --brokers 127.0.0.1:9092 --topic T [--keys FILE] [--partitioner P]
"""

import argparse
import sys

from confluent_kafka import Producer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--keys", help="file of hex keys, one per line (default: stdin)")
    ap.add_argument(
        "--partitioner",
        default="murmur2_random",
        help="librdkafka partitioner (default murmur2_random; other values only as a negative control)",
    )
    args = ap.parse_args()

    source = open(args.keys, encoding="ascii") if args.keys else sys.stdin
    with source:
        keys = [bytes.fromhex(line.strip()) for line in source if line.strip()]

    producer = Producer(
        {
            "bootstrap.servers": args.brokers,
            # librdkafka's default is consistent_random (CRC32): NOT what Java/Sluice use.
            "partitioner": args.partitioner,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 20000,
        }
    )
    failures = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(f"{msg.key().hex()}: {err}")
        else:
            print(f"{msg.key().hex()} {msg.partition()} {msg.offset()}")

    for i, key in enumerate(keys):
        while True:
            try:
                producer.produce(args.topic, key=key, value=b"py-%d" % i, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(30)
    sys.stdout.flush()
    if remaining:
        print(f"{remaining} message(s) not delivered within 30 s", file=sys.stderr)
        return 1
    if failures:
        print("delivery failures:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
