"""The capacity bench drives its replica through the gateway, as an
operator runs it: ``manage.py cluster bench`` against real sim engines, through a real
``manage.py gateway serve`` process, with a client key made for the run, pinned to the
replica measured and revoked after it.

Proof that the requests went through the gateway: the gateway's usage records count the
run's key's requests, as many as the measured engine completed. Proof that they reached
the pinned replica alone: the model's other replica completed none."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from catalog.models import ServedModel
from cluster.models import ClusterAction, Replica
from gateway.models import ClientKey, Usage
from tests.cluster.test_scaling_bench import two_profiles
from tests.guard.helpers import guard_model
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def ready_replica(profile: str, sims: Any, parallel: int) -> tuple[Replica, Any]:
    r = Replica.objects.create(model=ServedModel.objects.get(name="chat"), model_name="chat",
                               profile=profile, state="ready", reason="ready")  # fmt: skip
    sim = sims("chat", r.pk, parallel)
    r.endpoint = sim.url
    r.save()
    return r, sim


def test_the_bench_goes_through_the_gateway_to_its_replica_alone(sims: Any, gateway: Any) -> None:
    two_profiles()
    _, big = ready_replica("big", sims, 6)
    small_row, small = ready_replica("small", sims, 2)
    out = StringIO()
    call_command("cluster", "bench", "chat", "--profile", "small", stdout=out)
    text = out.getvalue()
    assert f"replica #{small_row.pk} of chat (profile small) through the gateway at " \
           f"{gateway.url}" in text  # fmt: skip
    assert "engine check: whole and streamed answers are well-formed" in text
    assert ServedModel.objects.get(name="chat").to_spec().profiles[1].capacity == 2

    # The run's key: pinned to the small replica, the model alone, the top band, no
    # owner; revoked at the end.
    key = ClientKey.objects.get(replica=small_row.pk)
    assert key.name.startswith(f"bench-replica-{small_row.pk}-")
    assert (key.models, key.priority, key.owner) == (["chat"], "high", "")
    assert key.revoked is not None
    logged = ClusterAction.objects.filter(target=key.name).values_list("action", flat=True)
    assert sorted(logged) == ["client key create", "client key revoke"]

    # Every request the small engine completed came through the gateway on that key
    # (its usage, written by the gateway process), and the big engine had none of them.
    completed = small.stats()["completed"]
    assert completed > 10

    def usage() -> int:
        return sum(Usage.objects.filter(key=key.name).values_list("requests", flat=True))

    wait_until(lambda: usage() == completed, timeout=30,
               what=f"the gateway's usage of {key.name} to reach {completed}")  # fmt: skip
    assert big.stats()["completed"] == 0


def test_no_gateway_at_the_url_says_where_it_looked(sims: Any, settings: Any) -> None:
    two_profiles()
    ready_replica("big", sims, 2)
    settings.LLMGW_GATEWAY_URL = "http://127.0.0.1:9"
    with pytest.raises(CommandError, match=r"no answer from the gateway at http://127\.0\.0\.1:9 "
                       r"\(LLMGW_GATEWAY_URL\)"):  # fmt: skip
        call_command("cluster", "bench", "chat", stdout=StringIO())
    assert not ClientKey.objects.filter(revoked__isnull=True).exists()


def test_a_judge_is_refused_with_why() -> None:
    guard_model("judge")
    with pytest.raises(CommandError, match="model judge is a judge"):
        call_command("cluster", "bench", "judge", stdout=StringIO())
