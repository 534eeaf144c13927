"""When a canary is rolled back: the pure decision over two windows of outcomes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import spec
from gateway.path.canary import Limits, Window, decide


def window(requests: int, errors: int = 0, ttft: float | None = 0.1) -> Window:
    ok = requests - errors
    if ttft is None or not ok:
        return Window(requests, errors)
    return Window(requests, errors, ttft * ok, ok)


@st.composite
def windows(draw: st.DrawFn) -> Window:
    requests = draw(st.integers(0, 400))
    errors = draw(st.integers(0, requests))
    counted = draw(st.integers(0, requests - errors))
    mean = draw(st.floats(0.001, 30, allow_nan=False))
    return Window(requests, errors, mean * counted, counted)


limits_st = st.builds(
    Limits,
    st.integers(1, 300),
    st.floats(0.0, 1.0, allow_nan=False),
    st.floats(0.1, 20, allow_nan=False),
)


def test_the_catalogs_zeros_are_the_seeds_defaults() -> None:
    assert Limits.of(spec.Canary(model="c", percent=5)) == Limits(50, 0.05, 1.5)
    assert Limits.of(spec.Canary(model="c", min_requests=10, max_error_increase=0.2,
                                 max_ttft_ratio=3)) == Limits(10, 0.2, 3)  # fmt: skip


def test_errors_past_the_increase_roll_back_with_the_figures() -> None:
    d = decide(window(50, 6), window(500, 5), Limits(), "chat-v2")
    assert d.roll_back
    assert d.why.startswith("canary chat-v2 rolled back: error rate 12% vs 1% over 50 requests")


def test_a_slower_candidate_rolls_back_with_the_figures() -> None:
    d = decide(window(60, ttft=0.52), window(600, ttft=0.06), Limits(), "chat-v2")
    assert d.roll_back
    assert "mean time to first token 520 ms vs 60 ms (8.7x, at most 1.5x) over 60" in d.why


def test_at_the_limits_it_is_kept() -> None:
    # 5 points more errors is not past 0.05, and 1.5 times is not past 1.5.
    assert not decide(window(100, 5), window(100, 0), Limits(50, 0.05, 1.5)).roll_back
    assert not decide(window(100, ttft=0.15), window(100, ttft=0.1), Limits()).roll_back
    assert decide(window(100, 6), window(100, 0), Limits()).roll_back
    assert decide(window(100, ttft=0.16), window(100, ttft=0.1), Limits()).roll_back


def test_below_min_requests_nothing_rolls_back() -> None:
    assert not decide(window(49, 49), window(1000), Limits()).roll_back
    assert decide(window(50, 49), window(1000), Limits()).roll_back


def test_with_no_traffic_of_the_models_own_errors_count_against_zero() -> None:
    assert decide(window(50, 3), Window(), Limits()).roll_back
    assert not decide(window(50, 2), Window(), Limits()).roll_back
    # and its time to first token cannot be compared: kept.
    assert not decide(window(50, ttft=9.0), Window(), Limits()).roll_back


@settings(deadline=None)  # a loaded machine's pauses are not the decision's
@given(windows(), windows(), limits_st)
def test_never_below_min_requests(cand: Window, model: Window, limits: Limits) -> None:
    if cand.requests < limits.min_requests:
        assert not decide(cand, model, limits).roll_back


@settings(deadline=None)  # a loaded machine's pauses are not the decision's
@given(windows(), limits_st)
def test_the_same_outcomes_never_roll_back(w: Window, limits: Limits) -> None:
    if limits.max_ttft_ratio >= 1:
        assert not decide(w, w, limits).roll_back


@settings(deadline=None)  # a loaded machine's pauses are not the decision's
@given(windows(), windows(), limits_st, st.integers(0, 300), st.floats(0, 1), st.floats(0, 20))
def test_looser_thresholds_never_roll_back_what_tighter_ones_keep(
    cand: Window, model: Window, limits: Limits, more_min: int, more_err: float, more_ttft: float
) -> None:
    looser = Limits(limits.min_requests + more_min, limits.max_error_increase + more_err,
                    limits.max_ttft_ratio + more_ttft)  # fmt: skip
    if decide(cand, model, looser).roll_back:
        assert decide(cand, model, limits).roll_back


@settings(deadline=None)  # a loaded machine's pauses are not the decision's
@given(windows(), windows(), limits_st, st.integers(1, 100))
def test_more_candidate_errors_never_keep_what_fewer_roll_back(
    cand: Window, model: Window, limits: Limits, more: int
) -> None:
    # The same requests, some successes turned into errors (their TTFTs no longer counted
    # would change the mean: keep the mean as it was).
    ok = cand.requests - cand.errors
    turned = min(more, ok - cand.ttft_count) if ok > cand.ttft_count else 0
    worse = Window(cand.requests, cand.errors + turned, cand.ttft_sum, cand.ttft_count)
    if decide(cand, model, limits).roll_back:
        assert decide(worse, model, limits).roll_back


@settings(deadline=None)  # a loaded machine's pauses are not the decision's
@given(windows(), windows(), limits_st)
def test_a_rollback_says_why_with_its_figures(cand: Window, model: Window, limits: Limits) -> None:
    d = decide(cand, model, limits, "cand")
    if d.roll_back:
        assert d.why.startswith("canary cand rolled back: ")
        assert f"over {cand.requests} requests" in d.why
    else:
        assert d.why == ""


@settings(deadline=None)  # a loaded machine's pauses are not the decision's
@given(windows(), windows(), limits_st)
def test_it_rolls_back_exactly_past_a_threshold(
    cand: Window, model: Window, limits: Limits
) -> None:
    enough = cand.requests >= limits.min_requests
    errors = cand.error_rate - model.error_rate > limits.max_error_increase
    slow = (
        cand.mean_ttft is not None
        and model.mean_ttft is not None
        and cand.mean_ttft / model.mean_ttft > limits.max_ttft_ratio
    )
    assert decide(cand, model, limits).roll_back == (enough and (errors or slow))
