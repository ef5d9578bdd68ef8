"""The report's two plots as inline SVG (no plotting library, nothing to fetch): the error of
every compared value along the model over the allowance its tolerance gives it (what the verdict
judges: a value passes when that ratio is at most 1), and the time of every kernel call.

Both have labelled axes; the error plot's axis always holds its line at 1.
"""
from __future__ import annotations

import html
import math
import re

from .graph import short_name

PLOT_W = 960       # fixed plot width: many values make thin bars, never a wider page
PASSED, FAILED, BAR = "#43a047", "#e53935", "#1e88e5"
_LEFT, _RIGHT, _UP, _DOWN = 74, 12, 16, 34


def atol_of(tolerance: str) -> float | None:
    """``atol`` out of a tolerance as :class:`~tvm_probe.core.tolerance.Tolerance` prints it
    (``exact`` is 0); None when the text says something else."""
    if tolerance == "exact":
        return 0.0
    found = re.match(r"atol ([^,]+),", tolerance or "")
    return float(found.group(1)) if found else None


def format_time(us: float | None) -> str:
    """``850 µs``, ``1.02 ms``, ``3.4 s``: three significant digits in the unit that reads best."""
    if us is None or not math.isfinite(us):
        return ""
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if abs(us) >= scale:
            return f"{us / scale:.3g} {unit}"
    return f"{us:.3g} µs"


def _svg(height: int, body: list[str], label: str, css_class: str) -> str:
    return (f'<svg class="plot {css_class}" xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}" height="{height}" '
            f'viewBox="0 0 {PLOT_W} {height}" role="img" aria-label="{html.escape(label)}" '
            f'font-family="sans-serif" font-size="11">\n' + "\n".join(body) + "\n</svg>")


def _axes(height: int, x_label: str, y_label: str) -> tuple[float, float, list[str]]:
    """The plot's frame and both axis labels; returns the inner width and height."""
    w, h = PLOT_W - _LEFT - _RIGHT, height - _UP - _DOWN
    body = [f'<rect class="axes" x="{_LEFT}" y="{_UP}" width="{w}" height="{h}" fill="#fafafa" stroke="#bdbdbd"/>',
            f'<text class="axis-label x" x="{_LEFT + w / 2}" y="{height - 6}" text-anchor="middle">{x_label}</text>',
            f'<text class="axis-label y" transform="translate(14 {_UP + h / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle">{y_label}</text>']
    return w, h, body


#: the error plot's y axis, and what the verdict judges by (core.tolerance.within)
ERROR_AXIS = "max |tvm − ref| / (atol + rtol·|ref|)"
PER_PATTERN = "per-pattern tolerances where configured"  # (the end of such a Comparison.tolerance_rule)
_ABOVE = 3.0  # px: a failed value is drawn at least this far above the line, even at 1 + 1e-16
_PAD = 6       # px between the axes' edges and the rows of zero and infinite ratios


