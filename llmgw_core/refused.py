"""A change refused for reasons its maker can fix: the base every app's refusal extends.

The API answers any :class:`Refused` with 400 and its problems (``llmgw_core.api``), so an
app raises its own subclass (``catalog.services.Refused``) and the framework never
imports the app. Nothing here imports Django REST framework: services import this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Problem(Protocol):
    """What the API says of one problem: where (``field``), what, a stable code, and
    the model it concerns when there is one (``catalog.problems.Problem`` is one)."""

    @property
    def field(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def code(self) -> str: ...

    @property
    def model(self) -> str: ...


@dataclass(frozen=True)
class Said:
    """A problem a refusal says in words only (an app's refusal with no ``problems`` of
    its own: its ``errors`` by field, or its message)."""

    field: str
    message: str
    code: str = "refused"
    model: str = ""


class Refused(Exception):
    """A change refused; nothing was written. ``problems`` says why, ``detail`` what.

    Every app's "you can fix this" exception extends it (``catalog.services.Refused``,
    ``gateway.services.KeyRefused``, ``updates.flow.FlowRefused``, ...), so the API
    answers each with 400 and its problems (``problems_of``), never a 500. A subclass
    gives ``problems``, or ``errors`` (field: messages, as a form's), or only its
    message."""

    detail = "the change is refused"
    problems: list[Any]


def problems_of(exc: Refused) -> list[Any]:
    """What ``exc`` says is wrong: its ``problems``; else its ``errors`` by field (a
    field ``__all__`` is the whole change's); else its message."""
    given = getattr(exc, "problems", None)
    if given:
        return list(given)
    errors = getattr(exc, "errors", None)
    if isinstance(errors, dict) and errors:
        return [
            Said("" if field == "__all__" else str(field), str(message))
            for field, messages in errors.items()
            for message in (messages if isinstance(messages, list | tuple) else [messages])
        ]
    return [Said("", str(exc) or exc.detail)]
