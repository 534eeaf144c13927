"""``GET /metrics`` as Prometheus meets it: two real gateway processes
(``manage.py serve`` and ``manage.py gateway serve``) sharing one data folder, either
scraped, tell the traffic of both; only a viewer's API token may scrape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.services import create_key
from llmgw_core.models import ApiToken
from tests.e2e.conftest import ControlPlane, wait_for
from tests.e2e.test_gateway import gateway_process

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The processes find their folder from their data folder, not from this one's."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    yield


def requests_of(url: str, token: str, owner: str) -> dict[str, float]:
    scraped = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert scraped.status_code == 200, scraped.text
    assert scraped.headers["content-type"].startswith("text/plain; version=")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(scraped.text):
        for s in family.samples:
            if s.name == "llmgw_gateway_requests_total" and s.labels["owner"] == owner:
                out[s.labels["status"]] = s.value
    return out


def test_either_process_tells_both_and_only_to_a_viewers_token(
    own_folder: None, control_plane: ControlPlane, tmp_path: Path, make_user: Any
) -> None:
    _, key = create_key("scraped", owner="team:metrics")
    _, viewer_token = ApiToken.issue(make_user("prom", "viewer"), "prometheus")
    _, no_role_token = ApiToken.issue(make_user("nobody", None), "nothing")
    with gateway_process(control_plane, tmp_path) as alone:
        web = control_plane.url

        def ask(url: str) -> int:
            return httpx.post(url + "/v1/chat/completions",
                              headers={"Authorization": f"Bearer {key}"},
                              json={"model": "no-such-model", "messages": [
                                  {"role": "user", "content": "hi"}]}).status_code  # fmt: skip

        # The key reaches both processes' tables within a second or so.
        wait_for(lambda: ask(web) == 404 and ask(alone) == 404, 30, "the key in both")
        for _ in range(3):
            assert ask(web) == 404
        for _ in range(2):
            assert ask(alone) == 404
        # 1 + 3 on the web process, 1 + 2 alone: each scrape has the 7 of both.
        assert requests_of(web, viewer_token, "team:metrics") == {"404": 7.0}
        assert requests_of(alone, viewer_token, "team:metrics") == {"404": 7.0}
        # Each process wrote its own files into the data folder's metrics/.
        pids = {f.stem.rsplit("_", 1)[1] for f in (tmp_path / "data" / "metrics").glob("*.db")}
        assert len(pids) >= 2

        for url in (web, alone):
            anonymous = httpx.get(url + "/metrics")
            assert anonymous.status_code == 401 and "API token" in anonymous.text
            assert "llmgw_gateway" not in anonymous.text
            client_key = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"})
            assert client_key.status_code == 401
            no_role = httpx.get(url + "/metrics",
                                headers={"Authorization": f"Bearer {no_role_token}"})  # fmt: skip
            assert no_role.status_code == 403 and "viewer" in no_role.text
            assert httpx.post(url + "/metrics").status_code == 405
