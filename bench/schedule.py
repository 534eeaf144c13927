"""Measure the week picture: what the schedule editor computes on every check.

    .venv/bin/python bench/schedule.py

``catalog.schedule.picture`` for schedules of 0, 1, 4 and 10 windows with a 20-minute
prewarm, in Europe/Berlin: 168 hours read with ``rules.window_at``, plus every instant
inside an hour where a window opens or closes. Prints the best of 5 per size. Asserts
nothing; no Django.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from catalog.durations import MINUTE  # noqa: E402
from catalog.schedule import picture  # noqa: E402
from catalog.spec import ScaleWindow, Scaling  # noqa: E402

DAYS = ["weekdays", "mon", "sat", "weekends", "fri"]


def scaling(n: int) -> Scaling:
    return Scaling(
        min=1,
        max=4,
        prewarm=20 * MINUTE,
        schedule=[
            ScaleWindow(
                days=[DAYS[i % len(DAYS)]],
                from_=f"{(6 + i) % 24:02d}:{(i * 15) % 60:02d}",
                to=f"{(18 + i) % 24:02d}:00",
                min=1 + i % 3,
            )
            for i in range(n)
        ],
    )


def main() -> None:
    zone = ZoneInfo("Europe/Berlin")
    for n in (0, 1, 4, 10):
        s = scaling(n)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            picture(s, zone)
            best = min(best, time.perf_counter() - t)
        print(f"week picture, {n:2d} windows: {best * 1000:.1f} ms")


if __name__ == "__main__":
    main()
