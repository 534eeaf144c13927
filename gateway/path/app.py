"""The gateway's ASGI route: ``/v1/`` in front of Django, no middleware, no query.

``Gateway(app)`` answers every ``/v1/`` request itself and hands anything else to
``app`` (Django and the lean routes). A request reads the process's table (``state``),
the policy in memory (``guard.snapshots.policy_in_memory``), and goes to an engine over
kept-alive connections (``llmgw_core.upstream``); nothing on its path queries the
database. The order of a request's life:

1. The client key (``Authorization: Bearer llmgw-ck-…``): 401 when unknown, revoked or
   expired. A peer's key (owner ``peer:NAME``), or any key on a request that came through
   another llmgw cluster (``x-llmgw-via``), never names nor reaches a ``residency: local``
   model or one learned from a peer (``gateway.path.table.crosses``).
2. The body: 400 naming the field OpenAI's way when unreadable.
3. The name: a model, alias or adapter the key may name, else 404 ``model_not_found``
   (guard models for every key; external models unless the key lists them).
4. What the model allows: ``max_tokens`` within ``max_output``; the prompt within its
   context length (``gateway.path.sizing``: the bytes first, the engine's ``/tokenize`` when
   they cannot say); embeddings only from a model that has them. Then admission by the
   key's band (``gateway.path.admission``): while the model's TTFT p99 is past its ``slo``, a
   lower band past its allowance in flight waits briefly, then 429 with ``Retry-After``
   and ``x-should-retry``; a model that names an ``overflow`` the key may reach sends
   such a request there at once instead (admitted by that model's own slo).
5. The key's budgets: 429 with ``Retry-After``.
6. A replica: the canary's share to the candidate, else the model's ready replicas by
   its routing profile (``gateway.path.balance``); with none ready the demand is recorded
   (the reconciler starts an on-demand model) and the request waits, bounded, then 503
   with ``Retry-After``.
7. The guard on the request runs beside the engine's start: no byte of the answer leaves
   before the verdict, and a refusal closes the engine's connection (it stops).
8. Before the first byte a connect error, a timeout, a 429 or a 5xx moves the request to
   another replica, never the same twice, then to the fallbacks in order (external ones
   only when the cluster has no replica for any of them). A canary or fallback the key
   could not name itself is skipped (``Key.may_reach``): no hop widens a key's scope.
9. The answer: whole, judged whole when the policy judges answers; or streamed, judged in
   windows (``gateway.path.holdback``) with only judged text released. After the first byte a
   failure ends the stream with an error event and ``[DONE]``.

A key pinned to one replica (made by the control plane alone, for the capacity bench:
``gateway.services.pinned_key``) skips admission (4) and the guard (7, 9), which would
time themselves rather than the replica, and goes to that replica alone (6, 8:
``gateway.path.routing``).

A client that goes away cancels the request at whatever step it is in, and the engine's
connection is closed, which stops its generation.

Where each part lives: this module answers a request (its key, its ``/v1/models``, the
ordered steps of a completion: ``Gateway.complete``); ``gateway.path.cycle`` holds one
request's life (``Cycle``); ``gateway.path.routing`` picks replicas and makes each attempt
(6, 8); ``gateway.path.guarding`` holds the guard's part (7, and the windows of 9);
``gateway.path.answer`` passes a whole or streamed answer on (9); ``gateway.path.dialect`` is the API
a request speaks when it is not chat's (Anthropic's Messages, OpenAI's Responses: its body
made the chat body it means, its answer, stream and errors made the API's own),
``gateway.speaking`` their routes, ``gateway.stored`` the stored responses. The layers in front of the
gateway (``/healthz``, the Host check, the console's chat, ``/metrics``) are one ordered
list in ``gateway.assembly``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from gateway import cacheshare, speaking
from gateway.batch import routes as batch_routes
from gateway.batch import token as batch_token
from gateway.path import admission, errors, federation, listing, reranking, sizing, sse
from gateway.path import body as bodies
from gateway.path import dialect as dialects
from gateway.path.adapters import Placer
from gateway.path.admission import Admission
from gateway.path.affinity import Sessions, affinity_key
from gateway.path.cycle import (
    CLIENT_GONE,
    ClientStalled,
    Cycle,
    Receive,
    Scope,
    Send,
    bearer,
    header,
    read_body,
    send_error,
)
from gateway.path.dialects import sessions
from gateway.path.dialects.common import DialectError
from gateway.path.errors import ApiError
from gateway.path.guarding import Guard, Judging
from gateway.path.limits import LocalLimits, RedisLimits
from gateway.path.options import Options
from gateway.path.outliers import Outliers, Rules
from gateway.path.parts import Parts
from gateway.path.routing import Routing
from gateway.path.table import KEY_PREFIX, Entry, Key, Source, Table, digest
from gateway.records.observe import Done, Observer
from gateway.shared import Shared
from llmgw_core.upstream import Upstream

log = logging.getLogger("gateway")

App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _part(name: str, doc: str) -> Any:
    """A ``Gateway`` attribute that is its ``Parts``' own (read and replaced there)."""

    def read(gateway: Gateway) -> Any:
        return getattr(gateway.parts, name)

    def replace(gateway: Gateway, value: Any) -> None:
        setattr(gateway.parts, name, value)

    return property(read, replace, doc=doc)


