#!/usr/bin/env python3
"""Chaos workload for Sluice: replicas killed, frozen and restarted while three kinds of
producers write, a reader pages through the records, functions are attached and detached,
and hostile records arrive.

What it does, in order:
  1. `sluice init --partitions P`, then one seed upsert per collection (`sluice produce`)
     so that every collection's embedding dimension (4) is fixed before any hostile
     wrong-dimension record can arrive;
  2. starts R `sluice process` replicas (replica i serves its HTTP API on the i-th of
     --http-ports);
  3. for --cycles actions on the replicas (or --seconds), at the same time:
     - a plain producer: `sluice produce` of JSON lines, a batch every ~second;
     - an idempotent producer (confluent-kafka, enable.idempotence=true) that also sends
       the hostile records: garbage bytes, truncated Avro, a wrong embedding dimension, a
       record on a partition that is not its collection's (misrouted) and a record whose
       key is not its collection id;
     - a transactional producer (transactional.id) committing most transactions and
       aborting some; aborted transactions carry hostile records too (they must never be
       seen by the processor);
     - all three now and then send a record with large values, up to the validation
       limits (a 1 MiB document, up to 64 metadata keys with strings of up to 64 KiB,
       ids of 1,024 bytes): about 1.1-1.6 MB a message;
     - a reader: pages of GET /api/v1/collections/{id}/records on a random live replica,
       followed to the end, and every 10th pass `sluice records`; each page must be in id
       order after its cursor, with its large values whole;
     - chaos on the replicas, one action (a cycle) every --action-every seconds: kill -9
       (restarted a few seconds later), SIGSTOP for 1-12 s (longer than the session
       timeout now and then: the frozen replica comes back as a zombie whose partitions
       moved), graceful restart (SIGTERM, start). A replica that exits although nobody
       stopped it (one that fails to start, say) is reported with the tail of its log;
     - `sluice functions attach` of record_counter / statistics / normalize on random
       collections, and `sluice functions detach` (with or without --drop-output) of some;
  4. stops the producers, thaws and restarts every replica, waits until the sysdb
     positions reach the high watermarks and every attached function is ready, or until
     nothing has moved for --stall-seconds (bounded by --settle-seconds); then reads every
     collection over HTTP page by page into final-pages.json;
  5. stops the replicas (SIGTERM) and writes manifest.json into --dir: the hostile records
     sent (partition, offset, label), the attaches/detaches, the replica logs, exit codes,
     lines that say a partition HALTED, the reader's errors and the figures of the run.

The verdict is not given here: the Rust checker (integration-tests/tests/it/chaos.rs) reads
the log topic with read_committed, computes the expected state with the reference model and
compares it with the sysdb, the pages read, the function outputs, the DLQ and the positions.

Every sluice command gets SLUICE_CONFIG/BROKERS/SYSDB/GROUP/TOPIC_PREFIX from the flags.
"""

import argparse
import http.client
import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import fastavro
from confluent_kafka import KafkaException, Producer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ left in the checkout
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
from murmur2 import partition as home_partition  # noqa: E402

DIM = 4
# The validation limits (record/src/validate.rs, Limits::default()): records with large
# values go up to them, and the log topic takes messages of MAX_MESSAGE bytes.
MAX_DOCUMENT = 1 << 20
MAX_META_VALUE = 64 * 1024
MAX_META_KEYS = 64
MAX_ID = 1024
MAX_MESSAGE = 4 << 20
BIG = "big"
FUNCTIONS = ["record_counter", "statistics", "normalize"]
META_KEYS = ["color", "size", "flag", "n"]
META_VALUES = {
    "color": ["red", "green", "blue", None],
    "size": [1, 2, 3, 10, None],
    "flag": [True, False, None],
    "n": [0.5, 1.5, -2.25, None],
}


def log_tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip()[:400] for line in f.readlines()[-lines:]]
    except OSError as e:
        return [f"(cannot read {path}: {e})"]


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Figures:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}

    def add(self, key, n=1):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def snapshot(self):
        with self.lock:
            return dict(sorted(self.counts.items()))


