"""The report of an LLM generation compared step by step (``tvm-probe run`` with ``generate:``):
one self-contained HTML page in the order a reader asks — the verdict, the tokens side by side,
the steps, the step × decoder layer errors (failing cells marked) and their heat map."""
from __future__ import annotations

import html
from pathlib import Path

from ..llm.render import layer_passed, layer_svg, layer_table, shade
from .page import CSS, format_error, html_table, name_html
from .report import write_atomic

GENERATION_CSS = """
table.layers td.num{min-width:4.5em}table.layers td.failed{outline:2px solid #000;outline-offset:-2px;font-weight:bold}
tr.different td{background:#ffebee}.side-by-side{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}
"""


def generation_html(comparison, title: str = "tvm_probe generation report") -> str:
    """The page for a :class:`~tvm_probe.llm.compare.GenerationComparison`."""
    passed = bool(comparison)
    verdict = (f'<div id="verdict" class="verdict {"pass" if passed else "fail"}"><span class="badge">'
               f'{"PASS" if passed else "FAIL"}</span>{name_html(comparison.verdict())}</div>')
    table, ok = layer_table(comparison), layer_passed(comparison)
    sections = [f"<h1>{html.escape(title)}</h1>", verdict, _tokens(comparison), _steps(comparison)]
    if not table.empty:
        sections += ['<section id="layers"><h2>Max abs error per step and decoder layer</h2>',
                     '<p class="note">Each cell: the largest absolute difference of that layer\'s output from '
                     "transformers' eager model at that step; outlined when out of tolerance.</p>",
                     f'<div class="side-by-side">{_layer_table(table, ok)}{layer_svg(table, ok)}</div>', "</section>"]
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{CSS}{GENERATION_CSS}</style>\n</head>\n<body>\n" + "\n".join(sections) + "\n</body>\n</html>\n")


def _tokens(comparison) -> str:
    rows = [{"step": i, "tvm": t, "reference": r, "same": "yes" if t == r else "no"}
            for i, (t, r) in enumerate(zip(comparison.tokens, comparison.reference_tokens))]
    columns = [("step", "step", "num", None), ("TVM token", "tvm", "num", None),
               ("transformers token", "reference", "num", None), ("same", "same", "text", None)]
    first = comparison.first_token_step
    head = "the same tokens" if first is None else f"tokens differ from step {first} on"
    return (f'<section id="tokens"><h2>Tokens: {head}</h2>'
            + html_table(rows, columns, lambda r: "different" if r["same"] == "no" else "", "tokens") + "</section>")


def _steps(comparison) -> str:
    frame = comparison.table()
    rows = frame.to_dict("records")
    for row in rows:
        row["status"] = "diverged" if row["diverged"] else "passed"
    columns = [("step", "step", "num", None), ("function", "function", "text", None),
               ("compared", "compared", "num", None), ("diverged", "diverged", "num", None),
               ("unchecked", "unchecked", "num", None), ("first divergent value", "first_divergent", "name",
                                                         lambda x: "" if x is None or x != x else str(x)),
               ("max abs", "max_abs", "num", format_error)]
    return ('<section id="steps"><h2>Steps</h2>' + html_table(rows, columns, lambda r: r["status"], "steps")
            + "</section>")


def _layer_table(table, ok) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["step", *table.columns])
    body = []
    for step in table.index:
        cells = [f'<td class="num">{step}</td>']
        for col in table.columns:
            err, good = table.loc[step, col], ok.loc[step, col]
            failed = " failed" if good == good and not bool(good) else ""
            cells.append(f'<td class="num{failed}" style="background:{shade(err)}">{html.escape(format_error(err))}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<table class="data layers" id="layer-errors"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(body) + "</tbody></table>")


def write_generation_report(folder, comparison) -> Path:
    """``folder/report.html`` for a generation comparison; returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return write_atomic(folder / "report.html", generation_html(comparison))
