#!/usr/bin/env python3
"""Helpers of scripts/bench-read-ab.sh (reads beside a paced load).

  read_ab.py reader --url http://HOST:PORT --stop-file F [--limit 1000] [--pause-ms 0]
      The reader client: pages through every collection of the replica's admin API,
      GET /api/v1/collections/{id}/records?limit=L&after=..., in a tight loop (one
      keep-alive connection; --pause-ms N: a sleep after each page) until F exists. Prints one JSON object: pages, records,
      bytes, seconds, pages/s, records/s, page time p50/p99, passes over all
      collections, its own CPU seconds, errors; steady_*: the same after --warmup-s, and
      per_second: [pages, records] in each second. Cheap on its own core: the cursor is
      read from the head of the body (serde_json writes the keys sorted: "collection",
      "next", "records") and the records counted by their "offset" key; the first page
      of every pass is parsed in full to check both.

  read_ab.py hist --before M0 --after M1 [--name sluice_sysdb_commit_duration_seconds]
      Quantiles of a Prometheus histogram between two /metrics scrapes (the buckets'
      difference), interpolated linearly within buckets like latency.py (Prometheus
      histogram_quantile), and the exact mean (sum / count). One JSON object.

  read_ab.py sqlite-events --log FILE
      From the replica's JSON log (sluice::sysdb at debug): how many records-delta
      merges, value-log compactions and WAL restart checkpoints ran and how long they
      took (ms: sum, max), the writer's own work that a reader could lengthen.

  read_ab.py summary --results FILE
      The medians and spreads (min-max) of the A and B runs of a results file (one JSON
      object per run), and whether each B median lies within A's run-to-run spread.
"""
import argparse
import http.client
import json
import math
import os
import re
import resource
import statistics
import sys
import time
import urllib.parse

HEAD = re.compile(rb'^\{"collection":"(?:[^"\\]|\\.)*","next":(null|"((?:[^"\\]|\\.)*)")')


def quantile(sorted_vals, q):
    """nearest rank (latency.py's)"""
    i = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[i]


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def reader(a):
    u = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)

    def get(path):
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()

    pages = records = nbytes = passes = errors = 0
    times, per_s = [], []  # per_s: [pages, records] per second of the run
    c0, t0 = cpu_s(), time.monotonic()
    stop = False
    while not stop:
        status, body = get("/api/v1/collections")
        if status != 200:
            errors += 1
            time.sleep(0.05)
            stop = os.path.exists(a.stop_file)
            continue
        ids = [c["id"] for c in json.loads(body)["collections"]]
        if not ids:  # nothing materialized yet
            time.sleep(0.01)
        for n, cid in enumerate(ids):
            after = None
            while True:
                path = f"/api/v1/collections/{urllib.parse.quote(cid, safe='')}/records?limit={a.limit}"
                if after is not None:
                    path += "&after=" + urllib.parse.quote(after, safe="")
                s = time.monotonic()
                status, body = get(path)
                times.append(time.monotonic() - s)
                if status != 200:
                    errors += 1
                    break
                pages += 1
                nbytes += len(body)
                sec = int(time.monotonic() - t0)
                while len(per_s) <= sec:
                    per_s.append([0, 0])
                per_s[sec][0] += 1
                m = HEAD.match(body)
                count = body.count(b'"offset":')
                if n == 0 or m is None:
                    v = json.loads(body)
                    nxt = v["next"]
                    if m is not None and (len(v["records"]) != count or (m.group(2) is None) != (nxt is None)):
                        sys.exit(f"reader: the cheap page parse disagrees with the JSON parse on {path}")
                    count = len(v["records"])
                else:
                    nxt = None if m.group(2) is None else json.loads(b'"' + m.group(2) + b'"')
                records += count
                per_s[sec][1] += count
                if a.pause_ms:
                    time.sleep(a.pause_ms / 1000)
                if nxt is None:
                    break
                after = nxt
            if os.path.exists(a.stop_file):
                stop = True
                break
        else:
            passes += 1 if ids else 0
            stop = stop or os.path.exists(a.stop_file)
    secs = time.monotonic() - t0
    times.sort()
    # after the warm-up (whole seconds, the last partial second left out): the pages of
    # the first seconds are small (the collections are filling)
    steady = per_s[a.warmup_s:int(secs)]
    sp, sr = sum(p for p, _ in steady), sum(r for _, r in steady)
    out = {"pages": pages, "records": records, "bytes": nbytes, "seconds": round(secs, 3),
           "pages_per_s": round(pages / secs, 1), "records_per_s": round(records / secs),
           "mb_per_s": round(nbytes / secs / 2**20, 1), "passes": passes, "errors": errors,
           "page_p50_ms": round(quantile(times, 0.5) * 1000, 1) if times else None,
           "page_p99_ms": round(quantile(times, 0.99) * 1000, 1) if times else None,
           "cpu_s": round(cpu_s() - c0, 2), "limit": a.limit, "pause_ms": a.pause_ms,
           "steady_pages_per_s": round(sp / len(steady), 1) if steady else None,
           "steady_records_per_s": round(sr / len(steady)) if steady else None,
           "steady_records_per_page": round(sr / sp) if sp else None, "per_second": per_s}
    json.dump(out, sys.stdout)
    print()
    return 0 if pages and not errors else 1


