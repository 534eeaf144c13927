"""cluster.quotas and placement with quotas: each replica counts against
its owner's quota and every parent's; a request past one waits with the quota named and
evicts nothing for it; another owner's model still places. Hypothesis for what holds
whatever the quotas and requests."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cluster.placement import Assignment, Card, Node, PlacementProfile, Request, Running, place
from cluster.quotas import CPU, Book, Ledger, Quota, check, held_by, need_of

H100 = "nvidia-h100-80gb"
A10 = "nvidia-a10-24gb"

BOOK = Book(
    quotas={
        "org:acme": Quota("org:acme", cards={H100: 6}),
        "team:search": Quota("team:search", "org:acme", cards={H100: 2}),
        "team:chat": Quota("team:chat", "org:acme", cards={H100: 8}, cpu_cores=4),
        "project:rag": Quota("project:rag", "team:search"),
    },
    owners={
        "s1": "team:search",
        "s2": "team:search",
        "rag": "project:rag",
        "c1": "team:chat",
        "free": "",
        "cpu": "team:chat",
    },  # fmt: skip
)


def node(name: str, count: int = 8, cls: str = H100, cores: int = 32) -> Node:
    return Node(name, cards=tuple(Card(i, cls, power_limit_w=700) for i in range(count)),
                cpu_cores=cores, engines={"vllm": "0.11.0", "llamacpp": "b1"})  # fmt: skip


def gpu(g: int = 1, cls: str = H100) -> PlacementProfile:
    return PlacementProfile("p", gpu_class=cls, gpus_per_node=g)


def req(key: str, model: str, *profiles: PlacementProfile, rank: int = 2) -> Request:
    return Request(key, model, profiles or (gpu(),), rank)


def test_the_chain_is_the_owner_then_each_parent() -> None:
    assert BOOK.chain("project:rag") == ["project:rag", "team:search", "org:acme"]
    assert BOOK.chain("team:other") == ["team:other"]
    assert BOOK.chain("") == []
    loop = Book({"team:a": Quota("team:a", "org:b"), "org:b": Quota("org:b", "team:a")})
    assert loop.chain("team:a") == ["team:a", "org:b"]


def test_a_teams_quota_spent_leaves_its_next_replica_pending_and_another_team_places() -> None:
    plan = place([node("n1")], [], [], [req("s1/0", "s1"), req("s1/1", "s1"), req("s1/2", "s1"),
                                       req("c1/0", "c1")], quotas=BOOK)  # fmt: skip
    assert sorted(p.key for p in plan.placed) == ["c1/0", "s1/0", "s1/1"]
    [waiting] = plan.unplaced
    assert waiting.key == "s1/2"
    assert waiting.reason == (
        f"quota of team:search spent: 2 of its 2 {H100} cards in use, and a replica needs 1"
    )


def test_running_replicas_count_and_a_project_counts_in_its_team_and_org() -> None:
    running = [Running("r1", "s1", "p", 2, (Assignment("n1", (0,)),)),
               Running("r2", "c1", "p", 2, (Assignment("n1", (1, 2, 3, 4)),))]  # fmt: skip
    plan = place([node("n1")], [], running, [req("rag/0", "rag"), req("rag/1", "rag")],
                 quotas=BOOK)  # fmt: skip
    assert [p.key for p in plan.placed] == ["rag/0"]
    assert plan.unplaced[0].reason.startswith(
        "quota of team:search (above project:rag) spent: 2 of its 2"
    )
    # The org's 6 cards: chat holds 4, search 2.
    more = place([node("n1")], [], running, [req("c1/1", "c1", gpu(2))], quotas=BOOK)
    assert more.unplaced[0].reason.startswith("quota of org:acme (above team:chat) spent: 5 of")


def test_a_quota_names_only_what_it_limits_and_no_owner_counts_against_nobody() -> None:
    plan = place([node("n1", cls=A10)], [], [],
                 [req("s1/0", "s1", gpu(4, A10)), req("free/0", "free", gpu(4, A10))],
                 quotas=BOOK)  # fmt: skip
    assert sorted(p.key for p in plan.placed) == ["free/0", "s1/0"]


def test_a_profile_past_the_quota_is_skipped_for_one_within_it() -> None:
    plan = place([node("n1"), node("a", cls=A10)], [], [],
                 [req("s1/0", "s1", gpu(4), gpu(1, A10))], quotas=BOOK)  # fmt: skip
    assert plan.placed[0].assignments[0].node == "a"


def test_cpu_profiles_count_cores() -> None:
    cpu = PlacementProfile("cpu", engine="llamacpp", cpu_cores=3)
    plan = place([node("n1", count=0)], [], [], [req("cpu/0", "cpu", cpu), req("cpu/1", "cpu", cpu)],
                 quotas=BOOK)  # fmt: skip
    assert [p.key for p in plan.placed] == ["cpu/0"]
    assert "3 of its 4 CPU cores in use" in plan.unplaced[0].reason


def test_no_eviction_for_a_request_past_its_quota() -> None:
    low = Running("low", "free", "p", 1, (Assignment("n1", tuple(range(8))),))
    plan = place([node("n1")], [], [low], [req("s1/0", "s1", gpu(3), rank=3)], quotas=BOOK)
    assert not plan.evictions and plan.unplaced[0].reason.startswith("quota of team:search")


def test_the_check_names_the_field() -> None:
    assert check("team:a", "org:b", {H100: 2}, 4) == {}
    assert set(check("teams:a", "", {}, None)) == {"owner"}
    assert "the parent of a project is a team" in check("project:p", "org:b", {}, None)["parent"]
    assert "has no parent" in check("org:a", "org:b", {}, None)["parent"]
    assert set(check("team:a", "", {H100: -1}, -2)) == {"cards", "cpu_cores"}


def test_held_by_reads_the_cards_class_from_the_node() -> None:
    classes = {("n1", 0): H100, ("n1", 1): H100}
    assert held_by([Assignment("n1", (0, 1))], classes) == (H100, 2)
    assert held_by([Assignment("n1", (), cpu_cores=6)], classes) == (CPU, 6)
    assert need_of(H100, 2, 2, 0) == (H100, 4) and need_of("", 0, 1, 8) == (CPU, 8)


owners = st.sampled_from(["team:a", "team:b", "project:x", ""])
limits = st.one_of(st.none(), st.integers(0, 6))


@given(
    st.fixed_dictionaries(
        {"org:o": limits, "team:a": limits, "team:b": limits, "project:x": limits}
    ),
    st.lists(st.tuples(owners, st.integers(1, 4), st.integers(1, 3)), max_size=12),
)
def test_placement_never_passes_an_owners_quota_nor_a_parents(
    caps: dict[str, Any], wanted: list[tuple[str, int, int]]
) -> None:
    parents = {"team:a": "org:o", "team:b": "org:o", "project:x": "team:a", "org:o": ""}
    book = Book(
        quotas={
            o: Quota(o, parents[o], cards={} if c is None else {H100: c}) for o, c in caps.items()
        },
        owners={f"m{i}": o for i, (o, _, _) in enumerate(wanted)},
    )
    reqs = [Request(f"m{i}/{j}", f"m{i}", (gpu(g),), 2, priority=-j)
            for i, (_, g, n) in enumerate(wanted) for j in range(n)]  # fmt: skip
    plan = place([node("n1"), node("n2")], [], [], reqs, quotas=book)
    ledger = Ledger(book)
    for p in plan.placed:
        ledger.take(p.model, H100, sum(len(a.cards) for a in p.assignments))
    for (owner, resource), used in ledger.used.items():
        limit = book.quotas[owner].limit(resource) if owner in book.quotas else None
        assert limit is None or used <= limit, (owner, used, limit)
    for u in plan.unplaced:
        if u.reason.startswith("quota of "):  # the quota named is the owner's or a parent's
            assert u.reason.split()[2] in book.chain(book.owner_of(u.model))
