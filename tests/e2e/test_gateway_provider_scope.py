"""An external provider reached only within a key's scope, with a key file from the secrets
folder only, through a real ``manage.py gateway serve`` process
and the ``openai`` client; the provider is a real HTTP server that counts what reaches it.

Before, a key that could not name external models reached the provider through the
fallback of a model with no room, and a key file of several lines went out as extra
headers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog import services as catalog_services
from catalog import spec
from catalog.choices import Surface
from cluster.models import Replica
from gateway import services as key_services
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import wait_for
from tests.e2e.test_gateway_serve import serving, started

pytestmark = pytest.mark.e2e

ACTOR = catalog_services.Actor(user=None, surface=Surface.CLI, name="test")


class Provider(ThreadingHTTPServer):
    """A fake OpenAI-compatible provider: every request's headers and body are kept."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: Provider

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        self.server.seen.append((dict(self.headers.items()), body))
        answer = json.dumps({
            "id": "p", "object": "chat.completion", "created": 1, "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "from the provider"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def provider() -> Iterator[Provider]:
    server = Provider()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_scope_and_key_file_hold_through_a_gateway_process(
    transactional_db: Any, tmp_path: Path, provider: Provider, settings: Any
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "openai").write_text("sk-provider\n")
    settings.LLMGW_SECRETS_DIR = str(secrets)  # the catalog's check, in this process
    # A plain http:// provider only at the host and port the operator lists.
    listed = provider.url.split("//", 1)[1].split("/")[0]
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [listed]
    cloud = spec.Model(name="cloud", source="cloud", external=spec.External(
        url=provider.url, model="gpt-x", api_key_file="openai"))  # fmt: skip
    catalog_services.save_model(cloud, ACTOR)
    store(sim_model("local", tp=None, fallbacks=["cloud"]))
    # No node has room for the local model.
    Replica.objects.create(model_name="local", state="pending", unplaced=True,
                           reason="no node has nvidia-h100-80gb cards")  # fmt: skip
    _, everything = key_services.create_key("cluster-only")  # every cluster model
    _, listing = key_services.create_key("listing", models=["local", "cloud"])
    with serving(tmp_path, "--port", "0", LLMGW_SECRETS_DIR=str(secrets),
                 LLMGW_EXTERNAL_HTTP_HOSTS=listed) as running:  # fmt: skip
        url = started(running).group(1)

        def ask(key: str) -> str:
            client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)
            answer = client.chat.completions.create(
                model="local", messages=[{"role": "user", "content": "a private prompt"}])  # fmt: skip
            return answer.choices[0].message.content or ""

        # The key that lists the provider is served by it, with the key file's one line.
        assert wait_for(lambda: _or_none(ask, listing), 60, "the gateway's table") == (
            "from the provider"
        )
        headers, body = provider.seen[-1]
        assert headers["Authorization"] == "Bearer sk-provider" and body["model"] == "gpt-x"
        # A key that may not name external models: no room, and nothing reaches the provider.
        for _ in range(3):
            with pytest.raises(openai.APIStatusError) as caught:
                ask(everything)
            assert caught.value.status_code == 503 and "no room" in caught.value.message
        assert len(provider.seen) == 1
        # A key file rewritten into two lines: refused, the provider not asked.
        (secrets / "openai").write_text("sk-provider\nX-Injected: yes\n")
        with pytest.raises(openai.APIStatusError) as caught:
            ask(listing)
        assert caught.value.status_code == 502 and "was not asked" in caught.value.message
        assert len(provider.seen) == 1
        assert "not one line of visible ASCII" in running.output()[1]


def _or_none(ask: Any, key: str) -> str | None:
    try:
        return ask(key)
    except openai.APIStatusError:
        return None
