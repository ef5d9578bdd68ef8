"""A generation comparison drawn: the step × decoder layer table of errors, which of its cells are
out of tolerance, and its heat map (labelled axes, a colour scale, failing cells outlined)."""
from __future__ import annotations

import html
import math
import re

#: ``module:<...>.layers.<i>`` (Llama, Qwen2, Mistral) or ``module:<...>.h.<i>`` (GPT-2): a decoder layer
_LAYER = re.compile(r"^module:(.*\.(?:layers|h)\.(\d+))$")
LOG_LOW, LOG_HIGH = -8, 0  # the colour scale: 1e-8 (green) to 1 (red), log10


def _layer_values(comparison):
    """``{step: {"layer i": ValueComparison}}``: each decoder layer's output at each step."""
    rows: dict[int, dict] = {}
    for step, calls in enumerate(comparison.by_step()):
        for value in (v for _, _, call in calls for v in call.values):
            found = _LAYER.match(value.name)
            if found:
                rows.setdefault(step, {})[f"layer {int(found[2])}"] = value
    return rows


def _frame(rows: dict, field):
    import pandas as pd

    frame = pd.DataFrame.from_dict({s: {c: field(v) for c, v in cells.items()} for s, cells in rows.items()},
                                   orient="index")
    frame.index.name = "step"
    return frame[sorted(frame.columns, key=lambda c: int(c.split()[1]))] if not frame.empty else frame


def layer_table(comparison):
    """DataFrame: step × decoder layer, the max abs error of each layer's output at each step
    (``comparison``: a :class:`~tvm_probe.llm.compare.GenerationComparison`)."""
    return _frame(_layer_values(comparison), lambda v: v.max_abs)


def layer_passed(comparison):
    """DataFrame shaped as :func:`layer_table`: whether each layer's output was within tolerance."""
    return _frame(_layer_values(comparison), lambda v: bool(v.passed))


def shade(err) -> str:
    """The heat map's colour of an error: green (≤ 1e-8) through yellow to red (≥ 1); grey for none."""
    if err is None or err != err:
        return "#e0e0e0"
    level = 0.0 if err <= 0 else min(1.0, max(0.0, (math.log10(err) - LOG_LOW) / (LOG_HIGH - LOG_LOW)))
    return f"rgb({int(255 * level)},{int(255 * (1 - level))},80)"


def layer_svg(table, passed=None) -> str:
    """The step × layer table as a heat map (SVG, no plotting library), log10 of the error, with a
    colour scale; cells out of tolerance (``passed``: :func:`layer_passed`) outlined in black."""
    cell, left, top = 28, 64, 52
    rows, cols = list(table.index), list(table.columns)
    grid_w, grid_h = cell * len(cols), cell * len(rows)
    width, height = max(left + grid_w + 20, 340), top + grid_h + 78
    parts = [f'<svg class="layer-map" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10" role="img" '
             'aria-label="max abs error per step and decoder layer">',
             f'<text class="axis-label x" x="{left + grid_w / 2}" y="14" text-anchor="middle">decoder layer</text>',
             f'<text class="axis-label y" transform="translate(12 {top + grid_h / 2}) rotate(-90)" '
             'text-anchor="middle">generation step</text>']
    for j, col in enumerate(cols):
        parts.append(f'<text x="{left + j * cell + cell / 2 - 1}" y="{top - 8}" text-anchor="middle">{col.split()[1]}</text>')
    for i, row in enumerate(rows):
        parts.append(f'<text x="{left - 6}" y="{top + i * cell + 18}" text-anchor="end">{row}</text>')
        for j, col in enumerate(cols):
            err = table.loc[row, col]
            ok = passed.loc[row, col] if passed is not None else True
            bad = ok == ok and not bool(ok)  # NaN: the layer has no value at that step
            outline = ' stroke="#000" stroke-width="2"' if bad else ""
            tip = html.escape(f"step {row}, {col}: max abs {err:.3g}" + (" (out of tolerance)" if bad else ""))
            parts.append(f'<rect class="cell{" failed" if bad else ""}" x="{left + j * cell}" y="{top + i * cell}" '
                         f'width="{cell - 2}" height="{cell - 2}" fill="{shade(err)}"{outline}><title>{tip}</title></rect>')
    parts.append(_scale(left, top + grid_h + 16, 240))
    return "\n".join(parts + ["</svg>"])


def _scale(x: float, y: float, width: float) -> str:
    """The colour legend: a bar from 1e-8 to 1 with its ticks, and what an outline means."""
    n = LOG_HIGH - LOG_LOW
    step = width / n
    bars = "".join(f'<rect x="{x + k * step:.1f}" y="{y}" width="{step + 0.5:.1f}" height="10" '
                   f'fill="{shade(10.0 ** (LOG_LOW + k + 0.5))}"/>' for k in range(n))
    ticks = "".join(f'<text x="{x + k * step:.1f}" y="{y + 22}" text-anchor="middle">1e{LOG_LOW + k}</text>'
                    for k in range(0, n + 1, 2))
    return (f'<g class="legend">{bars}{ticks}<text x="{x}" y="{y + 36}">colour: max abs error (log scale)</text>'
            f'<text x="{x}" y="{y + 50}">outlined: out of tolerance</text></g>')
