"""Issue 11 items 2-4: a node's identity, engine arguments and environment, weights sources.

The takeover is tried as it was found: over real HTTP against a real ``manage.py serve``,
with a real agent beside it that must keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cluster.models import JoinToken, Node, Replica
from tests.catalog.samples import sim_model, store
from tests.cluster.helpers import inventory
from tests.e2e.conftest import Agent, ControlPlane, agents, control_plane, engine_auth, wait_for

# The e2e fixtures, for this module's real processes.
__all__ = ("agents", "control_plane")

H100 = "nvidia-h100-80gb"


def _operator_headers() -> dict[str, str]:
    from django.contrib.auth.models import Group, User

    from llmgw_core.models import ApiToken

    user = User.objects.create_user("ops", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    _, secret = ApiToken.issue(user, "security")
    return {"Authorization": f"Bearer {secret}"}


def _ready(model: str) -> Replica | None:
    return Replica.objects.filter(model_name=model, desired=True, state="ready").first()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_join_token_cannot_take_over_a_node_and_the_real_agent_keeps_working(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    agent = agents("sim-1", "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    node = wait_for(lambda: Node.objects.filter(name="sim-1", health="ready").first(), 60, "sim-1")
    digest = node.token_digest
    store(sim_model("judge"))
    replica = wait_for(lambda: _ready("judge"), 90, "the judge's replica ready")
    # The endpoint is where the control plane heard the agent from, not what it claims.
    assert replica.endpoint.startswith("http://127.0.0.1:"), replica.endpoint

    # A join token made for another rack, used by someone who is not sim-1's agent.
    _, other = JoinToken.issue("rack 9", max_uses=5)
    claim = inventory([H100], hostname="attacker.example")
    join = f"{control_plane.url}/api/v1/agent/join"
    r = httpx.post(join, json={"token": other, "name": "sim-1", "inventory": claim}, timeout=10)
    assert r.status_code == 409, r.text
    assert "release" in r.json()["detail"] and "node_token" not in r.json()
    # A forged node token beside it proves nothing either.
    r = httpx.post(
        join,
        json={"token": other, "name": "sim-1", "inventory": claim},
        headers={"Authorization": "Bearer llmgw_node_forged"},
        timeout=10,
    )
    assert r.status_code == 409, r.text
    node.refresh_from_db()
    assert node.token_digest == digest and node.hostname != "attacker.example"

    # A new name is what a join token is for; its claimed host name reaches nothing.
    r = httpx.post(join, json={"token": other, "name": "rogue", "inventory": claim}, timeout=10)
    assert r.status_code == 201, r.text
    rogue = Node.objects.get(name="rogue")
    assert rogue.hostname == "attacker.example" and rogue.host == "127.0.0.1"
    # ... and it cannot speak for sim-1's replica.
    r = httpx.post(
        f"{control_plane.url}/api/v1/agent/report",
        json={"reports": [{"replica": replica.pk, "state": "ready", "port": 1}]},
        headers={"Authorization": f"Bearer {r.json()['node_token']}"},
        timeout=10,
    )
    assert r.status_code == 403, r.text

    # The real agent was never locked out: it keeps heartbeating and serving.
    seen = Node.objects.get(name="sim-1").last_heartbeat
    wait_for(lambda: Node.objects.get(name="sim-1").last_heartbeat > seen, 30, "sim-1's heartbeats")
    replica.refresh_from_db()
    assert replica.state == "ready" and replica.endpoint.startswith("http://127.0.0.1:")
    answer = httpx.post(
        replica.endpoint + "/v1/chat/completions",
        json={"model": "judge", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=engine_auth(replica.pk),
        timeout=10,
    )
    assert answer.status_code == 200

    # Restarted, the agent is sim-1 again with the node token it kept: no join at all.
    agent.kill()
    agents("sim-1", "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    seen = Node.objects.get(name="sim-1").last_heartbeat
    wait_for(
        lambda: Node.objects.get(name="sim-1").last_heartbeat > seen, 30, "the restarted agent"
    )
    assert Node.objects.get(name="sim-1").token_digest == digest

    # An operator releases the name: the next join takes it (here the agent itself).
    ops = _operator_headers()
    r = httpx.post(
        f"{control_plane.url}/api/v1/cluster/nodes/sim-1/release/", headers=ops, timeout=10
    )
    assert r.status_code == 200, r.text
    from cluster.models import ClusterAction

    assert ClusterAction.objects.filter(
        action="release", target="node sim-1", actor_name__startswith="ops"
    ).exists()
    wait_for(
        lambda: (n := Node.objects.get(name="sim-1")).token_digest not in (None, digest)
        and n.health == "ready",
        30,
        "sim-1's agent joined again after the release",
    )
    wait_for(lambda: _ready("judge"), 60, "the judge ready again")


@pytest.mark.django_db(transaction=True)
def test_release_and_address_need_an_operator(api_for: Any, viewer: Any, operator: Any) -> None:
    from tests.cluster.helpers import join_node

    join_node("gpu-1", [H100])
    for action, body in (("release", {}), ("address", {"address": "10.0.0.7"})):
        url = f"/api/v1/cluster/nodes/gpu-1/{action}/"
        assert api_for(viewer).post(url, body, format="json").status_code == 403
    r = api_for(operator).post(
        "/api/v1/cluster/nodes/gpu-1/address/", {"address": "not an address!"}, format="json"
    )
    assert r.status_code == 400 and "address" in r.json()["errors"]
    r = api_for(operator).post(
        "/api/v1/cluster/nodes/gpu-1/address/", {"address": "10.0.0.7"}, format="json"
    )
    assert r.status_code == 200 and r.json()["allowed_address"] == "10.0.0.7"
    assert Node.objects.get(name="gpu-1").host == "10.0.0.7"


# -- item 3: engine arguments and environment ---------------------------------------------

# What the probe passed, by engine: each must be refused by the catalog's rules at the
# profile's args (or its env key) and by the agent when it builds the command line.
BAD_ARGS = {
    "llamacpp": [
        ["--log-file", "/etc/cron.d/x"],
        ["-a", "judge"],
        ["-mu", "http://10.0.0.9/x.gguf"],
        ["--model-url", "http://10.0.0.9/x.gguf"],
        ["-hf", "org/repo"],
        ["--hf-repo", "org/repo"],
        ["--api-key", "k"],
        ["--api-key-file", "/etc/shadow"],
        ["--chat-template-file", "/etc/shadow"],
        ["--path", "/"],
        ["--slot-save-path", "/tmp"],
        ["--mod", "/etc/shadow"],
        ["--mmproj", "/etc/shadow"],
        ["--ctx-size", "1", "--ctx-size", "2"],
    ],
    "vllm": [
        ["--ho", "0.0.0.0"],
        ["--hos=0.0.0.0"],
        ["--mod", "x"],
        ["--tensor-parallel", "2"],
        ["--api-key", "k"],
        ["--download-dir", "/etc"],
        ["--chat-template", "/etc/shadow"],
        ["--middleware", "os.system"],
        ["--speculative-config", '{"model": "/etc/shadow", "num_speculative_tokens": 3}'],
        ["8192"],
    ],
    "sglang": [["--api-key", "k"], ["--tp-s", "2"], ["--model", "x"], ["--log-requests-level"]],
    "trtllm": [["--tp", "2"], ["--extra_llm_api_options", "/etc/shadow"], ["--tokenizer", "/"]],
    "sim": [["--mod", "x"], ["--guard-format", "llamaguard3"], ["--po", "1"], ["--model=judge"]],
}
BAD_ENV = [
    "BASH_ENV",
    "ENV",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONINSPECT",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "VLLM_PLUGINS",
    "VLLM_API_KEY",
    "LLMGW_SECRET_KEY",
    "LLMGW_DATABASE_URL",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "NCCL_DEBUG_FILE",
    "NCCL_NET_PLUGIN",
    "LLAMA_ARG_LOG_FILE",
    "LLAMA_ARG_API_KEY",
    "SSL_CERT_FILE",
    "HTTPS_PROXY",
]
# Every flag the agent sets, and others the probe named, whose prefixes an engine's argparse
# takes for them: none may pass, written whole or cut short, with or without a value.
REFUSED = {
    "llamacpp": ["--host", "--port", "--model", "--alias", "--threads", "--lora", "--log-file",
                 "--api-key", "--model-url", "--hf-repo", "--lora-scaled"],
    "vllm": ["--host", "--port", "--model", "--served-model-name", "--tensor-parallel-size",
             "--pipeline-parallel-size", "--api-key", "--download-dir", "--chat-template"],
    "sglang": ["--host", "--port", "--model-path", "--served-model-name", "--tp-size",
               "--pp-size", "--nnodes", "--node-rank", "--dist-init-addr", "--api-key"],
    "trtllm": ["--host", "--port", "--tp_size", "--pp_size", "--served_model_name",
               "--tokenizer"],
    "sim": ["--host", "--port", "--model", "--guard-format", "--guard-categories"],
}  # fmt: skip
# Flags an operator may pass that begin with a refused flag's prefix: those prefixes are
# exact names, and pass.
EXACT = {"--ctx-size", "--mlock", "--metrics", "--max-model-len", "--max-num-seqs"}


def _profile(engine: str, **extra: Any) -> dict[str, Any]:
    gpu = "" if engine == "llamacpp" else H100
    return {"name": "p", "engine": engine, "gpu_class": gpu, "tp": 1, **extra}


def _problems_at(engine: str, **extra: Any) -> list[tuple[Any, ...]]:
    from catalog import codec, rules

    data = {"name": "m", "source": "org/m", "profiles": [_profile(engine, **extra)]}
    m, decode = codec.decode_model(data)
    assert not decode
    return [p.path for p in rules.check_model(m)]


def _agent_refuses(engine: str, **extra: Any) -> bool:
    from agent.engines import CommandError, command_for

    replica = {"id": 1, "model": "m", "engine": engine, "cards": [0], **extra}
    try:
        command_for(replica, 8000, "/w/m.gguf", {"llama-server": "llama-server"})
    except CommandError:
        return True
    return False


@pytest.mark.parametrize(
    ("engine", "args"), [(e, a) for e, cases in BAD_ARGS.items() for a in cases]
)
def test_each_bad_argument_is_refused_at_the_field_and_by_the_agent(
    engine: str, args: list[str]
) -> None:
    assert ("profiles", 0, "args") in _problems_at(engine, args=args)
    assert _agent_refuses(engine, args=args)


@pytest.mark.parametrize("engine", list(BAD_ARGS))
@pytest.mark.parametrize("key", BAD_ENV)
def test_each_bad_variable_is_refused_at_its_key_and_by_the_agent(engine: str, key: str) -> None:
    assert ("profiles", 0, "env", key) in _problems_at(engine, env={key: "1"})
    assert _agent_refuses(engine, env={key: "1"})


@st.composite
def _cut_flags(draw: st.DrawFn) -> tuple[str, list[str]]:
    engine = draw(st.sampled_from(sorted(REFUSED)))
    flag = draw(st.sampled_from(REFUSED[engine]))
    cut = flag[: draw(st.integers(3, len(flag)))]
    assume(cut not in EXACT)
    form = draw(st.sampled_from(["alone", "equals", "separate"]))
    value = draw(st.sampled_from(["1", "x", "/etc/shadow", "0.0.0.0"]))
    args = {"alone": [cut], "equals": [f"{cut}={value}"], "separate": [cut, value]}[form]
    return engine, args


@settings(max_examples=300, deadline=None)
@given(case=_cut_flags())
def test_no_prefix_of_a_refused_flag_passes(case: tuple[str, list[str]]) -> None:
    from agent.engines import unsafe_args

    engine, args = case
    assert unsafe_args(engine, args) is not None
    assert _agent_refuses(engine, args=args)


@settings(max_examples=200, deadline=None)
@given(
    engine=st.sampled_from(sorted(REFUSED)),
    short=st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=3),
    value=st.sampled_from(["", "=1", "=/etc/shadow"]),
)
def test_no_short_form_passes(engine: str, short: str, value: str) -> None:
    """A short form passes only where it is one of the engine's own allowed names,
    written as the engine reads it (none takes "-x=value")."""
    from agent.engines import unsafe_args
    from agent.flags import kinds, table

    flag = table(engine).flags.get(f"-{short}")
    allowed = flag is not None and f"-{short}" not in kinds(engine)
    args = [f"-{short}{value}"] + (["1"] if flag is not None and flag.value != "none" else [])
    if allowed and not value:
        assert unsafe_args(engine, args) is None
    else:
        assert unsafe_args(engine, args) is not None


@pytest.mark.django_db
def test_the_demo_catalog_and_the_test_fixtures_stay_valid() -> None:
    from django.conf import settings as django_settings

    from catalog import codec, rules
    from llmgw_admin import demo
    from tests.catalog.samples import cpu_model, gpu_model

    classes = demo.gpu_classes(demo.parse_simulate(django_settings.SIMULATE_EMBEDDED))
    for m in demo.demo_models(classes):
        assert rules.check_model(m) == [], m.name
    for data in (gpu_model(), cpu_model()):
        m, problems = codec.decode_model(data)
        assert problems == [] and rules.check_model(m) == []


# -- item 4: weights sources --------------------------------------------------------------


class _Listener:
    """A real open port that counts the connections made to it."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import contextlib

        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()


