"""The capacity bench's decisions, plain data: which concurrency to try next, whether a
level kept within the slo, the capacity the levels show, and the table printed.

The bench (``cluster.benchrun``) drives one ready replica with ``c`` clients at once,
each sending a few streamed requests in turn, for rising ``c``: 1, 2, 3, 4, 6, 8, 12 ...
until a level misses the model's ``slo`` (TTFT p99, and TPOT p99 when set), then
bisects between the last level within it and the first past it. The capacity is the
most clients a level carried within the slo with no request failing; the profile's
router ``weight`` is that capacity (the gateway's weighted choice then sends a profile
carrying three times as much three times the requests).

A model with no ``slo`` is measured against twice what one request alone takes (its
TTFT p99 at concurrency 1, and its TPOT p99), which the table says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
# Without a slo: a level within twice what one request alone takes.
NO_SLO_FACTOR = 2.0


@dataclass(frozen=True)
class Sample:
    """One request: seconds to its first token, seconds per token after it, and whether
    it was answered whole."""

    ttft: float
    tpot: float | None
    ok: bool = True


@dataclass(frozen=True)
class Limits:
    ttft: float  # seconds
    tpot: float | None  # seconds; None: not judged
    derived: bool = False  # from one request alone (the model sets no slo)


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int
    failed: int
    ttft_p99: float
    tpot_p99: float | None
    within: bool


def p99(values: Sequence[float]) -> float:
    """The 99th percentile by nearest rank (of few samples, their largest)."""
    ordered = sorted(values)
    if not ordered:
        return math.inf
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def limits(slo_ttft_ns: int, slo_tpot_ns: int, alone: Sequence[Sample] = ()) -> Limits:
    """What a level must keep within: the model's slo, or twice one request alone."""
    if slo_ttft_ns > 0:
        return Limits(slo_ttft_ns / 1e9, slo_tpot_ns / 1e9 if slo_tpot_ns > 0 else None)
    ok = [s for s in alone if s.ok]
    ttft = p99([s.ttft for s in ok]) * NO_SLO_FACTOR if ok else math.inf
    tpots = [s.tpot for s in ok if s.tpot is not None]
    tpot = p99(tpots) * NO_SLO_FACTOR if tpots else None
    return Limits(max(ttft, 0.05), tpot, derived=True)


def judge(concurrency: int, samples: Sequence[Sample], limit: Limits) -> Level:
    """One level's figures, and whether it kept within ``limit`` with none failing."""
    ok = [s for s in samples if s.ok]
    failed = len(samples) - len(ok)
    ttft = p99([s.ttft for s in ok])
    tpots = [s.tpot for s in ok if s.tpot is not None]
    tpot = p99(tpots) if tpots else None
    within = (
        bool(ok)
        and not failed
        and ttft <= limit.ttft
        and (limit.tpot is None or tpot is None or tpot <= limit.tpot)
    )
    return Level(concurrency, len(samples), failed, ttft, tpot, within)


def next_level(done: Sequence[Level], top: int = LEVELS[-1]) -> int | None:
    """The concurrency to try next, or None when the capacity is known."""
    tried = {lv.concurrency: lv.within for lv in done}
    passed = [c for c, ok in tried.items() if ok]
    failed = [c for c, ok in tried.items() if not ok]
    if not failed:
        higher = [c for c in LEVELS if c > max(passed, default=0) and c <= top]
        return higher[0] if higher else None
    low = max((c for c in passed if c < min(failed)), default=0)
    high = min(failed)
    if high - low <= 1:
        return None
    return (low + high) // 2


def capacity(done: Sequence[Level]) -> int:
    """The most clients a level carried within the slo, below the first that did not."""
    failed = [lv.concurrency for lv in done if not lv.within]
    first_failed = min(failed, default=math.inf)
    return max((lv.concurrency for lv in done if lv.within and lv.concurrency < first_failed),
               default=0)  # fmt: skip


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return "none"
    return f"{seconds * 1000:.0f} ms"


def table(done: Sequence[Level], limit: Limits) -> list[str]:
    """The levels as lines of a table, in the order of concurrency."""
    head = (
        f"{'clients':>7}  {'requests':>8}  {'failed':>6}  {'TTFT p99':>9}  {'TPOT p99':>9}  within"
    )
    what = "twice one request alone" if limit.derived else "slo"
    lines = [f"limits ({what}): TTFT p99 {_s(limit.ttft)}, TPOT p99 {_s(limit.tpot)}", head]
    for lv in sorted(done, key=lambda lv: lv.concurrency):
        lines.append(
            f"{lv.concurrency:>7}  {lv.requests:>8}  {lv.failed:>6}  {_s(lv.ttft_p99):>9}  "
            f"{_s(lv.tpot_p99):>9}  {'yes' if lv.within else 'no'}"
        )
    return lines
