"""Rerank: ``POST /v1/rerank`` (the shape llama-server, vLLM, SGLang, TEI-style servers and
Jina answer) and Cohere's ``POST /v2/rerank``: plain Python, no I/O.

A request (``read``) is a query and documents; the engine is asked at ``ENGINE_PATH``
(``engine_request``: ``{model, query, documents, top_n}``, which every engine that reranks
takes) and its answer written in the client's shape (``answer``): results sorted by
``relevance_score``, highest first, cut to ``top_n``, each with the document's ``index``
in the request and, in the ``/v1`` shape unless ``return_documents`` is false, the
document itself (``{"text"}``), whatever the engine put in its own answer.

A model that serves embeddings but not rerank can rank by embedding similarity
(``embeddings_request``, then ``from_embeddings``): the query and the documents are
embedded in one request and each document scored by the cosine of its vector with the
query's, mapped to [0, 1] as ``(1 + cos) / 2``. A cross-encoder (a model that reads query
and document together) ranks better; the gateway says which was used in the answer's
``meta``. A chat-only model cannot rank: the gateway refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.path.dialects.common import DialectError, optional_bool, optional_int, require_str

V1_PATH = "/v1/rerank"
V2_PATH = "/v2/rerank"
ENGINE_PATH = "/v1/rerank"
EMBEDDINGS_PATH = "/v1/embeddings"
V1, V2 = "v1", "v2"
# Documents in one request at most (Cohere's own bound).
MAX_DOCUMENTS = 1000


@dataclass(frozen=True)
class RerankRequest:
    """A checked rerank request."""

    shape: str  # V1 or V2: the shape the client is answered in
    model: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None
    return_documents: bool


def read(body: Any, shape: str = V1) -> RerankRequest:
    """Check a rerank body of ``shape``; raise ``DialectError`` naming what is wrong.

    ``/v1``: documents are strings or ``{"text": ...}`` objects, ``return_documents``
    defaults to true (as Jina's API and vLLM answer). ``/v2`` (Cohere): documents are
    strings, and results carry no documents."""
    if not isinstance(body, Mapping):
        raise DialectError("the request body must be a JSON object")
    model = require_str(body, "model")
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise DialectError("query must be a non-empty string", "query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise DialectError("documents must be a non-empty list of texts", "documents")
    if len(documents) > MAX_DOCUMENTS:
        raise DialectError(
            f"documents holds {len(documents)} texts; send at most {MAX_DOCUMENTS} a request",
            "documents",
        )
    texts = []
    for i, document in enumerate(documents):
        if shape == V1 and isinstance(document, Mapping) and isinstance(document.get("text"), str):
            document = document["text"]
        if not isinstance(document, str):
            kinds = "a string" if shape == V2 else 'a string or {"text": ...}'
            raise DialectError(f"documents[{i}] must be {kinds}", f"documents[{i}]")
        texts.append(document)
    return RerankRequest(
        shape=shape,
        model=model,
        query=query,
        documents=tuple(texts),
        top_n=optional_int(body, "top_n"),
        return_documents=shape == V1 and optional_bool(body, "return_documents", True),
    )


def judged_text(request: RerankRequest) -> str:
    """What the guard judges of a rerank request: the query and every document (the
    engine reads them all; its answer is scores, with no text of its own)."""
    return "\n".join((request.query, *request.documents))


def engine_request(request: RerankRequest) -> dict[str, Any]:
    """The body an engine's native ``/v1/rerank`` is sent."""
    return {
        "model": request.model,
        "query": request.query,
        "documents": list(request.documents),
        "top_n": request.top_n or len(request.documents),
    }


def _score(result: Mapping[str, Any]) -> float | None:
    for key in ("relevance_score", "score"):
        value = result.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def answer_tokens(answer: Mapping[str, Any]) -> int | None:
    usage = answer.get("usage")
    if isinstance(usage, Mapping):
        for key in ("total_tokens", "prompt_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return None


def answer(
    request: RerankRequest, engine: Any, *, ident: str, method: str = "rerank"
) -> dict[str, Any]:
    """The client's answer of an engine's: its results (``index`` and ``relevance_score``,
    or TEI's ``score``; an engine's list of results alone is read too) sorted, cut to
    ``top_n`` and given documents in the request's shape. ``method`` says how the scores
    were made (``rerank``: the engine's reranker; ``embeddings``: ``from_embeddings``).

    Raises:
        DialectError: the engine's answer holds no readable results, or an index outside
            the request's documents.
    """
    results = engine.get("results") if isinstance(engine, Mapping) else engine
    if not isinstance(results, list):
        raise DialectError("the engine's rerank answer holds no results")
    scored: dict[int, float] = {}
    for result in results:
        if not isinstance(result, Mapping):
            raise DialectError("the engine's rerank answer holds a result that is not an object")
        index, score = result.get("index"), _score(result)
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(request.documents)
            or score is None
        ):
            raise DialectError(f"the engine's rerank answer holds an unreadable result: {result!r}")
        scored[index] = score
    ranked = sorted(scored.items(), key=lambda pair: (-pair[1], pair[0]))
    if request.top_n is not None:
        ranked = ranked[: request.top_n]
    tokens = answer_tokens(engine) if isinstance(engine, Mapping) else None
    out_results = []
    for index, score in ranked:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if request.return_documents:
            result["document"] = {"text": request.documents[index]}
        out_results.append(result)
    if request.shape == V2:
        meta: dict[str, Any] = {"api_version": {"version": "2"}, "method": method}
        if tokens is not None:
            meta["tokens"] = {"input_tokens": tokens, "output_tokens": 0}
        return {"id": ident, "results": out_results, "meta": meta}
    out: dict[str, Any] = {"id": ident, "model": request.model, "results": out_results,
                           "meta": {"method": method}}  # fmt: skip
    if tokens is not None:
        out["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
    return out


# -- ranking by embeddings ------------------------------------------------------------------


def embeddings_request(request: RerankRequest) -> dict[str, Any]:
    """The ``/v1/embeddings`` body that embeds the query and every document at once."""
    return {"model": request.model, "input": [request.query, *request.documents]}


def from_embeddings(request: RerankRequest, embeddings: Any) -> dict[str, Any]:
    """An engine-like rerank answer of an embeddings answer: each document scored by the
    cosine of its vector with the query's, as ``(1 + cos) / 2`` (the answer goes on to
    ``answer`` with ``method="embeddings"``).

    Raises:
        DialectError: the answer does not hold one vector per input, all of one length.
    """
    data = embeddings.get("data") if isinstance(embeddings, Mapping) else None
    count = 1 + len(request.documents)
    if not isinstance(data, list) or len(data) != count:
        raise DialectError(f"the engine's embeddings answer does not hold {count} vectors")
    vectors: list[list[float] | None] = [None] * count
    for position, item in enumerate(data):
        vector = item.get("embedding") if isinstance(item, Mapping) else None
        index = item.get("index", position) if isinstance(item, Mapping) else position
        if not (
            isinstance(index, int)
            and 0 <= index < count
            and isinstance(vector, list)
            and vector
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector)
        ):
            raise DialectError("the engine's embeddings answer holds an unreadable vector")
        vectors[index] = [float(x) for x in vector]
    query = vectors[0]
    assert query is not None
    results = []
    for i, vector in enumerate(vectors[1:]):
        if vector is None or len(vector) != len(query):
            raise DialectError("the engine's embeddings answer holds vectors of unlike lengths")
        results.append({"index": i, "relevance_score": (1.0 + _cosine(query, vector)) / 2.0})
    usage = embeddings.get("usage") if isinstance(embeddings, Mapping) else None
    return {"results": results, "usage": usage if isinstance(usage, Mapping) else None}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norm == 0 or not math.isfinite(norm):
        return 0.0
    return max(-1.0, min(1.0, dot / norm))
