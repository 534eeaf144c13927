"""An operator's first hour, as scenarios in a real browser against real processes.

The fixtures are the e2e tests' own: a real ``manage.py serve``, agents with simulated
cards, and Debian's Chromium signed in as a user.
"""

from __future__ import annotations

from tests.e2e.conftest import agents, chromium, console, control_plane  # noqa: F401
