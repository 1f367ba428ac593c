#!/usr/bin/env python3
"""Tests of report.py and chart.py: a small synthetic results file (the shapes
bench-suite.sh writes) through both, checking the goal verdicts and the SVG.

Run: python3 -m unittest discover -s scripts/bench -p 'test_*.py'   (or python3 scripts/bench/test_report.py)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
SVG = "{http://www.w3.org/2000/svg}"

META = {
    "commit": "abc1234", "worktree_dirty": False, "date": "2026-12-01T18:00:00Z", "command": "scripts/bench-suite.sh",
    "quick": False, "machine": {"nproc": 2, "cpu_model": "Test CPU @ 2.0GHz", "mem_total_kb": 8 * 1048576, "kernel": "6.1"},
    "pinning": "test", "kafka": "127.0.0.1:9092 (1 broker)", "postgres": "16.4", "java": "openjdk 21",
    "peer_jvm_opts": "JVM defaults", "build_s": {"cargo_release": 100.0, "mvn_package": 30.0, "note": "in parallel"},
    "wall_s_before_report": 900.0,
}


def workload(w, n, dim, collections=64):
    return {"kind": "workload", "workload": w, "records": n, "bytes": n * 2000, "key_bytes": n * 20, "dim": dim,
            "collections": collections, "ids_per_collection": 1000, "seeded_records_per_collection": 0,
            "collection_prefix": "c", "topic": "t", "produce_s": 10.0, "quick": False}


def drain(w, c, n, seconds, cpu_s, rss_mb, assign_s=None):
    d = {"kind": "drain", "workload": w, "contender": c, "records": n, "seconds": seconds, "cpu_s": cpu_s,
         "rss_kb": int(rss_mb * 1024), "broker_cpu_s": 1.0}
    if assign_s is not None:
        d["assign_s"] = assign_s
    if c == "sluice-postgres":
        d["postgres_server_cpu_s"] = 2.0
    return d


def results():
    """Rates (records/s), chosen so that each goal is clearly met or clearly missed:
    W1: cpt 200k, sqlite 120k (0.6x: met), postgres 40k (0.2x: missed), peer 30k
        (sqlite/peer 4x: met; CPU 0.2x: met; RSS 0.5x: missed);
    W2: sqlite 50k, peer 25k (2x: missed); W3 has no peer (no peer goals);
    W4: sqlite steady 130k vs W1 steady 125k (met); postgres steady 30k vs 50k (missed);
    latency: sqlite p99 40 ms (met), p50 12 ms (missed); postgres p99 80 (missed), p50 5 (met);
    backfill (sqlite): 350k records/s (met), live drop 20% (missed)."""
    n = 1_000_000
    r = [workload("W1", n, 384), workload("W2", 250_000, 1536), workload("W3", 500_000, 0),
         workload("W4", 500_000, 384, 80_000)]
    r += [drain("W1", "consumer-perf-test", n, 5.0, 4.0, 400),
          drain("W1", "kcat", n, 4.0, 3.0, 20),
          drain("W1", "sluice-sqlite", n, n / 120_000, 6.0, 100, assign_s=n / 120_000 - n / 125_000),
          drain("W1", "sluice-postgres", n, n / 40_000, 10.0, 120, assign_s=n / 40_000 - n / 50_000),
          drain("W1", "peer", n, n / 30_000, 30.0, 200, assign_s=2.0),
          drain("W2", "sluice-sqlite", 250_000, 5.0, 3.0, 150, assign_s=0.5),
          drain("W2", "peer", 250_000, 10.0, 10.0, 250, assign_s=2.0),
          drain("W3", "sluice-sqlite", 500_000, 2.0, 1.5, 60, assign_s=0.2),
          drain("W4", "sluice-sqlite", 500_000, 500_000 / 130_000 + 1.0, 4.0, 90, assign_s=1.0),
          drain("W4", "sluice-postgres", 500_000, 500_000 / 30_000 + 1.0, 9.0, 95, assign_s=1.0)]
    r += [{"kind": "checksums", "workload": w, "match": True, "method": "m", "values": ["a=1", "b=1"]}
          for w in ["W1", "W2", "W3", "W4"]]
    r += [{"kind": "latency", "contender": "sluice-sqlite", "rate": 60000, "records": 1000, "seconds": 20, "cpu_s": 1.0,
           "load": {"contender_cpu": 0.5, "cpu0": 0.6}, "n": 1000, "p50_ms": 12.0, "p90_ms": 25.0, "p99_ms": 40.0,
           "max_ms": 60.0, "histogram": None, "warmup_s": 3,
           "whole_run": {"n": 1150, "p50_ms": 13.0, "p99_ms": 700.0}},
          {"kind": "latency_log_append", "contender": "sluice-sqlite", "rate": 60000, "records": 1000, "seconds": 20,
           "cpu_s": 1.0, "load": {"contender_cpu": 0.5, "cpu0": 0.6}, "n": 1000, "p50_ms": 3.0, "p90_ms": 9.0,
           "p99_ms": 31.0, "max_ms": 44.0, "histogram": None, "warmup_s": 3},
          {"kind": "latency", "contender": "sluice-postgres", "rate": 20000, "records": 1000, "seconds": 20, "cpu_s": 1.0,
           "load": {"contender_cpu": 0.5, "cpu0": 0.6}, "n": 1000, "p50_ms": 5.0, "p90_ms": 30.0, "p99_ms": 80.0,
           "max_ms": 90.0, "histogram": None},
          {"kind": "latency", "contender": "peer", "rate": 15000, "records": 1000, "seconds": 20,
           "load": {"contender_cpu": 0.5, "cpu0": 0.6}, "n": 1000, "p50_ms": 100, "p90_ms": 150, "p99_ms": 300,
           "max_ms": 400}]
    r += [{"kind": "recovery", "variant": "static", "restart_to_first_batch_s": 1.5, "restart_to_assignment_s": 1.0,
           "method": "log", "rate": 60000, "config": ""}]
    r += [{"kind": "backfill", "backend": "sqlite", "function": "record_counter", "records_per_s": 350_000},
          {"kind": "live", "backend": "sqlite", "with_backfill": False, "records": 100_000, "seconds": 1.0,
           "records_per_s": 100_000},
          {"kind": "live", "backend": "sqlite", "with_backfill": True, "records": 100_000, "seconds": 1.25,
           "records_per_s": 80_000}]
    return r


def run_report(tmp, res):
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(META, f)
    with open(os.path.join(tmp, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(x) + "\n" for x in res))
    with open(os.path.join(tmp, "phases.tsv"), "w") as f:
        f.write("setup\t10.0\nW1\t100.5\n")
    out = os.path.join(tmp, "suite.json")
    p = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--meta", os.path.join(tmp, "meta.json"),
                        "--results", os.path.join(tmp, "results.jsonl"), "--phases", os.path.join(tmp, "phases.tsv"),
                        "--out", out], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"report.py failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    with open(out) as f:
        return json.load(f), p.stdout, out


def run_chart(tmp, doc_path):
    svg = os.path.join(tmp, "suite.svg")
    p = subprocess.run([sys.executable, os.path.join(HERE, "chart.py"), doc_path, svg], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"chart.py failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return ET.parse(svg).getroot()


def texts(root):
    return ["".join(t.itertext()) for t in root.iter(SVG + "text")]


sys.path.insert(0, HERE)
from report import LABEL, PAGE_BEGIN, PAGE_END, PageError, render_page_block, write_page  # noqa: E402


class ReportGoals(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.doc, self.stdout, self.path = run_report(self.tmp.name, results())
        self.goals = {g["id"]: g for g in self.doc["goals"]}

    def tearDown(self):
        self.tmp.cleanup()

    def verdicts(self):
        return {i: g["met"] for i, g in self.goals.items()}

    def test_every_goal_verdict(self):
        self.assertEqual(self.verdicts(), {
            "w1-sluice-sqlite-vs-cpt": True,
            "w1-sluice-postgres-vs-cpt": False,
            "latency-sluice-sqlite-p99": True,
            "latency-sluice-sqlite-p50": False,
            "latency-sluice-postgres-p99": False,
            "latency-sluice-postgres-p50": True,
            "w1-sluice-sqlite-vs-peer-records_per_s": True,
            "w1-sluice-sqlite-vs-peer-cpu_s_per_1m_records": True,
            "w1-sluice-sqlite-vs-peer-peak_rss_mb": False,
            "w2-sluice-sqlite-vs-peer-records_per_s": False,
            "w2-sluice-sqlite-vs-peer-cpu_s_per_1m_records": True,
            "w2-sluice-sqlite-vs-peer-peak_rss_mb": False,
            "w4-sluice-sqlite-steady-vs-w1": True,
            "w4-sluice-postgres-steady-vs-w1": False,
            "backfill-sqlite-record_counter-records-per-s": True,
            "backfill-sqlite-record_counter-live-drop": False,
        })

    def test_values_and_margins(self):
        g = self.goals
        self.assertAlmostEqual(g["w1-sluice-sqlite-vs-cpt"]["value"], 0.6)
        self.assertEqual((g["w1-sluice-sqlite-vs-cpt"]["op"], g["w1-sluice-sqlite-vs-cpt"]["target"]), (">=", 0.5))
        self.assertEqual(g["w1-sluice-sqlite-vs-cpt"]["result"], "met: 20.0% above the minimum")
        self.assertEqual(g["w1-sluice-postgres-vs-cpt"]["result"], "MISSED: 20.0% below the minimum")
        self.assertAlmostEqual(g["w1-sluice-sqlite-vs-peer-records_per_s"]["value"], 4.0)
        self.assertEqual(g["w1-sluice-sqlite-vs-peer-records_per_s"]["target"], 3.0)
        self.assertIn("steady ratio 3.917", g["w1-sluice-sqlite-vs-peer-records_per_s"]["note"])
        self.assertEqual(g["w1-sluice-sqlite-vs-peer-cpu_s_per_1m_records"]["target"], 0.33)
        self.assertEqual(g["w1-sluice-sqlite-vs-peer-peak_rss_mb"]["result"], "MISSED: 2.0x the limit")
        self.assertEqual(g["latency-sluice-postgres-p99"]["result"], "MISSED: 60.0% over the limit")
        self.assertEqual(g["latency-sluice-postgres-p50"]["result"], "met: 50.0% under the limit")
        self.assertEqual(g["latency-sluice-sqlite-p99"]["value"], 40.0)
        self.assertEqual(g["latency-sluice-sqlite-p50"]["result"], "MISSED: 20.0% over the limit")
        self.assertAlmostEqual(g["w4-sluice-sqlite-steady-vs-w1"]["value"], 1.04)
        self.assertAlmostEqual(g["backfill-sqlite-record_counter-live-drop"]["value"], 20.0)
        self.assertEqual(g["backfill-sqlite-record_counter-records-per-s"]["target"], 300_000)
        # the goal lines, in the baseline's units: 0.5x cpt's 200k, 3x the peer's 30k, 0.9x W1's steady 50k
        self.assertEqual(g["w1-sluice-sqlite-vs-cpt"]["line"]["value"], 100_000)
        self.assertEqual(g["w1-sluice-sqlite-vs-peer-records_per_s"]["line"]["value"], 90_000)
        self.assertEqual(g["w4-sluice-postgres-steady-vs-w1"]["line"]["value"], 45_000)
        self.assertEqual(g["w1-sluice-sqlite-vs-peer-cpu_s_per_1m_records"]["line"]["panel"], "cpu_s_per_1m_records")

    def test_printed_goals(self):
        goals = self.stdout[self.stdout.index("\nGoals\n"):]
        self.assertNotIn("#7", self.stdout)
        for g in self.doc["goals"]:
            line = next((l for l in goals.splitlines() if l.startswith(g["goal"])), None)
            self.assertIsNotNone(line, g["goal"])
            self.assertIn(g["result"], line)
        self.assertIn("8 met, 8 missed, 0 not measured", goals)
        self.assertIn("checksums of every contender match on every workload: OK", goals)

    def test_latency_warmup_and_log_append_lines(self):
        self.assertIn("first 3 s (the paced producer's warm-up) left out; over all 1,150: p50 13.0 ms, p99 700.0 ms",
                      self.stdout)
        self.assertIn("from the broker's append (a second run, topic with LogAppendTime, 60,000 records/s): p50 3.0 ms,"
                      " p90 9.0 ms, p99 31.0 ms, max 44.0 ms", self.stdout)
        self.assertEqual(self.doc["latency_log_append"]["p99_ms"], 31.0)
        # the goals stay on the CreateTime figures
        p99 = next(g for g in self.doc["goals"] if g["goal"].startswith("sluice SQLite p99"))
        self.assertEqual(p99["value"], 40.0)

    def test_chart(self):
        root = run_chart(self.tmp.name, self.path)
        self.assertEqual(root.tag, SVG + "svg")
        t = texts(root)
        for c in {r["contender"] for r in results() if r["kind"] in ("drain", "latency")}:
            self.assertIn(LABEL[c], t, f"the legend does not name {c}")
        title = t[0] + " " + t[1]
        for want in ["2026-12-01T18:00:00Z", "abc1234", "Test CPU @ 2.0GHz"]:
            self.assertIn(want, title)
        # a bar per drain row and panel (records/s, CPU-s/1M, peak RSS), a bar per latency percentile
        bars = [r.find(SVG + "title").text for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
        drains = [r for r in results() if r["kind"] == "drain"]
        self.assertEqual(len(bars), 3 * len(drains) + 3 * 3)
        for c in ["sluice-sqlite", "sluice-postgres", "peer", "consumer-perf-test", "kcat"]:
            self.assertTrue(any(f"({c}):" in b for b in bars), c)
        # values printed on the bars
        for v in ["120k", "40k", "30k", "6.0", "400", "12", "300"]:
            self.assertIn(v, t)
        # goal lines: the ratio goals and the latency limits, each marked met or missed
        for want in ["0.5x cpt met", "0.25x cpt MISSED", "3.0x peer met", "0.33x peer met", "0.25x peer MISSED",
                     "0.9x W1 steady met", "0.9x W1 steady MISSED", "p99 <= 50 ms met", "p50 <= 10 ms MISSED"]:
            self.assertIn(want, t)
        dashed = [ln for ln in root.iter(SVG + "line") if ln.get("stroke-dasharray")]
        self.assertEqual(len(dashed), 2 + sum(1 for g in self.doc["goals"] if "line" in g))


class ReportPartial(unittest.TestCase):
    """A run with no PostgreSQL, latency, peer or backfill results."""

    def test_not_measured_and_absent(self):
        res = [r for r in results() if r.get("contender") not in ("sluice-postgres", "peer")
               and r["kind"] not in ("latency", "backfill", "live")]
        with tempfile.TemporaryDirectory() as tmp:
            doc, stdout, path = run_report(tmp, res)
            goals = {g["id"]: g for g in doc["goals"]}
            self.assertEqual(goals["w1-sluice-postgres-vs-cpt"]["result"], "not measured")
            self.assertIsNone(goals["w1-sluice-postgres-vs-cpt"]["met"])
            self.assertEqual(goals["latency-sluice-sqlite-p99"]["result"], "not measured")
            self.assertNotIn("latency-sluice-postgres-p99", goals)
            self.assertFalse([i for i in goals if "peer" in i or "backfill" in i])
            self.assertTrue(goals["w4-sluice-sqlite-steady-vs-w1"]["met"])
            root = run_chart(tmp, path)
            t = texts(root)
            self.assertIn(LABEL["sluice-sqlite"], t)
            self.assertNotIn(LABEL["peer"], t)

    def test_backfill_drop_of_the_row(self):
        res = [r for r in results() if r["kind"] != "live"]
        for r in res:
            if r["kind"] == "backfill":
                r.update({"records_per_s": 250_000, "live_drop_pct": 4.0})
        with tempfile.TemporaryDirectory() as tmp:
            doc, _, _ = run_report(tmp, res)
            goals = {g["id"]: g for g in doc["goals"]}
            self.assertFalse(goals["backfill-sqlite-record_counter-records-per-s"]["met"])
            self.assertTrue(goals["backfill-sqlite-record_counter-live-drop"]["met"])
            self.assertEqual(goals["backfill-sqlite-record_counter-live-drop"]["value"], 4.0)

    def test_reads_cost_against_the_spread_of_the_same_run(self):
        row = {"kind": "reads", "records": 300000, "waiters": 100, "pinned": True,
               "drain_alone": [20000, 21000, 19000], "drain_with_waiters": [19500, 20500, 19800],
               "median_alone": 20000, "median_with_waiters": 19800, "waiter_cost_pct": 1.0, "spread_alone_pct": 10.0,
               "produce_to_read": {"samples": 400, "p50_ms": 3.2, "p90_ms": 20.0, "p99_ms": 80.5, "max_ms": 120.0,
                                   "paced_rate": 10000}}
        with tempfile.TemporaryDirectory() as tmp:
            doc, out, _ = run_report(tmp, results() + [row])
            goals = {g["id"]: g for g in doc["goals"]}
            self.assertTrue(goals["reads-waiters-cost"]["met"])
            self.assertEqual(goals["reads-waiters-cost"]["target"], 10.0)
            self.assertIn("p99 80.5 ms", goals["reads-waiters-cost"]["note"])
            self.assertIn("p50 3.2 ms, p90 20.0 ms, p99 80.5 ms", out)
            self.assertEqual(doc["reads"], [row])
        worse = dict(row, waiter_cost_pct=12.0)
        with tempfile.TemporaryDirectory() as tmp:
            doc, _, _ = run_report(tmp, results() + [worse])
            self.assertFalse({g["id"]: g for g in doc["goals"]}["reads-waiters-cost"]["met"])

    def test_changefeed_goal_per_backend(self):
        rows = [{"kind": "changefeed", "records": 300000, "rounds": 3, "backend": "sqlite",
                 "a_records_per_s": [80000, 82000, 79000], "b_records_per_s": [70000, 66000, 68000],
                 "a_median": 80000, "b_median": 68000, "ratio": 0.85},
                {"kind": "changefeed", "records": 300000, "rounds": 3, "backend": "postgres",
                 "a_records_per_s": [50000, 52000, 51000], "b_records_per_s": [20000, 21000, 19000],
                 "a_median": 51000, "b_median": 20000, "ratio": 0.392}]
        with tempfile.TemporaryDirectory() as tmp:
            doc, out, _ = run_report(tmp, results() + rows)
            goals = {g["id"]: g for g in doc["goals"]}
            self.assertTrue(goals["changefeed-sqlite-vs-off"]["met"])
            self.assertFalse(goals["changefeed-postgres-vs-off"]["met"])
            self.assertEqual(goals["changefeed-postgres-vs-off"]["target"], 0.8)
            self.assertIn("feed on 20,000 vs off 51,000 records/s", goals["changefeed-postgres-vs-off"]["note"])
            self.assertIn("on 70,000, 66,000, 68,000 (on/off 0.85x)", out)
            self.assertEqual(doc["changefeed"], rows)

    def test_wasm_goal_is_the_functions_own_cost(self):
        row = {"kind": "wasm", "records": 300000, "rounds": 3, "backend": "sqlite",
               "median_records_per_s": {"none": 90000, "native": 85000, "wasm": 80000},
               "median_cpu_s_per_1m": {"none": 10.0, "native": 10.5, "wasm": 11.0},
               "function_us_per_change": {"native": 0.5, "wasm": 1.0}, "function_cost_ratio": 2.0}
        wasm_backfill = {"kind": "backfill", "backend": "sqlite", "function": "wasm", "records_per_s": 310000}
        with tempfile.TemporaryDirectory() as tmp:
            doc, out, _ = run_report(tmp, results() + [row, wasm_backfill])
            goals = {g["id"]: g for g in doc["goals"]}
            g = goals["wasm-function-cost-vs-native"]
            self.assertFalse(g["met"])
            self.assertEqual((g["value"], g["target"]), (2.0, 1.5))
            self.assertIn("component 1.00 us, native 0.50 us", g["note"])
            self.assertTrue(goals["backfill-sqlite-wasm-records-per-s"]["met"])
            # the live runs beside a backfill are record_counter's: no drop goal for the component
            self.assertNotIn("backfill-sqlite-wasm-live-drop", goals)
            self.assertIn("native 85,000 records/s 10.50 CPU-s per 1M", out)
            self.assertEqual(doc["wasm"], [row])
        better = dict(row, function_cost_ratio=1.2)
        with tempfile.TemporaryDirectory() as tmp:
            doc, _, _ = run_report(tmp, results() + [better])
            self.assertTrue({g["id"]: g for g in doc["goals"]}["wasm-function-cost-vs-native"]["met"])

    def test_backfill_drop_over_repeats(self):
        res = [r for r in results() if r["kind"] != "live"]
        for r in res:
            if r["kind"] == "backfill":
                r.update({"live_drop_pct": 12.5, "live_drop_pct_same_records_runs": [3.0, 12.5, 30.1],
                          "function_ready_cost_pct": 6.0, "function_ready_cost_pct_runs": [5.0, 6.0, 9.0],
                          "live_drop_vs_ready_pct": 7.0, "live_drop_vs_ready_pct_runs": [-2.0, 7.0, 20.0]})
        with tempfile.TemporaryDirectory() as tmp:
            doc, out, _ = run_report(tmp, res)
            g = {g["id"]: g for g in doc["goals"]}["backfill-sqlite-record_counter-live-drop"]
            self.assertEqual(g["value"], 12.5)
            self.assertFalse(g["met"])
            self.assertIn("median of 3 repeats (3.0%, 12.5%, 30.1%)", g["note"])
            self.assertIn("per repeat: 3.0%, 12.5%, 30.1% (median 12.5%)", out)
            self.assertIn("itself: 5.0%, 6.0%, 9.0% (median 6.0%)", out)
            self.assertNotIn("interval", g["note"])
        # With enough repeats, bench-backfill.sh adds the median's 95% interval.
        for r in res:
            if r["kind"] == "backfill":
                r["live_drop_pct_same_records_ci95"] = [-4.5, 5.9]
        with tempfile.TemporaryDirectory() as tmp:
            doc, out, _ = run_report(tmp, res)
            g = {g["id"]: g for g in doc["goals"]}["backfill-sqlite-record_counter-live-drop"]
            self.assertIn("95% interval of the median -4.5..5.9%", g["note"])
            self.assertIn("(median 12.5%, 95% interval -4.5..5.9%)", out)

    def test_backfill_rate_is_the_workers_when_measured(self):
        res = results()
        for r in res:
            if r["kind"] == "backfill":
                r.update({"records_per_s": 120_000, "worker_records_per_s": 310_000})
        with tempfile.TemporaryDirectory() as tmp:
            doc, _, _ = run_report(tmp, res)
            g = {g["id"]: g for g in doc["goals"]}["backfill-sqlite-record_counter-records-per-s"]
            self.assertEqual(g["value"], 310_000)
            self.assertTrue(g["met"])
            self.assertIn("120,000", g["note"])

    def test_latency_from_the_histogram(self):
        res = results()
        for r in res:
            if r["kind"] == "latency" and r["contender"] == "sluice-sqlite":
                r.update({"n": 0, "histogram": {"p50_ms": 8.0, "p99_ms": 70.0, "count": 500, "bounds_s": [0.001]}})
                for k in ["p50_ms", "p90_ms", "p99_ms", "max_ms"]:
                    del r[k]
        with tempfile.TemporaryDirectory() as tmp:
            doc, _, path = run_report(tmp, res)
            goals = {g["id"]: g for g in doc["goals"]}
            self.assertEqual((goals["latency-sluice-sqlite-p50"]["met"], goals["latency-sluice-sqlite-p99"]["met"]),
                             (True, False))
            self.assertIn("histogram", goals["latency-sluice-sqlite-p99"]["note"])
            ET.ElementTree(run_chart(tmp, path))


# A suite JSON cut down to what the page reads: one goal met, one missed, one not measured.
PAGE_DOC = {
    "commit": "abc1234", "worktree_dirty": False, "date": "2026-12-01T18:00:00Z", "command": "scripts/bench-suite.sh",
    "quick": False, "machine": {"nproc": 2, "cpu_model": "Test CPU @ 2.0GHz", "mem_total_kb": 8 * 1048576, "kernel": "6.1"},
    "pinning": "contenders on CPU 1", "kafka": "1 broker", "postgres": "16.4", "java": "openjdk 21",
    "peer_jvm_opts": "JVM defaults", "build_s": {"cargo_release": 100.0, "mvn_package": 30.0},
    "wall_s_before_report": 1346.4,
    "checks": [{"check": "checksums of every contender match on every workload", "ok": True,
                "note": "W1: match (3 contenders)"}],
    "goals": [
        {"id": "a", "goal": "W1 sluice SQLite records/s vs consumer-perf-test", "op": ">=", "target": 0.5, "unit": "x",
         "note": "120,000 vs 200,000 records/s (sluice-sqlite W1 vs consumer-perf-test W1)", "measured": True,
         "value": 0.6, "met": True, "result": "met: 20.0% above the minimum"},
        {"id": "b", "goal": "sluice SQLite p99 latency at 50% load", "op": "<=", "target": 50, "unit": "ms",
         "note": "per record | CreateTime", "measured": True, "value": 80.5, "met": False,
         "result": "MISSED: 61.0% over the limit"},
        {"id": "c", "goal": "live records/s drop during the backfill (SQLite)", "op": "<=", "target": 10, "unit": "%",
         "note": "", "measured": False, "value": None, "met": None, "result": "not measured"},
    ],
    "latency": {"sluice-sqlite": {"rate": 60000, "n": 1000, "p50_ms": 12.0, "p99_ms": 80.5,
                                  "load": {"contender_cpu": 0.75}}},
    "recovery": {"static": {"rate": 30000, "restart_to_first_batch_s": 0.3}},
    "rebuild_s_per_1m": {"sluice-sqlite": 11.4},
}

PAGE = "# Benchmarks\n\nProse written by people.\n\n" + PAGE_BEGIN + "\nan old table\n" + PAGE_END + "\n\n## After\n\nMore prose.\n"


class PageWriter(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.page = os.path.join(self.tmp.name, "BENCHMARKS.md")
        os.makedirs(os.path.join(self.tmp.name, "docs", "bench"))
        self.json = os.path.join(self.tmp.name, "docs", "bench", "suite-2026-12-01-abc1234.json")
        self.svg = os.path.join(self.tmp.name, "docs", "bench", "suite-2026-12-01-abc1234.svg")
        with open(self.json, "w") as f:
            json.dump(PAGE_DOC, f)

    def tearDown(self):
        self.tmp.cleanup()

    def put(self, text):
        with open(self.page, "w") as f:
            f.write(text)

    def get(self):
        with open(self.page) as f:
            return f.read()

    def test_table_and_facts(self):
        block = render_page_block(PAGE_DOC, "docs/bench/x.json", "docs/bench/x.svg")
        lines = block.splitlines()
        self.assertIn("| goal | this run | target | result | measured |", lines)
        # the value, the target, met or missed; the note without the contender pair, pipes escaped
        self.assertIn("| W1 sluice SQLite records/s vs consumer-perf-test | 0.600x | >= 0.5x | met: 20.0% above the minimum"
                      " | 120,000 vs 200,000 records/s |", lines)
        self.assertIn("| sluice SQLite p99 latency at 50% load | 80.5 ms | <= 50 ms | **MISSED**: 61.0% over the limit"
                      " | per record \\| CreateTime |", lines)
        self.assertIn("| live records/s drop during the backfill (SQLite) | - | <= 10.0% | not measured |  |", lines)
        self.assertIn("**1 met, 1 missed, 1 not measured.**", lines)
        for want in ["2026-12-01 18:00 UTC", "commit `abc1234`", "2 x Test CPU @ 2.0GHz, 8.0 GiB",
                     "22 min 26 s (1,346 s", "**Checksums:** all match", "[x.json](docs/bench/x.json)",
                     "![suite chart](docs/bench/x.svg)", "p50 12.0 ms, p99 80.5 ms at 60,000 records/s",
                     "the contender at 75% of its core", "first committed batch after 0.3 s", "11.4 s per 1M W1 records"]:
            self.assertIn(want, block)
        self.assertNotIn("dirty", block)
        bad = dict(PAGE_DOC, worktree_dirty=True, checks=[dict(PAGE_DOC["checks"][0], ok=False)])
        block = render_page_block(bad)
        self.assertIn("dirty worktree", block)
        self.assertIn("**Checksums:** **DIFFER**", block)
        self.assertIn("no chart", block)
        self.assertNotIn("![suite chart]", block)

    def test_text_outside_the_markers_is_kept(self):
        self.put(PAGE)
        write_page(self.page, PAGE_DOC, self.json, self.svg)
        text = self.get()
        head, tail = PAGE.split(PAGE_BEGIN)[0], PAGE.split(PAGE_END)[1]
        self.assertTrue(text.startswith(head + PAGE_BEGIN + "\n"))
        self.assertTrue(text.endswith("\n" + PAGE_END + tail))
        self.assertNotIn("an old table", text)
        inside = text[text.index(PAGE_BEGIN) + len(PAGE_BEGIN):text.index(PAGE_END)]
        self.assertEqual(inside.strip(), render_page_block(PAGE_DOC, "docs/bench/suite-2026-12-01-abc1234.json",
                                                           "docs/bench/suite-2026-12-01-abc1234.svg"))
        # a second run with the same JSON changes nothing
        write_page(self.page, PAGE_DOC, self.json, self.svg)
        self.assertEqual(self.get(), text)

    def test_links_relative_to_the_page(self):
        os.makedirs(os.path.join(self.tmp.name, "docs", "other"))
        page = os.path.join(self.tmp.name, "docs", "other", "page.md")
        with open(page, "w") as f:
            f.write(PAGE)
        write_page(page, PAGE_DOC, self.json, self.svg)
        with open(page) as f:
            self.assertIn("![suite chart](../bench/suite-2026-12-01-abc1234.svg)", f.read())

    def test_a_page_without_markers_is_refused(self):
        for text, want in [("# Benchmarks\n\nNo markers.\n", "has no " + PAGE_BEGIN),
                           (PAGE + PAGE_BEGIN + "\n", "exactly one"),
                           ("x\n" + PAGE_END + "\n" + PAGE_BEGIN + "\n", "comes before")]:
            self.put(text)
            with self.assertRaises(PageError) as e:
                write_page(self.page, PAGE_DOC, self.json, self.svg)
            self.assertIn(want, str(e.exception))
            self.assertEqual(self.get(), text, "a refused page is left as it was")
        # the command line says so and exits non-zero
        self.put("# Benchmarks\n")
        p = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--json", self.json, "--write-page", self.page],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertIn("has no " + PAGE_BEGIN, p.stderr)
        self.assertEqual(self.get(), "# Benchmarks\n")

    def test_command_line_after_the_report(self):
        """report.py's JSON, then the page from it, as bench-suite.sh runs them."""
        doc, _, out = run_report(self.tmp.name, results())
        self.put(PAGE)
        p = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--json", out, "--write-page", self.page,
                            "--chart", self.svg], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        text = self.get()
        self.assertIn("**8 met, 8 missed, 0 not measured.**", text)
        for g in doc["goals"]:
            self.assertIn(f'| {g["goal"]} |', text)
        self.assertIn("[suite.json](suite.json)", text)
        self.assertIn("More prose.", text)
        p = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--json", out], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)


if __name__ == "__main__":
    unittest.main()
