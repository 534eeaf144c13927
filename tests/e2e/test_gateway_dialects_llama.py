"""The Messages and Responses APIs through the gateway in front of a real llama-server on
the test model: the official ``anthropic`` and ``openai`` clients, streamed and not,
count_tokens, previous_response_id, and the engine's cached tokens on a repeated prefix."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cluster.models import Node
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_cluster_e2e import _model_file
from tests.e2e.test_gateway import client, new_key, ready
from tests.e2e.test_gateway_dialects import claude
from tests.llama import llama_server_binary

pytestmark = pytest.mark.e2e


@pytest.mark.llama_server
def test_both_clients_through_the_gateway_on_llama_server(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    binary = llama_server_binary()
    model = _model_file()
    agents("cpu-1", "--llama-server", binary, "--weights-folder", str(model.parent),
           "--stop-engines-on-exit")  # fmt: skip
    wait_for(lambda: Node.objects.filter(name="cpu-1", health="ready").exists(), 60, "the node")
    store({
        "name": "smol", "source": str(model), "context_length": 2048, "max_output": 256,
        "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2,
                      "args": ["--ctx-size", "2048", "--parallel", "1"]}],
        "scaling": {"min": 1, "max": 1},
    })  # fmt: skip
    wait_for(ready("smol"), 180, "llama-server ready")
    key = new_key(control_plane, "smol-app")

    api = claude(control_plane.url, key)
    system = "You are a helpful assistant who answers in one short sentence. " * 8
    asked = [{"role": "user", "content": "Say hello."}]
    message = api.messages.create(model="smol", max_tokens=12, system=system, messages=asked)
    assert message.content[0].text.strip() and message.usage.output_tokens > 0
    with api.messages.stream(model="smol", max_tokens=12, system=system,
                             messages=asked) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.stop_reason in ("end_turn", "max_tokens")
    # The same prefix again: llama-server read it from its cache.
    assert final.usage.cache_read_input_tokens > 0
    counted = api.messages.count_tokens(model="smol", system=system, messages=asked)
    assert counted.input_tokens > 0

    responses_api = client(control_plane, key, timeout=120)
    first = responses_api.responses.create(model="smol", instructions=system, input="Say hi.",
                                           max_output_tokens=12)  # fmt: skip
    assert first.output_text.strip()
    events = list(responses_api.responses.create(model="smol", instructions=system,
                                                 input="Say hi.", max_output_tokens=12,
                                                 stream=True))  # fmt: skip
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    second = responses_api.responses.create(model="smol", input="Again.", instructions=system,
                                            previous_response_id=first.id,
                                            max_output_tokens=12)  # fmt: skip
    assert second.usage.input_tokens_details.cached_tokens > 0
