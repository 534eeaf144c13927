"""What context one request gets of an engine: llama-server shares --ctx-size across its
--parallel slots, so a request gets ctx-size / parallel tokens (engines knowledge; the
catalog's pages and the gateway's door both read it). No Django.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.flags import table


def effective_context(
    context_length: int, args: Sequence[str], engine: str = "llamacpp"
) -> tuple[int, str]:
    """The context one request of a replica gets, and why when it is smaller than
    ``context_length`` (0: unknown). Only llama-server divides its context."""
    if engine != "llamacpp":
        return context_length, ""
    ctx = _flag(args, ("--ctx-size", "-c"))
    parallel = _flag(args, ("--parallel", "-np"))
    if ctx is None:
        return context_length, ""
    slots = parallel if parallel and parallel > 0 else 1
    per_slot = ctx // slots
    if context_length and per_slot >= context_length:
        return context_length, ""
    return (
        per_slot,
        f"llama-server's --ctx-size {ctx} is shared by {slots} slot(s): {per_slot} each",
    )


def _flag(args: Sequence[str], names: tuple[str, ...]) -> int | None:
    # Any of the flag's names in llama-server's table (-c, --ctx-size, --ctx_size), the
    # last one given winning, as llama-server takes it.

    t = table("llamacpp")
    wanted = {t.flag(n) for n in names} - {None}
    value: str | None = None
    for i, arg in enumerate(args):
        name, eq, given = arg.partition("=")
        if t.flag(name) in wanted:
            if eq:
                value = given
            elif i + 1 < len(args):
                value = args[i + 1]
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None
