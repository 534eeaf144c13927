"""How long the gateway waits on a model, from its catalog entry (catalog.timeouts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import spec
from catalog.timeouts import (
    BETWEEN_FACTOR,
    BETWEEN_FLOOR,
    FIRST_TOKEN_FACTOR,
    FIRST_TOKEN_FLOOR,
    WAKE_MARGIN,
    Defaults,
    explain,
    waits,
)

S = 10**9
# Where the defaults are set, as the gateway names them (gateway.path.options.SET_BY).
SET_BY = {
    "first_token": "the gateway's LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT",
    "whole": "the gateway's LLMGW_GATEWAY_WHOLE_TIMEOUT",
    "wake": "the gateway's LLMGW_GATEWAY_WAKE_WAIT",
}
DEFAULTS = Defaults(first_token=300, between=200, whole=1800, wake=120, set_by=SET_BY)


def model(ttft: float = 0, tpot: float = 0, max_output: int = 0, startups: tuple[float, ...] = ()):
    return spec.Model(
        name="m", source="sim/m", max_output=max_output,
        slo=spec.SLO(ttft_p99=int(ttft * S), tpot_p99=int(tpot * S)),
        profiles=[spec.Profile(name=f"p{i}", engine="vllm", startup_timeout=int(t * S))
                  for i, t in enumerate(startups)],
    )  # fmt: skip


def test_a_model_that_says_nothing_takes_the_gateways_settings() -> None:
    w = waits(model(), DEFAULTS)
    assert (w.first_token, w.between, w.wake) == (300, 200, 120)
    assert w.whole(None) == w.whole(50) == 1800


def test_a_model_with_an_slo_has_waits_of_its_own() -> None:
    w = waits(model(ttft=6, tpot=2, max_output=1000), DEFAULTS)
    assert w.first_token == 60 and w.between == 20
    # A whole answer comes after its last token: the first token's wait and a share per
    # token the request may generate (its max_tokens, else the model's max_output).
    assert w.whole(10) == 60 + 10 * 20
    assert w.whole(None) == 60 + 1000 * 20


def test_a_fast_models_waits_are_never_below_the_floors() -> None:
    """A 10 s idle timeout killed long prefills on a healthy replica, and the retry failed
    the same way on the next one (gpustack #4725)."""
    w = waits(model(ttft=0.2, tpot=0.02), DEFAULTS)
    assert w.first_token == FIRST_TOKEN_FLOOR and w.between == BETWEEN_FLOOR


def test_the_wake_wait_is_the_longest_startup_and_a_margin_at_most_the_setting() -> None:
    long_wake = replace(DEFAULTS, wake=3600)
    assert waits(model(startups=(600, 60)), long_wake).wake == 600 + WAKE_MARGIN
    assert waits(model(startups=(60,)), DEFAULTS).wake == 60 + WAKE_MARGIN
    # Past the setting, the setting: the longest the site lets a client be held.
    assert waits(model(startups=(600,)), DEFAULTS).wake == 120
    assert waits(model(), DEFAULTS).wake == 120


@given(
    ttft=st.floats(0, 3600), tpot=st.floats(0, 60), max_output=st.integers(0, 1 << 20),
    asked=st.one_of(st.none(), st.integers(1, 1 << 20)),
)  # fmt: skip
def test_waits_hold_their_rules(
    ttft: float, tpot: float, max_output: int, asked: int | None
) -> None:
    m = model(ttft=ttft, tpot=tpot, max_output=max_output)
    w = waits(m, DEFAULTS)
    if m.slo.ttft_p99:
        assert w.first_token == pytest.approx(
            max(FIRST_TOKEN_FLOOR, FIRST_TOKEN_FACTOR * m.slo.ttft_p99 / S)
        )
    else:
        assert w.first_token == DEFAULTS.first_token
    if m.slo.tpot_p99:
        assert w.between == pytest.approx(max(BETWEEN_FLOOR, BETWEEN_FACTOR * m.slo.tpot_p99 / S))
    else:
        assert w.between == DEFAULTS.between
    # A whole answer never waits less than its first token would.
    assert w.whole(asked) >= w.first_token
    if asked and m.slo.tpot_p99:
        assert w.whole(asked) <= w.whole(asked + 1)


def test_the_models_page_says_each_wait_and_why() -> None:
    rows = {name: (value, why) for name, value, why in explain(
        model(ttft=3, tpot=0.05, max_output=512, startups=(1200,)), DEFAULTS)}  # fmt: skip
    assert rows["first token"] == ("30s", "10 × slo.ttft_p99 of 3s, at least 10s")
    assert rows["between tokens"] == ("15s", "10 × slo.tpot_p99 of 50ms, at least 15s")
    assert rows["whole answer"][0] == "30s + 500ms a token asked for"
    assert rows["whole answer"][1].startswith("4m46s at max_output 512")
    assert rows["held while waking"] == (
        "2m", "the gateway's LLMGW_GATEWAY_WAKE_WAIT, shorter than the longest "
        "startup_timeout, 20m, and 30s")  # fmt: skip
    quick = {n: (v, w) for n, v, w in explain(model(startups=(60,)), DEFAULTS)}
    assert quick["held while waking"] == ("1m30s", "the longest startup_timeout, 1m, and 30s")
    plain = {name: (value, why) for name, value, why in explain(model(), DEFAULTS)}
    assert plain["first token"] == ("5m", "no slo.ttft_p99: the gateway's "
                                          "LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT")  # fmt: skip
    assert plain["whole answer"][0] == "30m"


def test_the_site_defaults_are_the_gateways_settings_named_by_the_gateway(settings) -> None:
    """The catalog names no setting of the gateway's: the gateway gives its waits and
    their names (gateway.path.options.waits_defaults, registered by its ready())."""
    from catalog.timeouts import site_defaults

    settings.LLMGW_GATEWAY_WAKE_WAIT = 45
    got = site_defaults()
    assert (got.first_token, got.between, got.whole, got.wake) == (
        settings.LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT, settings.LLMGW_GATEWAY_READ_TIMEOUT,
        settings.LLMGW_GATEWAY_WHOLE_TIMEOUT, 45,
    )  # fmt: skip
    assert got.said("between") == "the gateway's LLMGW_GATEWAY_READ_TIMEOUT"
    assert Defaults(1, 2, 3, 4).said("between") == "the site's default"
    source = (Path(__file__).parents[2] / "catalog" / "timeouts.py").read_text()
    assert "LLMGW_" not in source
