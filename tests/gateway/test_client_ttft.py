"""The TTFT the gateway reports is the client's: to the first byte of text released to
it, after the guard's hold of a streamed window; the engine's (its first token as it
reached the gateway) is reported beside it.

A stream through the real gateway with the real guard judging answers by a sim judge
that takes ``JUDGE_TTFT`` seconds a verdict, read by the official ``openai`` client. No
byte of text can reach the client before the first window's verdict, so the client's
TTFT is at least the judge's time: the Traffic page, ``/metrics`` and the observers'
``Done`` must say so (they said the engine's, from the role chunk released at once),
and show the engine's, shorter, beside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from django.template.loader import render_to_string

from cluster.models import Replica
from gateway import services as keys
from gateway.path.guarding import Guard
from gateway.records import metrics
from gateway.records.observe import Done, Fanout, Listener
from gateway.records.state import State
from gateway.records.traffic import Traffic, Window
from guard import records
from guard import services as guard_services
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Harness
from tests.gateway.test_metrics import value
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

JUDGE_TTFT = 0.6  # seconds the sim judge takes before its verdict


class Heard(Listener):
    def __init__(self) -> None:
        self.done: list[Done] = []

    def request(self, done: Done) -> None:
        self.done.append(done)


@pytest.fixture
def judge_url() -> Iterator[str]:
    judge, url = launch("--model", "judge", "--guard-format", "qwen3guard",
                        "--ttft", str(JUDGE_TTFT), "--tps", "100000")  # fmt: skip
    yield url
    stop(judge)


def test_a_guarded_streams_ttft_is_the_clients_with_the_engines_beside_it(
    judge_url: str,
) -> None:
    h = Harness(state=State(), guard=Guard())
    # The engine sends its role chunk with its first token after its prefill, as vLLM
    # does: the role chunk carries no text and may leave before the verdict; the token
    # may not.
    engine_url = h.engine("e", behaviour="vllm", say="fine words here",
                          first_token_delay=0.05).url  # fmt: skip
    guard_model("judge", endpoint=judge_url)
    store(sim_model("ttft-probe", tp=None))
    Replica.objects.create(
        model_name="ttft-probe", state="ready", endpoint=engine_url, profile="sim"
    )
    guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": ["answers"],
                               "fail": "closed"}, surface="cli")  # fmt: skip
    _, secret = keys.create_key("k")
    records.start()
    heard, published = Heard(), []
    traffic = Traffic(publish=published.append)
    traffic._started = True  # published by hand below, not by its thread
    exported = metrics.Metrics()
    h.gateway.observer = Fanout(heard, traffic, exported)
    n = "llmgw_gateway_"
    try:
        h.serve([], [])
        # The histograms are the process's: a model of this test's own, and this request's
        # part is what changed (another test's gateway may still be answering in this process).
        client_before = value(n + "ttft_seconds_count", model="ttft-probe")
        engine_before = value(n + "engine_ttft_seconds_count", model="ttft-probe")
        under_before = value(n + "ttft_seconds_bucket", model="ttft-probe", le="0.5")
        engine_under_before = value(n + "engine_ttft_seconds_bucket", model="ttft-probe", le="0.5")
        api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=30)
        stream = api.chat.completions.create(
            model="ttft-probe", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "fine words here"
        done = wait_until(lambda: heard.done, what="the request's Done")[0]
        assert done.status == 200 and done.stream
        # The client's: after the judge's verdict on the first window.
        assert done.ttft is not None and done.ttft >= JUDGE_TTFT, done
        # The engine's: its first token, before the verdict.
        assert done.engine_ttft is not None and done.engine_ttft < done.ttft, done

        # /metrics: the client's TTFT in ttft_seconds, the engine's in engine_ttft_seconds
        # (the exporter hears the Done after the listener above).
        wait_until(lambda: value(n + "ttft_seconds_count", model="ttft-probe") > client_before
                   and value(n + "engine_ttft_seconds_count", model="ttft-probe") > engine_before,
                   what="the request's TTFTs exported")  # fmt: skip
        assert value(n + "ttft_seconds_count", model="ttft-probe") == client_before + 1
        assert value(n + "engine_ttft_seconds_count", model="ttft-probe") == engine_before + 1
        # The engine's first token came under 0.5 s; the client's, after the judge, did not.
        engine_under = value(n + "engine_ttft_seconds_bucket", model="ttft-probe", le="0.5")
        assert engine_under == engine_under_before + 1
        assert value(n + "ttft_seconds_bucket", model="ttft-probe", le="0.5") == under_before

        # The Traffic page: the client's TTFT (what an SLO is held to) and the engine's.
        items = traffic.take(int(time.time()) + 1)
        window = Window()
        window.add(items)
        fig = window.summary(time.time() + 1)["ttft-probe"]
        assert fig["ttft_p50_ms"] >= JUDGE_TTFT * 1000, fig
        assert fig["engine_ttft_p50_ms"] < fig["ttft_p50_ms"], fig
        from gateway.live import traffic_rows

        html = render_to_string("gateway/partials/traffic.html",
                                {"rows": traffic_rows({"ttft-probe": fig}), "span": 5, "ejected": []})  # fmt: skip
        assert f'data-role="ttft-p50">≤ {fig["ttft_p50_ms"]:.0f} ms' in html, html
        assert f'data-role="engine-ttft-p50">≤ {fig["engine_ttft_p50_ms"]:.0f} ms' in html, html
    finally:
        h.close()
        records.RECORDER.stop()
