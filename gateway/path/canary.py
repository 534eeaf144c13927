"""Whether a canary is rolled back: a plain function over two windows of outcomes.

A model with a ``canary`` sends ``canary.percent`` of its requests to the candidate
(``gateway.path.app``); ``gateway.records.watch.CanaryWatch`` keeps, per model, a window of what its
attempts came to and asks :func:`decide` about each canary. The candidate is rolled back
when, over at least ``min_requests`` of its own, its error rate is more than
``max_error_increase`` above the model's (0.05 is five points), or its mean time to the
first token is more than ``max_ttft_ratio`` times the model's. A threshold of 0 is the
catalog's default (``catalog.rules.canary_limits``: 50, 0.05, 1.5).

An error is an attempt the engine failed: a connect error, a timeout, a 429 or a 5xx
before the first byte (the request moved on to another replica or to the model), or an
answer of 5xx. A 4xx answer is the client's (the same request gets it from either model)
and is no error. The mean time to first token is
over successful attempts only. With no traffic of the model's own to compare with (the
canary at 100 percent), its error rate counts as 0 and the TTFT ratio is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog import spec
from catalog.rules import canary_limits


@dataclass(frozen=True)
class Window:
    """What a model's attempts came to, over the window kept."""

    requests: int = 0
    errors: int = 0
    ttft_sum: float = 0.0  # seconds, over the successful attempts that measured one
    ttft_count: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def mean_ttft(self) -> float | None:
        return self.ttft_sum / self.ttft_count if self.ttft_count else None


@dataclass(frozen=True)
class Limits:
    min_requests: int = 50
    max_error_increase: float = 0.05
    max_ttft_ratio: float = 1.5

    @classmethod
    def of(cls, canary: spec.Canary) -> Limits:
        """The canary's thresholds, the catalog's defaults where it says 0."""
        return cls(*canary_limits(canary))


@dataclass(frozen=True)
class Decision:
    roll_back: bool
    why: str = ""  # the figures, as the change log shows them


KEEP = Decision(False)


def decide(candidate: Window, model: Window, limits: Limits, name: str = "") -> Decision:
    """Roll the candidate (``name``) back, or keep it, from the two windows."""
    if candidate.requests < max(1, limits.min_requests):
        return KEEP
    over = f"over {candidate.requests} requests"
    label = f"canary {name} rolled back" if name else "canary rolled back"
    increase = candidate.error_rate - model.error_rate
    if increase > limits.max_error_increase:
        return Decision(
            True,
            f"{label}: error rate {_pct(candidate.error_rate)} vs {_pct(model.error_rate)} "
            f"{over} (at most {_points(limits.max_error_increase)} above the model's)",
        )
    mine, theirs = candidate.mean_ttft, model.mean_ttft
    if mine is not None and theirs is not None and theirs > 0:
        ratio = mine / theirs
        if ratio > limits.max_ttft_ratio:
            return Decision(
                True,
                f"{label}: mean time to first token {_ms(mine)} vs {_ms(theirs)} "
                f"({ratio:.1f}x, at most {limits.max_ttft_ratio:g}x) {over}",
            )
    return KEEP


def _pct(rate: float) -> str:
    value = rate * 100
    return f"{value:.0f}%" if value >= 10 or value == int(value) else f"{value:.1f}%"


def _points(rate: float) -> str:
    value = rate * 100
    return f"{value:g} points"


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
