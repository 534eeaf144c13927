"""What the processes' logs say while a dependency is away: each line stamped with its
time, and Celery beat's traceback for a task it cannot send (Redis away) given whole once,
then a line a minute (it came every few seconds, 63 in five minutes)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_admin.logfilters import Repeats
from tests.e2e.conftest import ROOT, wait_for
from tests.faultproxy import FaultProxy
from tests.redisserver import RedisServer

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) ", re.M)


def _failed(logger: logging.Logger) -> None:
    try:
        raise ConnectionError("Redis is away")
    except ConnectionError as exc:
        logger.error("Message Error: %s\n%s", exc, "the stack", exc_info=True)


def test_a_repeated_traceback_is_whole_once_then_a_line_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("llmgw_admin.logfilters.time.monotonic", lambda: now[0])
    seen: list[logging.LogRecord] = []
    logger = logging.getLogger("test.repeats")
    logger.propagate = False
    logger.addFilter(Repeats())
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    for _ in range(10):  # ten in a minute: the first whole
        _failed(logger)
        now[0] += 5
    assert len(seen) == 1 and seen[0].exc_info
    now[0] += 15  # a minute after the first: one line, no traceback, the count
    _failed(logger)
    assert len(seen) == 2 and not seen[1].exc_info
    assert seen[1].getMessage() == (
        "Message Error: Redis is away (ConnectionError: Redis is away); "
        "9 more like it in the last minute, said once a minute"
    )
    now[0] += 61  # a minute without it: the next run starts whole
    _failed(logger)
    assert len(seen) == 3 and seen[2].exc_info


@pytest.mark.e2e
def test_beat_with_redis_away_logs_its_traceback_once_and_stamps_its_lines(
    tmp_path: Path,
) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    proxy = FaultProxy(("127.0.0.1", redis.port)).start()
    log = tmp_path / "beat.log"
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
               LLMGW_REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0",
               LLMGW_DATA_DIR=str(tmp_path / "data"), LLMGW_RECONCILE_INTERVAL="1")  # fmt: skip
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "llmgw_admin", "beat", "--loglevel", "INFO",
             "--schedule", str(tmp_path / "schedule")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def sent() -> int:
            return log.read_text(errors="replace").count("Sending due task")

        wait_for(lambda: sent() >= 2, 60, "beat sending tasks")
        proxy.refuse()
        proxy.stop()
        cut = sent()
        # Each task due while Redis is away fails to be sent: several within the minute.
        wait_for(lambda: sent() >= cut + 6, 90, "beat trying six more sends")
        text = log.read_text(errors="replace")
        # One error logged (its traceback, chained exceptions and all), the sends after it
        # left out within the minute.
        errors = re.findall(r"^\[[^]]*: ERROR/MainProcess\] (.*)$", text, re.M)
        assert len(errors) == 1 and errors[0].startswith("Message Error"), errors
        assert "Traceback" in text
    finally:
        beat.terminate()
        beat.wait(timeout=30)
        proxy.stop()
        redis.stop()


def test_the_gateways_log_lines_carry_their_time_in_utc() -> None:
    """A process on the project's settings (``gateway serve``, the web process): each line
    its time, level and logger."""
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('gateway').warning('a replica failed')"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="llmgw_admin.settings")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert STAMP.match(line) and line.endswith("WARNING gateway: a replica failed"), line
