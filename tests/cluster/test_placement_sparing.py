"""Preemption that never darkens a model another node could hold.

Plain data, no database: run with ``-p no:django``. ``place_sparing`` is ``place`` where a
patient request (a drain's replacement whose replica still serves) may not evict a model's
last ready replica when no other node could hold that model.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.placement import (
    Assignment,
    Card,
    Node,
    PlacementProfile,
    Request,
    Running,
    place,
    place_sparing,
)

H100 = "nvidia-h100-80gb"
ONE = (PlacementProfile("h100", gpu_class=H100, gpus_per_node=1),)


def node(name: str, count: int = 1) -> Node:
    return Node(name, engines={"vllm": "0.11.0"}, cards=[Card(i, H100) for i in range(count)])


def test_the_issues_case_a_judges_replacement_waits_rather_than_darken_nightly() -> None:
    nodes = [replace(node("n1"), schedulable=False), node("n2")]
    running = [
        Running(1, "judge", "h100", 3, (Assignment("n1", (0,)),)),
        Running(2, "nightly", "h100", 2, (Assignment("n2", (0,)),)),
    ]
    want = [Request("9", "judge", ONE, 3)]
    # place alone evicts nightly's only replica for the judge's replacement.
    plain = place(nodes, [], running, want)
    assert [e.model for e in plain.evictions] == ["nightly"]
    plan, held = place_sparing(
        nodes, [], running, want, {"judge": {1}, "nightly": {2}}, ["9"], {"nightly": ONE}
    )
    assert not plan.placed and not plan.evictions
    assert held.keys() == {"9"}
    assert "last ready replica of nightly (#2" in held["9"].reason, held["9"].reason
    assert "no room elsewhere" in held["9"].reason
    # Not patient (a model's first replica): the class rule holds, nightly is evicted.
    plan, held = place_sparing(
        nodes, [], running, want, {"judge": set(), "nightly": {2}}, [], {"nightly": ONE}
    )
    assert [e.model for e in plan.evictions] == ["nightly"] and not held


def test_a_patient_request_takes_other_room_rather_than_darken_a_model() -> None:
    # n2 holds nightly's last replica; n3 holds one of two ready replicas of batch.
    nodes = [replace(node("n1"), schedulable=False), node("n2"), node("n3"), node("n4")]
    running = [
        Running(1, "judge", "h100", 3, (Assignment("n1", (0,)),)),
        Running(2, "nightly", "h100", 2, (Assignment("n2", (0,)),)),
        Running(3, "batch", "h100", 2, (Assignment("n3", (0,)),)),
        Running(4, "batch", "h100", 2, (Assignment("n4", (0,)),)),
    ]
    ready = {"judge": {1}, "nightly": {2}, "batch": {3, 4}}
    plan, held = place_sparing(
        nodes, [], running, [Request("9", "judge", ONE, 3)], ready, ["9"],
        {"nightly": ONE, "batch": ONE},
    )  # fmt: skip
    assert not held
    assert [e.model for e in plan.evictions] == ["batch"]


def test_a_model_that_could_be_held_elsewhere_may_be_evicted() -> None:
    # nightly fits on n3 (free): the eviction is allowed; the reconciler replaces it
    # there first (cluster.replace.spare_evicted).
    nodes = [replace(node("n1"), schedulable=False), node("n2"), node("n3")]
    running = [
        Running(1, "judge", "h100", 3, (Assignment("n1", (0,)),)),
        Running(2, "nightly", "h100", 2, (Assignment("n2", (0,)),)),
        Running(5, "other", "h100", 3, (Assignment("n3", (0,)),)),
    ]
    # n3 is full too: nightly has nowhere to go, so the judge waits.
    plan, held = place_sparing(
        nodes, [], running, [Request("9", "judge", ONE, 3)],
        {"judge": {1}, "nightly": {2}, "other": {5}}, ["9"], {"nightly": ONE},
    )  # fmt: skip
    assert held
    # Free n3: nightly could be held there, so the judge's replacement may evict it.
    plan, held = place_sparing(
        nodes, [], running[:2], [Request("9", "judge", ONE, 3)],
        {"judge": {1}, "nightly": {2}}, ["9"], {"nightly": ONE},
    )  # fmt: skip
    assert not held and plan.placed


def test_a_held_request_would_evict_only_what_frees_its_one_card() -> None:
    # A forced drain evicts what a held replacement would have evicted: each of a, b and
    # c is a last ready replica with nowhere else to go, and one card is needed, so one
    # of them (not all three the rounds of sparing tried) is what forcing it costs.
    nodes = [replace(node("n1"), schedulable=False), node("n2", 3)]
    running = [
        Running(1, "judge", "h100", 3, (Assignment("n1", (0,)),)),
        Running(2, "a", "h100", 1, (Assignment("n2", (0,)),)),
        Running(3, "b", "h100", 1, (Assignment("n2", (1,)),)),
        Running(4, "c", "h100", 1, (Assignment("n2", (2,)),)),
    ]
    ready = {"judge": {1}, "a": {2}, "b": {3}, "c": {4}}
    want = [Request("9", "judge", ONE, 3)]
    plan, held = place_sparing(
        nodes, [], running, want, ready, ["9"], {"a": ONE, "b": ONE, "c": ONE}
    )
    assert not plan.placed and held.keys() == {"9"}
    # Forcing it evicts exactly what place alone evicts for it.
    plain = place(nodes, [], running, want)
    assert [e.running_id for e in held["9"].evictions] == [e.running_id for e in plain.evictions]
    assert len(held["9"].evictions) == 1
    # The reason still names every room it spares.
    for model in ("a", "b", "c"):
        assert f"last ready replica of {model}" in held["9"].reason or f"; {model} (#" in (
            held["9"].reason
        ), held["9"].reason


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], list[Running], list[Request], set[str]]:
    n = draw(st.integers(2, 5))
    nodes = [node(f"n{i}", draw(st.integers(1, 3))) for i in range(n)]
    running: list[Running] = []
    rid = 0
    for nd in nodes:
        for c in range(len(nd.cards)):
            if draw(st.booleans()):
                rid += 1
                model = draw(st.sampled_from(["a", "b", "c", "d"]))
                rank = draw(st.integers(1, 3))
                running.append(Running(rid, model, "h100", rank, (Assignment(nd.name, (c,)),)))
    # A model's class is one: the first replica's.
    rank_of: dict[str, int] = {}
    running = [replace(r, class_rank=rank_of.setdefault(r.model, r.class_rank)) for r in running]
    k = draw(st.integers(1, 3))
    reqs = [
        Request(f"r{j}", f"x{j}", ONE, draw(st.integers(2, 3)), draw(st.integers(-2, 0)))
        for j in range(k)
    ]
    patient = {r.key for r in reqs if draw(st.booleans())}
    drained = draw(st.sampled_from([nd.name for nd in nodes]))
    nodes = [replace(nd, schedulable=False) if nd.name == drained else nd for nd in nodes]
    return nodes, running, reqs, patient


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_patient_request_never_darkens_a_model_another_node_could_hold(
    case: tuple[list[Node], list[Running], list[Request], set[str]],
) -> None:
    nodes, running, reqs, patient = case
    ready: dict[str, set[int | str]] = {}
    for r in running:
        ready.setdefault(r.model, set()).add(r.id)
    profiles = dict.fromkeys(ready, ONE)
    plan, held = place_sparing(nodes, [], running, reqs, ready, patient, profiles)
    gone = {e.running_id for e in plan.evictions}
    rank = {r.model: r.class_rank for r in running}
    placed = {p.key: p for p in plan.placed}
    for e in plan.evictions:
        if e.for_key not in patient or not ready[e.model] <= gone:
            continue
        # A patient request darkened this model: only because another node could hold it.
        taken = {a.node for a in placed[e.for_key].assignments}
        off = [replace(nd, schedulable=False) if nd.name in taken else nd for nd in nodes]
        trial = place(off, [], running, [Request("t", e.model, ONE, rank[e.model])])
        assert trial.placed and not trial.evictions, (e, plan)
    # Held requests wait, unplaced, and say what they spare.
    by_id = {r.id: r for r in running}
    for key, h in held.items():
        assert key not in placed and h.evictions and "last ready replica of" in h.reason
        # Forcing it would evict the fewest that free its one card: one replica, whose
        # going lets it in without evicting anything else.
        assert len(h.evictions) == 1, h
        gone = {e.running_id for e in h.evictions}
        (req,) = [r for r in reqs if r.key == key]
        alone = place(nodes, [], [r for r in running if r.id not in gone], [req])
        assert alone.placed and not alone.evictions, (h, alone)
        assert all(by_id[e.running_id].class_rank < req.class_rank for e in h.evictions)
    # Nothing patient: the very plan ``place`` makes.
    plain = place(nodes, [], running, reqs)
    same, none = place_sparing(nodes, [], running, reqs, ready, [], profiles)
    assert same == plain and not none
