"""An operator's first hour: a Llama Guard added in the policy's form refuses what it finds.

A real Chromium against a real ``manage.py serve`` (the reconciler in-process every
second) and an agent with simulated cards. Two sim judges are enabled as ``guard judge
enable NAME --sim`` enables them: the baseline's Qwen3Guard and a Llama Guard 3 1B, each
a sim engine speaking its format. The policy names the Qwen3Guard and Qwen3Guard's
categories. The operator adds the Llama Guard in the Guard page's form, first in the
order, and saves; a text that judge marks unsafe ("Violent Crimes", a name the policy's
Qwen3Guard categories did not hold) is then refused by ``/api/v1/guard/check``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from catalog.services import Actor
from cluster.models import Node, Replica
from guard import services
from guard.formats import QWEN3GUARD_CATEGORIES
from llmgw_core.models import ApiToken
from tests.e2e.conftest import Agent, ControlPlane, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

H100 = "nvidia-h100-80gb"
QWEN = "qwen3guard-0.6b"
LLAMA = "llamaguard3-1b"
UNSAFE_TEXT = "how to hurt someone UNSAFE-MARKER"  # the sim judges' unsafe marker


def test_a_llama_guard_added_in_the_form_has_its_unsafe_verdict_refused(
    console: Callable[..., Any],
    agents: Callable[..., Agent],
    control_plane: ControlPlane,
    operator: Any,
) -> None:
    agents("pf-1", "--simulate", f"2x {H100}")
    wait_for(lambda: Node.objects.filter(name="pf-1", health="ready").exists(), 30, "the node")
    actor = Actor(user=operator, surface="cli", name="test")
    for name in (QWEN, LLAMA):
        services.enable_judge(name, gpu=False, sim=True, actor=actor)
    services.set_policy(
        {"judge": {"models": [QWEN]}, "fail": "closed", "categories": list(QWEN3GUARD_CATEGORIES)},
        surface="cli",
        name="test",
    )
    for name in (QWEN, LLAMA):
        wait_for(
            lambda n=name: Replica.objects.filter(model_name=n, state="ready").exists(),
            90,
            f"a ready replica of {name}",
        )
    _, secret = ApiToken.issue(operator, "first hour")
    api = httpx.Client(base_url=control_plane.url, headers={"Authorization": f"Bearer {secret}"})

    def check() -> dict[str, Any]:
        r = api.post("/api/v1/guard/check", json={"request": UNSAFE_TEXT})
        assert r.status_code == 200, r.text
        return dict(r.json())

    # Before: the Qwen3Guard decides, in its own names.
    before = wait_for(lambda: (b := check())["judge"] == QWEN and b, 30, "the Qwen3Guard's verdict")
    assert before["decision"] == "refuse"

    # The operator adds the Llama Guard, first, in the Guard page's form.
    page = console(operator, "/guard/")
    models = page.locator("#id_judge_models")
    assert models.input_value() == QWEN
    models.fill(f"{LLAMA}\n{QWEN}")
    page.click("button:text('Save the policy')")
    page.locator("#guard-policy .saved").get_by_text("Saved.").wait_for()
    # The Llama Guard decides now (the web process sees the saved policy at once), and its
    # unsafe verdict in a Llama Guard name is refused.
    after = wait_for(
        lambda: (a := check())["judge"] == LLAMA and a, 30, "the Llama Guard's verdict"
    )
    assert (after["verdict"], after["categories"]) == ("unsafe", ["Violent Crimes"]), after
    assert after["decision"] == "refuse", after
    # The page says what saving did to the categories: the Llama Guard's names were added.
    notes = page.locator("#guard-policy-notes").inner_text()
    assert 'added "Violent Crimes", "Indiscriminate Weapons"' in notes, notes
    categories = page.locator("#id_categories").input_value().splitlines()
    assert {"Violent", "Violent Crimes", "Privacy"} <= set(categories), categories

    safe = api.post("/api/v1/guard/check", json={"request": "how do I list files"}).json()
    assert (safe["judge"], safe["decision"]) == (LLAMA, "allow"), safe
    api.close()
