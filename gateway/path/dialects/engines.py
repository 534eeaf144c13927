"""Which engine serves which dialect natively, and where the gateway sends each: plain data.

``NATIVE`` is what each engine the agent runs answers itself (read from the engines'
sources and, for llama-server, measured: ``docs/dialects.md``). ``route`` picks the
engine path for a request of a dialect:

- the Responses and Messages APIs go to the engine's chat completions and are
  translated (``gateway.path.dialects.responses``, ``messages``) unless ``native`` is
  asked and the engine serves the dialect: then the guard reads one chunk shape, the
  gateway keeps ``store`` and ``previous_response_id`` itself across replicas, and
  every engine answers alike (llama-server's own Responses stream has no
  ``sequence_number`` and its Messages errors are not in Anthropic's shape);
- ``count_tokens`` goes to the engine's own route, else to a ``/tokenize`` that takes
  chat messages (vLLM's, the sim's), else nowhere (None: the gateway refuses);
- rerank goes to the engine's own ``/v1/rerank``; a model that serves embeddings but no
  reranker can be ranked by embedding similarity (``embeddings=True``); else None.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.path.dialects.common import CHAT_PATH

RESPONSES = "responses"
MESSAGES = "messages"
COUNT_TOKENS = "count_tokens"
RERANK = "rerank"
DIALECTS = (RESPONSES, MESSAGES, COUNT_TOKENS, RERANK)

NATIVE: dict[str, dict[str, str]] = {
    # llama-server (tools/server/server.cpp): all four; rerank only when started with
    # --reranking, meaningful on a reranker model (docs/dialects.md, measured).
    "llamacpp": {
        RESPONSES: "/v1/responses",
        MESSAGES: "/v1/messages",
        COUNT_TOKENS: "/v1/messages/count_tokens",
        RERANK: "/v1/rerank",
    },
    # vLLM: /v1/responses (its store in memory, per process), /v1/messages and
    # count_tokens (vllm/entrypoints/anthropic), /rerank, /v1/rerank, /v2/rerank for a
    # cross-encoder; cached tokens in chat usage with --enable-prompt-tokens-details.
    "vllm": {
        RESPONSES: "/v1/responses",
        MESSAGES: "/v1/messages",
        COUNT_TOKENS: "/v1/messages/count_tokens",
        RERANK: "/v1/rerank",
    },
    # SGLang: /v1/responses, /v1/messages and count_tokens, /v1/rerank (cross-encoder).
    "sglang": {
        RESPONSES: "/v1/responses",
        MESSAGES: "/v1/messages",
        COUNT_TOKENS: "/v1/messages/count_tokens",
        RERANK: "/v1/rerank",
    },
    # trtllm-serve: /v1/responses; rerank only under the separate `trtllm-serve rerank`
    # command, which the agent does not run.
    "trtllm": {RESPONSES: "/v1/responses"},
    # The sim engine: a chat engine (every generating dialect is translated to it), and
    # a lexical reranker (agent.simchat).
    "sim": {RERANK: "/v1/rerank"},
}

# Engines whose /tokenize takes chat messages (count_tokens without a native route).
TOKENIZE_MESSAGES = frozenset({"vllm", "sim"})
TOKENIZE_PATH = "/tokenize"
EMBEDDINGS_PATH = "/v1/embeddings"


@dataclass(frozen=True)
class Route:
    """Where a dialect's request goes on an engine, and whether it is the engine's own
    (``native``: its answer is the dialect's already) or translated by the gateway."""

    path: str
    native: bool


def route(dialect: str, engine: str, *, native: bool = False,
          embeddings: bool = False) -> Route | None:  # fmt: skip
    """The engine path of a dialect's request (the module's docstring); None when the
    engine cannot serve it. ``native``: send the Responses or Messages API to the
    engine's own route where it has one. ``embeddings``: the model serves embeddings, so
    rerank may be made of them."""
    own = NATIVE.get(engine, {}).get(dialect)
    if dialect in (RESPONSES, MESSAGES):
        return Route(own, True) if native and own else Route(CHAT_PATH, False)
    if dialect == COUNT_TOKENS:
        if own:
            return Route(own, True)
        return Route(TOKENIZE_PATH, False) if engine in TOKENIZE_MESSAGES else None
    if dialect == RERANK:
        if own:
            return Route(own, True)
        return Route(EMBEDDINGS_PATH, False) if embeddings else None
    raise ValueError(f"unknown dialect {dialect!r}")
