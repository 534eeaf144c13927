"""The session a request names, for session affinity: plain Python, no I/O.

A client names its session, first found first: the ``x-session-id`` header (any
dialect), OpenAI's ``prompt_cache_key`` (chat and Responses: a group of requests sharing
a prefix), ``previous_response_id`` (Responses: the conversation it continues), or
Anthropic's ``metadata.user_id`` (Messages: Claude Code puts its session's id in it).

``previous_response_id`` names a response, not a session: the gateway finds the session
through the stored response (``chained``), so every turn of a conversation keeps the
session its first turn had. Keys are the client's own strings: the gateway scopes them
to the key's owner before it uses them, so two tenants' sessions never meet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.path.dialects.common import DialectError

HEADER = "x-session-id"
# The longest session key taken (Claude Code's user_id is about 150 characters).
MAX_KEY = 512

HEADER_SOURCE = "header"
CACHE_KEY = "prompt_cache_key"
PREVIOUS = "previous_response_id"
USER_ID = "metadata.user_id"


@dataclass(frozen=True)
class Session:
    """Where a request's session came from, and its key."""

    source: str
    key: str


def _key(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise DialectError(f"{where} must be a string", where)
    if len(value) > MAX_KEY:
        raise DialectError(f"{where} is {len(value)} characters; send at most {MAX_KEY}", where)
    return value


def session_of(body: Mapping[str, Any], header: str | None = None) -> Session | None:
    """The session a request names (the module's docstring), or None; a key that is not a
    string, or longer than ``MAX_KEY``, is a ``DialectError`` at its field.

    ``header`` is the request's ``x-session-id`` value (None when it has none)."""
    key = _key(header, HEADER)
    if key is not None:
        return Session(HEADER_SOURCE, key)
    for name in (CACHE_KEY, PREVIOUS):
        key = _key(body.get(name), name)
        if key is not None:
            return Session(name, key)
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        key = _key(metadata.get("user_id"), USER_ID)
        if key is not None:
            return Session(USER_ID, key)
    return None


def chained(session: Session | None, stored_session: str | None, response_id: str) -> str:
    """The session key a Responses turn takes and its stored response keeps: the session
    of the response it continues when it names one by ``previous_response_id`` (that
    response's stored key, ``stored_session``), else the session it names, else its own
    response id (a conversation's first turn starts a session of its own)."""
    if session is not None and session.source == PREVIOUS:
        return stored_session or session.key
    if session is not None:
        return session.key
    return response_id
