"""The policy on every surface: the console, the admin, the CLI and the API say the same."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from guard import services
from guard.models import GuardPolicy, PolicyChange

pytestmark = pytest.mark.django_db

# One bad value per key, and the message the policy's rules give for it.
BAD = {
    "fail": ("maybe", 'fail "maybe" is not open or closed'),
    "controversial": ("sometimes", 'judge.controversial "sometimes" is not safe or unsafe'),
}


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("guard", "policy", *args, stdout=out)
    return out.getvalue()


def form_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "judge_models": "qwen3guard-0.6b",
        "controversial": "safe",
        "fail": "open",
        "directions": ["requests", "answers"],
        "categories": "Violent",
    }
    data.update(changes)
    return data


def console_errors(client: Any, **changes: Any) -> str:
    body = client.post("/guard/policy/", form_data(**changes), HTTP_HX_REQUEST="true")
    return html.unescape(body.content.decode())


def admin_errors(client: Any, **changes: Any) -> str:
    if not GuardPolicy.objects.exists():
        GuardPolicy.objects.create(data={"judge": {"models": ["qwen3guard-0.6b"]}})
    pk = GuardPolicy.objects.get().pk
    r = client.post(
        f"/admin/guard/guardpolicy/{pk}/change/", {**form_data(**changes), "_save": "1"}
    )
    return html.unescape(r.content.decode())


def api_errors(api: Any, key: str, value: str) -> str:
    body = {"judge": {"models": ["qwen3guard-0.6b"]}}
    if key == "controversial":
        body["judge"]["controversial"] = value  # type: ignore[index]
    else:
        body[key] = value  # type: ignore[assignment]
    r = api.patch("/api/v1/guard/policy", body, format="json")
    assert r.status_code == 400
    return " ".join(e["message"] for e in r.json()["errors"])


@pytest.mark.parametrize("key", sorted(BAD))
def test_every_surface_refuses_with_the_policys_own_message(
    key: str, client_for: Any, api_for: Any, operator: Any
) -> None:
    value, message = BAD[key]
    assert message in console_errors(client_for(operator), **{key: value})
    assert message in admin_errors(client_for(operator), **{key: value})
    assert message in api_errors(api_for(operator), key, value)
    flag = "--fail" if key == "fail" else "--controversial"
    with pytest.raises(CommandError) as err:
        cli("set", flag, value)
    assert message in str(err.value)
    assert not PolicyChange.objects.exists()


# The CLI


def test_show_prints_the_policy_as_set_reads_it(tmp_path: Path) -> None:
    shown = json.loads(cli("show"))
    assert shown["judge"]["models"] == ["qwen3guard-0.6b"] and shown["fail"] == "open"
    (tmp_path / "p.json").write_text(json.dumps(shown))
    assert cli("set", "--file", str(tmp_path / "p.json")).startswith("policy saved")
    # The same again: nothing to log.
    assert cli("set", "--file", str(tmp_path / "p.json")).startswith("policy unchanged")
    assert PolicyChange.objects.count() == 1


def test_set_by_flags_changes_only_those_keys_and_logs_who() -> None:
    out = cli("set", "--judges", "qwen3guard-4b", "qwen3guard-8b", "--fail", "closed",
              "--directions", "none")  # fmt: skip
    assert out.startswith("policy saved")
    p = services.current_policy()
    assert (p.judge_models, p.fail, p.directions) == (
        ("qwen3guard-4b", "qwen3guard-8b"), "closed", (),
    )  # fmt: skip
    assert p.controversial == "safe" and len(p.refuse_categories) == 9
    change = PolicyChange.objects.get()
    assert change.surface == "cli" and "@" in change.actor_name
    cli("set", "--categories")  # none refuse by category
    assert services.current_policy().refuse_categories == ()


def test_set_from_a_yaml_file_with_flags_on_top(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "judge:\n  models: [qwen3guard-0.6b, llamaguard3-1b]\n  controversial: unsafe\n"
        "fail: closed\ncategories:\n  - Violent\n  - PII\n"
    )
    cli("set", "--file", str(tmp_path / "p.yaml"), "--fail", "open")
    p = services.current_policy()
    assert p.judge_models == ("qwen3guard-0.6b", "llamaguard3-1b")
    # The Llama Guard's names for them are added (guard.policy.complete).
    assert (p.controversial, p.fail) == ("unsafe", "open")
    assert p.refuse_categories == (
        "Violent", "PII", "Violent Crimes", "Indiscriminate Weapons", "Privacy",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "judge:\n  models:\n    - a\n    - a\nfail: shut\n",
            [
                'judge.models[1] (line 4): judge.models[1] "a" repeats judge.models[0]',
                'fail (line 5): fail "shut" is not open or closed',
            ],
        ),
        ("judge: {models: []}\n", ["judge.models (line 1): judge.models is empty"]),
        (
            "fail: open\nfail: closed\n",
            ['"fail" is written twice at the top of the file (lines 1 and 2)'],
        ),
        ("# nothing but a comment\n", ["p.yaml is empty"]),
        ("judge: [\n", ["is not valid YAML: line 2"]),
        ("- a\n", ["a policy is a mapping of keys, not a list"]),
        ("judges: [a]\n", ['judges (line 1): unknown key "judges"']),
    ],
)
def test_a_bad_file_prints_every_problem_with_its_line_and_changes_nothing(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(CommandError) as err:
        cli("set", "--file", str(tmp_path / "p.yaml"))
    said = str(err.value)
    assert "nothing was changed" in said
    for line in expected:
        assert line in said
    assert not PolicyChange.objects.exists() and not GuardPolicy.objects.exists()


def test_set_needs_something_to_set_and_a_readable_file() -> None:
    with pytest.raises(CommandError, match="nothing to set"):
        cli("set")
    with pytest.raises(CommandError, match="cannot read /nonexistent.yaml"):
        cli("set", "--file", "/nonexistent.yaml")


# The admin


def test_admin_edits_the_policy_through_the_same_checks_and_logs_it(
    client_for: Any, operator: Any, viewer: Any
) -> None:
    c = client_for(operator)
    page = c.get("/admin/guard/guardpolicy/add/").content.decode()
    assert 'name="judge_models"' in page and 'name="fail"' in page
    r = c.post(
        "/admin/guard/guardpolicy/add/",
        {**form_data(judge_models="qwen3guard-0.6b\nqwen3guard-4b", fail="closed"), "_save": "1"},
    )
    assert r.status_code == 302, re.findall(
        r'class="errorlist[^"]*">(.*?)</ul>', r.content.decode()
    )
    p = services.current_policy()
    assert p.judge_models == ("qwen3guard-0.6b", "qwen3guard-4b") and p.fail == "closed"
    change = PolicyChange.objects.get()
    assert (change.actor_name, change.surface) == ("otto", "admin")
    pk = GuardPolicy.objects.get().pk
    # Bad: the line is named, nothing changes.
    said = admin_errors(c, judge_models="x\n\n  \ny\nx")
    assert 'line 5: judge.models[2] "x" repeats judge.models[0]' in said
    assert PolicyChange.objects.count() == 1 and services.current_policy() == p
    # One policy: no second row, no deleting.
    assert c.get("/admin/guard/guardpolicy/add/").status_code == 403
    assert c.post(f"/admin/guard/guardpolicy/{pk}/delete/", {"post": "yes"}).status_code == 403
    # A viewer reads and cannot change.
    v = client_for(viewer)
    assert v.get(f"/admin/guard/guardpolicy/{pk}/change/").status_code == 200
    r = v.post(f"/admin/guard/guardpolicy/{pk}/change/", {**form_data(fail="open"), "_save": "1"})
    assert r.status_code == 403 and services.current_policy().fail == "closed"
