#!/usr/bin/env python3
"""Report of scripts/bench-suite.sh: reads the measurements (one JSON object per line),
prints a table per workload, the latency and recovery results, every goal (met / missed,
the measured value, by how much) and the per-phase wall times; writes everything as one
JSON document (which scripts/bench/chart.py draws).

Goals:
  - W1 records/s: sluice on SQLite >= 0.5x consumer-perf-test's, on PostgreSQL >= 0.25x;
  - latency at 50% load: p99 <= 50 ms and p50 <= 10 ms (SQLite; PostgreSQL's too when
    the results hold a latency result for it);
  - against the peer on W1-W3 (sluice on SQLite): >= 3x records/s, <= 0.33x CPU-s per 1M
    records, <= 0.25x peak RSS;
  - W4 and W5 steady records/s >= 0.9x the same backend's W1 steady records/s;
  - backfill, when the results hold a row of kind "backfill": records/s >= 300,000 (the
    worker's own rate, 'backfill started' -> 'finished', when the row has it) and the
    live throughput drop during the backfill <= 10% (see backfill_rows);
  - reads, when the results hold a row of kind "reads" (scripts/bench-reads.sh): the W1
    drain rate with 100 readers waiting on tokens drops by no more than the spread of the
    drain alone between repeats (the same run); the produce -> token read p50/p99 is
    printed beside it (a figure to plan with, no goal);
  - the change feed, per row of kind "changefeed" (scripts/bench-ab.sh, the feed off
    against on, on W1's log): records/s with the feed on >= 0.8x off, per backend;
  - a WebAssembly function, per row of kind "wasm" (scripts/bench-wasm.sh: W1 drained with
    no function, with the built-in record_counter on every collection, with the C component
    of the same logic): the function's own CPU per change (each side's CPU per record
    minus the side without a function) <= 1.5x the native one's. The backfill with the
    component is a "backfill" row of function "wasm" (the 300k records/s goal; its live
    drop is not measured: the live runs are record_counter's).

The page (--write-page): renders a suite JSON's run (date, commit, machine, wall time,
checksum verdict, JSON and chart paths) and its goal table as Markdown, and puts it between
the two marker lines of a page (PAGE_BEGIN, PAGE_END: see write_page), keeping the rest of
the page as it is; a page without exactly one pair of markers is refused.

usage: report.py --meta META.json --results RESULTS.jsonl --phases PHASES.tsv --out OUT.json
                 [--write-page PAGE.md [--chart CHART.svg]]
       report.py --json SUITE.json --write-page PAGE.md [--chart CHART.svg]
"""
import argparse
import json
import os
import re
import sys

MB = 2 ** 20
LATENCY_ORDER = ["sluice-sqlite", "sluice-postgres", "peer"]
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


# The goals (see evaluate_goals): throughput floors as ratios of a measured baseline, latency
# ceilings at 50% load, resource ratios against the peer, and the backfill rate.
GOAL_W1_VS_CPT = {"sluice-sqlite": 0.5, "sluice-postgres": 0.25}
GOAL_LATENCY_MS = {"p99": 50, "p50": 10}
GOAL_PEER = [("records_per_s", ">=", 3.0, "records/s"), ("cpu_s_per_1m_records", "<=", 0.33, "CPU-s/1M"),
             ("peak_rss_mb", "<=", 0.25, "peak RSS")]
GOAL_STEADY_VS_W1 = 0.9
GOAL_BACKFILL_RECORDS_PER_S = 300_000
GOAL_BACKFILL_LIVE_DROP_PCT = 10
GOAL_CHANGEFEED_VS_OFF = 0.8
GOAL_WASM_VS_NATIVE = 1.5
METRIC_FMT = {"records_per_s": (",.0f", " records/s"), "steady_records_per_s": (",.0f", " records/s"),
              "cpu_s_per_1m_records": (".1f", " CPU-s/1M"), "peak_rss_mb": (".0f", " MB")}
BACKEND = {"sluice-sqlite": "SQLite", "sluice-postgres": "PostgreSQL", "sqlite": "SQLite", "postgres": "PostgreSQL"}


