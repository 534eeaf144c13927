"""Measure the reconciler's whole tick on PostgreSQL: 1,000 and 10,000 nodes x 2,000 models.

    .venv/bin/python bench/reconcile.py [--sizes 1000,10000] [--models 2000] [--ticks 3]

Runs on a throwaway database created on the configured server (tests/settings.py: the
local PostgreSQL unless LLMGW_TEST_DATABASE_URL says otherwise) and drops it after. The
cluster and the catalog are ``bench/placement.py``'s (H100, A100, L4, MIG and CPU nodes in
racks of 20 under power caps; mixed profiles, classes and replica counts), stored as rows:
nodes and cards, rack budgets, and the catalog imported as a file would be. Then
``reconciler.tick`` runs ``--ticks`` times: the first creates every replica and places
what fits (at 1,000 nodes the cluster is short of room: some wait, unplaced; at 10,000
everything fits); each later one is a steady tick, where the catalog is unchanged and
placement is asked again for what waits. Each size has a database of its own.

Each tick prints its parts: the catalog read (rows to specs, normalized), the plan (each
model's wanted count, the replicas created or stopped), the cluster read (nodes, budgets,
replicas as placement sees them), placement (``place_sparing``), the writes (evictions,
placements, the waiting replicas' reasons) and the rest, then how the steady tick grows
from one size to the next. Prints the machine's cores and load first. Asserts nothing
about time.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# Storing 10,000 nodes, or dropping the database after, on a loaded machine may take
# longer than a statement's usual bound.
os.environ.setdefault("LLMGW_DB_STATEMENT_TIMEOUT", "600")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import teardown_test_environment  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench import placement as synthetic  # noqa: E402
from bench import webproc  # noqa: E402

# The parts of a tick, in the order printed, and the functions whose time is theirs.
PARTS = (
    ("catalog read", "fingerprint; specs, normalized, when it changed"),
    ("plan", "wanted counts; replicas created, stopped, rolls finished"),
    ("cluster read", "nodes, budgets and replicas as placement sees them"),
    ("placement", "place_sparing and the evictions' second look"),
    ("writes", "evictions, placements, waiting replicas' reasons"),
)


class Clock:
    """Time spent in wrapped functions, by part: a wrapped call inside another counts
    for its own part, not the caller's."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = collections.defaultdict(float)
        self.inner: list[float] = []

    def wrap(self, owner: Any, name: str, part: str) -> None:
        """Count the time of ``owner.name`` against a part."""
        wrapped: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.inner.append(0.0)
            t = time.perf_counter()
            try:
                return wrapped(*args, **kwargs)
            finally:
                took = time.perf_counter() - t
                nested = self.inner.pop()
                self.spent[part] += took - nested
                if self.inner:
                    self.inner[-1] += took

        setattr(owner, name, timed)

    @contextmanager
    def tick(self) -> Iterator[None]:
        """Start counting a tick afresh."""
        self.spent.clear()
        yield


def counting(count: list[int]) -> Callable[..., Any]:
    """Return a database execute wrapper that counts the queries in ``count[0]``."""

    def wrapper(execute: Callable[..., Any], *args: Any) -> Any:
        count[0] += 1
        return execute(*args)

    return wrapper


def store_cluster(size: int, rng: random.Random) -> None:
    """Store ``size`` nodes (bench/placement.py's), their cards and the racks' budgets."""
    from cluster.choices import NodeHealth
    from cluster.models import Card, FacilityBudget, Node

    now = timezone.now()
    specs = [synthetic.make_node(i, rng) for i in range(size)]
    rows = Node.objects.bulk_create(
        Node(
            name=n.name,
            labels=dict(n.labels),
            cpu_cores=n.cpu_cores,
            memory_mb=n.memory_mb,
            disk_free_mb=n.disk_free_mb,
            engines=dict(n.engines),
            weights=sorted(n.holds),
            health=NodeHealth.READY if n.schedulable else NodeHealth.NOT_READY,
            last_heartbeat=now,
        )
        for n in specs
    )
    Card.objects.bulk_create(
        Card(
            node=row,
            index=c.index,
            gpu_class=c.gpu_class,
            memory_mb=c.memory_mb,
            power_limit_w=c.power_limit_w,
            mig_of=c.mig_of,
        )
        for row, n in zip(rows, specs, strict=True)
        for c in n.cards
    )
    racks = (size + synthetic.RACK_SIZE - 1) // synthetic.RACK_SIZE
    FacilityBudget.objects.bulk_create(
        FacilityBudget(level="rack", name=f"r{r:03d}", cap_watts=60_000 if r % 4 else 20_000)
        for r in range(racks)
    )