def buckets(path, name):
    out, s, c = {}, 0.0, 0.0
    for line in open(path):
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[math.inf if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_sum"):
            s = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            c = float(line.rsplit(" ", 1)[1])
    return out, s, c


def hist(a):
    b0, s0, c0 = buckets(a.before, a.name) if a.before else ({}, 0.0, 0.0)
    b1, s1, c1 = buckets(a.after, a.name)
    bs = sorted((le, n - b0.get(le, 0.0)) for le, n in b1.items())
    total = c1 - c0
    out = {"name": a.name, "count": int(total)}
    if not bs or total <= 0:
        json.dump(out, sys.stdout)
        print()
        return 1

    def q(p):  # latency.py's hist_quantiles
        rank = p * total
        lo_b, lo_c = 0.0, 0.0
        for b, c in bs:
            if c >= rank:
                if b == math.inf:
                    return lo_b
                return lo_b + (b - lo_b) * ((rank - lo_c) / (c - lo_c) if c > lo_c else 1.0)
            lo_b, lo_c = b, c
        return bs[-1][0]

    for p in (0.5, 0.9, 0.99):
        out[f"p{round(p * 100)}_ms"] = round(q(p) * 1000, 2)
    out["mean_ms"] = round((s1 - s0) / total * 1000, 2)
    out["bounds_ms"] = [round(b * 1000, 1) for b, _ in bs if b != math.inf]
    json.dump(out, sys.stdout)
    print()
    return 0


def sqlite_events(a):
    kinds = {"records delta merged": ("merges", ["elapsed_ms"]),
             "WAL restart checkpoint": ("wal_restarts", ["writer_wait_ms", "restart_ms"])}
    seen = {name: [] for name, _ in kinds.values()}
    compactions = 0
    for line in open(a.log):
        if '"sluice::sysdb' not in line:
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        f = ev.get("fields", {})
        msg = f.get("message")
        if msg == "value log compacted":
            compactions += 1
        elif msg in kinds:
            name, keys = kinds[msg]
            seen[name].append(sum(int(f.get(k, 0)) for k in keys))
    out = {"compactions": compactions}
    for name, vals in seen.items():
        out[name] = {"n": len(vals), "sum_ms": sum(vals), "max_ms": max(vals, default=0)}
    json.dump(out, sys.stdout)
    print()
    return 0


# (label, key in a run's JSON, format)
FIELDS = [
    ("e2e p50 ms", "e2e_p50_ms", "{:.1f}"),
    ("e2e p99 ms", "e2e_p99_ms", "{:.1f}"),
    ("commit p50 ms", "commit_p50_ms", "{:.2f}"),
    ("commit p99 ms", "commit_p99_ms", "{:.2f}"),
    ("commit mean ms", "commit_mean_ms", "{:.2f}"),
    ("delta merges ms", "merges_ms", "{:.0f}"),
    ("replica CPU s", "cpu_s", "{:.2f}"),
    ("CPU 1 other s", "cpu1_other_s", "{:.2f}"),
    ("reader pages/s", "reader_pages_per_s", "{:.1f}"),
    ("reader records/s", "reader_records_per_s", "{:.0f}"),
    ("reader CPU s", "reader_cpu_s", "{:.2f}"),
]


def summary(a):
    runs = [json.loads(line) for line in open(a.results) if line.strip()]
    side = {v: [r for r in runs if r["variant"] == v] for v in ("A", "B")}
    out = {"rounds": min(len(side["A"]), len(side["B"]))}
    lines = []
    for label, key, fmt in FIELDS:
        row, stats = f"  {label:<17}", {}
        for v in ("A", "B"):
            vals = [r[key] for r in side[v] if r.get(key) is not None]
            if not vals:
                row += f"  {v}: -{'':<27}"
                continue
            med, lo, hi = (round(x, 3) for x in (statistics.median(vals), min(vals), max(vals)))
            stats[v] = (med, lo, hi)
            out[f"{v}_{key}"] = {"median": med, "min": lo, "max": hi}
            cell = f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"
            row += f"  {v}: {cell:<28}"
        if "A" in stats and "B" in stats and key.startswith(("e2e", "commit")):
            med, lo, hi = stats["B"][0], stats["A"][1], stats["A"][2]
            within = lo <= med <= hi
            out[f"B_{key}_within_A_spread"] = within
            row += "  B median within A's spread" if within else (
                "  B median ABOVE A's spread" if med > hi else "  B median BELOW A's spread")
        lines.append(row)
    print("medians [min-max] over the runs of each side:")
    print("\n".join(lines))
    print("JSON: " + json.dumps(out))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reader")
    r.add_argument("--url", required=True)
    r.add_argument("--stop-file", required=True)
    r.add_argument("--limit", type=int, default=1000)
    r.add_argument("--warmup-s", type=int, default=0, help="left out of the steady_* figures")
    r.add_argument("--pause-ms", type=float, default=0, help="sleep after each page (0: a tight loop)")
    h = sub.add_parser("hist")
    h.add_argument("--before")
    h.add_argument("--after", required=True)
    h.add_argument("--name", default="sluice_sysdb_commit_duration_seconds")
    e = sub.add_parser("sqlite-events")
    e.add_argument("--log", required=True)
    s = sub.add_parser("summary")
    s.add_argument("--results", required=True)
    a = ap.parse_args()
    return {"reader": reader, "hist": hist, "sqlite-events": sqlite_events, "summary": summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