def latency_percentiles(l):
    """(p50, p90, p99, source) of one latency result: the per-record figures, or (no per-record
    samples) the histogram's interpolated ones (which have no p90)."""
    if not l.get("n") and l.get("histogram"):
        h = l["histogram"]
        return h.get("p50_ms"), h.get("p90_ms"), h.get("p99_ms"), "histogram, interpolated"
    return l.get("p50_ms"), l.get("p90_ms"), l.get("p99_ms"), "per record"


def fmt_value(v, unit):
    if unit == "x":
        return f"{v:.3f}x"
    if unit == "records/s":
        return f"{v:,.0f} records/s"
    if unit == "%":
        return f"{v:.1f}%"
    return f"{v:g} {unit}"


def verdict(value, op, target):
    """(met, text): met or missed, and by how much."""
    met = value >= target if op == ">=" else value <= target
    if target == 0:
        return met, "met" if met else "MISSED"
    r = value / target
    d = abs(r - 1) * 100
    if op == ">=":
        if met:
            return met, (f"met: {r:.1f}x the minimum" if r >= 2 else f"met: {d:.1f}% above the minimum")
        return met, f"MISSED: {d:.1f}% below the minimum"
    if met:
        return met, f"met: {d:.1f}% under the limit"
    return met, (f"MISSED: {r:.1f}x the limit" if r >= 2 else f"MISSED: {d:.1f}% over the limit")


