"""Go duration strings (``90s``, ``20m``, ``1h30m``, ``300ms``), parsed and written.

The catalog's files use Go's duration syntax because the reference implementation did, and
operators' files written for it must keep working. Values are held as whole nanoseconds, as
Go holds them, so nothing is lost between a file, the database and an export.
"""

from __future__ import annotations

import re

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "µs": MICROSECOND,
    "μs": MICROSECOND,
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class DurationError(ValueError):
    """A duration that cannot be read, with a message that says how to write one."""


def parse_duration(text: str) -> int:
    """Return the nanoseconds a Go duration string stands for.

    Raises DurationError for a bare number (the unit is required), an unknown unit or
    anything else that is not a duration.
    """
    s = text.strip()
    if not s:
        raise DurationError("empty duration: write a number with a unit, like 90s or 20m")
    if s == "0":
        return 0
    sign = 1
    if s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if re.fullmatch(r"\d+(\.\d*)?|\.\d+", s):
        raise DurationError(f"{text!r} has no unit: write it with one, like {s}s, {s}m or {s}h")
    pos = 0
    total = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if not m:
            raise DurationError(
                f"{text!r} is not a duration: use a number and a unit "
                "(ns, us, ms, s, m, h), like 90s, 20m or 1h30m"
            )
        number, unit = m.group(1), m.group(2)
        whole, _, frac = number.partition(".")
        scale = _UNITS[unit]
        value = int(whole or "0") * scale
        if frac:
            value += int(frac) * scale // (10 ** len(frac))
        total += value
        pos = m.end()
    return sign * total


def format_duration(ns: int) -> str:
    """Return the shortest Go-style string for a duration: ``1h30m``, ``90s``, ``300ms``.

    Zero parts are left out (``1h`` rather than Go's ``1h0m0s``), so what an operator
    wrote as ``20m`` exports as ``20m``.
    """
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns % SECOND == 0 or ns >= SECOND:
        hours, rest = divmod(ns, HOUR)
        minutes, rest = divmod(rest, MINUTE)
        out = sign
        if hours:
            out += f"{hours}h"
        if minutes:
            out += f"{minutes}m"
        if rest:
            seconds, frac = divmod(rest, SECOND)
            if frac == 0:
                out += f"{seconds}s"
            elif frac % MILLISECOND == 0 and seconds == 0:
                out += f"{frac // MILLISECOND}ms"
            else:
                out += f"{seconds}.{frac:09d}".rstrip("0") + "s"
        return out
    for unit, scale in (("ms", MILLISECOND), ("us", MICROSECOND)):
        if ns % scale == 0:
            return f"{sign}{ns // scale}{unit}"
    return f"{sign}{ns}ns"
