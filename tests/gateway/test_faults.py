"""Failures on the data path: retries before the first byte, fallbacks in order, external
providers only when the cluster has no capacity, streams cut after it, cancels, waking."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from catalog import spec
from gateway.path.table import Key, ReplicaRow, digest
from gateway.records import state
from tests.gateway.harness import KEY, Harness, model, wait


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def api(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def ask(h: Harness, name: str = "m", **kw: object) -> str:
    answer = api(h).chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], **kw)  # fmt: skip
    return answer.choices[0].message.content or ""


def test_requests_reuse_kept_alive_connections_to_the_engine(h: Harness) -> None:
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    client = api(h)
    for stream in (False, True, False, True):
        for _ in range(5):
            if stream:
                list(client.chat.completions.create(
                    model="m", stream=True, messages=[{"role": "user", "content": "x"}]))  # fmt: skip
            else:
                ask(h)
    assert engine.requests == 20 and engine.connections == 1
    # The body went as the client sent it when nothing had to change; a stream was asked
    # for usage.
    assert "stream_options" not in engine.bodies[0]
    assert engine.bodies[5]["stream_options"] == {"include_usage": True}


def test_a_503_and_a_429_move_the_request_to_a_replica_that_answers(h: Harness) -> None:
    busy, full, good = (
        h.engine("busy", behaviour="503"),
        h.engine("full", behaviour="429"),
        h.engine("good"),
    )
    h.serve([model("m")], [(1, "m", busy), (2, "m", full), (3, "m", good)])
    for _ in range(6):
        assert ask(h).startswith("good0")
    # Each failing replica was tried at most once per request, never twice.
    assert busy.requests <= 6 and full.requests <= 6


def test_a_replica_refusing_connections_is_skipped(h: Harness) -> None:
    dead, good = h.engine("dead"), h.engine("good")
    h.run(dead.stop())  # its port now refuses
    h.serve([model("m")], [(1, "m", dead), (2, "m", good)])
    assert all(ask(h).startswith("good0") for _ in range(4))


def test_fallbacks_in_order_when_every_replica_fails(h: Harness) -> None:
    down = h.engine("down", behaviour="503")
    second, third = h.engine("second"), h.engine("third")
    h.serve(
        [model("m", fallbacks=["f2", "f3"]), model("f2"), model("f3")],
        [(1, "m", down), (2, "f2", second), (3, "f3", third)],
    )
    assert ask(h).startswith("second0")
    second.behaviour = "503"
    assert ask(h).startswith("third0")
    assert second.bodies[-1]["model"] == "f2"  # the fallback's own served name


def test_every_replica_failing_is_one_error(h: Harness) -> None:
    a, b = h.engine("a", behaviour="503"), h.engine("b", behaviour="503")
    h.serve([model("m")], [(1, "m", a), (2, "m", b)])
    with pytest.raises(openai.APIStatusError) as caught:
        ask(h)
    assert caught.value.status_code == 502 and "HTTP 503" in caught.value.message
    assert a.requests == 1 and b.requests == 1


def test_an_external_fallback_only_when_the_cluster_has_no_capacity(
    h: Harness, tmp_path: Path, settings: Any
) -> None:
    settings.LLMGW_SECRETS_DIR = str(tmp_path)  # key files only in the secrets folder
    secret_file = tmp_path / "provider.key"
    secret_file.write_text("sk-provider-secret\n")
    local, provider = h.engine("local", behaviour="503"), h.engine("provider")
    # A plain http:// provider only at the host and port the operator lists.
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [provider.url.split("//", 1)[1].split("/")[0]]
    cloud = model("cloud", external=spec.External(url=provider.url + "/v1", model="gpt-x",
                                                  api_key_file=str(secret_file)))  # fmt: skip
    # A key reaches an external model only if it names it, on a fallback too.
    h.keys = {digest(KEY): Key(1, "harness", "team:t", ("m", "cloud", "f2"), None)}
    h.serve([model("m", fallbacks=["cloud", "f2"]), cloud, model("f2")],
            [(1, "m", local), (2, "f2", h.engine("f2"))])  # fmt: skip
    # A cluster fallback answers first, though the external one is listed before it.
    assert ask(h).startswith("f20") and provider.requests == 0
    # With no capacity in the cluster, the provider: its model name, its key from the file.
    h.rows = [r for r in h.rows if r.model != "f2"]
    h.refresh()
    assert ask(h).startswith("provider0")
    assert provider.bodies[-1]["model"] == "gpt-x"
    assert provider.auth[-1] == "Bearer sk-provider-secret"
    # The key is read again when the file changes.
    secret_file.write_text("sk-rotated\n")
    import os

    os.utime(secret_file, (1, 1))
    ask(h)
    assert provider.auth[-1] == "Bearer sk-rotated"


def test_an_engine_cut_mid_stream_ends_the_stream_with_an_error_and_done(h: Harness) -> None:
    cut = h.engine("cut", behaviour="cut", words=10)
    h.serve([model("m")], [(1, "m", cut)])
    with httpx.stream("POST", h.url + "/v1/chat/completions",
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "x"}]}) as resp:  # fmt: skip
        raw = resp.read().decode()
    assert resp.status_code == 200
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "upstream_error"
    # The openai client raises at the error event.
    with pytest.raises(openai.APIError):
        for _ in api(h).chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "x"}]):  # fmt: skip
            pass


def test_a_stream_cut_before_its_first_byte_is_retried_elsewhere(h: Harness) -> None:
    early, good = h.engine("early", behaviour="cut", words=10), h.engine("good", words=3)
    h.serve([model("m", routing_profile="least")], [(1, "m", early), (2, "m", good)])
    # Under a guard every chunk is held until judged; here, with nothing judged, the cut
    # replica's first chunks reach the client, so only a cut before them is retried:
    # make the early engine cut at once.
    early.words = 0
    early.behaviour = "refuse"
    h.run(early.stop())
    for _ in range(3):
        text = "".join(
            c.choices[0].delta.content or ""
            for c in api(h).chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "x"}])
            if c.choices
        )  # fmt: skip
        assert text == "good0 good1 good2"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_the_engine(h: Harness, stream: bool) -> None:
    slow = h.engine("slow", behaviour="slow", words=100)
    h.serve([model("m")], [(1, "m", slow)])
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
    # Only the whole answer's read is short: it is how that client goes away mid-answer.
    timeout = httpx.Timeout(30.0) if stream else httpx.Timeout(30.0, read=0.5)
    with httpx.Client(timeout=timeout) as client:
        if stream:
            # Gone after the first bytes of the answer.
            with client.stream("POST", h.url + "/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {KEY}"}) as resp:  # fmt: skip
                assert resp.status_code == 200
                next(resp.iter_raw())
        else:
            # Gone while the whole answer is being generated.
            with pytest.raises(httpx.ReadTimeout):
                client.post(h.url + "/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    wait(lambda: slow.cancelled == 1, 5, "the engine to see its client go")


def test_a_model_woken_by_50_held_requests_answers_them_all(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model still asked for is demanded again every DEMAND_EVERY s: the window is made
    # longer than the slowest machine takes to hold 50 requests, so one demand is expected.
    monkeypatch.setattr(state, "DEMAND_EVERY", 3600.0)
    h.gateway.options.wake_wait = 60
    engine = h.engine("woken")
    h.serve([model("m", scaling=spec.Scaling(min=0, max=1))], [])
    answers: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            answers.append(ask(h))
        except BaseException as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    wait(lambda: h.state.waiting("m") == 50, 60, "50 requests held")
    # One demand for any number of requests.
    assert h.demanded == ["m"]
    h.rows = [ReplicaRow(1, "m", "sim", engine.url)]
    h.refresh()
    for t in threads:
        t.join(60)
    assert not errors and len(answers) == 50 and all(a.startswith("woken0") for a in answers)


def test_no_replica_before_the_bound_is_503_with_retry_after(h: Harness) -> None:
    h.gateway.options.wake_wait = 0.3
    h.serve([model("m", scaling=spec.Scaling(min=0, max=1))], [])
    with pytest.raises(openai.InternalServerError) as caught:
        ask(h)
    assert caught.value.status_code == 503
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert h.demanded == ["m"]


def test_an_adapter_is_applied_per_request_on_llama_server_and_by_name_on_vllm(
    h: Harness,
) -> None:
    llama, vllm = h.engine("llama"), h.engine("vllm")
    adapters = [
        spec.Adapter(name="sql", source="/l/sql"),
        spec.Adapter(name="poem", source="/l/p", scale=0.5),
    ]
    cpu = spec.Profile(name="cpu", engine="llamacpp")
    gpu = spec.Profile(name="gpu", engine="vllm")
    h.serve(
        [model("base", adapters=adapters, profiles=[cpu]),
         model("vbase", adapters=[spec.Adapter(name="vsql", source="/l/v")], profiles=[gpu])],
        [(1, "base", llama), (2, "vbase", vllm)],
    )  # fmt: skip
    h.rows = [ReplicaRow(1, "base", "cpu", llama.url), ReplicaRow(2, "vbase", "gpu", vllm.url)]
    h.refresh()
    ask(h, "poem")
    assert llama.bodies[-1]["model"] == "base"
    assert llama.bodies[-1]["lora"] == [{"id": 1, "scale": 0.5}]
    ask(h, "base")  # the base model: no adapter applied
    assert llama.bodies[-1]["lora"] == []
    ask(h, "vsql")
    assert vllm.bodies[-1]["model"] == "vsql" and "lora" not in vllm.bodies[-1]
    listed = {m.id: m for m in api(h).models.list()}
    assert (listed["poem"].model_extra or {}).get("parent") == "base"


def test_adapters_held_few_at_a_time_go_where_they_are_and_the_oldest_is_unloaded(
    h: Harness,
) -> None:
    a, b = h.engine("a"), h.engine("b")
    names = ["x", "y", "z"]
    gpu = spec.Profile(name="gpu", engine="vllm")
    m = model("base", profiles=[gpu], max_loaded_adapters=1,
              adapters=[spec.Adapter(name=n, source=f"/l/{n}") for n in names])  # fmt: skip
    h.serve([m], [])
    h.rows = [ReplicaRow(1, "base", "gpu", a.url), ReplicaRow(2, "base", "gpu", b.url)]
    h.refresh()
    ask(h, "x")
    home = a if a.bodies else b
    for _ in range(3):
        ask(h, "x")
    assert len(home.bodies) == 4  # x stays where it was loaded
    ask(h, "y")  # least busy (a tie): one of them loads y
    ask(h, "z")  # the other holds one already: one of them unloads its oldest

    def unloaded() -> set[str]:
        return {body["lora_name"] for e in (a, b) for body in e.bodies if "lora_name" in body}

    wait(unloaded, 5, "an unload asked")
    assert unloaded() <= {"x", "y"}  # an older adapter, never the one just asked for


def test_a_key_made_a_moment_ago_works_at_once(h: Harness) -> None:
    """A key this process has not read yet is looked for again after the next pass."""
    from gateway.path.table import Key, digest

    h.state.interval = 30  # no pass would come of itself within the test
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    fresh = "llmgw-ck-made-just-now"
    h.keys[digest(fresh)] = Key(2, "new", "", (), None)  # in the database, not yet read
    answer = openai.OpenAI(base_url=h.url + "/v1", api_key=fresh, max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}])  # fmt: skip
    assert answer.choices[0].message.content.startswith("e0")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=h.url + "/v1", api_key="llmgw-ck-unknown", max_retries=0
        ).models.list()


def test_a_fallback_named_by_an_alias_is_used(h: Harness) -> None:
    """The catalog lets fallbacks name an alias; the gateway skipped them as unknown."""
    down, backup = h.engine("down", behaviour="503"), h.engine("backup")
    h.serve([model("m", fallbacks=["backup-latest"]), model("b", aliases=["backup-latest"])],
            [(1, "m", down), (2, "b", backup)])  # fmt: skip
    assert ask(h).startswith("backup0")
    assert backup.bodies[-1]["model"] == "b"  # the fallback's own served name


def test_a_failure_tells_the_client_its_kind_never_an_engines_address(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator's log has the address, by the request id the client got."""
    dead = h.engine("dead")
    h.run(dead.stop())  # its port now refuses
    h.serve([model("m")], [(1, "m", dead)])
    with (
        caplog.at_level("WARNING", logger="gateway"),
        pytest.raises(openai.APIStatusError) as caught,
    ):
        ask(h)
    message = caught.value.message
    assert caught.value.status_code == 502 and "no connection to the engine" in message
    assert "127.0.0.1" not in message and str(dead.port) not in message
    request_id = caught.value.response.headers["x-request-id"]
    logged = [r.getMessage() for r in caplog.records if request_id in r.getMessage()]
    assert logged and f"127.0.0.1:{dead.port}" in logged[0]


