#!/usr/bin/env python3
"""Chart of one scripts/bench-suite.sh run: reads the JSON report.py wrote and draws an SVG
(plain XML, no plotting library needed):

  - records/s, CPU-s per 1M records and peak RSS per workload: grouped bars, one group per
    workload, one bar per contender (fixed colours, legend at the top), the value printed on
    each bar; a diamond marks the steady records/s (first record -> caught up) where measured;
  - latency at 50% load: p50 / p90 / p99 per contender of the latency phase, log scale;
  - goal lines: where a goal is a ratio of a measured baseline (report.py gives its threshold
    in the baseline's units, e.g. 0.5x consumer-perf-test's W1 records/s), a dashed line over
    the bar it applies to, and the latency limits over the latency bars; each labelled, and
    marked met or missed;
  - a title with the run's date, commit and machine.

usage: chart.py OUT.json CHART.svg
"""
import json
import math
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import LABEL, LATENCY_ORDER, ORDER, latency_percentiles  # noqa: E402

COLOUR = {"consumer-perf-test": "#7f7f7f", "kcat": "#bcbd22", "sluice-sqlite": "#1f77b4",
          "sluice-postgres": "#9467bd", "peer": "#ff7f0e"}
SPARE = ["#17becf", "#8c564b", "#e377c2", "#2ca02c"]
MET, MISSED = "#2a8a2a", "#c0201f"
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'

BAR_W, BAR_GAP, GROUP_GAP = 44, 4, 20
PANEL_H, PLOT_TOP, PLOT_BOTTOM = 300, 46, 40
LEFT, RIGHT = 80, 30


def colours(contenders):
    out, spare = {}, iter(SPARE)
    for c in contenders:
        out[c] = COLOUR.get(c) or next(spare, "#444444")
    return out


def label(c):
    return LABEL.get(c, c)


def short(v, kind):
    if v is None:
        return "n/a"
    if kind == "records_per_s":
        if v >= 1e6:
            return f"{v / 1e6:.2f}M"
        if v >= 1e4:
            return f"{v / 1e3:.0f}k"
        if v >= 1e3:
            return f"{v / 1e3:.1f}k"
        return f"{v:.0f}"
    if kind == "ms":
        return f"{v:.0f}" if v >= 10 else f"{v:.1f}"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def nice_max(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e


class Svg:
    def __init__(self):
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=11, anchor="start", weight="normal", fill="#222", extra=""):
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
                 f'fill="{fill}" {FONT}{" " + extra if extra else ""}>{escape(str(s))}</text>')

    def line(self, x1, y1, x2, y2, stroke="#ccc", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
                 f'stroke-width="{width}"{d}/>')

    def rect(self, x, y, w, h, fill, title=None):
        t = f"<title>{escape(title)}</title>" if title else ""
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{max(h, 0):.1f}" fill="{fill}">{t}</rect>')


AXIS_W, SUB_GAP = 58, 18


def subplot_width(groups):
    """groups: [(label, bars)] on one scale -> the width they need, axis labels included."""
    return AXIS_W + sum(len(bars) * (BAR_W + BAR_GAP) - BAR_GAP for _, bars in groups) + GROUP_GAP * (len(groups) + 1)


def panel_width(subplots):
    return sum(subplot_width(g) for g in subplots) + SUB_GAP * (len(subplots) - 1)


def draw_panel(svg, top, title, subplots, cols, kind, lines=(), log=False, unit=""):
    """One panel: its title, then side by side one subplot per entry of subplots, each on its
    own y scale (a workload's rates do not squash another's). subplots: [[(group label,
    [(contender, value, marker or None, key)])]]; lines: [(key, value, text, met)] goal lines
    over the bar whose key matches."""
    svg.text(LEFT, top + 20, title, size=14, weight="bold")
    x = LEFT
    for groups in subplots:
        draw_subplot(svg, x, top, groups, cols, kind, lines, log, unit)
        x += subplot_width(groups) + SUB_GAP


