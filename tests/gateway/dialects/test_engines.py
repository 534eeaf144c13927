"""Where each dialect's request goes on each engine the agent runs."""

from __future__ import annotations

import pytest

from gateway.path.dialects import engines
from gateway.path.dialects.engines import COUNT_TOKENS, MESSAGES, RERANK, RESPONSES, Route, route


@pytest.mark.parametrize("engine", sorted(engines.NATIVE))
@pytest.mark.parametrize("dialect", [RESPONSES, MESSAGES])
def test_generating_dialects_are_translated_to_chat_unless_native_is_asked(engine, dialect):
    assert route(dialect, engine) == Route("/v1/chat/completions", False)
    own = engines.NATIVE[engine].get(dialect)
    fit = engines.FIT[engine].get(dialect, False)
    asked = route(dialect, engine, native=True)
    assert asked == (Route(own, True) if own and fit else Route("/v1/chat/completions", False))


def test_native_only_where_fit_and_the_operator_does_not_force_translation() -> None:
    # llama-server's own Responses route is measured unfit, its Messages route fit;
    # vLLM's and the sim's are fit.
    assert route(RESPONSES, "llamacpp", native=True) == Route("/v1/chat/completions", False)
    assert route(MESSAGES, "llamacpp", native=True) == Route("/v1/messages", True)
    assert route(RESPONSES, "vllm", native=True) == Route("/v1/responses", True)
    assert route(MESSAGES, "sim", native=True) == Route("/v1/messages", True)
    # The operator names engines, models, or all of them.
    for translate in ({"sim"}, {"chat"}, {"all"}):
        assert route(MESSAGES, "sim", native=True, model="chat",
                     translate=frozenset(translate)) == Route("/v1/chat/completions", False)  # fmt: skip
    assert route(MESSAGES, "sim", native=True, model="chat",
                 translate=frozenset({"vllm", "other"})) == Route("/v1/messages", True)  # fmt: skip


def test_the_sim_serves_the_dialects_and_reranks() -> None:
    assert route(RESPONSES, "sim", native=True) == Route("/v1/responses", True)
    assert route(RERANK, "sim") == Route("/v1/rerank", True)
    assert route(COUNT_TOKENS, "sim") == Route("/tokenize", False)


@pytest.mark.parametrize(("engine", "expected"), [
    ("llamacpp", Route("/v1/messages/count_tokens", True)),
    ("vllm", Route("/v1/messages/count_tokens", True)),
    ("trtllm", None),
])  # fmt: skip
def test_count_tokens_goes_native_else_to_tokenize_else_nowhere(engine, expected) -> None:
    assert route(COUNT_TOKENS, engine) == expected


def test_rerank_without_a_reranker_is_made_of_embeddings_or_refused() -> None:
    assert route(RERANK, "trtllm") is None
    assert route(RERANK, "trtllm", embeddings=True) == Route("/v1/embeddings", False)
    with pytest.raises(ValueError):
        route("speech", "vllm")
