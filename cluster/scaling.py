"""Load scaling: how many replicas a model should run for the load it has, plain data.

The reconciler (``cluster.reconciler``) calls :func:`decide` once a tick per model whose
min and max in force (the model's or its schedule window's, ``cluster.plan.bounds``)
leave room to scale. It hands it what the gateway processes measured, summed
(``cluster.load``): requests in flight and waiting for a replica, and the model's TTFT
p99 over the last seconds; what one replica of the model's profile carries (its
``capacity`` measured by the bench, else :data:`DEFAULT_CAPACITY` of its engine); and
what it kept from the last tick (:class:`Memory`).

- **Up quickly**: when the load needs more replicas than the target (in flight and
  waiting over ``capacity`` each), or the TTFT p99 is past the ``slo`` with every replica
  ready, and that has held for ``up_after`` seconds, the target goes at once to what the
  load needs (at least one more), never over max.
- **Down slowly**: when the load would fit in one replica fewer, with the p99 within the
  slo, for ``down_after`` seconds, the target goes down by one; the next step needs
  another ``down_after`` of quiet. Never under min. (Stopping a replica throws its KV
  cache away, the seed's reason for minutes.)
- A burst shorter than ``up_after`` adds nothing: its start is forgotten as soon as a
  tick sees the load fit again.

Each decision says why, in words for the console ("scaled up: 14 in flight over 2
replicas, capacity 4 each"; "holding at max 4: TTFT p99 2.3 s over the 1 s slo").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

# What one replica carries at once before its answers slow past the slo, by engine, until
# the bench measures its profile (``manage.py cluster bench``). llama-server and the sim
# generate four at a time by default; vLLM, SGLang and TensorRT-LLM batch far more.
DEFAULT_CAPACITY = {"sim": 4, "llamacpp": 4, "vllm": 32, "sglang": 32, "trtllm": 32}
FALLBACK_CAPACITY = 4
# A TTFT p99 over fewer requests than this says too little to scale on.
MIN_SAMPLES = 10
# A reason whose words stay the same while its figures move ("3.8 in flight", a countdown)
# is pushed to the consoles at most this often (seconds): a model under load would
# otherwise re-render on every open console each tick.
FIGURES_EVERY = 5.0
_FIGURE = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Load:
    """What every gateway process measured of one model, summed."""

    in_flight: float = 0  # a mean over the gateways' last seconds
    waiting: int = 0
    ttft_p99_ms: float | None = None  # None: no request answered in the window
    samples: int = 0  # the requests the p99 is over

    @property
    def demand(self) -> float:
        return self.in_flight + self.waiting


@dataclass(frozen=True)
class Memory:
    """What a model's scaling keeps between ticks (Unix seconds)."""

    target: int | None = None  # None: never decided (the min in force applies)
    over_since: float | None = None  # the load first needed more, in this run of it
    quiet_since: float | None = None  # the load first fit in one fewer, in this run
    reason: str = ""
    lo: int | None = None  # the min in force when it was decided


@dataclass(frozen=True)
class Decision:
    target: int
    memory: Memory
    reason: str
    step: str = ""  # "up", "down" or "" (held)


def capacity_of(
    profiles: Sequence[tuple[str, str, int]], running: Iterable[str] = ()
) -> tuple[int, bool]:
    """What one replica carries: (requests, measured).

    ``profiles`` are (name, engine, measured capacity, 0 when not measured) in the
    model's order; ``running`` the profiles of its replicas now. The mean over the
    replicas' profiles (rounded down, at least 1), or the first profile's when none
    runs. An unmeasured profile counts its engine's default.
    """
    by_name = {name: (engine, cap) for name, engine, cap in profiles}
    names = [n for n in running if n in by_name] or [p[0] for p in profiles[:1]]
    if not names:
        return FALLBACK_CAPACITY, False
    values = []
    measured = True
    for name in names:
        engine, cap = by_name[name]
        if cap > 0:
            values.append(cap)
        else:
            measured = False
            values.append(DEFAULT_CAPACITY.get(engine, FALLBACK_CAPACITY))
    return max(1, sum(values) // len(values)), measured


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.0f} ms"


def _load_words(load: Load, ready: int, capacity: int) -> str:
    waiting = f" and {load.waiting} waiting" if load.waiting else ""
    s = "" if ready == 1 else "s"
    return f"{load.in_flight} in flight{waiting} over {ready} replica{s}, capacity {capacity} each"


def _slow_words(load: Load, slo_ms: float) -> str:
    assert load.ttft_p99_ms is not None
    return f"TTFT p99 {_seconds(load.ttft_p99_ms)} over the {_seconds(slo_ms)} slo"


