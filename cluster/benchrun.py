"""The capacity bench: measure what one replica of a profile carries within its model's
slo, and write it as the profile's ``capacity`` and router ``weight``.

``measure`` picks a ready replica of the model (of ``profile``, if given) and drives it
through the gateway (``LLMGW_GATEWAY_URL``), as clients reach it: an engine check first
(a whole answer and a streamed one, each well-formed), then rising concurrency
(``cluster.bench`` decides the levels and the verdicts); ``write`` writes the figures
through the catalog's services, logged with them.

The requests carry a client key made for the run and revoked after it, however it ends
(``gateway.services.pinned_key``, registered here by the gateway's ``ready()``: the
cluster imports no gateway). The key is pinned to the measured replica: the gateway
sends its requests there alone (no other replica, no canary, no fallback; a 503 naming
the replica when it leaves routing), since the gateway spreads a model's requests over
all its replicas and profiles and a profile's figure must be its own. It names the model
alone, has no owner (no quota, no token budget) and is in the top band; its requests skip
admission (never held, their deliberate overload not counted against the model's slo)
and the guard (a judge's windows would time the guard, not the replica).

Started from ``manage.py cluster bench``, ``POST /api/v1/cluster/models/{name}/bench/``
and the Bench button of a model's card (``start``: a Celery worker in production, a
thread of the web process embedded). Every run is logged as cluster actions: ``bench``
when it starts, and ``bench done`` with its table, or ``bench failed`` with why.
Every call to the gateway has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import close_old_connections, transaction

from catalog import rules
from catalog import services as catalog_services
from catalog.choices import Surface
from catalog.models import ServedModel
from cluster import bench, services
from cluster.choices import ReplicaState
from cluster.models import Replica
from llmgw_core import events

log = logging.getLogger(__name__)

PROMPT = "Count from one to fifty, one number a line."
MAX_TOKENS = 24
PER_CLIENT = 3  # requests each client sends in turn at a level
TIMEOUT = 60.0  # seconds any one request may take
CHECK_TOKENS = 8
# How long the engine check waits for the gateway to route the run's key to its replica
# (a new key and a replica just ready reach a gateway process's table within a second).
ROUTED_WITHIN = 30.0
VIA = "bench"
# The gateway's error code for a pinned key whose replica is not in routing.
GONE = "replica_unavailable"
# How a bench reaches the workers: ``cluster.tasks.bench_profile.delay``, set as the app
# starts (``cluster.apps``): the task calls the bench, never the other way round.
to_worker: Callable[..., object] | None = None


class BenchError(Exception):
    """Why a bench could not run or measure; nothing was written."""


# What makes the run's client key, pinned to the replica measured: called with the model,
# the replica's id, and user= and via= (who started the run), it yields the key's secret
# and revokes the key when the run ends. The gateway's (``gateway.services.pinned_key``),
# registered by its ``AppConfig.ready()``.
PinnedKeys = Callable[..., AbstractContextManager[str]]
_pinned_keys: PinnedKeys | None = None


def use_pinned_keys(make: PinnedKeys) -> None:
    """Register what makes the bench's pinned client keys (the gateway's ``ready()``)."""
    global _pinned_keys
    _pinned_keys = make


@dataclass
class Outcome:
    model: str
    profile: str
    replica: int
    limits: bench.Limits
    levels: list[bench.Level] = field(default_factory=list)
    capacity: int = 0
    written: bool = False

    @property
    def lines(self) -> list[str]:
        return bench.table(self.levels, self.limits)

    @property
    def summary(self) -> str:
        return (f"{self.model} profile {self.profile}: capacity {self.capacity} within "
                f"TTFT p99 {self.limits.ttft * 1000:.0f} ms (replica #{self.replica})")  # fmt: skip


def ready_replica(model: str, profile: str | None) -> Replica:
    ready = Replica.objects.filter(model_name=model, desired=True, state=ReplicaState.READY)
    ready = ready.exclude(endpoint="").order_by("id")
    chosen = ready.filter(profile=profile).first() if profile else ready.first()
    if chosen is None:
        have = sorted(set(ready.values_list("profile", flat=True)))
        of = f" of profile {profile}" if profile else ""
        more = f" (ready: {', '.join(have)})" if have else ""
        raise BenchError(
            f"model {model} has no ready replica{of} to measure{more}: start one "
            "(scaling min, or a request for an on-demand model) and wait until it is ready"
        )
    return chosen


def _body(model: str, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream,
                            "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def check_engine(base: str, key: str, model: str, timeout: float = TIMEOUT,
                 routed_within: float = ROUTED_WITHIN, tokens: int = CHECK_TOKENS) -> None:  # fmt: skip
    """Refuse (BenchError) an engine whose whole or streamed answer, through the gateway
    at ``base`` with the run's key, is not well-formed. The first request is asked again
    while the gateway does not route the key yet (401: its process has not read the new
    key; 503: nor the replica), for ``routed_within`` seconds."""
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{base}/v1/chat/completions"
    deadline = time.monotonic() + routed_within
    with httpx.Client(timeout=timeout) as client:
        while True:
            try:
                r = client.post(url, json=_body(model, False, tokens), headers=headers)
            except httpx.HTTPError as error:
                raise BenchError(f"engine check: no answer from the gateway at {base} "
                                 f"(LLMGW_GATEWAY_URL): {error}") from None  # fmt: skip
            if r.status_code not in (401, 503) or time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        if r.status_code != 200:
            raise BenchError(f"engine check: a whole answer was HTTP {r.status_code}: "
                             f"{r.text[:200]}")  # fmt: skip
        try:
            data = r.json()
            content = data["choices"][0]["message"]["content"]
            tokens = data["usage"]["completion_tokens"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BenchError("engine check: a whole answer is not an OpenAI chat completion "
                             f"(choices[0].message.content, usage): {r.text[:200]}") from None  # fmt: skip
        if not isinstance(content, str) or not content or not isinstance(tokens, int):
            raise BenchError("engine check: a whole answer has no text or no token count")
        text, finish = "", None
        try:
            with client.stream("POST", url, json=_body(model, True, tokens),
                               headers=headers) as s:  # fmt: skip
                if s.status_code != 200:
                    raise BenchError(f"engine check: a streamed answer was HTTP {s.status_code}")
                done = False
                for line in s.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    event = json.loads(payload)
                    for choice in event.get("choices") or ():
                        text += (choice.get("delta") or {}).get("content") or ""
                        finish = choice.get("finish_reason") or finish
        except (httpx.HTTPError, ValueError, AttributeError, TypeError) as error:
            raise BenchError(
                f"engine check: a streamed answer is not well-formed: {error}"
            ) from None
        if not done or not text or finish is None:
            raise BenchError("engine check: a streamed answer did not end well-formed "
                             f"(text {bool(text)}, finish_reason {finish!r}, [DONE] {done})")  # fmt: skip


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any],
               headers: dict[str, str], gone: list[str]) -> bench.Sample:  # fmt: skip
    """One streamed request timed; a 503 saying the replica left routing is noted in
    ``gone`` (the gateway's message)."""
    start = time.monotonic()
    first: float | None = None
    tokens = 0
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                if r.status_code == 503:
                    error = json.loads(await r.aread()).get("error") or {}
                    if error.get("code") == GONE:
                        gone.append(str(error.get("message")))
                return bench.Sample(time.monotonic() - start, None, ok=False)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                event = json.loads(payload)
                for choice in event.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        if first is None:
                            first = time.monotonic()
                usage = event.get("usage") or {}
                tokens = usage.get("completion_tokens") or tokens
    except (httpx.HTTPError, ValueError, AttributeError):
        return bench.Sample(time.monotonic() - start, None, ok=False)
    end = time.monotonic()
    if first is None:
        return bench.Sample(end - start, None, ok=False)
    tokens = tokens or chunks
    tpot = (end - first) / (tokens - 1) if tokens > 1 else None
    return bench.Sample(first - start, tpot)


async def _level(base: str, key: str, model: str, clients: int, per_client: int,
                 max_tokens: int, gone: list[str]) -> list[bench.Sample]:  # fmt: skip
    url = f"{base}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"}
    body = _body(model, True, max_tokens)
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:

        async def one_client() -> list[bench.Sample]:
            return [await _one(client, url, body, headers, gone) for _ in range(per_client)]

        runs = await asyncio.gather(*(one_client() for _ in range(clients)))
    return [s for run in runs for s in run]


