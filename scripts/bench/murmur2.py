#!/usr/bin/env python3
"""Kafka's murmur2 partitioner (the Java client's default for keyed records, librdkafka's
murmur2_random), for scripts/bench-suite.sh's W5 seeding: the seeded `collections` rows
must name the partition the processor will see each collection on.

  murmur2.py layout N P   picks a collection prefix whose N collections <prefix>0..N-1
                          land on N distinct partitions of P (N <= P); prints
                          "<prefix> <partition of 0> ... <partition of N-1>"
  murmur2.py check P      reads "<key> <partition>" lines (kcat %k %p of a real topic)
                          and exits 1 unless every partition is murmur2(key) % P
"""
import sys


def murmur2(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2, as an unsigned 32-bit value."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail, rem = length & ~3, length % 4
    if rem == 3:
        h ^= data[tail + 2] << 16
    if rem >= 2:
        h ^= data[tail + 1] << 8
    if rem >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def main() -> int:
    if sys.argv[1] == "layout":
        n, p = int(sys.argv[2]), int(sys.argv[3])
        if n > p:
            # more collections than partitions: the plain prefix
            print("collection-", *(partition(f"collection-{i}", p) for i in range(n)))
            return 0
        for k in range(100000):
            prefix = f"big{k}-collection-"
            parts = [partition(f"{prefix}{i}", p) for i in range(n)]
            if len(set(parts)) == n:
                print(prefix, *parts)
                return 0
        return 1
    if sys.argv[1] == "check":
        p, bad, n = int(sys.argv[2]), 0, 0
        for line in sys.stdin:
            key, part = line.split()
            n += 1
            if partition(key, p) != int(part):
                bad += 1
                print(f"murmur2: {key} is on partition {part}, computed {partition(key, p)}", file=sys.stderr)
        return 1 if bad or n == 0 else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