def decide(
    memory: Memory,
    load: Load,
    *,
    lo: int,
    hi: int,
    ready: int,
    capacity: int,
    slo_ttft_ms: float,
    now: float,
    up_after: float,
    down_after: float,
) -> Decision:
    """The target replica count between ``lo`` and ``hi`` for this load, and why.

    ``ready`` is how many of the model's replicas serve now; ``capacity`` what one
    carries (at least 1); ``slo_ttft_ms`` the model's TTFT p99 target, 0 for none.
    """
    hi = max(hi, lo)
    capacity = max(1, capacity)
    current = lo if memory.target is None else min(max(memory.target, lo), hi)
    need = math.ceil(round(load.demand / capacity, 6))
    # The min fell (a schedule window closed): replicas only the old min held go at
    # once, down to what the load needs; the load's own go slowly as ever.
    if memory.lo is not None and memory.target is not None and lo < memory.lo >= memory.target:
        current = min(max(need, lo), current)
    slow = (
        slo_ttft_ms > 0
        and load.ttft_p99_ms is not None
        and load.samples >= MIN_SAMPLES
        and load.ttft_p99_ms > slo_ttft_ms
        and load.demand > 0
    )
    # Slow while a replica is still starting says nothing of capacity: wait for it.
    slow_counts = slow and ready >= current
    words = _load_words(load, ready, capacity)
    if slow:
        words = f"{words}; {_slow_words(load, slo_ttft_ms)}"
    over = need > current or slow_counts
    quiet = current > lo and load.demand <= capacity * (current - 1) and not slow

    if over and current >= hi:
        why = _slow_words(load, slo_ttft_ms) if slow_counts and need <= hi else words
        reason = f"holding at max {hi}: {why}"
        return Decision(current, Memory(current, None, None, reason, lo), reason)
    if over:
        since = memory.over_since if memory.over_since is not None else now
        if now - since >= up_after:
            target = min(hi, max(need, current + 1))
            reason = f"scaled up to {target}: {words}"
            return Decision(target, Memory(target, None, None, reason, lo), reason, "up")
        reason = f"at {current}, scaling up if it holds {_left(since, now, up_after)}: {words}"
        return Decision(current, Memory(current, since, None, reason, lo), reason)
    if quiet:
        since = memory.quiet_since if memory.quiet_since is not None else now
        if now - since >= down_after:
            target = current - 1
            reason = f"scaled down to {target}: {words}, quiet for {down_after:g} s"
            # The next step down needs a quiet window of its own.
            return Decision(target, Memory(target, None, now, reason, lo), reason, "down")
        reason = f"at {current}, scaling down if quiet {_left(since, now, down_after)}: {words}"
        return Decision(current, Memory(current, None, since, reason, lo), reason)
    if current == lo and load.demand == 0:
        reason = f"at min {lo}: no load"
    elif current == lo:
        reason = f"at min {lo}: {words}"
    else:
        reason = f"steady at {current}: {words}"
    if memory.target is not None and memory.target != current:
        reason = f"{reason} (was {memory.target}; min {lo}, max {hi} now)"
    return Decision(current, replace(memory, target=current, over_since=None,
                                     quiet_since=None, reason=reason, lo=lo), reason)  # fmt: skip


def words_of(reason: str) -> str:
    """A reason without its figures: what it says, not how much."""
    return _FIGURE.sub("#", reason)


def worth_pushing(
    before: tuple[int | None, str] | None,
    after: tuple[int, str],
    last_push: float | None,
    now: float,
    every: float = FIGURES_EVERY,
) -> bool:
    """Whether a model's new (target, reason) goes to the consoles now.

    At once when the target or the reason's words change (or nothing was kept before);
    figures alone at most every ``every`` seconds since the last push; nothing new, never.
    """
    if before is None or before[0] != after[0]:
        return True
    if before[1] == after[1]:
        return False
    if words_of(before[1]) != words_of(after[1]):
        return True
    # A clock behind the last push (another run's): that push says nothing of this one.
    return last_push is None or not 0 <= now - last_push < every


def _left(since: float, now: float, window: float) -> str:
    return f"{max(0.0, window - (now - since)):.0f} s more (of {window:g} s)"


def quantile_ms(edges_ms: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The upper edge (ms) of the histogram bucket holding quantile ``q``; None with no
    sample; ``inf`` past the last edge (the gateway's histograms, ``cluster.load``)."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank and c:
            return float(edges_ms[i]) if i < len(edges_ms) else math.inf
    return math.inf
