"""Reports of one run: tables as CSV, one self-contained HTML page, the graph as Graphviz DOT/SVG.

Everything here reads the plain data of :class:`~tvm_probe.results.Results` (a live Probe or a
dump read back) and, optionally, a :class:`~tvm_probe.compare.Comparison`; nothing needs TVM.
The HTML page has no external resources: CSS is inline and both plots (error per op along the
model, time per kernel) are SVG drawn here, so the page opens offline and matplotlib is not
needed.  The graph SVG comes from Graphviz's ``dot`` when it is installed.
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

from .errors import ProbeError
from .schema import REPORT_FORMATS as FORMATS
# Fill of a graph node by the comparison of the values it outputs or keeps inside.
FILL = {"passed": "#a5d6a7", "divergent": "#e53935", "failing": "#ffb74d", "not compared": "#e0e0e0"}
_MAX_NAMES = 4     # names listed in a graph box before "+N more"
_MAX_LABEL = 48    # characters of one shortened name
_PLOT_W = 960      # fixed plot width: many values make thin bars, never a wider page


# ------------------------------------------------------------------------------------ tables
def nodes_table(results, comparison=None):
    """DataFrame, one row per graph node: :attr:`Results.nodes` plus ``view`` and ``inputs``.

    ``inputs`` lists the producing node of each argument.  With a ``comparison``, ``status``
    (passed / divergent / failing / not compared) and ``max_abs`` (worst error of the node's
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
        value = results.sources_map.values.get(v.key)
        by_node.setdefault(value.node_index if value else -1, []).append(v)
    first = comparison.first_divergent if comparison is not None else None
    status, worst = {}, {}
    for n in results.node_infos:
        vals = by_node.get(n.index, [])
        if vals:
            worst[n.index] = max(v.max_abs for v in vals)
        status[n.index] = ("divergent" if first is not None and any(v is first for v in vals)
                           else "failing" if any(not v.passed for v in vals)
                           else "passed" if vals else "not compared")
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
    ``graph``: graph.dot, and graph.svg when Graphviz's ``dot`` is on PATH.  Every file is
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
        if svg is not None:
            texts["svg"] = ("graph.svg", svg)
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
    red = the first divergent op, orange = other failing, grey = not compared.
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
    """Write the graph to ``path``: DOT for ``.dot``, SVG (needs Graphviz) for ``.svg``."""
    path = Path(path)
    dot = to_dot(results, comparison)
    if path.suffix == ".svg":
        text = render_svg(dot)
        if text is None:
            raise ProbeError("writing SVG needs Graphviz's 'dot' program: install graphviz or write a .dot file")
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
        body.append('<p class="note">No picture: Graphviz <code>dot</code> is missing or failed; see graph.dot.</p>')
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
            value = results.sources_map.values.get(first.key)
            where = f" (graph node {value.node_index}, {esc(value.served.value)})" if value and value.served else ""
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
