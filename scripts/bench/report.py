#!/usr/bin/env python3
"""Report of scripts/bench-suite.sh: reads the measurements (one JSON object per line),
prints a table per workload, the latency and recovery results, every goal of issue #7
(met / missed, by how much) and the per-phase wall times; writes everything as one JSON
document.

usage: report.py --meta META.json --results RESULTS.jsonl --phases PHASES.tsv --out OUT.json
"""
import argparse
import json
import sys

MB = 2 ** 20
ORDER = ["consumer-perf-test", "kcat", "sluice-sqlite", "sluice-postgres", "peer"]
LABEL = {"consumer-perf-test": "kafka consumer-perf-test", "kcat": "kcat -C -e > /dev/null",
         "sluice-sqlite": "sluice process (SQLite)", "sluice-postgres": "sluice process (PostgreSQL)",
         "peer": "Kafka Streams peer (EOS v2, RocksDB)"}
DESCR = {
    "W1": "384-dim embeddings, 64 collections, 70/20/10 upsert/update/delete",
    "W2": "1536-dim embeddings, 64 collections (scaled: fewer records, about half of W1's bytes)",
    "W3": "small records: no embedding, 3 metadata keys, short document",
    "W4": "W1-shaped records over 10,000 collections per partition (1 id each)",
    "W5": "W1-shaped records into 8 collections pre-seeded (SQL) with many small rows each (scaled)",
}


