"""A judge the guard policy names cannot leave it through the catalog.

Before, deleting the policy's judges was accepted on every surface and the default policy
fails open, so a cluster silently stopped judging. Now a deletion, a rename or a role
change away from guard is refused naming the policy, the same way on the console, the
API, the admin, a file import with ``--replace`` and the command line; once the judge
is out of the policy, it goes."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from django.core.management import call_command

from catalog import files, services
from catalog.choices import Surface
from catalog.models import ServedModel
from guard import services as guard
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db

ACTOR = services.Actor(user=None, surface=Surface.CLI, name="test")


def judge(name: str, **extra: Any) -> dict[str, Any]:
    return gpu_model(name, role="guard", guard={"format": "qwen3guard"}, **extra)


@pytest.fixture
def judged() -> None:
    store(cpu_model("chat"), judge("referee", aliases=["ref"]), judge("spare"))
    guard.set_policy({"judge": {"models": ["referee"]}}, surface="cli", name="test")


def said(problems: list[Any]) -> str:
    return " ".join(p.message for p in problems)


def test_the_service_refuses_deleting_renaming_or_unjudging_a_policy_judge(judged: None) -> None:
    with pytest.raises(services.Refused) as caught:
        services.delete_model("referee", ACTOR)
    (p,) = caught.value.problems
    assert p.code == "judge_in_policy" and p.path == ("name",)
    assert "guard policy" in p.message and "referee" in p.message and "delete it" in p.message
    stored = ServedModel.objects.get(name="referee").to_spec()
    stored.role, stored.guard = "", None
    (p,) = services.check_change(stored, "referee")
    assert (p.code, p.path) == ("judge_in_policy", ("role",))
    stored = ServedModel.objects.get(name="referee").to_spec()
    stored.name = "referee-2"
    assert [p.code for p in services.check_change(stored, "referee")] == ["judge_in_policy"]
    # A judge the policy does not name, and any other change to one it does, pass.
    services.delete_model("spare", ACTOR)
    stored = ServedModel.objects.get(name="referee").to_spec()
    stored.scaling.max = 3
    assert services.check_change(stored, "referee") == []
    # Out of the policy first: then it goes.
    store(judge("other"))
    guard.set_policy({"judge": {"models": ["other"]}}, surface="cli", name="test")
    services.delete_model("referee", ACTOR)
    assert not ServedModel.objects.filter(name="referee").exists()


def test_every_surface_refuses_it(
    judged: None, api_for: Any, client_for: Any, operator: Any, admin_user: Any
) -> None:
    # The API.
    r = api_for(operator).delete("/api/v1/catalog/models/referee/")
    assert r.status_code == 400 and "guard policy" in r.content.decode()
    r = api_for(operator).patch("/api/v1/catalog/models/referee/", {"role": ""}, format="json")
    assert r.status_code == 400 and "guard policy" in r.content.decode()
    # The console.
    r = client_for(operator).post("/catalog/models/referee/delete/")
    assert r.status_code == 200 and "guard policy" in r.content.decode()
    # The admin.
    pk = ServedModel.objects.get(name="referee").pk
    r = client_for(admin_user).post(f"/admin/catalog/servedmodel/{pk}/delete/", {"post": "yes"},
                                    follow=True)  # fmt: skip
    assert "not deleted" in r.content.decode() and "guard policy" in r.content.decode()
    # A file import that would remove it (--replace), through the command.
    text = files.dump_catalog([m for m in services.stored_specs() if m.name != "referee"])
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        with pytest.raises(SystemExit):
            call_command("catalog", "import", f.name, "--replace")
    assert ServedModel.objects.filter(name="referee").exists()
