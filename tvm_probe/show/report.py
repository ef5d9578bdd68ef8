"""Reports of one run: tables as CSV, one self-contained HTML page, the graph as Graphviz DOT/SVG.

Everything here reads the plain data of :class:`~tvm_probe.core.results.Results` (a live Probe or a
dump read back) and, optionally, a :class:`~tvm_probe.comparison.Comparison`; nothing needs TVM.
The HTML page has no external resources: CSS is inline and both plots (error per op along the
model, time per kernel) are SVG drawn here, so the page opens offline and matplotlib is not
needed.  The graph SVG comes from Graphviz's ``dot`` when it is installed, else from
:func:`layout_svg`, a layered drawing of our own.
"""
from __future__ import annotations

import html
import math
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from ..comparison.verdict import Status
from ..core.errors import ProbeError
from ..core.schema import REPORT_FORMATS as FORMATS
# Fill of a graph node by the comparison of the values it outputs or keeps inside.
FILL = {Status.PASSED.value: "#a5d6a7", Status.FIRST_DIVERGENT.value: "#e53935", Status.DIVERGED.value: "#ffb74d",
        Status.UNCHECKED.value: "#e0e0e0"}
_MAX_NAMES = 4     # names listed in a graph box before "+N more"
_MAX_LABEL = 48    # characters of one shortened name
_PLOT_W = 960      # fixed plot width: many values make thin bars, never a wider page


# ------------------------------------------------------------------------------------ tables
def nodes_table(results, comparison=None):
    """DataFrame, one row per graph node: :attr:`Results.nodes` plus ``view`` and ``inputs``.

    ``inputs`` lists the producing node of each argument.  With a ``comparison``, ``status``
    (passed / first divergent / diverged / unchecked: the words of :class:`~tvm_probe.comparison.Status`) and ``max_abs`` (worst error of the node's
    values) say how the node's values compared.
    """
    table = results.nodes  # a fresh DataFrame each time: safe to extend
    table["view"] = [n.is_view for n in results.node_infos]
    table["inputs"] = [[i for i, _ in n.inputs] for n in results.node_infos]
    if comparison is not None:
        status, worst = _node_status(results, comparison)
        table.insert(2, "status", [status[n.index] for n in results.node_infos])
        table["max_abs"] = [worst.get(n.index) for n in results.node_infos]
    return table


def compare_table(comparison):
    """DataFrame, one row per value asked about in source order (:meth:`Comparison.table`).

    Its ``status`` column is passed / diverged / unchecked / dead code, ``served`` says how the
    TVM value was obtained and ``first_divergent`` marks the value where divergence starts.
    """
    table = comparison.table()
    first = comparison.first_divergent
    table["first_divergent"] = table["key"] == first.key if first is not None else False
    return table


def _node_status(results, comparison):
    """Per node index: comparison status, and the worst max abs error of its compared values."""
    by_node: dict[int, list] = {}
    for v in comparison.values if comparison is not None else ():
        serving = results.servings.get(v.key)
        by_node.setdefault(serving.node_index if serving else -1, []).append(v)
    first = comparison.first_divergent if comparison is not None else None
    status, worst = {}, {}
    for n in results.node_infos:
        vals = by_node.get(n.index, [])
        if vals:
            worst[n.index] = max(v.max_abs for v in vals)
        status[n.index] = (Status.FIRST_DIVERGENT if first is not None and any(v is first for v in vals)
                           else Status.DIVERGED if any(not v.passed for v in vals)
                           else Status.PASSED if vals else Status.UNCHECKED).value
    return status, worst


def _flat(table, sep="; "):
    """Lists (names) joined with ``sep``, tuples (shapes) as ``[1, 16, 64]``: one cell, one string."""
    def cell(x):
        if isinstance(x, list):
            return sep.join(str(i) for i in x)
        return str(list(x)) if isinstance(x, tuple) else x
    return table.apply(lambda col: col.map(cell) if col.dtype == object else col)


