"""The capacity bench sets two profiles' weights, and the gateways' routing follows them."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest

from catalog.models import ServedModel
from cluster.models import Replica
from tests.catalog.samples import store
from tests.e2e.autoscale.conftest import L4, SLOW, nodes, plane_bench, ready
from tests.e2e.conftest import Agent, engine_auth, wait_for
from tests.e2e.faultplane import H100, FaultPlane

# 566 s on a loaded 2-core machine (setup 45, the test 474, teardown 47).
pytestmark = [pytest.mark.e2e, pytest.mark.takes(570)]


def test_bench_weights_three_to_one_and_the_router_follows(
    scaling_plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    plane = scaling_plane
    # One card each: the first replica takes big (the higher priority), the second small.
    nodes(agents, (f"1x {H100}", f"1x {L4}"))
    # Answers of 2.4 s (24 tokens at 10 a second) and a 1 s slo: a client past the slots
    # waits most of an answer (1.2 s and more), one within them about 0.2 s; through the
    # gateway, in the tail of a full run at load 8 to 13, one client alone measured past
    # a 600 ms slo with answers half as long.
    paced = {**SLOW, "LLMGW_SIM_TPS": "10"}
    big = {"name": "big", "engine": "sim", "gpu_class": H100, "tp": 1,
           "env": {**paced, "LLMGW_SIM_PARALLEL": "6"}, "priority": 2}  # fmt: skip
    small = {"name": "small", "engine": "sim", "gpu_class": L4, "tp": 1,
             "env": {**paced, "LLMGW_SIM_PARALLEL": "2"}, "priority": 1}  # fmt: skip
    store({"name": "pair", "source": "sim/pair", "profiles": [big, small],
           "slo": {"ttft_p99": "1s"}, "scaling": {"min": 2, "max": 2}})  # fmt: skip
    wait_for(lambda: ready("pair") == 2, 120, "two replicas of pair")
    profiles = set(Replica.objects.filter(model_name="pair", desired=True)
                   .values_list("profile", flat=True))  # fmt: skip
    if profiles != {"big", "small"}:
        pytest.fail(f"placement put pair's replicas on {profiles}, not one of each")
    for profile in ("big", "small"):
        done = plane_bench(plane, "pair", profile)
        assert done.returncode == 0, done.stdout + done.stderr
    m = ServedModel.objects.get(name="pair").to_spec()
    weights = {p.name: p.weight for p in m.profiles}
    ratio = weights["big"] / weights["small"]
    assert 2.7 <= ratio <= 3.3, weights
    # The gateways' weighted choice follows: each replica's engine counts what it answered.
    engines = {r.profile: (r.pk, r.endpoint) for r in Replica.objects.filter(model_name="pair")
               if r.desired}  # fmt: skip

    def completed() -> dict[str, int]:
        return {p: httpx.get(url + "/sim/stats", headers=engine_auth(pk), timeout=10)
                .json()["completed"] for p, (pk, url) in engines.items()}  # fmt: skip

    # The gateways read the new weights with the catalog (their table, within seconds).
    # The top band: admission never holds it while the small replica's queue passes the slo.
    key = plane.key("split", "--priority", "high")
    with plane.load(key, "pair", clients=4, pause=0.0) as load:
        load.wait_for_answers(100, timeout=300)  # the new weights read by then (a second)
        before = completed()
        load.wait_for_answers(2000, timeout=600)
        after = completed()
    done = {p: after[p] - before[p] for p in ("big", "small")}
    assert load.failures == [], load.summary()
    # Prefix routing (the default) hashes each conversation to a replica in proportion to
    # the weights (rendezvous hashing), and its bounded loads let each replica hold at
    # least its weight's share of a process's few requests: the traffic follows the
    # weights within 10 % (each replica's share of the answers against its weight's), or
    # four of chance's deviations of a share of this many conversations if that is wider
    # (2,000 give 0.25 +- 0.0097: 10 % alone is 2.6 of them, and failed one run in CI).
    total_weight, total = sum(weights.values()), sum(done.values())
    for p in done:
        expected = weights[p] / total_weight
        chance = math.sqrt(expected * (1 - expected) / total)
        bound = max(0.1 * expected, 4 * chance)
        assert abs(done[p] / total - expected) <= bound, (weights, done)
