"""A profile's measured capacity: stored, checked, written with its weight by
catalog.services.set_measured and logged with the figures."""

from __future__ import annotations

import pytest

from catalog import codec, services
from catalog.choices import Surface
from catalog.models import ChangeRecord, ServedModel
from tests.catalog.samples import sim_model, sim_profile, store

pytestmark = pytest.mark.django_db

BENCH = services.Actor(user=None, surface=Surface.CLI, name="bench")


def two_profiles() -> dict:
    big, small = sim_profile("big", tp=None), sim_profile("small", gpu_class="nvidia-l4", tp=None)
    return sim_model("chat", 0, most=0, source="org/chat", profiles=[big, small])


def test_set_measured_writes_weight_and_capacity_and_logs_the_figures() -> None:
    store(two_profiles())
    services.set_measured("chat", "small", 2.0, 2, BENCH, note="bench: 2 at TTFT p99 0.3 s")
    m = ServedModel.objects.get(name="chat").to_spec()
    small = next(p for p in m.profiles if p.name == "small")
    big = next(p for p in m.profiles if p.name == "big")
    assert (small.weight, small.capacity) == (2.0, 2)
    assert big.capacity == 0
    record = ChangeRecord.objects.latest("id")
    assert record.actor_name == "bench" and "bench: 2 at TTFT p99 0.3 s" in record.summary
    assert codec.encode_model(m)["profiles"][1]["capacity"] == 2


def test_set_measured_refuses_an_unknown_profile_and_model() -> None:
    store(two_profiles())
    with pytest.raises(services.Refused, match='no profile "tiny" .its profiles: big, small'):
        services.set_measured("chat", "tiny", 1.0, 1, BENCH, note="")
    with pytest.raises(services.Refused, match='model "nope" is not in the catalog'):
        services.set_measured("nope", "big", 1.0, 1, BENCH, note="")
    assert ChangeRecord.objects.count() == 1


def test_a_negative_capacity_is_refused() -> None:
    data = two_profiles()
    data["profiles"][0]["capacity"] = -1
    m, problems = codec.decode_model(data)
    assert not problems
    with pytest.raises(services.Refused, match="capacity -1 is negative"):
        services.save_model(m, BENCH)
    assert not ServedModel.objects.exists()
