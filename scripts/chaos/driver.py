#!/usr/bin/env python3
"""Chaos workload for Sluice: replicas killed, frozen and restarted while three kinds of
producers write, functions are attached and detached, and hostile records arrive.

What it does, in order:
  1. `sluice init --partitions P`, then one seed upsert per collection (`sluice produce`)
     so that every collection's embedding dimension (4) is fixed before any hostile
     wrong-dimension record can arrive;
  2. starts R `sluice process` replicas;
  3. for --seconds, at the same time:
     - a plain producer: `sluice produce` of JSON lines, a batch every ~second;
     - an idempotent producer (confluent-kafka, enable.idempotence=true) that also sends
       the hostile records: garbage bytes, truncated Avro, a wrong embedding dimension, a
       record on a partition that is not its collection's (misrouted) and a record whose
       key is not its collection id;
     - a transactional producer (transactional.id) committing most transactions and
       aborting some; aborted transactions carry hostile records too (they must never be
       seen by the processor);
     - chaos on the replicas: kill -9 (restarted a few seconds later), SIGSTOP for 1-12 s
       (longer than the session timeout now and then: the frozen replica comes back as a
       zombie whose partitions moved), graceful restart (SIGTERM, start);
     - `sluice functions attach` of record_counter / statistics / normalize on random
       collections, and `sluice functions detach` (with or without --drop-output) of some;
  4. stops the producers, thaws and restarts every replica, waits until the sysdb
     positions reach the high watermarks and every attached function is ready, or until
     nothing has moved for --stall-seconds (bounded by --settle-seconds);
  5. stops the replicas (SIGTERM) and writes manifest.json into --dir: the hostile records
     sent (partition, offset, label), the attaches/detaches, the replica logs, exit codes,
     lines that say a partition HALTED, and the figures of the run.

The verdict is not given here: the Rust checker (integration-tests/tests/it/chaos.rs) reads
the log topic with read_committed, computes the expected state with the reference model and
compares it with the sysdb, the function outputs, the DLQ and the positions.

Every sluice command gets SLUICE_CONFIG/BROKERS/SYSDB/GROUP/TOPIC_PREFIX from the flags.
"""

import argparse
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

import fastavro
from confluent_kafka import KafkaException, Producer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ left in the checkout
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
from murmur2 import partition as home_partition  # noqa: E402

