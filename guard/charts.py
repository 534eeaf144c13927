"""The guard's charts as geometry: the templates draw it as inline SVG (no JS, no CDN).

Plain Python, no Django. ``score_chart`` lays out an evaluation: one band a judge, an
ordinary and a harmful strip in it, a dot a text at its unsafe score (0 left, 1 right),
filled when the judge flagged it. ``timeline`` lays out a judge's samples over time:
the probe's latency as a line, failed probes as marks, and under it the decisions made
between two samples as stacked bars by verdict.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

# Score chart


@dataclass(frozen=True)
class Dot:
    """One text's score: where, how, and what the tooltip says."""

    x: float
    y: float
    label: str
    flagged: bool
    title: str


@dataclass(frozen=True)
class Band:
    """One judge's band: its top, its name's line, the strips' middles, dots, figures."""

    judge: str
    y: float
    name_y: float
    ordinary_y: float
    harmful_y: float
    dots: list[Dot]
    failures: int
    figures: str


@dataclass(frozen=True)
class ScoreChart:
    """An evaluation's scores, judge by judge."""

    width: int
    height: int
    left: int
    plot_width: int
    bands: list[Band]
    ticks: list[tuple[float, str]]
    top: int
    bottom: int


@dataclass(frozen=True)
class ScorePoint:
    """A judge's score on a text, as the chart takes it (``score`` None: no verdict)."""

    judge: str
    position: int
    label: str
    score: float | None
    flagged: bool
    text: str


NAME = 18
STRIP = 22
BAND = NAME + 2 * STRIP + 6
LEFT = 170
RIGHT = 250
TOP = 24
BOTTOM = 22


def score_chart(
    judges: Sequence[str],
    points: Sequence[ScorePoint],
    figures: dict[str, str] | None = None,
    width: int = 960,
) -> ScoreChart:
    """Return the layout of an evaluation's scores (``figures``: a line per judge)."""
    plot = width - LEFT - RIGHT
    bands = []
    for i, judge in enumerate(judges):
        y = TOP + i * BAND
        # The judge's name on the band's first line, the two strips under it.
        ordinary_y = y + NAME + STRIP / 2
        harmful_y = ordinary_y + STRIP
        dots = []
        failures = 0
        for p in points:
            if p.judge != judge:
                continue
            if p.score is None:
                failures += 1
                continue
            middle = ordinary_y if p.label == "ordinary" else harmful_y
            dots.append(
                Dot(
                    x=round(LEFT + _clamp(p.score) * plot, 1),
                    y=round(middle + _jitter(p.position), 1),
                    label=p.label,
                    flagged=p.flagged,
                    title=f"{p.label}, {p.score:.2f}{' (flagged)' if p.flagged else ''}: "
                    f"{_short(p.text)}",
                )
            )
        bands.append(
            Band(
                judge=judge,
                y=y,
                name_y=y + NAME - 5,
                ordinary_y=ordinary_y,
                harmful_y=harmful_y,
                dots=dots,
                failures=failures,
                figures=(figures or {}).get(judge, ""),
            )
        )
    height = TOP + len(bands) * BAND + BOTTOM
    ticks = [(round(LEFT + t * plot, 1), f"{t:g}") for t in (0, 0.25, 0.5, 0.75, 1)]
    return ScoreChart(width, height, LEFT, plot, bands, ticks, TOP, height - BOTTOM)


def _clamp(score: float) -> float:
    return min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0


def _jitter(position: int) -> float:
    """Return a steady offset within a strip, so equal scores do not hide each other."""
    return (zlib.crc32(str(position).encode()) % 1000) / 1000 * 12 - 6


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Timeline


@dataclass(frozen=True)
class Sample:
    """A judge at one probe, as the chart takes it (``guard.models.JudgeSample``'s fields)."""

    at: datetime
    ok: bool
    latency_ms: float | None
    safe: int
    unsafe: int
    controversial: int
    failures: int


@dataclass(frozen=True)
class Bar:
    """The decisions between two samples, stacked: (verdict, y, height) from the bottom."""

    x: float
    width: float
    parts: list[tuple[str, float, float]]
    title: str


@dataclass(frozen=True)
class Timeline:
    """A judge's latency and verdicts over time."""

    width: int
    height: int
    left: int
    right: int
    latency_top: int
    latency_bottom: int
    bars_top: int
    bars_bottom: int
    line: str
    points: list[tuple[float, float, str]]
    failed: list[tuple[float, str]]
    bars: list[Bar]
    latency_ticks: list[tuple[float, str]]
    count_ticks: list[tuple[float, str]]
    time_ticks: list[tuple[float, str]] = field(default_factory=list)
    empty: bool = False


VERDICT_ORDER = ("safe", "controversial", "unsafe", "failed")


