"""Production with what it leans on behind proxies a test cuts.

The arrangement docs/production.md describes, as processes: the web process, a Celery
worker, Celery beat and two ``gateway serve`` processes, all reaching PostgreSQL and Redis
only through a :class:`tests.faultproxy.FaultProxy` each; simulated agents with sim engines;
and :class:`Load`, openai clients sending chat requests (streamed and not) to both gateways
throughout, counting every answer a client sees.

The test process itself reads the database directly (Django's test connection), so what it
checks does not depend on the proxy it cuts.

    # in tests/e2e/faults/, whose conftest gives the fixtures
    def test_x(fault_plane: FaultPlane, agents) -> None:
        fault_plane.sim_cluster(agents, model="steady", replicas=2)
        key = fault_plane.key("load")
        with fault_plane.load(key, "steady") as load:
            load.wait_for_answers(20)
            fault_plane.pg.refuse()
            ...
            fault_plane.pg.heal()
        assert load.failures == []

Redis is a redis-server of the test's own (``tests.e2e.test_faults.Redis``), so cutting or
emptying it harms no other test.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from cluster.models import Node, Replica
from tests.catalog import samples
from tests.catalog.samples import store
from tests.dburl import database_url
from tests.e2e.conftest import ROOT, Agent, free_port, wait_for
from tests.e2e.test_faults import Plane
from tests.faultproxy import FaultProxy

H100 = "nvidia-h100-80gb"
FAST = {"LLMGW_SIM_TTFT": "0.05", "LLMGW_SIM_TPS": "200"}
SERVING = re.compile(r"^gateway serving on (http://127\.0\.0\.1:(\d+)/v1/)", re.M)


@dataclass
class GatewayProcess:
    """One ``manage.py gateway serve`` process, its output in a file."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def healthz(self) -> httpx.Response:
        return httpx.get(self.url + "/healthz", timeout=5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class FaultPlane(Plane):
    """Production's web, worker and beat (``tests.e2e.test_faults.Plane``) and gateways,
    with PostgreSQL and Redis each behind a FaultProxy."""

    pg: FaultProxy | None = None
    redis: FaultProxy | None = None
    gateways: list[GatewayProcess] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)  # more of every process's environment

    def env(self) -> dict[str, str]:
        assert self.pg is not None and self.redis is not None
        return dict(
            super().env(),
            LLMGW_DATABASE_URL=database_url(host="127.0.0.1", port=self.pg.port),
            LLMGW_REDIS_URL=f"redis://127.0.0.1:{self.redis.port}/0",
            **self.extra,
        )

    def start_all(self, gateways: int = 2) -> None:  # type: ignore[override]
        """Every process at once (the gateways read the database, not the web process),
        then wait for each: a plane starts in the time of its slowest process."""
        started = [self._spawn_gateway(f"gw{n}") for n in range(gateways)]
        super().start_all()
        for gw in started:
            self._listening(gw)

    def start_gateway(self, name: str, **extra: str) -> GatewayProcess:
        return self._listening(self._spawn_gateway(name, **extra))

    def _spawn_gateway(self, name: str, **extra: str) -> GatewayProcess:
        port = free_port()
        path = self.tmp / f"{name}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "gateway", "serve", "--port", str(port)],
                cwd=ROOT, env={**self.env(), **extra}, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        gw = GatewayProcess(name, port, proc, path)
        self.gateways.append(gw)
        return gw

    def _listening(self, gw: GatewayProcess) -> GatewayProcess:
        def listening() -> bool:
            assert gw.proc.poll() is None, f"gateway {gw.name} ended: {gw.output()[-3000:]}"
            return bool(SERVING.search(gw.output()))

        wait_for(listening, 60, f"gateway {gw.name} to listen")
        return gw

    def stop_all(self) -> None:
        """Every process told at once, then each waited for (killed past 20 s)."""
        procs = [gw.proc for gw in self.gateways] + [self.proc] + list(self.others.values())
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # What a fault test sets up first.

    def sim_cluster(
        self,
        agents: Callable[..., Agent],
        model: str = "steady",
        replicas: int = 2,
        nodes: int = 2,
        **extra: Any,
    ) -> None:
        """``nodes`` simulated nodes and a sim model with ``replicas`` ready replicas."""
        for i in range(nodes):
            agents(f"fp-{i}", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
        wait_for(lambda: Node.objects.filter(health="ready").count() == nodes, 60, "the nodes")
        store(sim_model(model, replicas, **extra))
        wait_for(
            lambda: Replica.objects.filter(model_name=model, state="ready").count() >= replicas,
            120,
            f"{replicas} replicas of {model} ready",
        )

    def key(self, name: str, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", "gateway", "key", "create", name, *args],
            cwd=ROOT, env=self.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def serving(self, key: str, model: str) -> None:
        """Wait until every gateway (and the web process) answers ``model`` on ``key``."""
        for url in self.urls():
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)

            def answers(client: openai.OpenAI = client) -> bool:
                try:
                    client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "/echo up"}]
                    )
                except openai.OpenAIError:
                    return False
                return True

            wait_for(answers, 90, f"{url} to serve {model}")

    def urls(self) -> list[str]:
        return [gw.url for gw in self.gateways]

    @contextlib.contextmanager
    def load(self, key: str, model: str, **kw: Any) -> Iterator[Load]:
        self.serving(key, model)
        load = Load(self.urls(), key, model, **kw)
        load.start()
        try:
            yield load
        finally:
            load.stop()