def error_plot(comparison, height: int = 280) -> str:
    """Dots: x = source order, y = each value's largest error over its allowance,
    ``|tvm − ref| / (atol + rtol·|ref|)`` over its elements (``over_tolerance``: what the verdict
    judges), log scale; the dashed line at 1: a value passes when it is on or below it.  Green
    passed, red out of tolerance (always drawn above the line); values equal to the reference
    (ratio 0) on the bottom row, infinite ratios (no allowance, NaN/Inf or shapes that disagree)
    on a top row of their own; the first divergent value marked."""
    values = comparison.values
    if not values:
        return '<p class="note">No values were compared.</p>'
    ratios = [v.over_tolerance for v in values]
    finite = [math.log10(r) for r in ratios if math.isfinite(r) and r > 0]
    lo = math.floor(min(finite + [0.0])) - 1                       # the row of exact zeros (ratio 0)
    hi = max(math.ceil(max(finite, default=0.0)), 1)               # a decade above the line at least
    infinite = any(not math.isfinite(r) for r in ratios)
    top = hi + infinite                                             # the row of infinite ratios
    w, h, body = _axes(height, f"compared values in source order ({len(values)})", ERROR_AXIS)
    y = lambda d: _UP + _PAD + (h - 2 * _PAD) * (top - d) / (top - lo)  # noqa: E731
    x = lambda i: _LEFT + w * (i + 0.5) / len(values)                # noqa: E731
    step = max(1, math.ceil((top - lo) / 8))
    ticks = [lo] + [d for d in range(lo + 1, hi + 1) if d == 0 or (d % step == 0 and d - lo >= step / 2
                                                                  and (not infinite or top - d >= step / 2))]
    for d in ticks + ([top] if infinite else []):
        tick = "0" if d == lo else "inf" if infinite and d == top else "1" if d == 0 else f"1e{d}"
        body.append(f'<line x1="{_LEFT}" x2="{_LEFT + w}" y1="{y(d):.1f}" y2="{y(d):.1f}" stroke="#e0e0e0"/>'
                    f'<text x="{_LEFT - 4}" y="{y(d) + 4:.1f}" text-anchor="end">{tick}</text>')
    line = y(0)
    body.append(f'<g class="tolerance"><line x1="{_LEFT}" x2="{_LEFT + w}" y1="{line:.1f}" y2="{line:.1f}" '
                f'stroke="#6a1b9a" stroke-width="1.2" stroke-dasharray="6 3"/>'
                f'<text x="{_LEFT + w - 4}" y="{line - 4:.1f}" text-anchor="end" fill="#6a1b9a">'
                "tolerance: above 1 fails</text></g>")
    for i, (v, ratio) in enumerate(zip(values, ratios)):
        d = lo if ratio <= 0 else math.log10(ratio) if math.isfinite(ratio) else top
        cy = y(d) if v.passed else min(y(d), line - _ABOVE)
        tip = html.escape(f"{v.name}: error / allowance {ratio:.3g} (max abs {v.max_abs:.3g}, {v.tolerance}, "
                          f"{v.served}){'' if v.passed else ', FAILED'}")
        if v is comparison.first_divergent:
            flip = x(i) > _LEFT + w / 2  # label on the side with room
            body.append(f'<g class="first-divergent"><line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{_UP}" '
                        f'y2="{_UP + h}" stroke="{FAILED}" stroke-dasharray="4 3"/>'
                        f'<text x="{x(i) + (-4 if flip else 4):.1f}" y="{y(top) + 16:.1f}" fill="#c62828" '
                        f'text-anchor="{"end" if flip else "start"}">'
                        f"first divergent: {html.escape(short_name(v.name))}</text></g>")
        body.append(f'<circle class="value {"passed" if v.passed else "failed"}" cx="{x(i):.1f}" cy="{cy:.1f}" '
                    f'r="2.5" fill="{PASSED if v.passed else FAILED}"><title>{tip}</title></circle>')
    return _svg(height, body, "error over tolerance per compared value", "error-plot")


def error_caption(comparison) -> str:
    """What the error plot shows, in words (plain text): the ratio, the line, the rows at the
    edges, and whether per-pattern tolerances set some values' allowances."""
    words = (f"Each dot is one compared value: {ERROR_AXIS} over its elements, its largest error over the "
             "allowance the verdict gives it, on a log scale. Points above the line at 1 fail (red); on or below "
             "it they pass (green). Values equal to the reference (ratio 0) sit on the bottom row, marked 0")
    if any(not math.isfinite(v.over_tolerance) for v in comparison.values):
        words += ("; values with no allowance (tolerance exact) that differ, NaN or infinities on one side "
                  "only, or another shape, on the top row, marked inf")
    words += "."
    rule = comparison.tolerance_rule or ""
    if rule.endswith(PER_PATTERN):
        words += (" Per-pattern tolerances apply where configured: a value matching a pattern is held to that "
                  "pattern's atol and rtol, the others to " + rule.removesuffix(PER_PATTERN).rstrip("; ") + ".")
    elif rule:
        words += f" Judged by {rule}."
    return words


def time_plot(results, height: int = 190) -> str:
    """One bar per kernel call, in call order; hover shows the symbol, its time and share."""
    calls = [n for n in results.node_infos if n.op == "tvm_op" and n.time_us is not None]
    if not calls:
        return '<p class="note">No kernel times were recorded for this run.</p>'
    total, peak = sum(n.time_us for n in calls) or 1.0, max(n.time_us for n in calls) or 1.0
    w, h, body = _axes(height, f"kernel calls in execution order ({len(calls)})", "time per call")
    step = w / len(calls)
    for frac in (0, 0.5, 1):
        yy = _UP + h * (1 - frac)
        body.append(f'<line x1="{_LEFT}" x2="{_LEFT + w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e0e0e0"/>'
                    f'<text x="{_LEFT - 4}" y="{yy + 4:.1f}" text-anchor="end">{format_time(peak * frac) or "0"}</text>')
    for i, n in enumerate(calls):
        bh = h * n.time_us / peak
        tip = html.escape(f"node {n.index} {n.symbol}: {format_time(n.time_us)} ({100 * n.time_us / total:.1f}%)")
        body.append(f'<rect x="{_LEFT + i * step:.2f}" y="{_UP + h - bh:.1f}" width="{max(step * 0.85, 0.5):.2f}" '
                    f'height="{bh:.1f}" fill="{BAR}"><title>{tip}</title></rect>')
    return _svg(height, body, "time per kernel call", "time-plot")