def tight_key(h: Harness, tpm: int) -> openai.OpenAI:
    from gateway.path.table import Key, digest

    secret = "llmgw-ck-tight-budget"
    h.keys[digest(secret)] = Key(2, "tight", "team:t", (), None, tpm=tpm)
    h.refresh()
    return openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=10)


def test_a_request_that_could_never_fit_its_token_budget_is_refused_at_once(h: Harness) -> None:
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    client = tight_key(h, tpm=500)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", max_tokens=1000,
                                       messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert caught.value.code == "tokens_exceed_budget"
    assert "more than the budget of tight, 500 tokens a minute" in caught.value.message
    assert engine.requests == 0


def test_an_answer_with_no_bound_is_charged_to_the_token_budget_when_it_ends(h: Harness) -> None:
    """No max_tokens and no max_output: nothing could be reserved for the answer, so its
    40 tokens are counted once it ends; the budget then refuses (it counted prompts only)."""
    engine = h.engine("e", words=40)
    h.serve([model("m")], [(1, "m", engine)])
    client = tight_key(h, tpm=100)
    answered = 0
    for _ in range(10):
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError as limited:
            assert limited.response.headers["retry-after"]
            assert limited.body["type"] == "tokens"
            break
        answered += 1
    assert 1 <= answered <= 3  # 40 tokens each, and its prompt's bound, within 100


