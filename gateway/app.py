"""The gateway's ASGI route: ``/v1/`` in front of Django, no middleware, no query.

``Gateway(app)`` answers every ``/v1/`` request itself and hands anything else to
``app`` (Django and the lean routes). A request reads the process's table (``state``),
the policy in memory (``guard.services.policy_in_memory``), and goes to an engine over
kept-alive connections (``gateway.upstream``); nothing on its path queries the
database. The order of a request's life:

1. The client key (``Authorization: Bearer llmgw-ck-…``): 401 when unknown, revoked or
   expired.
2. The body: 400 naming the field OpenAI's way when unreadable.
3. The name: a model, alias or adapter the key may name, else 404 ``model_not_found``
   (guard models for every key; external models unless the key lists them).
4. What the model allows: ``max_tokens`` within ``max_output``; the prompt within its
   context length (``gateway.sizing``: the bytes first, the engine's ``/tokenize`` when
   they cannot say); embeddings only from a model that has them.
5. The key's budgets: 429 with ``Retry-After``.
6. A replica: the canary's share to the candidate, else the model's ready replicas by
   its routing profile (``gateway.balance``); with none ready the demand is recorded
   (the reconciler starts an on-demand model) and the request waits, bounded, then 503
   with ``Retry-After``.
7. The guard on the request runs beside the engine's start: no byte of the answer leaves
   before the verdict, and a refusal closes the engine's connection (it stops).
8. Before the first byte a connect error, a timeout, a 429 or a 5xx moves the request to
   another replica, never the same twice, then to the fallbacks in order (external ones
   only when the cluster has no replica for any of them). A canary or fallback the key
   could not name itself is skipped (``Key.may_reach``): no hop widens a key's scope.
9. The answer: whole, judged whole when the policy judges answers; or streamed, judged in
   windows (``gateway.holdback``) with only judged text released. After the first byte a
   failure ends the stream with an error event and ``[DONE]``.

A client that goes away cancels the request at whatever step it is in, and the engine's
connection is closed, which stops its generation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from catalog import timeouts
from cluster.placement import UNPLACEABLE
from gateway import balance, errors, providers, sizing, sse
from gateway import body as bodies
from gateway.adapters import Placer
from gateway.errors import ApiError
from gateway.guarding import Guard
from gateway.holdback import Holdback
from gateway.limits import LocalLimits
from gateway.models import KEY_PREFIX, digest
from gateway.observe import Done, Observer, Refusal
from gateway.outliers import Outliers, Rules
from gateway.state import State
from gateway.table import Entry, Key, Pool, Table
from gateway.upstream import BROKEN, TIMEOUT, Response, Upstream, UpstreamError
from llmgw_admin import lean

log = logging.getLogger("gateway")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Chunks before a stream's first token held back with it, at most (then sent as they are).
MAX_EARLY = 64
# An answer too long for its judge is judged again in parts overlapping by this many
# characters; a part this short that is still too long for the judge cannot be judged.
PART_OVERLAP = 200
MIN_PART = 2 * PART_OVERLAP + 100
PARTS_AT_ONCE = 8  # judged at once, of one text
REQUEST, ANSWER = "request", "answer"
# Retry-After for a model the cluster has no room for: placement frees slowly.
NO_ROOM_RETRY = 30
# What a request came to when its client went away before its answer ended (nginx's).
CLIENT_GONE = 499


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


@dataclass
class Options:
    connect_timeout: float = 5.0
    # The waits for a model whose catalog entry says nothing of its latency
    # (catalog.timeouts): to the first token, between tokens, for a whole answer, and
    # held while it wakes.
    first_byte_timeout: float = 300.0
    read_timeout: float = 300.0
    whole_timeout: float = 1800.0
    wake_wait: float = 600.0
    max_body: int = 16 << 20
    max_answer: int = 64 << 20
    window_tokens: int = 16
    window_ms: float = 150.0
    retry_after: int = 10

    @classmethod
    def from_settings(cls) -> Options:
        waits = timeouts.Defaults.from_settings(settings)
        return cls(
            connect_timeout=_setting("LLMGW_GATEWAY_CONNECT_TIMEOUT", 5.0),
            first_byte_timeout=waits.first_token,
            read_timeout=waits.between,
            whole_timeout=waits.whole,
            wake_wait=waits.wake,
            max_body=_setting("LLMGW_GATEWAY_MAX_BODY", 16 << 20),
            window_tokens=_setting("LLMGW_GUARD_WINDOW_TOKENS", 16),
            window_ms=_setting("LLMGW_GUARD_WINDOW_MS", 150.0),
        )


def model_waits(model: Any, options: Options) -> timeouts.Waits:
    """The waits for ``model``: its own where its catalog entry gives its latency and
    startup (``catalog.timeouts``), else the options'."""
    return timeouts.waits(model, timeouts.Defaults(
        first_token=options.first_byte_timeout, between=options.read_timeout,
        whole=options.whole_timeout, wake=options.wake_wait,
    ))  # fmt: skip


class Refused(Exception):
    """The guard refused (or could not judge under ``fail: closed``)."""

    def __init__(self, error: ApiError, verdict: dict[str, Any]) -> None:
        super().__init__(error.message)
        self.error = error
        self.verdict = verdict


