"""No import circle across the files of ``cluster/``: every import, at module level or in a
function, points one way. The tasks call the reconciler and the bench, which reach the
workers through them, and the relay wakes the reconciler through ``cluster.wake``: each set
as the app starts. What stops a replica and changes a node's desired list, or releases
replicas to be placed again (``cluster.desired``), stands below all that call it."""

from __future__ import annotations

from cluster import benchrun, relay, tasks, wake
from tests.circles import circles, graph


def test_no_import_circle_across_the_files_of_cluster() -> None:
    assert circles(graph("cluster")) == []


def test_the_wake_the_bench_and_the_relay_reach_back_through_what_the_app_sets() -> None:
    assert wake.to_worker == tasks.reconcile_cluster.apply_async
    assert benchrun.to_worker == tasks.bench_profile.delay
    assert relay.on_wake is wake.wake
