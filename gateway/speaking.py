"""The dialects' routes: Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``,
OpenAI's ``/v1/responses``.

A generating request (``POST /v1/messages``, ``POST /v1/responses``) takes chat's path
whole (``Gateway.complete``): its dialect (``gateway.path.dialect``, on the cycle) turns its
body into the chat body it means and the answer back. ``count_tokens`` generates nothing:
the key's scope names the model, one of its ready replicas counts (the engine's own
route, else its ``/tokenize``: ``gateway.path.dialects.engines``), bounded in time.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from gateway import stored
from gateway.path import body as bodies
from gateway.path import errors
from gateway.path.affinity import affinity_key
from gateway.path.answer import told_of
from gateway.path.cycle import read_body
from gateway.path.dialects import engines, messages
from gateway.path.dialects.common import DialectError
from llmgw_core.upstream import UpstreamError

if TYPE_CHECKING:
    from gateway.path.cycle import Cycle, Receive, Scope
    from gateway.path.parts import Complete, Parts

# How long a replica may take to count a prompt's tokens.
COUNT_TIMEOUT = 10.0


async def serve_dialect(
    parts: Parts,
    complete: Complete,
    cycle: Cycle,
    scope: Scope,
    receive: Receive,
    path: str,
    method: str,
) -> None:
    """A request to one of the dialects' paths (``cycle.dialect`` is set)."""
    dialect = cycle.dialect
    assert dialect is not None
    if path not in (messages.PATH, messages.COUNT_PATH, "/v1/responses"):
        # GET and DELETE /v1/responses/{id}: a stored response (gateway.stored).
        await stored.answer(cycle, method, path, scope.get("query_string", b""))
        return
    if method != "POST":
        raise errors.method_not_allowed(path, "POST")
    raw = await read_body(receive, parts.options.max_body, scope)
    if raw is None:
        return  # the client went away
    cycle.watch(receive)  # from here a client that goes away cancels this task
    if path == messages.COUNT_PATH:
        await count_tokens(parts, cycle, raw)
        return
    if path == "/v1/responses":
        await stored.before(cycle, raw)
        await complete(cycle, bodies.CHAT, raw)
        stored.after(parts, cycle)
        _began(parts, cycle)
        return
    await complete(cycle, bodies.CHAT, raw)


def _began(parts: Parts, cycle: Cycle) -> None:
    """A stored response that named no session begins one, keyed by its id: the turn that
    continues it (``previous_response_id``) goes to the replica that answered it."""
    dialect = cycle.dialect
    response = getattr(dialect, "response", None)
    request = getattr(dialect, "request", None)
    if (
        cycle.session is not None or response is None or request is None or not request.store
        or cycle.key is None or cycle.replica is None or cycle.replica < 0
    ):  # fmt: skip
        return
    session = affinity_key(cycle.key, str(response["id"]))
    parts.sessions.began(cycle.model, session, cycle.replica, time.monotonic())


async def count_tokens(parts: Parts, cycle: Cycle, raw: bytes) -> None:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": n}`` counted by a ready
    replica of the model named (the prompt the engine would read, tools included)."""
    try:
        data = bodies.parse(raw)
        asked = messages.count_request(data)
    except bodies.BodyError as error:
        raise errors.bad_request(error.message, error.param) from None
    except DialectError as error:
        raise errors.bad_request(error.message, error.param) from None
    key, table = cycle.key, parts.state.table
    assert key is not None
    entry = table.resolve(asked["model"])
    if entry is None or not key.may_name(entry):
        raise errors.model_not_found(asked["model"])
    model = entry.model
    cycle.model = model.name
    if model.external is not None:
        raise errors.count_tokens_unsupported(
            asked["model"], "is an external provider's model: count_tokens is served for the "
            "cluster's own models.")  # fmt: skip
    pool = table.pool(model.name)
    if pool is None or not pool.endpoints:
        raise errors.not_ready(asked["model"], parts.options.retry_after)
    out = parts.outliers.excluded(pool.endpoints)
    ready = [r for r in pool.endpoints if not out or r not in out] or list(pool.endpoints)
    replica = min(ready, key=lambda r: parts.in_flight.get(r, 0))
    engine = pool.engines.get(replica, "")
    where = engines.route(engines.COUNT_TOKENS, engine)
    if where is None:
        raise errors.count_tokens_unsupported(
            asked["model"], f"runs on an engine ({engine or 'unknown'}) that cannot count "
            "tokens: count with a model served by llama-server, vLLM or SGLang.")  # fmt: skip
    served = entry.adapter or model.name
    body = dict(data) if where.native else dict(asked)
    body["model"] = served
    cycle.replica = replica
    try:
        resp = await parts.upstream.request(
            "POST", pool.endpoints[replica] + where.path,
            json.dumps(body, ensure_ascii=False).encode(), [("Content-Type", "application/json")],
            connect_timeout=parts.options.connect_timeout, first_byte_timeout=COUNT_TIMEOUT,
            read_timeout=COUNT_TIMEOUT,
        )  # fmt: skip
        answer = await resp.read(parts.options.max_answer)
    except UpstreamError as error:
        raise errors.count_failed(asked["model"], told_of(error)) from None
    if resp.status != 200:
        detail = errors.from_engine(resp.status, answer, resp.header(b"content-type"))
        message = json.loads(detail).get("error", {}).get("message") or ""
        raise errors.count_failed(asked["model"], f"HTTP {resp.status}: {message}"[:500])
    try:
        counted = messages.count_answer(json.loads(answer))
    except (ValueError, DialectError):
        raise errors.count_failed(asked["model"], "its answer is not a count") from None
    # Counted, not read by a model: no tokens in for the usage rows and budgets.
    await cycle.json(200, counted)