def sim_model(name: str, replicas: int, **extra: Any) -> dict[str, Any]:
    """``samples.sim_model`` answering quickly (``FAST``), ``replicas`` of it exactly."""
    profile = {"env": dict(FAST), **extra.pop("profile", {})}
    return samples.sim_model(name, replicas, most=replicas, profile=profile, **extra)


@dataclass
class Outcome:
    at: float  # seconds since the load started
    url: str
    stream: bool
    status: int  # 200, the HTTP status of an error, 0 for no answer (a connection error)
    seconds: float
    detail: str = ""


class Load:
    """Openai clients asking in a loop, alternately streamed and not, across ``urls``.

    Bounded in count (``limit``) and time (``for_at_most``): it stops by itself. Every
    answer is kept as an :class:`Outcome`; ``failures`` are the ones a client saw fail.
    """

    def __init__(
        self,
        urls: list[str],
        key: str,
        model: str,
        clients: int = 4,
        timeout: float = 60,
        limit: int = 20_000,
        for_at_most: float = 600,
        pause: float = 0.05,
    ) -> None:
        self.urls, self.key, self.model = urls, key, model
        self.clients, self.timeout, self.limit = clients, timeout, limit
        self.for_at_most, self.pause = for_at_most, pause
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        for n in range(self.clients):
            t = threading.Thread(target=self._run, args=(n,), name=f"load-{n}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout + 10)

    def now(self) -> float:
        return time.monotonic() - self._t0

    @property
    def failures(self) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.status != 200]

    def since(self, at: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.at >= at]

    def counts(self) -> Counter[int]:
        with self._lock:
            return Counter(o.status for o in self.outcomes)

    def answered(self) -> int:
        with self._lock:
            return sum(1 for o in self.outcomes if o.status == 200)

    def wait_for_answers(self, n: int, timeout: float = 60) -> None:
        start = self.answered()
        wait_for(lambda: self.answered() >= start + n, timeout, f"{n} more answers")

    def summary(self) -> str:
        outs = list(self.outcomes)
        slowest = max((o.seconds for o in outs), default=0.0)
        return (
            f"{len(outs)} requests, statuses {dict(Counter(o.status for o in outs))}, "
            f"slowest {slowest:.2f} s"
        )

    def _run(self, n: int) -> None:
        clients = [
            openai.OpenAI(base_url=u + "/v1", api_key=self.key, max_retries=0,
                          timeout=self.timeout)
            for u in self.urls
        ]  # fmt: skip
        i = n
        while not self._stop.is_set() and self.now() < self.for_at_most:
            with self._lock:
                if len(self.outcomes) >= self.limit:
                    return
            i += 1
            url = self.urls[i % len(self.urls)]
            client = clients[i % len(clients)]
            stream = i % 2 == 0
            self._record(self._ask(client, stream, f"{n}.{i}"), url, stream)
            self._stop.wait(self.pause)

    def _ask(self, client: openai.OpenAI, stream: bool, i: str) -> tuple[int, str, float]:
        """One request; ``i`` makes its text (its conversation) unlike any other's: clients
        counting from their own number asked the same few texts, so prefix routing saw a
        quarter as many conversations as requests."""
        start = time.monotonic()
        messages = [{"role": "user", "content": f"/echo load {i}"}]
        try:
            if stream:
                text = ""
                for chunk in client.chat.completions.create(
                    model=self.model, messages=messages, stream=True
                ):
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
            else:
                answer = client.chat.completions.create(model=self.model, messages=messages)
                text = answer.choices[0].message.content or ""
            if text != f"load {i}":
                return 200 if text else -1, f"answer {text!r}", time.monotonic() - start
            return 200, "", time.monotonic() - start
        except openai.APIStatusError as e:
            return e.status_code, e.message[:300], time.monotonic() - start
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            return 0, f"{type(e).__name__}: {e}"[:300], time.monotonic() - start

    def _record(self, result: tuple[int, str, float], url: str, stream: bool) -> None:
        status, detail, seconds = result
        with self._lock:
            self.outcomes.append(
                Outcome(self.now() - seconds, url, stream, status, seconds, detail)
            )
