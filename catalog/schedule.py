"""The week's picture of a model's scaling: the replicas it wants, hour by hour.

Plain Python on ``catalog.spec`` (no Django), used by the model's page and the schedule
editor (``catalog.views.pages``, ``catalog.views.schedule``), which draw it with
``templates/catalog/partials/week.html``.

Which window is in force is only ever asked of ``catalog.rules.window_at``, the one
reading of schedule windows the reconciler uses too; nothing here decides it. What this
module adds is where to ask: at the top of every hour, and at every instant inside an
hour where the answer can change. The answer can change only where some window opens
(its ``from``, pulled forward by prewarm) or closes (its ``to``), so asking there finds
every change: a window from 08:30, or one opened at 07:40 by a 20-minute prewarm, shows
in the hour it starts in, not only from the next one.

The week sampled is the first week of January 2024 (Monday the 1st), when no time zone
changes its clocks; the week repeats, so Sunday's cells show Monday's windows opened early
by prewarm, and Monday's cells Sunday's windows that run past midnight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo

from catalog import rules, spec

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Naive: the zone is attached per call, as window_at reads midnights in t's tzinfo.
_MONDAY = datetime(2024, 1, 1)
_HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class State:
    """What is in force from some instant on: the replicas wanted, and why.

    ``min`` and ``max`` are the window's (its max 0 meaning the model's, and never below
    its min, as ``cluster.plan.wanted`` reads them) or, outside every window, the
    model's. ``window`` is the window's index in the schedule, or None. ``prewarm`` is
    true when that window is in force only because prewarm opens it early.
    """

    min: int
    max: int
    window: int | None
    prewarm: bool = False

    @property
    def on_demand(self) -> bool:
        """Return whether replicas then run only while asked for (min 0, max above)."""
        return self.min == 0 and self.max > 0

    @property
    def label(self) -> str:
        """Return the state as the picture's hover text says it."""
        if self.window is None:
            why = "no window"
        elif self.prewarm:
            why = f"window {self.window}, opened early by prewarm"
        else:
            why = f"window {self.window}"
        text = f"min {self.min}, max {self.max} ({why})"
        return f"{text}, on demand" if self.on_demand else text


@dataclass(frozen=True)
class Change:
    """A change of what is in force, inside an hour: at this wall-clock time."""

    at: time
    state: State

    @property
    def label(self) -> str:
        """Return the time as HH:MM, with seconds only when it has some."""
        return self.at.strftime("%H:%M:%S" if self.at.second else "%H:%M")


@dataclass(frozen=True)
class GridCell:
    """One hour of the week: what is in force at its top, and any change inside it.

    ``level`` (0 to 4) is the min at the top of the hour relative to the week's highest
    min, for shading.
    """

    hour: int
    state: State
    changes: tuple[Change, ...] = ()
    level: int = 0
    day: str = ""

    @property
    def title(self) -> str:
        """Return the hover text: the state at the top of the hour, then each change."""
        text = f"{self.day} {self.hour:02d}:00 — {self.state.label}"
        return "".join([text, *(f"; from {c.label}: {c.state.label}" for c in self.changes)])

    @property
    def min(self) -> int:
        """Return the replicas wanted at the top of the hour (the floor)."""
        return self.state.min

    @property
    def max(self) -> int:
        """Return the ceiling at the top of the hour."""
        return self.state.max

    @property
    def window(self) -> int | None:
        """Return the window in force at the top of the hour, or None."""
        return self.state.window

    @property
    def prewarm(self) -> bool:
        """Return whether the top of the hour is inside a window's early opening."""
        return self.state.prewarm

    @property
    def peak(self) -> int:
        """Return the highest min in force at any time in the hour."""
        return max([self.state.min, *(c.state.min for c in self.changes)])

    def states(self) -> list[State]:
        """Return every state in force during the hour, in order."""
        return [self.state, *(c.state for c in self.changes)]


@dataclass(frozen=True)
class GridDay:
    """One day of the week picture: 24 cells."""

    name: str
    cells: list[GridCell]


