#!/usr/bin/env python3
"""SQL-only: what SQLite alone does with the write shapes of the suite's W1, W4 and W5.

No Kafka, no decoding, no Sluice process: the statements Sluice's SQLite backend runs for
a drained batch (read every key first, append the value to `record_values`, upsert the
small row into `records`, upsert each touched `collections` row, one transaction per
`--tx` records), with its settings (WAL, synchronous=NORMAL, 16 MiB writer cache, 2 GiB
memory map, a second connection checkpointing every 200 ms, RESTART past 16,384 frames),
on the layout `sluice init` created:

  W1  64 collections x 1,000 ids, into an empty sysdb
  W4  80,000 collections of one id, into an empty sysdb (a collections row per record)
  W5  8 collections x 1.25M ids drawn at random, into a sysdb seeded with 10M small rows
      (the suite's seeding SQL)

Every record is an upsert of a 1,536-byte embedding (384 dims), a short document and
metadata. It prints rows/s, CPU per row and the bytes and system calls per row that
went through read() and write() (/proc/self/io), per shape and round, and each shape's
median rate against W1's: the suite's W4/W5 goals are such ratios. Python's sqlite3
module runs the system's SQLite, not the one Sluice builds in, and adds its own
per-statement cost, so the absolute rates are not Sluice's; the ratios and the I/O per
row are the point.

Usage: shapes.py SYSDB [--rounds N] [--records N] [--tx N] [--work DIR]
  SYSDB: an empty sysdb made by `sluice init` (it is copied, never written).
The process pins nothing: run it under `taskset -c 1` to compare with a pinned replica.
"""
import argparse, os, random, shutil, sqlite3, statistics, sys, tempfile, threading, time

DIM_BYTES = 384 * 4
SEEDED_COLLECTIONS, SEEDED_IDS = 8, 1_250_000


def configure(c, cache_kib):
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute(f"PRAGMA cache_size=-{cache_kib}")
    c.execute("PRAGMA mmap_size=2147483648")
    c.execute("PRAGMA wal_autocheckpoint=40000")
    c.execute("PRAGMA journal_size_limit=335544320")


def seed_w5(empty, path):
    """The suite's W5 seeding (a recursive CTE for its generate_series): 8 collections of 1.25M small rows."""
    shutil.copyfile(empty, path)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA cache_size=-262144")
    values = ", ".join(f"('seeded-{i}', {i})" for i in range(SEEDED_COLLECTIONS))
    c.executescript(f"""
BEGIN;
INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)
  SELECT c.column1, c.column2, NULL, -1, {SEEDED_IDS}, 0 FROM (VALUES {values}) AS c;
INSERT INTO record_values (collection_id, id, embedding, document)
  WITH RECURSIVE s(value) AS (SELECT 0 UNION ALL SELECT value + 1 FROM s WHERE value < {SEEDED_IDS - 1})
  SELECT c.column1, printf('id-%06d', s.value), NULL, 'seeded record' FROM (VALUES {values}) AS c, s;
INSERT INTO records (collection_id, id, metadata, last_offset, value, value_bytes)
  SELECT collection_id, id, '{{"seeded":true}}', -1, seq, 13 FROM record_values ORDER BY seq;
UPDATE value_log SET log_bytes = log_bytes + 13 * (SELECT count(*) FROM records),
                     live_bytes = live_bytes + 13 * (SELECT count(*) FROM records);
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
""")
    c.close()


def keys_for(shape, n, rng):
    if shape == "W1":
        return [(f"collection-{rng.randrange(64)}", f"id-{rng.randrange(1000):06d}") for _ in range(n)]
    if shape == "W4":
        return [(f"collection-{rng.randrange(80_000)}", "id-000000") for _ in range(n)]
    return [(f"seeded-{rng.randrange(SEEDED_COLLECTIONS)}", f"id-{rng.randrange(SEEDED_IDS):06d}") for _ in range(n)]


