"""The gateway's options, read from the settings once (``Options.from_settings``): the
waits for a model whose catalog entry says nothing of its latency, the bounds on a body
and an answer, the guard's windows on a stream."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings as site

from catalog import timeouts


def waits_defaults(source: Any = site) -> timeouts.Defaults:
    """The gateway's waits for a model whose catalog entry gives none: its settings
    (registered with ``catalog.timeouts`` by the gateway's ``ready()``), or ``source``'s."""
    return timeouts.Defaults(
        first_token=float(source.LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT),
        between=float(source.LLMGW_GATEWAY_READ_TIMEOUT),
        whole=float(source.LLMGW_GATEWAY_WHOLE_TIMEOUT),
        wake=float(source.LLMGW_GATEWAY_WAKE_WAIT),
        set_by=SET_BY,
    )


# Where each default wait is set, as the model's page says it (catalog.timeouts.explain).
SET_BY = {
    "first_token": "the gateway's LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT",
    "between": "the gateway's LLMGW_GATEWAY_READ_TIMEOUT",
    "whole": "the gateway's LLMGW_GATEWAY_WHOLE_TIMEOUT",
    "wake": "the gateway's LLMGW_GATEWAY_WAKE_WAIT",
}


@dataclass
class Options:
    connect_timeout: float = 5.0
    # The waits for a model whose catalog entry says nothing of its latency
    # (catalog.timeouts): to the first token, between tokens, for a whole answer, and
    # held while it wakes.
    first_byte_timeout: float = 30.0
    read_timeout: float = 300.0
    whole_timeout: float = 1800.0
    wake_wait: float = 600.0
    max_body: int = 16 << 20
    max_answer: int = 64 << 20
    window_tokens: int = 16
    window_ms: float = 150.0
    retry_after: int = 10
    # A client that takes none of an answer's bytes for this long is taken as gone.
    send_timeout: float = 60.0
    # The control time zone, in which a model's schedule windows are read.
    time_zone: str = "UTC"
    # Engines and model names whose Responses and Messages requests are always
    # translated ("all": every one; gateway.path.dialects.engines.fit).
    translate: frozenset[str] = frozenset()

    def now(self) -> datetime:
        """Now, in the control time zone (a model's schedule windows are read in it)."""
        return datetime.now(zoneinfo.ZoneInfo(self.time_zone))

    @classmethod
    def from_settings(cls, settings: Any) -> Options:
        """The settings' (``django.conf.settings`` or anything with those names)."""
        # The waits the catalog's explain names too (gateway/apps.py registers them).
        waits = waits_defaults(settings)
        return cls(
            connect_timeout=float(settings.LLMGW_GATEWAY_CONNECT_TIMEOUT),
            first_byte_timeout=waits.first_token,
            read_timeout=waits.between,
            whole_timeout=waits.whole,
            wake_wait=waits.wake,
            max_body=int(settings.LLMGW_GATEWAY_MAX_BODY),
            window_tokens=int(settings.LLMGW_GUARD_WINDOW_TOKENS),
            window_ms=float(settings.LLMGW_GUARD_WINDOW_MS),
            time_zone=str(settings.TIME_ZONE),
            send_timeout=float(settings.LLMGW_HTTP_SEND_TIMEOUT),
            translate=frozenset(settings.LLMGW_GATEWAY_TRANSLATE_DIALECTS),
        )
