"""The console's live traffic: each gateway process's one-second aggregates per model,
published off the request path, summed by the web processes that show them.

A process's ``Traffic`` observer counts each request into the current second's bucket
(requests, errors, refusals, tokens out, and histograms on fixed edges of the client's
TTFT, the engine's and the time per output token): a few additions, no I/O. A thread of its own, once a second, takes
the finished seconds and publishes them as one ``gateway.records.traffic`` event
(``llmgw_core.events``: Redis in production, ``live.sock`` embedded), skipping seconds
with no traffic. Nothing of the request path waits on it; a publish that fails is
dropped (the next second brings fresh figures).

A web process keeps the last seconds of every process (``Window``, bounded) and its
consoles are pushed, at most once a second, each model's figures over the last
``SPAN`` seconds: requests/s, TTFT p50 and p99, tokens/s, error and refusal rates, and
the model's ``slo`` (``ttft_p99``, ``tpot_p99``) met or missed. The TTFT is the client's:
to the first byte of text released to it, after the guard's hold of a streamed window
(``gateway.records.observe.Done.ttft``), which is what an SLO is held to; the engine's (its first
token reaching the gateway) is shown beside it, p50 and p99. Percentiles are read
from the summed histograms (the upper edge of the bucket the quantile falls in, so a
"met" is never optimistic).

Each item carries ``dialects``, ``{dialect: requests}``: the APIs its clients spoke
(``gateway.path.dialect``: chat, messages, count_tokens, responses), summed per model over the
span (the Traffic page's "APIs" column). And ``batch``, when any: of its requests, those
a batch's runner sent (``gateway.batch``; the Traffic page's requests/s says live · batch).

Admission (``gateway.path.admission``) rides along too: an item carries ``bands``,
``{band: [admitted, held]}`` for its second, when any request of the model met its gate;
the window sums them per model and band over the span (the Traffic page's "admitted ·
held" column).

Overflow rides along: an item carries ``overflowed``, ``{to: requests}``, the requests of
a lower band that admission held back for the model and that went to its ``overflow`` model
instead in that second; the window sums them per model over the span (the Traffic page's
"admitted · held" column says "N to MODEL").

A process's replicas out of routing (``gateway.path.outliers``) ride along: each second it
publishes (one with no traffic too, while any is out), a model's item carries
``ejected``, ``[[replica, until], ...]`` (``until`` a Unix time); the window shows each
one until the latest ``until`` any process said, with how many processes said it.

Session affinity (``gateway.path.affinity``) rides along too: while a process remembers
sessions of a model, each second's item of that model carries ``sessions``, ``[held,
kept, moved, new]``: the sessions it holds now, and its session turns of that second that
kept their replica, moved, or began one. The window sums each process's last ``held``
and the turns over the span (the Traffic page's "sessions · kept" column).

The same thread writes the process's load report for the reconciler's scaling each
second (``gateway.records.loadreport``, given by ``report_load``): in flight and waiting per
model now, and the TTFT counts of the seconds it just took.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.path import admission
from gateway.path.admission import EDGES_MS, bucket, quantile  # the histograms' one reading
from gateway.path.parts import Parts
from gateway.records.loadreport import LoadReport
from gateway.records.observe import Done, Listener
from llmgw_core import events

log = logging.getLogger(__name__)

GROUP = "gateway.traffic"
TYPE = "gateway.traffic_changed"
SPAN = 5  # seconds the console's figures cover
KEEP = 15  # seconds a web process keeps
MAX_MODELS = 100  # a process publishes at most this many models a second (one datagram)
MAX_OVERFLOWS = 16  # overflow models counted per model a second (one names one)

_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("gateway_refused", default=False)


@dataclass
class Bucket:
    requests: int = 0
    errors: int = 0
    refusals: int = 0
    tokens_out: int = 0
    ttft: list[int] = field(default_factory=lambda: [0] * (len(EDGES_MS) + 1))
    engine_ttft: list[int] = field(default_factory=lambda: [0] * (len(EDGES_MS) + 1))
    tpot: list[int] = field(default_factory=lambda: [0] * (len(EDGES_MS) + 1))
    # Requests by the API their clients spoke (gateway.path.dialect): chat, messages, ...
    dialects: dict[str, int] = field(default_factory=dict)
    # Requests held back by admission and sent to the model's overflow, by that model.
    overflowed: dict[str, int] = field(default_factory=dict)
    batch: int = 0  # of requests, those a batch's runner sent (gateway.batch)


class Traffic(Listener):
    """Counts each request into this second's buckets; ``start()`` publishes them."""

    def __init__(self, publish: Any = None) -> None:
        super().__init__()
        self.process = f"{socket.gethostname()}:{os.getpid()}"
        self.seconds: dict[int, dict[str, Bucket]] = {}
        self._publish = publish
        self._started = False
        self._lock = threading.Lock()
        # Replicas this process ejected: (model, replica) -> until (a Unix time).
        self.ejections: dict[tuple[str, int], float] = {}
        self.load: Any = None  # gateway.records.loadreport.LoadReport, once report_load is called
        self.sessions: Any = None  # gateway.path.affinity.Sessions, once watch_sessions is called
        self._turns: dict[str, tuple[int, int, int]] = {}  # kept, moved, new last published

    def watch_sessions(self, sessions: Any) -> None:
        """Publish ``sessions``' figures (``gateway.path.affinity.Sessions``) each second too."""
        self.sessions = sessions

    def report_load(self, parts: Parts) -> None:
        """Report the load of the gateway of ``parts`` each second too
        (``gateway.records.loadreport``)."""
        self.load = LoadReport(parts, self.process)

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        _refused.set(True)  # the request's own task: its Done follows

    def ejected(self, model: str, replica: int, seconds: float, until: float) -> None:
        if not self._started:
            self.start()
        with self._lock:
            self.ejections[(model, replica)] = until

    def overflowed(self, model: str, to: str) -> None:
        if not self._started:
            self.start()
        second = int(time.time())
        with self._lock:
            models = self.seconds.setdefault(second, {})
            b = models.get(model)
            if b is None:
                if len(models) >= MAX_MODELS:
                    return
                b = models[model] = Bucket()
            if to in b.overflowed or len(b.overflowed) < MAX_OVERFLOWS:
                b.overflowed[to] = b.overflowed.get(to, 0) + 1

    def request(self, done: Done) -> None:
        if not self._started:
            self.start()
        refused = _refused.get()
        if refused:
            _refused.set(False)
        if not done.model:
            return
        second = int(time.time())
        with self._lock:
            models = self.seconds.setdefault(second, {})
            b = models.get(done.model)
            if b is None:
                if len(models) >= MAX_MODELS:
                    return
                b = models[done.model] = Bucket()
            b.requests += 1
            if done.batch:
                b.batch += 1
            b.dialects[done.dialect] = b.dialects.get(done.dialect, 0) + 1
            if refused:
                b.refusals += 1
            elif done.status >= 500 or done.status == 429:
                b.errors += 1
            b.tokens_out += done.tokens_out
            # Neither the bench's deliberate overload nor a batch's lines that may not add
            # replicas count toward the TTFT load scaling and the SLO read.
            if done.ttft is not None and done.status == 200 and not done.pinned \
                    and done.batch != "idle":  # fmt: skip
                b.ttft[bucket(done.ttft * 1000)] += 1
                if done.engine_ttft is not None:
                    b.engine_ttft[bucket(done.engine_ttft * 1000)] += 1
                if done.stream and done.tokens_out > 1:
                    per = (done.seconds - done.ttft) * 1000 / (done.tokens_out - 1)
                    b.tpot[bucket(per)] += 1

    def take(self, before: int) -> list[dict[str, Any]]:
        """The finished seconds (before ``before``) as the event carries them."""
        now = time.time()
        with self._lock:
            done = [s for s in self.seconds if s < before]
            taken = {s: self.seconds.pop(s) for s in done}
            for key in [k for k, until in self.ejections.items() if until <= now]:
                del self.ejections[key]
            out: dict[str, list[list[float]]] = {}
            for (model, replica), until in sorted(self.ejections.items()):
                out.setdefault(model, []).append([replica, until])
        # Admitted and held per band (gateway.path.admission), with the same seconds.
        bands = admission.COUNTS.take(before)
        for s, models in bands.items():
            into = taken.setdefault(s, {})
            for model in models:
                if model not in into and len(into) < MAX_MODELS:
                    into[model] = Bucket()
        if out:
            # The last second taken says what is out now (a second of its own if none).
            last = taken.setdefault(max(taken, default=before - 1), {})
            for model in out:
                if model not in last and len(last) < MAX_MODELS:
                    last[model] = Bucket()
        affinity = self._affinity()
        if affinity:
            last = taken.setdefault(max(taken, default=before - 1), {})
            for model in affinity:
                if model not in last and len(last) < MAX_MODELS:
                    last[model] = Bucket()
        items = [
            {"process": self.process, "second": s, "model": name, "requests": b.requests,
             "errors": b.errors, "refusals": b.refusals, "tokens_out": b.tokens_out,
             "ttft": b.ttft, "engine_ttft": b.engine_ttft, "tpot": b.tpot,
             "dialects": b.dialects, **({"batch": b.batch} if b.batch else {})}
            for s, models in sorted(taken.items()) for name, b in models.items()
        ]  # fmt: skip
        for item in items:
            counted = bands.get(item["second"], {}).get(item["model"])
            if counted:
                item["bands"] = counted
            overflowed = taken[item["second"]][item["model"]].overflowed
            if overflowed:
                item["overflowed"] = overflowed
        if out or affinity:
            last_second = items[-1]["second"]
            for item in items:
                if item["second"] == last_second and item["model"] in out:
                    item["ejected"] = out[item["model"]]
                if item["second"] == last_second and item["model"] in affinity:
                    item["sessions"] = affinity[item["model"]]
        return items

    def _affinity(self) -> dict[str, list[int]]:
        """Per model: [sessions held, turns kept, moved, new since the last call], for the
        models with sessions held or turns since."""
        if self.sessions is None:
            return {}
        out = {}
        for model, f in self.sessions.figures(time.monotonic()).items():
            seen = self._turns.get(model, (0, 0, 0))
            turns = (f["kept"], f["moved"], f["new"])
            self._turns[model] = turns
            since = [max(0, a - b) for a, b in zip(turns, seen, strict=True)]
            if f["sessions"] or any(since):
                out[model] = [f["sessions"], *since]
        return out

    def start(self) -> None:
        """Publish each second from now, and sample the load (the servers call it when
        they start; a first request does, for an application served another way)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        if self.load is not None:
            self.load.start_sampling()
        threading.Thread(target=self._loop, name="gateway-traffic", daemon=True).start()

    def publish_once(self) -> None:
        items = self.take(int(time.time()))
        if self.load is not None:
            self.load.tick(items)  # never raises
        for second in sorted({i["second"] for i in items}):
            of = [i for i in items if i["second"] == second]
            message = {"type": TYPE, "id": f"{self.process}:{second}", "models": of}
            (self._publish or _send)(message)

    def _loop(self) -> None:
        while True:
            time.sleep(1.0 - (time.time() % 1.0) + 0.05)
            try:
                self.publish_once()
            except Exception:
                log.warning("could not publish the gateway's traffic", exc_info=True)


def _send(message: dict[str, Any]) -> None:
    events.send(GROUP, message)


class Window:
    """What a web process heard from every gateway process: the last ``KEEP`` seconds."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, int, str], dict[str, Any]] = {}
        # Since when the process hears the gateways (None: not yet): before SPAN seconds
        # of it, an empty window says nothing of their traffic.
        self.listening_since: float | None = None

    def listen(self, now: float | None = None) -> None:
        """Note that the process hears the gateways from now (once; later calls keep it)."""
        if self.listening_since is None:
            self.listening_since = time.time() if now is None else now

    def heard_for(self, now: float | None = None) -> float:
        """Seconds the process has heard the gateways for (0 when it does not)."""
        if self.listening_since is None:
            return 0.0
        return (time.time() if now is None else now) - self.listening_since

    def add(self, items: list[dict[str, Any]], now: float | None = None) -> None:
        now = time.time() if now is None else now
        for item in items:
            if not isinstance(item, dict) or not _well_formed(item):
                continue
            if item["second"] < now - KEEP:
                continue
            self.items[(item["process"], item["second"], item["model"])] = item
        for key in [k for k in self.items if k[1] < now - KEEP]:
            del self.items[key]

    def ejected(self, now: float | None = None) -> list[dict[str, Any]]:
        """The replicas some gateway process has out of routing now, by each process's
        last second heard: each with the latest time one said it comes back at, and how
        many processes have it out."""
        now = time.time() if now is None else now
        last: dict[str, int] = {}
        items = list(self.items.items())  # the event loop adds while a view reads
        for (process, second, _), _item in items:
            last[process] = max(last.get(process, second), second)
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for (process, second, model), item in items:
            if second != last[process]:
                continue
            for replica, until in item.get("ejected", ()):
                if until <= now:
                    continue
                row = out.setdefault((model, replica), {"model": model, "replica": replica,
                                                        "until": until, "processes": 0})  # fmt: skip
                row["until"] = max(row["until"], until)
                row["processes"] += 1
        return [out[k] for k in sorted(out)]

    def summary(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Each model's figures over the last ``SPAN`` finished seconds."""
        now = time.time() if now is None else now
        last = int(now) - 1
        first = last - SPAN + 1
        sums: dict[str, dict[str, Any]] = {}
        for (_, second, model), item in list(self.items.items()):
            if not first <= second <= last:
                continue
            s = sums.setdefault(model, {"requests": 0, "errors": 0, "refusals": 0,
                                        "tokens_out": 0, "ttft": [0] * (len(EDGES_MS) + 1),
                                        "engine_ttft": [0] * (len(EDGES_MS) + 1),
                                        "tpot": [0] * (len(EDGES_MS) + 1)})  # fmt: skip
            for k in ("requests", "errors", "refusals", "tokens_out"):
                s[k] += item[k]
            s["batch"] = s.get("batch", 0) + item.get("batch", 0)
            for dialect, n in item.get("dialects", {}).items():
                spoke = s.setdefault("dialects", {})
                spoke[dialect] = spoke.get(dialect, 0) + n
            for to, n in item.get("overflowed", {}).items():
                went = s.setdefault("overflowed", {})
                went[to] = went.get(to, 0) + n
            for band, (took, held) in item.get("bands", {}).items():
                pair = s.setdefault("bands", {}).setdefault(band, [0, 0])
                pair[0] += took
                pair[1] += held
            if "sessions" in item:
                _, kept, moved, new = item["sessions"]
                s["turns"] = [a + b for a, b in zip(s.get("turns", [0, 0, 0]),
                                                    (kept, moved, new), strict=True)]  # fmt: skip
            for k in ("ttft", "engine_ttft", "tpot"):
                # A process of an older release sends no engine_ttft: none counted.
                got = item.get(k) or [0] * (len(EDGES_MS) + 1)
                s[k] = [a + b for a, b in zip(s[k], got, strict=True)]
        # The sessions each process holds, by its last second heard that said them.
        held: dict[str, dict[str, tuple[int, int]]] = {}
        for (process, second, model), item in self.items.items():
            if "sessions" in item and second <= last:
                had = held.setdefault(model, {}).get(process)
                if had is None or second > had[0]:
                    held[model][process] = (second, item["sessions"][0])
        out = {}
        for model, s in sorted(sums.items()):
            n = s["requests"]
            kept, moved, new = s.get("turns", (0, 0, 0))
            out[model] = {
                "rps": n / SPAN,
                # Of them, a batch's lines (gateway.batch) and the live requests.
                "batch_rps": s.get("batch", 0) / SPAN,
                "live_rps": (n - s.get("batch", 0)) / SPAN,
                "tokens_per_s": s["tokens_out"] / SPAN,
                "error_rate": s["errors"] / n if n else 0.0,
                "refusal_rate": s["refusals"] / n if n else 0.0,
                "ttft_p50_ms": quantile(s["ttft"], 0.5),
                "ttft_p99_ms": quantile(s["ttft"], 0.99),
                "engine_ttft_p50_ms": quantile(s["engine_ttft"], 0.5),
                "engine_ttft_p99_ms": quantile(s["engine_ttft"], 0.99),
                "tpot_p99_ms": quantile(s["tpot"], 0.99),
                # Session affinity: the sessions held now, and the share of the span's
                # turns that named a session known already and kept its replica.
                "sessions": sum(h for _, h in held.get(model, {}).values()),
                "session_turns": kept + moved + new,
                "kept_share": kept / (kept + moved) if kept + moved else None,
                # Admission per band: [admitted, held] over the span, top band first.
                "bands": [
                    {"band": b, "admitted": s["bands"][b][0], "held": s["bands"][b][1]}
                    for b in admission.BANDS
                    if b in s.get("bands", {})
                ],
                # Held back by admission and sent to the model's overflow, per model.
                "overflowed": [
                    {"to": to, "requests": n} for to, n in sorted(s.get("overflowed", {}).items())
                ],
                # Requests per API the clients spoke over the span, most first.
                "dialects": [
                    {"dialect": d, "requests": n}
                    for d, n in sorted(s.get("dialects", {}).items(), key=lambda p: (-p[1], p[0]))
                ],
            }
        return out


def _well_formed(item: dict[str, Any]) -> bool:
    ints = ("second", "requests", "errors", "refusals", "tokens_out")
    ejected = item.get("ejected", [])
    bands = item.get("bands", {})
    sessions = item.get("sessions", [0, 0, 0, 0])
    dialects = item.get("dialects", {})
    overflowed = item.get("overflowed", {})
    batch = item.get("batch", 0)
    return (
        isinstance(overflowed, dict)
        and len(overflowed) <= MAX_OVERFLOWS
        and all(
            isinstance(t, str)
            and len(t) <= 200
            and isinstance(n, int)
            and not isinstance(n, bool)
            and n >= 0
            for t, n in overflowed.items()
        )
        and isinstance(sessions, list)
        and len(sessions) == 4
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sessions)
        and isinstance(dialects, dict)
        and len(dialects) <= 16
        and all(
            isinstance(d, str)
            and len(d) <= 32
            and isinstance(n, int)
            and not isinstance(n, bool)
            and n >= 0
            for d, n in dialects.items()
        )  # fmt: skip
        and isinstance(bands, dict)
        and all(
            b in admission.RANK
            and isinstance(v, list)
            and len(v) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v)
            for b, v in bands.items()
        )
        and isinstance(ejected, list)
        and all(
            isinstance(e, list)
            and len(e) == 2
            and isinstance(e[0], int)
            and isinstance(e[1], int | float)
            and not isinstance(e[1], bool)
            for e in ejected
        )
        and isinstance(item.get("process"), str)
        and isinstance(item.get("model"), str)
        and all(isinstance(item.get(k), int) and item[k] >= 0 for k in ints)
        and all(
            isinstance(item.get(k), list)
            and len(item[k]) == len(EDGES_MS) + 1
            and all(isinstance(v, int) and v >= 0 for v in item[k])
            for k in ("ttft", "tpot", *(("engine_ttft",) if "engine_ttft" in item else ()))
        )
        and isinstance(batch, int)
        and not isinstance(batch, bool)
        and 0 <= batch <= item["requests"]
    )


def slo_verdict(p99_ms: float | None, slo_ns: int) -> str:
    """``met``, ``missed``, or ``""`` when the model sets no such SLO or nothing was seen."""
    if not slo_ns or p99_ms is None:
        return ""
    return "met" if p99_ms <= slo_ns / 1e6 else "missed"