class Gateway:
    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None,
        *,
        state: State | None = None,
        upstream: Upstream | None = None,
        limits: Any = None,
        guard: Guard | None = None,
        options: Options | None = None,
        observer: Observer | None = None,
        outliers: Outliers | None = None,
    ) -> None:
        self.app = app
        self.state = state or State()
        self._upstream = upstream
        self._limits = limits
        self.guard = guard or Guard()
        self.options = options or Options.from_settings()
        self.observer = observer or Observer()
        # Requests in flight per replica in this process (the balancer reads them).
        self.in_flight: dict[int, int] = {}
        # The adapters each replica holds, for models that hold only a few at once.
        self.placer = Placer()
        # Replicas left out of routing after failures in a row (gateway.outliers).
        self.outliers = outliers or Outliers(Rules.from_settings(settings))
        self._background: set[asyncio.Task[Any]] = set()
        self._started = False

    # Wiring.
    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self.state.start(asyncio.get_running_loop())
        self._listening = asyncio.get_running_loop().create_task(self.state.listen())
        if self._upstream is None:
            # Every call to a replica carries its engine key (cluster.enginekeys).
            self._upstream = Upstream(credentials=getattr(self.state, "engine_key", None))
        if self._limits is None:
            url = _setting("REDIS_URL", "") or ""
            if url:
                from gateway.limits import RedisLimits

                self._limits = RedisLimits(url)
            else:
                self._limits = LocalLimits()

    @property
    def upstream(self) -> Upstream:
        assert self._upstream is not None
        return self._upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/v1/"):
            if self.app is None:
                await _send_error(send, errors.ApiError(404, "not found", code="not_found"))
                return
            await self.app(scope, receive, send)
            return
        try:
            self._start()
            ready = self.state.loaded or await self.state.first_load()
        except Exception:
            # Nothing of the request read yet: a 500, counted with no key and no model.
            sent = _Sent(send, time.perf_counter())
            await self._failed(sent)
            self._done(sent, None)
            return
        if not ready:
            sent = _Sent(send, time.perf_counter())
            error = errors.unavailable("the gateway is starting: try again")
            sent.status = error.status
            await _send_error(send, error, sent.request_id)
            self._done(sent, None)
            return
        await self._serve(scope, receive, send, path)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        sent = _Sent(send, time.perf_counter())
        task = asyncio.current_task()
        watcher: asyncio.Task[None] | None = None
        key: Key | None = None
        try:
            method = scope.get("method", "GET")
            table = self.state.table
            key = await self._key_now(scope, table)
            if method == "GET" and path == "/v1/models":
                await self._models(sent, table, key)
                return
            if method == "GET" and path.startswith("/v1/models/"):
                await self._model(sent, table, key, path[len("/v1/models/") :])
                return
            if path == "/v1/models" or path.startswith("/v1/models/"):
                raise ApiError(405, f"{path} takes GET", code="method_not_allowed",
                               headers={"allow": "GET"})  # fmt: skip
            kind = bodies.KINDS.get(path)
            if kind is None:
                raise ApiError(404, f"Unknown path {path}: the gateway serves /v1/models, "
                               "/v1/chat/completions, /v1/completions and /v1/embeddings.",
                               code="not_found")  # fmt: skip
            if method != "POST":
                raise ApiError(405, f"{path} takes POST", code="method_not_allowed",
                               headers={"allow": "POST"})  # fmt: skip
            raw = await _read_body(receive, self.options.max_body, scope)
            if raw is None:
                return  # the client went away
            # From here a client that goes away cancels this task.
            watcher = asyncio.create_task(_watch_disconnect(receive, task))
            await self._complete(sent, table, key, kind, raw)
        except ApiError as error:
            if not sent.started:
                sent.status = error.status
                await _send_error(send, error, sent.request_id)
        except asyncio.CancelledError:
            if watcher is not None and watcher.done():
                sent.outcome = CLIENT_GONE
                return  # the client went away: no one to answer
            raise
        except Exception:
            await self._failed(sent)
        finally:
            if watcher is not None:
                watcher.cancel()
            self._done(sent, key)

    async def _failed(self, sent: _Sent) -> None:
        """An unexpected exception (being handled): logged with the request id, and a 500
        in OpenAI's shape when no byte of the answer was sent yet (else the stream just
        ends); the request comes to a 500 either way."""
        log.exception("%s: the gateway failed this request", sent.request_id)
        sent.outcome = 500
        error = ApiError(500, f"The gateway failed this request ({sent.request_id}); its log "
                         "says why under that id.", type="server_error", code="internal_error")  # fmt: skip
        try:
            if not sent.started:
                sent.status = 500
                await _send_error(sent.send, error, sent.request_id)
            elif sent.stream:
                # A stream ends as an engine's failure ends it: an error event, [DONE].
                await sent.body(sse.encode_json(error.payload()) + b"data: [DONE]\n\n",
                                more=False, text=False)  # fmt: skip
        except Exception:  # the answer had ended, or the client is gone too
            log.debug("%s: the 500 could not be told", sent.request_id, exc_info=True)

    def _done(self, sent: _Sent, key: Key | None) -> None:
        """Tell the observers how the request ended: every request, whatever its status
        (``model`` empty when it named none, ``key`` and ``owner`` empty without a valid
        key; 499 when the client went away before its answer ended)."""
        first = sent.first_at
        status = sent.outcome or sent.status or CLIENT_GONE
        self.observer.request(Done(
            model=sent.model, status=status, owner=key.owner if key else "",
            key=key.name if key else "", seconds=time.perf_counter() - sent.start_at,
            ttft=None if first is None else first - sent.start_at,
            tokens_in=sent.tokens_in, tokens_out=sent.tokens_out, replica=sent.replica,
            stream=sent.stream,
        ))  # fmt: skip
        if key is None:
            if status == 401:
                self.observer.unauthenticated()
        elif sent.unreserved and sent.tokens_out:
            self._later(self._limits.charge(key.id, "tokens", sent.tokens_out))

    def _later(self, work: Awaitable[None]) -> None:
        """Run ``work`` off the request's path, kept until it ends."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _key_now(self, scope: Scope, table: Table) -> Key:
        """The request's key; one this process has not read yet (made a moment ago) is
        looked for again after the state's next pass (half a second at most), so a new
        key works at once and an unknown one costs its sender that wait."""
        try:
            return self._key(scope, table)
        except ApiError:
            secret = _bearer(scope)
            if not secret or not secret.startswith(KEY_PREFIX) or digest(secret) in table.keys:
                raise
        await self.state.next_pass(timeout=2.0)
        return self._key(scope, self.state.table)

    def _key(self, scope: Scope, table: Table) -> Key:
        secret = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                parts = value.decode("latin-1").split()
                if len(parts) == 2 and parts[0].lower() == "bearer":
                    secret = parts[1]
                break
        if not secret or not secret.startswith(KEY_PREFIX):
            raise errors.bad_key()
        key = table.keys.get(digest(secret))
        if key is None or key.expired(time.time()):
            raise errors.bad_key()
        return key

    # GET /v1/models
    async def _models(self, sent: _Sent, table: Table, key: Key) -> None:
        data = [_describe(e, table) for e in table.listed(key)]
        await sent.json(200, {"object": "list", "data": data})

    async def _model(self, sent: _Sent, table: Table, key: Key, name: str) -> None:
        entry = table.resolve(name)
        if entry is None or not key.may_name(entry):
            raise errors.model_not_found(name)
        await sent.json(200, _describe(entry, table))

    # POST
    async def _complete(self, sent: _Sent, table: Table, key: Key, kind: str, raw: bytes) -> None:
        try:
            data = bodies.parse(raw)
            req = bodies.read(kind, data)
        except bodies.BodyError as error:
            raise errors.bad_request(error.message, error.param, error.code) from None
        entry = table.resolve(req.model)
        if entry is None or not key.may_name(entry):
            raise errors.model_not_found(req.model)
        model = entry.model
        sent.model, sent.stream = model.name, req.stream
        if kind == bodies.EMBEDDING and not model.capabilities.embeddings:
            raise errors.bad_request(
                f"The model '{req.model}' does not serve embeddings (its capabilities do not "
                "list them): name an embedding model.",
                "model",
                "model_not_supported",
            )
        if req.uses_tools and not model.capabilities.tools:
            raise errors.bad_request(
                f"The model '{req.model}' does not take tools or functions (its capabilities "
                "do not list them).",
                req.tools_param,
                "model_not_supported",
            )
        if req.max_tokens and model.max_output and req.max_tokens > model.max_output:
            name = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
            raise errors.bad_request(
                f"{name} is {req.max_tokens}, above this model's max_output of "
                f"{model.max_output}: ask for at most {model.max_output}.", name,
                "max_tokens_exceeded")  # fmt: skip
        await self._budget(sent, key, req, model)
        verdict = None
        judging_requests, judging_answers = self.guard.directions()
        if judging_requests and req.token_ids:
            field = "prompt" if kind == bodies.COMPLETION else "input"
            raise errors.bad_request(
                f"{field} is token ids, which the guard cannot read, and its policy judges "
                "requests: send it as text.", field, "content_filter",
            )  # fmt: skip
        if judging_requests and req.text:
            verdict = asyncio.create_task(self.guard.judge(req.text))
        try:
            call = _Call(sent, key, entry, req, data, raw, verdict, judging_answers)
            await self._route(call)
        finally:
            if verdict is not None and not verdict.done():
                verdict.cancel()

    async def _budget(self, sent: _Sent, key: Key, req: bodies.Request, model: Any) -> None:
        if key.rpm:
            wait = await self._limits.take(key.id, "requests", 1, key.rpm)
            if wait is not None:
                raise errors.rate_limited(f"{key.name} ({key.rpm} requests a minute)", wait)
        if key.tpm:
            _, high = sizing.prompt_bounds(req.prompt_bytes, req.messages)
            out = req.max_tokens or model.max_output or 0
            if high + out > key.tpm:
                # Never within the budget, however long the client waits.
                said = f", and {out} for its answer" if out else ""
                raise errors.bad_request(
                    f"This request may use up to {high + out} tokens (its prompt, counted "
                    f"by its bytes{said}), more than the budget of {key.name}, {key.tpm} "
                    "tokens a minute: send less, or ask for fewer max_tokens.",
                    "max_tokens" if out else "messages", "tokens_exceed_budget",
                )  # fmt: skip
            wait = await self._limits.take(key.id, "tokens", high + out, key.tpm)
            if wait is not None:
                raise errors.rate_limited(f"{key.name} ({key.tpm} tokens a minute)", wait,
                                          "tokens")  # fmt: skip
            # No bound on the answer was reserved: what it takes is charged when it ends.
            sent.unreserved = not out

    async def _route(self, call: _Call) -> None:
        entry, req = call.entry, call.req
        table = self.state.table
        model = entry.model
        if model.scaling.idle_timeout or model.scaling.min == 0:
            self.state.demand(model.name)  # it is in use: keep it (written off the path)
        primary = model.name
        # A canary and fallbacks may name a model by an alias. Each hop is within the
        # key's scope: one the key could not name itself is skipped (Key.may_reach).
        candidate = table.model_named(model.canary.model) if model.canary else None
        if candidate and not call.key.may_reach(table.models[candidate]):
            candidate = None
        if candidate and balance.in_canary(req.affinity, model.canary.percent):
            primary = candidate
        fallbacks = (table.model_named(f) for f in model.fallbacks)
        reach = [f for f in fallbacks if f and call.key.may_reach(table.models[f])]
        chain = list(dict.fromkeys([primary, model.name, *reach]))
        tried: set[int] = set()
        last: str = ""
        woken = False
        while True:
            table = self.state.table
            cluster = [n for n in chain if n in table.models and table.models[n].external is None]
            external = [n for n in chain if n in table.models and table.models[n].external]
            for index, name in enumerate(cluster):
                pool = table.pool(name)
                if pool is None:
                    continue
                if index and name != model.name:
                    self.observer.fell_back(model.name, name)
                target_model = table.models[name]
                await self._check_context(table, pool, target_model, req, entry)
                while True:
                    adapter = entry.adapter if name == model.name else None
                    # Never the same replica twice, nor one ejected (gateway.outliers).
                    out = self.outliers.excluded(pool.endpoints)
                    skip = tried | out if out else tried
                    if adapter and target_model.max_loaded_adapters > 0:
                        target, evicted = self.placer.choose(
                            pool.targets, self.in_flight, adapter,
                            target_model.max_loaded_adapters, skip,
                        )  # fmt: skip
                        if target is not None and evicted:
                            self._unload(pool.endpoints[target.id], evicted)
                    else:
                        target = balance.pick(
                            pool.ring, self.in_flight, req.affinity,
                            profile=target_model.routing_profile or balance.DEFAULT_PROFILE,
                            exclude=skip,
                        )  # fmt: skip
                    if target is None:
                        break
                    tried.add(target.id)
                    url = pool.endpoints[target.id]
                    outcome = await self._try(
                        call, url, target.id, target_model, served=name,
                        engine=pool.engines.get(target.id, ""),
                    )  # fmt: skip
                    if outcome is None:
                        return
                    last = outcome
                    self.observer.retried(name)
            if (
                not woken and table.pool(model.name) is None and model.external is None
                and model.name not in table.unplaced
            ):  # fmt: skip
                # No replica anywhere: wake the model and wait for it (bounded).
                woken = True
                wait = model_waits(model, self.options).wake
                if await self.state.wait_for_pool(model.name, wait):
                    continue
            break
        for name in external:
            ext = table.models[name]
            if name != model.name:
                self.observer.fell_back(model.name, name)
            outcome = await self._try(
                call, ext.external.url.rstrip("/"), -1, ext,
                served=ext.external.model or name, external=True,
            )  # fmt: skip
            if outcome is None:
                return
            last = outcome
        if last:
            raise errors.upstream_failed(req.model, last)
        table = self.state.table
        if model.name in table.unplaced:
            why = table.unplaced[model.name]
            log.info("%s: %s has no room: %s", call.sent.request_id, model.name, why)
            if why.startswith(UNPLACEABLE):
                raise errors.unplaceable(req.model, why[len(UNPLACEABLE) :].lstrip(": "))
            raise errors.unavailable(
                f"The model '{req.model}' has no ready replica and the cluster has no room "
                "to start one now: try again later, or another model.", NO_ROOM_RETRY,
            )  # fmt: skip
        raise errors.unavailable(
            f"The model '{req.model}' has no ready replica yet (it is being started, or the "
            "cluster has no room for it): try again shortly.",
            self.options.retry_after,
        )

    async def _check_context(
        self, table: Table, pool: Pool, model: Any, req: bodies.Request, entry: Entry
    ) -> None:
        context = pool.context
        if not context or req.kind == bodies.EMBEDDING and not req.text:
            return
        asked = req.max_tokens or 0
        why = f" ({pool.context_why})" if pool.context_why else ""
        if req.token_ids:
            # Counted exactly: as many tokens as ids (``prompt_bytes`` holds that count).
            if req.prompt_bytes + asked > context:
                raise errors.context_length_exceeded(
                    req.model, context, req.prompt_bytes + asked, why
                )
            return
        verdict = sizing.judge(req.prompt_bytes, req.messages, asked, context)
        if verdict == sizing.FITS:
            return
        if verdict == sizing.EXCEEDS:
            low, _ = sizing.prompt_bounds(req.prompt_bytes, req.messages)
            raise errors.context_length_exceeded(req.model, context, low + asked, why)
        # The engine's tokenizer decides: llama-server, vLLM and the sim have /tokenize.
        endpoint = next(iter(pool.endpoints.values()))
        count = await self._tokenize(endpoint, model.name, req.text)
        if count is not None and count + asked > context:
            raise errors.context_length_exceeded(req.model, context, count + asked, why)

    async def _tokenize(self, endpoint: str, model: str, text: str) -> int | None:
        body = json.dumps({"content": text, "prompt": text, "model": model}).encode()
        try:
            resp = await self.upstream.request(
                "POST", endpoint + "/tokenize", body, [("Content-Type", "application/json")],
                connect_timeout=self.options.connect_timeout, first_byte_timeout=10,
                read_timeout=10,
            )  # fmt: skip
            raw = await resp.read()
        except UpstreamError:
            return None
        if resp.status != 200:
            return None
        try:
            answer = json.loads(raw)
        except ValueError:
            return None
        if isinstance(answer.get("count"), int):
            return answer["count"]
        tokens = answer.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    async def _try(
        self,
        call: _Call,
        base: str,
        replica: int,
        target_model: Any,
        *,
        served: str,
        external: bool = False,
        engine: str = "",
    ) -> str | None:
        """Send to one replica; None when the client had its answer, else why not."""
        sent, key, entry, req = call.sent, call.key, call.entry, call.req
        data, raw, verdict, judging_answers = call.data, call.raw, call.verdict, call.answers
        adapter = entry.adapter if target_model.name == entry.model.name else None
        lora = _lora(target_model, adapter) if engine == "llamacpp" else None
        if (
            lora is None
            and data["model"] == (adapter or served)
            and (not req.stream or req.include_usage)
        ):
            payload = raw  # nothing to change: the client's bytes as they came
        else:
            if lora is not None:
                # llama-server applies adapters per request, by their place in the list
                # it was started with; the engine knows the model by its own name.
                out = bodies.rewrite(data, served=served, stream=req.stream)
                out["lora"] = lora
            else:
                out = bodies.rewrite(data, served=served, stream=req.stream, adapter=adapter)
            payload = json.dumps(out, ensure_ascii=False).encode()
        path = {"chat": "/v1/chat/completions", "completion": "/v1/completions",
                "embedding": "/v1/embeddings"}[req.kind]  # fmt: skip
        if external and base.endswith("/v1"):
            path = path[len("/v1") :]
        headers = [("Content-Type", "application/json")]
        if external:
            try:
                secret = providers.key(target_model)  # checked again, as it is sent
            except providers.Refused as refused:
                log.warning("%s: %s: %s", sent.request_id, target_model.name, refused.why)
                return refused.told
            if secret:
                headers.append(("Authorization", f"Bearer {secret}"))
        in_flight = self.in_flight
        sent.model, sent.replica = target_model.name, replica
        in_flight[replica] = in_flight.get(replica, 0) + 1
        resp: Response | None = None
        waits = model_waits(target_model, self.options)
        # A stream's head comes before its first token; a whole answer's after its last.
        head_wait = (waits.first_token if req.stream or req.kind == bodies.EMBEDDING
                     else waits.whole(req.max_tokens))  # fmt: skip
        sent_at = asyncio.get_running_loop().time()
        try:
            try:
                resp = await self.upstream.request(
                    "POST", base + path, payload, headers,
                    connect_timeout=self.options.connect_timeout,
                    first_byte_timeout=head_wait, read_timeout=waits.between,
                )  # fmt: skip
            except UpstreamError as error:
                log.warning("%s: %s at %s failed: %s", sent.request_id, target_model.name,
                            "the provider" if external else f"replica {replica}", error)  # fmt: skip
                self._replica_failed(target_model.name, replica, error.kind)
                if error.kind == TIMEOUT:
                    return f"no answer from {target_model.name} within {head_wait:g} s"
                return _told(error)
            if resp.status >= 500:
                self._replica_failed(target_model.name, replica, f"HTTP {resp.status}")
            if resp.status == 401 and not external:
                # A replica's 401: its engine holds another key than its replica's (the
                # secret key changed and its agent has not restarted it yet, or another
                # server took its port). Another replica may answer; this one fails every
                # request until then, so it counts toward its ejection as a 5xx does.
                self._replica_failed(target_model.name, replica, "HTTP 401 (engine key)")
            if resp.status in RETRY_STATUSES or (resp.status == 401 and not external):
                detail = f"HTTP {resp.status}"
                resp.release()
                return detail
            if verdict is not None:
                await self._await_request_verdict(req, verdict, resp)
            whole = True
            if req.stream and resp.status == 200:
                whole = await self._stream(sent, key, entry, req, resp, judging_answers, waits,
                                           sent_at)  # fmt: skip
            else:
                await self._whole(sent, key, entry, req, resp, judging_answers)
            if whole and resp.status < 500:
                # Answered to its end: its failures in a row are over (a 429 never gets here).
                self.outliers.succeeded(replica)
            return None
        except _Retry as retry:
            self._replica_failed(target_model.name, replica, retry.detail)
            return retry.detail
        except UpstreamError as error:
            # A whole answer's body broke or stalled after its head (a stream handles its
            # own): nothing reached the client, so another replica may answer.
            log.warning("%s: %s at replica %s failed within its answer: %s", sent.request_id,
                        target_model.name, replica, error)  # fmt: skip
            self._replica_failed(target_model.name, replica, error.kind)
            if sent.started:
                raise
            return _told(error)
        except Refused as refused:
            verdict = refused.verdict
            self.observer.refused(verdict["direction"], verdict.get("judge") or "",
                                  tuple(verdict.get("categories") or ()))  # fmt: skip
            self.observer.refusal(Refusal(
                request_id=sent.request_id, key=key.name, owner=key.owner,
                model=target_model.name, direction=verdict["direction"],
                judge=verdict.get("judge") or "", verdict=verdict.get("verdict") or "",
                categories=tuple(verdict.get("categories") or ()),
                score=verdict.get("score"), judged=verdict.get("judged", True) is not False,
                failures=tuple(verdict.get("failed") or ()),
            ))  # fmt: skip
            log.info("refused %s (%s) of %s on %s: judge %s, %s", sent.request_id,
                     verdict["direction"], key.name, target_model.name,
                     verdict.get("judge") or "none answered",
                     ", ".join(verdict.get("categories") or ()) or "-")  # fmt: skip
            if sent.started:
                return None
            raise refused.error from None
        finally:
            if resp is not None:
                resp.release()
            in_flight[replica] -= 1
            if not in_flight[replica]:
                del in_flight[replica]

    def _replica_failed(self, model: str, replica: int | None, why: str) -> None:
        """An attempt on ``replica`` failed (no connection, a broken one, no answer in
        time, a 5xx): told to the outlier detection, which may eject it."""
        if replica is None or replica < 0:
            return  # an external provider: not a replica of ours
        pool = self.state.table.pool(model)
        replicas = pool.endpoints if pool else (replica,)
        ejection = self.outliers.failed(model, replica, replicas)
        if ejection is None:
            health, after = self.outliers.replicas.get(replica), self.outliers.rules.after
            if health is not None and not health.until and health.failures == after:
                # Due, and kept in routing: said once (when it comes due).
                log.warning("replica %d of %s failed %d times in a row and stays in routing: "
                            "%s", replica, model, health.failures,
                            "it is the model's only ready replica" if len(replicas) <= 1
                            else "as many of the model's replicas are out as may be")  # fmt: skip
            return
        log.warning("replica %d of %s ejected from routing for %g s after %d failures in a "
                    "row (the last: %s)", replica, model, ejection.seconds, ejection.failures,
                    why)  # fmt: skip
        self.observer.ejected(model, replica, ejection.seconds, time.time() + ejection.seconds)

    def _unload(self, endpoint: str, adapter: str) -> None:
        """Ask a vLLM replica to unload an adapter it holds least recently, off the path."""

        async def unload() -> None:
            body = json.dumps({"lora_name": adapter}).encode()
            try:
                resp = await self.upstream.request(
                    "POST", endpoint + "/v1/unload_lora_adapter", body,
                    [("Content-Type", "application/json")], first_byte_timeout=30,
                )  # fmt: skip
                await resp.read()
            except UpstreamError as error:
                log.warning("unloading adapter %s from %s failed: %s", adapter, endpoint, error)

        self._later(unload())

    async def _await_request_verdict(
        self, req: bodies.Request, verdict: asyncio.Task[dict[str, Any]], resp: Response
    ) -> None:
        result = await verdict
        try:
            if result.get("decision") != "allow":
                raise Refused(_refusal("request", result), _refused("request", result))
            if result.get("request_cut"):
                # Too long for the judge: it read the start and the end; the middle too.
                await self._judge_parts(req, req.text, REQUEST)
        except Refused:
            resp.release()  # closes the engine's connection: it stops
            raise

    async def _whole(
        self, sent: _Sent, key: Key, entry: Entry, req: bodies.Request, resp: Response,
        judging_answers: bool,
    ) -> None:  # fmt: skip
        raw = await resp.read(self.options.max_answer)
        status = resp.status
        content_type = resp.header(b"content-type") or b"application/json"
        if status >= 400:
            # The engine's own shape of error (FastAPI's detail, a numeric code, text),
            # made OpenAI's.
            raw = errors.from_engine(status, raw, content_type)
            content_type = b"application/json"
        if status == 200 and judging_answers and req.kind != bodies.EMBEDDING:
            try:
                text = _answer_text(json.loads(raw))
            except ValueError:
                # Not JSON: whatever it is, it is judged as it would reach the client.
                text = raw.decode("utf-8", "replace")
            if text:
                result = await self._judge_answer(req, text)
                if result.get("answer_cut"):
                    await self._judge_parts(req, text, ANSWER)
        _usage_from(raw, sent)
        await sent.start(status, [(b"content-type", content_type)])
        await sent.body(raw, more=False)

    async def _stream(
        self, sent: _Sent, key: Key, entry: Entry, req: bodies.Request, resp: Response,
        judging_answers: bool, waits: timeouts.Waits, sent_at: float,
    ) -> bool:  # fmt: skip
        """Relay a stream; its first event is due ``waits.first_token`` after it was sent
        (``sent_at``, the loop's clock), each next within ``waits.between`` of the last.
        False when the engine failed after the first byte (the client was told so)."""
        framer = sse.Framer()
        hold = (
            Holdback(self.options.window_tokens, self.options.window_ms / 1000)
            if judging_answers else None
        )  # fmt: skip
        strip_usage = not req.include_usage
        conn = resp._conn
        loop = asyncio.get_running_loop()
        done = False
        seen = False  # the first token (not a chunk with only the role)
        # What came before the first token (the role) waits for it: until a byte has
        # reached the client the request can still move to another replica.
        early: list[bytes] = []
        read = 0  # how far into the answer's text the judges have read every character
        try:
            while not done:
                timeout = (waits.between if seen
                           else max(0.0, sent_at + waits.first_token - loop.time()))  # fmt: skip
                if hold is not None:
                    wait = hold.wait(loop.time())
                    if wait is not None:
                        timeout = min(timeout, wait + 0.001)
                try:
                    data = await conn.next_data(timeout)
                except UpstreamError as error:
                    if error.kind == TIMEOUT and hold is not None and hold.wait(loop.time()) == 0:
                        data = b""
                    else:
                        raise
                if data is None:
                    break
                out: list[bytes] = []
                for event in framer.feed(data):
                    payload = sse.data_of(event)
                    if payload is None:
                        continue
                    if payload == sse.DONE:
                        done = True
                        break
                    if not seen:
                        seen = _carries_token(payload)
                    if b'"usage":{' in payload or b'"usage": {' in payload:
                        _usage_from(payload, sent)
                    if strip_usage and b'"usage"' in payload:
                        payload = _without_usage(payload)
                        if payload is None:
                            continue
                    chunk_bytes = b"data: " + payload + b"\n\n"
                    if hold is None:
                        out.append(chunk_bytes)
                    else:
                        hold.add(chunk_bytes, _held_text(payload), loop.time())
                if hold is not None:
                    if hold.due(loop.time()):
                        read = await self._window(req, hold, read)
                    out = hold.releasable()
                if out and not seen and len(early) + len(out) <= MAX_EARLY:
                    early += out
                elif out:
                    if early:
                        out, early = early + out, []
                    if not sent.started:
                        await sent.start(200, SSE_HEADERS)
                    await sent.body(b"".join(out), text=seen)  # TTFT: from the first token
            rest = early
            if hold is not None:
                if hold.unjudged:
                    await self._window(req, hold, read, final=True)
                rest += hold.releasable()
            if not sent.started:
                await sent.start(200, SSE_HEADERS)
            await sent.body(b"".join(rest) + b"data: [DONE]\n\n", more=False, text=bool(rest))
            return True
        except Refused as refused:
            if hold is not None:
                hold.drop()
            resp.release()  # the engine stops
            if not sent.started:
                raise
            await sent.body(_filtered_end(refused), more=False)
            raise
        except UpstreamError as error:
            resp.release()
            if hold is not None:
                hold.drop()
            if error.kind == TIMEOUT:
                error = UpstreamError(TIMEOUT, (
                    f"the engine sent nothing for {waits.between:g} s" if seen
                    else f"no first token within {waits.first_token:g} s"))  # fmt: skip
            log.warning("%s: %s's stream failed: %s", sent.request_id, sent.model, error)
            told = error.args[0] if error.kind == TIMEOUT else _told(error)
            if not sent.started:
                raise _Retry(told) from None
            self._replica_failed(sent.model, sent.replica, told)
            failure = {"error": {"message": f"the engine's stream failed: {told}",
                                 "type": "server_error", "param": None,
                                 "code": "upstream_error"}}  # fmt: skip
            await sent.body(sse.encode_json(failure) + b"data: [DONE]\n\n", more=False)
            return False

    async def _window(
        self, req: bodies.Request, hold: Holdback, read: int, final: bool = False
    ) -> int:
        """Judge the text so far; return how far into it every character was read."""
        ticket = hold.start()
        result = await self._judge_answer(req, ticket.text)
        if result.get("answer_cut"):
            # Too long for the judge: it read the start and the end. What came since the
            # last window read whole is judged on its own (in parts if need be).
            await self._judge_parts(req, ticket.text[max(0, read - PART_OVERLAP) :], ANSWER)
        hold.allow(ticket, final)
        return ticket.upto

    async def _judge_answer(self, req: bodies.Request, text: str) -> dict[str, Any]:
        """The guard's verdict on an answer's text: a refusal raises ``Refused``."""
        return self._allowed(ANSWER, await self.guard.judge(req.text, text))

    def _allowed(self, direction: str, result: dict[str, Any]) -> dict[str, Any]:
        if result.get("decision") != "allow":
            raise Refused(_refusal(direction, result), _refused(direction, result))
        if result.get("failed_open"):
            self.observer.failed_open()
        return result

    async def _judge_parts(self, req: bodies.Request, text: str, direction: str) -> None:
        """Judge ``text`` (the request's, or the answer's) in halves, overlapping so no
        phrase is only ever split, each halved again while the judge still reads only its
        start and end: nothing passes that a judge did not read. ``Refused`` at the first
        refusal; a part of ``MIN_PART`` characters still too long is refused as
        unjudgeable. An answer's parts are judged with the request, as every answer is."""
        room = asyncio.Semaphore(PARTS_AT_ONCE)
        cut = f"{direction}_cut"

        async def judged(part: str) -> dict[str, Any]:
            async with room:
                if direction == REQUEST:
                    return self._allowed(REQUEST, await self.guard.judge(part))
                return await self._judge_answer(req, part)

        parts = _halves(text)
        while parts:
            results = await asyncio.gather(*(judged(p) for p in parts))
            again = [p for p, r in zip(parts, results, strict=True) if r.get(cut)]
            short = min((len(p) for p in again), default=MIN_PART + 1)
            if short <= MIN_PART:
                error = ApiError(
                    400, f"The {direction} could not be judged: {short} characters of it are "
                    "still too long for the judge's context, and nothing unjudged is let through.",
                    code="content_filter", param=None, headers={"x-should-retry": "false"},
                )  # fmt: skip
                raise Refused(error, {"decision": "refuse", "judged": False, "judge": None,
                                      "categories": [], "direction": direction})  # fmt: skip
            parts = [half for p in again for half in _halves(p)]


@dataclass
class _Call:
    """One request on its way: what the client sent, and what is known of it so far."""

    sent: _Sent
    key: Key
    entry: Entry
    req: bodies.Request
    data: dict[str, Any]
    raw: bytes  # the body as the client sent it
    verdict: asyncio.Task[dict[str, Any]] | None  # the guard's on the request, running
    answers: bool  # whether the policy judges answers


class _Retry(Exception):
    """The engine failed before any byte reached the client: another replica may answer."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Sent:
    """The response as sent so far, and what the request came to (for the observer)."""

    __slots__ = ("send", "started", "status", "start_at", "first_at", "model", "replica",
                 "tokens_in", "tokens_out", "stream", "request_id", "unreserved",
                 "outcome")  # fmt: skip

    def __init__(self, send: Send, start_at: float) -> None:
        self.send = send
        self.started = False
        self.status = 0  # the status sent (0: none yet)
        # What the request came to when not its status: 499 (the client went away before
        # the answer ended), 500 (the gateway failed after the head was sent).
        self.outcome = 0
        self.start_at = start_at
        self.first_at: float | None = None
        self.model = ""
        self.replica: int | None = None
        self.tokens_in = 0
        self.tokens_out = 0
        self.stream = False
        # The id the client gets (x-request-id, as OpenAI's API sends it); a refusal's
        # record carries it.
        self.unreserved = False  # a token budget reserved nothing for the answer
        self.request_id = "req_" + secrets.token_hex(12)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        headers = [*headers, (b"x-request-id", self.request_id.encode())]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = True, text: bool = True) -> None:
        if self.first_at is None and data and text:
            self.first_at = time.perf_counter()
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def json(self, status: int, value: Any) -> None:
        data = json.dumps(value, ensure_ascii=False).encode()
        await self.start(status, [*JSON, (b"content-length", str(len(data)).encode())])
        await self.body(data, more=False)


_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


def _usage_from(raw: bytes, sent: _Sent) -> None:
    """Tokens in and out from an answer's (or a chunk's) usage, without parsing it all."""
    found = _PROMPT_TOKENS.search(raw)
    if found:
        sent.tokens_in = int(found.group(1))
    found = _COMPLETION_TOKENS.search(raw)
    if found:
        sent.tokens_out = int(found.group(1))


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else None
    return None


async def _send_error(send: Send, error: ApiError, request_id: str = "") -> None:
    data = error.body()
    headers = [*JSON, (b"content-length", str(len(data)).encode())]
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    headers += [(k.encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive: Receive, limit: int, scope: Scope | None = None) -> bytes | None:
    """The whole body (None: the client went away first); 413 past ``limit``, at once
    (before any of it is read) when the request's ``Content-Length`` says so."""
    declared = _content_length(scope) if scope is not None else None
    if declared is not None and declared > limit:
        raise ApiError(413, f"The body is {declared} bytes (its Content-Length), over the "
                       f"gateway's limit of {limit} bytes: send less.",
                       code="request_too_large")  # fmt: skip
    read = await lean.read_body(receive, limit)
    if read is None:
        return None
    body, more = read
    if more or len(body) > limit:
        raise ApiError(413, f"The body is over {limit} bytes.", code="request_too_large")
    return body


