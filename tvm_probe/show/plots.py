"""The report's two plots as inline SVG (no plotting library, nothing to fetch): the error of
every compared value along the model, with the tolerance drawn, and the time of every kernel call.

Both have labelled axes; the error plot's axis always reaches the tolerance line.
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


def error_plot(comparison, height: int = 250) -> str:
    """Dots: x = source order, y = max abs error (log scale, exact zeros on the bottom row);
    green passed, red out of tolerance; the dashed line at each ``atol`` the values were held to
    (a value above it can still pass through ``rtol``); the first divergent value marked."""
    values = comparison.values
    if not values:
        return '<p class="note">No values were compared.</p>'
    atols = sorted({a for a in (atol_of(v.tolerance) for v in values) if a is not None})
    finite = [math.log10(v.max_abs) for v in values if math.isfinite(v.max_abs) and v.max_abs > 0]
    lines = [math.log10(a) for a in atols if a > 0]
    lo = math.floor(min(finite + lines, default=-7.0)) - 1          # the row of exact (zero) errors
    top = max(math.ceil(max(finite, default=0.0)), math.floor(max(lines, default=lo)) + 1, lo + 2)
    nonfinite = any(not math.isfinite(v.max_abs) for v in values)
    top += nonfinite                                                 # the row of inf / nan errors
    w, h, body = _axes(height, f"compared values in source order ({len(values)})", "max abs error")
    y = lambda d: _UP + h * (top - d) / (top - lo)                   # noqa: E731
    x = lambda i: _LEFT + w * (i + 0.5) / len(values)                 # noqa: E731
    for d in range(lo, top + 1, max(1, math.ceil((top - lo) / 8))):
        tick = "0" if d == lo else "inf/nan" if nonfinite and d == top else f"1e{d}"
        body.append(f'<line x1="{_LEFT}" x2="{_LEFT + w}" y1="{y(d):.1f}" y2="{y(d):.1f}" stroke="#e0e0e0"/>'
                    f'<text x="{_LEFT - 4}" y="{y(d) + 4:.1f}" text-anchor="end">{tick}</text>')
    for a in atols:
        yy = y(math.log10(a)) if a > 0 else y(lo)
        text = f"tolerance: atol {a:g}" + (" (exact)" if a == 0 else "")
        body.append(f'<g class="tolerance"><line x1="{_LEFT}" x2="{_LEFT + w}" y1="{yy:.1f}" y2="{yy:.1f}" '
                    f'stroke="#6a1b9a" stroke-width="1.2" stroke-dasharray="6 3"/>'
                    f'<text x="{_LEFT + w - 4}" y="{yy - 4:.1f}" text-anchor="end" fill="#6a1b9a">{text}</text></g>')
    for i, v in enumerate(values):
        d = top if not math.isfinite(v.max_abs) else lo if v.max_abs <= 0 else math.log10(v.max_abs)
        tip = html.escape(f"{v.name}: max abs {v.max_abs:.3g}, {v.tolerance} ({v.served}){'' if v.passed else ', FAILED'}")
        if v is comparison.first_divergent:
            flip = x(i) > _LEFT + w / 2  # label on the side with room
            body.append(f'<g class="first-divergent"><line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{_UP}" '
                        f'y2="{_UP + h}" stroke="{FAILED}" stroke-dasharray="4 3"/>'
                        f'<text x="{x(i) + (-4 if flip else 4):.1f}" y="{_UP + 12}" fill="#c62828" '
                        f'text-anchor="{"end" if flip else "start"}">'
                        f"first divergent: {html.escape(short_name(v.name))}</text></g>")
        body.append(f'<circle cx="{x(i):.1f}" cy="{y(d):.1f}" r="2.5" fill="{PASSED if v.passed else FAILED}">'
                    f"<title>{tip}</title></circle>")
    return _svg(height, body, "max abs error per compared value", "error-plot")


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