# ------------------------------------------------------------------------------------ writing
def write_report(folder, results, comparison=None, formats=FORMATS, title="tvm_probe report"):
    """Write the report files into ``folder``; return ``{kind: path}``.

    ``csv``: nodes.csv, sources.csv, compare.csv (with a comparison); ``html``: report.html;
    ``graph``: graph.dot and graph.svg (drawn by Graphviz's ``dot`` when it is on PATH, else by
    :func:`layout_svg`).  Every file is
    written under a temporary name and renamed into place, so none is ever half-written.
    """
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ProbeError(f"unknown report format {unknown[0]!r}: choose from {', '.join(FORMATS)}")
    # Build every text first: an error while building leaves the folder untouched.
    texts: dict[str, tuple[str, str]] = {}
    if "csv" in formats:
        texts["nodes"] = ("nodes.csv", _flat(nodes_table(results, comparison)).to_csv(index=False))
        texts["sources"] = ("sources.csv", _flat(results.sources).to_csv(index=False))
        if comparison is not None:
            texts["compare"] = ("compare.csv", compare_table(comparison).to_csv(index=False))
    dot = to_dot(results, comparison) if {"graph", "html"} & set(formats) else ""
    svg = render_svg(dot) if dot else None  # the page shows the graph too
    if "graph" in formats:
        texts["dot"] = ("graph.dot", dot)
        # Graphviz's drawing, else our own: graph.svg is always written
        texts["svg"] = ("graph.svg", svg or '<?xml version="1.0" encoding="UTF-8"?>\n' + layout_svg(results, comparison) + "\n")
    if "html" in formats:
        texts["html"] = ("report.html", _html_page(results, comparison, svg, title))
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return {kind: _write_atomic(folder / name, text) for kind, (name, text) in texts.items()}
    except OSError as err:
        raise ProbeError(f"cannot write report to '{folder}': {err.strerror or err}") from None