def measure(
    model: str,
    profile: str | None = None,
    *,
    say: Callable[[str], None] = lambda line: None,
    per_client: int = PER_CLIENT,
    max_tokens: int = MAX_TOKENS,
    top: int = bench.LEVELS[-1],
    user: Any = None,
    gateway: str | None = None,
) -> Outcome:
    """Check and drive one ready replica through the gateway (``gateway``, default
    ``LLMGW_GATEWAY_URL``) with a client key pinned to it; return its levels and
    capacity (nothing written but the run's key, made and revoked)."""
    row = ServedModel.objects.filter(name=model).first()
    if row is None:
        raise BenchError(f"model {model} is not in the catalog: see manage.py catalog export")
    m = rules.normalize(row.to_spec())
    if profile and rules.profile_by_name(m, profile) is None:
        names = ", ".join(p.name for p in m.profiles) or "none"
        raise BenchError(f"model {model} has no profile {profile} (its profiles: {names})")
    if m.role == "guard":
        raise BenchError(f"model {model} is a judge (role guard): the gateway serves judges to "
                         "no client, so the bench cannot drive one through it")  # fmt: skip
    replica = ready_replica(model, profile)
    if _pinned_keys is None:
        raise BenchError("no gateway to drive the replica through: the gateway app is not "
                         "installed (INSTALLED_APPS)")  # fmt: skip
    base = (gateway or settings.LLMGW_GATEWAY_URL).rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if m.max_output:  # the gateway refuses more than the model's max_output
        max_tokens = min(max_tokens, m.max_output)
    say(f"replica #{replica.pk} of {model} (profile {replica.profile}) through the gateway "
        f"at {base}")  # fmt: skip
    with contextlib.ExitStack() as run:
        try:
            key = run.enter_context(_pinned_keys(model, replica.pk, user=user, via=VIA))
        except ValueError as error:  # gateway.services.KeyRefused
            raise BenchError(f"no client key for the bench: {error}") from None
        check_engine(base, key, model, tokens=min(CHECK_TOKENS, max_tokens))
        say("engine check: whole and streamed answers are well-formed")
        gone: list[str] = []

        def drive(clients: int) -> list[bench.Sample]:
            samples = asyncio.run(_level(base, key, model, clients, per_client, max_tokens,
                                         gone))  # fmt: skip
            if gone:
                # Its failures say nothing of what it carries: no figure from this run.
                raise BenchError(f"replica #{replica.pk} left routing during the bench "
                                 f"({gone[0]}): nothing written")  # fmt: skip
            return samples

        alone = drive(1)
        limit = bench.limits(m.slo.ttft_p99, m.slo.tpot_p99, alone)
        out = Outcome(model, replica.profile, replica.pk, limit)
        out.levels.append(bench.judge(1, alone, limit))
        while (c := bench.next_level(out.levels, top)) is not None:
            level = bench.judge(c, drive(c), limit)
            out.levels.append(level)
            say(f"{c} clients: TTFT p99 {level.ttft_p99 * 1000:.0f} ms, "
                f"{'within' if level.within else 'past'} the limit")  # fmt: skip
    out.capacity = bench.capacity(out.levels)
    return out


