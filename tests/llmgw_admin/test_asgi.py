"""Importing the ASGI application starts nothing: its threads start where the server starts.

A test or a script that imports ``llmgw_admin.asgi`` (the in-process tests of the lean
routes and the live websocket do) must not get the guard recorder's thread writing counts
beside it; the web process's server starts it (``llmgw_admin/server.py``), which
tests/e2e/test_web_process.py holds (counts written only at the stop).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import threading
before = {t.name for t in threading.enumerate()}
import llmgw_admin.asgi
from guard import records
started = sorted({t.name for t in threading.enumerate()} - before)
print("threads:", started, "recorder running:", records.RECORDER.running)
"""


def test_importing_the_application_starts_no_thread() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "threads: [] recorder running: False", out.stdout
