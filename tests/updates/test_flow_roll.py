"""A roll of every replica (cluster.services.roll(every=True)): what an update's promote and
rollback do, since new weights change no profile."""

from __future__ import annotations

import pytest

from cluster import services
from cluster.models import Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.cluster.test_reconciler import H100, at, tick

pytestmark = pytest.mark.django_db


def test_every_replaces_each_replica_once_and_only_when_the_new_one_is_ready() -> None:
    join_node("n1", [H100] * 8)
    store(gpu_model("chat", scaling={"min": 2, "max": 2}))
    tick(at(2026, 11, 30, 12))
    old = set(Replica.objects.values_list("pk", flat=True))
    Replica.objects.update(state="ready")
    assert services.roll("chat") == []  # no profile changed: a plain roll does nothing
    started = services.roll("chat", every=True)
    assert len(started) == 2
    assert services.roll("chat", every=True) == []  # each is being replaced already
    tick(at(2026, 11, 30, 12))
    assert all(Replica.objects.get(pk=p).desired for p in old)  # the old ones keep serving
    Replica.objects.filter(pk__in=started).update(state="ready")
    tick(at(2026, 11, 30, 12))
    assert set(Replica.objects.filter(desired=True).values_list("pk", flat=True)) == set(started)


def _origin(revision: str) -> dict[str, object]:
    return {"repo": "org/chat", "revision": revision,
            "files": [{"path": "sim-weights.json", "sha256": revision[0] * 64, "bytes": 10}]}  # fmt: skip


def _change(data: dict[str, object]) -> None:
    """Save a changed model through the service, as a promote does (a change record)."""
    from catalog import codec
    from catalog.choices import Surface
    from catalog.services import Actor, save_model

    m, problems = codec.decode_model(data)
    assert not problems, problems
    save_model(m, Actor(user=None, surface=Surface.CLI, name="test"), replacing=m.name)


def _stopped_why(model_name: str) -> list[str]:
    return list(
        Replica.objects.filter(model_name=model_name, desired=False).values_list(
            "reason", flat=True
        )
    )


def test_a_roll_to_new_weights_says_so_where_the_old_replica_stops() -> None:
    join_node("n1", [H100] * 8)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}, origin=_origin("a" * 40)))
    tick(at(2026, 11, 30, 12))
    Replica.objects.update(state="ready")
    # The promote: the origin moves to the new revision, then every replica rolls.
    _change(gpu_model("chat", scaling={"min": 1, "max": 1}, origin=_origin("b" * 40)))
    [new] = services.roll("chat", every=True)
    tick(at(2026, 11, 30, 12))
    Replica.objects.filter(pk=new).update(state="ready")
    tick(at(2026, 11, 30, 12))
    [why] = _stopped_why("chat")
    assert f"replaced by #{new} (rolled to new weights, at bbbbbbbb)" in why, why
    assert "make room" not in why


def test_a_roll_with_the_weights_unchanged_is_no_roll_to_new_weights() -> None:
    join_node("n1", [H100] * 8)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}, origin=_origin("a" * 40)))
    tick(at(2026, 11, 30, 12))
    Replica.objects.update(state="ready")
    _change(gpu_model("chat", scaling={"min": 1, "max": 1}, origin=_origin("a" * 40),
                      description="the same weights"))  # fmt: skip
    [new] = services.roll("chat", every=True)
    tick(at(2026, 11, 30, 12))
    Replica.objects.filter(pk=new).update(state="ready")
    tick(at(2026, 11, 30, 12))
    whys = _stopped_why("chat")
    assert whys and all("new weights" not in why for why in whys), whys
