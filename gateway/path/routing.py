"""Where a request goes, and each attempt on a replica or provider.

``Routing.route`` walks a request's chain: the canary's share to its candidate, else the
model, then its fallbacks in order (a hop the key could not name itself is skipped:
``Key.may_reach``). Each cluster model's ready replicas are picked by its routing
profile (``gateway.path.balance``; adapters by ``gateway.path.adapters.Placer``), never the same
twice, never one ejected (``gateway.path.outliers``); with none anywhere the model is woken
and waited for (bounded). External providers come last, only when no cluster replica
answered. ``attempt`` sends the request to one of them: before the first byte a connect
error, a timeout, a 429, a 401 of a replica or a 5xx moves the request on; the answer
itself is passed on by ``gateway.path.answer``.

A key pinned to a replica (``Key.replica``: made by the control plane alone, for the
capacity bench) takes none of that walk: its requests go to that replica once, or get a
503 naming it when it is not in routing (``Routing._pinned``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from catalog import timeouts
from cluster.placement import UNPLACEABLE
from gateway.path import answer, balance, errors, federation, providers, sizing
from gateway.path import body as bodies
from gateway.path.answer import Retry, told_of
from gateway.path.guarding import GuardRefused, Judging
from gateway.path.options import SET_BY
from gateway.path.parts import Parts
from gateway.path.table import switched_off
from llmgw_core.upstream import TIMEOUT, Response, UpstreamError

if TYPE_CHECKING:
    from gateway.path.cycle import Cycle
    from gateway.path.table import Pool, Table

log = logging.getLogger("gateway")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Retry-After for a model the cluster has no room for: placement frees slowly.
NO_ROOM_RETRY = 30
PATHS = {bodies.CHAT: "/v1/chat/completions", bodies.COMPLETION: "/v1/completions",
         bodies.EMBEDDING: "/v1/embeddings", bodies.RERANK: "/v1/rerank"}  # fmt: skip


# Each model's waits as last worked out, by the model object's id: (the model, the
# options' four waits, its waits). A table read anew makes new model objects, and the
# options may be set again (tests do), so both are compared before one is used.
_waits: dict[int, tuple[Any, tuple[float, float, float, float], timeouts.Waits]] = {}
WAITS_KEPT = 4096  # past that many models' the kept waits start again


def model_waits(model: Any, options: Any) -> timeouts.Waits:
    """The waits for ``model``: its own where its catalog entry gives its latency and
    startup (``catalog.timeouts``), else the options'. Worked out once per model object
    and options' waits, not on every request."""
    given = (options.first_byte_timeout, options.read_timeout, options.whole_timeout,
             options.wake_wait)  # fmt: skip
    kept = _waits.get(id(model))
    if kept is not None and kept[0] is model and kept[1] == given:
        return kept[2]
    waits = timeouts.waits(model, timeouts.Defaults(
        first_token=given[0], between=given[1], whole=given[2], wake=given[3], set_by=SET_BY,
    ))  # fmt: skip
    if len(_waits) >= WAITS_KEPT:
        _waits.clear()
    _waits[id(model)] = (model, given, waits)
    return waits


