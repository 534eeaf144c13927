"""Stored responses of the Responses API (``store``, ``previous_response_id``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway import errors
from gateway.errors import ApiError

if TYPE_CHECKING:
    from gateway.cycle import Cycle


async def before(gateway: Any, cycle: Cycle, raw: bytes) -> None:
    """Read what a request continuing a stored response needs."""
    from gateway import body as bodies

    dialect = cycle.dialect
    try:
        data = bodies.parse(raw)
    except bodies.BodyError as error:
        raise errors.bad_request(error.message, error.param) from None
    request = dialect.read(data)
    if request.previous_response_id:
        raise ApiError(404, f"No response '{request.previous_response_id}' is stored.",
                       param="previous_response_id", code="response_not_found")  # fmt: skip


def after(gateway: Any, cycle: Cycle) -> None:
    """Keep the response the client had (off the request's path)."""


async def answer(gateway: Any, cycle: Cycle, method: str, path: str) -> None:
    raise errors.not_found(path)
