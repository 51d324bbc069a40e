"""Hand-drawn SVG charts for the parity report: one panel per measured series.

Each panel is an inline ``<svg>`` (no plotting library, no external file), sized by its
``viewBox`` so that it stretches to the width the page gives it. A panel has a titled frame,
ticks and labels on both axes (the x axis is the optimizer step), a legend naming each line,
bands on the steps the reference skipped (an overflow), and crosses on the top edge where a
value is not finite (a NaN or inf loss). :func:`diff_panel` draws ``|subject - reference|``
on a log10 axis, where a loose agreement and a one-ulp one are easy to tell apart.
"""

from __future__ import annotations

import html
import math
from typing import List, Optional, Sequence, Tuple

__all__ = ["series_panel", "diff_panel", "abs_differences", "standalone"]

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 16, 60, 44
REFERENCE_COLOUR, SUBJECT_COLOUR, SKIP_COLOUR, ALERT_COLOUR = "#1f5fa8", "#e0701a", "#f3c9c9", "#b3261e"


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _linear_ticks(low: float, high: float, count: int = 5) -> Tuple[float, float, List[float]]:
    """An axis range widened to round numbers, and the ticks on it."""
    if high - low < 1e-12 * max(abs(low), abs(high), 1.0):
        low, high = low - max(abs(low) * 0.1, 0.5), high + max(abs(high) * 0.1, 0.5)
    step = _nice_step(high - low, count)
    first, last = math.floor(low / step), math.ceil(high / step)
    return first * step, last * step, [k * step for k in range(first, last + 1)]


def _exponent_ticks(low: float, high: float, base: int) -> Tuple[float, float, List[float]]:
    """Integer exponents covering ``[low, high]`` (values already taken to log ``base``)."""
    first, last = math.floor(low), math.ceil(high)
    if first == last:
        first, last = first - 1, last + 1
    stride = max(1, math.ceil((last - first) / 6))
    return first, last, list(range(first, last + 1, stride))


def _step_ticks(count: int) -> List[int]:
    stride = 1 if count <= 13 else int(_nice_step(count - 1, 8))
    return list(range(0, count, stride))


def _format_tick(value: float, scale: str) -> str:
    if scale == "log2":
        return f"{2.0**value:g}"
    if scale == "log10":
        return f"1e{int(value)}"
    return f"{value:.6g}"


class _Frame:
    """Maps steps and (transformed) values to the drawing area of one panel."""

    def __init__(self, steps: int, low: float, high: float) -> None:
        self.steps, self.low, self.high = steps, low, high

    def x(self, step: float) -> float:
        return LEFT + step * (WIDTH - LEFT - RIGHT) / max(self.steps - 1, 1)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.low) / (self.high - self.low) * (HEIGHT - TOP - BOTTOM)


def _transform(value: float, scale: str) -> Optional[float]:
    """The plotted value, or None where it cannot be drawn (non-finite, or <= 0 on a log axis)."""
    if not math.isfinite(value):
        return None
    if scale == "linear":
        return value
    if value <= 0:
        return None
    return math.log2(value) if scale == "log2" else math.log10(value)


def _polylines(frame: _Frame, values: Sequence[Optional[float]], colour: str, dashed: bool) -> str:
    """The line through ``values``, broken where a value cannot be drawn; a dot per step."""
    dash = ' stroke-dasharray="7 4"' if dashed else ""
    parts: List[str] = []
    run: List[str] = []
    for step, value in enumerate(list(values) + [None]):
        if value is None:
            if len(run) > 1:
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{" ".join(run)}"/>'
                )
            run = []
            continue
        run.append(f"{frame.x(step):.1f},{frame.y(value):.1f}")
        parts.append(f'<circle cx="{frame.x(step):.1f}" cy="{frame.y(value):.1f}" r="2.5" fill="{colour}"/>')
    return "".join(parts)


