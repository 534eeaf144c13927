"""Schedule windows: reading an HH:MM clock, and which window is in force at a time."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from catalog.durations import SECOND
from catalog.spec import ScaleWindow, Scaling

_DAY_MINUTES = 24 * 60
WEEKDAYS: dict[str, tuple[int, ...]] = {
    "mon": (0,),
    "tue": (1,),
    "wed": (2,),
    "thu": (3,),
    "fri": (4,),
    "sat": (5,),
    "sun": (6,),
    "weekdays": (0, 1, 2, 3, 4),
    "weekends": (5, 6),
}
_CLOCK = re.compile(r"[0-9]{2}:[0-9]{2}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def clock(s: str) -> int | None:
    """Return the minutes past midnight of an HH:MM time, or None if it is not one.

    Exactly two digits, a colon and two digits: the reference's scanf also took forms
    like ``+1:30`` or ``1:5x`` of the same length, which nobody means.
    """
    if not _CLOCK.fullmatch(s):
        return None
    h, m = int(s[:2]), int(s[3:])
    if h > 23 or m > 59:
        return None
    return h * 60 + m


def window_at(scaling: Scaling, t: datetime) -> ScaleWindow | None:
    """Return the schedule window in force at t, or None outside them all.

    t must be aware, already in the control time zone: the windows' days and clocks
    are read in t's tzinfo. The first window that holds wins. A window holds when t is
    in one of its openings that start yesterday, today or tomorrow (tomorrow's can open
    today, pulled forward by prewarm).

    Openings are read by the wall clock: a window from 08:00 opens at 08:00 local time
    on a day the clocks change too, and one to 17:00 closes at 17:00. (The reference
    counted elapsed time from local midnight, so on those days its windows opened an
    hour off; operators write wall-clock times and mean them.) A wall-clock time that
    does not exist on its day (inside a spring-forward gap) is read with the offset
    before the change, as zoneinfo reads it. Every comparison is on absolute time.
    Prewarm is elapsed time before the opening.
    """
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError("window_at needs an aware datetime in the control time zone")
    now = _epoch_ns(t)
    today = t.date().toordinal()
    for w in scaling.schedule:
        if _holds(w, now, today, t, scaling.prewarm):
            return w
    return None


def _holds(w: ScaleWindow, now: int, today: int, t: datetime, lead: int) -> bool:
    # An unreadable clock counts as midnight, as the reference's does; a valid
    # catalog has none.
    start = clock(w.from_) or 0
    span = (clock(w.to) or 0) - start
    if span <= 0:
        span += _DAY_MINUTES  # past midnight
    for d in (-1, 0, 1):
        day = date.fromordinal(today + d)
        if not _starts_on(w, day.weekday()):
            continue
        midnight = datetime(day.year, day.month, day.day, tzinfo=t.tzinfo)
        # Aware arithmetic within one tzinfo is wall-clock arithmetic: these are the
        # local times the window names, whatever the offset on that day.
        opens = _epoch_ns(midnight + timedelta(minutes=start)) - lead
        closes = _epoch_ns(midnight + timedelta(minutes=start + span))
        if opens <= now < closes:
            return True
    return False


def _starts_on(w: ScaleWindow, weekday: int) -> bool:
    if not w.days:
        return True
    return any(weekday in WEEKDAYS.get(d.lower(), ()) for d in w.days)


def _epoch_ns(t: datetime) -> int:
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * SECOND + d.microseconds * 1_000