def _write_atomic(path: Path, text: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ------------------------------------------------------------------------------------ graph
def to_dot(results, comparison=None) -> str:
    """The graph as Graphviz DOT: kernels as boxes, model inputs as ellipses, edges = data flow.

    A box shows the kernel symbol, its output source names (shortened; full names in the
    tooltip) and, smaller, the names fused away inside it.  Fill: green = every value passed,
    red = the first divergent op, orange = other diverged, grey = unchecked.
    """
    status, _ = _node_status(results, comparison)
    names = lambda keys: [results.sources_map[k].display_name for k in keys]  # noqa: E731
    lines = ["digraph tvm_probe {", "  rankdir=TB;",
             '  node [fontname="Helvetica", fontsize=10, style=filled, margin="0.1,0.04"];',
             '  edge [color="#616161", arrowsize=0.6];']
    for n in results.node_infos:
        outs = names(k for keys in n.output_keys for k in keys)
        attrs = {"fillcolor": _quote(FILL[status[n.index]]), "tooltip": _quote("\n".join(outs) or n.name)}
        if n.op == "null":
            attrs.update(shape="ellipse", label=_quote(n.name))
        else:
            attrs.update(shape="box", label=_kernel_label(n, outs, names(n.interior_keys)))
            if n.is_view:  # zero-copy reshape: no kernel runs
                attrs["style"] = '"filled,dashed"'
        lines.append(f"  n{n.index} [{', '.join(f'{k}={v}' for k, v in attrs.items())}];")
    edges = dict.fromkeys((i, n.index) for n in results.node_infos for i, _ in n.inputs)
    lines += [f"  n{a} -> n{b};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _kernel_label(node, outs: list[str], interior: list[str]) -> str:
    """An HTML-like label (the only way to mix font sizes in one Graphviz node)."""
    head = f"<B>{_html_text(node.symbol or node.name)}</B>"
    if node.occurrence:
        head += f" #{node.occurrence}"
    rows = [head] + [_html_text(s) for s in _name_lines(outs)]
    if interior:
        small = "<BR/>".join(_html_text(s) for s in _name_lines(interior))
        rows.append(f'<FONT POINT-SIZE="8" COLOR="#424242">{small}</FONT>')
    return "<" + "<BR/>".join(rows) + ">"


def _name_lines(names: list[str]) -> list[str]:
    shown = [short_name(n) for n in names[:_MAX_NAMES]]
    return shown + ([f"+{len(names) - _MAX_NAMES} more"] if len(names) > _MAX_NAMES else [])


def short_name(name: str) -> str:
    """``a/b/encoder/layer_._3/attention/self/MatMul`` → ``layer_._3/…/attention/self/MatMul``.

    Keeps the last 3 path components (2 when those are long) and, when it is cut off, the
    nearest component with a digit (the layer index: every layer has the same tail names).
    """
    parts = name.split("/")
    keep = 3 if len("/".join(parts[-3:])) <= 32 else 2
    if len(parts) > keep:
        cut = len(parts) - keep
        i = next((i for i in reversed(range(cut)) if any(c.isdigit() for c in parts[i])), None)
        head = ([] if i is None else [parts[i]]) + (["…"] if i is None or i < cut - 1 else [])
        name = "/".join(head + parts[cut:])
    return name if len(name) <= _MAX_LABEL else "…" + name[-(_MAX_LABEL - 1):]


def _quote(text: str) -> str:
    """A DOT double-quoted string: backslashes, quotes and line breaks escaped."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n") + '"'


def _html_text(text: str) -> str:
    """Text for a Graphviz HTML-like label (its own entity escaping; no raw line breaks)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;").replace("'", "&#39;").replace("\r", " ").replace("\n", " ")


def write_graph(results, path, comparison=None) -> Path:
    """Write the graph to ``path``: DOT for ``.dot``, SVG for ``.svg`` (Graphviz's when installed, else :func:`layout_svg`)."""
    path = Path(path)
    dot = to_dot(results, comparison)
    if path.suffix == ".svg":
        # without Graphviz, the drawing of our own (the report's fallback)
        text = render_svg(dot) or '<?xml version="1.0" encoding="UTF-8"?>\n' + layout_svg(results, comparison) + "\n"
    elif path.suffix == ".dot":
        text = dot
    else:
        raise ProbeError(f"cannot write a graph as {path.suffix or 'a file without suffix'}: "
                         "use a .dot or .svg file name")
    try:
        return _write_atomic(path, text)
    except OSError as err:
        raise ProbeError(f"cannot write '{path}': {err.strerror or err}") from None


def render_svg(dot_text: str) -> str | None:
    """SVG of ``dot_text`` via ``dot -Tsvg``; None when Graphviz is not installed or fails."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-Tsvg"], input=dot_text.encode("utf-8"), capture_output=True,
                              timeout=300, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        # The graph is an extra: the rest of the report is still worth writing.
        warnings.warn(f"Graphviz could not render the graph: {str(err)[:200]}", stacklevel=2)
        return None
    return proc.stdout.decode("utf-8", "replace")


# ------------------------------------------------------------------------------------ HTML
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em;color:#212121}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #bdbdbd}
.pass{color:#2e7d32;font-weight:bold}.fail{color:#c62828;font-weight:bold}.note{color:#616161}
nav a{margin-right:1em}
table.data{border-collapse:collapse;font-size:12px}
table.data th,table.data td{border:1px solid #e0e0e0;padding:2px 6px;vertical-align:top;
  white-space:pre-line;overflow-wrap:anywhere;max-width:40em}
table.data thead th{position:sticky;top:0;background:#f5f5f5}
.graph{overflow:auto;max-height:60em;border:1px solid #e0e0e0}
"""


def _html_page(results, comparison, graph_svg: str | None, title: str) -> str:
    """The whole page; every piece of text from the model is escaped."""
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>", '<nav><a href="#summary">summary</a><a href="#plots">plots</a>'
            '<a href="#graph">graph</a><a href="#compare">compare</a><a href="#nodes">nodes</a>'
            '<a href="#sources">sources</a></nav>', _summary(results, comparison)]
    body.append('<h2 id="plots">Plots</h2>')
    if comparison is not None:
        body += ["<h3>Max abs error per value, in model order</h3>", _error_plot(comparison)]
    body += ["<h3>Time per kernel call</h3>", _time_plot(results), _top_kernels(results)]
    body.append('<h2 id="graph">Graph</h2>')
    if graph_svg:  # drop the XML prolog and DOCTYPE: only the <svg> element goes inline
        body.append(f'<div class="graph">{graph_svg[graph_svg.find("<svg"):]}</div>')
    else:
        # drawn here: Graphviz is optional
        body.append('<p class="note">Drawn by tvm_probe (Graphviz <code>dot</code> is not installed or failed; '
                    'graph.dot has the DOT text).</p>')
        body.append(f'<div class="graph" id="kernel-graph">{layout_svg(results, comparison)}</div>')
    if comparison is not None:
        body += ['<h2 id="compare">Compared values</h2>', _table(compare_table(comparison))]
    body += ['<h2 id="nodes">Graph nodes</h2>', _table(nodes_table(results, comparison)),
             '<h2 id="sources">Source values</h2>', _table(results.sources)]
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{esc(title)}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def _table(table) -> str:
    return _flat(table, sep="\n").to_html(index=False, escape=True, na_rep="", border=0, classes="data",
                                          float_format=lambda x: f"{x:.4g}")


def _top_kernels(results, top: int = 10) -> str:
    """The kernel symbols that take most time, all their calls together."""
    t = results.nodes
    t = t[(t.op == "tvm_op") & t.time_us.notna()].astype({"time_us": float})
    if t.empty:
        return ""
    g = t.groupby("symbol").agg(calls=("index", "size"), total_us=("time_us", "sum"))
    g = g.sort_values("total_us", ascending=False).head(top).reset_index()
    g["share"] = g.total_us / t.time_us.sum()
    return f"<h3>Top {len(g)} kernels by total time</h3>\n" + _table(g)


def _summary(results, comparison) -> str:
    esc = html.escape
    out = ['<div id="summary">']
    out += [f'<p class="note">{esc(note)}</p>' for note in getattr(results, "notes", [])]  # e.g. no source names
    if comparison is not None:
        out.append(f'<p id="verdict" class="{"pass" if comparison else "fail"}">{esc(comparison.verdict())}</p>')
        first = comparison.first_divergent
        if first is not None:
            serving = results.servings.get(first.key)
            where = f" (graph node {serving.node_index}, {esc(serving.served.value)})" if serving else ""
            out.append(f'<p>First divergent op: <code id="first-divergent">{esc(first.name)}</code>{where}</p>')
    findings = results.findings()
    if findings:
        out.append('<ul id="findings">' + "".join(f"<li>{esc(line)}</li>" for line in findings) + "</ul>")
    served = results.sources["served"].fillna("unknown").value_counts()
    out.append("<p>Source values by how they are served: "
               + ", ".join(f"{esc(str(k))} {v}" for k, v in served.items()) + "</p>")
    kernels = [n for n in results.node_infos if n.op == "tvm_op"]
    times = [n.time_us for n in kernels if n.time_us is not None]
    total = f"total kernel time {sum(times):.1f} µs" if times else "no kernel times recorded"
    out.append(f"<p>{len(results.node_infos)} graph nodes, {len(kernels)} kernel calls, {total}.</p></div>")
    return "\n".join(out)


def _svg(height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_PLOT_W}" height="{height}" '
            f'viewBox="0 0 {_PLOT_W} {height}" role="img" aria-label="{html.escape(label)}" '
            f'font-family="sans-serif" font-size="11">\n' + "\n".join(body) + "\n</svg>")