class Workload:
    """Good records over a fixed set of collections and ids (one RNG per user)."""

    def __init__(self, prefix, collections, ids, seed):
        self.collections = [f"{prefix}-c{i}" for i in range(collections)]
        self.ids = ids
        self.rng = random.Random(seed)

    def record(self):
        rng = self.rng
        op = rng.choices(["add", "update", "upsert", "delete"], weights=[35, 20, 25, 20])[0]
        rec = {"collection": rng.choice(self.collections), "id": f"r{rng.randrange(self.ids)}", "operation": op,
               "embedding": None, "metadata": None, "document": None}
        if op != "delete":
            if rng.random() < 0.7:
                rec["embedding"] = [round(rng.uniform(-1, 1), 3) for _ in range(DIM)]
            if rng.random() < 0.7:
                keys = rng.sample(META_KEYS, rng.randint(1, len(META_KEYS)))
                rec["metadata"] = {k: rng.choice(META_VALUES[k]) for k in keys}
            if rng.random() < 0.5:
                rec["document"] = rng.choice(["", "doc", f"document {rng.randrange(1000)}"])
        return rec

    def big_record(self):
        """A record near the validation limits: a document of up to 1 MiB, up to 64 metadata
        keys of which several hold strings of up to 64 KiB, now and then an id of 1,024
        bytes; about 1.1-1.6 MB encoded. Each large string says its own length and is one
        character repeated, so that a reader can tell a torn value (`intact`)."""
        rng = self.rng
        op = rng.choices(["upsert", "add", "update"], weights=[60, 20, 20])[0]
        if rng.random() < 0.2:
            head = f"long-{rng.randrange(5)}-"
            rid = head + "i" * (MAX_ID - len(head))
        else:
            rid = f"r{rng.randrange(self.ids)}"
        doc_len = MAX_DOCUMENT if rng.random() < 0.5 else rng.randint(MAX_DOCUMENT - 65536, MAX_DOCUMENT)
        meta = {}
        for k in rng.sample(META_KEYS, rng.randint(0, len(META_KEYS))):
            meta[k] = rng.choice(META_VALUES[k])
        for n in range(rng.randint(1, 8)):
            size = MAX_META_VALUE if rng.random() < 0.5 else rng.randint(MAX_META_VALUE - 4096, MAX_META_VALUE)
            meta[f"{BIG}{n}"] = big_text(rng, size)
        if rng.random() < 0.3:
            for n in range(MAX_META_KEYS - len(meta)):
                meta[f"k{n:02}"] = rng.randrange(4)
        return {"collection": rng.choice(self.collections), "id": rid, "operation": op,
                "embedding": [round(rng.uniform(-1, 1), 3) for _ in range(DIM)],
                "metadata": meta, "document": big_text(rng, doc_len)}


def big_text(rng, length):
    """`big|<length>|` then one letter repeated up to `length` bytes."""
    head = f"{BIG}|{length}|"
    return head + rng.choice("abcdefghijklmnopqrstuvwxyz") * (length - len(head))


def intact(value):
    """Whether a string made by `big_text` came back whole (other strings: True)."""
    if not isinstance(value, str) or not value.startswith(BIG + "|"):
        return True
    try:
        _, length, rest = value.split("|", 2)
    except ValueError:
        return False
    return len(value.encode()) == int(length) and len(set(rest)) <= 1


def avro_datum(rec):
    """A workload record as the datum fastavro writes (schemas/log_record.avsc)."""
    d = {"collection_id": rec["collection"], "id": rec["id"], "operation": rec["operation"].upper(),
         "metadata": rec["metadata"], "document": rec["document"]}
    if rec["embedding"] is not None:
        d["embedding"] = struct.pack("<%df" % len(rec["embedding"]), *rec["embedding"])
    return d


class Hostile:
    """Hostile payloads; each returns (key, value, partition or None, label)."""

    def __init__(self, schema, workload, partitions, seed):
        self.schema = schema
        self.w = workload
        self.partitions = partitions
        self.rng = random.Random(seed)

    def encode(self, datum):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.schema, datum)
        return buf.getvalue()

    def make(self):
        rng = self.rng
        c = rng.choice(self.w.collections)
        home = home_partition(c, self.partitions)
        kind = rng.choice(["garbage", "truncated", "wrong_dimension", "misrouted", "key_mismatch", "empty"])
        if kind == "garbage":
            # An overlong varint where the collection id's length should be, then noise.
            value = b"\xff" * 12 + bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
            return c.encode(), value, None, kind
        if kind == "empty":
            return c.encode(), b"", None, kind
        good = self.w.record()
        good["collection"] = c
        if kind == "truncated":
            good["operation"] = "upsert"
            good["document"] = "a document long enough to cut" * 2
            value = self.encode(avro_datum(good))
            return c.encode(), value[: rng.randint(1, len(value) - 1)], None, kind
        if kind == "wrong_dimension":
            good["operation"] = "upsert"
            good["embedding"] = [0.25] * rng.choice([1, 3, 5, 8])
            return c.encode(), self.encode(avro_datum(good)), None, kind
        if kind == "misrouted":
            other = (home + rng.randint(1, self.partitions - 1)) % self.partitions
            return c.encode(), self.encode(avro_datum(good)), other, kind
        # key_mismatch: the record of collection c, keyed by another name, on c's partition.
        return f"not-{c}".encode(), self.encode(avro_datum(good)), home, kind


class Delivery:
    """Collects delivery reports of one flush/transaction."""

    def __init__(self):
        self.reports = []

    def cb(self, label):
        def done(err, msg):
            self.reports.append((label, err, msg.partition() if err is None else None, msg.offset() if err is None else None))
        return done


