"""The kernel graph of a run: Graphviz DOT (drawn by ``dot`` when it is installed) or a layered
SVG drawing of our own; boxes filled by how the values they hold compared.

Reads the plain data of :class:`~tvm_probe.core.results.Results` and, optionally, a
:class:`~tvm_probe.comparison.Comparison`; nothing needs TVM.
"""
from __future__ import annotations

import html
import math
import shutil
import subprocess
import warnings

from ..comparison.verdict import Status

# Fill of a graph node by the comparison of the values it outputs or keeps inside.
FILL = {Status.PASSED.value: "#a5d6a7", Status.FIRST_DIVERGENT.value: "#e53935", Status.DIVERGED.value: "#ffb74d",
        Status.UNCHECKED.value: "#e0e0e0"}
_MAX_NAMES = 4     # names listed in a graph box before "+N more"
_MAX_LABEL = 48    # characters of one shortened name


def node_status(results, comparison):
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



def to_dot(results, comparison=None) -> str:
    """The graph as Graphviz DOT: kernels as boxes, model inputs as ellipses, edges = data flow.

    A box shows the kernel symbol, its first output source names (shortened; every name in the
    tooltip) and, smaller, how many values are fused away inside it.  Fill: green = every value passed,
    red = the first divergent op, orange = other diverged, grey = unchecked.
    """
    status, _ = node_status(results, comparison)
    names = lambda keys: [results.sources_map[k].display_name for k in keys]  # noqa: E731
    lines = ["digraph tvm_probe {", "  rankdir=TB; ranksep=0.3; nodesep=0.2;",
             '  node [fontname="Helvetica", fontsize=10, style=filled, margin="0.1,0.04"];',
             '  edge [color="#616161", arrowsize=0.6];']
    for n in results.node_infos:
        outs = names(k for keys in n.output_keys for k in keys)
        inside = names(n.interior_keys)
        tip = "\n".join([*outs, *(f"inside: {s}" for s in inside)]) or n.name
        attrs = {"fillcolor": _quote(FILL[status[n.index]]), "tooltip": _quote(tip)}
        if n.op == "null":
            attrs.update(shape="ellipse", label=_quote(n.name))
        else:
            attrs.update(shape="box", label=_kernel_label(n, outs, inside))
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
    rows = [head] + [_html_text(s) for s in _name_lines(outs, 2)]
    if interior:
        rows.append(f'<FONT POINT-SIZE="8" COLOR="#424242">+{len(interior)} fused inside</FONT>')
    return "<" + "<BR/>".join(rows) + ">"


def _name_lines(names: list[str], most: int = _MAX_NAMES) -> list[str]:
    shown = [short_name(n) for n in names[:most]]
    return shown + ([f"+{len(names) - most} more"] if len(names) > most else [])


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


# ------------------------------------------------------------------------------------ graph without Graphviz
# A layered drawing of our own (no Graphviz, no JavaScript): kernels in rows by longest path from
# the inputs, ordered in each row by where their producers sit (barycentres, a few sweeps), boxes
# sized to their text, edges as curves.  Enough for a few hundred kernels in a scrolling box.
_BOX_H_LINE, _ROW_GAP, _COL_GAP, _CHAR_W = 13, 34, 14, 6.2
_BOLD_W = 6.9  # the first line (the symbol) is bold: wider


def layout_svg(results, comparison=None) -> str:
    """The kernel graph as SVG drawn in Python (what the report shows when Graphviz is missing).

    Same content as :func:`to_dot`: kernels as boxes (symbol, output source names), model
    inputs as rounded boxes, views dashed, fill by comparison status, full names on hover.
    Every box is a ``<g class="node" id="node-<index>">``.
    """
    status, _ = node_status(results, comparison)
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
    width = max(90.0, _BOLD_W * len(lines[0]) + 12, _CHAR_W * max(len(s) for s in lines) + 12)
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
