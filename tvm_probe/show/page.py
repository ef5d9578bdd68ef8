"""The report as one self-contained HTML page, in the order a reader asks: the verdict, what
failed (the first divergent op, the values out of tolerance), the plots, the kernel graph, the
kernels that take the time, TVM's warnings, then every table collapsed.

No external resources and no script: CSS inline, plots and graph inline SVG, collapsing by
``<details>``.  Tables show the columns a reader needs, failures first; each keeps its other
columns behind a toggle (the CSV files hold them all).  Every text from the model is escaped.
"""
from __future__ import annotations

import html
import math
import re

from ..comparison.verdict import Status
from .graph import FILL, layout_svg, short_name
from .plots import error_caption, error_plot, format_time, time_plot
from .tables import compare_table, flat, nodes_table

SHOWN_FAILURES = 10   # values out of tolerance listed before "the other N"
# The graph's size on the page: Graphviz writes points (4/3 px); shrunk to fit the page's width,
# but not below a scale where its text stays readable (then its box scrolls).
GRAPH_PX, GRAPH_FIT_W, GRAPH_GAP, GRAPH_MIN_SCALE, GRAPH_MAX_H = 4 / 3, 1220.0, 10.0, 0.45, 760.0

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.2em 1.5em;color:#212121;
  font-size:14px;max-width:1240px}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .5em;border-bottom:1px solid #bdbdbd}
