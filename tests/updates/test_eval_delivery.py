"""An update's eval task delivered twice runs once (updates.run.run_eval).

A Celery task may reach the worker twice: a publish that Redis answered after the
broker's socket timeout is sent again, and both copies are queued. The eval runs through
a real ``gateway serve`` process (tests/cluster/conftest.py) to a real sim engine, with
the gateway reached through a proxy the test holds, so the first delivery is inside its
eval, its client key made, when the second comes.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

import pytest

from catalog.models import ServedModel
from cluster.models import Replica
from gateway.models import ClientKey
from tests.catalog.samples import sim_model, store
from tests.cluster.conftest import gateway, sims  # noqa: F401 (fixtures)
from tests.faultproxy import fault_proxy
from tests.updates.hubstandin import HubStandIn
from tests.waiting import wait_until
from updates import mirror, run
from updates.models import UpdateRun

pytestmark = pytest.mark.django_db(transaction=True)

WEIGHTS = b'{"llmgw-sim-weights": 1, "name": "v1"}'


def test_a_second_delivery_of_the_eval_task_leaves_the_running_eval_alone(
    hub: HubStandIn,
    sims: Any,  # noqa: F811 (the fixture imported above)
    gateway: Any,  # noqa: F811
    settings: Any,
) -> None:
    hub.commit("org/chat", {"sim-weights.json": WEIGHTS, "README.md": b"v1"})
    store(sim_model("chat", source="org/chat", eval={"suite": "arithmetic", "min_score": 0.5}))
    fetch = mirror.request_fetch("chat", by="test", surface="cli", start=False)
    assert mirror.run_fetch(fetch.pk).state == "done"
    hub.commit("org/chat", {"sim-weights.json": WEIGHTS.replace(b"v1", b"v2"), "README.md": b"v2"})
    r = run.start("chat")
    assert mirror.run_fetch(r.fetch_id).state == "done"
    r = run.advance(r.pk)
    assert r is not None and r.step == "candidate", r.lines
    # The candidate's replica, ready on a sim engine.
    replica = Replica.objects.create(model=ServedModel.objects.get(name=r.candidate),
                                     model_name=r.candidate, state="ready", reason="ready")  # fmt: skip
    replica.endpoint = sims(r.candidate, replica.pk, 4).url
    replica.save()
    where = urlsplit(gateway.url)
    with fault_proxy((where.hostname or "127.0.0.1", where.port or 80)) as proxy:
        settings.LLMGW_GATEWAY_URL = f"http://127.0.0.1:{proxy.port}"
        proxy.hang()
        # Into the eval: the first delivery (a thread, as embedded) makes its key and waits
        # at the held gateway.
        r = run.advance(r.pk)
        assert r is not None and r.step == "eval", r.lines
        name = f"update-eval-{r.pk}"
        wait_until(lambda: ClientKey.objects.filter(name=name, revoked__isnull=True).exists(),
                   30, "the first delivery's client key")  # fmt: skip
        first = next(t for t in threading.enumerate() if t.name == f"update-eval-{r.pk}")
        try:
            # The second delivery, while the first runs.
            run.run_eval(r.pk)
            after = UpdateRun.objects.get(pk=r.pk)
            assert after.reason == "" and after.score is None, after.reason
            assert ClientKey.objects.filter(name=name, revoked__isnull=True).count() == 1
        finally:
            proxy.heal()
            first.join(120)
    assert not first.is_alive()
    done = UpdateRun.objects.get(pk=r.pk)
    assert done.reason == "" and done.score is not None, (done.reason, done.lines)
    assert done.eval_total and done.eval_done == done.eval_total
    # One key for the eval, revoked at its end.
    keys = ClientKey.objects.filter(name=name)
    assert keys.count() == 1 and keys[0].revoked is not None
