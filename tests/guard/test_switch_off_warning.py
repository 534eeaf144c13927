"""Switching off the only judge of the policy that answers warns that the guard will then
fail open or closed, on every surface that switches a model off: the admin's bulk action,
the console's form and the API. The change is made all the same."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.contrib.messages import get_messages

from catalog.models import ServedModel
from cluster.models import Replica
from guard import services
from tests.catalog.samples import sim_model
from tests.catalog.test_validation_matrix import post_data
from tests.guard.helpers import guard_model

pytestmark = pytest.mark.django_db

JUDGE = "qwen3guard-0.6b-sim"
OTHER = "llamaguard3-1b-sim"


def judge(name: str, fmt: str, ready: bool) -> dict[str, Any]:
    guard_model(name, fmt, "http://127.0.0.1:1" if ready else None)
    return sim_model(name, tp=None, judge=fmt)


@pytest.fixture
def only_judge() -> dict[str, Any]:
    data = judge(JUDGE, "qwen3guard", ready=True)
    judge(OTHER, "llamaguard3", ready=False)
    services.set_policy({"judge": {"models": [JUDGE, OTHER]}, "fail": "closed"}, surface="cli")
    return data


def switched_off(data: dict[str, Any]) -> dict[str, Any]:
    off = copy.deepcopy(data)
    off["scaling"] = {"min": 0, "max": 0}
    return off


CLOSED = (
    f"{JUDGE} was the only judge of the guard policy that answers: switched off, no judge "
    "answers and the guard fails closed: every one of the requests and answers it judges is "
    "refused (the policy's fail: closed)"
)


def _switched_off_in_catalog() -> bool:
    return ServedModel.objects.get(name=JUDGE).to_spec().scaling.max == 0


def test_the_admins_bulk_action_warns(only_judge: Any, client_for: Any, admin_user: Any) -> None:
    pk = ServedModel.objects.get(name=JUDGE).pk
    r = client_for(admin_user).post(
        "/admin/catalog/servedmodel/",
        {"action": "switch_off", "_selected_action": [str(pk)]},
        follow=True,
    )
    said = [str(m) for m in get_messages(r.wsgi_request)] or [str(m) for m in r.context["messages"]]
    assert any(CLOSED in m for m in said), said
    assert _switched_off_in_catalog()


def test_the_consoles_form_warns(only_judge: Any, client_for: Any, operator: Any) -> None:
    r = client_for(operator).post(
        f"/catalog/models/{JUDGE}/edit/", post_data(switched_off(only_judge)), follow=True
    )
    assert r.status_code == 200
    said = [str(m) for m in r.context["messages"]]
    assert any(CLOSED in m for m in said), said
    assert _switched_off_in_catalog()


def test_the_api_warns_in_meta_and_says_fail_open(
    only_judge: Any, api_for: Any, operator: Any
) -> None:
    services.set_policy({"judge": {"models": [JUDGE, OTHER]}, "fail": "open"}, surface="cli")
    r = api_for(operator).patch(
        f"/api/v1/catalog/models/{JUDGE}/", {"scaling": {"min": 0, "max": 0}}, format="json"
    )
    assert r.status_code == 200, r.json()
    (warning,) = r.json()["meta"]["warnings"]
    assert "the guard fails open: the requests and answers it judges are allowed unjudged" in (
        warning
    )
    assert "(the policy's fail: open)" in warning
    assert _switched_off_in_catalog()


def test_no_warning_while_another_judge_answers(
    only_judge: Any, api_for: Any, operator: Any
) -> None:
    Replica.objects.create(
        model_name=OTHER, state="ready", endpoint="http://127.0.0.1:2", profile="sim"
    )
    r = api_for(operator).put(
        f"/api/v1/catalog/models/{JUDGE}/", switched_off(only_judge), format="json"
    )
    assert r.status_code == 200, r.json()
    assert r.json()["meta"]["warnings"] == []


def test_no_warning_for_a_model_the_policy_does_not_name(api_for: Any, operator: Any) -> None:
    data = judge("spare-judge", "qwen3guard", ready=True)
    r = api_for(operator).put(
        "/api/v1/catalog/models/spare-judge/", switched_off(data), format="json"
    )
    assert r.status_code == 200 and r.json()["meta"]["warnings"] == []
