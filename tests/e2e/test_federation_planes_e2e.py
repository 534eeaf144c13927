"""Two whole llmgw clusters on this machine, federated: "east" (the one a client asks) and
"west" (its peer), each its own database, its own ``manage.py serve`` and a simulated node
(an agent whose engines are sim engines). East adds west with ``manage.py federation
add``, as an operator would; the official ``openai`` client asks east.

- west's models appear at east as ``west/MODEL`` within the refresh; a streamed and a
  whole answer come from west's replica through east, judged by east's guard (a sim
  judge) and counted in both clusters' usage; west's ``residency: local`` model is never
  listed at east nor reached; a model added to west's catalog appears at east;
- west stopped: its models leave east's ``/v1/models`` within 10 s and each request for
  one is refused within a second; west back: its models back after the probes;
- overflow: east's own replica offered twice what it answers within its slo by a
  low-band key; the requests admission holds back are answered by west, none gets 429.

The two planes are started once for the module (a cluster takes a while to come up);
each test leaves them as it found them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from catalog.models import ServedModel
from cluster.models import JoinToken, Replica
from gateway import services as keys
from gateway.models import Peer, Usage
from guard.models import JudgeDecision
from guard.services import set_policy
from tests.catalog.samples import store
from tests.dburl import database_url
from tests.e2e.conftest import ROOT, ControlPlane, wait_for
from tests.e2e.faultplane import H100, sim_model

# The test database exists for a test that asks for it; each test only reads it (what the
# planes committed: read committed), so its transaction rolls nothing of theirs back.
# 3 tests in about 5 minutes on a loaded 2-core machine, most of it the planes' start.
pytestmark = [pytest.mark.e2e, pytest.mark.django_db, pytest.mark.takes(100)]

HI = [{"role": "user", "content": "/echo hello from east"}]
# East's own model: first tokens at 600 ms, its slo 300 ms (under pressure after one answer),
# four requests at once per replica.
SLOW = {"LLMGW_SIM_TTFT": "0.6", "LLMGW_SIM_TPS": "200", "LLMGW_SIM_PARALLEL": "4"}


@dataclass
class Cluster:
    name: str
    plane: ControlPlane
    db: str  # its database's name
    agent: subprocess.Popen[bytes] | None = None

    def manage(self, *args: str) -> str:
        """``manage.py ARGS`` in this cluster (its database, its folders); its output."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.plane.env(),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start_agent(self, secret: str, cards: int) -> None:
        log = (self.plane.tmp / f"agent-{self.name}.log").open("ab")  # noqa: SIM115
        env = dict(os.environ, LLMGW_E2E_RUN=str(self.plane.tmp))  # the engines' marker
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "agent", "--server", self.plane.url, "--join-token", secret,
             "--name", f"{self.name}-node", "--state-dir", str(self.plane.tmp / "agent"),
             "--heartbeat", "1s", "--grace", "3s", "--simulate", f"{cards}x {H100}",
             "--stop-engines-on-exit"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


# West's side is set up by one process of west's own (its database is not this test's).
WEST_SETUP = """
import json
from cluster.models import JoinToken
from gateway import services
from tests.catalog.samples import store
from tests.e2e.faultplane import sim_model
store(sim_model("chat", 1), sim_model("secret", 1, residency="local"))
_, token = JoinToken.issue("west")
_, key = services.create_key("east", owner="peer:east")
print(json.dumps({"token": token, "key": key}))
"""


