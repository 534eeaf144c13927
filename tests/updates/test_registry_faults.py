"""The registry away, then hung, then back, through a proxy in front of the Hub stand-in:
an update check says ``error`` with the reason in its own time, changes nothing in the
catalog, and is ``current`` again once the registry answers (no restart, no state kept
from the fault)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from catalog.services import stored_specs
from tests.faultproxy import fault_proxy
from tests.updates.hubstandin import HubStandIn
from tests.updates.test_check import BASE, _mirrored
from updates import checking, registry

pytestmark = pytest.mark.django_db


def test_a_registry_away_or_hung_is_an_error_that_changes_nothing_and_then_current(
    hub: HubStandIn, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mirrored(hub, BASE)
    before = stored_specs(names=["chat"])[0]
    where = urlsplit(hub.url)
    monkeypatch.setattr(registry, "TIMEOUT_S", 1.0)  # 20 s in production
    with fault_proxy((where.hostname, where.port)) as proxy:
        settings.HF_ENDPOINT = f"http://{proxy.address}"
        [r] = checking.check_models(["chat"])
        assert r.state == "current", r.message
        for fault in ("refuse", "hang"):
            getattr(proxy, fault)()
            [r] = checking.check_models(["chat"])
            assert r.state == "error", (fault, r)
            assert "did not answer" in r.message and proxy.address in r.message, r.message
            assert stored_specs(names=["chat"])[0] == before
            proxy.heal()
            [r] = checking.check_models(["chat"])
            assert r.state == "current", (fault, r.message)
