"""An operator's first hour: the heartbeat age a node shows is current, not frozen.

A real Chromium against a real ``manage.py serve`` and a simulated agent. Heartbeats push
nothing to the consoles (only state changes do), so the age must be kept current by the
page itself (``static/llmgw/console.js`` asks ``/cluster/heartbeats/``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from cluster.models import Node
from tests.e2e.conftest import Agent, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"

# How much later than the first rendered heartbeat the page must come to show one: past
# this, an age counted from the first render would read at least this many seconds.
LATER_S = 20
CURRENT_S = 15  # the agent heartbeats every second: a current age reads well under this


def test_the_heartbeat_age_stays_current_without_a_push(
    console: Callable[..., Any], agents: Callable[..., Agent], viewer: Any
) -> None:
    agents("hb-1", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="hb-1", health="ready").first(), 30, "node")
    page = console(viewer)
    card = f"#cluster-node-{node.pk}"
    stamp = page.locator(f"{card} time[data-heartbeat]")
    first = stamp.get_attribute("datetime")
    assert first, "the node's heartbeat is rendered with its timestamp"
    # Marks the node's element: a push would replace it.
    page.evaluate("(sel) => { document.querySelector(sel).__firstRender = true; }", card)

    # Polled from here (page.evaluate): the page's Content-Security-Policy refuses the
    # eval that page.wait_for_function runs in the page.
    wait_for(
        lambda: page.evaluate(
            """([sel, first, later]) => {
              const t = document.querySelector(sel + ' time[data-heartbeat]');
              return Date.parse(t.getAttribute('datetime')) - Date.parse(first) >= later * 1000;
            }""",
            [card, first, LATER_S],
        ),
        LATER_S + 40,
        f"the page to show a heartbeat {LATER_S} s after the first it rendered",
    )
    text = stamp.inner_text()
    seconds = re.fullmatch(r"(\d+) s ago", text)
    assert seconds and int(seconds[1]) < CURRENT_S, f"the page says {text!r}"
    # The API's figure agrees with it.
    node.refresh_from_db()
    assert (timezone.now() - node.last_heartbeat).total_seconds() < CURRENT_S
    # No push carried the new time: the node's element is the one first rendered.
    assert page.evaluate("(sel) => document.querySelector(sel).__firstRender === true", card)
