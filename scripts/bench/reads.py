#!/usr/bin/env python3
"""Clients of the read benchmark (scripts/bench-reads.sh), standard library only.

  reads.py pace --rate R                 stdin lines to stdout at R lines/s (10 ms steps)
  reads.py probe --port P --seconds S [--warmup-s W] [--interval-ms I]
      every I ms: POST one record to /api/v1/collections/<c>/records, take the token of
      its answer, GET /api/v1/collections/<c>?at_least=TOKEN&wait_ms=30000; the sample is
      the time from the POST's answer (the produce acknowledged) to the GET's answer.
      Prints one JSON document: samples after the warm-up, p50/p90/p99/max in ms, errors.
  reads.py waiters --port P --token TOKEN --waiters N --collection C [--steps K]
      N threads; thread i waits, through GET /api/v1/collections/C?at_least=...&wait_ms=,
      for K offsets spread evenly over partition (i mod partitions) of TOKEN (a token of
      the log's high watermarks), one after the other, so that N reads wait at every
      moment of a drain and each is woken by the commits of its partition. Runs until
      every thread is done or killed; prints one JSON document (reads answered, errors).
"""

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def pace(rate):
    step = 0.01
    per_step = rate * step
    owed = 0.0
    t = time.monotonic()
    out = sys.stdout
    for line in sys.stdin:
        if owed < 1.0:
            out.flush()
            t += step
            delay = t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            owed += per_step
        out.write(line)
        owed -= 1.0
    out.flush()


def request(port, method, path, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, None


def quantile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def probe(port, seconds, warmup_s, interval_ms, collection):
    samples, errors, n = [], [], 0
    start = time.monotonic()
    end = start + warmup_s + seconds
    next_t = start
    while time.monotonic() < end:
        next_t += interval_ms / 1000
        rec = {"id": f"probe-{n}", "operation": "upsert", "document": f"probe {n}"}
        n += 1
        status, answer = request(port, "POST", f"/api/v1/collections/{collection}/records", [rec])
        if status >= 300 or not answer or "token" not in answer:
            errors.append(f"POST {status}: {answer}")
        else:
            acked = time.monotonic()
            status, body = request(port, "GET", f"/api/v1/collections/{collection}?at_least={answer['token']}&wait_ms=30000")
            took = time.monotonic() - acked
            if status != 200:
                errors.append(f"GET {status}: {body}")
            elif acked - start >= warmup_s:
                samples.append(took * 1000)
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    print(json.dumps({
        "samples": len(samples),
        "p50_ms": quantile(samples, 0.5),
        "p90_ms": quantile(samples, 0.9),
        "p99_ms": quantile(samples, 0.99),
        "max_ms": max(samples) if samples else None,
        "errors": len(errors),
        "first_errors": errors[:3],
    }))


def waiters(port, token, count, collection, steps):
    version, fp, parts = token.split(".", 2)
    highs = [tuple(int(x) for x in p.split("-")) for p in parts.split("_")]
    done = [0] * count
    errors = []
    lock = threading.Lock()

    def run(i):
        p, high = highs[i % len(highs)]
        for k in range(1, steps + 1):
            want = high * k // steps
            t = f"{version}.{fp}.{p}-{want}"
            while True:
                status, body = request(port, "GET", f"/api/v1/collections/{collection}?at_least={t}&wait_ms=60000", timeout=90)
                # (404: the wait was covered, the collection is not in the state yet)
                if status in (200, 404):
                    done[i] += 1
                    break
                if status == 504:
                    continue
                with lock:
                    errors.append(f"{status}: {body}")
                return

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"waiters": count, "reads_answered": sum(done), "errors": len(errors), "first_errors": errors[:3]}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pace")
    a.add_argument("--rate", type=float, required=True)
    a = sub.add_parser("probe")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--seconds", type=float, default=20)
    a.add_argument("--warmup-s", type=float, default=3)
    a.add_argument("--interval-ms", type=float, default=50)
    a.add_argument("--collection", default="read-probe")
    a = sub.add_parser("waiters")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--token", required=True)
    a.add_argument("--waiters", type=int, default=100)
    a.add_argument("--collection", required=True)
    a.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if args.cmd == "pace":
        try:
            pace(args.rate)
        except (BrokenPipeError, KeyboardInterrupt):
            pass  # the consumer of the paced lines was stopped: the end of the run
    elif args.cmd == "probe":
        probe(args.port, args.seconds, args.warmup_s, args.interval_ms, args.collection)
    else:
        waiters(args.port, args.token, args.waiters, args.collection, args.steps)


if __name__ == "__main__":
    main()