class Gateway:
    """The ``/v1/`` route: a request's steps in order (``complete``), each handed the
    gateway's ``Parts`` or the few of them it needs."""

    def __init__(
        self,
        app: App | None = None,
        *,
        state: Source,
        upstream: Upstream | None = None,
        limits: Any = None,
        guard: Guard | None = None,
        options: Options | None = None,
        observer: Observer | None = None,
        outliers: Outliers | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.app = app
        self.parts = Parts(
            state=state,
            options=options or Options.from_settings(settings),
            observer=observer or Observer(),
            guard=guard or Guard(),
            # Lower bands held while a model is past its latency SLO (gateway.path.admission).
            admission=admission or Admission.from_settings(settings),
            # Replicas left out of routing after failures in a row (gateway.path.outliers).
            outliers=outliers or Outliers(Rules.from_settings(settings)),
            placer=Placer(),
            # Each session's last replica, per model (gateway.path.affinity): this process's.
            sessions=Sessions.from_settings(settings),
            client=upstream,
            limits=limits,
        )
        self.judging = Judging(self.parts)
        self.routing = Routing(self.parts, self.judging)
        self._started = False

    state = _part("state", "The table's source (``Parts.state``).")
    options = _part("options", "``Parts.options``.")
    observer = _part("observer", "``Parts.observer``.")
    guard = _part("guard", "``Parts.guard`` (``gateway.records.metrics.exported`` wraps it).")
    admission = _part("admission", "``Parts.admission``.")
    outliers = _part("outliers", "``Parts.outliers``.")
    placer = _part("placer", "``Parts.placer``.")
    sessions = _part("sessions", "``Parts.sessions``.")
    in_flight = _part("in_flight", "``Parts.in_flight``.")
    pinned_in_flight = _part("pinned_in_flight", "``Parts.pinned_in_flight``.")
    shared = _part("shared", "``Parts.shared``.")
    limits = _part("limits", "The keys' budgets: in Redis when ``REDIS_URL`` is set, else "
                   "this process's.")  # fmt: skip

    @property
    def upstream(self) -> Upstream:
        """The engines' client, made at the first request (``Parts.upstream``)."""
        return self.parts.upstream

    @upstream.setter
    def upstream(self, upstream: Upstream) -> None:
        self.parts.client = upstream

    # Wiring.
    def start(self) -> None:
        """Start what the gateway runs beside its requests (the state's reader and
        listener) and make its upstream and budgets: at its first request."""
        if self._started:
            return
        self._started = True
        parts = self.parts
        parts.state.start(asyncio.get_running_loop())
        self._listening = asyncio.get_running_loop().create_task(parts.state.listen())
        if parts.client is None:
            # Every call to a replica carries its engine key (cluster.enginekeys).
            parts.client = Upstream(credentials=getattr(parts.state, "engine_key", None))
        if parts.limits is None:
            url = settings.REDIS_URL
            if url:
                parts.limits = RedisLimits(url)
            else:
                parts.limits = LocalLimits()
        if parts.shared is None and settings.REDIS_URL:
            parts.shared = Shared(settings.REDIS_URL, parts.admission, parts.outliers,
                                  parts.observer)  # fmt: skip
            parts.shared.start()

    async def ready(self) -> bool:
        """Whether the process has read its table (it is read at once when not yet)."""
        self.start()
        return self.state.loaded or await self.state.first_load()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path.startswith("/v1/") or path == reranking.V2_PATH):
            if self.app is None:
                await send_error(send, errors.not_found())
                return
            await self.app(scope, receive, send)
            return
        cycle = Cycle(send)
        cycle.send_wait = self.options.send_timeout
        try:
            ready = await self.ready()
        except Exception:
            # Nothing of the request read yet: a 500, counted with no key and no model.
            await self.failed(cycle)
            self.done(cycle)
            return
        if not ready:
            await cycle.error(errors.starting())
            self.done(cycle)
            return
        await self.serve(cycle, lambda: self._route(cycle, scope, receive, path))

    async def serve(self, cycle: Cycle, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` for ``cycle``: an ``ApiError`` is answered, a client gone ends
        it (499), anything else is a 500; the observers hear of it however it ended."""
        try:
            await work()
        except ApiError as error:
            await cycle.error(error)
        except ClientStalled as stalled:
            # Taken as gone: what it was sent so far is all it gets.
            log.info("%s: the client took none of its answer for %g s: given up", cycle.request_id,
                     stalled.args[0])  # fmt: skip
            cycle.outcome = CLIENT_GONE
        except asyncio.CancelledError:
            if cycle.client_gone:
                cycle.outcome = CLIENT_GONE
                return  # the client went away: no one to answer
            raise
        except Exception:
            await self.failed(cycle)
        finally:
            cycle.unwatch()
            self.done(cycle)

    async def _route(self, cycle: Cycle, scope: Scope, receive: Receive, path: str) -> None:
        """A ``/v1/`` request by its path and method."""
        method = scope.get("method", "GET")
        table = self.state.table
        # Set first: from the key on, every error is in the dialect's shape.
        cycle.dialect = dialects.for_path(path, cycle.request_id) or reranking.for_path(
            path, cycle.request_id
        )
        cycle.session_header = header(scope, sessions.HEADER.encode())
        key = cycle.key = await self._key_now(scope, table)
        if not key.peer and header(scope, federation.VIA.encode()):
            # Sent on by another llmgw cluster (its peer sender sets it): held to what a
            # peer's key may reach, whatever the key (docs/federation.md).
            key = cycle.key = dataclasses.replace(key, peer=True)
        if path == "/v1/models" or path.startswith("/v1/models/"):
            await listing.answer(cycle, method, path, table, key, self.options.now())
            return
        if batch_routes.serves(path):  # the Files and Batch APIs (gateway.batch)
            await batch_routes.serve_files_and_batches(
                self.parts, cycle, scope, receive, path, method
            )
            return
        if cycle.dialect is not None and cycle.dialect.name == reranking.RERANK:
            await reranking.serve_rerank(
                self.parts, self.complete, cycle, scope, receive, path, method
            )
            return
        if cycle.dialect is not None:
            await speaking.serve_dialect(
                self.parts, self.complete, cycle, scope, receive, path, method
            )
            return
        kind = bodies.KINDS.get(path)
        if kind is None:
            raise errors.not_found(path)
        if method != "POST":
            raise errors.method_not_allowed(path, "POST")
        raw = await read_body(receive, self.options.max_body, scope)
        if raw is None:
            return  # the client went away
        cycle.watch(receive)  # from here a client that goes away cancels this task
        await self.complete(cycle, kind, raw)

    async def failed(self, cycle: Cycle) -> None:
        """An unexpected exception (being handled): logged with the request id, and a 500
        in OpenAI's shape when no byte of the answer was sent yet (else the stream just
        ends); the request comes to a 500 either way."""
        log.exception("%s: the gateway failed this request", cycle.request_id)
        cycle.outcome = 500
        error = errors.internal(cycle.request_id)
        try:
            if not cycle.started:
                await cycle.error(error)
            elif cycle.stream and cycle.dialect is not None:
                await cycle.body(cycle.dialect.fail(error.message), more=False, text=False)
            elif cycle.stream:
                # A stream ends as an engine's failure ends it: an error event, [DONE].
                await cycle.body(sse.encode_json(error.payload()) + b"data: [DONE]\n\n",
                                 more=False, text=False)  # fmt: skip
        except Exception:  # the answer had ended, or the client is gone too
            log.debug("%s: the 500 could not be told", cycle.request_id, exc_info=True)

    def done(self, cycle: Cycle) -> None:
        """Tell the observers how the request ended: every request, whatever its status
        (``model`` empty when it named none, ``key`` and ``owner`` empty without a valid
        key; 499 when the client went away before its answer ended)."""
        key, first, engine = cycle.key, cycle.first_at, cycle.engine_first_at
        status = cycle.outcome or cycle.status or CLIENT_GONE
        ended = Done(
            model=cycle.model, status=status, owner=key.owner if key else "",
            key=key.name if key else "", seconds=time.perf_counter() - cycle.start_at,
            ttft=None if first is None else first - cycle.start_at,
            tokens_in=cycle.tokens_in, tokens_out=cycle.tokens_out, replica=cycle.replica,
            stream=cycle.stream, engine_ttft=None if engine is None else engine - cycle.start_at,
            pinned=key is not None and key.replica is not None, dialect=cycle.dialect_name,
            tokens_cached=cycle.tokens_cached, batch=key.batch if key else "",
        )  # fmt: skip
        self.observer.request(ended)
        if key is None or key.replica is None:  # a pinned key's overload is deliberate
            self.admission.heard(ended)
        if key is None:
            if status == 401:
                self.observer.unauthenticated()
        else:
            # Cached prompt tokens cost the model's cached_token_weight of a fresh one's.
            entry = cycle.entry
            weight = entry.model.cached_token_weight if entry is not None else 1.0
            spare = cacheshare.spared(cycle.tokens_cached, weight)
            if cycle.unreserved and cycle.tokens_out:
                self.later(self.limits.charge(key.id, "tokens", cycle.tokens_out))
            if key.tpm and spare:
                # Reserved as fresh up front (the cache is known once the engine answers).
                self.later(self.limits.charge(key.id, "tokens", -spare))
            if cycle.owner_reserved is not None:
                window, reserved = cycle.owner_reserved
                spent = cycle.tokens_in + cycle.tokens_out - spare
                self.later(self.limits.settle(key.owner, window, reserved, spent))

    def later(self, work: Awaitable[None]) -> None:
        """Run ``work`` off the request's path, kept until it ends (``Parts.later``)."""
        self.parts.later(work)

    async def _key_now(self, scope: Scope, table: Table) -> Key:
        """The request's key; one this process has not read yet (made a moment ago) is
        looked for again after the state's next pass (half a second at most), so a new
        key works at once and an unknown one costs its sender that wait."""
        try:
            return _key(scope, table)
        except ApiError:
            secret = bearer(scope)
            if not secret or not secret.startswith(KEY_PREFIX) or digest(secret) in table.keys:
                raise
        await self.state.next_pass(timeout=2.0)
        return _key(scope, self.state.table)

    # POST: a completion's steps, in order. A step that refuses raises its ApiError.
    async def complete(self, cycle: Cycle, kind: str, raw: bytes) -> None:
        """Answer a completion (or embeddings) request whose body is ``raw``."""
        self._read(cycle, kind, raw)  # 2. the body, 3. the name
        self._allows(cycle)  # 4. what the model allows
        await self._admit(cycle)  # 4b. admission by the key's band (gateway.path.admission)
        await self._budget(cycle)  # 5. the key's budgets
        # A new step before routing goes here, as admission above: it takes the cycle
        # and raises an ApiError (gateway.path.errors) to refuse.
        assert cycle.key is not None
        if cycle.key.replica is None:
            # 7. the guard on the request, beside the engine's start. Not for a key pinned
            # to a replica: the capacity bench's own fixed prompt, its answers read by the
            # bench alone and thrown away, timed as the replica gives them (a judge's
            # windows would time the guard, not the replica).
            self.judging.start(cycle)
        try:
            await self.routing.route(cycle)  # 6, 8, 9: a replica, its attempts, the answer
        finally:
            if cycle.verdict is not None and not cycle.verdict.done():
                cycle.verdict.cancel()

    def _read(self, cycle: Cycle, kind: str, raw: bytes) -> None:
        """The body read OpenAI's way, and the model, alias or adapter it names."""
        try:
            cycle.data = bodies.parse(raw)
            _session(cycle, cycle.data)
            if cycle.dialect is not None:
                # The dialect's body as the chat body it means: read as chat's is.
                cycle.data = cycle.dialect.chat_body(cycle.data)
                raw = bodies.dumps(cycle.data)
            req = cycle.req = bodies.read(kind, cycle.data)
        except bodies.BodyError as error:
            raise errors.bad_request(error.message, error.param, error.code) from None
        cycle.raw = raw
        key = cycle.key
        assert key is not None
        entry = self.state.table.resolve(req.model)
        if entry is None or not key.may_name(entry):
            raise errors.model_not_found(req.model)
        cycle.entry = entry
        cycle.model, cycle.stream = entry.model.name, req.stream

    def _allows(self, cycle: Cycle) -> None:
        """What the model takes: embeddings, tools, ``max_tokens`` within ``max_output``
        (its context is checked per pool, ``gateway.path.routing``)."""
        req, entry = cycle.req, cycle.entry
        assert req is not None and entry is not None
        model = entry.model
        if req.kind == bodies.RERANK:
            reranking.allows(cycle)  # natively, by embeddings, or 400
        if req.kind == bodies.EMBEDDING and not model.capabilities.embeddings:
            raise errors.no_embeddings(req.model)
        if req.uses_tools and not model.capabilities.tools:
            raise errors.no_tools(req.model, req.tools_param)
        if req.max_tokens and model.max_output and req.max_tokens > model.max_output:
            name = (
                "max_completion_tokens" if "max_completion_tokens" in cycle.data else "max_tokens"
            )
            if cycle.dialect is not None:
                name = cycle.dialect.max_tokens_param
            raise errors.max_tokens_exceeded(name, req.max_tokens, model.max_output)

    async def _admit(self, cycle: Cycle) -> None:
        """The key's band at the door: while the model is under pressure (its TTFT p99
        past its slo), a lower band past its allowance in flight waits briefly, then 429
        with ``Retry-After``; an admitted request is in flight until ``done``."""
        key, entry = cycle.key, cycle.entry
        assert key is not None and entry is not None
        model = entry.model
        slo_ms = model.slo.ttft_p99 / 1e6
        if not slo_ms or key.replica is not None:
            # A key pinned to one replica is the capacity bench's, which drives it past
            # the slo on purpose: never held, and its times are not the model's service.
            return
        over = self._overflow(cycle) if admission.lower(key.priority) else None
        if over is not None and not self.admission.check(model.name, key.priority, slo_ms).admit:
            # Held back here: its overflow answers instead of a wait and a 429, admitted
            # there by its own slo (docs/catalog.md, overflow).
            self.observer.overflowed(model.name, over.model.name)
            cycle.entry, cycle.model = over, over.model.name
            model, slo_ms = over.model, over.model.slo.ttft_p99 / 1e6
            if not slo_ms:
                return
        decision = await self.admission.admit(model.name, key.priority, slo_ms)
        if not decision.admit:
            a = self.admission
            raise errors.held_back(
                admission.reason(key.priority, model.name, decision, a.window),
                admission.retry_after(a.window, key.priority),
            )

    def _overflow(self, cycle: Cycle) -> Entry | None:
        """The model's ``overflow`` as an entry, when there is one this request may go to:
        within the key's scope (``Key.may_reach``), not a peer that is down, and not for
        an adapter (the overflow does not hold it)."""
        entry, key, table = cycle.entry, cycle.key, self.state.table
        assert entry is not None and key is not None
        name = table.model_named(entry.model.overflow) if entry.model.overflow else None
        if name is None or entry.adapter is not None:
            return None
        target = table.models[name]
        if not key.may_reach(target) or table.peer_down(target):
            return None
        return Entry(name, target)

    async def _budget(self, cycle: Cycle) -> None:
        """The key's budgets: 429 with ``Retry-After`` when over."""
        key, req, entry = cycle.key, cycle.req, cycle.entry
        assert key is not None and req is not None and entry is not None
        if key.rpm:
            wait = await self.limits.take(key.id, "requests", 1, key.rpm)
            if wait is not None:
                raise errors.rate_limited(f"{key.name} ({key.rpm} requests a minute)", wait)
        if key.tpm:
            _, high = sizing.prompt_bounds(req.prompt_bytes, req.messages)
            out = req.max_tokens or entry.model.max_output or 0
            if high + out > key.tpm:
                # Never within the budget, however long the client waits.
                raise errors.over_budget(key.name, high + out, key.tpm, out)
            wait = await self.limits.take(key.id, "tokens", high + out, key.tpm)
            if wait is not None:
                raise errors.rate_limited(f"{key.name} ({key.tpm} tokens a minute)", wait,
                                          "tokens")  # fmt: skip
            # No bound on the answer was reserved: what it takes is charged when it ends.
            cycle.unreserved = not out
        if key.owner_tpm:
            await self._owner_budget(cycle)

    async def _owner_budget(self, cycle: Cycle) -> None:
        """The owner's token budget, shared by all its keys and every gateway process:
        the request's bound reserved up front (``limits.reserve``: one Redis script),
        settled with what it used when it ends (``Gateway.done``)."""
        key, req, entry = cycle.key, cycle.req, cycle.entry
        assert key is not None and req is not None and entry is not None
        _, high = sizing.prompt_bounds(req.prompt_bytes, req.messages)
        out = req.max_tokens or entry.model.max_output or 0
        what = f"{key.owner}, shared by its keys"
        if high + out > key.owner_tpm:
            raise errors.over_budget(what, high + out, key.owner_tpm, out)
        wait, window = await self.limits.reserve(key.owner, high + out, key.owner_tpm)
        if wait is not None:
            raise errors.rate_limited(f"{what} ({key.owner_tpm} tokens a minute)", wait,
                                      "tokens")  # fmt: skip
        cycle.owner_reserved = (window, high + out)


def _session(cycle: Cycle, data: dict[str, Any]) -> None:
    """The session the request names (``gateway.path.affinity``), scoped to its key's owner; a
    session key that is not a string, or too long, is a 400 naming its field."""
    try:
        named = sessions.session_of(data, cycle.session_header)
    except DialectError as error:
        raise errors.bad_request(error.message, error.param) from None
    dialect = cycle.dialect
    name = named.key if named is not None else None
    if isinstance(dialect, dialects.Responses):
        dialect.named = named  # what its stored response keeps (gateway.stored)
        if named is not None and named.source == sessions.PREVIOUS:
            # The session of the conversation it continues, kept with that response.
            name = dialect.previous_session or named.key
    if name is not None and cycle.key is not None:
        cycle.session = affinity_key(cycle.key, name)


def _key(scope: Scope, table: Table) -> Key:
    secret = bearer(scope)
    if secret and secret.startswith(batch_token.PREFIX):  # a batch's line (gateway.batch)
        key = batch_token.key_of(secret, table.keys)
    elif not secret or not secret.startswith(KEY_PREFIX):
        raise errors.bad_key()
    else:
        key = table.keys.get(digest(secret))
    if key is None or key.expired(time.time()):
        raise errors.bad_key()
    return key
