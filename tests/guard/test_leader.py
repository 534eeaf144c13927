"""The leader adds and serves a known judge the policy names and the catalog lacks: the
pure decision, then the real reconciler tick on PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection

from catalog import services as catalog_services
from catalog.choices import Surface
from catalog.models import ChangeRecord, ServedModel
from cluster import reconciler
from cluster.models import Replica
from guard import checks, known, services
from tests.catalog.samples import sim_model, store
from tests.cluster.helpers import join_node

# -- the decision ---------------------------------------------------------------------


def test_known_judges_the_policy_names_and_the_catalog_lacks_are_added_in_order() -> None:
    named = ["llamaguard3-1b", "custom-judge", "qwen3guard-0.6b", "qwen3guard-4b"]
    assert known.judges_to_add(named, {"qwen3guard-0.6b"}) == ["llamaguard3-1b", "qwen3guard-4b"]


def test_a_judge_in_the_catalog_is_never_added_whatever_it_holds() -> None:
    assert known.judges_to_add(["qwen3guard-0.6b"], {"qwen3guard-0.6b"}) == []


def test_a_judge_deleted_since_the_policy_changed_is_left_out() -> None:
    named = ["qwen3guard-0.6b", "qwen3guard-4b"]
    assert known.judges_to_add(named, set(), deleted_since_policy={"qwen3guard-0.6b"}) == [
        "qwen3guard-4b"
    ]


def test_only_known_judges_and_each_once() -> None:
    assert known.judges_to_add(["x", "x", "y"], set(), known=("x",)) == ["x"]
    assert known.judges_to_add([], set()) == []


# -- the tick -------------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db


def operator_actor(user: Any) -> catalog_services.Actor:
    return catalog_services.Actor(user=user, surface=Surface.API)


def set_judges(*names: str, fail: str = "open") -> None:
    services.set_policy({"judge": {"models": list(names)}, "fail": fail}, surface="cli", name="t")


def stored_judges(*names: str) -> None:
    """Store a policy as it is, unchecked: one saved before a policy could name only
    judges, which the leader still meets."""
    from guard.models import GuardPolicy

    GuardPolicy.objects.create(data={"judge": {"models": list(names)}})


@pytestmark_db
def test_the_tick_adds_and_serves_a_named_known_judge_logged_as_the_reconciler() -> None:
    join_node("cpu-1", [], cpu_cores=16)
    stored_judges("qwen3guard-4b", "custom-judge")
    result = reconciler.tick()
    assert result.leader
    m = ServedModel.objects.get(name="qwen3guard-4b").to_spec()
    assert m.role == "guard" and m.guard is not None and m.guard.format == "qwen3guard"
    p = m.profiles[0]
    assert (p.engine, p.cpu_cores, p.gpu_class) == ("llamacpp", 8, "")
    change = ChangeRecord.objects.get(model_name="qwen3guard-4b")
    assert change.action == "create"
    assert change.actor_name == "reconciler (the guard policy names it)"
    # Served in the same tick: a replica wanted and placed on the CPU node.
    assert result.created.get("qwen3guard-4b") == 1
    replica = Replica.objects.get(model_name="qwen3guard-4b")
    assert replica.pk in result.placed and replica.profile == "cpu"
    # A name llmgw does not know is not invented.
    assert not ServedModel.objects.filter(name="custom-judge").exists()
    # Again: nothing changes.
    reconciler.tick()
    assert ChangeRecord.objects.filter(model_name="qwen3guard-4b").count() == 1


@pytestmark_db
def test_before_a_policy_is_stored_nothing_is_added() -> None:
    reconciler.tick()
    assert not ServedModel.objects.exists()


@pytestmark_db
def test_an_operators_judge_is_never_rewritten(operator: Any) -> None:
    join_node("sim-1", ["nvidia-h100-80gb"], simulated=True)
    spec = known.enable_spec("qwen3guard-0.6b", sim=True, gpu_classes={"nvidia-h100-80gb": 81559})
    spec.description = "ours, on the sim engine"
    catalog_services.save_model(spec, operator_actor(operator))
    set_judges("qwen3guard-0.6b")
    reconciler.tick()
    m = ServedModel.objects.get(name="qwen3guard-0.6b").to_spec()
    assert m.description == "ours, on the sim engine" and m.profiles[0].engine == "sim"
    assert ChangeRecord.objects.filter(model_name="qwen3guard-0.6b").count() == 1


@pytestmark_db
def test_a_model_of_that_name_that_is_no_judge_is_left_alone() -> None:
    store(sim_model("qwen3guard-0.6b", 0, most=0, tp=None, source="sim/chat"))
    # No surface saves a policy naming a model that is no judge (guard.policy.complete)...
    with pytest.raises(services.PolicyRefused, match="neither a guard model in the catalog"):
        set_judges("qwen3guard-0.6b")
    # ...and when one was stored before, the leader leaves the model alone.
    stored_judges("qwen3guard-0.6b")
    reconciler.tick()
    assert ServedModel.objects.get(name="qwen3guard-0.6b").role != "guard"
    assert ChangeRecord.objects.filter(model_name="qwen3guard-0.6b").count() == 1


@pytestmark_db
def test_a_judge_the_operator_deleted_stays_deleted_until_the_policy_is_saved_again(
    operator: Any,
) -> None:
    set_judges("qwen3guard-0.6b")
    reconciler.tick()
    assert ServedModel.objects.filter(name="qwen3guard-0.6b").exists()
    # Not while the policy judges with it: it would silently stop judging.
    with pytest.raises(catalog_services.Refused, match="named by the guard policy"):
        catalog_services.delete_model("qwen3guard-0.6b", operator_actor(operator))
    services.set_policy({"judge": {"models": ["qwen3guard-0.6b"]}, "directions": []},
                        surface="cli", name="t")  # fmt: skip
    catalog_services.delete_model("qwen3guard-0.6b", operator_actor(operator))
    reconciler.tick()
    reconciler.tick()
    assert not ServedModel.objects.filter(name="qwen3guard-0.6b").exists()
    # (Checks meanwhile judge nothing: the policy said so. A check naming a judge the
    # catalog lacks says so: tests/guard/test_check_on_loop.py.)
    assert checks.check("hello")["failures"] == []
    # The operator saves the policy again, still naming it: the later word wins.
    set_judges("qwen3guard-0.6b", fail="closed")
    reconciler.tick()
    assert ServedModel.objects.filter(name="qwen3guard-0.6b").exists()
    latest = ChangeRecord.objects.filter(model_name="qwen3guard-0.6b").order_by("-at", "-id")[0]
    assert latest.action == "create"
    assert latest.actor_name == (
        "reconciler (the guard policy names it; re-added: deleted before the policy last changed)"
    )


@pytestmark_db
def test_a_judge_the_catalog_refuses_does_not_stop_the_tick() -> None:
    store(sim_model("chat", tp=None, aliases=["qwen3guard-0.6b"]))  # the judge's name is taken
    set_judges("qwen3guard-0.6b")
    result = reconciler.tick()
    assert not ServedModel.objects.filter(name="qwen3guard-0.6b").exists()
    assert result.created == {"chat": 1}  # the rest of the tick ran


@pytestmark_db
def test_only_the_leader_adds() -> None:
    set_judges("qwen3guard-0.6b")
    settings = connection.settings_dict
    other = psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        autocommit=True,
    )
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [reconciler.LEADER_LOCK])
        assert not reconciler.tick().leader
        assert not ServedModel.objects.filter(name="qwen3guard-0.6b").exists()
        other.execute("SELECT pg_advisory_unlock(%s)", [reconciler.LEADER_LOCK])
    finally:
        other.close()
    assert reconciler.tick().leader
    assert ServedModel.objects.filter(name="qwen3guard-0.6b").exists()