def _content_length(scope: Scope) -> int | None:
    """The request's declared ``Content-Length`` (the server has checked it is a number
    when it framed the body by it); None when absent or unreadable."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any] | None) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if task is not None and not task.done():
                task.cancel()
            return


def _describe(entry: Entry, table: Table) -> dict[str, Any]:
    m = entry.model
    pool = table.pool(m.name)
    context = pool.context if pool and pool.context else m.context_length
    out: dict[str, Any] = {
        "id": entry.name,
        "object": "model",
        "created": table.added.get(m.name, table.created),
        "owned_by": m.owner or "llmgw",
        "description": m.description,
        "context_length": context or None,
        "max_output": m.max_output or None,
        "capabilities": {
            "tools": m.capabilities.tools,
            "vision": m.capabilities.vision,
            "embeddings": m.capabilities.embeddings,
        },
    }
    if entry.adapter:
        out["parent"] = m.name
        out["adapter"] = True
    elif entry.name != m.name:
        out["alias_of"] = m.name
    if m.external is not None:
        out["external"] = True
    return out


def _lora(model: Any, adapter: str | None) -> list[dict[str, Any]] | None:
    """llama-server's per-request adapters: the one named at its scale, else none (an
    adapter left out of the list is not applied). None when the model has no adapters."""
    if not model.adapters:
        return None
    for index, a in enumerate(model.adapters):
        if a.name == adapter:
            return [{"id": index, "scale": a.scale or 1.0}]
    return []


def _told(error: UpstreamError) -> str:
    """What a client is told of an engine's failure: its kind, never an address (the
    operator's log has the whole error, by request id)."""
    if error.kind == TIMEOUT:
        return "timeout"
    if error.kind == BROKEN:
        return "the engine's connection broke"
    return "no connection to the engine"


