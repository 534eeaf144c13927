"""The guard's console: the Guard page, fragments, enabling a judge, a judge's page, roles."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from catalog.models import ServedModel
from cluster.models import Replica
from guard import live, services
from guard.models import JudgeDecision, JudgeHealth, JudgeProbe, JudgeSample, PolicyChange
from tests.cluster.helpers import join_node
from tests.guard.helpers import guard_model

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def judges(db: Any) -> None:
    guard_model("qwen3guard-0.6b", endpoint="http://127.0.0.1:9")
    guard_model("llamaguard3-1b", "llamaguard3")
    services.set_policy(
        {"judge": {"models": ["llamaguard3-1b", "qwen3guard-0.6b"]}}, surface="cli", name="t"
    )
    PolicyChange.objects.all().delete()


def ids_in_order(page: str, prefix: str) -> list[str]:
    return re.findall(rf'id="({prefix}[^"]*)"', page)


# The Guard page


def test_guard_page_lists_judges_in_policy_order_with_health(
    client_for: Any, viewer: Any, judges: None
) -> None:
    now = timezone.now()
    JudgeHealth.objects.create(
        judge="qwen3guard-0.6b", answers=7, failures=2, last_good_at=now, last_latency_ms=12.5,
        last_error="refused", last_error_kind="timeout", last_error_at=now - timedelta(minutes=5),
    )  # fmt: skip
    JudgeDecision.objects.create(judge="qwen3guard-0.6b", verdict="safe", category="", count=5)
    JudgeDecision.objects.create(
        judge="qwen3guard-0.6b", verdict="unsafe", category="Violent", count=2
    )
    page = client_for(viewer).get("/guard/").content.decode()
    assert ids_in_order(page, "guard-judge-")[:2] == [
        "guard-judge-list",
        "guard-judge-llamaguard3-1b-health",
    ]
    assert page.index("guard-judge-llamaguard3-1b-health") < page.index(
        "guard-judge-qwen3guard-0-6b-health"
    )
    block = page[page.index('id="guard-judge-qwen3guard-0-6b-health"') :]
    block = block[: block.index("</article>")]
    assert "answering" in block and "12.5 ms" in block and "7 / 2" in block
    assert "safe 5" in block and "unsafe 2" in block and "1 ready" in block
    llama = page[page.index('id="guard-judge-llamaguard3-1b-health"') :]
    assert "no ready replica" in llama[: llama.index("</article>")]


def test_viewer_sees_everything_and_no_button(client_for: Any, viewer: Any, judges: None) -> None:
    page = client_for(viewer).get("/guard/").content.decode()
    assert 'data-role="policy"' in page and "llamaguard3-1b" in page
    assert 'id="guard-enable-judge"' in page and "qwen3guard-8b" in page
    for absent in ("Save the policy", ">Enable</button>", "hx-post"):
        assert absent not in page


def test_operator_sees_the_forms(client_for: Any, operator: Any, judges: None) -> None:
    page = client_for(operator).get("/guard/").content.decode()
    assert "Save the policy" in page and ">Enable</button>" in page
    assert "llamaguard3-1b\nqwen3guard-0.6b" in page  # the judges' textarea, in order
    assert "{% csrf_token %}" not in page and "csrfmiddlewaretoken" not in page.split("<main")[1]


@pytest.mark.parametrize(
    ("method", "url"),
    [("post", "/guard/policy/"), ("post", "/guard/enable/")],
)
def test_viewer_posts_are_refused_and_change_nothing(
    client_for: Any, viewer: Any, judges: None, method: str, url: str
) -> None:
    before = services.current_policy()
    r = getattr(client_for(viewer), method)(
        url, {"judge_models": "x", "fail": "closed", "name": "qwen3guard-4b", "where": "cpu"}, **HX
    )
    assert r.status_code == 403
    assert services.current_policy() == before and not PolicyChange.objects.exists()
    assert not ServedModel.objects.filter(name="qwen3guard-4b").exists()


def test_signed_out_and_roleless_are_kept_out(client: Any, client_for: Any, outsider: Any) -> None:
    r = client.get("/guard/")
    assert r.status_code == 302 and "/login/" in r["Location"]
    assert client_for(outsider).get("/guard/").status_code == 403
    assert client_for(outsider).get("/guard/judges/x/").status_code == 403


# The policy form


def post_policy(c: Any, **fields: str) -> Any:
    data = {
        "judge_models": "llamaguard3-1b\nqwen3guard-0.6b",
        "controversial": "safe",
        "fail": "open",
        "directions": ["requests", "answers"],
        "categories": "Violent\nPII",
    }
    data.update(fields)
    return c.post("/guard/policy/", data, **HX)


def test_a_bad_policy_shows_the_policys_messages_at_the_fields(
    client_for: Any, operator: Any, judges: None
) -> None:
    before = services.current_policy()
    r = post_policy(
        client_for(operator),
        judge_models="qwen3guard-0.6b\n\nqwen3guard-0.6b",
        fail="maybe",
        controversial="sometimes",
        directions=["requests", "sideways"],
        categories="PII\npii",
    )
    assert r.status_code == 200
    body = r.content.decode()
    assert "<html" not in body and 'id="guard-policy"' in body

    def errors(field: str) -> str:
        found = re.search(rf'id="guard-policy-err-{field}">(.*?)</div>', body, re.S)
        assert found, field
        return html.unescape(found.group(1))

    assert 'line 3: judge.models[1] "qwen3guard-0.6b" repeats judge.models[0]' in errors(
        "judge_models"
    )
    assert 'fail "maybe" is not open or closed' in errors("fail")
    assert 'judge.controversial "sometimes" is not safe or unsafe' in errors("controversial")
    assert 'direction "sideways" is not one of requests, answers' in errors("directions")
    assert 'line 2: categories[1] "pii" repeats categories[0]' in errors("categories")
    assert "Not saved" in body
    assert services.current_policy() == before and not PolicyChange.objects.exists()
    assert "HX-Trigger" not in r


def test_an_empty_judge_list_is_refused(client_for: Any, operator: Any, judges: None) -> None:
    body = post_policy(client_for(operator), judge_models="  \n").content.decode()
    assert "judge.models is empty: name at least one judge" in html.unescape(body)
    assert not PolicyChange.objects.exists()


def test_a_good_policy_is_saved_logged_and_announced(
    client_for: Any, operator: Any, judges: None
) -> None:
    r = post_policy(
        client_for(operator),
        judge_models="qwen3guard-0.6b\nllamaguard3-1b",
        fail="closed",
        controversial="unsafe",
        directions=["requests"],
    )
    assert r.status_code == 200 and "Saved." in r.content.decode()
    assert "guard-policy-changed" in r["HX-Trigger"]
    p = services.current_policy()
    assert p.judge_models == ("qwen3guard-0.6b", "llamaguard3-1b")
    assert (p.fail, p.controversial, p.directions) == ("closed", "unsafe", ("requests",))
    # The Llama Guard's names for them are added, so its verdicts refuse too.
    assert p.refuse_categories == (
        "Violent", "PII", "Violent Crimes", "Indiscriminate Weapons", "Privacy",
    )  # fmt: skip
    assert "categories: added &quot;Violent Crimes&quot;" in r.content.decode()
    change = PolicyChange.objects.get()
    assert (change.actor_name, change.surface) == ("otto", "console")
    assert change.after["fail"] == "closed" and change.before["fail"] == "open"
    # The list, refreshed after the event, follows the new order.
    listed = client_for(operator).get("/guard/judges/", **HX).content.decode()
    assert listed.index("qwen3guard-0-6b-health") < listed.index("llamaguard3-1b-health")
    # Saving the same again changes nothing and logs nothing.
    r = post_policy(
        client_for(operator),
        judge_models="qwen3guard-0.6b\nllamaguard3-1b",
        fail="closed",
        controversial="unsafe",
        directions=["requests"],
    )
    assert "Nothing changed." in r.content.decode() and PolicyChange.objects.count() == 1


# Enabling a known judge


def enable(c: Any, name: str, where: str, add: bool = True) -> Any:
    data = {"name": name, "where": where}
    if add:
        data["add_to_policy"] = "on"
    return c.post("/guard/enable/", data, **HX)


def outcome(r: Any) -> str:
    found = re.search(r'data-role="enable-outcome">(.*?)</div>', r.content.decode(), re.S)
    assert found, r.content.decode()
    return html.unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


def test_enable_a_known_judge_on_the_sim_engine_and_add_it(
    client_for: Any, operator: Any, judges: None
) -> None:
    join_node("sim-1", [H100] * 2, simulated=True)
    c = client_for(operator)
    r = enable(c, "qwen3guard-4b", "sim")
    assert r.status_code == 200 and "guard-judge-enabled" in r["HX-Trigger"]
    said = outcome(r)
    assert "qwen3guard-4b: enabled on the sim engine" in said
    assert "added to the policy's judges as #3" in said
    assert "<html" not in r.content.decode() and 'id="guard-enable-judge"' in r.content.decode()
    m = ServedModel.objects.get(name="qwen3guard-4b").to_spec()
    assert m.role == "guard" and m.profiles[0].engine == "sim"
    assert services.current_policy().judge_models[-1] == "qwen3guard-4b"
    assert PolicyChange.objects.get().actor_name == "otto"
    # Again: nothing changes.
    again = outcome(enable(c, "qwen3guard-4b", "sim"))
    assert "already enabled as asked" in again and "added" not in again
    assert PolicyChange.objects.count() == 1


def test_enable_on_cpus_without_adding_to_the_policy(
    client_for: Any, operator: Any, judges: None
) -> None:
    join_node("cpu-1", [], cpu_cores=16)
    said = outcome(enable(client_for(operator), "llamaguard3-8b", "cpu", add=False))
    assert "llamaguard3-8b: enabled on CPUs (llama.cpp, 8 cores reserved)" in said
    assert "llamaguard3-8b" not in services.current_policy().judge_models


def test_enable_refusals_say_why_and_change_nothing(
    client_for: Any, operator: Any, judges: None
) -> None:
    c = client_for(operator)
    r = enable(c, "nonesuch", "cpu")
    body = html.unescape(r.content.decode())
    assert r.status_code == 200 and 'no known judge "nonesuch"' in body and "HX-Trigger" not in r
    r = enable(c, "qwen3guard-4b", "sideways")
    assert '"sideways" is not one of cpu, gpu, sim' in html.unescape(r.content.decode())
    # No node reports a GPU class.
    said = outcome(enable(c, "qwen3guard-4b", "gpu"))
    assert "report no GPU class" in said
    assert not ServedModel.objects.filter(name="qwen3guard-4b").exists()
    assert not PolicyChange.objects.exists()


def test_the_enable_fragment_stands_alone(client_for: Any, viewer: Any, operator: Any) -> None:
    r = client_for(viewer).get("/guard/enable/", **HX)
    body = r.content.decode()
    assert r.status_code == 200 and body.lstrip().startswith("{#") is False
    assert 'id="guard-enable-judge"' in body and "<html" not in body and "<form" not in body
    body = client_for(operator).get("/guard/enable/", **HX).content.decode()
    assert 'hx-post="/guard/enable/"' in body and 'hx-target="#guard-enable-judge"' in body
    assert "csrfmiddlewaretoken" not in body


# Fragments for the live view


def test_health_rows_need_no_request_and_a_fixed_number_of_queries(
    judges: None, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as two:
        live.judge_health_rows()
    for i in range(5):
        guard_model(f"extra-{i}")
        JudgeHealth.objects.create(judge=f"extra-{i}", answers=i)
        Replica.objects.create(model_name=f"extra-{i}", state="pending", profile="sim")
    with django_assert_max_num_queries(len(two)):
        rows = live.judge_health_rows()
    assert [r.name for r in rows][:2] == ["llamaguard3-1b", "qwen3guard-0.6b"]
    assert len(rows) == 7 and rows[0].position == 1 and rows[2].position is None
    assert live.judge_health_row("nonesuch") is None
    row = live.judge_health_row("qwen3guard-0.6b")
    assert row is not None and row.dom_id == "guard-judge-qwen3guard-0-6b-health"
    from django.template.loader import render_to_string

    fragment = render_to_string("guard/partials/judge_health.html", {"row": row})
    assert fragment.strip().startswith('<article id="guard-judge-qwen3guard-0-6b-health"')


def test_judge_slug_keeps_letters_digits_and_dashes() -> None:
    assert live.judge_slug("qwen3guard-0.6b") == "qwen3guard-0-6b"
    assert live.judge_slug("org/Llama_Guard 3") == "org-Llama-Guard-3"
    assert live.judge_slug("///") == "judge"


def test_health_fragment_by_url(client_for: Any, viewer: Any, judges: None) -> None:
    r = client_for(viewer).get("/guard/judges/qwen3guard-0.6b/health/", **HX)
    assert r.status_code == 200 and "<html" not in r.content.decode()
    assert r.content.decode().strip().startswith('<article id="guard-judge-qwen3guard-0-6b-health"')
    assert client_for(viewer).get("/guard/judges/nonesuch/health/").status_code == 404


# A judge's page


def test_judge_page_shows_its_facts_health_and_decisions(
    client_for: Any, viewer: Any, judges: None
) -> None:
    JudgeDecision.objects.create(
        judge="qwen3guard-0.6b", verdict="unsafe", category="Violent", count=3
    )
    page = client_for(viewer).get("/guard/judges/qwen3guard-0.6b/").content.decode()
    facts = page[page.index('data-role="judge-facts"') :]
    assert "sim/qwen3guard-0.6b" in facts and "qwen3guard" in facts and "32768 tokens" in facts
    assert 'id="guard-judge-qwen3guard-0-6b-health"' in page
    assert "judge #2 of the policy" in page
    assert re.search(r"unsafe</td><td>Violent</td><td class=\"num\">3</td>", page)
    assert 'data-role="chart-empty"' in page  # no probe yet


def test_judge_page_prompt_is_what_guard_prompt_prints(
    client_for: Any, viewer: Any, judges: None, tmp_path: Path, capsys: Any
) -> None:
    request = "how do I kill all child processes in bash <|im_end|>"
    answer = "Use pkill -P $$."
    (tmp_path / "r.txt").write_text(request)
    (tmp_path / "a.txt").write_text(answer)
    for judge in ("qwen3guard-0.6b", "llamaguard3-1b", "shieldgemma-known"):
        if judge == "shieldgemma-known":
            guard_model(judge, "shieldgemma")
        call_command(
            "guard", "prompt", "--judge", judge,
            "--request-file", str(tmp_path / "r.txt"), "--answer-file", str(tmp_path / "a.txt"),
        )  # fmt: skip
        printed = capsys.readouterr().out
        c = client_for(viewer)
        raw = c.get(f"/guard/judges/{judge}/prompt.txt", {"request": request, "answer": answer})
        assert raw.status_code == 200 and raw.content == printed.encode("utf-8")
        fragment = c.get(
            f"/guard/judges/{judge}/prompt/", {"request": request, "answer": answer}, **HX
        ).content.decode()
        shown = re.search(r'<pre class="prompt" data-role="prompt">\n(.*?)</pre>', fragment, re.S)
        assert shown and html.unescape(shown.group(1)) == printed
        assert f"{len(printed.encode())} bytes" in fragment


def test_judge_page_prompt_of_a_request_alone_and_of_a_known_judge_not_in_the_catalog(
    client_for: Any, viewer: Any, db: Any
) -> None:
    # The baseline policy names qwen3guard-0.6b; the catalog is empty.
    c = client_for(viewer)
    page = c.get("/guard/judges/qwen3guard-0.6b/").content.decode()
    assert "not in the catalog" in page and "32768 tokens" in page
    body = c.get("/guard/judges/qwen3guard-0.6b/prompt/", {"request": "continue"}, **HX)
    assert "USER: continue\n\n&lt;END CONVERSATION&gt;" in body.content.decode()
    long = c.get("/guard/judges/qwen3guard-0.6b/prompt.txt", {"request": "x" * 7000})
    assert long.status_code == 400 and b"guard prompt" in long.content


def test_probes_become_a_chart_of_latency_and_verdicts(
    client_for: Any, viewer: Any, judges: None
) -> None:
    start = timezone.now() - timedelta(minutes=10)
    probe = JudgeProbe(judge="qwen3guard-0.6b")
    for i in range(4):
        if i == 2:
            JudgeDecision.objects.update_or_create(
                judge="qwen3guard-0.6b", verdict="safe", category="", defaults={"count": 6}
            )
        probe.at = start + timedelta(minutes=i)
        probe.ok = i != 1
        probe.latency_ms = None if i == 1 else 10.0 * (i + 1)
        probe.ordinary_verdict, probe.harmful_verdict = ("safe", "unsafe") if probe.ok else ("", "")
        probe.error = "" if probe.ok else "timeout: no answer"
        probe.save()
    samples = list(JudgeSample.objects.filter(judge="qwen3guard-0.6b").order_by("at"))
    assert [s.ok for s in samples] == [True, False, True, True]
    assert [s.safe for s in samples] == [0, 0, 6, 6]
    page = client_for(viewer).get("/guard/judges/qwen3guard-0.6b/").content.decode()
    svg = page[page.index('data-role="timeline"') : page.index("</svg>")]
    assert svg.count('class="latency-dot"') == 3 and svg.count('class="failed-mark"') == 1
    assert svg.count('class="bar-safe"') == 1 and "6 safe" in svg
    assert "4 probes" in page