def _axes(frame: _Frame, y_ticks: Sequence[float], scale: str, y_label: str) -> str:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" fill="white" stroke="#999"/>']
    for tick in y_ticks:
        y = frame.y(tick)
        parts.append(
            f'<line x1="{LEFT - 5}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<line x1="{LEFT - 5}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#555"/>'
            f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_format_tick(tick, scale)}</text>'
        )
    for step in _step_ticks(frame.steps):
        x = frame.x(step)
        parts.append(
            f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" stroke="#555"/>'
            f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">{step}</text>'
        )
    parts.append(
        f'<text x="{(LEFT + right) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle">optimizer step</text>'
        f'<text transform="translate(14 {(TOP + bottom) / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    return "".join(parts)


def _legend(entries: Sequence[Tuple[str, str]]) -> str:
    """``entries``: (swatch svg drawn at the origin, label), laid out under the title, on a
    second line when the first is full."""
    parts: List[str] = []
    x, y = float(LEFT), 34
    for swatch, label in entries:
        width = 40 + 6.6 * len(label)  # swatch, gap, and about 6.6 px per character at 12 px
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = float(LEFT), y + 15
        parts.append(
            f'<g transform="translate({x:.0f} {y})">{swatch}<text x="26" y="4">{html.escape(label)}</text></g>'
        )
        x += width
    return "".join(parts)


def _line_swatch(colour: str, dashed: bool) -> str:
    dash = ' stroke-dasharray="7 4"' if dashed else ""
    return f'<line x1="0" y1="0" x2="22" y2="0" stroke="{colour}" stroke-width="2"{dash}/>'


_SKIP_SWATCH = f'<rect x="4" y="-6" width="14" height="12" fill="{SKIP_COLOUR}"/>'
_CROSS_SWATCH = f'<text x="11" y="5" text-anchor="middle" fill="{ALERT_COLOUR}" font-weight="bold">×</text>'


def _svg(title: str, body: str) -> str:
    label = html.escape(title)
    room = WIDTH - LEFT - 8
    # about 7.2 px per character in 14 px bold; a longer title is squeezed to fit, not cut off
    fit = f' textLength="{room}" lengthAdjust="spacingAndGlyphs"' if 7.2 * len(title) > room else ""
    return (
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg" '
        f'role="img" aria-label="{label}" font-family="sans-serif" font-size="12">'
        f'<title>{label}</title><text x="{LEFT}" y="18" font-size="14" font-weight="bold"{fit}>{label}</text>'
        f"{body}</svg>"
    )


def standalone(panel: str) -> str:
    """A panel as an ``.svg`` file of its own: with an XML declaration, and the size an
    ``<img>`` showing it takes (the inline panels have none, so that they fill their box)."""
    sized = panel.replace("<svg ", f'<svg width="{WIDTH}" height="{HEIGHT}" ', 1)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{sized}\n'


def series_panel(
    title: str,
    y_label: str,
    reference: Sequence[float],
    subject: Sequence[float],
    names: Tuple[str, str],
    scale: str = "linear",
    skipped: Sequence[bool] = (),
    subject_skipped: Sequence[bool] = (),
) -> str:
    """Reference (solid) and subject (dashed) per step; ``scale`` is ``linear`` or ``log2``.

    ``skipped`` marks the steps the reference skipped (shaded); steps only the subject skipped
    (or did not skip) are marked with a red tick on the bottom edge.
    """
    ref = [_transform(v, scale) for v in reference]
    sub = [_transform(v, scale) for v in subject]
    drawn = [v for v in ref + sub if v is not None] or [0.0]
    steps = max(len(ref), len(sub), 2)
    if scale == "log2":
        low, high, ticks = _exponent_ticks(min(drawn), max(drawn), 2)
    else:
        low, high, ticks = _linear_ticks(min(drawn), max(drawn))
    frame = _Frame(steps, low, high)
    band = (WIDTH - LEFT - RIGHT) / max(steps - 1, 1)
    body = [_axes(frame, ticks, scale, y_label)]
    for step in (k for k, flag in enumerate(skipped) if flag):
        left, right = max(LEFT, frame.x(step) - band / 2), min(WIDTH - RIGHT, frame.x(step) + band / 2)
        body.append(
            f'<rect x="{left:.1f}" y="{TOP}" width="{right - left:.1f}" '
            f'height="{HEIGHT - TOP - BOTTOM}" fill="{SKIP_COLOUR}" opacity="0.8"/>'
        )
    mismatched = [k for k, (a, b) in enumerate(zip(skipped, subject_skipped)) if a != b]
    body += [
        f'<line x1="{frame.x(k):.1f}" y1="{HEIGHT - BOTTOM - 10}" x2="{frame.x(k):.1f}" '
        f'y2="{HEIGHT - BOTTOM}" stroke="{ALERT_COLOUR}" stroke-width="3"/>'
        for k in mismatched
    ]
    body.append(_polylines(frame, ref, REFERENCE_COLOUR, dashed=False))
    body.append(_polylines(frame, sub, SUBJECT_COLOUR, dashed=True))
    crosses = sorted(
        {k for k, v in enumerate(reference) if not math.isfinite(v)}
        | {k for k, v in enumerate(subject) if not math.isfinite(v)}
    )
    body += [
        f'<text x="{frame.x(k):.1f}" y="{TOP + 12}" text-anchor="middle" fill="{ALERT_COLOUR}" '
        f'font-weight="bold" font-size="15">×</text>'
        for k in crosses
    ]
    legend = [
        (_line_swatch(REFERENCE_COLOUR, False), f"reference: {names[0]}"),
        (_line_swatch(SUBJECT_COLOUR, True), f"subject: {names[1]}"),
    ]
    if any(skipped):
        legend.append((_SKIP_SWATCH, "skipped step (overflow)"))
    if mismatched:
        legend.append(
            (f'<line x1="11" y1="-6" x2="11" y2="6" stroke="{ALERT_COLOUR}" stroke-width="3"/>', "skip differs")
        )
    if crosses:
        legend.append((_CROSS_SWATCH, "NaN/inf"))
    body.append(_legend(legend))
    return _svg(title, "".join(body))


def abs_differences(reference: Sequence[float], subject: Sequence[float]) -> List[float]:
    """``|subject - reference|`` per common step: 0 where both are the same non-finite value,
    inf where only one side is finite."""
    out = []
    for a, b in zip(reference, subject):
        if a == b or (math.isnan(a) and math.isnan(b)):
            out.append(0.0)
        elif math.isfinite(a) and math.isfinite(b):
            out.append(abs(b - a))
        else:
            out.append(math.inf)
    return out


def diff_panel(title: str, differences: Sequence[float], bound: Optional[float] = None) -> str:
    """``differences`` on a log10 axis; zeros sit as hollow dots on the bottom edge, infinite
    values (one side not finite) as crosses on the top edge; ``bound``, when given, is a
    horizontal line."""
    logs = [_transform(v, "log10") for v in differences]
    drawn = [v for v in logs if v is not None] + ([math.log10(bound)] if bound else [])
    low, high, ticks = _exponent_ticks(min(drawn, default=-8), max(drawn, default=-7), 10)
    frame = _Frame(max(len(differences), 2), low, high)
    body = [
        _axes(frame, ticks, "log10", "|subject − reference|"),
        _polylines(frame, logs, SUBJECT_COLOUR, dashed=False),
    ]
    zeros = [k for k, v in enumerate(differences) if v == 0]
    body += [
        f'<circle cx="{frame.x(k):.1f}" cy="{HEIGHT - BOTTOM}" r="4" fill="white" '
        f'stroke="{REFERENCE_COLOUR}" stroke-width="2"/>'
        for k in zeros
    ]
    infinite = [k for k, v in enumerate(differences) if math.isinf(v)]
    body += [
        f'<text x="{frame.x(k):.1f}" y="{TOP + 12}" text-anchor="middle" fill="{ALERT_COLOUR}" '
        f'font-weight="bold" font-size="15">×</text>'
        for k in infinite
    ]
    legend = [(_line_swatch(SUBJECT_COLOUR, False), "|subject − reference|")]
    if zeros:
        legend.append(
            (
                f'<circle cx="11" cy="0" r="4" fill="white" stroke="{REFERENCE_COLOUR}" stroke-width="2"/>',
                "identical (0)",
            )
        )
    if infinite:
        legend.append((_CROSS_SWATCH, "one side not finite"))
    if bound:
        y = frame.y(math.log10(bound))
        body.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
            f'stroke="{ALERT_COLOUR}" stroke-dasharray="3 3"/>'
        )
        legend.append(
            (
                f'<line x1="0" y1="0" x2="22" y2="0" stroke="{ALERT_COLOUR}" stroke-dasharray="3 3"/>',
                f"bound {bound:.3g}",
            )
        )
    body.append(_legend(legend))
    return _svg(title, "".join(body))
