"""The gateway's options, read from the settings once (``Options.from_settings``): the
waits for a model whose catalog entry says nothing of its latency, the bounds on a body
and an answer, the guard's windows on a stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from catalog import timeouts


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


@dataclass
class Options:
    connect_timeout: float = 5.0
    # The waits for a model whose catalog entry says nothing of its latency
    # (catalog.timeouts): to the first token, between tokens, for a whole answer, and
    # held while it wakes.
    first_byte_timeout: float = 300.0
    read_timeout: float = 300.0
    whole_timeout: float = 1800.0
    wake_wait: float = 600.0
    max_body: int = 16 << 20
    max_answer: int = 64 << 20
    window_tokens: int = 16
    window_ms: float = 150.0
    retry_after: int = 10

    @classmethod
    def from_settings(cls) -> Options:
        waits = timeouts.Defaults.from_settings(settings)
        return cls(
            connect_timeout=_setting("LLMGW_GATEWAY_CONNECT_TIMEOUT", 5.0),
            first_byte_timeout=waits.first_token,
            read_timeout=waits.between,
            whole_timeout=waits.whole,
            wake_wait=waits.wake,
            max_body=_setting("LLMGW_GATEWAY_MAX_BODY", 16 << 20),
            window_tokens=_setting("LLMGW_GUARD_WINDOW_TOKENS", 16),
            window_ms=_setting("LLMGW_GUARD_WINDOW_MS", 150.0),
        )