def draw_subplot(svg, left, top, groups, cols, kind, lines, log, unit):
    x0, x1 = left + AXIS_W, left + subplot_width(groups)
    y0, y1 = top + PLOT_TOP, top + PANEL_H - PLOT_BOTTOM
    keys = {b[3] for _, bars in groups for b in bars}
    lines = [ln for ln in lines if ln[0] in keys and ln[1] is not None]
    values = [x for _, bars in groups for b in bars for x in (b[1], b[2]) if x]
    values += [ln[1] for ln in lines if ln[1] > 0]
    if not values:
        svg.text(x0, y0 + 20, "no measurements", fill="#888")
        return
    if log:
        lo = 10 ** math.floor(math.log10(min(values) * 0.5))
        hi = 10 ** math.ceil(math.log10(max(values) * 1.5))

        def ypos(v):
            return y1 - (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (y1 - y0)
        ticks = []
        t = lo
        while t <= hi * 1.0001:
            ticks += [x for x in (t, 2 * t, 5 * t) if x <= hi * 1.0001]
            t *= 10
    else:
        lo, hi = 0.0, nice_max(max(values) * 1.15)

        def ypos(v):
            return y1 - (v - lo) / (hi - lo) * (y1 - y0)
        ticks = [hi * i / 5 for i in range(6)]
    for t in ticks:
        y = ypos(t)
        svg.line(x0, y, x1, y, stroke="#e4e4e4")
        svg.text(x0 - 5, y + 4, short(t, kind) + (f" {unit}" if unit else ""), size=10, anchor="end", fill="#555")
    svg.line(x0, y1, x1, y1, stroke="#888")
    svg.line(x0, y0, x0, y1, stroke="#888")
    pos = {}
    values_text = []  # drawn last, over the goal lines and their labels
    x = x0 + GROUP_GAP
    for glabel, bars in groups:
        gx = x
        for c, v, marker, key in bars:
            pos[key] = x
            if v is not None:
                y = ypos(v)
                svg.rect(x, y, BAR_W, y1 - y, cols[c], title=f"{label(c)} ({c}): {v:,.3f}" if isinstance(v, float)
                         else f"{label(c)} ({c}): {v}")
                if y1 - y >= 18:  # inside the bar's top
                    values_text.append((x + BAR_W / 2, y + 12, short(v, kind), "#fff"))
                else:
                    values_text.append((x + BAR_W / 2, y - 4, short(v, kind), "#222"))
            else:
                svg.text(x + BAR_W / 2, y1 - 4, "n/a", size=9, anchor="middle", fill="#888")
            if marker:
                my = ypos(marker)
                cx = x + BAR_W / 2
                svg.add(f'<path d="M{cx - 5:.1f},{my:.1f} L{cx:.1f},{my - 5:.1f} L{cx + 5:.1f},{my:.1f} L{cx:.1f},{my + 5:.1f} Z" '
                        f'fill="#fff" stroke="#222" stroke-width="1.2"><title>{escape(f"{c}: steady {marker:,.0f}")}</title></path>')
            x += BAR_W + BAR_GAP
        x += GROUP_GAP - BAR_GAP
        svg.text((gx + x - GROUP_GAP) / 2, y1 + 18, glabel, size=12, anchor="middle", weight="bold")
    placed = []  # label boxes (x0, x1, y) already drawn: a label that would overlap one moves up
    for key, v, text, met in sorted(lines, key=lambda ln: -ln[1]):
        bx, y = pos[key], ypos(v)
        col = MET if met else (MISSED if met is False else "#555")
        svg.line(bx - 6, y, bx + BAR_W + 6, y, stroke=col, width=2, dash="6,3")
        half = 2.9 * len(text)
        cx, ty = min(max(bx + BAR_W / 2, x0 + half), x1 - half), y - 3  # inside the subplot
        while any(a < cx + half and cx - half < b and abs(ty - py) < 10 for a, b, py in placed):
            ty -= 10
        placed.append((cx - half, cx + half, ty))
        svg.add(f'<rect x="{cx - half:.1f}" y="{ty - 8:.1f}" width="{2 * half:.1f}" height="10" fill="#fff" '
                f'fill-opacity="0.8"/>')
        svg.text(cx, ty, text, size=9, anchor="middle", fill=col, weight="bold")
    for tx, ty, text, fill in values_text:
        svg.text(tx, ty, text, size=10, anchor="middle", fill=fill, weight="bold",
                 extra='stroke="#000" stroke-opacity="0.25" stroke-width="0.3"' if fill == "#fff" else "")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    doc = json.load(open(sys.argv[1]))
    rows = doc.get("rows", [])
    lat = doc.get("latency", {})
    goals = doc.get("goals", [])
    present = [c for c in ORDER if any(r["contender"] == c for r in rows) or c in lat]
    present += sorted(({r["contender"] for r in rows} | set(lat)) - set(present))
    cols = colours(present)

    workloads = sorted({r["workload"] for r in rows})
    by = {(r["workload"], r["contender"]): r for r in rows}

    def groups_of(key, steady=False):
        out = []
        for w in workloads:
            bars = [(c, by[(w, c)].get(key), by[(w, c)].get("steady_records_per_s") if steady else None, (w, c))
                    for c in present if (w, c) in by]
            out.append((w, bars))
        return out

    def goal_lines(panel):
        out = []
        for g in goals:
            ln = g.get("line")
            if not ln or ln.get("panel") != panel:
                continue
            mark = "" if g.get("met") is None else (" met" if g["met"] else " MISSED")
            if panel == "latency":
                out.append(((ln["percentile"], ln["contender"]), ln["value"], ln["label"] + mark, g.get("met")))
            else:
                out.append(((ln["workload"], ln["contender"]), ln["value"], ln["label"] + mark, g.get("met")))
        return out

    lat_groups = []
    lat_contenders = [c for c in LATENCY_ORDER if c in lat] + sorted(set(lat) - set(LATENCY_ORDER))
    for i, pct in enumerate(["p50", "p90", "p99"]):
        bars = []
        for c in lat_contenders:
            v = latency_percentiles(lat[c])[i]
            bars.append((c, v if v else None, None, (pct, c)))
        lat_groups.append((pct, bars))

    # one subplot (own scale) per workload; the latency percentiles share one log scale
    panels = [("records/s (a diamond: steady records/s, first record -> caught up); each workload on its own scale",
               [[g] for g in groups_of("records_per_s", True)], "records_per_s", goal_lines("records_per_s"), False, ""),
              ("CPU-s per 1M records (the contender's process alone)",
               [[g] for g in groups_of("cpu_s_per_1m_records")], "cpu", goal_lines("cpu_s_per_1m_records"), False, ""),
              ("peak RSS, MB", [[g] for g in groups_of("peak_rss_mb")], "mb", goal_lines("peak_rss_mb"), False, "")]
    if lat:
        panels.append(("latency at 50% load, produce -> materialized, ms (log scale)", [lat_groups], "ms",
                       goal_lines("latency"), True, "ms"))

    plot_w = max([panel_width(p[1]) for p in panels] + [760])
    width = LEFT + plot_w + RIGHT
    m = doc.get("machine", {})
    title = "Sluice benchmark suite" + (" (--quick: smoke-test sizes)" if doc.get("quick") else "")
    sub = (f'{doc.get("date", "?")}, commit {doc.get("commit", "?")}{" (dirty worktree)" if doc.get("worktree_dirty") else ""}; '
           f'{m.get("nproc", "?")} x {m.get("cpu_model", "?")}, {m.get("mem_total_kb", 0) // 1048576} GiB, '
           f'kernel {m.get("kernel", "?")}')

    svg = Svg()
    svg.text(LEFT, 28, title, size=18, weight="bold")
    svg.text(LEFT, 48, sub, size=12, fill="#444")
    # legend: every contender in its colour, then the markers
    lx, ly = LEFT, 72
    for c in present:
        text = label(c)
        w = 18 + 6.6 * len(text) + 18
        if lx + w > width - RIGHT:
            lx, ly = LEFT, ly + 20
        svg.rect(lx, ly - 10, 12, 12, cols[c])
        svg.text(lx + 17, ly, text, size=11)
        lx += w
    ly += 20
    svg.add(f'<path d="M{LEFT + 1},{ly - 4} L{LEFT + 6},{ly - 9} L{LEFT + 11},{ly - 4} L{LEFT + 6},{ly + 1} Z" fill="#fff" '
            f'stroke="#222" stroke-width="1.2"/>')
    svg.text(LEFT + 17, ly, "steady records/s", size=11)
    svg.line(LEFT + 150, ly - 4, LEFT + 180, ly - 4, stroke=MET, width=2, dash="6,3")
    svg.text(LEFT + 186, ly, "goal met", size=11)
    svg.line(LEFT + 260, ly - 4, LEFT + 290, ly - 4, stroke=MISSED, width=2, dash="6,3")
    svg.text(LEFT + 296, ly, "goal missed (threshold drawn over the bar the goal applies to)", size=11)
    top = ly + 14
    for ptitle, subplots, kind, lines, log, unit in panels:
        draw_panel(svg, top, ptitle, subplots, cols, kind, lines, log, unit)
        top += PANEL_H
    met = sum(1 for g in goals if g.get("met") is True)
    missed = sum(1 for g in goals if g.get("met") is False)
    svg.text(LEFT, top + 10, f"goals: {met} met, {missed} missed, {len(goals) - met - missed} not measured "
             f"(the report lists each)", size=12, fill="#444")
    height = top + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}">',
           f"<title>{escape(title + ', ' + sub)}</title>",
           f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#fff"/>']
    out += svg.parts + ["</svg>"]
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
