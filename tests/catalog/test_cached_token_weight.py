"""A model's cached_token_weight (what a token budget charges for a cached prompt token,
0 to 1, default 1) on every surface: the rules, a catalog file, the API, the console's
form (the admin's is the same form) and the model's page."""

from __future__ import annotations

import math
from typing import Any

import pytest

from catalog.codec import encode_model
from catalog.files import dump_catalog, load_catalog_text
from catalog.models import ServedModel
from catalog.rules import check_model
from catalog.spec import Model, Profile
from tests.catalog.samples import gpu_model
from tests.catalog.test_views import ADD, HX, new_model_data

URL = "/api/v1/catalog/models/"


def model(**kw: Any) -> Model:
    return Model(name="m", source="org/m", profiles=[Profile(name="p", engine="vllm",
                 gpu_class="nvidia-h100-80gb", tp=1)], **kw)  # fmt: skip


@pytest.mark.parametrize("weight", [-0.1, 1.5, math.nan])
def test_the_rules_refuse_a_weight_outside_0_to_1(weight: float) -> None:
    found = [p for p in check_model(model(cached_token_weight=weight))
             if p.path == ("cached_token_weight",)]  # fmt: skip
    assert [p.code for p in found] == ["cached_token_weight_range"]
    assert "is not 0 to 1" in found[0].message


@pytest.mark.parametrize("weight", [0.0, 0.1, 1.0])
def test_the_rules_take_a_weight_from_0_to_1(weight: float) -> None:
    assert not [p for p in check_model(model(cached_token_weight=weight))
                if p.path == ("cached_token_weight",)]  # fmt: skip


def test_a_catalog_file_reads_it_writes_it_unless_1_and_refuses_a_wrong_one() -> None:
    base = "models:\n- name: m\n  source: org/m\n  profiles: [{name: p, engine: vllm, " \
           "gpu_class: nvidia-h100-80gb}]\n"  # fmt: skip
    models, problems = load_catalog_text(base)
    assert not problems and models is not None and models[0].cached_token_weight == 1.0
    assert "cached_token_weight" not in encode_model(models[0])
    for weight in (0.0, 0.25):
        models, problems = load_catalog_text(base + f"  cached_token_weight: {weight}\n")
        assert not problems and models is not None
        assert encode_model(models[0])["cached_token_weight"] == weight
        again, _ = load_catalog_text(dump_catalog(models))
        assert again is not None and again[0].cached_token_weight == weight  # 0 kept as 0
    _, problems = load_catalog_text(base + "  cached_token_weight: lots\n")
    assert problems and problems[0].path[-1] == "cached_token_weight"


@pytest.mark.django_db
def test_the_api_stores_it_answers_it_and_refuses_a_wrong_one(
    api_for: Any, operator: Any, client_for: Any
) -> None:
    api = api_for(operator)
    r = api.post(URL, gpu_model("cheap", cached_token_weight=2), format="json")
    assert r.status_code == 400 and "cached_token_weight" in str(r.json())
    assert not ServedModel.objects.exists()
    r = api.post(URL, gpu_model("cheap", cached_token_weight=0.1), format="json")
    assert r.status_code == 201, r.json()
    assert api.get(f"{URL}cheap/").json()["cached_token_weight"] == 0.1
    page = client_for(operator).get("/catalog/models/cheap/").content.decode()
    assert 'id="cached-token-weight">0.1 ' in page
    r = api.post(URL, gpu_model("plain"), format="json")
    assert r.status_code == 201 and "cached_token_weight" not in r.json()  # 1: left out
    assert ServedModel.objects.get(name="plain").to_spec().cached_token_weight == 1.0


@pytest.mark.django_db
def test_the_console_form_refuses_a_wrong_one_and_reads_empty_as_1(
    client_for: Any, operator: Any
) -> None:
    c = client_for(operator)
    r = c.post(ADD, new_model_data(c, cached_token_weight="1.5"), **HX)
    assert "is not 0 to 1" in r.content.decode() and not ServedModel.objects.exists()
    r = c.post(ADD, new_model_data(c, cached_token_weight=""), **HX)
    assert r.status_code == 200 and r.get("HX-Redirect"), r.content.decode()[:2000]
    assert ServedModel.objects.get(name="chat").cached_token_weight == 1.0
