"""A change refused for reasons its maker can fix: the base every app's refusal extends.

The API answers any :class:`Refused` with 400 and its problems (``llmgw_core.api``), so an
app raises its own subclass (``catalog.services.Refused``) and the framework never
imports the app. Nothing here imports Django REST framework: services import this.
"""

from __future__ import annotations

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


class Refused(Exception):
    """A change refused; nothing was written. ``problems`` says why, ``detail`` what."""

    detail = "the change is refused"
    problems: list[Any]