def _refusal(source: str, folder: Any, **kw: Any) -> Any:
    from agent import weights

    with pytest.raises(weights.WeightsError) as info:
        weights.resolve(source, "llamacpp", folder, **kw)
    assert info.value.retry is False
    return info.value


def test_a_local_source_outside_the_weights_folders_is_refused_unread(tmp_path: Any) -> None:
    from agent import weights

    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "ok.gguf").write_bytes(b"gguf")
    secret = tmp_path / "secret"
    secret.write_text("root:x")
    (folder / "link.gguf").symlink_to(secret)
    assert weights.resolve(str(folder / "ok.gguf"), "llamacpp", folder) == str(folder / "ok.gguf")
    said = {
        _refusal(src, folder).summary
        for src in (
            "/etc/shadow",
            "/etc/no-such-file",
            str(secret),
            str(tmp_path / "missing"),
            str(folder / "link.gguf"),
            str(folder / ".." / "secret"),
            "../secret",
            "~/.ssh/id_rsa",
        )
    }
    # One answer, whether the file exists or not: nothing for a probe to tell apart.
    assert said == {"the weights source is outside this node's weights folders"}
    # A folder the agent was given (--weights-folder) is one too.
    assert weights.resolve(str(secret), "llamacpp", folder, folders=[folder, tmp_path])


