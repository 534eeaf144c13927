"""A model's ``residency`` (local: never crosses to a federated cluster) and ``overflow``
(where a lower band goes while admission holds it back) on every surface: the rules, a
catalog file, the API, the console's form (the admin's is the same form) and the model's
page; a local model naming a peer's model on any hop is refused with why."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.codec import encode_model
from catalog.files import dump_catalog, load_catalog_text
from catalog.models import ServedModel
from catalog.rules import check_catalog
from catalog.spec import SLO, External, Model, Profile
from tests.catalog.samples import gpu_model
from tests.catalog.test_views import ADD, HX, new_model_data

URL = "/api/v1/catalog/models/"
SECOND = 1_000_000_000
PEER = {"url": "https://llmgw.east.example/v1", "model": "chat", "peer": "east"}


def model(name: str = "m", **kw: Any) -> Model:
    return Model(name=name, source=f"org/{name}", profiles=[Profile(name="p", engine="vllm",
                 gpu_class="nvidia-h100-80gb", tp=1)], **kw)  # fmt: skip


def peer_model() -> Model:
    return Model(name="east/chat", source="llmgw-peer://east/chat", external=External(**PEER))


def codes(models: list[Model], field: str) -> list[str]:
    return [p.code for p in check_catalog(models) if p.path and p.path[0] == field]


def test_the_rules_take_local_and_refuse_any_other_residency() -> None:
    assert codes([model(residency="local")], "residency") == []
    found = [p for p in check_catalog([model(residency="eu")]) if p.path == ("residency",)]
    assert [p.code for p in found] == ["bad_residency"] and "is not local" in found[0].message


def test_the_rules_refuse_an_overflow_unknown_itself_a_judge_or_without_an_slo() -> None:
    slo = SLO(ttft_p99=SECOND)
    assert codes([model(overflow="big", slo=slo), model("big")], "overflow") == []
    assert codes([model(overflow="nope", slo=slo)], "overflow") == ["unknown_overflow"]
    assert codes([model(overflow="m", slo=slo)], "overflow") == ["overflow_self"]
    assert codes([model(overflow="big"), model("big")], "overflow") == ["overflow_needs_slo"]


def test_a_local_model_naming_a_peers_model_on_any_hop_is_refused_with_why() -> None:
    slo = SLO(ttft_p99=SECOND)
    local = model(residency="local", fallbacks=["east/chat"], overflow="east/chat", slo=slo)
    found = [p for p in check_catalog([local, peer_model()]) if p.code == "local_to_peer"]
    assert [p.path for p in found] == [("fallbacks", 0), ("overflow",)]
    assert "never leave for a peer" in found[0].message and '"east"' in found[0].message
    # Without residency: local the same hops are allowed.
    free = model(fallbacks=["east/chat"], overflow="east/chat", slo=slo)
    assert not [p for p in check_catalog([free, peer_model()]) if p.code == "local_to_peer"]


def test_a_catalog_file_reads_both_writes_them_only_when_set_and_refuses_wrong_ones() -> None:
    base = "models:\n- name: m\n  source: org/m\n  profiles: [{name: p, engine: vllm, " \
           "gpu_class: nvidia-h100-80gb}]\n  slo: {ttft_p99: 1s}\n" \
           "- name: big\n  source: org/big\n  profiles: [{name: p, engine: vllm, " \
           "gpu_class: nvidia-h100-80gb}]\n"  # fmt: skip
    models, problems = load_catalog_text(base)
    assert not problems and models is not None
    assert "residency" not in encode_model(models[0]) and "overflow" not in encode_model(models[0])
    text = base.replace("  slo:", "  residency: local\n  overflow: big\n  slo:", 1)
    models, problems = load_catalog_text(text)
    assert not problems and models is not None
    assert (models[0].residency, models[0].overflow) == ("local", "big")
    again, _ = load_catalog_text(dump_catalog(models))
    assert again is not None and (again[0].residency, again[0].overflow) == ("local", "big")
    _, problems = load_catalog_text(text.replace("residency: local", "residency: [1]"))
    assert problems and problems[0].path[-1] == "residency"


@pytest.mark.django_db
def test_the_api_stores_them_answers_them_and_refuses_wrong_ones(
    api_for: Any, operator: Any, client_for: Any
) -> None:
    api = api_for(operator)
    assert api.post(URL, gpu_model("big"), format="json").status_code == 201
    r = api.post(URL, gpu_model("chat", residency="abroad"), format="json")
    assert r.status_code == 400 and "residency" in str(r.json())
    r = api.post(URL, gpu_model("chat", overflow="nope", slo={"ttft_p99": "1s"}), format="json")
    assert r.status_code == 400 and "overflow" in str(r.json()) and "nope" in str(r.json())
    assert list(ServedModel.objects.values_list("name", flat=True)) == ["big"]
    r = api.post(URL, gpu_model("chat", residency="local", overflow="big",
                                slo={"ttft_p99": "1s"}), format="json")  # fmt: skip
    assert r.status_code == 201, r.json()
    got = api.get(f"{URL}chat/").json()
    assert (got["residency"], got["overflow"]) == ("local", "big")
    page = client_for(operator).get("/catalog/models/chat/").content.decode()
    assert 'id="residency"><strong>local</strong>' in page and 'href="/catalog/models/big/"' in page
    # The overflow's target is depended on: deleting it is refused, naming why.
    r = api.delete(f"{URL}big/")
    assert r.status_code in (400, 409) and "overflow" in str(r.json())


@pytest.mark.django_db
def test_the_console_form_takes_them_and_refuses_a_wrong_one(
    client_for: Any, operator: Any
) -> None:
    c = client_for(operator)
    r = c.post(ADD, new_model_data(c, residency="abroad"), **HX)
    assert "is not local" in r.content.decode() and not ServedModel.objects.exists()
    r = c.post(ADD, new_model_data(c, overflow="chat", slo_ttft_p99="1s"), **HX)
    assert "cannot overflow to itself" in r.content.decode() and not ServedModel.objects.exists()
    r = c.post(ADD, new_model_data(c, residency="local"), **HX)
    assert r.status_code == 200 and r.get("HX-Redirect"), r.content.decode()[:2000]
    assert ServedModel.objects.get(name="chat").residency == "local"