def write(out: Outcome, actor: catalog_services.Actor) -> None:
    """Write the measured capacity and weight (refused, writing nothing, at capacity 0)."""
    if out.capacity < 1:
        raise BenchError(f"{out.model} profile {out.profile} carried not even one client "
                         f"within TTFT p99 {out.limits.ttft * 1000:.0f} ms: nothing written")  # fmt: skip
    figures = "; ".join(
        f"{lv.concurrency}: {lv.ttft_p99 * 1000:.0f} ms{'' if lv.within else ' past'}"
        for lv in sorted(out.levels, key=lambda lv: lv.concurrency)
    )
    note = f"bench: capacity {out.capacity} (clients: TTFT p99) {figures}"
    with transaction.atomic():
        before = _fingerprint(out.model, out.profile)
        catalog_services.set_measured(out.model, out.profile, float(out.capacity), out.capacity,
                                      actor, note=note[:900])  # fmt: skip
        after = _fingerprint(out.model, out.profile)
        # A weight is the router's only: replicas running the definition just measured
        # run the new one as well (no roll for a weight).
        if before and after and before != after:
            Replica.objects.filter(model_name=out.model, profile=out.profile,
                                   fingerprint=before).update(fingerprint=after)  # fmt: skip
    events.changed(models=[out.model])
    out.written = True
    log.info("bench %s: %s", out.summary, note)