def _create_database(name: str) -> None:
    """A new database on the test's server, a copy of the test database as it is now
    (migrated, empty): nothing may be connected to that one meanwhile."""
    db = connection.settings_dict
    connection.close()
    with contextlib.suppress(Exception):
        connection.close_pool()
    with psycopg.connect(database_url(name="postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{db["NAME"]}"')


def _drop_database(name: str) -> None:
    with psycopg.connect(database_url(name="postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _kill_engines(tmp: Path) -> None:
    marker = f"LLMGW_E2E_RUN={tmp}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if marker in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)


def west_usage(west: Cluster, model: str) -> int:
    """The requests west's usage counts for ``model``, read from west's database."""
    with psycopg.connect(database_url(name=west.db)) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(requests), 0) FROM gateway_usage WHERE model = %s", (model,)
        ).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Planes:
    east: Cluster
    west: Cluster
    app: str  # a key of east's (normal band)
    low: str  # a key of east's, low band


@pytest.fixture(scope="module")
def planes(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Planes]:
    """East on the test database, west on a database of its own, both running for the
    module; east's database emptied at the end, as a transactional test's is."""
    tmp = tmp_path_factory.mktemp("planes")
    west_db = f"{connection.settings_dict['NAME']}_west"
    secrets = tmp / "secrets"
    secrets.mkdir()
    with django_db_blocker.unblock():
        _create_database(west_db)
        # Two planes, their agents and engines on a loaded 2-core machine: a start (and the
        # peer's restart) may take longer than one plane's minute.
        west_plane = ControlPlane(tmp / "west", up_within=180)
        west_plane.extra = {"LLMGW_DATABASE_URL": database_url(name=west_db)}
        (tmp / "west").mkdir()
        west = Cluster("west", west_plane, west_db)
        west_host = west_plane.url.split("//", 1)[1]
        (tmp / "east").mkdir()
        east = Cluster("east", ControlPlane(tmp / "east", up_within=180),
                       str(connection.settings_dict["NAME"]))  # fmt: skip
        east.plane.extra = {
            "LLMGW_SECRETS_DIR": str(secrets), "LLMGW_EXTERNAL_HTTP_HOSTS": west_host,
            "LLMGW_FEDERATION_REFRESH": "1", "LLMGW_FEDERATION_RECOVER_PROBES": "2",
            "LLMGW_FEDERATION_DWELL": "2", "LLMGW_ADMISSION_WINDOW": "30",
        }  # fmt: skip
        # The test process writes east's catalog too: it is told what east's processes are.
        told = override_settings(LLMGW_SECRETS_DIR=str(secrets),
                                 LLMGW_EXTERNAL_HTTP_HOSTS=[west_host])  # fmt: skip
        try:
            told.enable()
            # The two start side by side: a plane starts in the time of the slower.
            with ThreadPoolExecutor(1) as side:
                east_up = side.submit(east.plane.start)
                west.plane.start()
                got = json.loads(west.manage("shell", "-c", WEST_SETUP).strip().splitlines()[-1])
                east_up.result(timeout=200)
            (secrets / "west").write_text(got["key"] + "\n")
            west.start_agent(got["token"], cards=4)
            # East: its judge, then the peer, then its own slow model whose overflow is
            # west's chat (a model east knows once west is added).
            _, token = JoinToken.issue("east")
            store(sim_model("judge", 1, role="guard", guard={"format": "qwen3guard"}))
            set_policy({"judge": {"models": ["judge"]}, "directions": ["requests", "answers"],
                        "fail": "closed"}, surface="cli", name="test")  # fmt: skip
            east.start_agent(token, cards=2)
            out = east.manage("federation", "add", "west", "--url", west.plane.url,
                              "--key-file", "west")  # fmt: skip
            assert "west" in out, out
            wait_for(lambda: ServedModel.objects.filter(name="west/chat").exists(), 120,
                     "west's chat in east's catalog")  # fmt: skip
            store(sim_model("slow", 1, slo={"ttft_p99": "300ms"}, overflow="west/chat",
                            profile={"env": SLOW}))  # fmt: skip
            wait_for(lambda: Replica.objects.filter(state="ready").count() == 2, 120,
                     "east's judge and model ready")  # fmt: skip
            # A peer's model is reached by a key that names it (its prompts leave the cluster).
            _, app = keys.create_key("app", models=["west/chat", "slow"])
            _, low = keys.create_key("batch", models=["west/chat", "slow"], priority="low")
            yield Planes(east, west, app, low)
        finally:
            # Every process told at once, then each waited for: they stop side by side.
            procs = [p for c in (east, west) for p in (c.agent, c.plane.proc) if p is not None]
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            _kill_engines(tmp / "east")
            _kill_engines(tmp / "west")
            _drop_database(west_db)
            call_command("flush", interactive=False, verbosity=0)
            told.disable()


def client(planes: Planes, key: str | None = None, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=planes.east.plane.url + "/v1", api_key=key or planes.app,
                         max_retries=0, timeout=timeout)  # fmt: skip


def listed(api: openai.OpenAI) -> set[str]:
    return {m.id for m in api.models.list()}


def test_a_peers_models_served_judged_and_counted_in_both_and_its_local_model_kept(
    planes: Planes,
) -> None:
    east = client(planes)
    # West's models as west/MODEL within the refresh; never its residency: local one.
    wait_for(lambda: "west/chat" in listed(east), 60, "west/chat listed at east")
    assert not ServedModel.objects.filter(name="west/secret").exists()
    assert "west/secret" not in listed(east)
    assert Peer.objects.get(name="west").state == "up"
    judged = JudgeDecision.objects.filter(judge="judge").values_list("count", flat=True)
    before = sum(judged)
    raw = east.chat.completions.with_raw_response.create(model="west/chat", messages=HI)
    assert raw.headers["x-llmgw-peer"] == "west"
    assert "hello from east" in (raw.parse().choices[0].message.content or "")
    with east.chat.completions.with_streaming_response.create(
        model="west/chat", messages=HI, stream=True
    ) as streamed:
        assert streamed.headers["x-llmgw-peer"] == "west"
        chunks = list(streamed.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "hello from east" in text
    # Judged by east's guard: the request and the answer of each, by east's judge.
    wait_for(lambda: sum(judged.all()) >= before + 4, 30, "east's judge's verdicts")
    # Counted in both: east under its key and west/chat, west under the key it gave east.
    wait_for(lambda: sum(Usage.objects.filter(model="west/chat", key="app")
                         .values_list("requests", flat=True)) == 2, 30,
             "east's usage")  # fmt: skip
    wait_for(lambda: west_usage(planes.west, "chat") == 2, 30, "west's usage")
    # West's local model is not reached from east under any name.
    for name in ("west/secret", "secret"):
        with pytest.raises(openai.NotFoundError):
            east.chat.completions.create(model=name, messages=HI)
    assert west_usage(planes.west, "secret") == 0
    # A model added to west's catalog appears at east within the refresh.
    later = {**sim_model("later", 0), "scaling": {"min": 0, "max": 1}}
    added = planes.west.plane.tmp / "later.yaml"
    added.write_text(json.dumps({"models": [later]}))  # JSON is YAML
    planes.west.manage("catalog", "import", str(added))
    wait_for(lambda: ServedModel.objects.filter(name="west/later").exists(), 30,
             "west/later in east's catalog")  # fmt: skip


def test_the_peer_stopped_is_unlisted_and_refused_at_once_and_back_after_the_probes(
    planes: Planes,
) -> None:
    east = client(planes)
    wait_for(lambda: "west/chat" in listed(east), 60, "west/chat listed at east")
    planes.west.plane.stop()
    try:
        wait_for(lambda: "west/chat" not in listed(east), 10, "west/chat unlisted")
        # Each refused within a second (the client's own bound: no answer by then fails).
        quick = client(planes, timeout=1)
        for _ in range(3):
            with pytest.raises(openai.APIStatusError) as caught:
                quick.chat.completions.create(model="west/chat", messages=HI)
            assert caught.value.status_code == 503 and "west" in caught.value.message
    finally:
        planes.west.plane.start()
    wait_for(lambda: "west/chat" in listed(east), 60, "west/chat listed again")
    assert east.chat.completions.create(model="west/chat", messages=HI).choices


def test_a_low_band_offered_twice_the_local_capacity_is_answered_by_the_peer_none_429(
    planes: Planes,
) -> None:
    east, batch = client(planes), client(planes, planes.low)
    wait_for(lambda: "west/chat" in listed(east), 60, "west/chat listed at east")
    # One answer of the normal band: its first token past the slo, the model under pressure.
    assert east.chat.completions.create(model="slow", messages=HI).choices
    got: list[Any] = []
    lock = threading.Lock()

    def ask() -> None:
        try:
            answer = batch.chat.completions.with_raw_response.create(model="slow", messages=HI)
        except openai.APIStatusError as error:
            answer = error
        with lock:
            got.append(answer)

    # Twice the four its one replica answers at once.
    threads = [threading.Thread(target=ask, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 8
    refused = [g for g in got if isinstance(g, Exception)]
    assert refused == [], [str(r) for r in refused]  # none 429
    by_west = [g for g in got if g.headers.get("x-llmgw-peer") == "west"]
    assert len(by_west) >= 4, [g.headers.get("x-llmgw-peer") for g in got]
    assert all("hello from east" in (g.parse().choices[0].message.content or "")
               for g in got)  # fmt: skip
