"""What the gateway tells of its traffic, and the default listener: counts in memory.

``Gateway`` calls an ``Observer`` once per request when it is answered (or given up on),
and when it retries, falls back or refuses. The calls are cheap and make no I/O: a
listener that exports (``/metrics``) or pushes to the console keeps its own aggregates
and sends them off the request path.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Done:
    """One request, as it ended; every listener is given the same one, and none changes
    it. (Not frozen: a frozen dataclass of this size cost a request more to make than
    most of its listeners took to read it.)"""

    model: str  # the catalog model that answered ("" when none was named or found)
    status: int
    owner: str
    key: str
    seconds: float
    # The client's time to first token: to the first byte of the answer's text released
    # to it (streams: after the guard's hold of a window), or to the answer sent.
    ttft: float | None
    tokens_in: int
    tokens_out: int
    replica: int | None
    stream: bool
    # The engine's: to its first token as it reached the gateway (or its whole answer),
    # before any hold of the guard's.
    engine_ttft: float | None = None
    # Sent by a key pinned to one replica (the capacity bench's): its times are the bench's
    # deliberate overload, not the model's service (no TTFT for the SLO or load scaling).
    pinned: bool = False
    # The API the client spoke: chat (chat, completions, embeddings), messages,
    # count_tokens or responses (gateway.path.dialect).
    dialect: str = "chat"
    # Of tokens_in, those the engine read from its prefix cache.
    tokens_cached: int = 0
    # Sent by a batch's runner (gateway.batch: "idle" or "scale", Key.batch; "" for every
    # other request): counted apart from live traffic.
    batch: str = ""


@dataclass(frozen=True)
class RefusalHeard:
    """A request or answer the guard refused, as the listeners hear it: what the client
    was told, never the text (the row it is kept as is ``gateway.models.Refusal``)."""

    request_id: str
    key: str
    owner: str
    model: str
    direction: str
    judge: str
    verdict: str
    categories: tuple[str, ...]
    score: float | None
    judged: bool  # False: no judge answered and the policy fails closed
    # The judges that gave no verdict on the way: (judge, kind), kind as guard.chain's.
    failures: tuple[tuple[str, str], ...] = ()


class Listener:
    """What the Gateway tells of its traffic, each call doing nothing: an exporter
    (metrics, usage, refusal records, canaries, the console's traffic) overrides what it
    needs and is given to a ``Fanout``."""

    def request(self, done: Done) -> None:
        """One request, as it ended."""

    def retried(self, model: str) -> None:
        """An attempt on one of ``model``'s replicas failed before the first byte."""

    def fell_back(self, model: str, to: str) -> None:
        """A request for ``model`` went to its fallback ``to``."""

    def overflowed(self, model: str, to: str) -> None:
        """A lower band's request for ``model``, held back by admission, went to the
        model's ``overflow`` ``to`` instead."""

    def ejected(self, model: str, replica: int, seconds: float, until: float) -> None:
        """``replica`` of ``model`` was ejected from routing for ``seconds``, until the
        Unix time ``until`` (``gateway.path.outliers``)."""

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        """The guard refused a request or an answer."""

    def failed_open(self) -> None:
        """A window every judge failed on was released under ``fail: open``."""

    def unauthenticated(self) -> None:
        """A request refused 401 (no key, or one unknown, revoked or expired)."""

    def refusal(self, record: RefusalHeard) -> None:
        """A refusal's record, with the request id its client got."""


@dataclass
class Observer(Listener):
    """Counts in memory (tests and the console read them), and the Gateway's default."""

    requests: dict[tuple[str, int, str], int] = field(default_factory=dict)
    tokens_in: dict[str, int] = field(default_factory=dict)
    tokens_out: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)
    overflows: dict[tuple[str, str], int] = field(default_factory=dict)
    ejections: dict[str, int] = field(default_factory=dict)
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)
    failed_open_windows: int = 0
    unauthenticated_requests: int = 0
    last: Done | None = None
    last_refusal: RefusalHeard | None = None

    def request(self, done: Done) -> None:
        k = (done.model, done.status, done.owner)
        self.requests[k] = self.requests.get(k, 0) + 1
        if done.tokens_in:
            self.tokens_in[done.model] = self.tokens_in.get(done.model, 0) + done.tokens_in
        if done.tokens_out:
            self.tokens_out[done.model] = self.tokens_out.get(done.model, 0) + done.tokens_out
        self.last = done

    def retried(self, model: str) -> None:
        self.retries[model] = self.retries.get(model, 0) + 1

    def fell_back(self, model: str, to: str) -> None:
        self.fallbacks[(model, to)] = self.fallbacks.get((model, to), 0) + 1

    def overflowed(self, model: str, to: str) -> None:
        self.overflows[(model, to)] = self.overflows.get((model, to), 0) + 1

    def ejected(self, model: str, replica: int, seconds: float, until: float) -> None:
        self.ejections[model] = self.ejections.get(model, 0) + 1

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        for category in categories or ("",):
            k = (direction, category)
            self.refusals[k] = self.refusals.get(k, 0) + 1

    def failed_open(self) -> None:
        self.failed_open_windows += 1

    def unauthenticated(self) -> None:
        self.unauthenticated_requests += 1

    def refusal(self, record: RefusalHeard) -> None:
        self.last_refusal = record


class Fanout(Observer):
    """Counts in memory, and tells every listener given (metrics, canaries, usage)."""

    def __init__(self, *listeners: Listener) -> None:
        super().__init__()
        self.listeners = listeners

    def request(self, done: Done) -> None:
        super().request(done)
        for listener in self.listeners:
            listener.request(done)

    def retried(self, model: str) -> None:
        super().retried(model)
        for listener in self.listeners:
            listener.retried(model)

    def fell_back(self, model: str, to: str) -> None:
        super().fell_back(model, to)
        for listener in self.listeners:
            listener.fell_back(model, to)

    def overflowed(self, model: str, to: str) -> None:
        super().overflowed(model, to)
        for listener in self.listeners:
            listener.overflowed(model, to)

    def ejected(self, model: str, replica: int, seconds: float, until: float) -> None:
        super().ejected(model, replica, seconds, until)
        for listener in self.listeners:
            listener.ejected(model, replica, seconds, until)

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        super().refused(direction, judge, categories)
        for listener in self.listeners:
            listener.refused(direction, judge, categories)

    def failed_open(self) -> None:
        super().failed_open()
        for listener in self.listeners:
            listener.failed_open()

    def unauthenticated(self) -> None:
        super().unauthenticated()
        for listener in self.listeners:
            listener.unauthenticated()

    def refusal(self, record: RefusalHeard) -> None:
        super().refusal(record)
        for listener in self.listeners:
            listener.refusal(record)
