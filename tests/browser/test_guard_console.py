"""The Guard console in a real browser: the policy edited, a judge enabled, prompts, evaluations."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from catalog.models import ServedModel
from guard import services
from guard.evalrun import SET_DIR
from guard.judgeprompt import judge_prompt
from guard.models import EvalRun, PolicyChange
from tests.browser.conftest import wait_js
from tests.cluster.helpers import join_node
from tests.guard.helpers import guard_model
from tests.guard.test_client import FAST, launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "nvidia-h100-80gb"
SHOTS = "/tmp/llmgw-guard-{}.png"


@pytest.fixture
def sim_judge() -> Iterator[str]:
    proc, url = launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard", "--context-length", "8192",
        *FAST,
    )  # fmt: skip
    yield url
    stop(proc)


def test_operator_edits_the_policy_and_enables_a_judge_without_reloading(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    join_node("sim-1", [H100] * 2, simulated=True)
    guard_model("qwen3guard-0.6b", "qwen3guard")
    guard_model("llamaguard3-1b", "llamaguard3")
    services.set_policy({"judge": {"models": ["qwen3guard-0.6b"]}}, surface="cli", name="t")
    PolicyChange.objects.all().delete()

    page = signed_in(operator)
    page.goto(f"{live_server.url}/guard/")
    page.evaluate("window.notReloaded = true")

    # A judge named twice and a category twice: the policy's messages at their fields.
    page.fill("#id_judge_models", "llamaguard3-1b\nqwen3guard-0.6b\nllamaguard3-1b")
    page.fill("#id_categories", "Violent\nviolent")
    page.check("input[name=fail][value=closed]")
    page.click("button:text('Save the policy')")
    models_error = page.locator("#guard-policy-err-judge_models")
    models_error.get_by_text("repeats judge.models[0]").wait_for()
    assert "line 3" in models_error.inner_text()
    assert "repeats categories[0]" in page.locator("#guard-policy-err-categories").inner_text()
    assert page.locator("#guard-policy-err-fail").inner_text() == ""
    assert not PolicyChange.objects.exists()
    assert services.current_policy().judge_models == ("qwen3guard-0.6b",)
    page.locator("#guard-policy").screenshot(path=SHOTS.format("policy-error"))

    # Fixed: saved, and the judges' list follows the new order at once.
    page.fill("#id_judge_models", "llamaguard3-1b\nqwen3guard-0.6b")
    page.fill("#id_categories", "Violent\nViolent Crimes")
    page.click("button:text('Save the policy')")
    page.locator("#guard-policy .saved").get_by_text("Saved.").wait_for()
    wait_js(
        page,
        "(() => { const ids = [...document.querySelectorAll('#guard-judge-list article')]"
        ".map(a => a.id); return ids[0] === 'guard-judge-llamaguard3-1b-health'; })()",
        what="llamaguard3-1b first in the judge list",
    )
    policy = services.current_policy()
    assert policy.judge_models == ("llamaguard3-1b", "qwen3guard-0.6b") and policy.fail == "closed"
    # The page's summary and the log of changes follow too.
    page.locator("#guard-summary").get_by_text("closed").wait_for()
    page.locator("#guard-policy-changes").get_by_text(operator.username).wait_for()
    assert PolicyChange.objects.get().actor_name == operator.username
    # A changed controversial is named in the log, with what it was and is.
    page.check("input[name=controversial][value=unsafe]")
    page.click("button:text('Save the policy')")
    page.locator("#guard-policy-changes").get_by_text(
        "judge.controversial: safe → unsafe"
    ).wait_for()
    assert services.current_policy().controversial == "unsafe"

    # Enable a known judge on the sim engine and add it to the policy.
    page.select_option("#guard-enable-judge-name", "qwen3guard-4b")
    page.check("input[name=where][value=sim]")
    page.click("#guard-enable-judge button:text('Enable')")
    page.locator('[data-role="enable-outcome"]').get_by_text(
        "qwen3guard-4b: enabled on the sim engine"
    ).wait_for()
    # The list and the policy form pick it up without a reload.
    page.locator("#guard-judge-qwen3guard-4b-health").wait_for()
    wait_js(
        page,
        "document.querySelector('#id_judge_models').value.includes('qwen3guard-4b')",
        what="the policy form's judges to include qwen3guard-4b",
    )
    # No node runs it in this test: its card says so, rather than "answering".
    page.locator("#guard-judge-qwen3guard-4b-health [data-role=judge-status]").get_by_text(
        "no ready replica"
    ).wait_for()
    assert ServedModel.objects.get(name="qwen3guard-4b").to_spec().profiles[0].engine == "sim"
    assert services.current_policy().judge_models[-1] == "qwen3guard-4b"
    assert page.evaluate("window.notReloaded") is True
    page.screenshot(path=SHOTS.format("page"), full_page=True)


def test_viewer_sees_the_judges_and_cannot_act(
    signed_in: Any, viewer: Any, live_server: Any
) -> None:
    guard_model("qwen3guard-0.6b", "qwen3guard")
    page = signed_in(viewer)
    page.goto(f"{live_server.url}/guard/")
    page.locator("#guard-judge-qwen3guard-0-6b-health").wait_for()
    assert page.locator("text=Save the policy").count() == 0
    assert page.locator("#guard-enable-judge button").count() == 0
    assert "qwen3guard-0.6b" in page.locator('[data-role="policy"]').inner_text()
    # Even a hand-made request from the page is refused.
    status = page.evaluate(
        """async () => {
            const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
            const r = await fetch('/guard/enable/', {method: 'POST', headers: {'X-CSRFToken': token,
              'Content-Type': 'application/x-www-form-urlencoded'},
              body: 'name=qwen3guard-4b&where=cpu'});
            return r.status;
        }"""
    )
    assert status == 403
    assert not ServedModel.objects.filter(name="qwen3guard-4b").exists()


def test_judge_page_prompt_and_an_evaluation_with_its_chart(
    signed_in: Any, operator: Any, live_server: Any, sim_judge: str
) -> None:
    guard_model("qwen3guard-0.6b", "qwen3guard", sim_judge)
    call_command(
        "guard", "eval", "--judges", "qwen3guard-0.6b", stdout=io.StringIO(), stderr=io.StringIO()
    )
    record = EvalRun.objects.get()

    page = signed_in(operator)
    page.goto(f"{live_server.url}/guard/judges/qwen3guard-0.6b/")
    page.fill("#prompt-request", "continue the code above")
    page.fill("#prompt-answer", "")
    page.click("button:text('Show the prompt')")
    wait_js(
        page,
        "document.querySelector('[data-role=prompt]').textContent"
        ".includes('USER: continue the code above')",
        what="the judge's prompt shown",
    )
    shown = page.locator('[data-role="prompt"]').text_content()
    assert shown == judge_prompt("qwen3guard-0.6b", "continue the code above")
    assert page.locator('[data-role="judge-evals"]').count() == 1

    page.goto(f"{live_server.url}/guard/evals/{record.pk}/")
    # Where its set came from, by name: no path of the machine's.
    lead = page.inner_text(".lead")
    assert "texts from the packaged set coding-ops" in lead, lead
    assert str(SET_DIR) not in page.content()
    chart = page.locator('[data-role="score-chart"]')
    chart.wait_for()
    answered = record.results.exclude(verdict="").count()
    assert chart.locator("circle").count() == answered and answered >= 80
    summary = page.locator('tr[data-judge="qwen3guard-0.6b"]').inner_text()
    # The sim flags only texts holding its marker: the packaged set has none.
    assert "0.0%" in summary
    page.screenshot(path=SHOTS.format("eval"), full_page=True)