def _error_plot(comparison, height: int = 280) -> str:
    """Dots: x = source order, y = log10 max abs error; failing red, first divergent marked."""
    values = comparison.values
    if not values:
        return '<p class="note">No values were compared.</p>'
    finite = [math.log10(v.max_abs) for v in values if math.isfinite(v.max_abs) and v.max_abs > 0]
    lo = math.floor(min(finite, default=-7.0)) - 1          # row of exact (zero) errors
    top = max(math.ceil(max(finite, default=0.0)), lo + 2)
    nonfinite = any(not math.isfinite(v.max_abs) for v in values)
    top += nonfinite                                         # row of inf / nan errors
    left, right, up, down = 56, 10, 14, 28
    w, h = _PLOT_W - left - right, height - up - down
    y = lambda d: up + h * (top - d) / (top - lo)            # noqa: E731
    x = lambda i: left + w * (i + 0.5) / len(values)          # noqa: E731
    body = [f'<rect x="{left}" y="{up}" width="{w}" height="{h}" fill="#fafafa" stroke="#bdbdbd"/>']
    for d in range(lo, top + 1, max(1, math.ceil((top - lo) / 8))):
        tick = "0" if d == lo else "inf" if nonfinite and d == top else f"1e{d}"
        body.append(f'<line x1="{left}" x2="{left + w}" y1="{y(d):.1f}" y2="{y(d):.1f}" stroke="#e0e0e0"/>'
                    f'<text x="{left - 4}" y="{y(d) + 4:.1f}" text-anchor="end">{tick}</text>')
    body.append(f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle">'
                f"compared values in source order ({len(values)})</text>")
    for i, v in enumerate(values):
        d = top if not math.isfinite(v.max_abs) else lo if v.max_abs <= 0 else math.log10(v.max_abs)
        colour = "#e53935" if not v.passed else "#43a047"
        tip = html.escape(f"{v.name}: max abs {v.max_abs:.3g} ({v.served}){'' if v.passed else ', FAILED'}")
        if v is comparison.first_divergent:
            flip = x(i) > left + w / 2  # label on the side with room
            body.append(f'<g class="first-divergent"><line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{up}" '
                        f'y2="{up + h}" stroke="#e53935" stroke-dasharray="4 3"/>'
                        f'<text x="{x(i) + (-4 if flip else 4):.1f}" y="{up + 12}" fill="#c62828" '
                        f'text-anchor="{"end" if flip else "start"}">'
                        f"first divergent: {html.escape(short_name(v.name))}</text></g>")
        body.append(f'<circle cx="{x(i):.1f}" cy="{y(d):.1f}" r="2.5" fill="{colour}"><title>{tip}</title></circle>')
    return _svg(height, body, "max abs error per compared value")


