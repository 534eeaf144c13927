"""Which engine serves which dialect natively, and where the gateway sends each: plain data.

``NATIVE`` is what each engine the agent runs answers itself (read from the engines'
sources and, for llama-server, measured: ``docs/dialects.md``). ``route`` picks the
engine path for a request of a dialect:

- the Responses and Messages APIs go to the engine's own route where it serves the
  dialect and that route is fit (``FIT``: decided per engine and dialect, from the
  engine's sources or, for llama-server, measured), unless the operator forces
  translation (``translate``: ``LLMGW_GATEWAY_TRANSLATE_DIALECTS``); the gateway still
  reads and checks the request itself, keeps ``store`` and ``previous_response_id``
  across replicas, and normalizes the answer (``gateway.path.dialects.native``). Else
  they go to the engine's chat completions and are translated
  (``gateway.path.dialects.responses``, ``messages``);
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
    # The sim engine: /v1/responses and /v1/messages as vLLM serves them (agent.simnative:
    # made of its chat completions, stateless), count_tokens through /tokenize, and a
    # lexical reranker (agent.simchat).
    "sim": {RESPONSES: "/v1/responses", MESSAGES: "/v1/messages", RERANK: "/v1/rerank"},
}

# Whether a generating dialect is sent to the engine's own route (NATIVE) or translated:
# only a route known to take every request the gateway sends it and to answer in the
# dialect's event types is fit; any doubt, translated (docs/dialects.md, "Native or
# translated, per engine").
FIT: dict[str, dict[str, bool]] = {
    # Measured (docs/dialects.md): its Responses route says "completed" for an answer cut
    # at max_output_tokens (the API says "incomplete"): translated. Its Messages route
    # reads tool uses, tool results and the billing-free system prompt, streams the API's
    # events with the prompt's cached tokens, and names the stop sequence it stopped at;
    # what it would take wrongly (no max_tokens, an unknown role: a 500 or a 200) the
    # gateway refuses first.
    "llamacpp": {RESPONSES: False, MESSAGES: True},
    # vllm/entrypoints/openai/responses (the openai package's event types, each with its
    # sequence_number; usage with input_tokens_details.cached_tokens) and
    # vllm/entrypoints/anthropic (Anthropic's events, each under its event: line).
    "vllm": {RESPONSES: True, MESSAGES: True},
    # Neither route is confirmed from its sources (its Responses route is reported
    # incomplete by those who tried it): both translated.
    "sglang": {RESPONSES: False, MESSAGES: False},
    # Not measured, and its Responses route is new: translated.
    "trtllm": {RESPONSES: False},
    # Its own routes, tested through the gateway (tests/e2e/test_gateway_dialects.py).
    "sim": {RESPONSES: True, MESSAGES: True},
}

# Forces translation for every engine and model (LLMGW_GATEWAY_TRANSLATE_DIALECTS=all).
ALL = "all"

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


def fit(dialect: str, engine: str, model: str = "",
        translate: frozenset[str] = frozenset()) -> bool:  # fmt: skip
    """Whether a Responses or Messages request to ``model`` on ``engine`` goes to the
    engine's own route: it has one, it is fit, and the operator's ``translate`` (engines
    and model names, or ``all``) does not name the engine or the model."""
    if ALL in translate or engine in translate or (model and model in translate):
        return False
    return bool(NATIVE.get(engine, {}).get(dialect)) and FIT.get(engine, {}).get(dialect, False)


def route(dialect: str, engine: str, *, native: bool = False, embeddings: bool = False,
          model: str = "", translate: frozenset[str] = frozenset()) -> Route | None:  # fmt: skip
    """The engine path of a dialect's request (the module's docstring); None when the
    engine cannot serve it. ``native``: send the Responses or Messages API to the
    engine's own route where it has one that is ``fit`` (for ``model``, under the
    operator's ``translate``). ``embeddings``: the model serves embeddings, so rerank may
    be made of them."""
    own = NATIVE.get(engine, {}).get(dialect)
    if dialect in (RESPONSES, MESSAGES):
        if native and own and fit(dialect, engine, model, translate):
            return Route(own, True)
        return Route(CHAT_PATH, False)
    if dialect == COUNT_TOKENS:
        if own:
            return Route(own, True)
        return Route(TOKENIZE_PATH, False) if engine in TOKENIZE_MESSAGES else None
    if dialect == RERANK:
        if own:
            return Route(own, True)
        return Route(EMBEDDINGS_PATH, False) if embeddings else None
    raise ValueError(f"unknown dialect {dialect!r}")