class Run:
    def __init__(self, args):
        self.args = args
        self.env = dict(os.environ)
        self.env.update({
            "SLUICE_CONFIG": args.config, "SLUICE_BROKERS": args.brokers, "SLUICE_SYSDB": args.sysdb,
            "SLUICE_GROUP": args.group, "SLUICE_TOPIC_PREFIX": args.prefix, "SLUICE_HTTP": "",
        })
        self.env.pop("SLUICE_FAILPOINT", None)
        self.topic = f"{args.prefix}.log"
        self.fig = Figures()
        self.stop = threading.Event()      # plain and idempotent producers
        self.stop_tx = threading.Event()   # the transactional producer (stops last)
        self.stop_reader = threading.Event()
        self.operator = None                # the attach or detach in flight (a thread)
        self.hostile = []          # {"partition", "offset", "label", "producer"}
        self.hostile_lock = threading.Lock()
        self.errors = []           # harness-level problems (reported, never hidden)
        self.replicas = [None] * args.replicas   # subprocess.Popen or None
        self.frozen_until = [None] * args.replicas
        self.restart_at = [None] * args.replicas
        self.generation = [0] * args.replicas
        self.logs = []
        self.replica_log = [None] * args.replicas
        self.started_at = [None] * args.replicas
        self.http_ports = [int(p) for p in args.http_ports.split(",")] if args.http_ports else []
        self.exit_codes = []       # {replica, generation, how it ended, code, seconds_alive, log[, log_tail]}
        self.reader_errors = []    # pages that came back wrong (reported, never hidden)
        self.cycles = 0            # chaos actions done: kill -9, freeze, graceful restart
        self.functions = []        # {"function_id", "collection", "function", "output", "detached", "drop_output"}
        self.schema = fastavro.schema.load_schema(os.path.join(REPO, "schemas", "log_record.avsc"))

    # ---- sluice commands -------------------------------------------------------------
    def sluice(self, *argv, timeout=120):
        return subprocess.run([self.args.sluice, *argv], env=self.env, capture_output=True, text=True, timeout=timeout)

    def sluice_write(self, what, *argv, wait=60):
        """A command that writes the sysdb, repeated while SQLite answers that another
        connection holds the write lock past the busy timeout (a replica frozen inside its
        transaction holds it for up to 12 s): the documented answer is "unavailable,
        nothing written, retry" (docs/sqlite.md), whether SQLite's lock or the writers'
        queue in front of it was held. Counted, not an error."""
        deadline = time.monotonic() + wait
        while True:
            out = self.sluice(*argv)
            busy = "database is locked" in out.stderr or "sysdb unavailable (sqlite)" in out.stderr
            if out.returncode == 0 or not busy or time.monotonic() > deadline:
                return out
            self.fig.add(f"{what}_retried_locked")
            time.sleep(1)

    def produce_lines(self, recs, tag):
        path = os.path.join(self.args.dir, f"produce-{tag}.jsonl")
        with open(path, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        out = self.sluice("produce", path)
        os.unlink(path)
        if out.returncode != 0:
            # A failed `sluice produce` may have written part of its input: the oracle reads
            # the log, so that is fine, but it is reported.
            self.errors.append(f"sluice produce failed ({out.returncode}): {out.stderr.strip()[-400:]}")
            self.fig.add("plain_produce_failures")
            return False
        self.fig.add("plain_records", len(recs))
        for r in recs:
            self.fig.add(f"plain_{r['operation']}")
        return True

    # ---- replicas --------------------------------------------------------------------
    def start_replica(self, i):
        self.generation[i] += 1
        path = os.path.join(self.args.dir, f"replica-{i}-{self.generation[i]}.log")
        self.logs.append(path)
        env = self.env
        if self.http_ports:
            env = dict(self.env, SLUICE_HTTP=f"127.0.0.1:{self.http_ports[i]}")
        f = open(path, "w")
        self.replicas[i] = subprocess.Popen([self.args.sluice, "process"], env=env, stdout=subprocess.DEVNULL,
                                            stderr=f, stdin=subprocess.DEVNULL)
        f.close()
        self.replica_log[i] = path
        self.started_at[i] = time.monotonic()
        self.restart_at[i] = None
        self.frozen_until[i] = None

    def reap(self, i, how):
        p = self.replicas[i]
        code = p.wait()
        x = {"replica": i, "generation": self.generation[i], "how": how, "code": code,
             "seconds_alive": round(time.monotonic() - self.started_at[i], 1), "log": self.replica_log[i]}
        if how == "exited by itself" or (how == "SIGTERM" and code != 0):
            x["log_tail"] = log_tail(self.replica_log[i])
        self.exit_codes.append(x)
        self.replicas[i] = None
        return x

    def exited_by_itself(self, i):
        """Reaps replica i if it has exited although nobody stopped it: a replica that
        failed to start (cannot open the sysdb, its port is taken, ...) or died. Reported
        with the tail of its log; it is restarted a second later."""
        p = self.replicas[i]
        if p is None or p.poll() is None:
            return False
        # The checker reports it from the exits, with the tail of its log.
        x = self.reap(i, "exited by itself")
        self.fig.add("replica_exits_by_itself")
        self.restart_at[i] = time.monotonic() + 1
        log(f"replica {i} exited by itself with {x['code']}")
        return True

    def kill9(self, i):
        if self.exited_by_itself(i):
            return False
        p = self.replicas[i]
        if self.frozen_until[i] is not None:
            self.frozen_until[i] = None
        os.kill(p.pid, signal.SIGKILL)
        self.reap(i, "kill -9")
        self.fig.add("kills")
        self.restart_at[i] = time.monotonic() + random.uniform(0.5, 4.0)
        return True

    def freeze(self, i, seconds):
        if self.exited_by_itself(i):
            return False
        os.kill(self.replicas[i].pid, signal.SIGSTOP)
        self.frozen_until[i] = time.monotonic() + seconds
        self.fig.add("freezes")
        if seconds > self.args.session_timeout:
            self.fig.add("freezes_beyond_session_timeout")
        return True

    def thaw(self, i):
        os.kill(self.replicas[i].pid, signal.SIGCONT)
        self.frozen_until[i] = None

    def terminate(self, i, timeout=40):
        if self.frozen_until[i] is not None:
            self.thaw(i)
        if self.exited_by_itself(i):
            return False
        p = self.replicas[i]
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
            self.reap(i, "SIGTERM")
        except subprocess.TimeoutExpired:
            self.errors.append(f"replica {i} (generation {self.generation[i]}) did not stop within {timeout}s of SIGTERM; killed")
            p.kill()
            self.reap(i, "SIGTERM timed out, then kill -9")
        return True

    def check_unexpected_exits(self):
        for i in range(self.args.replicas):
            if self.frozen_until[i] is None:
                self.exited_by_itself(i)

    # ---- producers -------------------------------------------------------------------
    def plain_producer(self):
        w = Workload(self.args.prefix, self.args.collections, self.args.ids, self.args.seed + 1)
        n = 0
        while not self.stop.is_set():
            n += 1
            recs = [w.record() for _ in range(w.rng.randint(50, 150))]
            if w.rng.random() < self.args.big_ratio * 50:
                recs.insert(w.rng.randrange(len(recs)), w.big_record())
            if self.produce_lines(recs, f"plain-{n}"):
                self.count_big(recs, "plain")
            self.stop.wait(random.uniform(0.5, 1.5))

    def base_config(self):
        return {"bootstrap.servers": self.args.brokers, "partitioner": "murmur2_random", "linger.ms": 5,
                "message.max.bytes": MAX_MESSAGE}

    def count_big(self, recs, producer):
        big = sum(1 for r in recs if isinstance(r.get("document"), str) and r["document"].startswith(BIG + "|"))
        if big:
            self.fig.add("big_records", big)
            self.fig.add(f"big_records_{producer}", big)

    def record_hostile(self, reports, producer):
        for label, err, p, o in reports:
            if label is None:
                continue
            if err is not None:
                self.errors.append(f"{producer} hostile record ({label}) not delivered: {err}")
                continue
            with self.hostile_lock:
                self.hostile.append({"partition": p, "offset": o, "label": label, "producer": producer})
            self.fig.add(f"hostile_{label}")
            self.fig.add("hostile_records")

    def idempotent_producer(self):
        w = Workload(self.args.prefix, self.args.collections, self.args.ids, self.args.seed + 2)
        hostile = Hostile(self.schema, w, self.args.partitions, self.args.seed + 3)
        conf = self.base_config()
        conf["enable.idempotence"] = True
        prod = Producer(conf)
        while not self.stop.is_set():
            d = Delivery()
            for _ in range(w.rng.randint(20, 60)):
                if w.rng.random() < 0.04:
                    key, value, part, label = hostile.make()
                    kw = {} if part is None else {"partition": part}
                    prod.produce(self.topic, key=key, value=value, on_delivery=d.cb(label), **kw)
                else:
                    rec = w.big_record() if w.rng.random() < self.args.big_ratio else w.record()
                    prod.produce(self.topic, key=rec["collection"].encode(), value=hostile.encode(avro_datum(rec)),
                                 on_delivery=d.cb(None))
                    self.fig.add("idempotent_records")
                    self.fig.add(f"idempotent_{rec['operation']}")
                    self.count_big([rec], "idempotent")
                prod.poll(0)
            left = prod.flush(30)
            if left:
                self.errors.append(f"idempotent producer: {left} messages not flushed in 30 s")
            failed = [e for label, e, _, _ in d.reports if label is None and e is not None]
            if failed:
                self.errors.append(f"idempotent producer: {len(failed)} records failed: {failed[0]}")
            self.record_hostile(d.reports, "idempotent")
            self.stop.wait(random.uniform(0.1, 0.4))

    def transactional_producer(self):
        w = Workload(self.args.prefix, self.args.collections, self.args.ids, self.args.seed + 4)
        hostile = Hostile(self.schema, w, self.args.partitions, self.args.seed + 5)
        conf = self.base_config()
        conf["transactional.id"] = f"{self.args.prefix}-chaos-tx"
        prod = Producer(conf)
        prod.init_transactions(60)
        while not self.stop_tx.is_set():
            abort = w.rng.random() < self.args.abort_ratio
            d = Delivery()
            n = 0
            sent = []
            prod.begin_transaction()
            try:
                for _ in range(w.rng.randint(5, 60)):
                    if w.rng.random() < 0.03:
                        key, value, part, label = hostile.make()
                        kw = {} if part is None else {"partition": part}
                        prod.produce(self.topic, key=key, value=value, on_delivery=d.cb(label), **kw)
                    else:
                        rec = w.big_record() if w.rng.random() < self.args.big_ratio * 2 else w.record()
                        prod.produce(self.topic, key=rec["collection"].encode(), value=hostile.encode(avro_datum(rec)),
                                     on_delivery=d.cb(None))
                        sent.append(rec)
                        n += 1
                    prod.poll(0)
                if abort:
                    prod.flush(30)  # the aborted records are in the log, then the abort marker
                    prod.abort_transaction(60)
                    self.fig.add("transactions_aborted")
                    self.fig.add("transactional_records_aborted", n)
                else:
                    prod.commit_transaction(60)
                    self.fig.add("transactions_committed")
                    self.fig.add("transactional_records_committed", n)
                    self.count_big(sent, "transactional")
                    self.record_hostile(d.reports, "transactional")
            except KafkaException as e:
                # Whatever happened, the oracle reads the log with read_committed.
                self.errors.append(f"transaction failed: {e}")
                self.fig.add("transactions_failed")
                try:
                    prod.abort_transaction(60)
                except KafkaException:
                    pass
            self.stop_tx.wait(random.uniform(0.1, 0.6))
        # The last writes of the run: one committed transaction with a record for every
        # collection, then an aborted one. Every partition that holds a collection then
        # ends with a transaction marker, as it does when a transactional producer (Kafka
        # Streams, Flink, Connect) is the last writer.
        for abort in (False, True):
            prod.begin_transaction()
            for c in w.collections:
                rec = w.record()
                rec["collection"] = c
                prod.produce(self.topic, key=c.encode(), value=hostile.encode(avro_datum(rec)))
            if abort:
                prod.flush(30)
                prod.abort_transaction(60)
                self.fig.add("transactions_aborted")
                self.fig.add("transactional_records_aborted", len(w.collections))
            else:
                prod.commit_transaction(60)
                self.fig.add("transactions_committed")
                self.fig.add("transactional_records_committed", len(w.collections))

    # ---- the reader ------------------------------------------------------------------
    def http_page(self, port, collection, after, limit, timeout=5):
        """GET one page of records: (status, body as JSON or text), or (None, why) when the
        replica does not answer (killed, frozen, starting)."""
        q = {"limit": str(limit)}
        if after is not None:
            q["after"] = after
        url = (f"http://127.0.0.1:{port}/api/v1/collections/{urllib.parse.quote(collection, safe='')}/records?"
               + urllib.parse.urlencode(q))
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")[:400]
        except (OSError, ValueError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short
            return None, str(e)

    def check_page(self, where, collection, after, page):
        """A page's records are in id order after the cursor, once each, whole."""
        ids = [r.get("id") for r in page.get("records", [])]
        problems = []
        if page.get("collection") != collection:
            problems.append(f"collection {page.get('collection')!r}")
        if any(not isinstance(i, str) for i in ids):
            problems.append("a record without an id")
        elif ids != sorted(set(ids)) or (after is not None and ids and ids[0] <= after):
            problems.append(f"ids out of order or not after the cursor {after!r}: {[i[:40] for i in ids][:10]}")
        for r in page.get("records", []):
            values = [r.get("document")] + list((r.get("metadata") or {}).values())
            if not all(intact(v) for v in values):
                problems.append(f"a torn large value in record {str(r.get('id'))[:40]}")
        if problems:
            self.reader_errors.append(f"{where}, collection {collection}, after {str(after)[:40]!r}: " + "; ".join(problems))
        return not problems

    def reader(self):
        """Polls pages of GET /api/v1/collections/{id}/records on a random replica, in a
        loop, following `next` to the end of the collection; every 10th pass reads the
        collection with `sluice records` instead. A page must be in id order after its
        cursor and its large values whole; a replica that does not answer (killed,
        frozen, starting) or answers 503 is counted, not an error."""
        rng = random.Random(self.args.seed + 7)
        collections = [f"{self.args.prefix}-c{i}" for i in range(self.args.collections)]
        seen = set()   # collections that answered once: a 404 afterwards is an error
        passes = 0
        while not self.stop_reader.is_set():
            passes += 1
            c = rng.choice(collections)
            if passes % 10 == 0:
                out = self.sluice("records", c, "--format", "jsonl", timeout=120)
                self.fig.add("reader_cli_reads")
                if out.returncode != 0:
                    if c in seen or "unknown collection" not in out.stderr:
                        self.reader_errors.append(f"sluice records {c} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
                    continue
                recs = [json.loads(line) for line in out.stdout.splitlines()]
                seen.add(c)
                self.fig.add("reader_cli_records", len(recs))
                self.check_page("sluice records", c, None, {"collection": c, "records": recs})
                continue
            up = [i for i in range(self.args.replicas) if self.replicas[i] is not None and self.frozen_until[i] is None]
            if not up or not self.http_ports:
                self.stop_reader.wait(0.2)
                continue
            port = self.http_ports[rng.choice(up)]
            limit = rng.choice([1, 7, 25, 50])
            after = None
            while not self.stop_reader.is_set():
                status, page = self.http_page(port, c, after, limit)
                if status is None:
                    self.fig.add("reader_no_answer")
                    break
                if status == 503:
                    self.fig.add("reader_503")
                    break
                if status == 404 and c not in seen:
                    self.fig.add("reader_404_before_first_record")
                    break
                if status != 200 or not isinstance(page, dict):
                    self.reader_errors.append(f"GET records of {c} after {str(after)[:40]!r} on port {port}: {status} {str(page)[:400]}")
                    break
                seen.add(c)
                self.fig.add("reader_pages")
                self.fig.add("reader_records", len(page.get("records", [])))
                self.check_page(f"GET on port {port}", c, after, page)
                after = page.get("next")
                if after is None:
                    self.fig.add("reader_passes")
                    break
            self.stop_reader.wait(rng.uniform(0.05, 0.3))

    def final_pages(self):
        """After the run: every collection read over HTTP page by page (limit 37) from the
        first replica that answers; the checker compares them with the model."""
        pages = {}
        for c in [f"{self.args.prefix}-c{i}" for i in range(self.args.collections)]:
            for port in self.http_ports:
                recs, after, ok = [], None, True
                while True:
                    status, page = self.http_page(port, c, after, 37, timeout=60)
                    if status != 200:
                        ok = False
                        break
                    self.check_page(f"final GET on port {port}", c, after, page)
                    recs.extend(page["records"])
                    after = page.get("next")
                    if after is None:
                        break
                if ok:
                    pages[c] = recs
                    break
            else:
                self.reader_errors.append(f"final read of {c}: no replica answered 200 ({status} {str(page)[:200]})")
        path = os.path.join(self.args.dir, "final-pages.json")
        with open(path, "w") as f:
            json.dump(pages, f)
        return path

    # ---- functions -------------------------------------------------------------------
    def attach(self, rng):
        c = rng.choice([f"{self.args.prefix}-c{i}" for i in range(self.args.collections)])
        # The first attaches go through every function, so that even a short run has each.
        fn = FUNCTIONS[len(self.functions)] if len(self.functions) < len(FUNCTIONS) else rng.choice(FUNCTIONS)
        output = f"{self.args.prefix}-out{len(self.functions)}-{fn}"
        out = self.sluice_write("attach", "functions", "attach", c, "--function", fn, "--output", output, "--format", "json")
        if out.returncode != 0:
            self.errors.append(f"functions attach {c} {fn} failed: {out.stderr.strip()[-400:]}")
            self.fig.add("attach_failures")
            return
        v = json.loads(out.stdout)
        self.functions.append({"function_id": v["function_id"], "collection": c, "function": fn, "output": output,
                               "detached": False, "drop_output": False, "marker": v.get("marker")})
        self.fig.add("attaches")

    def detach(self, rng, newest=False):
        # The first attach of each function stays attached: its output is compared.
        live = [f for f in self.functions[len(FUNCTIONS):] if not f["detached"]]
        if not live:
            return
        f = live[-1] if newest else rng.choice(live)
        drop = rng.random() < 0.5
        out = self.sluice_write("detach", "functions", "detach", f["function_id"], *(["--drop-output"] if drop else []))
        if out.returncode != 0:
            self.errors.append(f"functions detach {f['function_id']} failed: {out.stderr.strip()[-400:]}")
            self.fig.add("detach_failures")
            return
        f["detached"] = True
        f["drop_output"] = drop
        self.fig.add("detaches")

    # ---- the run ---------------------------------------------------------------------
    def offsets(self):
        out = self.sluice("offsets", "show", "--format", "json", timeout=60)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def function_views(self):
        out = self.sluice("functions", "list", "--format", "json", timeout=60)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def chaos_loop(self, deadline):
        rng = random.Random(self.args.seed + 6)
        next_action = time.monotonic() + rng.uniform(2, 5)
        next_function = time.monotonic() + rng.uniform(3, 8)
        scripted = [0.0, 0.5 + 0.01, 0.9]     # kill -9, a freeze, a graceful restart
        # One attach of each function, a fourth, and the detach of that fourth one.
        functions_scripted = ["attach"] * (len(FUNCTIONS) + 1) + ["detach newest"]
        cycles = self.args.cycles
        while time.monotonic() < deadline and (not cycles or self.cycles < cycles):
            now = time.monotonic()
            for i in range(self.args.replicas):
                if self.frozen_until[i] is not None and now >= self.frozen_until[i]:
                    self.thaw(i)
                if self.replicas[i] is None and self.restart_at[i] is not None and now >= self.restart_at[i]:
                    self.start_replica(i)
                    self.fig.add("restarts_after_kill")
            self.check_unexpected_exits()
            if now >= next_action:
                running = [i for i in range(self.args.replicas) if self.replicas[i] is not None and self.frozen_until[i] is None]
                if running:
                    i = rng.choice(running)
                    # The first three actions are one of each kind, so that even a short
                    # run has them all; then at random.
                    a = scripted.pop(0) if scripted else rng.random()
                    n = self.cycles + 1
                    if a < 0.4:
                        log(f"cycle {n}: kill -9 replica {i}")
                        done = self.kill9(i)
                    elif a < 0.75:
                        st = self.args.session_timeout
                        secs = rng.uniform(st + 1, st + 6) if self.fig.snapshot().get("freezes", 0) == 0 else rng.choice([rng.uniform(1, st - 1), rng.uniform(st + 1, st + 6)])
                        log(f"cycle {n}: SIGSTOP replica {i} for {secs:.1f}s")
                        done = self.freeze(i, secs)
                    else:
                        log(f"cycle {n}: graceful restart of replica {i}")
                        done = self.terminate(i)
                        if done:
                            self.start_replica(i)
                            self.fig.add("graceful_restarts")
                    if done:
                        self.cycles += 1
                lo, hi = self.args.action_every
                next_action = now + rng.uniform(lo, hi)
            # An operator's attach or detach runs on a thread of its own, one at a time: it
            # may wait for a replica this loop froze inside its commit (SQLite's write lock
            # and the writers' queue are held then), and this loop must go on to thaw it.
            # (Run inline, the loop waited for the command, the command for the thaw:
            # a 2.7 s freeze lasted 70 s and the command gave up.)
            if now >= next_function and (self.operator is None or not self.operator.is_alive()):
                what = functions_scripted.pop(0) if functions_scripted else ("attach" if rng.random() < 0.7 else "detach")
                op_rng = random.Random(rng.random())
                if what == "attach" or not any(not f["detached"] for f in self.functions[len(FUNCTIONS):]):
                    def op():
                        self.attach(op_rng)
                else:
                    def op(newest=what == "detach newest"):
                        self.detach(op_rng, newest=newest)
                op.__name__ = f"operator {what}"
                self.operator = threading.Thread(target=self.reporting(op), name="operator", daemon=True)
                self.operator.start()
                next_function = now + (rng.uniform(3, 6) if functions_scripted else rng.uniform(5, 15))
            time.sleep(0.1)

    def settle(self):
        """Everything running; wait for the end state or for nothing to move."""
        for i in range(self.args.replicas):
            if self.replicas[i] is not None and self.frozen_until[i] is not None:
                self.thaw(i)
            if self.replicas[i] is None:
                self.start_replica(i)
                self.fig.add("restarts_after_kill")
        started = time.monotonic()
        last, last_change, state = None, time.monotonic(), None
        while True:
            time.sleep(1)
            self.check_unexpected_exits()
            for i in range(self.args.replicas):
                if self.replicas[i] is None:
                    self.start_replica(i)
            rows, views = self.offsets(), self.function_views()
            if rows is None or views is None:
                continue
            caught_up = all(r["sysdb_next_offset"] == r["high_watermark"] or (r["high_watermark"] == 0 and r["sysdb_next_offset"] is None) for r in rows)
            ready = all(v["status"] in ("ready", "detached") for v in views)
            state = {"positions": [(r["partition"], r["sysdb_next_offset"], r["high_watermark"]) for r in rows],
                     "functions": [(v["id"], v["status"], v["backfill_done"]) for v in views]}
            if state != last:
                last, last_change = state, time.monotonic()
            if caught_up and ready:
                return True, time.monotonic() - started, state
            if time.monotonic() - last_change >= self.args.stall_seconds:
                log(f"nothing moved for {self.args.stall_seconds}s: {state}")
                return False, time.monotonic() - started, state
            if time.monotonic() - started >= self.args.settle_seconds:
                log(f"not settled after {self.args.settle_seconds}s: {state}")
                return False, time.monotonic() - started, state

    def reporting(self, target):
        """`target`, with an exception it dies of reported as a harness error."""
        def run():
            try:
                target()
            except Exception as e:  # noqa: BLE001 - reported, and the run fails on it
                self.errors.append(f"{target.__name__} died: {type(e).__name__}: {e}")
                log(f"{target.__name__} died: {e!r}")
        return run

    def kill_all(self):
        """Leaves no replica behind when the driver itself fails."""
        for p in self.replicas:
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()

    def run(self):
        try:
            self.run_inner()
        finally:
            self.kill_all()

    def run_inner(self):
        a = self.args
        t0 = time.monotonic()
        out = self.sluice("init", "--partitions", str(a.partitions))
        if out.returncode != 0:
            raise SystemExit(f"sluice init failed: {out.stderr}")
        seed = Workload(a.prefix, a.collections, a.ids, a.seed)
        seeds = [{"collection": c, "id": "seed", "operation": "upsert", "embedding": [0.5] * DIM,
                  "metadata": {"color": "red"}, "document": "seed"} for c in seed.collections]
        if not self.produce_lines(seeds, "seed"):
            raise SystemExit("seeding failed: " + "; ".join(self.errors))
        for i in range(a.replicas):
            self.start_replica(i)
        threads = [threading.Thread(target=self.reporting(t), name=t.__name__, daemon=True)
                   for t in (self.plain_producer, self.idempotent_producer, self.transactional_producer)]
        for t in threads:
            t.start()
        reader = threading.Thread(target=self.reporting(self.reader), name="reader", daemon=True)
        reader.start()
        bound = f"{a.cycles} cycles (at most {a.seconds:.0f} s)" if a.cycles else f"{a.seconds}s"
        log(f"chaos for {bound} on {a.replicas} replicas, {a.partitions} partitions, prefix {a.prefix}")
        self.chaos_loop(t0 + a.seconds)
        if self.operator is not None:
            for i in range(a.replicas):  # an operator waiting on a frozen replica ends once it is thawed
                if self.replicas[i] is not None and self.frozen_until[i] is not None:
                    self.thaw(i)
            self.operator.join(timeout=180)
            if self.operator.is_alive():
                self.errors.append("an operator's attach or detach did not end within 180 s of the chaos")
        self.fig.add("cycles", self.cycles)
        self.stop.set()
        for t in threads[:2]:
            t.join(timeout=120)
        self.stop_tx.set()
        for t in threads:
            t.join(timeout=120)
            if t.is_alive():
                self.errors.append(f"producer thread {t.name} did not stop within 120 s")
        chaos_secs = time.monotonic() - t0
        log("chaos over; producers stopped; waiting for the replicas to settle")
        settled, settle_secs, state = self.settle()
        self.stop_reader.set()
        reader.join(timeout=180)
        if reader.is_alive():
            self.errors.append("the reader did not stop within 180 s")
        final_pages = self.final_pages() if self.http_ports else None
        self.check_unexpected_exits()
        for i in range(a.replicas):
            if self.replicas[i] is not None:
                self.terminate(i)
        halted = []
        events = {"log_cas_refusals": "batch refused by the sysdb compare-and-set",
                  "log_partitions_revoked": "revoked partitions",
                  "log_dlq_lines": "record sent to the DLQ",
                  "log_backfills_finished": "backfill finished"}
        for path in self.logs:
            with open(path, errors="replace") as f:
                for line in f:
                    if "HALTED" in line or "panicked" in line:
                        halted.append(f"{os.path.basename(path)}: {line.strip()[:400]}")
                    for key, needle in events.items():
                        if needle in line:
                            self.fig.add(key)
        figures = self.fig.snapshot()
        figures.update({
            "replicas": a.replicas, "partitions": a.partitions, "collections": a.collections,
            "chaos_seconds": round(chaos_secs, 1), "settle_seconds": round(settle_secs, 1),
            "total_seconds": round(time.monotonic() - t0, 1),
        })
        manifest = {
            "prefix": a.prefix, "group": a.group, "sysdb": a.sysdb, "brokers": a.brokers, "config": a.config,
            "partitions": a.partitions, "collections": seed.collections,
            "hostile": sorted(self.hostile, key=lambda h: (h["partition"], h["offset"])),
            "functions": self.functions, "replica_logs": self.logs, "exits": self.exit_codes,
            "halted_or_panicked": halted, "harness_errors": self.errors, "settled": settled,
            "reader_errors": self.reader_errors, "final_pages": final_pages, "backend": a.sysdb.split(":", 1)[0],
            "final_state": state, "figures": figures,
        }
        path = os.path.join(a.dir, "manifest.json")
        with open(path, "w") as f:
            json.dump(manifest, f, indent=1)
        log("figures: " + json.dumps(figures))
        print(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", required=True, help="path of the sluice binary")
    ap.add_argument("--config", required=True)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--sysdb", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--dir", required=True, help="run directory: replica logs and manifest.json")
    ap.add_argument("--seconds", type=float, default=600, help="chaos for this long (with --cycles: at most)")
    ap.add_argument("--cycles", type=int, default=0,
                    help="stop the chaos after this many actions on the replicas (kill -9, freeze, graceful restart)")
    ap.add_argument("--action-every", type=lambda v: tuple(float(x) for x in v.split(",")), default=(1.5, 4.5),
                    help="seconds between two actions, drawn between MIN,MAX")
    ap.add_argument("--session-timeout", type=float, default=6, help="the replicas' session timeout, seconds")
    ap.add_argument("--http-ports", default="", help="comma-separated: replica i serves its HTTP API on the i-th")
    ap.add_argument("--big-ratio", type=float, default=0.0005,
                    help="share of the idempotent producer's records that are large (twice that for the "
                         "transactional producer; plain batches carry one with 50 times that probability)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--collections", type=int, default=8)
    ap.add_argument("--ids", type=int, default=150, help="record ids per collection")
    ap.add_argument("--abort-ratio", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--settle-seconds", type=float, default=240)
    ap.add_argument("--stall-seconds", type=float, default=30)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    random.seed(args.seed)
    Run(args).run()


if __name__ == "__main__":
    main()
