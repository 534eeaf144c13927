"""A model switched off (min 0, max 0, the admin's "Switch off"): ``gateway.path.table``'s pure
``switched_off`` and the listing. The process's answer (503 at once, no retry by the
``openai`` client) is held in ``tests/e2e/test_gateway_switched_off.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from catalog import codec, spec
from gateway.path.table import Key, ReplicaRow, build, switched_off
from tests.catalog.samples import sim_model

# A Wednesday.
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NIGHT = datetime(2026, 12, 2, 23, 0, tzinfo=UTC)


def _model(name: str, lo: int, hi: int, *windows: dict[str, Any]) -> spec.Model:
    m, problems = codec.decode_model(
        sim_model(name, lo, most=hi, tp=None, schedule=list(windows), aliases=[f"{name}-alias"])
    )
    assert not problems, problems
    return m


def test_min_0_max_0_is_switched_off_and_says_so() -> None:
    assert switched_off(_model("m", 0, 0), NOON) == "switched off (its scaling: min 0, max 0)"


def test_on_demand_and_fixed_models_are_not() -> None:
    assert switched_off(_model("m", 0, 1), NOON) == ""
    assert switched_off(_model("m", 1, 1), NOON) == ""


def test_a_schedule_window_in_force_decides() -> None:
    office = {"days": ["wed"], "from": "08:00", "to": "18:00", "min": 1, "max": 2}
    m = _model("m", 0, 0, office)
    assert switched_off(m, NOON) == ""
    assert switched_off(m, NIGHT) == "switched off (its scaling: min 0, max 0)"
    # A window that switches an always-on model off at night.
    dark = {"days": ["wed"], "from": "22:00", "to": "23:59", "min": 0, "max": 0}
    night_off = _model("n", 1, 1, dark)
    assert switched_off(night_off, NOON) == ""
    # A window's max 0 means the model's own max, here 1.
    assert switched_off(night_off, NIGHT) == ""
    really_off = _model("o", 0, 0, dark)
    assert switched_off(really_off, NIGHT).startswith("switched off (its schedule window wed")


def test_an_external_model_is_never_switched_off() -> None:
    ext = spec.Model(name="cloud", source="cloud", external=spec.External(url="http://x"))
    assert switched_off(ext, NOON) == ""


def test_the_listing_leaves_out_a_switched_off_model_while_no_replica_is_left() -> None:
    key = Key(id=1, name="k", owner="", models=(), expires=None)
    off, on = _model("off", 0, 0), _model("on", 0, 1)
    table = build([off, on], [], {})
    assert [e.name for e in table.listed(key, NOON)] == ["on", "on-alias"]
    # Just switched off, its last replica still ready (it is stopping): still served.
    table = build([off, on], [ReplicaRow(7, "off", "sim", "http://127.0.0.1:1")], {})
    assert [e.name for e in table.listed(key, NOON)] == ["off", "off-alias", "on", "on-alias"]
