"""Rerank in both shapes (native and by embeddings), and the session a request names."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.path.dialects import rerank, sessions
from gateway.path.dialects.common import DialectError

DOCS = ["Paris is in France.", "Berlin is in Germany.", "The weather in Paris is mild."]


def test_a_v1_request_asks_the_engines_rerank_and_answers_sorted_with_documents() -> None:
    request = rerank.read({"model": "r", "query": "Paris weather", "top_n": 2,
                           "documents": [DOCS[0], {"text": DOCS[1]}, DOCS[2]]})  # fmt: skip
    assert rerank.engine_request(request) == {"model": "r", "query": "Paris weather",
                                              "documents": DOCS, "top_n": 2}  # fmt: skip
    # llama-server's answer: no documents, its own order, usage as prompt tokens.
    engine = {"model": "r", "object": "list", "usage": {"prompt_tokens": 30, "total_tokens": 30},
              "results": [{"index": 0, "relevance_score": 0.4},
                          {"index": 2, "relevance_score": 0.9},
                          {"index": 1, "relevance_score": -2.0}]}  # fmt: skip
    out = rerank.answer(request, engine, ident="rr_1")
    assert out == {
        "id": "rr_1", "model": "r", "meta": {"method": "rerank"},
        "results": [{"index": 2, "relevance_score": 0.9, "document": {"text": DOCS[2]}},
                    {"index": 0, "relevance_score": 0.4, "document": {"text": DOCS[0]}}],
        "usage": {"prompt_tokens": 30, "total_tokens": 30},
    }  # fmt: skip
    assert rerank.judged_text(request) == "Paris weather\n" + "\n".join(DOCS)


def test_a_v2_request_is_answered_in_cohere_shape() -> None:
    request = rerank.read({"model": "r", "query": "q", "documents": DOCS}, rerank.V2)
    # vLLM's answer: documents included, TEI-style "score" read as well.
    engine = {"id": "x", "results": [{"index": 1, "document": {"text": DOCS[1]}, "score": 0.5},
                                     {"index": 0, "relevance_score": 0.7},
                                     {"index": 2, "relevance_score": 0.5}],
              "usage": {"total_tokens": 12}}  # fmt: skip
    out = rerank.answer(request, engine, ident="rr_2")
    assert out == {"id": "rr_2", "results": [{"index": 0, "relevance_score": 0.7},
                                             {"index": 1, "relevance_score": 0.5},
                                             {"index": 2, "relevance_score": 0.5}],
                   "meta": {"api_version": {"version": "2"}, "method": "rerank",
                            "tokens": {"input_tokens": 12, "output_tokens": 0}}}  # fmt: skip


def test_return_documents_false_leaves_them_out() -> None:
    request = rerank.read({"model": "r", "query": "q", "documents": DOCS,
                           "return_documents": False})  # fmt: skip
    out = rerank.answer(request, [{"index": 0, "relevance_score": 1}], ident="x")
    assert out["results"] == [{"index": 0, "relevance_score": 1.0}] and "usage" not in out


@pytest.mark.parametrize(
    ("body", "shape", "param"),
    [
        ({"query": "q", "documents": ["a"]}, rerank.V1, "model"),
        ({"model": "r", "documents": ["a"]}, rerank.V1, "query"),
        ({"model": "r", "query": "q", "documents": []}, rerank.V1, "documents"),
        ({"model": "r", "query": "q", "documents": ["a", 3]}, rerank.V1, "documents[1]"),
        ({"model": "r", "query": "q", "documents": [{"text": "a"}]}, rerank.V2, "documents[0]"),
        ({"model": "r", "query": "q", "documents": ["a"], "top_n": 0}, rerank.V1, "top_n"),
        ({"model": "r", "query": "q", "documents": ["a"] * 1001}, rerank.V1, "documents"),
    ],
)  # fmt: skip
def test_a_request_it_cannot_serve_names_the_field(body: dict[str, Any], shape: str,
                                                   param: str) -> None:  # fmt: skip
    with pytest.raises(DialectError) as caught:
        rerank.read(body, shape)
    assert caught.value.param == param


@pytest.mark.parametrize("engine", [{"error": "x"}, {"results": [{"index": 9, "score": 1}]},
                                    {"results": [{"index": 0}]}, {"results": ["a"]}])  # fmt: skip
def test_an_engine_answer_it_cannot_read_is_an_error(engine: Any) -> None:
    request = rerank.read({"model": "r", "query": "q", "documents": ["a"]})
    with pytest.raises(DialectError):
        rerank.answer(request, engine, ident="x")


def test_a_model_of_embeddings_ranks_by_cosine() -> None:
    request = rerank.read({"model": "e", "query": "q", "documents": ["same", "opposite", "side"]})
    assert rerank.embeddings_request(request) == {"model": "e",
                                                  "input": ["q", "same", "opposite", "side"]}  # fmt: skip
    vectors = [[1.0, 0.0], [2.0, 0.0], [-1.0, 0.0], [0.0, 3.0]]
    embeddings = {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)][::-1],
                  "usage": {"prompt_tokens": 8, "total_tokens": 8}}  # fmt: skip
    out = rerank.answer(request, rerank.from_embeddings(request, embeddings), ident="x",
                        method="embeddings")  # fmt: skip
    assert [(r["index"], r["relevance_score"]) for r in out["results"]] == [
        (0, 1.0), (2, 0.5), (1, 0.0)]  # fmt: skip
    assert out["meta"] == {"method": "embeddings"}
    with pytest.raises(DialectError):
        rerank.from_embeddings(request, {"data": embeddings["data"][:2]})
    with pytest.raises(DialectError):
        rerank.from_embeddings(request, {"data": [{"embedding": [1.0]}, *embeddings["data"][1:]]})


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30),
       top_n=st.none() | st.integers(1, 40))  # fmt: skip
def test_results_are_sorted_cut_and_each_document_once(scores: list[float], top_n) -> None:
    docs = [f"d{i}" for i in range(len(scores))]
    body: dict[str, Any] = {"model": "r", "query": "q", "documents": docs}
    if top_n is not None:
        body["top_n"] = top_n
    request = rerank.read(body)
    engine = [{"index": i, "relevance_score": s} for i, s in reversed(list(enumerate(scores)))]
    results = rerank.answer(request, engine, ident="x")["results"]
    assert len(results) == min(len(scores), top_n or len(scores))
    assert [r["relevance_score"] for r in results] == sorted(scores, reverse=True)[: len(results)]
    assert len({r["index"] for r in results}) == len(results)
    assert all(r["document"]["text"] == docs[r["index"]] for r in results)


# -- sessions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "header", "found"),
    [
        ({}, None, None),
        ({"prompt_cache_key": "p", "previous_response_id": "resp_1"}, "h",
         sessions.Session("header", "h")),
        ({"prompt_cache_key": "p", "previous_response_id": "resp_1"}, None,
         sessions.Session("prompt_cache_key", "p")),
        ({"previous_response_id": "resp_1"}, "", sessions.Session("previous_response_id", "resp_1")),
        ({"metadata": {"user_id": "user_x_session_y"}}, None,
         sessions.Session("metadata.user_id", "user_x_session_y")),
        ({"metadata": {"user_id": ""}, "prompt_cache_key": ""}, None, None),
    ],
)  # fmt: skip
def test_the_session_a_request_names_first_found_first(body, header, found) -> None:
    assert sessions.session_of(body, header) == found


@pytest.mark.parametrize(("body", "header", "param"), [
    ({"prompt_cache_key": 5}, None, "prompt_cache_key"),
    ({}, "x" * 513, "x-session-id"),
    ({"metadata": {"user_id": ["a"]}}, None, "metadata.user_id"),
])  # fmt: skip
def test_a_session_key_it_cannot_take_names_the_field(body, header, param) -> None:
    with pytest.raises(DialectError) as caught:
        sessions.session_of(body, header)
    assert caught.value.param == param


def test_a_conversation_keeps_its_first_turns_session() -> None:
    first = sessions.chained(None, None, "resp_1")
    assert first == "resp_1"
    second = sessions.chained(sessions.session_of({"previous_response_id": "resp_1"}),
                              first, "resp_2")  # fmt: skip
    assert second == "resp_1"
    named = sessions.chained(sessions.Session("header", "s"), None, "resp_3")
    assert named == "s"
    # A previous response no longer stored: its id is the session.
    assert (
        sessions.chained(sessions.Session("previous_response_id", "resp_9"), None, "r") == "resp_9"
    )
