"""The fault suite's fixtures: production behind proxies (tests/e2e/faultplane.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.e2e.faultplane import FaultPlane
from tests.e2e.test_faults import Redis
from tests.faultproxy import FaultProxy

pytestmark = [pytest.mark.e2e]


@contextlib.contextmanager
def running_plane(tmp_path: Path, **extra: str) -> Iterator[FaultPlane]:
    """Production behind proxies, started, every process with ``extra`` in its environment;
    stopped after."""
    db = connection.settings_dict
    redis = Redis(tmp_path)
    redis.start()
    pg = FaultProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
    rp = FaultProxy(("127.0.0.1", redis.port)).start()
    plane = FaultPlane(tmp_path, pg=pg, redis=rp, extra=extra)
    try:
        plane.start_all()
        yield plane
    finally:
        pg.heal()
        rp.heal()
        plane.stop_all()
        pg.stop()
        rp.stop()
        redis.stop()


@pytest.fixture
def fault_plane(transactional_db: Any, tmp_path: Path) -> Iterator[FaultPlane]:
    """Production behind proxies: web, worker, beat and two gateways, started."""
    with running_plane(tmp_path) as plane:
        yield plane


@pytest.fixture
def control_plane(fault_plane: FaultPlane) -> FaultPlane:
    """The ``agents`` fixture joins agents to the web process of the fault plane."""
    return fault_plane