h3{font-size:1em;margin:1em 0 .4em}
.meta,.note{color:#616161}.meta{margin:0 0 .8em}
nav a{margin-right:1em}
.verdict{padding:.6em .9em;border-radius:4px;border-left:6px solid;font-size:1.05em;margin:.6em 0}
.verdict.pass{background:#e8f5e9;border-color:#2e7d32}.verdict.fail{background:#ffebee;border-color:#c62828}
.verdict.none{background:#f5f5f5;border-color:#9e9e9e}
.badge{font-weight:bold;margin-right:.5em}.pass .badge{color:#2e7d32}.fail .badge{color:#c62828}
table.data{border-collapse:collapse;font-size:12px;margin:.3em 0}
table.data th,table.data td{border:1px solid #e0e0e0;padding:2px 6px;vertical-align:top;text-align:left;
  white-space:normal;overflow-wrap:normal;word-break:normal}
table.data td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.data td.word{white-space:nowrap}
table.data td.name{min-width:16em;max-width:44em}
table.data th{background:#f5f5f5;white-space:nowrap}
tr.first-divergent td{background:#ffcdd2}tr.diverged td{background:#fff3e0}tr.unchecked td{background:#f5f5f5}
details{margin:.4em 0}summary{cursor:pointer;color:#1565c0}details.raw summary{font-size:12px}
details.raw>div{overflow-x:auto}details.raw td{white-space:nowrap}
.graph{border:1px solid #e0e0e0;padding:4px;overflow:auto;max-height:92vh}
.graph-columns{display:flex;gap:10px;align-items:flex-start}.graph-column{flex:none;border-left:1px dashed #e0e0e0}
.legend{display:flex;flex-wrap:wrap;gap:.4em 1.2em;font-size:12px;margin:.3em 0}
.legend span{display:inline-flex;align-items:center;gap:.35em;white-space:nowrap}
.swatch{display:inline-block;width:1.4em;height:.9em;border:1px solid #424242}
.swatch.view{border-style:dashed;background:#fff}.swatch.input{border-radius:.45em;background:#fff}
svg.plot{max-width:100%;height:auto}
.caption{font-size:12px;margin:.2em 0 .8em;max-width:960px}
code{font-size:12px;overflow-wrap:normal}
"""


# ------------------------------------------------------------------------------------ cells
def name_html(text) -> str:
    """A source or kernel name, escaped, that may wrap after ``/``, ``_`` or a ``.`` of a module
    path (``layers.0.mlp``, not ``0.0001``), never inside a word: TVM's fused kernel names run to
    over 100 characters of ``op_op_op`` with no other place to break, and a cell that cannot wrap
    spills over its neighbours (the table caps the name column's width)."""
    return re.sub(r"(/|_|(?<=[A-Za-z_])\.|\.(?=[A-Za-z_]))", r"\1<wbr>", html.escape(str(text)))


def format_error(x) -> str:
    """An error in three significant digits; ``""`` when there is none (not compared)."""
    if x is None:
        return ""
    return "0" if x == 0 else f"{x:.3g}"


def _node_err(x) -> str:
    return "" if x is None or x != x else format_error(x)  # NaN in a node row: no value of it compared


def _number(x, spec: str = ".3g") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def html_table(rows: list[dict], columns: list[tuple], row_class=None, table_id: str = "") -> str:
    """A table of ``rows`` with ``columns`` = (header, key, how, format); how: ``name`` (wraps
    after ``/`` or ``_``), ``num`` (right-aligned), ``word`` (a short term kept on one line) or ``text``."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h, *_ in columns)
    body = []
    for row in rows:
        cells = []
        for _, key, how, fmt in columns:
            value = row.get(key)
            text = fmt(value) if fmt else ("" if value is None else str(value))
            cell = name_html(text) if how == "name" else html.escape(text)
            cells.append(f'<td class="{how}">{cell}</td>')
        cls = f' class="{row_class(row)}"' if row_class else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    ident = f' id="{table_id}"' if table_id else ""
    return (f'<table class="data"{ident}><thead><tr>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(body) + "\n</tbody></table>")


def raw_table(table) -> str:
    """Every column of a DataFrame, as pandas writes it (the CSV's content)."""
    return flat(table, sep="\n").to_html(index=False, escape=True, na_rep="", border=0, classes="data",
                                         float_format=lambda x: f"{x:.4g}")


def _all_columns(table) -> str:
    return (f'<details class="raw"><summary>all {len(table.columns)} columns</summary>\n'
            f"<div>{raw_table(table)}</div>\n</details>")


# ------------------------------------------------------------------------------------ the page
def html_page(results, comparison, graph_svg: str | None, title: str) -> str:
    """The whole page (see the module docstring)."""
    esc = html.escape
    sections = [_header(results, title), _verdict(results, comparison)]
    if comparison is not None and (comparison.failed or comparison.unchecked):
        sections.append(_what_failed(results, comparison))
    sections += [_plots(results, comparison), _graph(results, comparison, graph_svg), _top_kernels(results),
                 _build_notes(results), _tables(results, comparison)]
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{esc(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n" + "\n".join(s for s in sections if s) + "\n</body>\n</html>\n")


def _header(results, title: str) -> str:
    kernels = [n for n in results.node_infos if n.op == "tvm_op"]
    times = [n.time_us for n in kernels if n.time_us is not None]
    served = results.sources["served"].fillna("unknown").value_counts()
    facts = [f"{len(results.node_infos)} graph nodes", f"{len(kernels)} kernel calls",
             f"kernel time {format_time(sum(times))}" if times else "no kernel times recorded",
             "source values: " + ", ".join(f"{k} {v}" for k, v in served.items())]
    return (f"<h1>{html.escape(title)}</h1>\n<p class=\"meta\">{html.escape(' · '.join(facts))}</p>\n"
            '<nav><a href="#verdict">verdict</a><a href="#plots">plots</a><a href="#graph">graph</a>'
            '<a href="#kernels">kernels</a><a href="#warnings">warnings</a><a href="#tables">tables</a></nav>')


def _verdict(results, comparison) -> str:
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in getattr(results, "notes", []))
    if comparison is None:
        return ('<div id="verdict" class="verdict none"><span class="badge">NOT COMPARED</span>this report shows '
                "the run alone: no reference was compared (tvm-probe compare DUMP -o DIR compares it)</div>" + notes)
    text = comparison.verdict()
    word = "PASS" if comparison else "FAIL"
    text = text.removeprefix("FAIL: ")
    return (f'<div id="verdict" class="verdict {"pass" if comparison else "fail"}"><span class="badge">{word}</span>'
            f"{name_html(text)}</div>" + notes)


def _where(results, key: str) -> str:
    """``graph node 5: fused_mean_kernel#0`` for the node that serves ``key``."""
    serving = results.servings.get(key)
    if serving is None or not 0 <= serving.node_index < len(results.node_infos):
        return ""
    node = results.node_infos[serving.node_index]
    kernel = f": {node.symbol}#{node.occurrence}" if node.op == "tvm_op" and node.symbol else ""
    return f"graph node {node.index}{kernel}"


def _status(comparison, v) -> str:
    return (Status.FIRST_DIVERGENT if v is comparison.first_divergent else
            Status.PASSED if v.passed else Status.DIVERGED).value


def _value_rows(comparison) -> list[dict]:
    """Every value asked about, failures first (the first divergent on top), then unchecked,
    dead code and passed, each group in source order."""
    rows = [{**v.__dict__, "order": i, "status": _status(comparison, v)} for i, v in enumerate(comparison.values)]
    rows += [{"key": k, "name": comparison.names.get(k, k), "status": Status.UNCHECKED.value, "note": why}
             for k, why in comparison.unchecked.items()]
    rows += [{"key": k, "name": name, "status": Status.DEAD.value, "note": "no model output depends on it"}
             for k, name in comparison.dead.items()]
    rank = {Status.FIRST_DIVERGENT.value: 0, Status.DIVERGED.value: 1, Status.UNCHECKED.value: 2,
            Status.DEAD.value: 3, Status.PASSED.value: 4}
    return sorted(rows, key=lambda r: rank[r["status"]])  # stable: source order inside each group


VALUE_COLUMNS = [("#", "order", "num", None), ("status", "status", "word", None), ("name", "name", "name", None),
                 ("served", "served", "word", None), ("dtype", "dtype", "word", None),
                 ("max abs", "max_abs", "num", format_error), ("max rel", "max_rel", "num", format_error),
                 ("tolerance", "tolerance", "word", None), ("cosine", "cosine", "num", lambda x: _number(x, ".6g")),
                 ("note", "note", "text", None)]


def _with_notes(columns: list[tuple], rows: list[dict]) -> list[tuple]:
    """``columns`` without the note column when no row has a note."""
    return columns if any(r.get("note") for r in rows) else [c for c in columns if c[1] != "note"]


def _row_class(row) -> str:
    return row["status"].replace(" ", "-")


def _what_failed(results, comparison) -> str:
    out = ['<section id="failed"><h2>What failed</h2>']
    first = comparison.first_divergent
    if first is not None:
        facts = {"served": first.served, "where": _where(results, first.key), "max_abs": first.max_abs,
                 "max_rel": first.max_rel, "tolerance": first.tolerance, "cosine": first.cosine, "note": first.note,
                 "dtype": first.dtype}
        columns = [("served", "served", "word", None), ("where", "where", "name", None)] + VALUE_COLUMNS[4:]
        out.append(f'<p>First divergent op: <code id="first-divergent">{name_html(first.name)}</code></p>'
                   + html_table([facts], _with_notes(columns, [facts]), table_id="first-divergent-facts"))
    rows = [r for r in _value_rows(comparison) if r["status"] in (Status.FIRST_DIVERGENT.value, Status.DIVERGED.value,
                                                                    Status.UNCHECKED.value)]
    bad = [r for r in rows if r["status"] != Status.UNCHECKED.value]
    if bad:
        out.append(f"<h3>{len(bad)} of {len(comparison.values)} compared values out of tolerance</h3>")
    unchecked = len(rows) - len(bad)
    shown, rest = rows[:SHOWN_FAILURES], rows[SHOWN_FAILURES:]
    columns = _with_notes(VALUE_COLUMNS, rows)
    out.append(html_table(shown, columns, _row_class, "failures"))
    if rest:
        out.append(f"<details><summary>the other {len(rest)}</summary>{html_table(rest, columns, _row_class)}</details>")
    if unchecked:
        out.append(f'<p class="note">{unchecked} value{"s" if unchecked > 1 else ""} asked for could not be checked '
                   "(status unchecked, with why).</p>")
    return "\n".join(out) + "</section>"


def _plots(results, comparison) -> str:
    out = ['<section id="plots"><h2>Plots</h2>']
    if comparison is not None:
        out += ["<h3>Error over tolerance per value, in model order</h3>", error_plot(comparison),
                f'<p class="note caption" id="error-plot-caption">{html.escape(error_caption(comparison))}</p>']
    out += ["<h3>Time per kernel call</h3>", time_plot(results)]
    return "\n".join(out) + "</section>"


def _legend() -> str:
    swatches = "".join(f'<span><i class="swatch" style="background:{colour}"></i>{html.escape(status)}</span>'
                       for status, colour in FILL.items())
    return (f'<div class="legend" id="graph-legend">{swatches}'
            '<span><i class="swatch input"></i>model input</span>'
            '<span><i class="swatch view"></i>view (zero-copy reshape: no kernel runs)</span></div>')


def _graph(results, comparison, graph_svg: str | None) -> str:
    out = ['<section id="graph"><h2>Kernel graph</h2>',
           '<p class="note">Each box is a kernel call: its symbol, the first source values it outputs and how many '
           "it keeps fused inside, filled by how those values compared; hover a box for every name.</p>",
           _legend()]
    if graph_svg:  # drop the XML prolog and DOCTYPE: only the <svg> element goes inline
        svg = graph_svg[graph_svg.find("<svg"):]
    else:  # drawn here: Graphviz is optional
        out.append('<p class="note">Drawn by tvm_probe (Graphviz <code>dot</code> is not installed or failed; '
                   "graph.dot has the DOT text).</p>")
        svg = layout_svg(results, comparison)
    out.append(f'<div class="graph" id="kernel-graph">{_fitted(svg)}</div>')
    return "\n".join(out) + "</section>"


def _fitted(svg: str) -> str:
    """The graph laid out to be seen whole: its top-to-bottom drawing cut between rows of boxes
    into side-by-side columns (each an SVG ``<use>`` of one drawing), as many as the page's
    width allows at a readable scale; the box scrolls only for a graph too big for that."""
    root = re.match(r"<svg\b[^>]*>", svg)
    box = re.search(r'viewBox="([-\d.]+) ([-\d.]+) ([\d.]+) ([\d.]+)"', root.group(0)) if root else None
    if box is None:
        return svg
    x0, y0, w, h = map(float, box.groups())
    unit = GRAPH_PX if re.search(r' width="[\d.]+pt"', root.group(0)) else 1.0
    columns, scale = _columns(w * unit, h * unit)
    cuts = _cuts(_node_spans(svg), y0, h, columns)
    inner = svg[root.end():svg.rfind("</svg>")]
    fonts = " ".join(re.findall(r'font-(?:family|size)="[^"]*"', root.group(0)))  # the root's, for the clones
    out = ['<svg class="graph-source" width="0" height="0" style="position:absolute" aria-hidden="true">'
           f'<g id="kernel-graph-body" {fonts}>{inner}</g></svg><div class="graph-columns">']
    for top, bottom in zip(cuts, cuts[1:]):
        out.append(f'<svg class="graph-column" xmlns="http://www.w3.org/2000/svg" viewBox="{x0:g} {top:.1f} {w:g} '
                   f'{bottom - top:.1f}" style="width:{w * unit * scale:.0f}px;height:{(bottom - top) * unit * scale:.0f}px" '
                   'role="img" aria-label="kernel graph"><use href="#kernel-graph-body"/></svg>')
    return "".join(out) + "</div>"


def _columns(width: float, height: float) -> tuple[int, float]:
    """How many columns and at what scale: the fewest that fit a window's height, each column
    at least GRAPH_MIN_SCALE (else one column at that scale, and the box scrolls)."""
    best = (1, max(GRAPH_MIN_SCALE, min(1.0, GRAPH_FIT_W / width)))
    for n in range(1, 9):
        scale = min(1.0, (GRAPH_FIT_W - GRAPH_GAP * (n - 1)) / (n * width))
        if scale < GRAPH_MIN_SCALE:
            break
        best = (n, scale)
        if 1.15 * height * scale / n <= GRAPH_MAX_H:  # cuts fall between rows: columns differ a little
            break
    return best


def _node_spans(svg: str) -> list[tuple[float, float]]:
    """The vertical extent of every box, in the drawing's own coordinates (Graphviz draws inside a
    translated group; our own layout does not)."""
    shift = re.search(r'class="graph" transform="[^"]*translate\(([-\d.]+) ([-\d.]+)\)', svg)
    dy = float(shift.group(2)) if shift else 0.0
    spans = []
    for group in re.findall(r'class="node".*?</g>', svg, re.S):
        ys = [float(y) for y in re.findall(r"[-\d.]+,([-\d.]+)", " ".join(re.findall(r'points="([^"]*)"', group)))]
        for cy, ry in re.findall(r'<ellipse[^>]* cy="([-\d.]+)" rx="[-\d.]+" ry="([-\d.]+)"', group):
            ys += [float(cy) - float(ry), float(cy) + float(ry)]
        for y, hh in re.findall(r'<rect[^>]* y="([-\d.]+)" width="[\d.]+" height="([\d.]+)"', group):
            ys += [float(y), float(y) + float(hh)]
        if ys:
            spans.append((min(ys) + dy, max(ys) + dy))
    return sorted(spans)


def _cuts(spans, top: float, height: float, columns: int) -> list[float]:
    """``columns + 1`` heights: the top, a cut in the gap between rows nearest each equal share, the bottom."""
    gaps, reach = [], top
    for a, b in spans:
        if a > reach:
            gaps.append((reach + a) / 2)
        reach = max(reach, b)
    cuts = [top]
    for k in range(1, columns):
        want = top + height * k / columns
        cut = min((g for g in gaps if g > cuts[-1] + 1), key=lambda g: abs(g - want), default=None)
        if cut is not None and cut < top + height:
            cuts.append(cut)
    return cuts + [top + height]


def _top_kernels(results, top: int = 10) -> str:
    """The kernel symbols that take most time, all their calls together."""
    t = results.nodes
    t = t[(t.op == "tvm_op") & t.time_us.notna()].astype({"time_us": float})
    if t.empty:
        return ""
    g = t.groupby("symbol").agg(calls=("index", "size"), total_us=("time_us", "sum"))
    g = g.sort_values("total_us", ascending=False).head(top).reset_index()
    g["share"] = g.total_us / t.time_us.sum()
    columns = [("kernel", "symbol", "name", None), ("calls", "calls", "num", None),
               ("total time", "total_us", "num", format_time), ("share", "share", "num", lambda x: f"{100 * x:.1f} %")]
    return (f'<section id="kernels"><h2>Top {len(g)} kernels by total time</h2>\n'
            + html_table(g.to_dict("records"), columns) + "</section>")


def _build_notes(results) -> str:
    """Import fixes and TVM's compile warnings, each message once with the ops it concerns."""
    fixes = [{"fix": f.name, "count": len(f.sources), "ops": ", ".join(f.sources), "does": f.does}
             for f in getattr(results, "import_fixes", [])]
    grouped: dict[str, dict] = {}
    for w in getattr(results, "compile_warnings", []):
        g = grouped.setdefault(w.message, {"message": w.message, "where": [], "keys": [], "times": 0})
        g["times"] += 1
        g["where"] += [w.where] if w.where and w.where not in g["where"] else []
        g["keys"] += [k for k in w.keys if k not in g["keys"]]
    if not fixes and not grouped:
        return '<section id="warnings"><h2>Build notes</h2><p class="note">No import fix was needed; TVM printed no warning.</p></section>'
    out = ['<section id="warnings"><h2>Build notes</h2>']
    if grouped:
        rows = [{**g, "where": ", ".join(g["where"]) or "", "count": len(g["keys"]) or "",
                 "ops": _ops(results, g["keys"]) or "not tied to a source op"} for g in grouped.values()]
        columns = [("TVM says", "message", "text", None), ("printed by", "where", "text", None),
                   ("ops", "count", "num", None), ("source ops", "ops", "name", None)]
        n = sum(g["times"] for g in grouped.values())
        out.append(f"<details open><summary>TVM compile warnings: {len(grouped)} message{'s' * (len(grouped) > 1)}, "
                   f"{n} time{'s' * (n > 1)}</summary>{html_table(rows, columns, table_id='compile-warnings')}</details>")
    if fixes:
        columns = [("import fix", "fix", "text", None), ("ops", "count", "num", None),
                   ("source ops", "ops", "name", None), ("what it does", "does", "text", None)]
        out.append(f"<details open><summary>import fixes: {len(fixes)}</summary>{html_table(fixes, columns)}</details>")
    return "\n".join(out) + "</section>"


def _ops(results, keys) -> str:
    sources = results.sources_map
    return ", ".join(f"{sources[k].display_name} ({sources[k].op_type})" if k in sources else k for k in keys)


# ------------------------------------------------------------------------------------ tables
def _tables(results, comparison) -> str:
    out = ['<section id="tables"><h2>Tables</h2>']
    if comparison is not None:
        rows = _value_rows(comparison)
        passed = sum(r["status"] == Status.PASSED.value for r in rows)
        out.append(f'<details id="compare"><summary>Compared values: {len(rows)} ({passed} passed), failures first'
                   f"</summary>{html_table(rows, _with_notes(VALUE_COLUMNS, rows), _row_class, 'compared')}\n"
                   f"{_all_columns(compare_table(comparison))}</details>")
    nodes = nodes_table(results, comparison)
    out.append(f'<details id="nodes"><summary>Graph nodes: {len(nodes)}</summary>'
               f"{html_table(_node_rows(nodes), _node_columns(comparison is not None), _row_class if comparison else None)}\n"
               f"{_all_columns(nodes)}</details>")
    sources = results.sources
    order = sources.assign(_p=sources["kind"].isin(["param", "constant"])).sort_values("_p", kind="stable")
    columns = [("name", "name", "name", None), ("op type", "op_type", "text", None), ("kind", "kind", "text", None),
               ("served", "served", "text", None), ("node", "node", "num", None), ("shape", "shape", "text", None),
               ("dtype", "dtype", "text", None)]
    out.append(f'<details id="sources"><summary>Source values: {len(sources)}, weights last</summary>'
               f"{html_table(flat(order).to_dict('records'), columns)}\n{_all_columns(sources)}</details>")
    return "\n".join(out) + "</section>"


def _node_rows(nodes) -> list[dict]:
    rows = []
    for r in flat(nodes).to_dict("records"):
        names = [s for s in str(r.get("source_names") or "").split("; ") if s]
        r["outputs"] = "; ".join(short_name(s) for s in names[:3]) + (f"; +{len(names) - 3} more" if len(names) > 3 else "")
        r["kernel"] = f"{r['symbol']}#{r['occurrence']}" if r.get("op") == "tvm_op" else f"input {r['name']}"
        r.setdefault("status", "")
        rows.append(r)
    return rows


def _node_columns(compared: bool) -> list[tuple]:
    columns = [("node", "index", "num", None), ("kernel", "kernel", "name", None),
               ("outputs", "outputs", "name", None), ("shape", "shape", "text", None), ("dtype", "dtype", "text", None),
               ("time", "time_us", "num", format_time),
               ("share", "time_share", "num", lambda x: "" if x is None or x != x else f"{100 * x:.1f} %")]
    if compared:
        columns[2:2] = [("status", "status", "text", None)]
        columns.append(("max abs", "max_abs", "num", _node_err))
    return columns


# ------------------------------------------------------------------ reduced precision (precision.py)
def precision_ranking_html(analysis, keep_fp32=(), lines=()) -> str:
    """An HTML section: the source ops of a reduced-precision build ranked by the error each adds
    by itself (local), beside the error it inherits and its inf/NaN/flushed-to-zero counts; the
    ops kept in fp32 marked.  ``analysis`` is a :class:`tvm_probe.tools.precision.PrecisionAnalysis`."""
    esc = html.escape
    table = analysis.table()
    table.insert(1, "keep_fp32", table["name"].isin(list(keep_fp32)))
    head = "".join(f"<p>{esc(line)}</p>" for line in lines)
    return (f'<h2 id="precision">Ops ranked by local error in {esc(analysis.dtype)}</h2>\n{head}\n'
            '<p class="note">local: the op alone, fed the fp32 run\'s values in the reduced dtypes, against the same '
            "op in fp32 on those values; inherited: the reduced build's value against the fp32 build's (errors "
            "normalized by the fp32 value's largest magnitude; inf when the op creates inf or NaN).</p>\n"
            + raw_table(table))
