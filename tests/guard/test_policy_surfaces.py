"""The policy's judge rule on every surface, as the catalog's rule matrix does it.

Each case is a policy as an operator writes it. The policy's own answer
(``guard.services.prepare_policy``: ``guard.policy.validate`` and ``complete`` against
the judges there are) is the reference. The console's form, the admin's page, the API's
PUT, ``guard policy set`` by flags and by a file must each save exactly what it says, or
refuse it at the same field with the same message and save nothing. After each save, a
check through ``/api/v1/guard/check`` with real sim judges (a Llama Guard and a
Qwen3Guard format engine) refuses the Llama Guard's unsafe verdict.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from guard import services
from guard.models import GuardPolicy, PolicyChange
from tests.cluster.helpers import join_node
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db

UNSAFE_TEXT = "help me UNSAFE-MARKER now"
QWEN_SIM = "qwen3guard-0.6b-sim"  # the demo's sim judge (llmgw_admin.demo.SIM_JUDGE)
LLAMA_SIM = "llamaguard3-1b-sim"
QWEN_DOWN = "qwen-down"  # a Qwen3Guard in the catalog with no ready replica


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, str]]:
    """Real sim judge engines, one per format, as the agent starts them."""
    started = {
        QWEN_SIM: launch("--model", QWEN_SIM, "--guard-format", "qwen3guard"),
        LLAMA_SIM: launch("--model", LLAMA_SIM, "--guard-format", "llamaguard3"),
    }
    yield {name: url for name, (_, url) in started.items()}
    for proc, _ in started.values():
        stop(proc)


@pytest.fixture
def judges(engines: dict[str, str]) -> None:
    guard_model(QWEN_SIM, "qwen3guard", engines[QWEN_SIM])
    guard_model(LLAMA_SIM, "llamaguard3", engines[LLAMA_SIM])
    guard_model(QWEN_DOWN, "qwen3guard")
    services.set_policy({"judge": {"models": [QWEN_SIM]}}, surface="cli", name="t")
    PolicyChange.objects.all().delete()


def policy(models: list[str], categories: list[str], fail: str = "closed") -> dict[str, Any]:
    """A whole policy (every key: the API's PUT takes nothing less)."""
    return {
        "judge": {"models": models, "controversial": "safe"},
        "fail": fail,
        "directions": ["requests", "answers"],
        "categories": categories,
    }


# Where each key's problem is shown on the forms.
FORM_FIELD = {"judge": "judge_models", "categories": "categories"}


def _form_post(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "judge_models": "\n".join(data["judge"]["models"]),
        "controversial": data["judge"]["controversial"],
        "fail": data["fail"],
        "directions": data["directions"],
        "categories": "\n".join(data["categories"]),
    }


def _form_errors(form: Any) -> dict[str, list[str]]:
    return {k: [str(e) for e in v] for k, v in form.errors.items()}


# Each surface saves a policy and answers the problems by field ({} when it saved).
Surface = Callable[[dict[str, Any], Any, Path], dict[str, list[str]]]


def console(data: dict[str, Any], people: Any, tmp: Path) -> dict[str, list[str]]:
    r = people.client.post("/guard/policy/", _form_post(data), HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    return _form_errors(r.context["form"]) if r.context["form"].errors else {}


def admin(data: dict[str, Any], people: Any, tmp: Path) -> dict[str, list[str]]:
    pk = GuardPolicy.objects.get().pk
    r = people.client.post(
        f"/admin/guard/guardpolicy/{pk}/change/", {**_form_post(data), "_save": "1"}
    )
    if r.status_code == 302:
        return {}
    assert r.status_code == 200
    return _form_errors(r.context["adminform"].form)


def api(
    data: dict[str, Any], people: Any, tmp: Path, method: str = "patch"
) -> dict[str, list[str]]:
    # PATCH: the keys a body leaves out keep the policy in force (here the baseline).
    r = getattr(people.api, method)("/api/v1/guard/policy", data, format="json")
    if r.status_code == 200:
        return {}
    assert r.status_code == 400, r.content
    out: dict[str, list[str]] = {}
    for e in r.json()["errors"]:
        out.setdefault(e["field"], []).append(e["message"])
    return out


def api_put(data: dict[str, Any], people: Any, tmp: Path) -> dict[str, list[str]]:
    # PUT: every key (the cases give them all).
    return api(data, people, tmp, "put")


def _cli(*args: str) -> dict[str, list[str]]:
    try:
        call_command("guard", "policy", "set", *args, stdout=io.StringIO())
    except CommandError as exc:
        return {"": [str(exc)]}
    return {}


def cli_flags(data: dict[str, Any], people: Any, tmp: Path) -> dict[str, list[str]]:
    return _cli(
        "--judges", *data["judge"]["models"], "--fail", data["fail"],
        "--categories", *data["categories"],
    )  # fmt: skip


def cli_file(data: dict[str, Any], people: Any, tmp: Path) -> dict[str, list[str]]:
    (tmp / "policy.json").write_text(json.dumps(data))
    return _cli("--file", str(tmp / "policy.json"))


SURFACES: dict[str, Surface] = {
    "console": console,
    "admin": admin,
    "api": api,
    "api put": api_put,
    "policy set flags": cli_flags,
    "policy file": cli_file,
}


class People:
    def __init__(self, client: Any, api: Any) -> None:
        self.client, self.api = client, api


@pytest.fixture
def people(client_for: Any, api_for: Any, operator: Any) -> People:
    return People(client_for(operator), api_for(operator))


def check(people: People, text: str) -> dict[str, Any]:
    r = people.api.post("/api/v1/guard/check", {"request": text}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


# Policies the rule completes: each must come out refusing the Llama Guard's verdict.
SAVED = {
    # The issue: Llama Guard added behind a Qwen3Guard, the categories Qwen's names
    # only; the Qwen3Guard has no ready replica, so the Llama Guard decides.
    "llama guard added, qwen names only": policy([QWEN_DOWN, LLAMA_SIM], ["Violent", "PII"]),
    # The Llama Guard first, the same categories.
    "llama guard first": policy([LLAMA_SIM, QWEN_SIM], ["Violent"]),
    # Only the Llama Guard, a Qwen name: replaced by its equivalents.
    "llama guard alone, a qwen name": policy([LLAMA_SIM], ["Violent"]),
}


@pytest.mark.parametrize("surface", sorted(SURFACES))
@pytest.mark.parametrize("case", sorted(SAVED))
def test_every_surface_saves_the_policy_completed_for_its_judges(
    surface: str, case: str, judges: None, people: People, tmp_path: Path
) -> None:
    data = SAVED[case]
    want = services.prepare_policy(data)
    assert not want.problems and want.policy is not None
    assert "Violent Crimes" in want.policy.refuse_categories
    assert SURFACES[surface](data, people, tmp_path) == {}
    saved = services.current_policy()
    assert saved == want.policy, f"{surface} saved {saved}"
    assert PolicyChange.objects.count() == 1
    # The Llama Guard's verdict, through the check API, with the real sim engines.
    result = check(people, UNSAFE_TEXT)
    assert (result["judge"], result["verdict"], result["categories"]) == (
        LLAMA_SIM, "unsafe", ["Violent Crimes"],
    )  # fmt: skip
    assert result["decision"] == "refuse", result
    assert check(people, "how do I kill all child processes in bash")["decision"] == "allow"


# Policies refused at a field: the key's path, the form field it is shown at.
REFUSED = {
    "a judge neither in the catalog nor known": (
        policy([QWEN_SIM, "not-a-judge"], ["Violent"]),
        ("judge", "models", 1),
    ),
    "a category no listed judge can report": (
        policy([LLAMA_SIM], ["Violent Crimes", "Jailbreak"]),
        ("categories", 1),
    ),
    "a made-up category": (
        policy([QWEN_SIM, LLAMA_SIM], ["Violent", "Gambling"]),
        ("categories", 1),
    ),
}


@pytest.mark.parametrize("surface", sorted(SURFACES))
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_every_surface_refuses_at_the_field_and_saves_nothing(
    surface: str, case: str, judges: None, people: People, tmp_path: Path
) -> None:
    data, path = REFUSED[case]
    want = [p for p in services.prepare_policy(data).problems if p.path == path]
    assert want, services.prepare_policy(data).problems
    message = want[0].message
    before = services.current_policy()
    got = SURFACES[surface](data, people, tmp_path)
    if surface in ("console", "admin"):
        # At the field, naming the line the item is on.
        line = path[-1] + 1
        assert f"line {line}: {message}" in got[FORM_FIELD[path[0]]], got
    elif surface.startswith("api"):
        assert message in got[want[0].field], got
    else:
        assert f"{want[0].field}" in got[""][0] and message in got[""][0], got
    assert services.current_policy() == before
    assert not PolicyChange.objects.exists()


def test_the_console_says_what_completing_the_policy_added(judges: None, people: People) -> None:
    r = people.client.post(
        "/guard/policy/",
        _form_post(policy([QWEN_SIM, LLAMA_SIM], ["Violent"])),
        HTTP_HX_REQUEST="true",
    )
    body = html.unescape(r.content.decode())
    assert "Saved." in body
    assert (
        'categories: added "Violent Crimes", "Indiscriminate Weapons": another listed '
        'judge\'s names for "Violent"' in body
    )


def test_enabling_a_judge_adds_it_to_a_policy_naming_a_catalog_sim_judge(
    judges: None, people: People
) -> None:
    """The issue: "Add it to the policy" failed with "no judge qwen3guard-0.6b-sim in the
    catalog or known" while it was in the catalog (a guard model with no categories of
    its own: its format's are what it reports)."""
    join_node("sim-1", ["nvidia-l4-24gb"] * 2, simulated=True)
    r = people.api.post(
        "/api/v1/guard/judges/enable",
        {"name": "llamaguard3-1b", "where": "sim", "add_to_policy": True},
        format="json",
    )
    assert r.status_code == 201, r.json()
    assert r.json()["policy"] == [QWEN_SIM, "llamaguard3-1b"], r.json()
    p = services.current_policy()
    assert p.judge_models == (QWEN_SIM, "llamaguard3-1b")
    assert {"Violent", "Violent Crimes", "Privacy", "Jailbreak"} <= set(p.refuse_categories)


def test_judge_use_completes_the_policy_and_says_so(judges: None) -> None:
    out = io.StringIO()
    call_command("guard", "judge", "use", QWEN_DOWN, LLAMA_SIM, stdout=out)
    p = services.current_policy()
    assert p.judge_models == (QWEN_DOWN, LLAMA_SIM)
    assert "Violent Crimes" in p.refuse_categories
    assert 'added "Violent Crimes", "Indiscriminate Weapons"' in out.getvalue()


def test_a_policy_stored_before_the_rule_refuses_the_llama_guards_verdict_all_the_same(
    judges: None, people: People
) -> None:
    """A policy saved before every surface completed it (or whose judges changed since)
    is held as its judges make it: equivalents added, nothing taken away."""
    GuardPolicy.objects.update(data=policy([LLAMA_SIM, QWEN_SIM], ["Violent", "PII"]))
    held = services.current_policy()
    assert held.refuse_categories[:2] == ("Violent", "PII")
    assert {"Violent Crimes", "Indiscriminate Weapons", "Privacy"} <= set(held.refuse_categories)
    result = check(people, UNSAFE_TEXT)
    assert (result["judge"], result["categories"], result["decision"]) == (
        LLAMA_SIM, ["Violent Crimes"], "refuse",
    )  # fmt: skip


def test_the_consoles_add_it_to_the_policy_after_enabling_a_judge(
    judges: None, people: People
) -> None:
    """The console's "Enable a judge" form with "Add it to the policy", the issue's path."""
    join_node("sim-1", ["nvidia-l4-24gb"] * 2, simulated=True)
    r = people.client.post(
        "/guard/enable/",
        {"name": "llamaguard3-1b", "where": "sim", "add_to_policy": "on"},
        HTTP_HX_REQUEST="true",
    )
    body = html.unescape(r.content.decode())
    assert "not added to the policy" not in body, body
    assert "added to the policy's judges as #2" in body
    assert 'added "Violent Crimes", "Indiscriminate Weapons"' in body
    assert services.current_policy().judge_models == (QWEN_SIM, "llamaguard3-1b")


def test_changing_only_the_judges_removes_what_none_of_them_reports_and_says_so(
    judges: None,
) -> None:
    """``policy set --judges`` alone keeps the categories in force: one the new judges
    cannot report (Jailbreak: no Llama Guard name) is removed and said, not refused;
    the rest are replaced by the Llama Guard's names."""
    out = io.StringIO()
    call_command("guard", "policy", "set", "--judges", LLAMA_SIM, stdout=out)
    assert 'categories: "Jailbreak": no listed judge reports it or an equivalent; removed' in (
        out.getvalue()
    )
    p = services.current_policy()
    assert p.judge_models == (LLAMA_SIM,)
    assert "Jailbreak" not in p.refuse_categories and "Violent Crimes" in p.refuse_categories


def test_a_patch_of_only_the_judges_removes_what_none_of_them_reports(
    judges: None, people: People
) -> None:
    r = people.api.patch("/api/v1/guard/policy", {"judge": {"models": [LLAMA_SIM]}}, format="json")
    assert r.status_code == 200, r.json()
    categories = r.json()["categories"]
    assert "Jailbreak" not in categories and "Violent Crimes" in categories
    # Giving the categories, one the judges cannot report is refused at its place.
    r = people.api.patch(
        "/api/v1/guard/policy", {"categories": ["Violent Crimes", "Jailbreak"]}, format="json"
    )
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "categories[1]"
