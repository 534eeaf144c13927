"""The guard's charts as geometry: every mark inside the plot, where its value puts it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from guard import charts

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def test_score_chart_puts_each_text_at_its_score_in_its_strip() -> None:
    points = [
        charts.ScorePoint("a", 0, "ordinary", 0.0, False, "continue"),
        charts.ScorePoint("a", 1, "harmful", 1.0, True, "bomb"),
        charts.ScorePoint("a", 2, "ordinary", 0.5, True, "x" * 200),
        charts.ScorePoint("a", 3, "harmful", None, False, "failed"),
        charts.ScorePoint("b", 0, "ordinary", 0.25, False, "continue"),
    ]
    chart = charts.score_chart(["a", "b"], points, {"a": "FP 50%"})
    a, b = chart.bands
    assert (a.judge, b.judge, a.failures, b.failures, a.figures, b.figures) == (
        "a", "b", 1, 0, "FP 50%", "",
    )  # fmt: skip
    xs = [d.x for d in a.dots]
    assert xs == [chart.left, chart.left + chart.plot_width, chart.left + chart.plot_width / 2]
    for band in chart.bands:
        assert band.y < band.name_y < band.ordinary_y < band.harmful_y < band.y + charts.BAND
        for d in band.dots:
            strip = band.ordinary_y if d.label == "ordinary" else band.harmful_y
            assert abs(d.y - strip) <= 6
    assert [d.flagged for d in a.dots] == [False, True, True]
    assert a.dots[2].title.endswith("…") and len(a.dots[2].title) < 120
    assert chart.height == chart.top + 2 * charts.BAND + charts.BOTTOM
    assert [label for _, label in chart.ticks] == ["0", "0.25", "0.5", "0.75", "1"]


samples = st.lists(
    st.builds(
        charts.Sample,
        at=st.integers(0, 10_000).map(lambda s: T0 + timedelta(seconds=s)),
        ok=st.booleans(),
        latency_ms=st.one_of(st.none(), st.floats(0, 1e5)),
        safe=st.integers(0, 1000),
        unsafe=st.integers(0, 1000),
        controversial=st.integers(0, 1000),
        failures=st.integers(0, 1000),
    ),
    max_size=30,
)


@given(samples)
def test_timeline_marks_stay_in_their_panels(found: list[charts.Sample]) -> None:
    t = charts.timeline(found)
    assert t.empty == (not found)
    for x, y, _ in t.points:
        assert t.left <= x <= t.right and t.latency_top <= y <= t.latency_bottom
    for x, _ in t.failed:
        assert t.left <= x <= t.right
    assert len(t.points) == sum(1 for s in found if s.ok and s.latency_ms is not None)
    assert len(t.failed) == sum(1 for s in found if not s.ok)
    assert len(t.bars) == max(len(found) - 1, 0)
    for bar in t.bars:
        assert t.left <= bar.x and bar.x + bar.width <= t.right + 1
        for _, y, h in bar.parts:
            assert h >= 0 and t.bars_top - 0.5 <= y and y + h <= t.bars_bottom + 0.5


def test_timeline_bars_are_the_decisions_between_samples() -> None:
    def s(minute: int, safe: int, unsafe: int, failures: int = 0, ok: bool = True) -> charts.Sample:
        return charts.Sample(
            T0 + timedelta(minutes=minute), ok, 10.0 * (minute + 1), safe, unsafe, 0, failures
        )

    t = charts.timeline([s(0, 0, 0), s(1, 8, 2), s(2, 8, 2, failures=4), s(3, 3, 0)])
    assert [b.title.split(": ", 1)[1] for b in t.bars] == [
        "8 safe, 2 unsafe",
        "4 failed",
        "3 safe",  # the counters went back (records reset): counted from zero
    ]
    first = {v: h for v, _, h in t.bars[0].parts}
    assert first["safe"] == 4 * first["unsafe"]
    # The busiest interval (10) fills the panel on a nice scale of 10.
    assert sum(first.values()) == t.bars_bottom - t.bars_top
    assert [label for _, label in t.latency_ticks] == ["0 ms", "25 ms", "50 ms"]


def test_nice_ceiling() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 0.3, 1, 7, 10, 11, 23, 240, 1001)] == [
        1.0, 0.5, 1.0, 10.0, 10.0, 20.0, 25.0, 250.0, 2000.0,
    ]  # fmt: skip
    # A subnormal latency (found by hypothesis) still gets a scale above zero.
    assert 0 < charts.nice_ceiling(5e-324) <= 1e-299


@given(st.floats(1e-6, 1e9))
def test_nice_ceiling_is_at_least_the_value_and_within_double(value: float) -> None:
    top = charts.nice_ceiling(value)
    assert value * (1 - 1e-9) <= top <= value * 2.5 + 1e-9