def store_catalog(count: int, rng: random.Random) -> None:
    """Import ``count`` catalog models (bench/placement.py's), as a file would be."""
    from catalog import services
    from catalog.choices import Surface

    models = [synthetic.make_model(i, rng) for i in range(count)]
    actor = services.Actor(user=None, surface=Surface.FILE, name="bench")
    services.import_catalog(models, actor)


def instrument(clock: Clock) -> None:
    """Wrap the reconciler's steps so that each part's time is counted."""
    from cluster import desired, placement, reconciler, replace, services

    # The catalog's fingerprint, and its rows read and normalized when it changed.
    clock.wrap(reconciler, "catalog_specs", "catalog read")
    clock.wrap(reconciler, "_scale", "plan")
    clock.wrap(reconciler, "_finish_rolls", "plan")
    clock.wrap(services, "end_drains", "plan")
    clock.wrap(replace, "snapshot", "cluster read")
    clock.wrap(reconciler, "_requests", "placement")
    clock.wrap(placement, "place_sparing", "placement")
    clock.wrap(replace, "spare_evicted", "placement")
    clock.wrap(reconciler, "_make_room", "placement")
    # What _place does beyond the parts above is writing: the reasons of those that wait.
    clock.wrap(reconciler, "_place", "writes")
    clock.wrap(reconciler, "_evict", "writes")
    clock.wrap(reconciler, "_assign", "writes")
    # The reconciler calls it through services; a replica stopped, through desired.
    clock.wrap(services, "bump_desired", "writes")
    clock.wrap(desired, "bump_desired", "writes")
    clock.wrap(reconciler, "_no_room", "writes")


def run(size: int, models: int, ticks: int, clock: Clock) -> float:
    """Store a cluster of ``size`` nodes and the catalog in a throwaway database, run
    and print ``ticks`` ticks; return the last (steady) tick's time."""
    from cluster import reconciler
    from cluster.models import Node, Replica

    old_name, db = webproc.throwaway_database("llmgw_bench_reconcile")
    try:
        rng = random.Random(1)
        t = time.perf_counter()
        store_cluster(size, rng)
        store_catalog(models, rng)
        print(
            f"{size} nodes x {models} models: stored in {time.perf_counter() - t:.1f} s "
            f"(database {connection.vendor} {db})"
        )
        whole = 0.0
        for n in range(1, ticks + 1):
            # Every agent just heard from: a tick slowed by a loaded machine must not
            # find the nodes silent and hold them (cluster.silence).
            Node.objects.update(last_heartbeat=timezone.now())
            queries = [0]
            with clock.tick(), connection.execute_wrapper(counting(queries)):
                t = time.perf_counter()
                result = reconciler.tick()
                whole = time.perf_counter() - t
            waiting = Replica.objects.filter(desired=True, assignments__isnull=True).count()
            kind = "first" if n == 1 else "steady"
            print(
                f"  tick {n} ({kind}): {whole:.3f} s, {queries[0]} queries; "
                f"{sum(result.created.values())} created, {len(result.placed)} placed, "
                f"{len(result.evicted)} evicted, {waiting} waiting"
            )
            counted = 0.0
            for part, what in PARTS:
                spent = clock.spent.get(part, 0.0)
                counted += spent
                print(f"    {part:<13} {spent:7.3f} s  ({what})")
            print(
                f"    {'the rest':<13} {whole - counted:7.3f} s  (leader lock, lost nodes, signals)"
            )
        print(f"reconcile {size} nodes x {models} models, steady tick: {whole:.3f} s")
        return whole
    finally:
        webproc.drop_database(old_name)
        teardown_test_environment()  # the next size sets up its own


def main() -> None:
    """Run the ticks at each size (1,000 nodes, short of room; 10,000, roomy) and print
    them, then how the steady tick grows from one size to the next."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--ticks", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (1, 5, 15 min); Python {sys.version.split()[0]}"
    )
    clock = Clock()
    instrument(clock)
    sizes = [int(s) for s in args.sizes.split(",")]
    steady = {size: run(size, args.models, args.ticks, clock) for size in sizes}
    for a, b in zip(sizes, sizes[1:], strict=False):
        print(
            f"growth {a} -> {b} nodes ({b / a:.0f}x): {steady[b] / steady[a]:.1f}x the steady tick"
        )


if __name__ == "__main__":
    main()
