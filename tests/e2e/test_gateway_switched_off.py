"""A model an operator switched off (min 0, max 0, the admin's "Switch off"), as a client
meets it through a real ``gateway serve`` process with the official ``openai`` client: not
listed, and a request answered at once with a 503 that says why and that the client does
not retry (``x-should-retry: false``), instead of being held for a replica that never
comes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway import services as key_services
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import wait_for
from tests.e2e.test_gateway_serve import serving, started

pytestmark = pytest.mark.e2e


def test_a_switched_off_model_is_unlisted_and_refused_at_once_without_retries(
    transactional_db: Any, tmp_path: Path
) -> None:
    store(sim_model("dark", 0, most=0, tp=None), sim_model("ondemand", 0, tp=None))
    _, secret = key_services.create_key("everything")
    sent: list[str] = []
    # The client's own transport, counting what it sends (its retries included).
    http = httpx.Client(event_hooks={"request": [lambda r: sent.append(str(r.url))]})
    # A short wake wait: held for a replica, the request would come back a retried 503.
    with serving(tmp_path, "--port", "0", LLMGW_GATEWAY_WAKE_WAIT="3") as running:
        url = started(running).group(1)
        client = openai.OpenAI(base_url=url, api_key=secret, timeout=30, http_client=http)

        def listed() -> list[str] | None:
            try:
                return [m.id for m in client.models.list()]
            except openai.AuthenticationError:
                return None  # the key is not in the process's table yet

        names = wait_for(listed, 60, "the gateway's table")
        assert names == ["ondemand"]
        sent.clear()
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(
                model="dark", messages=[{"role": "user", "content": "hello"}]
            )
        error = caught.value
        assert error.status_code == 503
        assert error.code == "model_switched_off"
        assert "'dark' is switched off (its scaling: min 0, max 0)" in error.message
        assert "until an operator scales it up again" in error.message
        assert error.response.headers["x-should-retry"] == "false"
        assert "retry-after" not in error.response.headers
        # Asked once: the client did not retry what retrying will not help.
        assert len(sent) == 1, sent