def _halves(text: str) -> list[str]:
    """``text`` in two halves that overlap by ``PART_OVERLAP`` characters."""
    middle = len(text) // 2
    return [text[: middle + PART_OVERLAP], text[max(0, middle - PART_OVERLAP) :]]


def _carries_token(payload: bytes) -> bool:
    """Whether a streamed event is the first token or later (``sse.carries_token``)."""
    try:
        return sse.carries_token(json.loads(payload))
    except (ValueError, RecursionError):
        return True


def _held_text(payload: bytes) -> str:
    """The text a streamed chunk would put before the client, for the guard's windows.

    Every chunk is read (only under a guard that judges answers): one that cannot be
    read is judged as its raw data, never released as if it carried no text."""
    try:
        chunk = json.loads(payload)
    except (ValueError, RecursionError):
        return payload.decode("utf-8", "replace")
    if not isinstance(chunk, dict):
        return payload.decode("utf-8", "replace")
    return sse.chunk_text(chunk)


def _answer_text(answer: Any) -> str:
    """Everything of a whole answer a client would read: content, reasoning, refusals,
    tool calls' arguments, completions' text."""
    if not isinstance(answer, dict):
        return json.dumps(answer)
    texts = []
    for choice in answer.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            for name in ("content", "reasoning_content", "refusal"):
                if isinstance(message.get(name), str):
                    texts.append(message[name])
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    texts.append(function["arguments"])
        if isinstance(choice.get("text"), str):
            texts.append(choice["text"])
    return "\n".join(texts)


