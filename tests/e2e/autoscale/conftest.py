"""Load scaling and the capacity bench end to end, as production runs them: the
web process, a Celery worker and beat, two ``gateway serve`` processes, PostgreSQL and
Redis (tests/e2e/faultplane.py), simulated nodes with sim engines that have a capacity,
and openai clients.

Short windows (``LLMGW_SCALE_UP_AFTER``, ``LLMGW_SCALE_DOWN_AFTER``) keep it to minutes;
everything is waited for as an event, with generous bounds.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from cluster.models import ModelScale, Node, Replica
from tests.catalog.samples import sim_model
from tests.e2e.conftest import ROOT, Agent, wait_for
from tests.e2e.faultplane import H100, FaultPlane
from tests.e2e.test_faults import Redis
from tests.faultproxy import FaultProxy

pytestmark = [pytest.mark.e2e]

UP, DOWN = 8, 10
# A stopped replica's engine runs this long after it left the gateways' tables.
DRAIN = 5
L4 = "nvidia-l4-24gb"
# Each request takes the sim about 0.4 s (TTFT 0.3 s, then a few tokens at 20 a second),
# so a client is in flight most of the time: N clients are about N requests in flight.
SLOW = {"LLMGW_SIM_TTFT": "0.3", "LLMGW_SIM_TPS": "20"}
# The first token at once, then the rest slowly: a streamed answer is cut mid-way, not
# retried elsewhere, if its replica's engine stops under it (the sim cuts open streams).
STREAMING = {"LLMGW_SIM_TTFT": "0.05", "LLMGW_SIM_TPS": "3"}


@pytest.fixture
def scaling_plane(transactional_db: Any, tmp_path: Path) -> Iterator[FaultPlane]:
    """Production with short scaling windows (the proxies pass everything through)."""
    db = connection.settings_dict
    redis = Redis(tmp_path)
    redis.start()
    pg = FaultProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
    rp = FaultProxy(("127.0.0.1", redis.port)).start()
    plane = FaultPlane(tmp_path, pg=pg, redis=rp,
                       extra={"LLMGW_SCALE_UP_AFTER": str(UP),
                              "LLMGW_SCALE_DOWN_AFTER": str(DOWN),
                              "LLMGW_STOP_DRAIN": str(DRAIN)})  # fmt: skip
    try:
        plane.start_all()
        yield plane
    finally:
        plane.stop_all()
        pg.stop()
        rp.stop()
        redis.stop()


@pytest.fixture
def control_plane(scaling_plane: FaultPlane) -> FaultPlane:
    """The ``agents`` fixture joins agents to this plane's web process."""
    return scaling_plane


def nodes(agents: Callable[..., Agent], cards: tuple[str, ...] = (f"4x {H100}",) * 2) -> None:
    for i, these in enumerate(cards):
        agents(f"as-{i}", "--simulate", these, "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").count() == len(cards), 60, "the nodes")


def model(name: str, lo: int, hi: int, capacity: int = 2, **extra: Any) -> dict[str, Any]:
    """``samples.sim_model`` answering slowly (``SLOW``), from ``lo`` to ``hi`` replicas,
    idle after 20 s."""
    profile = {"env": dict(SLOW), "capacity": capacity, **extra.pop("profile", {})}
    extra.setdefault("scaling", {"min": lo, "max": hi, "idle_timeout": "20s"})
    return sim_model(name, lo, most=hi, profile=profile, **extra)


def ready(name: str) -> int:
    return Replica.objects.filter(model_name=name, desired=True, state="ready").count()


def wanted(name: str) -> int:
    return Replica.objects.filter(model_name=name, desired=True).count()


def scale(name: str) -> ModelScale | None:
    return ModelScale.objects.filter(model_name=name).first()


def plane_bench(plane: FaultPlane, name: str, profile: str) -> subprocess.CompletedProcess[str]:
    """``manage.py cluster bench``, driving its replica through a gateway process."""
    env = {**plane.env(), "LLMGW_GATEWAY_URL": plane.urls()[0]}
    return subprocess.run(
        [sys.executable, "manage.py", "cluster", "bench", name, "--profile", profile],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
