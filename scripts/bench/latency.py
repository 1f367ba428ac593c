#!/usr/bin/env python3
"""Produce-to-materialized latency of `sluice process` from its own JSON log.

Every batch commit logs (at debug, target sluice::processor) a line "batch committed"
inside the span `batch{topic, partition, from, to}`, right after the sysdb transaction
committed. A record at (partition, offset) is materialized by the batch whose
[from, to) holds its offset, so its latency is that line's timestamp minus the record's
CreateTime (kcat -f '%p %o %T'). Exact per record, no bucketing.

The `sluice_end_to_end_latency_seconds` histogram (same definition, measured in the
process) is read from a /metrics scrape and its quantiles interpolated linearly within
buckets (Prometheus histogram_quantile), as a cross-check.

With --warmup-ms W, the records whose CreateTime falls in the first W ms of the paced
run (from the earliest CreateTime) are left out of the figures, which then describe the
steady state; `whole_run` gives the figures over every record beside them. The paced
producer is a JVM that starts sending at full rate on the broker's core: in its first
second it falls behind its own schedule, records that already have their CreateTime wait
in its buffer, and that wait would be counted as the contender's.

usage: latency.py --log FILE --timestamps FILE --topic T [--metrics FILE] [--warmup-ms W]
prints one JSON object.
"""
import argparse
import bisect
import json
import math
import sys
from datetime import datetime


def epoch_ms(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000.0


def quantile(sorted_vals, q):
    """nearest rank"""
    i = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[i]


def hist_quantiles(path, name="sluice_end_to_end_latency_seconds"):
    buckets = []
    for line in open(path):
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    out = {"count": int(total), "bounds_s": [b for b, _ in buckets if b != math.inf]}

    def q(p):
        rank = p * total
        lo_b, lo_c = 0.0, 0.0
        for b, c in buckets:
            if c >= rank:
                if b == math.inf:
                    return lo_b
                return lo_b + (b - lo_b) * ((rank - lo_c) / (c - lo_c) if c > lo_c else 1.0)
            lo_b, lo_c = b, c
        return buckets[-1][0]

    for p in (0.5, 0.9, 0.99):
        out[f"p{round(p * 100)}_ms"] = round(q(p) * 1000, 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--timestamps", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--metrics")
    ap.add_argument("--warmup-ms", type=float, default=0.0)
    a = ap.parse_args()
    batches = {}  # partition -> sorted [(from, to, commit_ms)]
    for line in open(a.log):
        if '"batch committed"' not in line:
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        span = ev.get("span") or {}
        if ev.get("fields", {}).get("message") != "batch committed" or span.get("topic") != a.topic:
            continue
        batches.setdefault(int(span["partition"]), []).append((int(span["from"]), int(span["to"]), epoch_ms(ev["timestamp"])))
    starts = {}
    for p, bs in batches.items():
        bs.sort()
        starts[p] = [b[0] for b in bs]
    lat, unmatched = [], 0  # lat: (CreateTime, latency)
    for line in open(a.timestamps):
        parts = line.split()
        if len(parts) != 3:
            continue
        p, o, ts = int(parts[0]), int(parts[1]), int(parts[2])
        bs = batches.get(p)
        i = bisect.bisect_right(starts.get(p, []), o) - 1
        if bs is None or i < 0 or not (bs[i][0] <= o < bs[i][1]):
            unmatched += 1
            continue
        lat.append((ts, bs[i][2] - ts))
    nb = sum(len(b) for b in batches.values())
    matched = len(lat)
    out = {"method": "per record: 'batch committed' log time of its batch - CreateTime", "unmatched": unmatched,
           "batches": nb, "records_per_batch": round((matched + unmatched) / nb, 1) if nb else None,
           "warmup_ms": a.warmup_ms}
    if lat:
        first = min(ts for ts, _ in lat)
        whole = sorted(v for _, v in lat)
        steady = sorted(v for ts, v in lat if ts >= first + a.warmup_ms)
        out.update(figures(steady))
        out["whole_run"] = figures(whole)
    else:
        out["n"] = 0
    if a.metrics:
        try:
            out["histogram"] = hist_quantiles(a.metrics)
        except OSError:
            out["histogram"] = None
    json.dump(out, sys.stdout)
    print()
    return 0 if out["n"] and unmatched == 0 else 1


def figures(lat):
    """n and percentiles (ms) of sorted latencies"""
    if not lat:
        return {"n": 0}
    return {"n": len(lat), "p50_ms": round(quantile(lat, 0.5), 1), "p90_ms": round(quantile(lat, 0.9), 1),
            "p99_ms": round(quantile(lat, 0.99), 1), "p999_ms": round(quantile(lat, 0.999), 1),
            "max_ms": round(lat[-1], 1), "mean_ms": round(sum(lat) / len(lat), 1)}


if __name__ == "__main__":
    sys.exit(main())
