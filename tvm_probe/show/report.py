"""Reports of one run: tables as CSV, one self-contained HTML page, the graph as Graphviz DOT/SVG.

Everything here reads the plain data of :class:`~tvm_probe.core.results.Results` (a live Probe or a
dump read back) and, optionally, a :class:`~tvm_probe.comparison.Comparison`; nothing needs TVM.
The tables are :mod:`.tables`', the page :mod:`.page` (its plots :mod:`.plots`: SVG drawn here, so
the page opens offline and matplotlib is not needed), the graph :mod:`.graph` (Graphviz's ``dot``
when it is installed, else a layered drawing of our own).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..core.errors import ProbeError
from ..core.schema import REPORT_FORMATS as FORMATS
from .graph import FILL, layout_svg, render_svg, short_name, to_dot
from .page import CSS, html_page, precision_ranking_html
from .tables import compare_table, flat, nodes_table

__all__ = ["FILL", "FORMATS", "compare_table", "layout_svg", "nodes_table", "precision_ranking_html", "render_svg",
           "short_name", "to_dot", "write_graph", "write_precision_report", "write_report"]


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
        texts["nodes"] = ("nodes.csv", flat(nodes_table(results, comparison)).to_csv(index=False))
        texts["sources"] = ("sources.csv", flat(results.sources).to_csv(index=False))
        if comparison is not None:
            texts["compare"] = ("compare.csv", compare_table(comparison).to_csv(index=False))
    dot = to_dot(results, comparison) if {"graph", "html"} & set(formats) else ""
    svg = render_svg(dot) if dot else None  # the page shows the graph too
    if "graph" in formats:
        texts["dot"] = ("graph.dot", dot)
        # Graphviz's drawing, else our own: graph.svg is always written
        texts["svg"] = ("graph.svg", svg or '<?xml version="1.0" encoding="UTF-8"?>\n' + layout_svg(results, comparison) + "\n")
    if "html" in formats:
        texts["html"] = ("report.html", html_page(results, comparison, svg, title))
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return {kind: write_atomic(folder / name, text) for kind, (name, text) in texts.items()}
    except OSError as err:
        raise ProbeError(f"cannot write report to '{folder}': {err.strerror or err}") from None


def write_atomic(path: Path, text: str) -> Path:
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
        return write_atomic(path, text)
    except OSError as err:
        raise ProbeError(f"cannot write '{path}': {err.strerror or err}") from None



def write_precision_report(folder, search) -> dict[str, Path]:
    """``ranking.csv`` and ``precision.html`` for what ``tvm-probe precision`` found
    (a :class:`tvm_probe.tools.precision.Search`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    csv = write_atomic(folder / "ranking.csv", search.analysis.table().to_csv(index=False))
    section = precision_ranking_html(search.analysis, search.keep_fp32, search.lines())
    page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>tvm_probe precision</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<h1>tvm_probe precision</h1>\n{section}\n</body>\n</html>\n")
    return {"ranking": csv, "html": write_atomic(folder / "precision.html", page)}