def week_grid(
    scaling: spec.Scaling, tz: tzinfo = UTC, *, leave_out: Collection[int] = ()
) -> list[GridDay]:
    """Return the replicas wanted at each hour of a week, Monday first.

    Every hour is read with ``rules.window_at`` in ``tz`` (the control time zone) at
    its top, and again at each instant inside it where a window opens (early by
    prewarm, or on time) or closes. The scaling is read as the rules' ``normalize``
    leaves it (a max of 0 with a min above is the min). ``leave_out`` names windows to
    draw as if they were absent (the editor's rows with errors); the others keep their
    indices.
    """
    s = _scaling(scaling, leave_out)
    cold = dataclasses.replace(s.scaling, prewarm=0)
    start = _MONDAY.replace(tzinfo=tz)
    inside = sorted(t for t in _boundaries(s.scaling, tz) if start <= t < start + 7 * 24 * _HOUR)
    raw: list[list[tuple[State, tuple[Change, ...]]]] = []
    k = 0
    for d in range(7):
        day = []
        for h in range(24):
            top = (_MONDAY + timedelta(days=d, hours=h)).replace(tzinfo=tz)
            state = _state(s, cold, top)
            changes = []
            last = state
            while k < len(inside) and inside[k] < top + _HOUR:
                t = inside[k]
                k += 1
                if t <= top:
                    continue
                now = _state(s, cold, t)
                if now != last:
                    changes.append(Change(t.time(), now))
                    last = now
            day.append((state, tuple(changes)))
        raw.append(day)
    peak = max((x.min for day in raw for state, ch in day for x in (state, *(c.state for c in ch))))
    return [
        GridDay(
            name=WEEKDAYS[d],
            cells=[
                GridCell(h, state, changes, -(-state.min * 4 // peak) if peak else 0, WEEKDAYS[d])
                for h, (state, changes) in enumerate(day)
            ],
        )
        for d, day in enumerate(raw)
    ]


def state_at(grid: list[GridDay], weekday: int, at: time) -> State:
    """Return what the picture says is in force on a weekday (0 Monday) at a time."""
    cell = grid[weekday].cells[at.hour]
    state = cell.state
    for c in cell.changes:
        if c.at <= at:
            state = c.state
    return state


def windows_in_force(grid: list[GridDay]) -> set[int]:
    """Return the indices of the windows in force at some time of the week."""
    return {
        st.window
        for day in grid
        for cell in day.cells
        for st in cell.states()
        if st.window is not None
    }


def never_in_force(
    scaling: spec.Scaling, grid: list[GridDay], leave_out: Collection[int] = ()
) -> list[int]:
    """Return the windows drawn that are never in force: earlier windows always win.

    The rules allow overlapping windows (the first that holds wins, as the reference
    has it); a window wholly covered by earlier ones is then dead weight, which the
    editor points out.
    """
    seen = windows_in_force(grid)
    return [i for i in range(len(scaling.schedule)) if i not in leave_out and i not in seen]


@dataclass(frozen=True)
class LegendEntry:
    """A window of the schedule as the picture's legend lists it.

    ``status``: ``drawn``; ``left_out`` (not drawn, as the caller asked: it has errors);
    ``never`` (drawn, but never in force: earlier windows hold whenever it would).
    """

    index: int
    window: spec.ScaleWindow
    status: str

    @property
    def days(self) -> str:
        """Return the window's days as written, or "every day" for none."""
        return ", ".join(self.window.days) or "every day"


@dataclass(frozen=True)
class WeekPicture:
    """What the week fragment draws: the grid, and a legend of the windows."""

    days: list[GridDay]
    windows: list[LegendEntry]
    prewarm: int

    @property
    def has_changes_inside_hours(self) -> bool:
        """Return whether some hour's cell has a change inside it (for the key)."""
        return any(c.changes for day in self.days for c in day.cells)

    @property
    def has_on_demand(self) -> bool:
        """Return whether some time of the week is on demand (for the key)."""
        return any(st.on_demand for day in self.days for c in day.cells for st in c.states())


def picture(
    scaling: spec.Scaling, tz: tzinfo = UTC, *, leave_out: Collection[int] = ()
) -> WeekPicture:
    """Return the week picture of a scaling: ``week_grid`` and its windows' legend."""
    grid = week_grid(scaling, tz, leave_out=leave_out)
    never = set(never_in_force(scaling, grid, leave_out))
    legend = [
        LegendEntry(i, w, "left_out" if i in leave_out else "never" if i in never else "drawn")
        for i, w in enumerate(scaling.schedule)
    ]
    return WeekPicture(grid, legend, scaling.prewarm)


# Reading


@dataclass(frozen=True)
class _Drawn:
    scaling: spec.Scaling
    index: list[int]  # position in the drawn schedule -> index in the given one


def _scaling(scaling: spec.Scaling, leave_out: Collection[int]) -> _Drawn:
    kept = [i for i in range(len(scaling.schedule)) if i not in leave_out]
    s = rules.normalize(spec.Model(scaling=scaling)).scaling
    # A scaling of its own: normalize may hand back the one given (it copies on write).
    s = dataclasses.replace(s, schedule=[s.schedule[i] for i in kept])
    return _Drawn(s, kept)


def _state(s: _Drawn, cold: spec.Scaling, t: datetime) -> State:
    w = rules.window_at(s.scaling, t)
    if w is None:
        return State(s.scaling.min, s.scaling.max, None)
    i = next(j for j, x in enumerate(s.scaling.schedule) if x is w)
    early = s.scaling.prewarm > 0 and rules.window_at(cold, t) is not w
    return State(w.min, max(w.max or s.scaling.max, w.min), s.index[i], early)


def _boundaries(s: spec.Scaling, tz: tzinfo) -> set[datetime]:
    """Return every instant near the week where a window may open or close.

    For each window and each day from the Sunday before to the Tuesday after: its
    ``from`` less prewarm (rounded up to the microsecond, the first instant a datetime
    can name at which it holds), its ``from`` (where an early opening becomes an
    on-time one) and its ``to`` (a window past midnight closes at the next day's ``to``,
    which is another day's here). An unreadable clock is midnight, as window_at reads it.
    """
    lead = timedelta(microseconds=-(-s.prewarm // 1000))
    out: set[datetime] = set()
    for w in s.schedule:
        opens = rules.clock(w.from_) or 0
        closes = rules.clock(w.to) or 0
        for d in range(-1, 9):
            midnight = _MONDAY + timedelta(days=d)
            on_time = (midnight + timedelta(minutes=opens)).replace(tzinfo=tz)
            early = (on_time.astimezone(UTC) - lead).astimezone(tz)
            out.update((early, on_time, (midnight + timedelta(minutes=closes)).replace(tzinfo=tz)))
    return out
