"""The reconciler's last tick: recorded each tick, shown in the API and on the dashboard,
with a warning when it is past a few intervals (cluster.marks)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from cluster import marks, reconciler
from cluster.models import ControlMark

pytestmark = pytest.mark.django_db

T = datetime(2026, 11, 30, 12, tzinfo=ZoneInfo("UTC"))


def test_each_tick_records_when_and_which_process(settings: Any) -> None:
    settings.LLMGW_RECONCILE_INTERVAL = 5
    assert marks.tick_status().warning.startswith("the reconciler has not run yet")
    reconciler.tick(T)
    mark = ControlMark.objects.get(kind="tick")
    assert "pid" in mark.by and (timezone.now() - mark.at).total_seconds() < 60
    status = marks.tick_status()
    assert not status.stale and status.age_s is not None and status.age_s < 60
    # Past a few intervals (3 × 5 s): a warning naming who ran it last and what to check.
    old = marks.tick_status(now=mark.at + timedelta(seconds=16))
    assert old.stale and f"last by {mark.by}" in old.warning and "16 s" in old.warning
    assert not marks.tick_status(now=mark.at + timedelta(seconds=14)).stale


def test_the_api_says_when_the_reconciler_last_ran_and_warns_when_it_stopped(
    client_for: Any, viewer: Any, settings: Any
) -> None:
    settings.LLMGW_RECONCILE_INTERVAL = 5
    c = client_for(viewer)
    body = c.get("/api/v1/cluster/status/").json()
    assert body["reconciler"]["last_tick"] is None and body["reconciler"]["stale"]
    marks.ticked("worker on h1 (pid 7)", at=timezone.now() - timedelta(seconds=45))
    body = c.get("/api/v1/cluster/status/").json()["reconciler"]
    assert body["by"] == "worker on h1 (pid 7)" and body["stale"]
    assert 44 <= body["age_s"] <= 60 and "worker on h1 (pid 7)" in body["warning"]
    marks.ticked("worker on h1 (pid 7)")
    body = c.get("/api/v1/cluster/status/").json()["reconciler"]
    assert not body["stale"] and body["warning"] == ""


def test_the_api_status_needs_a_role(client: Any) -> None:
    assert client.get("/api/v1/cluster/status/").status_code in (401, 403)
    assert client.get("/cluster/reconciler/").status_code in (302, 403)


def test_the_dashboard_shows_the_last_tick_and_polls_it(
    client_for: Any, viewer: Any, settings: Any
) -> None:
    settings.LLMGW_RECONCILE_INTERVAL = 5
    c = client_for(viewer)
    marks.ticked("worker on h1 (pid 7)", at=timezone.now() - timedelta(seconds=2))
    page = c.get("/cluster/").content.decode()
    assert 'id="cluster-reconciler"' in page and 'hx-get="/cluster/reconciler/"' in page
    assert "by worker on h1 (pid 7)" in page and 'data-stale="false"' in page
    marks.ticked("worker on h1 (pid 7)", at=timezone.now() - timedelta(seconds=45))
    fragment = c.get("/cluster/reconciler/").content.decode()
    assert 'data-stale="true"' in fragment and "has not run for 45 s" in fragment


def test_cluster_status_says_when_the_reconciler_last_ran(settings: Any) -> None:
    import io
    import re

    from django.core.management import call_command

    settings.LLMGW_RECONCILE_INTERVAL = 5
    out = io.StringIO()
    call_command("cluster", "reconcile", stdout=out)
    call_command("cluster", "status", stdout=out)
    # Who ran it: this process, by the role it started as (another test in the same
    # process may have started it as a web process).
    pid = os.getpid()
    assert re.search(
        rf"reconciler: last tick \d+ s ago by [a-z ]+ on \S+ \(pid {pid}\)", out.getvalue()
    )
    marks.ticked("worker on h1 (pid 7)", at=timezone.now() - timedelta(seconds=60))
    call_command("cluster", "status", stdout=out)
    assert "reconciler: the reconciler has not run for 60 s" in out.getvalue()