def _time_plot(results, height: int = 220) -> str:
    """One bar per kernel call, in call order; hover shows the symbol and its time."""
    calls = [n for n in results.node_infos if n.op == "tvm_op" and n.time_us is not None]
    if not calls:
        return '<p class="note">No kernel times were recorded for this run.</p>'
    total, peak = sum(n.time_us for n in calls) or 1.0, max(n.time_us for n in calls) or 1.0
    left, right, up, down = 56, 10, 14, 28
    w, h = _PLOT_W - left - right, height - up - down
    step = w / len(calls)
    body = [f'<rect x="{left}" y="{up}" width="{w}" height="{h}" fill="#fafafa" stroke="#bdbdbd"/>']
    for frac in (0, 0.5, 1):
        yy = up + h * (1 - frac)
        body.append(f'<text x="{left - 4}" y="{yy + 4:.1f}" text-anchor="end">{peak * frac:.3g} µs</text>')
    body.append(f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle">'
                f"kernel calls in execution order ({len(calls)})</text>")
    for i, n in enumerate(calls):
        bh = h * n.time_us / peak
        tip = html.escape(f"node {n.index} {n.symbol}: {n.time_us:.1f} µs ({100 * n.time_us / total:.1f}%)")
        body.append(f'<rect x="{left + i * step:.2f}" y="{up + h - bh:.1f}" width="{max(step * 0.85, 0.5):.2f}" '
                    f'height="{bh:.1f}" fill="#1e88e5"><title>{tip}</title></rect>')
    return _svg(height, body, "time per kernel call")


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
            + _table(table))