class Routing:
    """The gateway's routing: its ``parts`` give the state, options, upstream, outliers,
    placer, observer, in-flight counts and background tasks (read at each call), and
    ``judging`` the guard's verdicts on what it sends and relays."""

    def __init__(self, parts: Parts, judging: Judging) -> None:
        self.parts = parts
        self.judging = judging

    async def route(self, cycle: Cycle) -> None:
        """Answer ``cycle`` from the first of its chain that can; else raise the error
        that says why none could."""
        parts, entry = self.parts, cycle.entry
        assert entry is not None and cycle.req is not None
        model = entry.model
        off = switched_off(model, parts.options.now()) if model.scaling.min == 0 else ""
        if not off and (model.scaling.idle_timeout or model.scaling.min == 0):
            parts.state.demand(model.name)  # it is in use: keep it (written off the path)
        pinned = cycle.key.replica if cycle.key is not None else None
        if pinned is not None:
            await self._pinned(cycle, pinned)
            return
        chain = self._chain(cycle)
        tried: set[int] = set()
        last = ""
        woken = False
        while True:
            table = parts.state.table
            for index, name in enumerate(n for n in chain if _in_cluster(table, n)):
                pool = table.pool(name)
                if pool is None:
                    continue
                if index and name != model.name:
                    parts.observer.fell_back(model.name, name)
                outcome = await self._replicas(cycle, table, name, pool, tried)
                if outcome is None:
                    return
                last = outcome or last
            if (
                not woken and not off and table.pool(model.name) is None
                and model.external is None and model.name not in table.unplaced
            ):  # fmt: skip
                # No replica anywhere: wake the model and wait for it (bounded). One
                # switched off is not woken: nothing would start it.
                woken = True
                if await parts.state.wait_for_pool(
                    model.name, model_waits(model, parts.options).wake
                ):
                    continue
            break
        down = None
        for name in (n for n in chain if n in table.models and table.models[n].external):
            ext = table.models[name]
            peer = table.peer_down(ext)
            if peer:  # a federated cluster that is down: sent nothing (docs/federation.md)
                down = down or (peer, table.down[peer])
                continue
            if name != model.name:
                parts.observer.fell_back(model.name, name)
            outcome = await self.attempt(cycle, ext.external.url.rstrip("/"), -1, ext,
                                         served=ext.external.model or name, external=True)  # fmt: skip
            if outcome is None:
                return
            last = outcome
        if off and not last and table.pool(model.name) is None:
            raise errors.switched_off(cycle.req.model, off)
        if down and not last:
            raise errors.peer_down(cycle.req.model, *down)
        raise self._none_answered(cycle, last)

    async def _pinned(self, cycle: Cycle, replica: int) -> None:
        """A key pinned to one replica (the control plane's, for the capacity bench, which
        measures that replica alone): sent there once; never to another replica, a canary,
        a fallback or a provider. 503 naming the replica when it is not in routing; 502
        naming it when it gave no answer."""
        parts, entry = self.parts, cycle.entry
        assert entry is not None
        model, table = entry.model, parts.state.table
        pool = table.pool(model.name)
        if pool is None or replica not in pool.endpoints:
            raise errors.pinned_away(model.name, replica, parts.options.retry_after)
        await self._check_context(table, pool, model, cycle)
        pinned = parts.pinned_in_flight  # counted apart: load scaling leaves the bench out
        pinned[replica] = pinned.get(replica, 0) + 1
        try:
            outcome = await self.attempt(cycle, pool.endpoints[replica], replica, model,
                                         served=model.name, engine=pool.engines.get(replica, ""))  # fmt: skip
        finally:
            pinned[replica] -= 1
            if not pinned[replica]:
                del pinned[replica]
        if outcome is not None:
            raise errors.pinned_failed(model.name, replica, outcome)

    def _chain(self, cycle: Cycle) -> list[str]:
        """The models to try in order: the canary's candidate (its share of requests),
        the model, its fallbacks; each within the key's scope."""
        table, key, req = self.parts.state.table, cycle.key, cycle.req
        assert cycle.entry is not None and key is not None and req is not None
        model = cycle.entry.model
        primary = model.name
        # A canary and fallbacks may name a model by an alias. Each hop is within the
        # key's scope: one the key could not name itself is skipped (Key.may_reach).
        candidate = table.model_named(model.canary.model) if model.canary else None
        if candidate and not key.may_reach(table.models[candidate]):
            candidate = None
        if candidate and balance.in_canary(req.affinity, model.canary.percent):
            primary = candidate
        fallbacks = (table.model_named(f) for f in model.fallbacks)
        reach = [f for f in fallbacks if f and key.may_reach(table.models[f])]
        return list(dict.fromkeys([primary, model.name, *reach]))

    async def _replicas(
        self, cycle: Cycle, table: Table, name: str, pool: Pool, tried: set[int]
    ) -> str | None:
        """Try ``name``'s replicas one after another: None when one answered, else why
        the last did not ('' when there was none to try)."""
        parts, entry, req = self.parts, cycle.entry, cycle.req
        assert entry is not None and req is not None
        target_model = table.models[name]
        await self._check_context(table, pool, target_model, cycle)
        adapter = entry.adapter if name == entry.model.name else None
        last = ""
        while True:
            # Never the same replica twice, nor one ejected (gateway.path.outliers).
            out = parts.outliers.excluded(pool.endpoints)
            skip = tried | out if out else tried
            if adapter and target_model.max_loaded_adapters > 0:
                target, evicted = parts.placer.choose(
                    pool.targets, parts.in_flight, adapter, target_model.max_loaded_adapters, skip
                )
                if target is not None and evicted:
                    self._unload(pool.endpoints[target.id], evicted)
            elif cycle.session is not None:
                # A session's turn: its last replica while it may (gateway.path.affinity).
                target = parts.sessions.pick(
                    name, cycle.session, pool.ring, parts.in_flight, time.monotonic(),
                    profile=target_model.routing_profile or balance.DEFAULT_PROFILE,
                    exclude=skip,
                )  # fmt: skip
            else:
                target = balance.pick(
                    pool.ring, parts.in_flight, req.affinity,
                    profile=target_model.routing_profile or balance.DEFAULT_PROFILE,
                    exclude=skip,
                )  # fmt: skip
            if target is None:
                return last
            tried.add(target.id)
            outcome = await self.attempt(cycle, pool.endpoints[target.id], target.id,
                                         target_model, served=name,
                                         engine=pool.engines.get(target.id, ""))  # fmt: skip
            if outcome is None:
                return None
            last = outcome
            parts.observer.retried(name)

    def _none_answered(self, cycle: Cycle, last: str) -> errors.ApiError:
        """Why no replica or provider answered: each failed, or there was none ready."""
        assert cycle.req is not None and cycle.entry is not None
        name, model = cycle.req.model, cycle.entry.model
        if last:
            return errors.upstream_failed(name, last)
        table = self.parts.state.table
        if model.name in table.unplaced:
            why = table.unplaced[model.name]
            log.info("%s: %s has no room: %s", cycle.request_id, model.name, why)
            if why.startswith(UNPLACEABLE):
                return errors.unplaceable(name, why[len(UNPLACEABLE) :].lstrip(": "))
            return errors.no_room(name, NO_ROOM_RETRY)
        return errors.not_ready(name, self.parts.options.retry_after)

    async def _check_context(self, table: Table, pool: Pool, model: Any, cycle: Cycle) -> None:
        """400 ``context_length_exceeded`` when the prompt and ``max_tokens`` cannot fit
        the pool's context: by the bytes, else by the engine's own count."""
        req = cycle.req
        assert req is not None
        context = pool.context
        if (
            not context
            or req.kind == bodies.RERANK
            or req.kind == bodies.EMBEDDING
            and not req.text
        ):
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
            resp = await self.parts.upstream.request(
                "POST", endpoint + "/tokenize", body, [("Content-Type", "application/json")],
                connect_timeout=self.parts.options.connect_timeout, first_byte_timeout=10,
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

    async def attempt(
        self, cycle: Cycle, base: str, replica: int, target_model: Any, *, served: str,
        external: bool = False, engine: str = "",
    ) -> str | None:  # fmt: skip
        """Send to one replica (``replica`` -1: a provider); None when the client had its
        answer, else why not."""
        req = cycle.req
        assert req is not None
        path = PATHS[req.kind]
        if external and base.endswith("/v1"):
            path = path[len("/v1") :]
        headers = [("Content-Type", "application/json")]
        if external:
            try:
                secret = providers.key(target_model)  # checked again, as it is sent
            except providers.ProviderRefused as refused:
                log.warning("%s: %s: %s", cycle.request_id, target_model.name, refused.why)
                return refused.told
            if secret:
                headers.append(("Authorization", f"Bearer {secret}"))
            if target_model.external.peer:
                headers.append((federation.VIA, federation.VIA_VALUE))
        payload = _payload(cycle, target_model, served, engine)
        if cycle.dialect is not None:
            # The dialect's own route on this engine, where it goes natively (each
            # attempt asks: another replica may run another engine).
            entry = cycle.entry
            assert entry is not None
            adapter = entry.adapter if target_model.name == entry.model.name else None
            sent = cycle.dialect.engine_request(
                "" if external or (adapter and engine == "llamacpp") else engine,
                adapter or served, target_model.name, self.parts.options.translate)  # fmt: skip
            if sent is not None:
                path, payload = sent
        in_flight = self.parts.in_flight
        cycle.model, cycle.replica = target_model.name, replica
        cycle.peer = target_model.external.peer if external else ""
        in_flight[replica] = in_flight.get(replica, 0) + 1
        # A batch's line that may not add replicas: counted apart, as the bench's are.
        idle, apart = (
            cycle.key is not None and cycle.key.batch == "idle",
            self.parts.pinned_in_flight,
        )
        if idle:
            apart[replica] = apart.get(replica, 0) + 1
        try:
            return await self._exchange(cycle, base + path, payload, headers, replica,
                                        target_model, external)  # fmt: skip
        except GuardRefused as refused:
            self.judging.record(cycle, target_model.name, refused)
            if cycle.started:
                return None
            raise refused.error from None
        finally:
            in_flight[replica] -= 1
            if not in_flight[replica]:
                del in_flight[replica]
            if idle:
                apart[replica] -= 1
                if not apart[replica]:
                    del apart[replica]

    async def _exchange(
        self, cycle: Cycle, url: str, payload: bytes, headers: list[tuple[str, str]],
        replica: int, target_model: Any, external: bool,
    ) -> str | None:  # fmt: skip
        """The request sent and its answer passed on; None when the client had it."""
        parts, req, name = self.parts, cycle.req, target_model.name
        assert req is not None
        waits = model_waits(target_model, parts.options)
        # A stream's head comes before its first token; a whole answer's after its last.
        head_wait = (waits.first_token if req.stream or req.kind in bodies.NO_TEXT
                     else waits.whole(req.max_tokens))  # fmt: skip
        sent_at = asyncio.get_running_loop().time()
        resp: Response | None = None
        try:
            try:
                resp = await parts.upstream.request(
                    "POST", url, payload, headers, connect_timeout=parts.options.connect_timeout,
                    first_byte_timeout=head_wait, read_timeout=waits.between,
                )  # fmt: skip
            except UpstreamError as error:
                log.warning("%s: %s at %s failed: %s", cycle.request_id, name,
                            "the provider" if external else f"replica {replica}", error)  # fmt: skip
                self.replica_failed(name, replica, error.kind)
                if error.kind == TIMEOUT:
                    return f"no answer from {name} within {head_wait:g} s"
                return told_of(error)
            moved = self._moves_on(resp, name, replica, external)
            if moved:
                return moved
            if cycle.verdict is not None:
                try:
                    await self.judging.request(cycle)
                except GuardRefused:
                    resp.release()  # closes the engine's connection: it stops
                    raise
            whole = True
            if req.stream and resp.status == 200:
                whole = await answer.streamed(
                    self.judging, parts.options, cycle, resp, waits, sent_at, self.replica_failed
                )
            else:
                await answer.whole(self.judging, parts.options, cycle, resp)
            if whole and resp.status < 500:
                # Answered to its end: its failures in a row are over (a 429 never gets here).
                parts.outliers.succeeded(replica)
            return None
        except Retry as retry:
            self.replica_failed(name, replica, retry.detail)
            return retry.detail
        except UpstreamError as error:
            # A whole answer's body broke or stalled after its head (a stream handles its
            # own): nothing reached the client, so another replica may answer.
            log.warning("%s: %s at replica %s failed within its answer: %s", cycle.request_id,
                        name, replica, error)  # fmt: skip
            self.replica_failed(name, replica, error.kind)
            if cycle.started:
                raise
            return told_of(error)
        finally:
            if resp is not None:
                resp.release()

    def _moves_on(self, resp: Response, model: str, replica: int, external: bool) -> str:
        """Why an answer's status moves the request on ('' when it does not)."""
        if resp.status >= 500:
            self.replica_failed(model, replica, f"HTTP {resp.status}")
        if resp.status == 401 and not external:
            # A replica's 401: its engine holds another key than its replica's (the
            # secret key changed and its agent has not restarted it yet, or another
            # server took its port). Another replica may answer; this one fails every
            # request until then, so it counts toward its ejection as a 5xx does.
            self.replica_failed(model, replica, "HTTP 401 (engine key)")
        if resp.status in RETRY_STATUSES or (resp.status == 401 and not external):
            resp.release()
            return f"HTTP {resp.status}"
        return ""

    def replica_failed(self, model: str, replica: int | None, why: str) -> None:
        """An attempt on ``replica`` failed (no connection, a broken one, no answer in
        time, a 5xx): told to the outlier detection, which may eject it."""
        if replica is None or replica < 0:
            return  # an external provider: not a replica of ours
        parts = self.parts
        pool = parts.state.table.pool(model)
        replicas = pool.endpoints if pool else (replica,)
        ejection = parts.outliers.failed(model, replica, replicas)
        if ejection is None:
            health, after = parts.outliers.replicas.get(replica), parts.outliers.rules.after
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
        parts.observer.ejected(model, replica, ejection.seconds, time.time() + ejection.seconds)
        if parts.shared is not None:
            parts.shared.ejected(model, replica, ejection)  # the other gateway processes too

    def _unload(self, endpoint: str, adapter: str) -> None:
        """Ask a vLLM replica to unload an adapter it holds least recently, off the path."""

        async def unload() -> None:
            body = json.dumps({"lora_name": adapter}).encode()
            try:
                resp = await self.parts.upstream.request(
                    "POST", endpoint + "/v1/unload_lora_adapter", body,
                    [("Content-Type", "application/json")], first_byte_timeout=30,
                )  # fmt: skip
                await resp.read()
            except UpstreamError as error:
                log.warning("unloading adapter %s from %s failed: %s", adapter, endpoint, error)

        self.parts.later(unload())


def _in_cluster(table: Table, name: str) -> bool:
    return name in table.models and table.models[name].external is None


def _payload(cycle: Cycle, target_model: Any, served: str, engine: str) -> bytes:
    """The body the engine gets: the client's bytes as they came when nothing changes,
    else the model's name the engine knows, the adapter, the usage the gateway reads."""
    entry, req, data = cycle.entry, cycle.req, cycle.data
    assert entry is not None and req is not None
    adapter = entry.adapter if target_model.name == entry.model.name else None
    lora = _lora(target_model, adapter) if engine == "llamacpp" else None
    if (
        lora is None
        and data["model"] == (adapter or served)
        and (not req.stream or req.include_usage)
    ):
        return cycle.raw
    if lora is not None:
        # llama-server applies adapters per request, by their place in the list it was
        # started with; the engine knows the model by its own name.
        out = bodies.rewrite(data, served=served, stream=req.stream)
        out["lora"] = lora
    else:
        out = bodies.rewrite(data, served=served, stream=req.stream, adapter=adapter)
    return bodies.dumps(out)


def _lora(model: Any, adapter: str | None) -> list[dict[str, Any]] | None:
    """llama-server's per-request adapters: the one named at its scale, else none (an
    adapter left out of the list is not applied). None when the model has no adapters."""
    if not model.adapters:
        return None
    for index, a in enumerate(model.adapters):
        if a.name == adapter:
            return [{"id": index, "scale": a.scale or 1.0}]
    return []
