"""An engine that accepts connections and answers nothing (a real sim engine process
stopped with SIGSTOP), behind a real gateway (``tests/gateway/harness``) with the
options it has in production: a request's wait for its first byte is the model's slo
bound (10 × ``slo.ttft_p99``, at least 10 s), not minutes, after which it moves to
another replica and the hung one is counted toward its ejection."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from django.conf import settings

from catalog import spec, timeouts
from gateway.path import balance
from gateway.path import body as bodies
from gateway.path.app import Options
from gateway.path.options import waits_defaults
from gateway.path.outliers import Outliers, Rules
from gateway.path.table import ReplicaRow
from tests.gateway.harness import KEY, Harness, model

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


@pytest.fixture
def stopped_sim() -> Iterator[str]:
    """A sim engine process, stopped by SIGSTOP once it listens: its port accepts
    connections (the kernel's backlog) and nothing answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", "0", "--model", "m"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    found = re.search(r"listening on (http://\S+)", proc.stdout.readline())
    assert found, "the sim did not start"
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield found.group(1).rstrip("/")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_the_default_first_byte_wait_is_seconds() -> None:
    # A model with no slo waits the site's default for its first byte: seconds, as an
    # engine that answers nothing holds each request that long.
    defaults = waits_defaults()
    assert defaults.first_token == 30 == Options.from_settings(settings).first_byte_timeout
    assert timeouts.waits(spec.Model(name="m"), defaults).first_token == 30
    # A model whose slo says 1 s waits 10 s.
    fast = spec.Model(name="f", slo=spec.SLO(ttft_p99=1 * S))
    assert timeouts.waits(fast, defaults).first_token == 10


def test_a_hung_engine_holds_a_request_its_slo_bound_then_it_moves_on_and_is_ejected(
    h: Harness, stopped_sim: str
) -> None:
    h.gateway.options = Options.from_settings(settings)  # the waits as deployed
    h.gateway.outliers = Outliers(Rules(after=1, base=60))
    good = h.engine("good")
    m = model("m", slo=spec.SLO(ttft_p99=1 * S))
    h.serve([m], [(2, "m", good)])
    h.rows = [ReplicaRow(1, "m", "sim", stopped_sim), ReplicaRow(2, "m", "sim", good.url)]
    h.refresh()
    pool = h.state.table.pool("m")
    assert pool is not None
    # A conversation whose prefix the hung replica is picked for first.
    prompt = next(
        p for p in (f"question {i}" for i in range(200))
        if balance.pick(pool.ring, {}, _affinity(p), profile=balance.DEFAULT_PROFILE).id == 1
    )  # fmt: skip
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    took = time.monotonic() - started
    assert text.startswith("good0")  # answered by the other replica …
    # … after the hung one's first-byte wait: 10 s (10 × its 1 s slo), not 30 s or 300 s.
    assert 10 <= took < 20, took
    assert good.requests == 1
    # The timeout counted toward its ejection: out of routing now.
    assert h.gateway.outliers.excluded(pool.endpoints) == {1}
    again = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], timeout=5
    )
    assert (again.choices[0].message.content or "").startswith("good0")


def _affinity(prompt: str) -> str:
    data = {"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True}
    return bodies.read(bodies.CHAT, data).affinity