def evaluate_goals(by, lat, res):
    """Every goal, met or missed. by: (workload, contender) -> drain row with the derived
    rates; lat: contender -> latency result; res: every result line (for "backfill" and
    "live" rows). A goal with no measurement is listed as not measured. A goal that is a
    ratio of a measured baseline carries a "line" (the threshold in the baseline's units)
    for the chart."""
    goals = []

    def goal(gid, name, value, op, target, unit="x", note="", line=None):
        g = {"id": gid, "goal": name, "op": op, "target": target, "unit": unit, "note": note, "measured": value is not None,
             "value": None, "met": None, "margin": None, "result": "not measured"}
        if value is not None:
            met, text = verdict(value, op, target)
            g.update({"value": round(value, 3), "met": met, "result": text,
                      "margin": round(value / target, 3) if target else None})
        if line is not None:
            g["line"] = line
        goals.append(g)

    def ratio_goal(gid, name, w, c, bw, bc, key, op, factor, label):
        """goal: by[w, c][key] op factor x by[bw, bc][key]."""
        x, y = by.get((w, c)), by.get((bw, bc))
        xv = x.get(key) if x else None
        yv = y.get(key) if y else None
        value = xv / yv if xv is not None and yv else None
        f, u = METRIC_FMT[key]
        note = (f"{xv:{f}} vs {yv:{f}}{u} ({c} {w} vs {bc} {bw})" if value is not None
                else ("no baseline" if x and not yv else ""))
        if key == "records_per_s" and x and y and x.get("steady_records_per_s") and y.get("steady_records_per_s"):
            note += f'; steady ratio {x["steady_records_per_s"] / y["steady_records_per_s"]:.3f}'
        line = None
        if yv:
            # the steady rates are drawn as markers on the records/s panel
            line = {"panel": "records_per_s" if key == "steady_records_per_s" else key, "workload": w, "contender": c,
                    "value": round(factor * yv, 3), "label": label, "compare": key}
        goal(gid, name, value, op, factor, note=note, line=line)

    for c, f in GOAL_W1_VS_CPT.items():
        ratio_goal(f"w1-{c}-vs-cpt", f"W1 sluice {BACKEND[c]} records/s vs consumer-perf-test", "W1", c, "W1",
                   "consumer-perf-test", "records_per_s", ">=", f, f"{f}x cpt")

    for c in ["sluice-sqlite", "sluice-postgres"]:
        if c not in lat and c != "sluice-sqlite":
            continue  # PostgreSQL's latency only when measured
        p50, _p90, p99, src = latency_percentiles(lat.get(c, {}))
        for pct, v in [("p99", p99), ("p50", p50)]:
            lim = GOAL_LATENCY_MS[pct]
            goal(f"latency-{c}-{pct}", f"sluice {BACKEND[c]} {pct} latency at 50% load", v, "<=", lim, "ms",
                 note=src if c in lat else "", line={"panel": "latency", "percentile": pct, "contender": c, "value": lim,
                                                     "label": f"{pct} <= {lim} ms"})

    for w in ["W1", "W2", "W3"]:
        if (w, "peer") not in by:
            continue
        for key, op, f, what in GOAL_PEER:
            ratio_goal(f"{w.lower()}-sluice-sqlite-vs-peer-{key}", f"{w} sluice SQLite {what} vs the peer", w, "sluice-sqlite", w,
                       "peer", key, op, f, f"{f}x peer")

    for w in ["W4", "W5"]:
        for c in ["sluice-sqlite", "sluice-postgres"]:
            if (w, c) in by:
                # steady rates: W4/W5 are shorter than W1, start-up must not count
                ratio_goal(f"{w.lower()}-{c}-steady-vs-w1", f"{w} sluice {BACKEND[c]} steady records/s vs its W1", w, c, "W1", c,
                           "steady_records_per_s", ">=", GOAL_STEADY_VS_W1, f"{GOAL_STEADY_VS_W1}x W1 steady")

    for b in backfill_rows(res):
        name = BACKEND.get(b["backend"], b["backend"])
        goal(f'backfill-{b["backend"]}-{b["function"]}-records-per-s', f'backfill ({name}, {b["function"]}) records/s',
             b["records_per_s"], ">=", GOAL_BACKFILL_RECORDS_PER_S, "records/s", note=b["rate_note"])
        if b["function"] != "wasm":  # the live runs beside a backfill are record_counter's
            goal(f'backfill-{b["backend"]}-{b["function"]}-live-drop', f"live records/s drop during the backfill ({name})",
                 b["live_drop_pct"], "<=", GOAL_BACKFILL_LIVE_DROP_PCT, "%", note=b["live_drop_note"])
    for r in res:
        if r.get("kind") != "reads":
            continue
        p = r.get("produce_to_read") or {}
        spread = max(r["spread_alone_pct"], 0.1)
        note = (f'drain {r["median_with_waiters"]:,.0f} vs {r["median_alone"]:,.0f} records/s alone (medians of '
                f'{len(r["drain_alone"])}); produce ack -> token read at {p.get("paced_rate", 0):,} records/s: '
                f'p50 {fmt_ms(p.get("p50_ms"))}, p99 {fmt_ms(p.get("p99_ms"))}')
        goal("reads-waiters-cost", f'drain records/s drop with {r["waiters"]} readers waiting on tokens', r["waiter_cost_pct"],
             "<=", round(spread, 1), "%", note=note)
    for r in res:
        if r.get("kind") != "changefeed":
            continue
        name = BACKEND.get(r["backend"], r["backend"])
        note = (f'feed on {r["b_median"]:,.0f} vs off {r["a_median"]:,.0f} records/s (medians of {r["rounds"]} '
                f'interleaved rounds, {r["records"]:,} W1 records, caught up and every change published)')
        goal(f'changefeed-{r["backend"]}-vs-off', f"W1 records/s with the change feed on vs off ({name})", r["ratio"],
             ">=", GOAL_CHANGEFEED_VS_OFF, "x", note=note)
    for r in res:
        if r.get("kind") != "wasm" or r.get("function_cost_ratio") is None:
            continue
        rate, cpu, fn = r["median_records_per_s"], r["median_cpu_s_per_1m"], r["function_us_per_change"]
        note = (f'the function\'s own CPU per change: component {fn["wasm"]:.2f} us, native {fn["native"]:.2f} us; '
                f'W1 {rate["wasm"]:,.0f} vs {rate["native"]:,.0f} records/s ({rate["none"]:,.0f} without a function), '
                f'CPU-s per 1M {cpu["wasm"]:.2f} vs {cpu["native"]:.2f} ({cpu["none"]:.2f}); medians of {r["rounds"]} '
                f'interleaved rounds, {r["records"]:,} records')
        goal("wasm-function-cost-vs-native", "a WebAssembly function's cost per change vs the same logic native",
             r["function_cost_ratio"], "<=", GOAL_WASM_VS_NATIVE, "x", note=note)
    return goals


def fmt_ms(v):
    return "-" if v is None else f"{v:.1f} ms"


