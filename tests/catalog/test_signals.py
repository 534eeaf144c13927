"""The catalog's signal (catalog.signals): what the layers above hear of a catalog change.

The receiver here stands for the cluster's (the reconciler's wake, tests/cluster/test_wake.py
shows the loop woken through it): sent once a transaction that changed the catalog
commits, with the models it changed, once however many it changed, and never for a
change that is rolled back or only tried (a dry run).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from catalog import codec, services
from catalog.choices import Surface
from catalog.signals import catalog_changed
from tests.catalog.samples import cpu_model, gpu_model, store

ACTOR = services.Actor(user=None, surface=Surface.CLI, name="test")


@pytest.fixture
def heard() -> Iterator[list[list[str]]]:
    """Every send of ``catalog_changed``, as the list of names it carried."""
    sends: list[list[str]] = []

    def receiver(sender: Any, names: list[str], **kwargs: Any) -> None:
        sends.append(names)

    catalog_changed.connect(receiver, dispatch_uid="test-catalog-changed")
    yield sends
    catalog_changed.disconnect(dispatch_uid="test-catalog-changed")


def _specs(*models: dict[str, Any]) -> list[Any]:
    out = []
    for data in models:
        m, problems = codec.decode_model(data)
        assert not problems, problems
        out.append(m)
    return out


@pytest.mark.django_db(transaction=True)
def test_a_change_is_heard_after_its_commit_and_a_rolled_back_one_never(
    heard: list[list[str]],
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        store(gpu_model("chat"))
        raise RuntimeError("undo")
    assert heard == []

    with transaction.atomic():
        store(gpu_model("chat"))
        store(cpu_model("small"))
        assert heard == []  # not before the commit
    assert heard == [["chat", "small"]]  # once for the transaction, naming both

    services.delete_model("small", ACTOR)
    assert heard[-1] == ["small"]


@pytest.mark.django_db(transaction=True)
def test_an_import_of_new_models_written_in_bulk_is_heard_once(
    heard: list[list[str]],
) -> None:
    store(gpu_model("chat"))
    heard.clear()
    new = [cpu_model(f"new-{i}") for i in range(5)]
    models = _specs(gpu_model("chat", scaling={"min": 1, "max": 3}), *new)
    services.import_catalog(models, ACTOR, dry_run=True)
    assert heard == []  # a dry run writes nothing, so tells nothing

    result = services.import_catalog(models, ACTOR)
    assert sorted(result.added) == [f"new-{i}" for i in range(5)]
    assert heard == [["chat", *[f"new-{i}" for i in range(5)]]]