def nice_ceiling(value: float) -> float:
    """Return the smallest of 1, 2, 2.5 or 5 times a power of ten at or above ``value``."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    # A subnormal value's power of ten underflows to 0 (hypothesis found 5e-324 ms).
    value = max(value, 1e-300)
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-12):
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def _deltas(samples: Sequence[Sample]) -> list[tuple[Sample, Sample, dict[str, int]]]:
    """Return each interval between samples with its verdicts' counts; a counter that went
    down (the records were reset) starts the interval from zero."""
    deltas = []
    for before, after in zip(samples, samples[1:], strict=False):
        counts = {}
        for verdict, attr in (
            ("safe", "safe"),
            ("controversial", "controversial"),
            ("unsafe", "unsafe"),
            ("failed", "failures"),
        ):
            a, b = getattr(before, attr), getattr(after, attr)
            counts[verdict] = b - a if b >= a else b
        deltas.append((before, after, counts))
    return deltas


def _bar(
    before: Sample,
    after: Sample,
    counts: dict[str, int],
    x_of: Callable[[datetime], float],
    top_count: float,
    bottom: float,
    room: float,
    right: float,
) -> Bar:
    """Return one interval's bar: its verdicts stacked from ``bottom``, and its title."""
    x0, x1 = x_of(before.at), x_of(after.at)
    bar_width = max(round(x1 - x0 - 1, 1), 1.0)
    parts = []
    y = float(bottom)
    for verdict in VERDICT_ORDER:
        n = counts[verdict]
        if n <= 0:
            continue
        h = round(n / top_count * room, 1)
        y = round(y - h, 1)
        parts.append((verdict, y, h))
    said = ", ".join(f"{counts[v]} {v}" for v in VERDICT_ORDER if counts[v])
    title = f"{before.at:%H:%M:%S}–{after.at:%H:%M:%S}: {said or 'nothing'}"
    # Samples at one instant at the right edge still get a visible bar inside the plot.
    bar_x = min(round(x0 + 0.5, 1), right - bar_width)
    return Bar(bar_x, bar_width, parts, title)


def timeline(samples: Sequence[Sample], width: int = 960) -> Timeline:
    """Return the layout of a judge's samples (oldest first), each at its time.

    The latency panel's scale is the highest latency's ``nice_ceiling``; a bar's height
    is its count against the busiest interval's. A counter that went down (the records
    were reset) starts that interval from zero.
    """
    left, right = 64, width - 16
    latency_top, latency_bottom = 14, 134
    bars_top, bars_bottom = 152, 232
    height = 256
    if not samples:
        return Timeline(
            width, height, left, right, latency_top, latency_bottom, bars_top, bars_bottom,
            "", [], [], [], [], [], [], empty=True,
        )  # fmt: skip
    samples = sorted(samples, key=lambda s: s.at)
    start, end = samples[0].at, samples[-1].at
    span = (end - start).total_seconds() or 1.0

    def x_of(at: datetime) -> float:
        if len(samples) == 1:
            return round((left + right) / 2, 1)
        return round(left + (at - start).total_seconds() / span * (right - left), 1)

    latencies = [s.latency_ms for s in samples if s.ok and s.latency_ms is not None]
    top_ms = nice_ceiling(max(latencies, default=1.0))

    def y_of(ms: float) -> float:
        return round(latency_bottom - min(ms, top_ms) / top_ms * (latency_bottom - latency_top), 1)

    points = [
        (x_of(s.at), y_of(s.latency_ms), f"{s.at:%Y-%m-%d %H:%M:%S}: {s.latency_ms:.1f} ms")
        for s in samples
        if s.ok and s.latency_ms is not None
    ]
    failed = [(x_of(s.at), f"{s.at:%Y-%m-%d %H:%M:%S}: probe failed") for s in samples if not s.ok]
    line = " ".join(f"{x},{y}" for x, y, _ in points)

    deltas = _deltas(samples)
    busiest = max((sum(c.values()) for _, _, c in deltas), default=0)
    top_count = nice_ceiling(busiest) if busiest else 1.0
    room = bars_bottom - bars_top
    bars = [
        _bar(b, a, counts, x_of, top_count, bars_bottom, room, right) for b, a, counts in deltas
    ]
    latency_ticks = [(y_of(v), f"{v:g} ms") for v in (0, top_ms / 2, top_ms)]
    count_ticks = [(round(bars_bottom - v / top_count * room, 1), f"{v:g}") for v in (0, top_count)]
    time_ticks = [(x_of(start), f"{start:%m-%d %H:%M}")]
    if len(samples) > 1:
        time_ticks.append((x_of(end), f"{end:%m-%d %H:%M}"))
    return Timeline(
        width, height, left, right, latency_top, latency_bottom, bars_top, bars_bottom,
        line, points, failed, bars, latency_ticks, count_ticks, time_ticks,
    )  # fmt: skip
