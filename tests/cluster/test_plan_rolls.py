"""Rolls in the plan's pure core: counting by place, finishing, one at a time without room.

Plain data, no database: run with ``-p no:django``. The property drives ``plan.scale``,
``plan.finish_rolls`` and ``plan.make_room`` tick after tick over a toy cluster of
one-card replicas, as the reconciler does, with replicas becoming ready a few ticks after
they are placed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import plan
from cluster.plan import ReplicaView, Want


def view(rid: int, state: str = "ready", **kw: object) -> ReplicaView:
    kw.setdefault("model", "chat")
    kw.setdefault("desired", True)
    kw.setdefault("placed", True)
    kw.setdefault("created", float(rid))
    return ReplicaView(rid, state=state, **kw)  # type: ignore[arg-type]


WANT2 = {"chat": Want(2, "window weekdays 08:00-18:00: min 2")}


def test_a_ready_replacement_is_kept_and_what_it_replaces_stops() -> None:
    # The tick: both replacements ready beside the replicas they replace.
    reps = [
        view(1, outdated=True),
        view(2, outdated=True),
        view(3, replaces=1),
        view(4, replaces=2),
    ]
    changes = plan.scale(WANT2, reps)
    assert changes.stop == [] and changes.create == {}
    assert sorted(plan.finish_rolls(reps)) == [(1, 3), (2, 4)]


def test_a_replacement_beside_its_replica_counts_once() -> None:
    reps = [view(1, outdated=True), view(3, "loading", replaces=1), view(2)]
    assert plan.scale(WANT2, reps) == plan.Changes()
    # Its replica already stopped: the replacement holds the place alone.
    reps = [view(1, "stopping", desired=False), view(3, "pending", replaces=1), view(2)]
    assert plan.scale(WANT2, reps) == plan.Changes()


def test_scaling_down_gives_up_replaced_and_old_definition_replicas_first() -> None:
    one = {"chat": Want(1, "scaling: min 1")}
    # A roll under way: its place goes, both replicas of it.
    reps = [view(1, outdated=True), view(2, "loading", replaces=1), view(3)]
    stopped = {rid for rid, _ in plan.scale(one, reps).stop}
    assert stopped == {1, 2}
    # Of two ready replicas, the one of an old definition goes, though it is older.
    reps = [view(1, outdated=True), view(2)]
    assert [rid for rid, _ in plan.scale(one, reps).stop] == [1]
    # One not ready goes before any ready one, outdated or not: ready never drops to 0.
    reps = [view(1, outdated=True), view(2, "pending", placed=False)]
    assert [rid for rid, _ in plan.scale(one, reps).stop] == [2]


def test_without_room_one_replica_is_replaced_at_a_time() -> None:
    reps = [
        view(1, outdated=True),
        view(2, outdated=True),
        view(3, "pending", replaces=1, placed=False),
        view(4, "pending", replaces=2, placed=False),
    ]
    stops, reasons = plan.make_room(WANT2, reps, [3, 4])
    assert [rid for rid, _ in stops] == [1]
    assert reasons[3].startswith(plan.ONE_AT_A_TIME) and "#1 stops first" in reasons[3]
    assert "waiting for #3" in reasons[4]
    # While #3 loads, #2 keeps serving: nothing else stops.
    reps[0] = view(1, "stopping", desired=False, outdated=True)
    reps[2] = view(3, "loading", replaces=1)
    stops, reasons = plan.make_room(WANT2, reps, [4])
    assert stops == [] and "waiting for #3" in reasons[4]


def test_without_room_the_last_ready_replica_of_a_min_2_model_waits() -> None:
    reps = [
        view(1, outdated=True),
        view(2, "failed", outdated=True),
        view(3, "pending", replaces=1, placed=False),
    ]
    stops, reasons = plan.make_room(WANT2, reps, [3])
    assert stops == [] and "waiting for another replica" in reasons[3]
    # A lone replica (min 1) is replaced all the same, and says the model goes dark.
    one = {"chat": Want(1, "scaling: min 1")}
    stops, reasons = plan.make_room(one, reps[:1] + reps[2:], [3])
    assert [rid for rid, _ in stops] == [1] and "no ready replica" in reasons[3]


# The property: a toy cluster, ticked as the reconciler ticks it.


@dataclass
class Rep:
    id: int
    model: str
    desired: bool = True
    state: str = "pending"
    placed: bool = False
    replaces: int | None = None
    version: int = -1  # the definition it was placed with
    wait: int = 0  # ticks from placed to ready


class Toy:
    """One model's replicas on a cluster with room for ``room`` one-card replicas."""

    def __init__(self, room: int, delays: list[int]) -> None:
        self.room = room
        self.reps: dict[int, Rep] = {}
        self.version = 0
        self.next_id = 1
        self.delays = delays

    def add(self, replaces: int | None = None) -> Rep:
        r = Rep(self.next_id, "chat", replaces=replaces)
        r.wait = self.delays[self.next_id % len(self.delays)]
        self.reps[r.id] = r
        self.next_id += 1
        return r

    def views(self) -> list[ReplicaView]:
        return [
            ReplicaView(
                r.id,
                r.model,
                r.desired,
                r.state,
                r.placed,
                r.replaces,
                float(r.id),
                outdated=r.placed and r.version != self.version,
            )  # fmt: skip
            for r in self.reps.values()
        ]

    def stop(self, ids: list[int]) -> None:
        for rid in ids:
            r = self.reps[rid]
            if not r.placed:
                self.delete(rid)
            else:
                r.desired, r.state = False, "stopping"

    def delete(self, rid: int) -> None:
        del self.reps[rid]
        for r in self.reps.values():
            if r.replaces == rid:
                r.replaces = None  # on_delete=SET_NULL

    def ready(self) -> int:
        return sum(r.desired and r.state == "ready" for r in self.reps.values())

    def roll(self) -> None:
        """What services.roll does: a replacement for each replica of an old definition."""
        replaced = {r.replaces for r in self.reps.values() if r.desired}
        for r in list(self.reps.values()):
            if (
                r.desired and r.placed and r.version != self.version
                and r.replaces is None and r.id not in replaced
            ):  # fmt: skip
                self.add(replaces=r.id)

    def tick(self, want: Want) -> list[int]:
        """One reconcile tick, then the agents' progress; return ready counts seen."""
        seen = []
        wants = {"chat": want}
        changes = plan.scale(wants, self.views())
        for _ in range(changes.create.get("chat", 0)):
            self.add()
        self.stop([rid for rid, _ in changes.stop])
        seen.append(self.ready())
        for old, _new in plan.finish_rolls(self.views()):
            self.stop([old])
        for r in self.reps.values():
            if r.desired and r.state == "ready":
                r.replaces = None
        seen.append(self.ready())
        # Placement: one card each, oldest request first.
        used = sum(r.placed for r in self.reps.values())
        blocked = []
        for r in sorted(self.reps.values(), key=lambda r: r.id):
            if r.desired and not r.placed:
                if used < self.room:
                    r.placed, r.version = True, self.version
                    used += 1
                elif r.replaces in self.reps and self.reps[r.replaces].placed:
                    blocked.append(r.id)  # it would fit in the room of what it replaces
        stops, _ = plan.make_room(wants, self.views(), blocked)
        self.stop([rid for rid, _ in stops])
        seen.append(self.ready())
        # The agents: stopping engines go, placed ones come up after their delay.
        for r in list(self.reps.values()):
            if not r.desired:
                self.delete(r.id)
            elif r.placed and r.state != "ready":
                r.wait -= 1
                r.state = "ready" if r.wait <= 0 else "loading"
        seen.append(self.ready())
        return seen


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 4),
    spare=st.integers(0, 5),
    delays=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    later=st.integers(1, 4),
    rolls=st.integers(1, 2),
)
def test_property_a_roll_ends_with_only_current_replicas_and_never_goes_dark(
    count: int, spare: int, delays: list[int], later: int, rolls: int
) -> None:
    toy = Toy(room=count + spare, delays=delays)
    want = Want(count, f"window weekdays 08:00-18:00: min {count}")
    for _ in range(20):
        toy.tick(want)
    assert toy.ready() == count
    for _ in range(rolls):
        toy.version += 1
        toy.roll()
        seen = []
        for _ in range(60):
            seen += toy.tick(want)
        if count >= 2:
            assert min(seen) >= 1, seen
        # The roll finished: only replicas of the current definition, as many as wanted.
        assert all(r.version == toy.version for r in toy.reps.values()), toy.reps
        assert [r.state for r in toy.reps.values()] == ["ready"] * count
        assert all(r.replaces is None for r in toy.reps.values())
    # A later change of count during nothing in particular still converges.
    want = replace(want, count=later)
    for _ in range(30):
        toy.tick(want)
    assert toy.ready() == min(later, toy.room)