def test_a_url_of_an_origin_not_allowed_is_refused_without_connecting(tmp_path: Any) -> None:
    from tests.e2e.conftest import free_port

    listener = _Listener()
    closed = free_port()
    open_url = f"http://127.0.0.1:{listener.port}/x.gguf"
    closed_url = f"http://127.0.0.1:{closed}/x.gguf"
    said = {
        _refusal(url, tmp_path).summary
        for url in (open_url, closed_url, "file:///etc/shadow", "ftp://10.0.0.1/x.gguf")
    }
    assert said == {"the weights source is a URL this node does not fetch from"}
    assert listener.accepted == 0
    # Allowed, the same port is fetched from; another port of the host is not.
    refused_port = _refusal(closed_url, tmp_path, hosts=[f"http://127.0.0.1:{listener.port}"])
    assert "not one of the agent's --weights-hosts" in refused_port.detail
    assert listener.accepted == 0


def test_a_real_refused_port_fails_as_a_download_saying_no_more_to_viewers(tmp_path: Any) -> None:
    from agent import weights
    from cluster import reasons
    from tests.e2e.conftest import free_port

    closed = free_port()
    url = f"http://127.0.0.1:{closed}/x.gguf"
    with pytest.raises(weights.WeightsError) as info:
        weights.resolve(url, "llamacpp", tmp_path, hosts=[f"http://127.0.0.1:{closed}"])
    assert info.value.retry is True
    shown = reasons.public(str(info.value))
    assert shown == "downloading the weights failed"
    assert str(closed) not in shown and "refused" not in shown.lower()
    assert str(closed) in str(info.value)  # the operator's detail