def percents(xs):
    """Per-repeat percentages as "3.0%, 12.5%"."""
    return ", ".join(f"{x}%" for x in xs)


def backfill_rows(res):
    """The backfill results: each "backfill" row (records_per_s; backend or contender; function)
    with the live throughput drop during it: the row's own live_drop_pct, or else computed from
    the "live" rows of its backend (with_backfill false / true: steady records/s when both have
    it, records/s otherwise)."""
    out = []
    for r in res:
        if r.get("kind") != "backfill":
            continue
        backend = r.get("backend") or r.get("contender") or "sqlite"
        drop, note = r.get("live_drop_pct"), ""
        if drop is not None:
            note = "the live records applied while the worker ran, against the same records' time without a backfill"
            if r.get("live_drop_pct_same_records_runs"):
                runs = r["live_drop_pct_same_records_runs"]
                note += f'; median of {len(runs)} repeats ({percents(runs)})'
                if r.get("live_drop_pct_same_records_ci95"):
                    lo, hi = r["live_drop_pct_same_records_ci95"]
                    note += f'; 95% interval of the median {lo}..{hi}%'
        else:
            live = [x for x in res if x.get("kind") == "live" and (x.get("backend") or x.get("contender") or "sqlite") == backend]
            la = next((x for x in live if not x.get("with_backfill")), None)
            lb = next((x for x in live if x.get("with_backfill")), None)
            if la and lb:
                key = "steady_records_per_s" if la.get("steady_records_per_s") and lb.get("steady_records_per_s") else "records_per_s"
                drop = 100 * (1 - lb[key] / la[key])
                note = (f'{"steady " if key.startswith("steady") else ""}records/s of the live backlog: '
                        f'{lb[key]:,.0f} with the backfill vs {la[key]:,.0f} without')
            else:
                note = "no live throughput measured beside the backfill"
        # The rate of the backfill itself (the worker's 'backfill started' -> 'finished'),
        # when measured; attach -> finished adds a fixed ~0.5 s (the CLI starting, the
        # marker's trip through the log), a large share of a run of a few 100k records.
        rate, rate_note = r.get("records_per_s"), ""
        if r.get("worker_records_per_s"):
            rate = r["worker_records_per_s"]
            rate_note = f'the worker\'s rate; attach -> finished: {r["records_per_s"]:,.0f} records/s'
        out.append({"backend": backend, "function": r.get("function", "backfill"), "records_per_s": rate,
                    "rate_note": rate_note, "live_drop_pct": drop, "live_drop_note": note})
    return out


PAGE_BEGIN = "<!-- suite-table:begin -->"
PAGE_END = "<!-- suite-table:end -->"


class PageError(Exception):
    """A page the run's block cannot be written into (no markers, or not one pair)."""