def _refused(direction: str, result: dict[str, Any]) -> dict[str, Any]:
    """A refusal's record (``Refused.verdict``): ``judged`` false when no judge answered
    (each failed or was skipped by its breaker, and the policy fails closed), and
    ``failed``, each judge that gave no verdict on the way with how: (judge, kind)."""
    answered = result.get("judge") is not None and result.get("verdict") is not None
    failed = tuple(
        (str(f.get("judge") or ""), str(f.get("kind") or ""))
        for f in result.get("failures") or ()
        if isinstance(f, dict)
    )
    judged = answered and result.get("judged", True) is not False
    return {**result, "direction": direction, "judged": judged, "failed": failed}


def _refusal(direction: str, result: dict[str, Any]) -> ApiError:
    if result.get("judged") is False or (result.get("verdict") is None and result.get("failures")):
        return ApiError(
            400 if direction == "request" else 400,
            f"The {direction} could not be judged (every judge failed) and the guard's policy "
            "fails closed: it was refused. Try again when the judges answer.",
            code="content_filter", param=None, headers={"x-should-retry": "false"},
        )  # fmt: skip
    return errors.content_filter(
        direction, result.get("judge") or "?", list(result.get("categories") or ())
    )


def _filtered_end(refused: Refused) -> bytes:
    end = {
        "id": "llmgw-guard",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}],
    }
    error = refused.error.payload()
    return sse.encode_json(end) + sse.encode_json(error) + b"data: [DONE]\n\n"


def _without_usage(payload: bytes) -> bytes | None:
    """A chunk without the usage the client did not ask for; None for a usage-only one."""
    if payload.endswith(b',"usage":null}'):
        return payload[: -len(b',"usage":null}')] + b"}"
    try:
        chunk = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(chunk, dict) or "usage" not in chunk:
        return payload
    if not chunk.get("choices"):
        return None
    chunk.pop("usage", None)
    return json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode()