def _fingerprint(model: str, profile: str) -> str:
    row = ServedModel.objects.filter(name=model).first()
    if row is None:
        return ""
    p = rules.profile_by_name(rules.normalize(row.to_spec()), profile)
    return rules.fingerprint(p) if p is not None else ""


def run(model: str, profile: str | None, user: Any, surface: str, via: str = "",
        say: Callable[[str], None] = lambda line: None) -> Outcome:  # fmt: skip
    """Measure and write, logging the run as cluster actions (raises BenchError)."""
    target = f"model {model}" + (f" profile {profile}" if profile else "")
    try:
        out = measure(model, profile, say=say, user=user)
        name = getattr(user, "username", "") or "system"
        actor = catalog_services.Actor(user=user if getattr(user, "pk", None) else None,
                                       surface=surface, via=via, name=name)  # fmt: skip
        write(out, actor)
    except BenchError as error:
        services.log_action(user, "bench failed", target, str(error), via)
        events.changed(models=[model])
        raise
    except catalog_services.Refused as refused:
        services.log_action(user, "bench failed", target, str(refused), via)
        events.changed(models=[model])
        raise BenchError(str(refused)) from None
    services.log_action(user, "bench done", target, "\n".join([out.summary, *out.lines]), via)
    events.changed(models=[model])
    return out


def start(model: str, profile: str | None, user: Any, surface: str, via: str = "") -> None:
    """Run the bench in the background: a Celery worker in production, a thread embedded.
    The start is logged now; the end (done or failed) when it ends."""
    target = f"model {model}" + (f" profile {profile}" if profile else "")
    services.log_action(user, "bench", target, "started", via)
    events.changed(models=[model])
    user_id = getattr(user, "pk", None)
    if settings.REDIS_URL:
        send = to_worker
        if send is None:
            raise RuntimeError("the cluster app is not ready: no way to the workers is set")
        transaction.on_commit(lambda: send(model, profile, user_id, surface, via))
    else:
        transaction.on_commit(lambda: threading.Thread(
            target=in_background, args=(model, profile, user_id, surface, via),
            name=f"bench-{model}", daemon=True,
        ).start())  # fmt: skip


def in_background(model: str, profile: str | None, user_id: int | None, surface: str,
                  via: str) -> None:  # fmt: skip
    """The background part of ``start`` (the worker's task, or the thread)."""
    close_old_connections()
    try:
        user = get_user_model().objects.filter(pk=user_id).first() if user_id else None
        run(model, profile, user, surface or Surface.API, via)
    except BenchError as error:
        log.warning("bench of %s failed: %s", model, error)
    except Exception:
        log.exception("bench of %s failed", model)
    finally:
        close_old_connections()