def table(rows, hdr):
    w = [max(len(str(r[i])) for r in [hdr] + rows) for i in range(len(hdr))]
    out = ["  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(hdr)),
           "  ".join("-" * x for x in w)]
    for r in rows:
        out.append("  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meta", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--phases", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    meta = json.load(open(a.meta))
    res = [json.loads(l) for l in open(a.results) if l.strip()]
    workloads = {r["workload"]: r for r in res if r["kind"] == "workload"}
    drains = [r for r in res if r["kind"] == "drain"]
    checks = {r["workload"]: r for r in res if r["kind"] == "checksums"}
    lat = {r["contender"]: r for r in res if r["kind"] == "latency"}
    rec = {r["variant"]: r for r in res if r["kind"] == "recovery"}
    phases = []
    for line in open(a.phases):
        name, s = line.rstrip("\n").split("\t")
        phases.append({"phase": name, "seconds": float(s)})

    by = {}
    for d in drains:
        wl = workloads.get(d["workload"], {})
        n, s = d["records"], d["seconds"]
        d["records_per_s"] = round(n / s, 1)
        d["mb_per_s"] = round(wl.get("bytes", 0) / MB / s, 2)
        d["cpu_s_per_1m_records"] = round(d["cpu_s"] * 1e6 / n, 2)
        d["peak_rss_mb"] = round(d["rss_kb"] / 1024, 1)
        if d.get("assign_s") is not None and s > d["assign_s"]:
            d["steady_records_per_s"] = round(n / (s - d["assign_s"]), 1)
            d["steady_mb_per_s"] = round(wl.get("bytes", 0) / MB / (s - d["assign_s"]), 2)
        by[(d["workload"], d["contender"])] = d
    for (w, c), d in by.items():
        cpt = by.get((w, "consumer-perf-test"))
        if cpt:
            d["ratio_vs_cpt"] = round(d["records_per_s"] / cpt["records_per_s"], 3)

    q = meta.get("quick")
    print()
    print(f'Sluice benchmark suite{" (--quick: 1/10 sizes, numbers are a smoke test only)" if q else ""}')
    print(f'commit {meta["commit"]}{" (dirty worktree)" if meta["worktree_dirty"] else ""}, {meta["date"]}, '
          f'{meta["machine"]["nproc"]} x {meta["machine"]["cpu_model"]}, {meta["machine"]["mem_total_kb"] // 1048576} GiB')
    print(f'pinning: {meta["pinning"]}')
    print(f'Kafka {meta["kafka"]}; PostgreSQL {meta["postgres"]}; peer: {meta["java"]}, {meta["peer_jvm_opts"]}')
    for w in sorted(workloads):
        wl = workloads[w]
        print()
        seeded = (f', sysdb pre-seeded with {wl["seeded_records_per_collection"]:,} records per collection '
                  f'({wl["seeded_records_per_collection"] * wl["collections"]:,} rows)') if wl["seeded_records_per_collection"] else ""
        print(f'{w}: {wl["records"]:,} records, {DESCR[w]}; dim {wl["dim"]}, {wl["collections"]:,} collections, '
              f'{wl["ids_per_collection"]:,} ids per collection{seeded}; {wl["bytes"] / MB:.1f} MB key+value '
              f'({wl["bytes"] / wl["records"]:.0f} B/record); produced in {wl["produce_s"]:.1f} s')
        rows = []
        for c in ORDER:
            d = by.get((w, c))
            if not d:
                continue
            cpu = f'{d["cpu_s_per_1m_records"]:.1f}'
            if "postgres_server_cpu_s" in d:
                cpu += f' (+{d["postgres_server_cpu_s"] * 1e6 / d["records"]:.1f} pg)'
            rows.append([LABEL[c], f'{d["seconds"]:.2f}', f'{d["records_per_s"]:,.0f}', f'{d["mb_per_s"]:.1f}', cpu,
                         f'{d["peak_rss_mb"]:.0f}', f'{d["ratio_vs_cpt"]:.3f}' if "ratio_vs_cpt" in d else "",
                         f'{d["steady_records_per_s"]:,.0f}' if "steady_records_per_s" in d else "",
                         f'{d["broker_cpu_s"]:.1f}'])
        print(table(rows, ["contender", "seconds", "records/s", "MB/s", "CPU-s/1M", "peak RSS MB", "vs cpt",
                           "steady rec/s", "broker CPU-s"]))
        s, p = by.get((w, "sluice-sqlite")), by.get((w, "peer"))
        if s and p:
            print(f'  sluice SQLite / peer: records/s {s["records_per_s"] / p["records_per_s"]:.2f}x, '
                  f'CPU-s/1M {s["cpu_s_per_1m_records"] / p["cpu_s_per_1m_records"]:.2f}x, '
                  f'peak RSS {s["peak_rss_mb"] / p["peak_rss_mb"]:.2f}x')
        ck = checks.get(w)
        if ck:
            print(f'  checksums: {"MATCH" if ck["match"] else "DIFFER"}: ' + "; ".join(ck["values"]))
    if lat:
        print()
        print("Latency, produce -> materialized, at 50% of each contender's W1 steady records/s (paced producer on CPU 0)")
        rows = []
        for c in ["sluice-sqlite", "peer"]:
            l = lat.get(c)
            if l:
                ld = l.get("load") or {}
                rows.append([LABEL[c], f'{l["rate"]:,.0f}', f'{l.get("n", 0):,}', f'{l.get("p50_ms", "?")}',
                             f'{l.get("p90_ms", "?")}', f'{l.get("p99_ms", "?")}', f'{l.get("max_ms", "?")}',
                             f'{ld.get("contender_cpu", 0) * 100:.0f}%', f'{ld.get("cpu0", 0) * 100:.0f}%'])
        print(table(rows, ["contender", "records/s", "samples", "p50 ms", "p90 ms", "p99 ms", "max ms",
                           "contender CPU", "CPU 0 (broker+producer)"]))
        s_ = lat.get("sluice-sqlite") or {}
        if s_.get("records_per_batch"):
            print(f'  sluice committed {s_["batches"]:,} batches, {s_["records_per_batch"]} records per batch on average')
        h = (lat.get("sluice-sqlite") or {}).get("histogram")
        if h:
            print(f'  sluice_end_to_end_latency_seconds histogram (interpolated within buckets {h["bounds_s"][:6]}...): '
                  f'p50 {h["p50_ms"]} ms, p99 {h["p99_ms"]} ms over {h["count"]:,} records')
        print("  sluice: per record, the commit log line of its batch - CreateTime; peer: read_committed consumer of its"
              " changelog, receive time - record timestamp")
    rebuild = {}
    for c in ["sluice-sqlite", "sluice-postgres"]:
        d = by.get(("W1", c))
        if d:
            rebuild[c] = round(d["seconds"] * 1e6 / d["records"], 1)
    if rec or rebuild:
        print()
        print("Recovery (sluice, SQLite)")
        for v, r in rec.items():
            print(f'  kill -9 under {r["rate"]:,.0f} records/s, restart ({v}{": " + r["config"].strip().replace(chr(10), " ") if r["config"] else " configuration"}):'
                  f' partitions assigned after {r["restart_to_assignment_s"]} s, first committed batch after {r["restart_to_first_batch_s"]} s')
        for c, s in rebuild.items():
            print(f'  rebuild from offset 0 ({LABEL[c]}): {s} s per 1M W1 records (the W1 drain, scaled to 1M)')

    goals = []

    def goal(name, value, op, target, unit="x", note=""):
        if value is None:
            goals.append({"goal": name, "status": "not measured", "note": note})
            return
        met = value >= target if op == ">=" else value <= target
        goals.append({"goal": name, "value": round(value, 3), "op": op, "target": target, "unit": unit, "met": met,
                      "margin": round(value / target, 3) if target else None, "note": note})

    def ratio(w1, c1, w2, c2, key="records_per_s"):
        x, y = by.get((w1, c1)), by.get((w2, c2))
        return x[key] / y[key] if x and y else None

    goal("W1 sluice SQLite records/s vs consumer-perf-test", ratio("W1", "sluice-sqlite", "W1", "consumer-perf-test"), ">=", 0.5)
    goal("W1 sluice PostgreSQL records/s vs consumer-perf-test", ratio("W1", "sluice-postgres", "W1", "consumer-perf-test"), ">=", 0.25)
    for w in ["W1", "W2", "W3"]:
        if (w, "peer") in by:
            st = ratio(w, "sluice-sqlite", w, "peer", "steady_records_per_s")
            goal(f"{w} sluice SQLite records/s vs the peer", ratio(w, "sluice-sqlite", w, "peer"), ">=", 2.0,
                 note=f"steady (first record -> caught up) ratio {st:.3f}" if st else "")
            goal(f"{w} sluice SQLite CPU-s/1M vs the peer", ratio(w, "sluice-sqlite", w, "peer", "cpu_s_per_1m_records"), "<=", 0.5)
            goal(f"{w} sluice SQLite peak RSS vs the peer", ratio(w, "sluice-sqlite", w, "peer", "peak_rss_mb"), "<=", 0.25)
    for w in ["W4", "W5"]:
        for c, name in [("sluice-sqlite", "SQLite"), ("sluice-postgres", "PostgreSQL")]:
            if (w, c) in by:
                # steady rates: W4/W5 are shorter than W1, start-up must not count
                goal(f"{w} sluice {name} steady records/s vs its W1", ratio(w, c, "W1", c, "steady_records_per_s"), ">=", 0.9,
                     note=(f'per MB (steady MB/s ratio): {ratio(w, c, "W1", c, "steady_mb_per_s"):.3f}' if ("W1", c) in by else ""))
    if "sluice-sqlite" in lat:
        l = lat["sluice-sqlite"]
        p99, p50, src = l.get("p99_ms"), l.get("p50_ms"), "per record"
        if not l.get("n") and l.get("histogram"):
            p99, p50, src = l["histogram"]["p99_ms"], l["histogram"]["p50_ms"], "histogram, interpolated"
        goal("sluice SQLite p99 latency at 50% load", p99, "<=", 50, "ms",
             note=f'{src}; p50 {p50} ms; peer p99 {lat.get("peer", {}).get("p99_ms", "?")} ms, p50 {lat.get("peer", {}).get("p50_ms", "?")} ms')
    for v, r in rec.items():
        goal(f"first committed batch after kill -9 restart ({v})", r["restart_to_first_batch_s"], "<=", 3, "s")
    all_match = all(c["match"] for c in checks.values()) if checks else None
    goals.append({"goal": "checksums of every contender match on every workload", "met": all_match,
                  "value": None if all_match is None else all_match,
                  "note": "; ".join(f'{w}: {"match" if c["match"] else "DIFFER"} ({len(c["values"])} contenders)' for w, c in sorted(checks.items()))})

    print()
    print("Goals (issue #7)")
    rows = []
    for g in goals:
        if g.get("status") == "not measured":
            rows.append([g["goal"], "", "", "not measured", g["note"]])
            continue
        if g.get("op"):
            v = f'{g["value"]:.3f}{g["unit"]}' if g["unit"] == "x" else f'{g["value"]}{" " + g["unit"]}'
            t = f'{g["op"]} {g["target"]}{g["unit"] if g["unit"] == "x" else " " + g["unit"]}'
            if g["met"]:
                how = "MET"
            elif g["op"] == ">=":
                how = f'MISSED: {g["margin"] * 100:.1f}% of the goal'
            else:
                how = f'MISSED: {g["margin"]:.2f}x the limit'
        else:
            v, t, how = str(g["value"]), "true", "MET" if g["met"] else "FAILED"
        rows.append([g["goal"], v, t, how, g.get("note", "")])
    print(table(rows, ["goal", "value", "target", "result", "note"]))

    print()
    print("Phases (wall seconds)")
    total = sum(p["seconds"] for p in phases)
    print(table([[p["phase"], f'{p["seconds"]:.1f}'] for p in phases] + [["total (phases)", f"{total:.1f}"]], ["phase", "s"]))
    b = meta["build_s"]
    print(f'  builds: cargo release {b["cargo_release"]:.1f} s, mvn package {b["mvn_package"]:.1f} s (in parallel)')

    doc = dict(meta)
    doc.update({"workloads": workloads, "rows": drains, "checksums": checks, "latency": lat, "recovery": rec,
                "rebuild_s_per_1m": rebuild, "goals": goals, "phases": phases, "phases_total_s": round(total, 1)})
    json.dump(doc, open(a.out, "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
