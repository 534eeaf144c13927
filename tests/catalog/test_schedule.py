"""The week picture (catalog.schedule): what a model wants at each hour, prewarm shown.

Frozen examples for each shape a schedule takes, then properties: the picture agrees with
``rules.window_at`` at the top of every hour and at any instant inside one, and with what
the reconciler wants (``cluster.plan.wanted``).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import rules
from catalog.durations import HOUR, MINUTE, SECOND
from catalog.schedule import (
    State,
    never_in_force,
    picture,
    state_at,
    week_grid,
    windows_in_force,
)
from catalog.spec import Model, Profile, ScaleWindow, Scaling

MON, TUE, WED, THU, FRI, SAT, SUN = range(7)
BERLIN = ZoneInfo("Europe/Berlin")


def w(
    days: list[str] | None = None, frm: str = "08:00", to: str = "18:00", lo: int = 1, hi: int = 0
):
    return ScaleWindow(days=days or [], from_=frm, to=to, min=lo, max=hi)


def hours_in_window(grid, window: int) -> set[tuple[int, int]]:
    """Return the (weekday, hour) cells whose top of the hour is in the window."""
    return {(d, c.hour) for d, day in enumerate(grid) for c in day.cells if c.window == window}


# Frozen examples


def test_every_hour_of_a_week_monday_first() -> None:
    grid = week_grid(Scaling(min=1, max=2))
    assert [d.name for d in grid] == ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    assert [c.hour for c in grid[0].cells] == list(range(24))
    assert all(c.state == State(1, 2, None) and not c.changes for d in grid for c in d.cells)
    assert grid[TUE].cells[9].title == "Tue 09:00 — min 1, max 2 (no window)"


def test_a_weekday_window_holds_from_its_from_to_its_to() -> None:
    grid = week_grid(Scaling(min=1, max=4, schedule=[w(["weekdays"], "08:00", "18:00", 3)]))
    assert hours_in_window(grid, 0) == {(d, h) for d in range(5) for h in range(8, 18)}
    assert grid[MON].cells[8].state == State(3, 4, 0)
    assert grid[MON].cells[17].title == "Mon 17:00 — min 3, max 4 (window 0)"
    assert grid[MON].cells[18].state == State(1, 4, None)
    assert grid[SAT].cells[10].state == State(1, 4, None)
    # Shading: the week's highest min is 3.
    assert (grid[MON].cells[8].level, grid[MON].cells[7].level) == (4, 2)


@pytest.mark.parametrize(
    ("days", "on"),
    [
        (["weekdays"], {MON, TUE, WED, THU, FRI}),
        (["weekends"], {SAT, SUN}),
        (["mon", "wed"], {MON, WED}),
        (["MON", "Fri"], {MON, FRI}),
        (["weekends", "fri"], {FRI, SAT, SUN}),
        ([], set(range(7))),  # no days: every day
    ],
)
def test_weekday_sets(days: list[str], on: set[int]) -> None:
    grid = week_grid(Scaling(min=0, max=2, schedule=[w(days, "10:00", "11:00", 2)]))
    assert hours_in_window(grid, 0) == {(d, 10) for d in on}


def test_a_window_past_midnight_holds_into_the_next_morning() -> None:
    grid = week_grid(Scaling(min=1, max=4, schedule=[w(["fri"], "22:00", "02:00", 2, 3)]))
    assert hours_in_window(grid, 0) == {(FRI, 22), (FRI, 23), (SAT, 0), (SAT, 1)}
    assert grid[SAT].cells[1].state == State(2, 3, 0)
    assert grid[SAT].cells[2].state == State(1, 4, None)


def test_sunday_past_midnight_holds_on_monday_morning_of_the_same_picture() -> None:
    # The week repeats: Monday's first hours show last Sunday's window.
    grid = week_grid(Scaling(min=0, max=3, schedule=[w(["sun"], "23:00", "01:30", 3)]))
    assert (SUN, 23) in hours_in_window(grid, 0)
    assert grid[MON].cells[0].state == State(3, 3, 0)
    assert grid[MON].cells[1].state == State(3, 3, 0)
    [change] = grid[MON].cells[1].changes
    assert (change.label, change.state.window) == ("01:30", None)
    assert grid[MON].cells[2].window is None


def test_a_window_starting_inside_an_hour_shows_in_that_hour() -> None:
    grid = week_grid(Scaling(min=0, max=4, schedule=[w(["tue"], "08:30", "09:15", 2)]))
    cell = grid[TUE].cells[8]
    assert cell.state.window is None
    [change] = cell.changes
    assert (change.label, change.state) == ("08:30", State(2, 4, 0))
    assert cell.peak == 2
    assert grid[TUE].cells[9].state.window == 0
    assert [c.label for c in grid[TUE].cells[9].changes] == ["09:15"]
    assert cell.title == (
        "Tue 08:00 — min 0, max 4 (no window), on demand; from 08:30: min 2, max 4 (window 0)"
    )


def test_prewarm_opens_the_window_early_and_is_marked() -> None:
    s = Scaling(min=0, max=2, schedule=[w(["mon"], "08:00", "09:00", 2)], prewarm=HOUR)
    grid = week_grid(s)
    cold = week_grid(dataclasses.replace(s, prewarm=0))
    assert cold[MON].cells[7].min == 0
    assert grid[MON].cells[7].state == State(2, 2, 0, prewarm=True)
    assert (
        grid[MON].cells[7].title == "Mon 07:00 — min 2, max 2 (window 0, opened early by prewarm)"
    )
    assert grid[MON].cells[8].state == State(2, 2, 0, prewarm=False)
    assert grid[MON].cells[6].state.window is None


def test_a_prewarm_that_is_not_whole_minutes_shows_its_seconds() -> None:
    s = Scaling(min=1, max=2, schedule=[w(["wed"], "08:00", "09:00", 2)], prewarm=90 * SECOND)
    [change] = week_grid(s)[WED].cells[7].changes
    assert change.at == time(7, 58, 30)
    assert change.label == "07:58:30"
    assert change.state.prewarm


def test_prewarm_crosses_midnight_into_the_day_before() -> None:
    s = Scaling(min=0, max=1, schedule=[w(["wed"], "00:30", "02:00", 1)], prewarm=HOUR)
    grid = week_grid(s)
    [early] = grid[TUE].cells[23].changes
    assert (early.label, early.state) == ("23:30", State(1, 1, 0, prewarm=True))
    top = grid[WED].cells[0]
    assert top.state.prewarm
    [on_time] = top.changes
    assert (on_time.label, on_time.state) == ("00:30", State(1, 1, 0, prewarm=False))


def test_prewarm_crosses_the_end_of_the_week() -> None:
    # Monday's window opened two hours early: Sunday evening of the (repeating) week.
    s = Scaling(min=0, max=2, schedule=[w(["mon"], "00:00", "06:00", 2)], prewarm=2 * HOUR)
    grid = week_grid(s)
    assert [c.hour for c in grid[SUN].cells if c.prewarm] == [22, 23]
    assert grid[SUN].cells[21].window is None
    assert grid[MON].cells[0].state == State(2, 2, 0, prewarm=False)


def test_prewarm_of_twelve_hours_across_the_week_end_and_midnight() -> None:
    s = Scaling(min=1, max=3, schedule=[w(["mon"], "06:00", "07:00", 3)], prewarm=12 * HOUR)
    grid = week_grid(s)
    warm = {(d, c.hour) for d, day in enumerate(grid) for c in day.cells if c.prewarm}
    assert warm == {(SUN, h) for h in range(18, 24)} | {(MON, h) for h in range(6)}


def test_the_first_window_that_holds_wins_and_a_covered_one_is_never_in_force() -> None:
    s = Scaling(
        min=1,
        max=5,
        schedule=[
            w(["weekdays"], "08:00", "18:00", 3),
            w(["mon"], "09:00", "10:00", 5),  # wholly inside window 0
            w(["mon"], "17:00", "19:00", 4),  # half inside
        ],
    )
    grid = week_grid(s)
    assert grid[MON].cells[9].state == State(3, 5, 0)
    assert grid[MON].cells[17].window == 0 and grid[MON].cells[18].window == 2
    assert windows_in_force(grid) == {0, 2}
    assert never_in_force(s, grid) == [1]
    legend = picture(s).windows
    assert [(e.index, e.status) for e in legend] == [(0, "drawn"), (1, "never"), (2, "drawn")]
    assert legend[0].days == "weekdays"


def test_windows_left_out_are_drawn_as_absent_and_keep_the_others_numbers() -> None:
    s = Scaling(
        min=1, max=5, schedule=[w(["mon"], "25:00", "09:00", 4), w(["mon"], "10:00", "11:00", 2)]
    )
    pic = picture(s, leave_out={0})
    assert pic.days[MON].cells[8].window is None
    assert pic.days[MON].cells[10].state == State(2, 5, 1)
    assert [(e.index, e.status) for e in pic.windows] == [(0, "left_out"), (1, "drawn")]
    assert (
        pic.windows[1].days == "mon"
        and picture(Scaling(schedule=[w()])).windows[0].days == "every day"
    )


def test_max_reads_as_the_reconciler_reads_it() -> None:
    s = Scaling(
        min=1,
        max=2,
        schedule=[w(["thu"], "08:00", "09:00", 4, 0), w(["fri"], "08:00", "09:00", 1, 6)],
    )
    grid = week_grid(s)
    # Max 0 keeps the model's, and never below the window's min.
    assert grid[THU].cells[8].state == State(4, 4, 0)
    assert grid[FRI].cells[8].state == State(1, 6, 1)


def test_the_scaling_is_read_normalized() -> None:
    # A max of 0 with a min above it is the min (rules.normalize), outside windows too.
    assert week_grid(Scaling(min=2, max=0))[MON].cells[0].state == State(2, 2, None)
    # Min 0 and max 0: switched off, not on demand.
    off = week_grid(Scaling(min=0, max=0))[MON].cells[0]
    assert off.state == State(0, 0, None) and not off.state.on_demand and off.level == 0


def test_on_demand_hours_say_so() -> None:
    cell = week_grid(Scaling(min=0, max=2))[MON].cells[3]
    assert cell.state.on_demand
    assert cell.title == "Mon 03:00 — min 0, max 2 (no window), on demand"


def test_windows_are_read_by_the_wall_clock_of_the_zone() -> None:
    s = Scaling(min=0, max=1, schedule=[w(["mon"], "08:00", "09:00", 1)])
    for zone in (UTC, BERLIN, ZoneInfo("America/New_York"), ZoneInfo("Asia/Kolkata")):
        assert hours_in_window(week_grid(s, zone), 0) == {(MON, 8)}


def test_an_unreadable_clock_is_read_as_the_rules_read_it() -> None:
    # window_at reads it as midnight; the picture asks window_at, so it agrees (the
    # editor leaves such windows out, the rules refuse them).
    s = Scaling(min=0, max=1, schedule=[w(["tue"], "8am", "02:00", 1)])
    assert hours_in_window(week_grid(s), 0) == {(TUE, 0), (TUE, 1)}


def test_the_input_is_left_alone() -> None:
    s = Scaling(min=2, max=0, schedule=[w(["mon"]), w(["tue"])], prewarm=HOUR)
    before = dataclasses.replace(s, schedule=list(s.schedule))
    picture(s, leave_out={1})
    assert s == before and s.max == 0 and len(s.schedule) == 2


# Properties

zones = st.sampled_from(
    ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
)
clocks = st.one_of(
    st.integers(0, 23).map(lambda h: f"{h:02d}:00"),
    st.integers(0, 24 * 60 - 1).map(lambda m: f"{m // 60:02d}:{m % 60:02d}"),
)
day_lists = st.lists(
    st.sampled_from(
        ["mon", "tue", "wed", "thu", "fri", "sat", "sun", "weekdays", "weekends", "Sun"]
    ),
    max_size=3,
)


@st.composite
def scalings(draw):
    schedule = []
    for _ in range(draw(st.integers(0, 4))):
        start = draw(clocks)
        end = draw(clocks.filter(lambda c, s=start: c != s))
        schedule.append(
            ScaleWindow(
                days=draw(day_lists),
                from_=start,
                to=end,
                min=draw(st.integers(0, 4)),
                max=draw(st.integers(0, 6)),
            )
        )
    prewarm = draw(
        st.one_of(
            st.just(0),
            st.integers(0, 12 * 60).map(lambda m: m * MINUTE),
            st.integers(0, 12 * 3600).map(lambda s: s * SECOND),
        )
    )
    return Scaling(
        min=draw(st.integers(0, 3)), max=draw(st.integers(0, 5)), schedule=schedule, prewarm=prewarm
    )


def expected(s: Scaling, t: datetime) -> State:
    """Return what is in force at t, straight from rules.window_at."""
    n = rules.normalize(Model(scaling=s)).scaling
    found = rules.window_at(n, t)
    if found is None:
        return State(n.min, n.max, None)
    index = next(i for i, x in enumerate(n.schedule) if x is found)
    cold = rules.window_at(dataclasses.replace(n, prewarm=0), t)
    return State(found.min, max(found.max or n.max, found.min), index, cold is not found)


MONDAY = datetime(2024, 1, 1)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(s=scalings(), zone=zones)
def test_every_top_of_the_hour_agrees_with_window_at(s: Scaling, zone: str) -> None:
    tz = ZoneInfo(zone)
    grid = week_grid(s, tz)
    for d in range(7):
        for h in range(24):
            t = (MONDAY + timedelta(days=d, hours=h)).replace(tzinfo=tz)
            assert grid[d].cells[h].state == expected(s, t), (d, h)


@FAST
@given(
    s=scalings(),
    zone=zones,
    instants=st.lists(st.integers(0, 7 * 24 * 3600 - 1), min_size=1, max_size=40),
)
def test_any_instant_of_the_week_agrees_with_window_at(
    s: Scaling, zone: str, instants: list[int]
) -> None:
    """Changes inside an hour are found wherever window_at's answer changes."""
    tz = ZoneInfo(zone)
    grid = week_grid(s, tz)
    # The instants where something opens or closes, and the seconds either side.
    edges = []
    for x in s.schedule:
        for clock_text in (x.from_, x.to):
            m = rules.clock(clock_text) or 0
            for d in range(7):
                base = (d * 24 * 60 + m) * 60
                for lead in (0, s.prewarm // SECOND):
                    edges += [(base - lead + k) % (7 * 24 * 3600) for k in (-1, 0, 1)]
    for second in [*instants, *edges]:
        t = (MONDAY + timedelta(seconds=second)).replace(tzinfo=tz)
        got = state_at(grid, t.weekday(), t.time())
        assert got == expected(s, t), (t, got)


@FAST
@given(s=scalings())
def test_the_picture_agrees_with_what_the_reconciler_wants(s: Scaling) -> None:
    from cluster import plan

    m = rules.normalize(
        Model(
            name="m", source="/m.gguf", profiles=[Profile(name="cpu", engine="llamacpp")], scaling=s
        )
    )
    grid = week_grid(s, UTC)
    for d in range(7):
        for h in range(0, 24, 3):
            t = (MONDAY + timedelta(days=d, hours=h)).replace(tzinfo=UTC)
            cell = grid[d].cells[h]
            want = plan.wanted(m, t)
            if cell.state.on_demand:
                assert want.count == 0  # nobody asked
                assert plan.wanted(m, t, last_demand=t).count == 1
            else:
                assert want.count == cell.min


@FAST
@given(s=scalings(), data=st.data())
def test_leaving_windows_out_draws_the_schedule_without_them(
    s: Scaling, data: st.DataObject
) -> None:
    out = data.draw(st.sets(st.integers(0, max(len(s.schedule) - 1, 0))))
    kept = [x for i, x in enumerate(s.schedule) if i not in out]
    renumber = [i for i in range(len(s.schedule)) if i not in out]
    left = week_grid(s, UTC, leave_out=out)
    alone = week_grid(dataclasses.replace(s, schedule=kept), UTC)
    for a, b in zip(left, alone, strict=True):
        for x, y in zip(a.cells, b.cells, strict=True):
            assert x.state.min == y.state.min and x.state.max == y.state.max
            assert x.window == (None if y.window is None else renumber[y.window])
