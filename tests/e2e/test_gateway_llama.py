"""A real llama-server serving SmolLM2 through the gateway: a streamed chat with the
official client, and the context length enforced with the engine's /tokenize, at the size
llama-server really gives a request (--ctx-size shared by --parallel slots)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from cluster.models import Assignment, Node
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, engine_auth, wait_for
from tests.e2e.test_cluster_e2e import _model_file
from tests.e2e.test_gateway import client, new_key, ready
from tests.llama import llama_server_binary

pytestmark = pytest.mark.e2e


@pytest.mark.llama_server
def test_smollm2_streams_through_the_gateway_and_its_context_is_enforced(
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
                      "args": ["--ctx-size", "2048", "--parallel", "2"]}],
        "scaling": {"min": 1, "max": 1},
    })  # fmt: skip
    wait_for(ready("smol"), 180, "llama-server ready")
    api = client(control_plane, new_key(control_plane, "smol-app"), timeout=120)

    # The catalog says 2048; each of llama-server's 2 slots gets 1024, and the gateway
    # says so.
    listed = api.models.retrieve("smol").model_extra or {}
    assert listed["context_length"] == 1024

    parts = []
    for chunk in api.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Say hello in three words."}],
        max_tokens=12, stream=True,
    ):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts).strip()

    # Too long by the bytes alone: refused without asking the engine.
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "hello " * 200_000}], max_tokens=8
        )
    assert caught.value.code == "context_length_exceeded"
    # Between the bounds: llama-server's /tokenize counts it; 1,200 words do not fit a
    # slot's 1,024 tokens, though they fit the catalog's 2,048.
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "hello " * 1200}], max_tokens=8
        )
    assert caught.value.code == "context_length_exceeded"
    assert "1024" in caught.value.message and "slot" in caught.value.message
    # 600 words do: the engine answers.
    fits = api.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "hello " * 600}], max_tokens=4
    )
    assert fits.choices[0].finish_reason in ("length", "stop")

    # llama-server was started with its replica's engine key (from its environment, not
    # its command line): a call straight to its port without it, or with another, is
    # refused; the gateway's (above, /tokenize included) carried it.
    (replica,) = ready("smol")()
    key = engine_auth(replica.pk)["Authorization"].removeprefix("Bearer ")
    proc = Path(f"/proc/{Assignment.objects.get(replica=replica).pid}")
    assert key.encode() not in (proc / "cmdline").read_bytes()
    assert f"LLAMA_API_KEY={key}".encode() in (proc / "environ").read_bytes().split(b"\0")
    chat = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/tokenize", {"content": "hi"})):
        for auth in ({}, {"Authorization": "Bearer llmgw_engine_wrong"}):
            refused = httpx.post(replica.endpoint + path, json=body, headers=auth, timeout=60)
            assert refused.status_code == 401, (path, auth, refused.text)
        good = httpx.post(replica.endpoint + path, json=body, headers=engine_auth(replica.pk),
                          timeout=60)  # fmt: skip
        assert good.status_code == 200, (path, good.text)
    assert httpx.get(replica.endpoint + "/health", timeout=10).status_code == 200