def page_cell(s):
    """A Markdown table cell: no pipes, no line breaks."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def page_note(note):
    """A goal's note, short enough for the page's table: the contender pair in brackets
    dropped (the goal's name says it), a per-repeat list reduced to its count, and any part
    (between '; ') still longer than 90 characters left out (the JSON keeps the whole note)."""
    note = re.sub(r" \([a-z-]+ W\d vs [a-z-]+ W\d\)", "", note or "")
    note = re.sub(r"median of (\d+) repeats \([^)]*\)", r"median of \1 repeats", note)
    return "; ".join(p for p in note.split("; ") if p and len(p) <= 90)


def ms(v):
    """A latency for the page: '1,855 ms', '36.4 ms', '?' when absent."""
    return "?" if v is None else f"{v:,} ms"


def duration(s):
    """1346.4 -> '22 min 26 s'."""
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec} s" if m else f"{sec} s"


def render_page_block(doc, json_link=None, chart_link=None):
    """The page's generated block for one suite JSON (as report.py writes it): the run's
    facts, the goal table (goal, this run's value, target, met/missed, how), the count, what
    the suite measures beside the goals, and the chart. json_link / chart_link: the paths as
    the page links them (None: not linked)."""
    m = doc.get("machine", {})
    date = doc.get("date", "?")
    when = date.replace("T", " ")[:16] + " UTC" if "T" in date else date
    run = f'{when}, commit `{doc.get("commit", "?")}`'
    if doc.get("worktree_dirty"):
        run += " (dirty worktree: the code measured is not exactly that commit's)"
    run += f', `{doc.get("command", "scripts/bench-suite.sh")}`'
    if doc.get("quick"):
        run += " (--quick: 1/10 sizes, the numbers are a smoke test only)"
    mem = f', {m["mem_total_kb"] / 1048576:.1f} GiB' if m.get("mem_total_kb") else ""
    kernel = f', Linux {m["kernel"]}' if m.get("kernel") else ""
    lines = [f"- **Run:** {run}.",
             f'- **Machine:** {m.get("nproc", "?")} x {m.get("cpu_model", "?")}{mem}{kernel}; Kafka {doc.get("kafka", "?")}; '
             f'PostgreSQL {doc.get("postgres", "?")}; the peer on {doc.get("java", "?")}, {doc.get("peer_jvm_opts", "?")}.',
             f'- **Pinning:** {doc.get("pinning", "?")}.']
    if doc.get("wall_s_before_report") is not None:
        wall = f'- **Wall time:** {duration(doc["wall_s_before_report"])} ({doc["wall_s_before_report"]:,.0f} s, to the report)'
        b = doc.get("build_s") or {}
        if b.get("cargo_release") is not None:
            wall += (f', the builds included (cargo release {b["cargo_release"]:.0f} s and mvn package '
                     f'{b.get("mvn_package", 0):.0f} s, in parallel)')
        lines.append(wall + ".")
    checks = doc.get("checks") or []
    if checks:
        c = checks[0]
        verdict_ = "all match" if c["ok"] else "**DIFFER**"
        lines.append(f'- **Checksums:** {verdict_}: {c["check"]} ({c["note"]}).')
    else:
        lines.append("- **Checksums:** not compared in this run.")
    files = []
    if json_link:
        files.append(f"JSON [{os.path.basename(json_link)}]({json_link})")
    files.append(f"chart [{os.path.basename(chart_link)}]({chart_link}) (below)" if chart_link else "no chart")
    lines.append(f'- **Files:** {", ".join(files)}.')

    goals = doc.get("goals") or []
    lines += ["", "| goal | this run | target | result | measured |", "|---|---|---|---|---|"]
    for g in goals:
        value = fmt_value(g["value"], g["unit"]) if g.get("measured") and g.get("value") is not None else "-"
        target = f'{g["target"]:g}x' if g["unit"] == "x" else fmt_value(g["target"], g["unit"])
        if g.get("met") is True:
            result = g["result"]
        elif g.get("met") is False:
            result = "**MISSED**" + g["result"][len("MISSED"):]
        else:
            result = "not measured"
        lines.append("| " + " | ".join(page_cell(x) for x in [
            g["goal"], value, f'{g["op"]} {target}', result, page_note(g.get("note"))]) + " |")
    met = sum(1 for g in goals if g.get("met") is True)
    missed = sum(1 for g in goals if g.get("met") is False)
    lines += ["", f"**{met} met, {missed} missed, {len(goals) - met - missed} not measured.**"]

    beside = []
    lat = doc.get("latency") or {}
    for c in LATENCY_ORDER:
        l = lat.get(c)
        if not l:
            continue
        p50, _p90, p99, src = latency_percentiles(l)
        core = (l.get("load") or {}).get("contender_cpu")
        beside.append(f'latency at half load, {LABEL[c]}: p50 {ms(p50)}, p99 {ms(p99)} at {l["rate"]:,} records/s'
                      + (f", the contender at {core * 100:.0f}% of its core" if core is not None else "")
                      + (f" ({src})" if src != "per record" else ""))
    la = doc.get("latency_log_append")
    if la and la.get("n"):
        beside.append(f'the same for {LABEL["sluice-sqlite"]} from the broker\'s append (LogAppendTime, its own share): '
                      f'p50 {ms(la.get("p50_ms"))}, p99 {ms(la.get("p99_ms"))}')
    for v, r in (doc.get("recovery") or {}).items():
        what = "static membership, `[kafka] instance_id`" if v == "static" else f"{v} configuration"
        beside.append(f'kill -9 and restart under {r["rate"]:,} records/s ({what}): first committed batch after '
                      f'{r["restart_to_first_batch_s"]} s')
    for c, s in (doc.get("rebuild_s_per_1m") or {}).items():
        beside.append(f"rebuild from offset 0, {LABEL.get(c, c)}: {s} s per 1M W1 records")
    if beside:
        lines += ["", "Measured beside the goals:", ""] + [f"- {b}." for b in beside]
    if chart_link:
        lines += ["", f"![suite chart]({chart_link})"]
    return "\n".join(lines)


def replace_block(text, block, where="the page"):
    """text with everything between its one PAGE_BEGIN and its one PAGE_END replaced by
    block (on lines of its own); the markers and everything outside them unchanged."""
    nb, ne = text.count(PAGE_BEGIN), text.count(PAGE_END)
    if nb == 0 and ne == 0:
        raise PageError(f"{where} has no {PAGE_BEGIN} ... {PAGE_END} markers: add both, each on a line of its own, "
                        "where the run's table goes (the text between them is replaced, the rest is kept); nothing written")
    if nb != 1 or ne != 1:
        raise PageError(f"{where} must hold exactly one {PAGE_BEGIN} and one {PAGE_END} (found {nb} and {ne}); nothing written")
    i, j = text.index(PAGE_BEGIN) + len(PAGE_BEGIN), text.index(PAGE_END)
    if j < i:
        raise PageError(f"{where}: {PAGE_END} comes before {PAGE_BEGIN}; nothing written")
    return text[:i] + "\n" + block + "\n" + text[j:]


def write_page(page, doc, json_path=None, chart_path=None):
    """Writes the run's block (render_page_block) into the page file between its markers;
    json_path / chart_path are linked relative to the page's folder. Raises PageError (the
    file untouched) when the page has no pair of markers."""
    base = os.path.dirname(os.path.abspath(page))
    rel = (lambda p: os.path.relpath(os.path.abspath(p), base).replace(os.sep, "/") if p else None)
    with open(page, encoding="utf-8") as f:
        text = f.read()
    new = replace_block(text, render_page_block(doc, rel(json_path), rel(chart_path)), page)
    if new != text:
        with open(page, "w", encoding="utf-8") as f:
            f.write(new)


def main():
    ap = argparse.ArgumentParser(description="the suite's report (--meta/--results/--phases/--out) and/or its page "
                                             "(--write-page, from --json or the report's --out)")
    ap.add_argument("--meta")
    ap.add_argument("--results")
    ap.add_argument("--phases")
    ap.add_argument("--out")
    ap.add_argument("--json", help="a suite JSON to write the page from (default: --out)")
    ap.add_argument("--write-page", metavar="PAGE.md", help="write the run's block between the page's markers")
    ap.add_argument("--chart", help="the run's chart, linked from the page")
    a = ap.parse_args()
    report_args = [a.meta, a.results, a.phases, a.out]
    if any(report_args) and not all(report_args):
        ap.error("--meta, --results, --phases and --out go together")
    if not any(report_args) and not (a.write_page and a.json):
        ap.error("give --meta, --results, --phases and --out (the report), or --json and --write-page (the page)")
    if a.json and not a.write_page:
        ap.error("--json is the page's input: give --write-page too")
    rc = report(a) if all(report_args) else 0
    if a.write_page:
        src = a.json or a.out
        with open(src) as f:
            doc = json.load(f)
        try:
            write_page(a.write_page, doc, src, a.chart)
        except PageError as e:
            print(f"report.py: {e}", file=sys.stderr)
            return 1
        print(f"page: {a.write_page} (the run of {src})")
    return rc


def report(a):
    meta = json.load(open(a.meta))
    res = [json.loads(l) for l in open(a.results) if l.strip()]
    workloads = {r["workload"]: r for r in res if r["kind"] == "workload"}
    drains = [r for r in res if r["kind"] == "drain"]
    checks_by_w = {r["workload"]: r for r in res if r["kind"] == "checksums"}
    lat = {r["contender"]: r for r in res if r["kind"] == "latency"}
    lat_append = next((r for r in res if r["kind"] == "latency_log_append"), None)
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
            anon = (f' (allocated memory only, RssAnon sampled: {s["rss_anon_max_kb"] / 1024:.0f} MB, '
                    f'{s["rss_anon_max_kb"] / 1024 / p["peak_rss_mb"]:.2f}x)') if s.get("rss_anon_max_kb") else ""
            print(f'  sluice SQLite / peer: records/s {s["records_per_s"] / p["records_per_s"]:.2f}x, '
                  f'CPU-s/1M {s["cpu_s_per_1m_records"] / p["cpu_s_per_1m_records"]:.2f}x, '
                  f'peak RSS {s["peak_rss_mb"] / p["peak_rss_mb"]:.2f}x{anon}')
        ck = checks_by_w.get(w)
        if ck:
            print(f'  checksums: {"MATCH" if ck["match"] else "DIFFER"}: ' + "; ".join(ck["values"]))
    if lat:
        print()
        print("Latency, produce -> materialized, at 50% of each contender's W1 steady records/s (paced producer on CPU 0)")
        rows = []
        for c in LATENCY_ORDER:
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
        for c in LATENCY_ORDER:
            l = lat.get(c) or {}
            if l.get("warmup_s"):
                whole = l.get("whole_run") or {"n": l.get("all_n"), "p50_ms": l.get("all_p50_ms"), "p99_ms": l.get("all_p99_ms")}
                print(f'  {LABEL[c]}: records stamped in the first {l["warmup_s"]} s (the paced producer\'s warm-up) left out;'
                      f' over all {whole.get("n") or 0:,}: p50 {whole.get("p50_ms")} ms, p99 {whole.get("p99_ms")} ms')
        if lat_append and lat_append.get("n"):
            la = lat_append
            print(f'  sluice (SQLite) from the broker\'s append (a second run, topic with LogAppendTime, {la["rate"]:,.0f} records/s):'
                  f' p50 {la.get("p50_ms")} ms, p90 {la.get("p90_ms")} ms, p99 {la.get("p99_ms")} ms, max {la.get("max_ms")} ms'
                  ' -- Sluice\'s own share, without the paced producer\'s and the broker\'s delays before the append')
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

    bf = [r for r in res if r["kind"] == "backfill"]
    live = {r.get("with_backfill"): r for r in res if r["kind"] == "live"}
    if bf or live:
        print()
        print(f'Backfill (scripts/bench-backfill.sh; {next((r["pinning"] for r in bf if r.get("pinning")), "nothing pinned")})')
        for r in bf:
            total, secs, worker = r.get("backfill_total"), r.get("seconds"), r.get("worker_records_per_s")
            print(f'  {r.get("function")} on {BACKEND.get(r.get("backend"), r.get("backend"))}: '
                  + (f'{total:,} records, attach -> finished {secs:.2f} s = ' if total and secs else "")
                  + f'{r["records_per_s"]:,} records/s'
                  + (f' (the worker alone: {worker:,} records/s)' if worker else ""))
        for k, what in [(False, "without a backfill"), (True, "with the backfill running")]:
            r = live.get(k)
            if r:
                steady = r.get("steady_records_per_s")
                print(f'  live backlog {what}: {r["records"]:,} records in {r["seconds"]:.2f} s'
                      + (f', steady {steady:,} records/s' if steady else "")
                      + (f' (repeat {r["repeat"]})' if r.get("repeat") else ""))
        for r in bf:
            runs = r.get("live_drop_pct_same_records_runs")
            if runs:
                ci = r.get("live_drop_pct_same_records_ci95")
                print(f'  live drop on the same records, per repeat: {percents(runs)} (median {r.get("live_drop_pct")}%'
                      + (f', 95% interval {ci[0]}..{ci[1]}%)' if ci else ")"))
            if r.get("function_ready_cost_pct_runs"):
                print(f'  of it, the cost of the ready function itself: {percents(r["function_ready_cost_pct_runs"])}'
                      f' (median {r.get("function_ready_cost_pct")}%); the backfill beside it:'
                      f' {percents(r.get("live_drop_vs_ready_pct_runs") or [])} (median {r.get("live_drop_vs_ready_pct")}%)')

    for r in (r for r in res if r["kind"] == "reads"):
        p = r.get("produce_to_read") or {}
        print()
        print(f'Reads (scripts/bench-reads.sh, SQLite, {r["records"]:,} W1 records{", pinned" if r.get("pinned") else ""})')
        print(f'  drain alone: {", ".join(f"{x:,.0f}" for x in r["drain_alone"])} records/s (spread {r["spread_alone_pct"]}%); '
              f'with {r["waiters"]} waiting readers: {", ".join(f"{x:,.0f}" for x in r["drain_with_waiters"])} '
              f'(cost {r["waiter_cost_pct"]}% of the median)')
        print(f'  produce ack -> token read at {p.get("paced_rate", 0):,} records/s ({p.get("samples")} reads): '
              f'p50 {fmt_ms(p.get("p50_ms"))}, p90 {fmt_ms(p.get("p90_ms"))}, p99 {fmt_ms(p.get("p99_ms"))}, max {fmt_ms(p.get("max_ms"))}')

    for r in (r for r in res if r["kind"] == "changefeed"):
        print()
        print(f'Change feed (scripts/bench-ab.sh, {BACKEND.get(r["backend"], r["backend"])}, {r["records"]:,} W1 records): '
              f'off {", ".join(f"{x:,.0f}" for x in r["a_records_per_s"])} records/s, '
              f'on {", ".join(f"{x:,.0f}" for x in r["b_records_per_s"])} (on/off {r["ratio"]}x)')

    for r in (r for r in res if r["kind"] == "wasm"):
        rate, cpu = r["median_records_per_s"], r["median_cpu_s_per_1m"]
        print()
        print(f'WebAssembly function (scripts/bench-wasm.sh, SQLite, {r["records"]:,} W1 records, medians of {r["rounds"]} rounds): '
              + ", ".join(f'{s} {rate[s]:,.0f} records/s {cpu[s]:.2f} CPU-s per 1M' for s in ("none", "native", "wasm")))

    goals = evaluate_goals(by, lat, res)
    print()
    print("Goals")
    rows = []
    for g in goals:
        if not g["measured"]:
            rows.append([g["goal"], "", f'{g["op"]} {fmt_value(g["target"], g["unit"])}', "not measured", g["note"]])
            continue
        rows.append([g["goal"], fmt_value(g["value"], g["unit"]), f'{g["op"]} {fmt_value(g["target"], g["unit"])}',
                     g["result"], g["note"]])
    print(table(rows, ["goal", "value", "target", "result", "note"]))
    met = sum(1 for g in goals if g["met"] is True)
    missed = sum(1 for g in goals if g["met"] is False)
    print(f"  {met} met, {missed} missed, {len(goals) - met - missed} not measured")
    checks = []
    if checks_by_w:
        all_match = all(c["match"] for c in checks_by_w.values())
        checks.append({"check": "checksums of every contender match on every workload", "ok": all_match,
                       "note": "; ".join(f'{w}: {"match" if c["match"] else "DIFFER"} ({len(c["values"])} contenders)'
                                         for w, c in sorted(checks_by_w.items()))})
        print(f'  check: {checks[0]["check"]}: {"OK" if all_match else "FAILED"} ({checks[0]["note"]})')

    print()
    print("Phases (wall seconds)")
    total = sum(p["seconds"] for p in phases)
    print(table([[p["phase"], f'{p["seconds"]:.1f}'] for p in phases] + [["total (phases)", f"{total:.1f}"]], ["phase", "s"]))
    b = meta["build_s"]
    print(f'  builds: cargo release {b["cargo_release"]:.1f} s, mvn package {b["mvn_package"]:.1f} s (in parallel)')

    doc = dict(meta)
    doc.update({"workloads": workloads, "rows": drains, "checksums": checks_by_w, "latency": lat, "latency_log_append": lat_append, "recovery": rec,
                "backfill": [r for r in res if r["kind"] in ("backfill", "live")],
                "reads": [r for r in res if r["kind"] == "reads"],
                "changefeed": [r for r in res if r["kind"] == "changefeed"],
                "wasm": [r for r in res if r["kind"] == "wasm"],
                "rebuild_s_per_1m": rebuild, "goals": goals, "checks": checks, "phases": phases, "phases_total_s": round(total, 1)})
    json.dump(doc, open(a.out, "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
