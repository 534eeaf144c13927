"""The cluster's GPU classes (cluster.inventory) and their API, GET /api/v1/cluster/gpu-classes/."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from cluster.choices import NodeHealth
from cluster.inventory import ClassInfo, gpu_classes, shortfall, summarize
from cluster.models import Assignment, Card, Node, Replica

L4 = "nvidia-l4-24gb"
A100 = "nvidia-a100-80gb"
MIG = "nvidia-a100-80gb-mig-1g.10gb"
URL = "/api/v1/cluster/gpu-classes/"


def by_name(classes: list[ClassInfo]) -> dict[str, ClassInfo]:
    return {c.name: c for c in classes}


# Pure counting


def test_summarize_counts_total_free_nodes_and_the_best_node() -> None:
    cards = [
        (1, 0, L4, None),
        (1, 1, L4, None),
        (2, 0, L4, None),
        (2, 1, L4, None),
        (2, 2, L4, None),
    ]
    [l4] = summarize(cards, {2: {0}}, schedulable={1, 2})
    assert l4 == ClassInfo(
        L4, total=5, free=4, mig=False, nodes=2, best_free_on_one_node=2, free_per_node=(2, 2)
    )


def test_only_ready_uncordoned_nodes_have_free_cards() -> None:
    cards = [(1, 0, L4, None), (2, 0, L4, None), (2, 1, L4, None)]
    [l4] = summarize(cards, {}, schedulable={1})
    assert (l4.total, l4.free, l4.nodes, l4.best_free_on_one_node, l4.free_per_node) == (
        3,
        1,
        2,
        1,
        (1,),
    )
    [l4] = summarize(cards, {}, schedulable=set())
    assert (l4.total, l4.free, l4.best_free_on_one_node, l4.free_per_node) == (3, 0, 0, ())


def test_a_card_carved_into_mig_instances_counts_only_as_its_instances() -> None:
    cards = [(1, 0, A100, None), (1, 1, MIG, 0), (1, 2, MIG, 0), (1, 3, A100, None)]
    got = by_name(summarize(cards, {}, schedulable={1}))
    assert (got[A100].total, got[A100].free) == (1, 1)
    assert (got[MIG].total, got[MIG].free, got[MIG].mig) == (2, 2, True)
    assert not got[A100].mig


def test_a_card_held_whole_holds_its_instances() -> None:
    cards = [(1, 0, A100, None), (1, 1, MIG, 0), (1, 2, MIG, 0)]
    got = by_name(summarize(cards, {1: {0}}, schedulable={1}))
    assert (got[MIG].total, got[MIG].free) == (2, 0)
    got = by_name(summarize(cards, {1: {2}}, schedulable={1}))
    assert got[MIG].free == 1


def test_classes_come_sorted_by_name() -> None:
    cards = [(1, 0, L4, None), (1, 1, A100, None)]
    assert [c.name for c in summarize(cards, {}, {1})] == [A100, L4]


# Fit


def test_shortfall_of_a_class_no_node_has() -> None:
    assert shortfall({}, "nvidia-b200-192gb", 1, 1) == (
        "no node has nvidia-b200-192gb: replicas will be unplaced"
    )


def test_shortfall_of_too_few_free_cards_on_one_node() -> None:
    l4 = ClassInfo(L4, 4, 4, False, 2, 2, (2, 2))
    assert shortfall({L4: l4}, L4, 2, 1) is None
    assert shortfall({L4: l4}, L4, 4, 1) == (
        "no node has 4 free nvidia-l4-24gb; the best has 2: replicas will be unplaced"
    )


def test_shortfall_of_a_multi_node_profile() -> None:
    l4 = ClassInfo(L4, 12, 10, False, 3, 4, (4, 4, 2))
    assert shortfall({L4: l4}, L4, 4, 2) is None
    assert shortfall({L4: l4}, L4, 4, 3) == (
        "only 2 nodes have 4 free nvidia-l4-24gb; the profile needs 3 such nodes: "
        "replicas will be unplaced"
    )
    assert shortfall({L4: l4}, L4, 3, 3) == (
        "only 2 nodes have 3 free nvidia-l4-24gb; the profile needs 3 such nodes: "
        "replicas will be unplaced"
    )
    one = ClassInfo(L4, 6, 5, False, 2, 4, (4, 1))
    assert shortfall({L4: one}, L4, 4, 2).startswith("only 1 node has 4 free")
    assert shortfall({L4: one}, L4, 5, 2).startswith(
        "no node has 5 free nvidia-l4-24gb; the profile needs 2"
    )


def test_no_shortfall_without_a_class() -> None:
    assert shortfall({}, "", 0, 1) is None


# From the database


def node(name: str, *classes: str, health: str = NodeHealth.READY, cordoned: bool = False) -> Node:
    n = Node.objects.create(name=name, health=health, cordoned=cordoned)
    Card.objects.bulk_create(Card(node=n, index=i, gpu_class=c) for i, c in enumerate(classes))
    return n


def hold(n: Node, *cards: int, desired: bool = True) -> None:
    r = Replica.objects.create(model_name="m", desired=desired)
    Assignment.objects.create(replica=r, node=n, cards=list(cards))


@pytest.mark.django_db
def test_gpu_classes_reads_nodes_cards_and_what_replicas_hold(
    django_assert_num_queries: Any,
) -> None:
    a = node("a", L4, L4)
    b = node("b", L4, L4, L4, L4)
    node("c", L4, L4, cordoned=True)
    node("d", L4, health=NodeHealth.LOST)
    hold(b, 0, 1)
    hold(a, 0, desired=False)  # stopping: holds its card until it is gone
    carved = node("e", A100, MIG, MIG)
    Card.objects.filter(node=carved, gpu_class=MIG).update(mig_of=0)
    with django_assert_num_queries(3):
        got = by_name(gpu_classes())
    assert got[L4] == ClassInfo(L4, 9, 3, False, 4, 2, (2, 1))
    assert got[MIG] == ClassInfo(MIG, 2, 2, True, 1, 2, (2,))
    assert A100 not in got  # only its instances are offered


@pytest.mark.django_db
def test_no_nodes_no_classes() -> None:
    assert gpu_classes() == []


# API


@pytest.mark.django_db
def test_api_lists_classes_for_viewers(api_for: Any, viewer: Any) -> None:
    node("a", L4, L4, MIG)
    assert reverse("cluster-api:gpu-classes") == URL
    r = api_for(viewer).get(URL)
    assert r.status_code == 200
    assert r.json() == [
        {
            "name": MIG,
            "total": 1,
            "free": 1,
            "mig": True,
            "nodes": 1,
            "best_free_on_one_node": 1,
            "free_per_node": [1],
        },
        {
            "name": L4,
            "total": 2,
            "free": 2,
            "mig": False,
            "nodes": 1,
            "best_free_on_one_node": 2,
            "free_per_node": [2],
        },
    ]


@pytest.mark.django_db
def test_api_is_read_only_and_needs_a_role(
    api_for: Any, client: Any, operator: Any, outsider: Any
) -> None:
    assert api_for(operator).post(URL, {}, format="json").status_code == 405
    assert api_for(outsider).get(URL).status_code == 403
    assert client.get(URL).status_code in (401, 403)
