"""Rerank on the gateway's one path: ``POST /v1/rerank`` and Cohere's ``POST /v2/rerank``.

A rerank request takes chat's path whole (``Gateway.complete``, kind ``rerank``): the
key and its scope, admission, the key's and the owner's budgets, the guard on the query
and every document (``gateway.path.body``), routing, retries before the first byte, outlier
ejection, usage and the metrics. Its dialect (``Rerank``, on the cycle) reads the
client's body (``gateway.path.dialects.rerank``), gives the engine its own
``/v1/rerank`` body, and writes the engine's answer in the client's shape. The model
named must list ``rerank`` in its capabilities (the engine ranks natively: llama-server
started with ``--reranking``, vLLM, SGLang, the sim), else ``embeddings`` (the gateway
embeds the query and the documents in one request and ranks by cosine similarity: the
answer's ``meta.method`` says ``embeddings``), else 400 ``model_not_supported``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import TYPE_CHECKING, Any

from gateway.path import body as bodies
from gateway.path import errors
from gateway.path.cycle import read_body
from gateway.path.dialect import Dialect, read_request
from gateway.path.dialects import rerank
from gateway.path.dialects.common import DialectError

if TYPE_CHECKING:
    from gateway.path.cycle import Cycle, Receive, Scope
    from gateway.path.parts import Complete, Parts

RERANK = "rerank"
V1_PATH, V2_PATH = rerank.V1_PATH, rerank.V2_PATH
SHAPES = {V1_PATH: rerank.V1, V2_PATH: rerank.V2}


class Rerank(Dialect):
    """A rerank request of either shape (``shape``: ``rerank.V1`` or ``V2``)."""

    name = RERANK

    def __init__(self, request_id: str = "", shape: str = rerank.V1) -> None:
        super().__init__(request_id)
        self.shape = shape
        self.request: rerank.RerankRequest | None = None
        self.by_embeddings = False  # ranked by embedding similarity (no reranker)
        self.tokens: int | None = None  # the engine's count, as its answer said it

    def chat_body(self, data: dict[str, Any]) -> dict[str, Any]:
        """The engine's rerank body (the name says chat's: the step is chat's)."""
        self.request = read_request(lambda d: rerank.read(d, self.shape), data)
        return rerank.engine_request(self.request)

    def whole(self, raw: bytes) -> bytes:
        assert self.request is not None
        try:
            engine = json.loads(raw)
            method = "rerank"
            if self.by_embeddings:
                engine, method = rerank.from_embeddings(self.request, engine), "embeddings"
            self.tokens = rerank.answer_tokens(engine) if isinstance(engine, dict) else None
            out = rerank.answer(self.request, engine, ident="rerank-" + uuid.uuid4().hex,
                                method=method)  # fmt: skip
        except (ValueError, RecursionError, DialectError):
            raise errors.not_a_rerank_answer() from None
        return json.dumps(out, ensure_ascii=False).encode()


def for_path(path: str, request_id: str = "") -> Rerank | None:
    """The rerank dialect of a request to ``path`` (None: not a rerank path)."""
    shape = SHAPES.get(path)
    return Rerank(request_id, shape) if shape is not None else None


async def serve_rerank(parts: Parts, complete: Complete, cycle: Cycle, scope: Scope,
                receive: Receive, path: str, method: str) -> None:  # fmt: skip
    """``POST /v1/rerank`` or ``/v2/rerank`` (``cycle.dialect`` is a ``Rerank``)."""
    if method != "POST":
        raise errors.method_not_allowed(path, "POST")
    raw = await read_body(receive, parts.options.max_body, scope)
    if raw is None:
        return  # the client went away
    cycle.watch(receive)  # from here a client that goes away cancels this task
    await complete(cycle, bodies.RERANK, raw)
    dialect = cycle.dialect
    if isinstance(dialect, Rerank) and dialect.tokens and not cycle.tokens_in:
        cycle.tokens_in = dialect.tokens  # an engine that says only total_tokens


def allows(cycle: Cycle) -> None:
    """The model ranks: natively (``rerank``), else by its embeddings (the request made
    an embeddings request to the engine), else 400."""
    entry, dialect, req = cycle.entry, cycle.dialect, cycle.req
    assert entry is not None and isinstance(dialect, Rerank) and req is not None
    capabilities = entry.model.capabilities
    if capabilities.rerank:
        return
    if not capabilities.embeddings:
        raise errors.no_rerank(req.model)
    assert dialect.request is not None
    dialect.by_embeddings = True
    cycle.data = rerank.embeddings_request(dialect.request)
    cycle.raw = json.dumps(cycle.data, ensure_ascii=False).encode()
    cycle.req = dataclasses.replace(req, kind=bodies.EMBEDDING)
