"""The gateway as a client meets it: the official ``openai`` package against a real
``manage.py serve`` (console and gateway on one port) and a ``manage.py gateway serve``,
real agents and sim engines."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cluster.models import Node, Replica
from guard.models import GuardPolicy
from tests.catalog import samples
from tests.catalog.samples import store
from tests.e2e.conftest import ROOT, Agents, ControlPlane, engine_auth, free_port, wait_for
from tests.e2e.test_cluster_e2e import ready  # noqa: F401 (others import it from here)
from tests.redisserver import url as redis_url
from tests.waiting import budget_minute_with

pytestmark = pytest.mark.e2e

H100 = "nvidia-h100-80gb"
FAST = {"LLMGW_SIM_TTFT": "0.05", "LLMGW_SIM_TPS": "200"}


def sim_model(name: str, **extra: Any) -> dict[str, Any]:
    """``samples.sim_model`` answering quickly (``FAST``), one replica."""
    profile = {"env": dict(FAST), **extra.pop("profile", {})}
    return samples.sim_model(name, profile=profile, **extra)


def manage(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=cp.env(), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


def new_key(cp: ControlPlane, name: str, *args: str) -> str:
    done = manage(cp, "gateway", "key", "create", name, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def client(cp: ControlPlane, key: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=cp.url + "/v1", api_key=key, max_retries=0, **kw)


@pytest.fixture(scope="module")
def shared_cluster(
    module_transactional_db: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """One web process, two agents and the models, for the whole module (started once:
    about a minute on a loaded machine). ``cluster`` puts back what a test changed."""
    cp = ControlPlane(tmp_path_factory.mktemp("gateway-plane"))
    cp.start()
    agents = Agents(cp, cp.tmp)
    try:
        agents("gw-a", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
        agents("gw-b", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
        wait_for(lambda: Node.objects.filter(health="ready").count() == 2, 60, "two nodes")
        store(
            sim_model(
                "chat", description="a chat model for tests", context_length=4096,
                max_output=512, aliases=["chat-latest"], owner="team:tests",
                scaling={"min": 2, "max": 2},
            ),
            sim_model("embed", capabilities={"embeddings": True}, context_length=2048),
            sim_model("judge", role="guard", guard={"format": "qwen3guard"}),
            # A judge no node can run (no node has its class): it never answers.
            sim_model("judge-down", role="guard", guard={"format": "qwen3guard"},
                      profile={"gpu_class": "nvidia-a100-40gb"}),
        )  # fmt: skip
        yield cp
    finally:
        agents.stop()
        cp.stop()


@pytest.fixture
def cluster(shared_cluster: ControlPlane) -> Iterator[ControlPlane]:
    """The module's cluster with every model ready; after the test, the guard's policy
    back to none set (tests set their own) and the web process answering as it did
    before (a text a judge would refuse is answered). Each test's keys have names of
    their own; the test that kills the engines runs last."""
    wait_for(ready("chat", 2), 90, "two chat replicas ready")
    wait_for(ready("embed"), 90, "the embedding model ready")
    wait_for(ready("judge"), 90, "the judge ready")
    yield shared_cluster
    if GuardPolicy.objects.exists():
        GuardPolicy.objects.all().delete()
        api = client(shared_cluster, new_key(shared_cluster, f"policy-back-{next(_BACK)}"))
        wait_for(lambda: _answered(api, "/echo UNSAFE-MARKER back"), 30, "no policy in force")


_BACK = itertools.count()


def _answered(api: openai.OpenAI, text: str) -> bool:
    try:
        answer = api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": text}]
        )
    except openai.BadRequestError:
        return False
    return answer.choices[0].message.content == text.removeprefix("/echo ")


def test_the_openai_client_lists_chats_streams_and_embeds(cluster: ControlPlane) -> None:
    key = new_key(cluster, "app", "--owner", "team:tests")
    assert key.startswith("llmgw-ck-")
    api = client(cluster, key)

    listed = {m.id: m for m in api.models.list()}
    assert {"chat", "chat-latest", "embed"} <= set(listed)
    assert "judge" not in listed  # guard models are never listed
    chat = api.models.retrieve("chat")
    extra = chat.model_extra or {}
    assert extra["description"] == "a chat model for tests"
    assert extra["context_length"] == 4096 and extra["max_output"] == 512
    assert chat.owned_by == "team:tests"

    whole = api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "/echo hello from the gateway"}],
        max_tokens=50,
    )  # fmt: skip
    assert whole.choices[0].message.content == "hello from the gateway"
    assert whole.usage is not None and whole.usage.completion_tokens > 0

    # Streamed, with usage asked for.
    parts, usage = [], None
    for chunk in api.chat.completions.create(
        model="chat-latest", messages=[{"role": "user", "content": "/echo one two three four"}],
        stream=True, stream_options={"include_usage": True},
    ):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(parts) == "one two three four"
    assert usage is not None and usage.completion_tokens >= 4

    # Streamed without: the gateway asked the engine for usage and takes it out again.
    chunks = list(api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "/echo a b"}], stream=True))  # fmt: skip
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "a b"

    text = api.completions.create(model="chat", prompt="/echo plain completion", max_tokens=20)
    assert text.choices[0].text == "plain completion"

    emb = api.embeddings.create(model="embed", input=["first", "second"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 16


def test_each_error_is_the_exception_the_client_raises(cluster: ControlPlane) -> None:
    key = new_key(cluster, "errors")
    api = client(cluster, key)
    with pytest.raises(openai.AuthenticationError):
        client(cluster, "llmgw-ck-not-a-key").models.list()
    with pytest.raises(openai.AuthenticationError):
        client(cluster, "sk-something").chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x"}])  # fmt: skip
    with pytest.raises(openai.NotFoundError) as caught:
        api.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):  # a judge is refused to every key
        api.chat.completions.create(model="judge", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("judge")
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=100000
        )
    assert caught.value.code == "max_tokens_exceeded" and "max_output" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "word " * 10000}], max_tokens=10
        )
    assert caught.value.code == "context_length_exceeded"
    # Between the bounds, the engine's /tokenize decides: the sim counts words.
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "ab " * 3900}], max_tokens=500
        )
    assert caught.value.code == "context_length_exceeded"
    fits = api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "ab " * 1800}], max_tokens=5
    )
    assert fits.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as caught:
        api.embeddings.create(model="chat", input="x")
    assert caught.value.code == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="chat", messages=[])
    assert caught.value.param == "messages"

    # A key with a budget of 2 requests a minute: the third is refused with Retry-After.
    limited = client(cluster, new_key(cluster, "limited", "--rpm", "2"))
    budget_minute_with()
    for _ in range(2):
        limited.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}],
                                        max_tokens=2)  # fmt: skip
    with pytest.raises(openai.RateLimitError) as caught:
        limited.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}],
                                        max_tokens=2)  # fmt: skip
    assert 1 <= int(caught.value.response.headers["retry-after"]) <= 60


def test_a_key_names_only_its_models_and_is_revoked_everywhere(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    key = new_key(cluster, "narrow", "--model", "embed")
    api = client(cluster, key)
    assert [m.id for m in api.models.list()] == ["embed"]
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])

    # A gateway process of its own, beside the web process.
    with gateway_process(cluster, tmp_path) as url:
        alone = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        assert [m.id for m in alone.models.list()] == ["embed"]
        assert manage(cluster, "gateway", "key", "revoke", "narrow").returncode == 0
        for api_ in (api, alone):
            wait_for(lambda a=api_: _refused(a), 3, "the revoked key refused")
        listed = manage(cluster, "gateway", "key", "list").stdout
        assert "narrow\trevoked" in listed and key not in listed


def _refused(api: openai.OpenAI) -> bool:
    try:
        api.models.list()
    except openai.AuthenticationError:
        return True
    return False


class gateway_process:
    """``manage.py gateway serve`` on a port of its own."""

    def __init__(self, cp: ControlPlane, tmp: Path, **env: str) -> None:
        self.cp, self.tmp, self.port, self.extra = cp, tmp, free_port(), env

    def __enter__(self) -> str:
        path = self.tmp / f"gateway-{self.port}.log"
        log = path.open("wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "gateway", "serve", "--port", str(self.port)],
            cwd=ROOT, env={**self.cp.env(), **self.extra}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{self.port}"
        try:
            # Its start is Django's and the application's imports: seconds when quiet, a
            # minute or more on a loaded machine. A process that ended is said at once.
            wait_for(lambda: self.proc.poll() is not None or _answers(url), 180,
                     "the gateway process to answer")  # fmt: skip
            assert self.proc.poll() is None, path.read_text()[-3000:]
        except BaseException as error:
            self.__exit__()  # not left running (and on the database) past its test
            if isinstance(error, AssertionError):
                raise AssertionError(f"{error}\n{path.read_text()[-3000:]}") from None
            raise
        return url

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/models", timeout=1).status_code == 401
    except httpx.HTTPError:
        return False


def sim_stats(replica: Replica) -> dict[str, int]:
    return httpx.get(
        replica.endpoint + "/sim/stats", headers=engine_auth(replica.pk), timeout=5
    ).json()


def test_a_client_that_goes_away_stops_the_engine(cluster: ControlPlane) -> None:
    key = new_key(cluster, "cancel")
    replicas = ready("chat", 2)()
    before = {r.pk: sim_stats(r)["cancelled"] for r in replicas}
    with httpx.Client(base_url=cluster.url, timeout=10) as http, http.stream(
        "POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": "chat", "stream": True, "max_tokens": 400,
              "messages": [{"role": "user", "content": "write at length"}]},
    ) as resp:  # fmt: skip
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "chat.completion.chunk"
    # Closed after the first event: the engine's generation stops.
    wait_for(
        lambda: sum(sim_stats(r)["cancelled"] for r in replicas) > sum(before.values()),
        10, "the engine to see the cancel",
    )  # fmt: skip


def set_policy(cp: ControlPlane, *args: str) -> None:
    done = manage(cp, "guard", "policy", "set", *args)
    assert done.returncode == 0, done.stdout + done.stderr


def stream_raw(cp: ControlPlane, key: str, text: str, **extra: Any) -> tuple[int, str]:
    """A streamed chat as bytes on the wire: the status and everything received."""
    with httpx.Client(base_url=cp.url, timeout=30) as http, http.stream(
        "POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": text}],
              **extra},
    ) as resp:  # fmt: skip
        return resp.status_code, resp.read().decode()


def streamed_text(raw: str) -> str:
    out = []
    for line in raw.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            for choice in event.get("choices") or ():
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def test_the_guard_holds_back_an_unsafe_answer_and_refuses_unsafe_requests(
    cluster: ControlPlane,
) -> None:
    key = new_key(cluster, "guarded")
    api = client(cluster, key)
    # Answers judged only: the request asking for the marker is let through, so the
    # engine's answer carries it.
    set_policy(cluster, "--judges", "judge", "--directions", "answers",
               "--fail", "closed", "--controversial", "safe")  # fmt: skip
    chat = ready("chat", 2)()
    cancelled = sum(sim_stats(r)["cancelled"] for r in chat)

    # An ordinary streamed answer comes through whole, judged in windows.
    words = " ".join(f"word{i}" for i in range(80))
    status, raw = stream_raw(cluster, key, "/echo " + words)
    assert status == 200 and streamed_text(raw) == words and raw.endswith("data: [DONE]\n\n")

    # The marker after many tokens: not one byte of it reaches the client, the stream ends
    # with content_filter and an error naming the judge, and the engine is stopped.
    before = " ".join(f"safe{i}" for i in range(60))
    after = " ".join(f"tail{i}" for i in range(200))
    status, raw = stream_raw(cluster, key, f"/echo {before} UNSAFE-MARKER {after}")
    assert status == 200
    text = streamed_text(raw)
    assert "UNSAFE" not in raw and "MARKER" not in raw
    assert text and before.startswith(text.strip()[: len(text.strip())])
    assert '"finish_reason":"content_filter"' in raw.replace(" ", "")
    assert "content_filter" in raw and "judge" in raw and raw.endswith("data: [DONE]\n\n")
    wait_for(lambda: sum(sim_stats(r)["cancelled"] for r in chat) > cancelled, 10,
             "the engine to see the cancel")  # fmt: skip

    # A whole answer holding the marker is refused before anything is sent.
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "/echo fine then UNSAFE-MARKER"}]
        )
    assert caught.value.code == "content_filter"
    assert caught.value.response.headers["x-should-retry"] == "false"

    # An unsafe request is refused, naming the judge, and none of the engine's answer is sent.
    set_policy(cluster, "--judges", "judge", "--directions", "requests", "answers",
               "--fail", "closed", "--controversial", "safe")  # fmt: skip
    wait_for(lambda: _refused_as_filter(api, "UNSAFE-MARKER please"), 5, "the request refused")
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "UNSAFE-MARKER please"}]
        )
    assert caught.value.code == "content_filter" and "judge" in caught.value.message
    # The client got a request id; the refusal's record (the web process's log) carries it,
    # and not the text.
    request_id = caught.value.response.headers["x-request-id"]
    assert request_id.startswith("req_") and caught.value.request_id == request_id
    log = (cluster.tmp / f"web-{cluster.starts}.log").read_text()
    line = next(line for line in log.splitlines() if request_id in line)
    assert "judge" in line and "UNSAFE-MARKER" not in line
    status, raw = stream_raw(cluster, key, "/echo the engine would say this UNSAFE-MARKER")
    assert status == 400 and "the engine would say" not in raw

    # Controversial both ways.
    ok = api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "/echo CONTROVERSIAL-MARKER ok"}]
    )
    assert ok.choices[0].message.content == "CONTROVERSIAL-MARKER ok"
    set_policy(cluster, "--judges", "judge", "--directions", "requests", "answers",
               "--fail", "closed", "--controversial", "unsafe")  # fmt: skip
    wait_for(lambda: _refused_as_filter(api, "/echo CONTROVERSIAL-MARKER ok"), 5,
             "controversial refused under controversial: unsafe")  # fmt: skip


def _refused_as_filter(api: openai.OpenAI, text: str) -> bool:
    try:
        api.chat.completions.create(model="chat", messages=[{"role": "user", "content": text}])
    except openai.BadRequestError as error:
        return error.code == "content_filter"
    return False


def test_fail_closed_with_every_judge_down_releases_nothing(cluster: ControlPlane) -> None:
    key = new_key(cluster, "closed")
    set_policy(cluster, "--judges", "judge-down", "--directions", "requests", "answers",
               "--fail", "closed")  # fmt: skip
    status, raw = stream_raw(cluster, key, "/echo secret words the engine says")
    assert status == 400 and "secret words" not in raw and "content_filter" in raw
    # Only answers judged: the request passes, the answer's text is never released.
    set_policy(cluster, "--judges", "judge-down", "--directions", "answers", "--fail", "closed")
    status, raw = stream_raw(cluster, key, "/echo secret words the engine says")
    assert "secret" not in raw and "words" not in raw
    # Fail open: released, and the request is answered.
    set_policy(cluster, "--judges", "judge-down", "--directions", "answers", "--fail", "open")
    status, raw = stream_raw(cluster, key, "/echo secret words the engine says")
    assert status == 200 and streamed_text(raw) == "secret words the engine says"


def test_a_budget_is_shared_by_two_gateway_processes_through_redis(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    key = new_key(cluster, "shared", "--rpm", "3")
    redis = {"LLMGW_REDIS_URL": redis_url(13)}
    with (
        gateway_process(cluster, tmp_path, **redis) as one,
        gateway_process(cluster, tmp_path, **redis) as two,
    ):
        apis = [
            openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) for url in (one, two)
        ]
        answered = 0
        budget_minute_with()
        for i in range(3):  # 3 of the minute's 3, spread over both processes
            apis[i % 2].chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=2)  # fmt: skip
            answered += 1
        for api in apis:  # the fourth is refused by either
            with pytest.raises(openai.RateLimitError):
                api.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=2)  # fmt: skip
        assert answered == 3


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error(cluster: ControlPlane) -> None:
    import os
    import signal

    from cluster.models import Assignment

    key = new_key(cluster, "killed")
    api = client(cluster, key)
    stream = api.chat.completions.create(
        model="chat", stream=True, max_tokens=400,
        messages=[{"role": "user", "content": "write at length"}],
    )  # fmt: skip
    first = next(iter(stream))
    assert first.choices
    # Whichever replica answers: kill both engines' processes now.
    for pid in Assignment.objects.filter(replica__model_name="chat").values_list("pid", flat=True):
        if pid:
            os.kill(pid, signal.SIGKILL)
    with pytest.raises(openai.APIError) as caught:
        for _ in stream:
            pass
    assert "stream failed" in str(caught.value.message) or "engine" in str(caught.value.message)
