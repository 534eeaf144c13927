"""POST /api/v1/guard/judges/enable: the console's "enable a judge" for scripts."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.models import ChangeRecord, ServedModel
from guard import services
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

URL = "/api/v1/guard/judges/enable"


def test_operator_enables_a_sim_judge_once_and_adds_it_to_the_policy(
    api_for: Any, operator: Any
) -> None:
    join_node("sim-1", ["nvidia-l4-24gb"] * 2, simulated=True)
    api = api_for(operator)
    r = api.post(
        URL, {"name": "llamaguard3-1b", "where": "sim", "add_to_policy": True}, format="json"
    )
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["judge"] == "llamaguard3-1b" and body["changed"] is True
    assert body["policy"][-1] == "llamaguard3-1b"
    m = ServedModel.objects.get(name="llamaguard3-1b").to_spec()
    assert m.role == "guard" and m.profiles[0].engine == "sim"
    assert "llamaguard3-1b" in services.current_policy().judge_models
    record = ChangeRecord.objects.get(model_name="llamaguard3-1b")
    assert (record.surface, record.actor_name) == ("api", "otto")

    again = api.post(URL, {"name": "llamaguard3-1b", "where": "sim"}, format="json")
    assert again.status_code == 200 and again.json()["changed"] is False
    assert ChangeRecord.objects.filter(model_name="llamaguard3-1b").count() == 1


def test_a_viewer_cannot_enable(api_for: Any, viewer: Any) -> None:
    r = api_for(viewer).post(URL, {"name": "qwen3guard-4b"}, format="json")
    assert r.status_code == 403
    assert not ServedModel.objects.filter(name="qwen3guard-4b").exists()


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"name": "llamaguard9"}, "name", 'no known judge "llamaguard9"'),
        ({"name": "qwen3guard-4b", "where": "tpu"}, "where", '"tpu" is not one of cpu, gpu, sim'),
        ({"name": "qwen3guard-4b", "gpus": 2}, "gpus", 'unknown key "gpus"'),
        ({"name": 4}, "name", "must be a known judge's name"),
        ({"name": "qwen3guard-4b", "add_to_policy": "yes"}, "add_to_policy", "true or false"),
        # No node reports a GPU class: the roomiest class cannot be chosen.
        ({"name": "qwen3guard-4b", "where": "gpu"}, "where", "GPU class"),
    ],
)
def test_bad_requests_say_where_and_change_nothing(
    api_for: Any, operator: Any, body: dict, field: str, words: str
) -> None:
    r = api_for(operator).post(URL, body, format="json")
    assert r.status_code == 400, r.json()
    errors = r.json()["errors"]
    assert any(e["field"] == field and words in e["message"] for e in errors), errors
    assert not ServedModel.objects.filter(role="guard").exists()
    assert not ChangeRecord.objects.exists()


def test_a_body_that_is_not_an_object_is_refused(api_for: Any, operator: Any) -> None:
    r = api_for(operator).post(URL, ["qwen3guard-4b"], format="json")
    assert r.status_code == 400
    assert r.json()["errors"][0]["message"] == "the body must be a JSON object"
