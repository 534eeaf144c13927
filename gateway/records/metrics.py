"""``GET /metrics`` in Prometheus' text format: what the gateway served, from every
gateway process of this host.

Several processes (``manage.py serve`` and any number of ``manage.py gateway serve``)
each count their own traffic; a scrape of any of them must tell the whole host's. This
uses ``prometheus_client``'s multiprocess mode: each process writes its counters and
histograms to memory-mapped files of its own (named by its pid) in one folder,
``DATA_DIR/metrics`` (or ``PROMETHEUS_MULTIPROC_DIR`` when set), and a scrape sums the
folder's files. Writing a sample costs a lock and a write to mapped memory: no system
call, nothing on the request path waits. A request's ten samples are added up in memory
and written once a pass of the event loop (``Metrics.request``), so the requests a pass
ends write each series once; a scrape reads them one pass later at most. A process that starts forgets the in-flight
gauges of processes no longer alive; their counters stay, so the sums only grow (what
Prometheus' ``rate()`` expects). Remove the folder while no process runs to start from
zero. Hosts are scraped one by one: each has its own data folder.

Who may scrape: a bearer API token (``llmgw-…``, the tokens page) whose user holds the
viewer role; nothing is shown to anyone else (401, or 403 for a user without a role).
The token is read from memory when fresh (``guard.api.auth``), else on a thread.

The series (all ``llmgw_gateway_`` but the judge's):

- ``requests_total{model,status,owner}``; ``request_seconds{model}``,
  ``ttft_seconds{model}`` and ``engine_ttft_seconds{model}`` (histograms: the whole
  request; the client's time to first token, to the first byte of text released to it,
  after the guard's hold of a window; the engine's, to its first token as it reached
  the gateway);
- ``tokens_in_total{model}``, ``tokens_out_total{model}`` (the engines' usage);
- ``refusals_total{direction,category}`` (the guard's, on requests and answers);
  ``failed_open_windows_total`` (answers released unjudged under ``fail: open``);
- ``retries_total{model}``, ``fallbacks_total{model,to}``, ``overflows_total{model,to}``
  (requests of a lower band sent to the model's ``overflow`` while admission held it);
- ``ejections_total{model}`` (replicas ejected from routing, ``gateway.path.outliers``) and
  ``ejected_replicas{model}`` (out now: the most any live process has out);
- ``in_flight{replica}`` (summed over live processes; synced every half second);
- ``state_read_timestamp_seconds{part}``: when the table (``part="table"``) and the
  guard's policy and judges (``"guard"``) were last read whole, the oldest of the live
  processes (``time() - …`` is how stale a process serves while the database is away),
  and ``state_read_failures_total{part}``;
- ``llmgw_guard_judge_seconds{judge}``: the guard's checks as the gateway waited on them.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from django.db import connection

from gateway.path import series
from gateway.path.parts import Parts
from gateway.records.observe import Done, Listener
from guard.api.auth import token_user, token_user_in_memory
from llmgw_core.lean import bearer, headers
from llmgw_core.models import TOKEN_PREFIX
from llmgw_core.roles import VIEWER, has_role

NS = series.NS
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
JUDGE_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
PATH = "/metrics"
SYNC_EVERY = 0.5


_lock = threading.Lock()
_metrics: dict[str, Any] | None = None


def _setup() -> dict[str, Any]:
    """The metrics of this process, in multiprocess mode over ``series.folder()`` (once)."""
    global _metrics
    with _lock:
        if _metrics is not None:
            return _metrics
        series.multiprocess()
        # Imported here: prometheus_client picks its value class as it is imported; this
        # process's multiprocess folder is set first (series.multiprocess).
        from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return Counter(name, doc, labels, namespace=NS, registry=None)

        _metrics = {
            "requests": counter("requests", "requests answered", ("model", "status", "owner")),
            "dialects": counter("dialect_requests", "requests answered per API the client "
                                "spoke (chat, messages, count_tokens, responses)",
                                ("model", "dialect", "status")),
            "seconds": Histogram("request_seconds", "a request from its start to its end",
                                 ("model",), namespace=NS, buckets=SECONDS, registry=None),
            "ttft": Histogram("ttft_seconds", "the client's time to first token: a request's "
                              "start to the first byte of text released to it",
                              ("model",), namespace=NS, buckets=SECONDS, registry=None),
            "engine_ttft": Histogram("engine_ttft_seconds", "the engine's time to first "
                                     "token: a request's start to its first token reaching "
                                     "the gateway, before the guard's hold",
                                     ("model",), namespace=NS, buckets=SECONDS, registry=None),
            "tokens_in": counter("tokens_in", "prompt tokens (the engines' usage)", ("model",)),
            "tokens_out": counter("tokens_out", "answer tokens (the engines' usage)", ("model",)),
            "refusals": counter("refusals", "the guard's refusals", ("direction", "category")),
            "failed_open": counter("failed_open_windows",
                                   "answer windows released unjudged (fail: open)"),
            "retries": counter("retries", "requests moved to another replica", ("model",)),
            "fallbacks": counter("fallbacks", "requests sent to a fallback", ("model", "to")),
            "overflows": counter("overflows", "requests of a lower band sent to the model's "
                                 "overflow while admission held that band back",
                                 ("model", "to")),
            "in_flight": Gauge("in_flight", "requests in flight per replica", ("replica",),
                               namespace=NS, multiprocess_mode="livesum", registry=None),
            "ejections": counter("ejections", "replicas ejected from routing after "
                                 "failures in a row", ("model",)),
            "ejected": Gauge("ejected_replicas", "replicas out of routing now (the most "
                             "any live process has out)", ("model",), namespace=NS,
                             multiprocess_mode="livemax", registry=None),
            # When this process last read what it serves from (its table, the guard's
            # policy and judges), as Unix time; the oldest of the live processes.
            "state_read": Gauge("state_read_timestamp_seconds",
                                "when the process last read its table (part=table) or the "
                                "guard's policy and judges (part=guard) whole", ("part",),
                                namespace=NS, multiprocess_mode="livemin", registry=None),
            "state_failures": counter("state_read_failures",
                                      "reads of the table that failed or hung", ("part",)),
            "judge": Histogram("llmgw_guard_judge_seconds",
                               "the guard's checks as the gateway waited on them", ("judge",),
                               buckets=JUDGE_SECONDS, registry=None),
        }  # fmt: skip
        return _metrics


def state_read(part: str) -> None:
    """Note that this process read ``part`` of its state whole, now."""
    _setup()["state_read"].labels(part).set(time.time())


def state_failed(part: str) -> None:
    """Note that a read of ``part`` failed (or hung past its bound)."""
    _setup()["state_failures"].labels(part).inc()


def scrape() -> bytes:
    """Every process's samples of this host, summed, in Prometheus' text format."""
    _setup()
    # Imported here: prometheus_client picks its value class as it is imported; this
    # process's multiprocess folder is set first (series.multiprocess).
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess  # noqa: PLC0415

    registry = CollectorRegistry()
    registry.register(_Made(multiprocess.MultiProcessCollector, series.folder()))
    return visible(generate_latest(registry).decode()).encode()


class _Made:
    """The folder's files less those still being made: a process's new file is empty
    from its creation until it is sized (``prometheus_client``'s ``MmapedDict``), and the
    library's own collector fails the whole scrape on one (``struct.error``, a 500 to
    Prometheus whenever a process started or made its first sample of a kind). An empty
    file holds no sample yet, so leaving it out loses nothing."""

    def __init__(self, collector: Any, path: Path) -> None:
        self.collector, self.path = collector, path

    def collect(self) -> Any:
        files = []
        for f in self.path.glob("*.db"):
            try:
                if f.stat().st_size >= 8:
                    files.append(str(f))
            except FileNotFoundError:
                continue  # a dead process's live gauge, removed meanwhile
        return self.collector.merge(files, accumulate=True)


# Control characters as their Unicode pictures (U+2400 + code; DEL U+2421), the C1 ones
# as U+FFFD: the client escapes only \\, " and \n in a label value, and a raw CR or ESC
# from a name stored before the catalog refused them would break a scraper's lines.
_PICTURES = (
    {c: 0x2400 + c for c in range(0x20) if c != 0x0A}
    | {0x7F: 0x2421}
    | dict.fromkeys(range(0x80, 0xA0), 0xFFFD)
)


def visible(text: str) -> str:
    """Return the exposition with every control character but its line feeds visible."""
    return text.translate(_PICTURES)


class Metrics(Listener):
    """The gateway's observer that exports: each call writes its samples and returns."""

    def __init__(self) -> None:
        super().__init__()
        self.m = _setup()
        self._gateways: weakref.WeakSet[Parts] = weakref.WeakSet()
        self._shown: set[int] = set()
        self._syncing = False
        # The labelled children, looked up once (labels() costs more than the write).
        self._requests: dict[tuple[str, int, str], Any] = {}
        self._dialects: dict[tuple[str, str, int], Any] = {}
        self._per_model: dict[str, tuple[Any, ...]] = {}
        self._ejected_shown: set[str] = set()
        # The requests' samples added up, written once a pass of this loop (``request``).
        self._due: dict[Any, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def request(self, done: Done) -> None:
        if not self._syncing and self._gateways:
            self._start_sync()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or (self._loop is not None and loop is not self._loop):
            # Off the loop that writes (a thread, another loop): written at once.
            for value, amount in self._samples(done):
                value.inc(amount)
            return
        due = self._due
        if not due:
            if self._loop is None:
                self._loop = loop
            loop.call_soon(self._write)
        for value, amount in self._samples(done):
            due[value] = due.get(value, 0) + amount

    def _write(self) -> None:
        """Write the samples added up since the last pass (``request``)."""
        due, self._due = self._due, {}
        for value, amount in due.items():
            value.inc(amount)

    def _samples(self, done: Done) -> list[tuple[Any, float]]:
        """The values ``done`` adds to, and by how much: prometheus_client's own value
        objects (a counter's, a histogram's sum and the bucket its ``observe`` would add
        to), as its ``inc`` and ``observe`` write them."""
        requests = self._requests.get((done.model, done.status, done.owner))
        if requests is None:
            child = self.m["requests"].labels(done.model, str(done.status), done.owner)
            requests = self._requests[(done.model, done.status, done.owner)] = child._value
        spoke = self._dialects.get((done.model, done.dialect, done.status))
        if spoke is None:
            child = self.m["dialects"].labels(done.model, done.dialect, str(done.status))
            spoke = self._dialects[(done.model, done.dialect, done.status)] = child._value
        per_model = self._per_model.get(done.model)
        if per_model is None:
            m = self.m
            per_model = self._per_model[done.model] = tuple(
                m[k].labels(done.model)
                for k in ("seconds", "ttft", "engine_ttft", "tokens_in", "tokens_out")
            )
        seconds, ttft, engine_ttft, tokens_in, tokens_out = per_model
        out: list[tuple[Any, float]] = [(requests, 1), (spoke, 1)]
        _observed(out, seconds, done.seconds)
        if done.ttft is not None:
            _observed(out, ttft, done.ttft)
            if done.engine_ttft is not None:
                _observed(out, engine_ttft, done.engine_ttft)
        if done.tokens_in:
            out.append((tokens_in._value, done.tokens_in))
        if done.tokens_out:
            out.append((tokens_out._value, done.tokens_out))
        return out

    def retried(self, model: str) -> None:
        self.m["retries"].labels(model).inc()

    def ejected(self, model: str, replica: int, seconds: float, until: float) -> None:
        self.m["ejections"].labels(model).inc()
        if not self._syncing and self._gateways:
            self._start_sync()

    def fell_back(self, model: str, to: str) -> None:
        self.m["fallbacks"].labels(model, to).inc()

    def overflowed(self, model: str, to: str) -> None:
        self.m["overflows"].labels(model, to).inc()

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        for category in categories or ("",):
            self.m["refusals"].labels(direction, category).inc()

    def failed_open(self) -> None:
        self.m["failed_open"].inc()

    def judged(self, judge: str, seconds: float) -> None:
        self.m["judge"].labels(judge or "").observe(seconds)

    # In flight: the Gateway's own counts, copied every half second by a thread.
    def watch(self, parts: Parts) -> None:
        """Export a gateway's ``parts.in_flight`` (its requests in flight per replica) and
        its replicas out of routing (``gateway.path.outliers``); the thread that copies them
        starts with the first request (importing starts no thread)."""
        self._gateways.add(parts)

    def _start_sync(self) -> None:
        self._syncing = True
        threading.Thread(target=self._sync_loop, name="gateway-metrics", daemon=True).start()

    def sync(self) -> None:
        counts: dict[int, int] = {}
        for gateway in list(self._gateways):
            for replica, n in gateway.in_flight.copy().items():
                counts[replica] = counts.get(replica, 0) + n
        gauge = self.m["in_flight"]
        for replica in self._shown - set(counts):
            gauge.labels(str(replica)).set(0)
        for replica, n in counts.items():
            gauge.labels(str(replica)).set(n)
        self._shown = set(counts)
        # Each model's replicas out of routing (gateway.path.outliers), read as they are.
        out: dict[str, int] = {}
        for gateway in list(self._gateways):
            for model, replicas in gateway.outliers.out().items():
                out[model] = max(out.get(model, 0), len(replicas))
        for model in self._ejected_shown | set(out):
            self.m["ejected"].labels(model).set(out.get(model, 0))
        self._ejected_shown = set(out)

    def _sync_loop(self) -> None:
        while True:
            time.sleep(SYNC_EVERY)
            try:
                self.sync()
            except RuntimeError:
                continue  # a dict changed while copied: next time


def _observed(out: list[tuple[Any, float]], histogram: Any, amount: float) -> None:
    """What ``histogram.observe(amount)`` writes: its sum, and the first bucket whose
    bound is at or above ``amount`` (each bucket holds its own count; a scrape adds them
    up)."""
    out.append((histogram._sum, amount))
    index = bisect.bisect_left(histogram._upper_bounds, amount)
    out.append((histogram._buckets[index], 1))


def exported(parts: Parts, metrics: Metrics) -> None:
    """Tell ``metrics`` (which must be among the gateway's observers) a gateway's
    in-flight counts and its guard's time: its ``parts``' guard is wrapped."""
    parts.guard = TimedGuard(parts.guard, metrics)
    metrics.watch(parts)


class TimedGuard:
    """The guard as the gateway asks it, each check's time told to ``metrics``."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def directions(self) -> tuple[bool, bool]:
        return self.inner.directions()  # type: ignore[no-any-return]

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        start = time.perf_counter()
        result = await self.inner.judge(request, answer)
        if result.get("judged") is not False:
            self.metrics.judged(result.get("judge") or "", time.perf_counter() - start)
        return result  # type: ignore[no-any-return]


class MetricsRoute:
    """``GET /metrics`` for a viewer's API token; anything else to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH:
            await self.app(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _plain(send, 405, "GET /metrics\n", [(b"allow", b"GET")])
            return
        refused = await _refusal(scope)
        if refused is not None:
            await _plain(send, *refused)
            return
        # Imported here: prometheus_client picks its value class as it is imported; this
        # process's multiprocess folder is set first (series.multiprocess).
        from prometheus_client import CONTENT_TYPE_LATEST  # noqa: PLC0415

        body = await asyncio.to_thread(scrape)
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                   (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")]  # fmt: skip
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )


async def _refusal(scope: dict[str, Any]) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
    secret = bearer(headers(scope))
    challenge = [(b"www-authenticate", b'Bearer realm="llmgw metrics"')]
    if not secret or not secret.startswith(TOKEN_PREFIX):
        return (
            401,
            (
                "/metrics needs an API token: send Authorization: Bearer llmgw_… (a token of a "
                "user with the viewer role, from the console's Tokens page)\n"
            ),
            challenge,
        )
    found = token_user_in_memory(secret)
    if found is None:
        found = await asyncio.to_thread(_token_user, token_user, secret)
    if found is None:
        return 401, "/metrics: that API token is unknown, expired or revoked\n", challenge
    if not has_role(found[0], VIEWER):
        return 403, "/metrics: the token's user holds no role (viewer is needed)\n", []
    return None


def _token_user(lookup: Any, secret: str) -> Any:
    try:
        return lookup(secret)
    finally:
        connection.close()


async def _plain(send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode()), *extra]  # fmt: skip
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
