"""How long the gateway waits on a model, worked out from what the catalog says of it.

A small model answers its first token in a fraction of a second and a 70B one across two
nodes can take a minute on a long prompt, so one timeout for every model is either too
short for the large ones (a healthy but slow replica is given up on, and the retry on the
next one fails the same way: gpustack #4725, a 10 s idle timeout) or too long for the small
ones (a hung replica holds its requests for minutes before they move). The catalog already
says what each model is expected to do: ``slo.ttft_p99`` and ``slo.tpot_p99``, and each
profile's ``startup_timeout``. The gateway's waits are read from them; a model that gives
none takes the site's defaults, which the gateway gives (``use_site_defaults``).

- ``first_token``: to the first token. For a stream, the engine's answer head and its
  first event, counted from when the request was sent to that replica; for an embedding,
  the whole answer. ``FIRST_TOKEN_FACTOR`` times ``slo.ttft_p99``, never under
  ``FIRST_TOKEN_FLOOR``; else the default. Before the first byte
  reached the client, running out of it moves the request to another replica.
- ``between``: the longest silence after that (a stream's next event, the rest of a whole
  answer's body). ``BETWEEN_FACTOR`` times ``slo.tpot_p99``, never under ``BETWEEN_FLOOR``;
  else the default.
- ``whole``: an answer that is not streamed arrives all at once, after its last token, so
  its wait is ``first_token`` plus, for each token the request may generate (its own
  ``max_tokens``, else the model's ``max_output``), ``BETWEEN_FACTOR`` times
  ``slo.tpot_p99``. Without either number, the default. (A single
  first-byte timeout for whole answers cut off every one that took longer to generate
  than a stream's first token may take.)
- ``wake``: how long a request for a model with no ready replica is held while one
  starts: the profiles' longest ``startup_timeout`` (the longest a start may take) and
  ``WAKE_MARGIN``, at most the default (the longest the site lets a client be held). Every profile
  has a startup_timeout (20 minutes when not written), so the setting is what bounds
  most models; one that loads in a minute and says so is given up on sooner.

Pure: plain data in, plain data out. The gateway calls ``waits`` on its request path; the
model's page calls ``explain`` to say what they are and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.durations import format_duration

NS = 1e9

FIRST_TOKEN_FACTOR = 10
FIRST_TOKEN_FLOOR = 10.0
BETWEEN_FACTOR = 10
BETWEEN_FLOOR = 15.0
WAKE_MARGIN = 30.0


@dataclass(frozen=True)
class Defaults:
    """The waits of a model whose catalog entry says nothing, and, for ``explain``, where
    each is set (``set_by["wake"]``: the setting, as the model's page names it).

    The layer that owns them gives them: the gateway registers its settings' in its
    ``AppConfig.ready()`` (``use_site_defaults``); the catalog knows none of their names.
    """

    first_token: float
    between: float
    whole: float
    wake: float
    set_by: Mapping[str, str] = field(default_factory=dict)

    def said(self, name: str) -> str:
        """Return where the wait ``name`` is set, as ``explain`` says it."""
        return self.set_by.get(name, "the site's default")


_site: Callable[[], Defaults] | None = None


def use_site_defaults(read: Callable[[], Defaults]) -> None:
    """Set what gives the site's defaults (the gateway's ``ready()`` does)."""
    global _site
    _site = read


def site_defaults() -> Defaults:
    """Return the site's defaults; raise LookupError when no app gave them."""
    if _site is None:
        raise LookupError("no app gave the gateway's waits (catalog.timeouts.use_site_defaults)")
    return _site()


@dataclass(frozen=True)
class Waits:
    """One model's waits, in seconds. ``per_token`` is 0 when ``slo.tpot_p99`` is unset."""

    first_token: float
    between: float
    per_token: float
    whole_default: float
    max_output: int
    wake: float

    def whole(self, max_tokens: int | None) -> float:
        """The wait for a whole (not streamed) answer of at most ``max_tokens`` tokens."""
        tokens = max_tokens or self.max_output
        if not self.per_token or not tokens:
            return max(self.whole_default, self.first_token)
        return self.first_token + tokens * self.per_token


def waits(model: Any, defaults: Defaults) -> Waits:
    """Return the waits for ``model`` (a ``catalog.spec.Model``)."""
    ttft, tpot = model.slo.ttft_p99 / NS, model.slo.tpot_p99 / NS
    first = max(FIRST_TOKEN_FLOOR, FIRST_TOKEN_FACTOR * ttft) if ttft > 0 else defaults.first_token
    between = max(BETWEEN_FLOOR, BETWEEN_FACTOR * tpot) if tpot > 0 else defaults.between
    return Waits(
        first_token=first,
        between=between,
        per_token=BETWEEN_FACTOR * tpot if tpot > 0 else 0.0,
        whole_default=defaults.whole,
        max_output=model.max_output or 0,
        wake=wake_wait(model, defaults.wake),
    )


def wake_wait(model: Any, most: float) -> float:
    """How long a request for ``model`` with no ready replica waits for one, at most
    ``most`` (the site's default)."""
    longest = max((p.startup_timeout for p in model.profiles), default=0)
    if longest <= 0:
        return most
    return min(most, longest / NS + WAKE_MARGIN)


def _seconds(value: float) -> str:
    return format_duration(round(value * NS))


def _why_slo(field: str, ns: int, factor: int, floor: float, default: str) -> str:
    if not ns:
        return f"no slo.{field}: {default}"
    return f"{factor} × slo.{field} of {format_duration(ns)}, at least {_seconds(floor)}"


def explain(model: Any, defaults: Defaults) -> list[tuple[str, str, str]]:
    """Each wait as the model's page shows it: (name, how long, why)."""
    w = waits(model, defaults)
    ttft, tpot = model.slo.ttft_p99, model.slo.tpot_p99
    rows = [
        ("first token", _seconds(w.first_token),
         _why_slo("ttft_p99", ttft, FIRST_TOKEN_FACTOR, FIRST_TOKEN_FLOOR,
                  defaults.said("first_token"))),
        ("between tokens", _seconds(w.between),
         _why_slo("tpot_p99", tpot, BETWEEN_FACTOR, BETWEEN_FLOOR, defaults.said("between"))),
    ]  # fmt: skip
    if w.per_token and w.max_output:
        whole = (f"{_seconds(w.first_token)} + {_seconds(w.per_token)} a token asked for",
                 f"{_seconds(w.whole(None))} at max_output {w.max_output}")  # fmt: skip
        rows.append(("whole answer", whole[0], whole[1] + "; less for a smaller max_tokens"))
    elif w.per_token:
        rows.append(("whole answer",
                     f"{_seconds(w.first_token)} + {_seconds(w.per_token)} a token asked for",
                     "a request without max_tokens (and no max_output): "
                     + defaults.said("whole")))  # fmt: skip
    else:
        rows.append(("whole answer", _seconds(w.whole(None)),
                     "no slo.tpot_p99: " + defaults.said("whole")))  # fmt: skip
    longest = max((p.startup_timeout for p in model.profiles), default=0)
    if longest and w.wake < defaults.wake:
        why = (f"the longest startup_timeout, {format_duration(longest)}, and "
               f"{_seconds(WAKE_MARGIN)}")  # fmt: skip
    elif longest:
        why = (f"{defaults.said('wake')}, shorter than the longest "
               f"startup_timeout, {format_duration(longest)}, and {_seconds(WAKE_MARGIN)}")  # fmt: skip
    else:
        why = "no profile: " + defaults.said("wake")
    rows.append(("held while waking", _seconds(w.wake), why))
    return rows