DIM = 4
FUNCTIONS = ["record_counter", "statistics", "normalize"]
META_KEYS = ["color", "size", "flag", "n"]
META_VALUES = {
    "color": ["red", "green", "blue", None],
    "size": [1, 2, 3, 10, None],
    "flag": [True, False, None],
    "n": [0.5, 1.5, -2.25, None],
}


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
        self.hostile = []          # {"partition", "offset", "label", "producer"}
        self.hostile_lock = threading.Lock()
        self.errors = []           # harness-level problems (reported, never hidden)
        self.replicas = [None] * args.replicas   # subprocess.Popen or None
        self.frozen_until = [None] * args.replicas
        self.restart_at = [None] * args.replicas
        self.generation = [0] * args.replicas
        self.logs = []
        self.exit_codes = []       # (replica, generation, how it ended, code)
        self.functions = []        # {"function_id", "collection", "function", "output", "detached", "drop_output"}
        self.schema = fastavro.schema.load_schema(os.path.join(REPO, "schemas", "log_record.avsc"))

    # ---- sluice commands -------------------------------------------------------------
    def sluice(self, *argv, timeout=120):
        return subprocess.run([self.args.sluice, *argv], env=self.env, capture_output=True, text=True, timeout=timeout)

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
        f = open(path, "w")
        self.replicas[i] = subprocess.Popen([self.args.sluice, "process"], env=self.env, stdout=subprocess.DEVNULL,
                                            stderr=f, stdin=subprocess.DEVNULL)
        f.close()
        self.restart_at[i] = None
        self.frozen_until[i] = None

    def reap(self, i, how):
        p = self.replicas[i]
        code = p.wait()
        self.exit_codes.append({"replica": i, "generation": self.generation[i], "how": how, "code": code})
        self.replicas[i] = None

    def kill9(self, i):
        p = self.replicas[i]
        if self.frozen_until[i] is not None:
            self.frozen_until[i] = None
        os.kill(p.pid, signal.SIGKILL)
        self.reap(i, "kill -9")
        self.fig.add("kills")
        self.restart_at[i] = time.monotonic() + random.uniform(0.5, 4.0)

    def freeze(self, i, seconds):
        os.kill(self.replicas[i].pid, signal.SIGSTOP)
        self.frozen_until[i] = time.monotonic() + seconds
        self.fig.add("freezes")
        if seconds > 6:
            self.fig.add("freezes_beyond_session_timeout")

    def thaw(self, i):
        os.kill(self.replicas[i].pid, signal.SIGCONT)
        self.frozen_until[i] = None

    def terminate(self, i, timeout=40):
        p = self.replicas[i]
        if self.frozen_until[i] is not None:
            self.thaw(i)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
            self.reap(i, "SIGTERM")
        except subprocess.TimeoutExpired:
            self.errors.append(f"replica {i} (generation {self.generation[i]}) did not stop within {timeout}s of SIGTERM; killed")
            p.kill()
            self.reap(i, "SIGTERM timed out, then kill -9")

    def check_unexpected_exits(self):
        for i, p in enumerate(self.replicas):
            if p is not None and self.frozen_until[i] is None and p.poll() is not None:
                self.errors.append(f"replica {i} (generation {self.generation[i]}) exited by itself with {p.returncode}; "
                                   f"log {self.logs[-1] if self.logs else '?'}")
                self.reap(i, "exited by itself")
                self.restart_at[i] = time.monotonic() + 1

    # ---- producers -------------------------------------------------------------------
    def plain_producer(self):
        w = Workload(self.args.prefix, self.args.collections, self.args.ids, self.args.seed + 1)
        n = 0
        while not self.stop.is_set():
            n += 1
            self.produce_lines([w.record() for _ in range(w.rng.randint(50, 150))], f"plain-{n}")
            self.stop.wait(random.uniform(0.5, 1.5))

    def base_config(self):
        return {"bootstrap.servers": self.args.brokers, "partitioner": "murmur2_random", "linger.ms": 5}

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
                    rec = w.record()
                    prod.produce(self.topic, key=rec["collection"].encode(), value=hostile.encode(avro_datum(rec)),
                                 on_delivery=d.cb(None))
                    self.fig.add("idempotent_records")
                    self.fig.add(f"idempotent_{rec['operation']}")
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
            prod.begin_transaction()
            try:
                for _ in range(w.rng.randint(5, 60)):
                    if w.rng.random() < 0.03:
                        key, value, part, label = hostile.make()
                        kw = {} if part is None else {"partition": part}
                        prod.produce(self.topic, key=key, value=value, on_delivery=d.cb(label), **kw)
                    else:
                        rec = w.record()
                        prod.produce(self.topic, key=rec["collection"].encode(), value=hostile.encode(avro_datum(rec)),
                                     on_delivery=d.cb(None))
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

    # ---- functions -------------------------------------------------------------------
    def attach(self, rng):
        c = rng.choice([f"{self.args.prefix}-c{i}" for i in range(self.args.collections)])
        # The first attaches go through every function, so that even a short run has each.
        fn = FUNCTIONS[len(self.functions)] if len(self.functions) < len(FUNCTIONS) else rng.choice(FUNCTIONS)
        output = f"{self.args.prefix}-out{len(self.functions)}-{fn}"
        out = self.sluice("functions", "attach", c, "--function", fn, "--output", output, "--format", "json")
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
        out = self.sluice("functions", "detach", f["function_id"], *(["--drop-output"] if drop else []))
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
        while time.monotonic() < deadline:
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
                    if a < 0.4:
                        log(f"kill -9 replica {i}")
                        self.kill9(i)
                    elif a < 0.75:
                        secs = rng.uniform(7, 12) if self.fig.snapshot().get("freezes", 0) == 0 else rng.choice([rng.uniform(1, 5), rng.uniform(7, 12)])
                        log(f"SIGSTOP replica {i} for {secs:.1f}s")
                        self.freeze(i, secs)
                    else:
                        log(f"graceful restart of replica {i}")
                        self.terminate(i)
                        self.start_replica(i)
                        self.fig.add("graceful_restarts")
                next_action = now + rng.uniform(2, 6)
            if now >= next_function:
                what = functions_scripted.pop(0) if functions_scripted else ("attach" if rng.random() < 0.7 else "detach")
                if what == "attach" or not any(not f["detached"] for f in self.functions[len(FUNCTIONS):]):
                    self.attach(rng)
                else:
                    self.detach(rng, newest=what == "detach newest")
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

    def run(self):
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
        threads = [threading.Thread(target=t, name=t.__name__, daemon=True)
                   for t in (self.plain_producer, self.idempotent_producer, self.transactional_producer)]
        for t in threads:
            t.start()
        log(f"chaos for {a.seconds}s on {a.replicas} replicas, {a.partitions} partitions, prefix {a.prefix}")
        self.chaos_loop(t0 + a.seconds)
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
    ap.add_argument("--seconds", type=float, default=600)
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
