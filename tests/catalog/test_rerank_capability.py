"""The ``rerank`` capability on every surface, as ``embeddings``: a file, the API, the
console's form and the model's page; the agent's llama-server for it reranks."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.codec import encode_model
from catalog.files import load_catalog_text
from catalog.models import ServedModel
from tests.catalog.samples import gpu_model
from tests.catalog.test_views import ADD, HX, new_model_data

BASE = ("models:\n- name: m\n  source: org/m\n  profiles: [{name: p, engine: vllm, "
        "gpu_class: nvidia-h100-80gb}]\n")  # fmt: skip


def test_a_file_reads_it_writes_it_and_refuses_a_wrong_one() -> None:
    models, problems = load_catalog_text(BASE + "  capabilities: {rerank: true}\n")
    assert not problems and models is not None and models[0].capabilities.rerank
    assert encode_model(models[0])["capabilities"] == {"rerank": True}
    _, problems = load_catalog_text(BASE + "  capabilities: {rerank: sometimes}\n")
    assert problems and problems[0].path[-1] == "rerank"


def test_the_rules_refuse_it_on_an_engine_the_agent_does_not_start_as_a_reranker() -> None:
    from catalog.rules import check_model
    from catalog.spec import Capabilities, Model, Profile

    def ranker(engine: str) -> Model:
        return Model(name="m", source="org/m", capabilities=Capabilities(rerank=True),
                     profiles=[Profile(name="p", engine=engine, gpu_class="nvidia-h100-80gb")])  # fmt: skip

    found = [p for p in check_model(ranker("trtllm")) if p.path == ("capabilities", "rerank")]
    assert [p.code for p in found] == ["rerank_engine"] and "llamacpp, vllm" in found[0].message
    assert not [p for p in check_model(ranker("vllm")) if p.path == ("capabilities", "rerank")]


@pytest.mark.django_db
def test_the_api_and_the_form_store_it(api_for: Any, operator: Any, client_for: Any) -> None:
    api = api_for(operator)
    r = api.post("/api/v1/catalog/models/", gpu_model("ranker", capabilities={"rerank": True}),
                 format="json")  # fmt: skip
    assert r.status_code == 201, r.json()
    assert r.json()["capabilities"] == {"rerank": True}
    r = api.post("/api/v1/catalog/models/", gpu_model("bad", capabilities={"rerank": "x"}),
                 format="json")  # fmt: skip
    assert r.status_code == 400 and "rerank" in str(r.json())
    c = client_for(operator)
    assert '<span class="badge">rerank</span>' in c.get("/catalog/models/ranker/").content.decode()
    r = c.post(ADD, new_model_data(c, capabilities_rerank="on"), **HX)
    assert r.status_code == 200 and r.get("HX-Redirect"), r.content.decode()[:2000]
    assert ServedModel.objects.get(name="chat").to_spec().capabilities.rerank