def proc_io():
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().split("\n") if line)
    return [int(fields[k]) for k in ("wchar", "rchar", "syscw", "syscr")]


def run(shape, template, db, n, tx_rows, seed):
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    shutil.copyfile(template, db)
    writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    configure(writer, 16 * 1024)
    checkpointer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    configure(checkpointer, 2 * 1024)
    keys = keys_for(shape, n, random.Random(seed))
    embedding, metadata, document = os.urandom(DIM_BYTES), '{"k":"v","n":1,"tag":"abcdefgh"}', "document " * 10
    stop = threading.Event()

    def checkpoint():
        while not stop.wait(0.2):
            if checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1] > 16_384:
                checkpointer.execute("PRAGMA wal_checkpoint(RESTART)")

    thread = threading.Thread(target=checkpoint)
    thread.start()
    io0, t0, c0 = proc_io(), time.time(), time.process_time()
    offset = 0
    for start in range(0, n, tx_rows):
        chunk = keys[start:start + tx_rows]
        writer.execute("BEGIN IMMEDIATE")
        for key in chunk:
            writer.execute("SELECT last_offset, value FROM records WHERE collection_id = ? AND id = ?", key).fetchone()
        for collection, rid in chunk:
            value = writer.execute(
                "INSERT INTO record_values (collection_id, id, embedding, document) VALUES (?, ?, ?, ?)",
                (collection, rid, embedding, document)).lastrowid
            writer.execute(
                "INSERT INTO records (collection_id, id, metadata, last_offset, value) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (collection_id, id) DO UPDATE SET metadata = excluded.metadata,"
                " last_offset = excluded.last_offset, value = excluded.value",
                (collection, rid, metadata, offset, value))
            offset += 1
        for collection in sorted({c for c, _ in chunk}):
            writer.execute(
                "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)"
                " VALUES (?, 0, 384, ?, 1, 0) ON CONFLICT (id) DO UPDATE SET"
                " dimension = COALESCE(collections.dimension, excluded.dimension),"
                " log_position = excluded.log_position, record_count = collections.record_count + excluded.record_count",
                (collection, offset))
        writer.execute("COMMIT")
    wall, cpu = time.time() - t0, time.process_time() - c0
    stop.set()
    thread.join()
    io1 = proc_io()
    writer.close()
    checkpointer.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    d = [b - a for a, b in zip(io0, io1)]
    return {"rate": n / wall, "cpu_us": cpu / n * 1e6, "w_kb": d[0] / n / 1024, "r_kb": d[1] / n / 1024,
            "w_calls": d[2] / n, "r_calls": d[3] / n}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sysdb")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--tx", type=int, default=5_000)
    p.add_argument("--work", default=None)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="sqlite-shapes.", dir=a.work)
    try:
        seeded = os.path.join(work, "seeded.db")
        seed_w5(a.sysdb, seeded)
        print(f"SQLite {sqlite3.sqlite_version}; {a.records} records per run, {a.tx} per transaction")
        print(f"{'shape':5} {'round':>5} {'rows/s':>8} {'CPU us/row':>10} {'write KB':>8} {'read KB':>8} {'writes':>6} {'reads':>6}  (per row)")
        results = {s: [] for s in ("W1", "W4", "W5")}
        for r in range(1, a.rounds + 1):
            for shape in results:
                m = run(shape, seeded if shape == "W5" else a.sysdb, os.path.join(work, "run.db"), a.records, a.tx, r)
                results[shape].append(m)
                print(f"{shape:5} {r:5} {m['rate']:8.0f} {m['cpu_us']:10.1f} {m['w_kb']:8.1f} {m['r_kb']:8.1f} "
                      f"{m['w_calls']:6.2f} {m['r_calls']:6.2f}", flush=True)
        base = statistics.median(m["rate"] for m in results["W1"])
        for shape in ("W4", "W5"):
            print(f"{shape} / W1 (median rows/s): {statistics.median(m['rate'] for m in results[shape]) / base:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
