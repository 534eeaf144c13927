"""Each replica's engine key: derived, never stored, told to its own node only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import reconciler
from cluster.enginekeys import PREFIX, authorization, engine_key
from tests.catalog.samples import gpu_model, store
from tests.cluster.test_agent_api import H100, joined


@given(st.integers(min_value=1, max_value=2**62), st.integers(min_value=1, max_value=2**62))
def test_each_replica_has_its_own_key_and_each_secret_its_own_keys(a: int, b: int) -> None:
    ka = engine_key(a, "s1")
    assert ka == engine_key(a, "s1") and ka.startswith(PREFIX)
    # Long enough to guess never (256 bits), and only URL-safe characters (a header value).
    assert (
        len(ka) == len(PREFIX) + 43
        and ka[len(PREFIX) :].replace("-", "").replace("_", "").isalnum()
    )
    assert engine_key(a, "s2") != ka
    assert (engine_key(b, "s1") == ka) == (a == b)


def test_the_settings_secret_key_is_the_default(settings: pytest.FixtureRequest) -> None:
    settings.SECRET_KEY = "one"  # type: ignore[attr-defined]
    assert engine_key(7) == engine_key(7, "one")
    assert authorization(7) == f"Bearer {engine_key(7, 'one')}"
    settings.SECRET_KEY = "two"  # type: ignore[attr-defined]
    assert engine_key(7) == engine_key(7, "two") != engine_key(7, "one")


@pytest.mark.django_db
def test_the_desired_list_gives_each_replica_its_key_and_only_to_its_node() -> None:
    a, _ = joined("a", [H100, H100])
    b, _ = joined("b", [])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    (rep,) = a.get("/api/v1/agent/desired").json()["replicas"]
    assert rep["engine_key"] == engine_key(rep["id"])
    assert b.get("/api/v1/agent/desired").json()["replicas"] == []