def write_precision_report(folder, search) -> dict[str, Path]:
    """``ranking.csv`` and ``precision.html`` for what ``tvm-probe precision`` found
    (a :class:`tvm_probe.tools.precision.Search`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    csv = _write_atomic(folder / "ranking.csv", search.analysis.table().to_csv(index=False))
    section = precision_ranking_html(search.analysis, search.keep_fp32, search.lines())
    page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>tvm_probe precision</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n<h1>tvm_probe precision</h1>\n{section}\n</body>\n</html>\n")
    return {"ranking": csv, "html": _write_atomic(folder / "precision.html", page)}


# ------------------------------------------------------------------------------------ graph without Graphviz
# A layered drawing of our own (no Graphviz, no JavaScript): kernels in rows by longest path from
# the inputs, ordered in each row by where their producers sit (barycentres, a few sweeps), boxes
# sized to their text, edges as curves.  Enough for a few hundred kernels in a scrolling box.
_BOX_H_LINE, _ROW_GAP, _COL_GAP, _CHAR_W = 13, 34, 14, 6.2


def layout_svg(results, comparison=None) -> str:
    """The kernel graph as SVG drawn in Python (what the report shows when Graphviz is missing).

    Same content as :func:`to_dot`: kernels as boxes (symbol, output source names), model
    inputs as rounded boxes, views dashed, fill by comparison status, full names on hover.
    Every box is a ``<g class="node" id="node-<index>">``.
    """
    status, _ = _node_status(results, comparison)
    nodes = results.node_infos
    preds = {n.index: sorted({i for i, _ in n.inputs if 0 <= i < len(nodes)}) for n in nodes}
    boxes = {n.index: _box(results, n) for n in nodes}
    rank = {}
    for n in nodes:  # node order is execution order: producers come first
        rank[n.index] = max((rank[p] + 1 for p in preds[n.index] if p in rank), default=0)
    rows: dict[int, list[int]] = {}
    for i in sorted(rank, key=lambda i: (rank[i], i)):
        rows.setdefault(rank[i], []).append(i)
    succs: dict[int, list[int]] = {i: [] for i in rank}
    for i, ps in preds.items():
        for p in ps:
            succs[p].append(i)
    x = _place(rows, preds, succs, boxes)
    top, y = 10.0, {}
    for r in sorted(rows):
        height = max(boxes[i][1] for i in rows[r])
        for i in rows[r]:
            y[i] = top + (height - boxes[i][1]) / 2
        top += height + _ROW_GAP
    shift = 10 - min(x[i] - boxes[i][0] / 2 for i in x)
    width = max(x[i] + boxes[i][0] / 2 for i in x) + shift + 10
    body = [('<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#616161"/></marker></defs>')]
    for i, ps in preds.items():
        for p in ps:
            x1, y1 = x[p] + shift, y[p] + boxes[p][1]
            x2, y2 = x[i] + shift, y[i]
            bend = max(18.0, (y2 - y1) / 2)
            body.append(f'<path class="edge" d="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} '
                        f'{x2:.1f},{y2:.1f}" fill="none" stroke="#9e9e9e" marker-end="url(#arrow)"/>')
    for n in nodes:
        w, h, lines, tip = boxes[n.index]
        left, up = x[n.index] + shift - w / 2, y[n.index]
        dash = ' stroke-dasharray="4 2"' if n.is_view else ""
        rx = 10 if n.op == "null" else 3
        body.append(f'<g class="node" id="node-{n.index}" data-status="{html.escape(status[n.index])}">'
                    f"<title>{html.escape(tip)}</title>"
                    f'<rect x="{left:.1f}" y="{up:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" '
                    f'fill="{FILL[status[n.index]]}" stroke="#424242"{dash}/>')
        for k, line in enumerate(lines):
            weight = ' font-weight="bold"' if k == 0 else ""
            body.append(f'<text x="{left + w / 2:.1f}" y="{up + 13 + k * _BOX_H_LINE:.1f}" '
                        f'text-anchor="middle"{weight}>{html.escape(line)}</text>')
        body.append("</g>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{top:.0f}" '
            f'viewBox="0 0 {width:.0f} {top:.0f}" role="img" aria-label="kernel graph" '
            f'font-family="sans-serif" font-size="10">\n' + "\n".join(body) + "\n</svg>")


def _box(results, node) -> tuple[float, float, list[str], str]:
    """Width, height, text lines and tooltip of one node's box."""
    outs = [results.sources_map[k].display_name for keys in node.output_keys for k in keys]
    inside = [results.sources_map[k].display_name for k in node.interior_keys]
    head = node.name if node.op == "null" else (node.symbol or node.name)
    if node.occurrence:
        head += f" #{node.occurrence}"
    lines = [_clip(head)] + [_clip(s) for s in _name_lines(outs)[:3]]
    if inside:
        lines.append(f"+{len(inside)} fused inside")
    tip = "\n".join([f"node {node.index}: {head}", *outs, *(f"inside: {s}" for s in inside)])
    width = min(max(90.0, _CHAR_W * max(len(s) for s in lines) + 12), 330.0)
    return width, 6 + _BOX_H_LINE * len(lines), lines, tip


def _clip(text: str, limit: int = 52) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _place(rows, preds, succs, boxes) -> dict[int, float]:
    """Centre x of every node: rows ordered by barycentre, then packed without overlap."""
    order = {r: list(ids) for r, ids in rows.items()}
    x = {}

    def pack(r):
        pos = 0.0
        for i in order[r]:
            x[i] = pos + boxes[i][0] / 2
            pos += boxes[i][0] + _COL_GAP

    for r in sorted(order):
        pack(r)
    for sweep in range(4):  # down (by producers), up (by consumers), twice
        ranks = sorted(order) if sweep % 2 == 0 else sorted(order, reverse=True)
        for r in ranks:
            nbrs = preds if sweep % 2 == 0 else succs
            want = {i: (sum(x[j] for j in nbrs[i]) / len(nbrs[i]) if nbrs[i] else x[i]) for i in order[r]}
            order[r].sort(key=lambda i: want[i])
            _spread(order[r], want, boxes, x)
    return x


def _spread(row: list[int], want: dict[int, float], boxes, x: dict[int, float]) -> None:
    """Put each box of ``row`` (in order) as near its wanted centre as the ones before it allow,
    then shift the whole row back so that it is centred on what it wanted on average."""
    prev_right = -math.inf
    for i in row:
        half = boxes[i][0] / 2
        x[i] = max(want[i], prev_right + _COL_GAP + half)
        prev_right = x[i] + half
    offset = sum(x[i] - want[i] for i in row) / len(row)
    for i in row:
        x[i] -= offset