@pytest.mark.django_db
def test_replica_reasons_by_role_on_the_api_and_the_console(
    api_for: Any, client_for: Any, viewer: Any, operator: Any, tmp_path: Any
) -> None:
    from rest_framework.test import APIClient

    from agent import weights
    from cluster import reconciler
    from tests.catalog.samples import gpu_model
    from tests.cluster.helpers import join_node

    _, token = join_node("gpu-1", [H100, H100])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    replica = Replica.objects.get()
    # What an agent reports when the source is outside its folders (the real error).
    try:
        weights.resolve("/etc/shadow", "vllm", tmp_path)
    except weights.WeightsError as exc:
        reason = str(exc)
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"reports": [{"replica": replica.pk, "state": "failed", "reason": reason}]}
    assert agent.post("/api/v1/agent/report", body, format="json").status_code == 200

    summary = "the weights source is outside this node's weights folders"
    seen = api_for(viewer).get(f"/api/v1/cluster/replicas/{replica.pk}/").json()
    assert seen["reason"] == summary
    assert seen["assignments"][0]["reason"] == summary
    assert "/etc/shadow" not in str(seen)
    ops = api_for(operator).get(f"/api/v1/cluster/replicas/{replica.pk}/").json()
    assert ops["reason"] == summary
    assert "/etc/shadow" in ops["assignments"][0]["reason"]
    page = client_for(viewer).get("/cluster/").content.decode()
    assert summary.replace("'", "&#x27;") in page and "/etc/shadow" not in page