def test_a_request_without_a_valid_key_is_counted(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    bad = openai.OpenAI(base_url=h.url + "/v1", api_key="llmgw-ck-nobody", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    wait(lambda: h.gateway.observer.unauthenticated_requests == 1, what="the 401 counted")


def test_a_model_the_cluster_has_no_room_for_is_503_at_once(h: Harness) -> None:
    """Placement found no room: holding the client for the model's wake wait (10 min by
    default) gains nothing. The client is told to come back later; the reason (card
    classes, nodes) stays in the operator's log and console."""
    h.gateway.options.wake_wait = 60
    h.unplaced = {"m": "no node has nvidia-a100-80gb cards"}
    h.serve([model("m")], [])
    with pytest.raises(openai.APIStatusError) as caught:
        api(h).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "30"
    assert "no room to start one now" in caught.value.message
    assert "a100" not in caught.value.message


def test_a_held_request_is_let_go_when_placement_finds_no_room(h: Harness) -> None:
    h.gateway.options.wake_wait = 60
    h.serve([model("m", scaling=spec.Scaling(min=0, max=1))], [])
    got: list[BaseException] = []

    def held() -> None:
        try:
            ask(h)  # the client gives up after 10 s
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            got.append(error)

    waiting = threading.Thread(target=held)
    waiting.start()
    wait(lambda: h.gateway.state.waiting("m") == 1, what="the request held")
    h.unplaced = {"m": "no node has nvidia-a100-80gb cards"}
    h.refresh()
    waiting.join(15)
    (error,) = got
    assert isinstance(error, openai.APIStatusError) and error.status_code == 503
    assert "no room" in error.message
