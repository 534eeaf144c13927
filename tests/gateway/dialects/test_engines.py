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
    asked = route(dialect, engine, native=True)
    assert asked == (Route(own, True) if own else Route("/v1/chat/completions", False))


def test_the_sim_is_a_chat_engine_and_a_reranker() -> None:
    assert route(RESPONSES, "sim", native=True) == Route("/v1/chat/completions", False)
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
