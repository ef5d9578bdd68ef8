"""A generation comparison drawn: the step × decoder layer table of errors, and its heat map."""
from __future__ import annotations

import math
import re

#: ``module:<...>.layers.<i>`` (Llama, Qwen2, Mistral) or ``module:<...>.h.<i>`` (GPT-2): a decoder layer
_LAYER = re.compile(r"^module:(.*\.(?:layers|h)\.(\d+))$")


def layer_table(comparison):
    """DataFrame: step × decoder layer, the max abs error of each layer's output at each step
    (``comparison``: a :class:`~tvm_probe.llm.compare.GenerationComparison`)."""
    import pandas as pd

    rows = {}
    for step, (_, _, call) in enumerate(comparison.calls.by_call):
        for value in call.values:
            found = _LAYER.match(value.name)
            if found:
                rows.setdefault(step, {})[f"layer {int(found[2])}"] = value.max_abs
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "step"
    return frame[sorted(frame.columns, key=lambda c: int(c.split()[1]))] if not frame.empty else frame


def layer_svg(table) -> str:
    """The step × layer table as a heat map (SVG, no plotting library): log10 of the error."""
    cell, pad = 28, 60
    rows, cols = list(table.index), list(table.columns)
    width, height = pad + cell * len(cols) + 10, pad + cell * len(rows) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="10">',
             '<text x="4" y="14">max abs error per step (rows) and layer (columns), log10</text>']
    for j, col in enumerate(cols):
        parts.append(f'<text x="{pad + j * cell + 2}" y="{pad - 6}">{col.split()[1]}</text>')
    for i, row in enumerate(rows):
        parts.append(f'<text x="4" y="{pad + i * cell + 18}">step {row}</text>')
        for j, col in enumerate(cols):
            err = table.loc[row, col]
            level = 0.0 if not err or err != err else min(1.0, max(0.0, (math.log10(err) + 8) / 8))
            shade = f"rgb({int(255 * level)},{int(255 * (1 - level))},80)"
            parts.append(f'<rect x="{pad + j * cell}" y="{pad + i * cell}" width="{cell - 2}" height="{cell - 2}" '
                         f'fill="{shade}"><title>{err:.3g}</title></rect>')
    return "\n".join(parts + ["</svg>"])
