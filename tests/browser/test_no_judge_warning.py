"""The dashboard says loudly when no judge of the guard policy answers,
in real Chromium: before, a policy whose judges were gone or down failed open with
nothing on the page."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.models import Replica
from guard import services
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)

WARNING = '[data-role="no-judge-warning"]'


def test_the_dashboard_warns_while_no_policy_judge_answers(
    signed_in: Any, viewer: Any, live_server: Any
) -> None:
    store(cpu_model("chat"), gpu_model("referee", role="guard", guard={"format": "qwen3guard"}))
    services.set_policy({"judge": {"models": ["referee"]}, "fail": "open"}, surface="cli",
                        name="test")  # fmt: skip
    page = signed_in(viewer)
    page.goto(f"{live_server.url}/cluster/")
    warning = page.locator(WARNING)
    warning.wait_for()
    text = warning.inner_text()
    assert "No judge of the guard policy answers" in text
    assert "referee: no ready replica" in text and "fails open" in text
    assert warning.is_visible() and warning.get_attribute("role") == "alert"
    # A ready replica of the judge: the warning goes.
    Replica.objects.create(model_name="referee", state="ready", desired=True,
                           endpoint="http://127.0.0.1:9")  # fmt: skip
    page.goto(f"{live_server.url}/cluster/")
    page.locator("#guard-judges").wait_for()
    assert page.locator(WARNING).count() == 0
    # Fail closed, naming a judge the catalog lacks: said as it is.
    services.set_policy({"judge": {"models": ["qwen3guard-4b"]}, "fail": "closed"},
                        surface="cli", name="test")  # fmt: skip
    page.goto(f"{live_server.url}/cluster/")
    text = page.locator(WARNING).inner_text()
    assert "qwen3guard-4b: not in the catalog" in text and "fails closed" in text
