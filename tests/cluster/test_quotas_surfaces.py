"""Quotas per owner through every surface: the command, the API, the
admin and the console set them through ``cluster.tenancy`` (checked, logged with who and
how); the reconciler counts each model's replicas against its owner's quota and its
parents', a replica past one waits pending with the quota named, shown on the quotas page,
the owner's page and the API, while another team's model still places."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from cluster import reconciler
from cluster.models import ClusterAction, Node, Quota, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def tick() -> reconciler.TickResult:
    Node.objects.update(last_heartbeat=NOW)
    return reconciler.tick(NOW)


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("cluster", "quota", *args, stdout=out)
    return out.getvalue()


def teams() -> None:
    """Two teams of one org; search may hold 2 H100 cards (one replica of 2)."""
    join_node("n1", [H100] * 8)
    cli("set", "org:acme", "--cards", f"{H100}=8")
    cli("set", "team:search", "--parent", "org:acme", "--cards", f"{H100}=2")
    store(gpu_model("search", owner="team:search", scaling={"min": 2, "max": 2}),
          gpu_model("chat", owner="team:chat", scaling={"min": 1, "max": 1}))  # fmt: skip


def test_a_teams_quota_spent_leaves_its_next_replica_pending_and_another_team_places() -> None:
    teams()
    result = tick()
    assert len(result.placed) == 2
    [waiting] = Replica.objects.filter(model_name="search", assignments__isnull=True)
    assert waiting.state == "pending"
    assert "quota of team:search spent: 2 of its 2 nvidia-h100-80gb cards in use" in waiting.reason
    assert Replica.objects.get(model_name="chat").assignments.count() == 1
    # More room in the quota: the waiting replica places at the next tick.
    cli("set", "team:search", "--parent", "org:acme", "--cards", f"{H100}=4")
    tick()
    assert Replica.objects.filter(model_name="search", assignments__isnull=False).count() == 2


def test_the_command_sets_lists_and_removes_and_refuses_bad_input_plainly() -> None:
    teams()
    tick()
    listed = cli("list")
    assert f"team:search\t2 {H100}; in org:acme\tin use: 2 {H100}" in listed
    # team:chat has no quota, so nothing says it is in org:acme: only search counts there.
    assert f"org:acme\t8 {H100}\tin use: 2 {H100}" in listed
    for args, words in [
        (("set", "teams:x"), "owner 'teams:x' is not org:ID"),
        (("set", "team:x", "--parent", "project:y"), "the parent of a team is a org"),
        (("set", "team:x", "--cards", "h100"), "'h100' is not CLASS=N"),
        (("delete", "team:none"), "no quota for 'team:none'"),
    ]:
        with pytest.raises(CommandError) as caught:
            cli(*args)
        assert words in str(caught.value)
    assert set(Quota.objects.values_list("owner", flat=True)) == {"org:acme", "team:search"}
    assert "removed" in cli("delete", "team:search")
    assert ClusterAction.objects.filter(action="quota removed", target="team:search").exists()


def test_api_writes_through_the_same_path_and_shows_what_is_in_use(
    operator: Any, viewer: Any, api_for: Any
) -> None:
    teams()
    tick()
    api = api_for(operator)
    made = api.post("/api/v1/cluster/quotas/", {"owner": "project:rag", "parent": "team:search",
                                                "cards": {H100: 1}}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert made.json()["owner"] == "project:rag"
    listed = {
        q["owner"]: q for q in api_for(viewer).get("/api/v1/cluster/quotas/").json()["results"]
    }
    assert listed["team:search"]["in_use"] == {H100: 2}
    assert listed["team:search"]["cards"] == {H100: 2}
    bad = api.post("/api/v1/cluster/quotas/", {"owner": "team:z", "parent": "team:y"},
                   format="json")  # fmt: skip
    assert bad.status_code == 400
    assert [e["field"] for e in bad.json()["errors"]] == ["parent"]
    assert not Quota.objects.filter(owner="team:z").exists()
    pk = listed["team:search"]["id"]
    patched = api.patch(f"/api/v1/cluster/quotas/{pk}/", {"cards": {H100: 6}}, format="json")
    assert patched.status_code == 200 and patched.json()["parent"] == "org:acme"
    assert Quota.objects.get(owner="team:search").cards == {H100: 6}
    assert api_for(viewer).post("/api/v1/cluster/quotas/", {"owner": "team:v"},
                                format="json").status_code == 403  # fmt: skip
    assert ClusterAction.objects.filter(action="quota set", target="team:search",
                                        actor_name=f"{operator.username} (api)").exists()  # fmt: skip
    # The waiting replica's reason is in the replicas' API too.
    Quota.objects.filter(owner="team:search").update(cards={H100: 2})
    tick()
    replicas = api_for(viewer).get("/api/v1/cluster/replicas/?model=search").json()["results"]
    assert [r["reason"] for r in replicas if "quota of team:search spent" in r["reason"]]


def test_console_lists_sets_and_shows_the_owner_page(operator: Any, client_for: Any) -> None:
    teams()
    tick()
    web = client_for(operator)
    page = web.get("/cluster/quotas/").content.decode()
    assert 'data-quota="team:search" data-spent="1"' in page
    assert "quota of team:search spent" in page
    bad = web.post("/cluster/quotas/set/", {"owner": "team:q", "cards": "h100=two"})
    assert bad.status_code == 400 and b"is not CLASS=N" in bad.content
    done = web.post("/cluster/quotas/set/", {"owner": "team:chat", "parent": "org:acme",
                                             "cards": f"{H100}=2", "cpu_cores": ""}, follow=True)  # fmt: skip
    assert b"Quota of team:chat" in done.content
    assert Quota.objects.get(owner="team:chat").cards == {H100: 2}
    owner = web.get("/cluster/owners/team:search/").content.decode()
    assert 'data-owner="org:acme"' in owner and "quota of team:search spent" in owner
    assert 'data-resource="nvidia-h100-80gb" data-used="2" data-limit="2"' in owner


def test_admin_sets_a_quota_checked_and_logged(operator: Any, client_for: Any) -> None:
    web = client_for(operator)
    bad = web.post("/admin/cluster/quota/add/", {"owner": "project:p", "parent": "org:o",
                                                 "cards": "{}", "cpu_cores": ""})  # fmt: skip
    assert bad.status_code == 200 and b"the parent of a project is a team" in bad.content
    ok = web.post("/admin/cluster/quota/add/", {"owner": "team:t", "parent": "",
                                                "cards": '{"nvidia-h100-80gb": 2}', "cpu_cores": "8", "tpm": "500"})  # fmt: skip
    assert ok.status_code == 302
    assert Quota.objects.get(owner="team:t").cpu_cores == 8
    assert Quota.objects.get(owner="team:t").tpm == 500
    assert ClusterAction.objects.filter(action="quota set", target="team:t",
                                        actor_name=f"{operator.username} (admin)").exists()  # fmt: skip
