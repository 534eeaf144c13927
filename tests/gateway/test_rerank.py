"""Rerank through the real gateway: ``/v1/rerank`` and Cohere's ``/v2/rerank`` bodies, as
RAG tools send them with httpx, against the gateway (real uvicorn, its table read from the
database, the real guard with a sim judge) in front of a real sim engine, which ranks
natively and embeds. The key's scope, the guard on the query and the documents, the
embeddings fallback and the clear 400 of a model that cannot rank."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.path.guarding import Guard
from gateway.records.state import State
from guard import records
from guard import services as guard_services
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Harness
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "UNSAFE-MARKER"
DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow.",
             "The capital of Italy is Rome."]  # fmt: skip


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[str, str]]:
    judge, judge_url = launch("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "0",
                              "--tps", "100000")  # fmt: skip
    engine, engine_url = launch("--model", "ranker", "--ttft", "0", "--tps", "100000")
    yield judge_url, engine_url
    stop(judge)
    stop(engine)


@pytest.fixture
def gw(sims: tuple[str, str]) -> Iterator[tuple[Harness, str, str]]:
    judge_url, engine_url = sims
    h = Harness(state=State(), guard=Guard())
    guard_model("judge", endpoint=judge_url)
    for name, capabilities in (("ranker", {"rerank": True}), ("embedder", {"embeddings": True}),
                               ("chatty", {})):  # fmt: skip
        store(sim_model(name, tp=None, capabilities=capabilities))
        Replica.objects.create(model_name=name, state="ready", endpoint=engine_url, profile="sim")
    guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"],
                               "fail": "closed"}, surface="cli")  # fmt: skip
    _, secret = keys.create_key("rag")
    _, scoped = keys.create_key("scoped", models=["chatty"])
    records.start()
    h.serve([], [])
    yield h, secret, scoped
    h.close()
    records.RECORDER.stop()


def post(h: Harness, path: str, secret: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(h.url + path, json=body, timeout=30,
                      headers={"Authorization": f"Bearer {secret}"})  # fmt: skip


def test_v1_rerank_is_ranked_by_the_engine_in_the_v1_shape(gw: tuple[Harness, str, str]) -> None:
    h, secret, _ = gw
    r = post(h, "/v1/rerank", secret, {"model": "ranker", "query": "capital of France",
                                       "documents": DOCUMENTS, "top_n": 2})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["index"] for x in body["results"]][0] == 0 and len(body["results"]) == 2
    assert body["results"][0]["document"] == {"text": DOCUMENTS[0]}
    assert body["meta"]["method"] == "rerank" and body["model"] == "ranker"
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    done = wait_until(lambda: h.gateway.observer.last, what="the request to end")
    assert (done.dialect, done.model, done.status) == ("rerank", "ranker", 200)
    assert done.tokens_in > 0


def test_v2_rerank_is_coheres_shape(gw: tuple[Harness, str, str]) -> None:
    h, secret, _ = gw
    r = post(h, "/v2/rerank", secret, {"model": "ranker", "query": "capital of Italy",
                                       "documents": DOCUMENTS})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["results"][0]["index"] == 2 and "document" not in body["results"][0]
    assert body["meta"]["api_version"] == {"version": "2"} and body["id"].startswith("rerank-")
    assert len(body["results"]) == 3


def test_a_model_serving_embeddings_is_ranked_by_cosine(gw: tuple[Harness, str, str]) -> None:
    h, secret, _ = gw
    r = post(h, "/v1/rerank", secret, {"model": "embedder", "query": "capital of France",
                                       "documents": DOCUMENTS})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["method"] == "embeddings" and len(body["results"]) == 3
    assert all(0 <= x["relevance_score"] <= 1 for x in body["results"])


def test_what_cannot_be_ranked_is_a_clear_400_and_the_scope_holds(
    gw: tuple[Harness, str, str],
) -> None:
    h, secret, scoped = gw
    r = post(h, "/v1/rerank", secret, {"model": "chatty", "query": "q", "documents": ["d"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"
    assert "rerank" in r.json()["error"]["message"]
    r = post(h, "/v2/rerank", scoped, {"model": "ranker", "query": "q", "documents": ["d"]})
    assert r.status_code == 404  # outside the key's scope: as if not there
    r = post(h, "/v2/rerank", secret, {"model": "ranker", "query": "q", "documents": [{"x": 1}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[0]"
    r = post(h, "/v1/rerank", secret, {"model": "ranker", "query": "", "documents": ["d"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query"
    r = httpx.post(h.url + "/v2/rerank", json={"model": "ranker"}, timeout=30)
    assert r.status_code == 401
    r = httpx.get(h.url + "/v2/rerank", headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    assert r.status_code == 405


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_the_guard_judges_the_query_and_every_document(
    gw: tuple[Harness, str, str], path: str
) -> None:
    h, secret, _ = gw
    for body in ({"query": f"find {MARKER}", "documents": DOCUMENTS},
                 {"query": "capital", "documents": [*DOCUMENTS, f"it is {MARKER}"]}):  # fmt: skip
        r = post(h, path, secret, {"model": "ranker", **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "content_filter" and MARKER not in r.text
    # Refusals are heard in the request's own task, before it ends.
    wait_until(lambda: sum(h.gateway.observer.refusals.values()) == 2, what="two refusals")
