"""No import circle across the files of ``updates/``: every import, at module level or in a
function, points one way (the tasks call the mirror and the flow, which reach the workers
through them, set as the app starts; the mirror's modules build on one another, ``store``
first)."""

from __future__ import annotations

from tests.circles import circles, graph
from updates import run, tasks
from updates.mirror import fetches


def test_the_search_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_walk_reads_every_module_a_from_import_names() -> None:
    # ``from updates import checking, flow, mirror, registry``: each, not the first alone.
    assert {"updates.flow", "updates.mirror", "updates.registry"} <= graph("updates")["updates.run"]


def test_no_import_circle_across_the_files_of_updates() -> None:
    assert circles(graph("updates")) == []


def test_the_mirror_and_the_flow_reach_the_workers_through_their_tasks() -> None:
    assert fetches.to_worker == tasks.fetch_into_mirror.delay
    assert run.eval_to_worker == tasks.run_update_eval.delay
