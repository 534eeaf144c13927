"""Session affinity through the real gateway (real uvicorn, its table read from the
database) in front of three real sim engine processes: each way of naming a session, sent
by the official clients, keeps a session's turns on one replica while each turn's leading
text changes (which alone would send them anywhere); a replica that goes away moves its
sessions, and they stay where they moved."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import anthropic
import openai
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.records.observe import Done, Observer
from gateway.records.state import State
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Harness, wait
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = 6
TURNS = 4


@dataclass
class Recorder(Observer):
    """Every request as it ended."""

    ended: list[Done] = field(default_factory=list)

    def request(self, done: Done) -> None:
        super().request(done)
        self.ended.append(done)


@dataclass
class Served:
    gw: Harness
    secret: str
    recorder: Recorder

    def replica(self, send: object) -> int:
        """Send one request (``send()``) and the replica that answered it."""
        before = len(self.recorder.ended)
        send()  # type: ignore[operator]
        wait(lambda: len(self.recorder.ended) > before, what="the request to end")
        done = self.recorder.ended[-1]
        assert done.status == 200 and done.replica is not None and done.replica > 0
        return done.replica


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    procs = [launch("--model", "chat", "--ttft", "0", "--tps", "100000") for _ in range(3)]
    yield [url for _, url in procs]
    for proc, _ in procs:
        stop(proc)


@pytest.fixture
def served(sims: list[str]) -> Iterator[Served]:
    store(sim_model("chat", 3, tp=None, capabilities={"tools": True}))
    for url in sims:
        Replica.objects.create(model_name="chat", state="ready", endpoint=url, profile="sim")
    _, secret = keys.create_key("k")
    h = Harness(state=State())
    recorder = Recorder()
    h.gateway.observer = recorder
    h.serve([], [])
    yield Served(h, secret, recorder)
    h.close()


def _oai(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.gw.url + "/v1", api_key=s.secret, max_retries=0, timeout=30)


def _turn(session: int, turn: int) -> str:
    # Each turn's leading text differs: prefix affinity alone would scatter the turns.
    return f"Session {session}, turn {turn}: say one word."


def _kept(s: Served, send: object) -> dict[int, set[int]]:
    """Each session's replicas over its turns (``send(session, turn)``)."""
    seen: dict[int, set[int]] = {}
    for session in range(SESSIONS):
        for turn in range(TURNS):
            seen.setdefault(session, set()).add(
                s.replica(lambda n=session, t=turn: send(n, t))  # type: ignore[operator]
            )
    return seen


def _assert_kept(seen: dict[int, set[int]]) -> None:
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    # Spread by session: not every session on one replica.
    assert len(set().union(*seen.values())) > 1, seen


def test_x_session_id_header(served: Served) -> None:
    api = _oai(served)
    _assert_kept(_kept(served, lambda s, t: api.chat.completions.create(
        model="chat", max_tokens=4, messages=[{"role": "user", "content": _turn(s, t)}],
        extra_headers={"x-session-id": f"header-{s}"},
    )))  # fmt: skip
    c = served.gw.gateway.sessions.counts["chat"]
    assert (c.new, c.kept, c.moved) == (SESSIONS, SESSIONS * (TURNS - 1), 0)


def test_prompt_cache_key_with_the_openai_client(served: Served) -> None:
    api = _oai(served)
    _assert_kept(_kept(served, lambda s, t: api.chat.completions.create(
        model="chat", max_tokens=4, messages=[{"role": "user", "content": _turn(s, t)}],
        prompt_cache_key=f"cache-{s}",
    )))  # fmt: skip
    _assert_kept(_kept(served, lambda s, t: api.responses.create(
        model="chat", max_output_tokens=4, input=_turn(s, t), prompt_cache_key=f"cache-{s}",
    )))  # fmt: skip


def test_previous_response_id_chains_a_session(served: Served) -> None:
    api = _oai(served)
    last: dict[int, str] = {}

    def send(s: int, t: int) -> None:
        response = api.responses.create(
            model="chat", max_output_tokens=4, input=_turn(s, t), store=True,
            instructions=f"Turn {t}.",  # the leading text changes each turn
            previous_response_id=last.get(s),
        )  # fmt: skip
        last[s] = response.id

    _assert_kept(_kept(served, send))


def test_anthropic_metadata_user_id(served: Served) -> None:
    api = anthropic.Anthropic(base_url=served.gw.url, api_key=served.secret, max_retries=0,
                              timeout=30)  # fmt: skip
    _assert_kept(_kept(served, lambda s, t: api.messages.create(
        model="chat", max_tokens=4, messages=[{"role": "user", "content": _turn(s, t)}],
        metadata={"user_id": f"user_abc_account__session_{s}"},
    )))  # fmt: skip


def test_a_replica_that_goes_away_moves_its_sessions(served: Served) -> None:
    api = _oai(served)

    def send(s: int, t: int) -> int:
        return served.replica(lambda: api.chat.completions.create(
            model="chat", max_tokens=4, messages=[{"role": "user", "content": _turn(s, t)}],
            extra_headers={"x-session-id": f"moving-{s}"},
        ))  # fmt: skip

    where = {s: send(s, 0) for s in range(SESSIONS)}
    gone = where[0]
    Replica.objects.filter(pk=gone).delete()
    served.gw.refresh()
    wait(lambda: gone not in served.gw.gateway.state.table.pool("chat").endpoints,
         what="the replica to leave the table")  # fmt: skip
    for turn in (1, 2, 3):
        now = {s: send(s, turn) for s in range(SESSIONS)}
        for s in range(SESSIONS):
            if where[s] == gone:
                assert now[s] != gone  # moved
            else:
                assert now[s] == where[s]  # the others stay
        if turn == 1:
            moved = now
        else:
            assert now == moved  # and where they moved, they stay
    c = served.gw.gateway.sessions.counts["chat"]
    assert c.moved == sum(1 for s in range(SESSIONS) if where[s] == gone) >= 1


def test_a_session_key_that_is_not_a_string_is_a_400_naming_it(served: Served) -> None:
    api = _oai(served)
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="chat", max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}],
                                    extra_body={"prompt_cache_key": 7})  # fmt: skip
    assert caught.value.body["param"] == "prompt_cache_key"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="chat", max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}],
                                    extra_headers={"x-session-id": "x" * 600})  # fmt: skip
    assert caught.value.body["param"] == "x-session-id"  # type: ignore[index]
    assert served.gw.gateway.sessions.counts == {}
