"""The guard's windows on a streamed answer: plain Python, no I/O, no clock of its own.

A streamed answer is held back and released only as far as judges have read it. Events
arrive (``add``) with the text each carries; once the text not yet judged holds
``tokens`` chunks of text, or its oldest part is ``interval`` seconds old, a window is
``due``: the lead judges the whole text so far (``start`` gives it, and a ``Ticket``
saying how far it reaches) and hands the verdict back (``allow``, or the stream ends).
Text that arrives while a window is judged waits for the next one.

What is released (``releasable``) is every event up to the end of the judged text but
its last ``margin`` characters, and after it the events that carry no text (a role chunk, the finish chunk, usage), which
cannot carry anything a judge has not read. The margin is judged again with what follows
it: a harmful phrase cut in two by a window's end (``UNSAFE-`` judged alone as safe, then
``MARKER``) is not half released; the last window of an answer (``allow(final=True)``)
releases all it judged. So under ``fail: closed`` no unjudged byte
of text ever leaves; under ``fail: open`` the lead calls ``allow`` for a window every
judge failed on (and counts it).

Memory is bounded by the lead: ``held_bytes`` says how much is waiting, and a lead
stops reading the engine while it is over its bound (the engine then waits on TCP).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Defaults: a window every 16 chunks of text or 150 ms, whichever comes first, so the
# delay a judge adds to the answer is bounded by the interval plus one judgement.
TOKENS = 16
INTERVAL = 0.15
# Characters at the end of a judged window held back until the next window reads them in
# context (a phrase a window's end cut in two).
MARGIN = 64


@dataclass(frozen=True)
class Ticket:
    """A window being judged: the text so far, and how far into it that is."""

    text: str
    upto: int


class Holdback:
    __slots__ = (
        "_held",
        "_parts",
        "_length",
        "_judged",
        "_pending",
        "_pending_since",
        "_judging",
        "held_bytes",
        "tokens",
        "interval",
        "windows",
        "margin",
        "released_text",
    )

    def __init__(
        self, tokens: int = TOKENS, interval: float = INTERVAL, margin: int = MARGIN
    ) -> None:
        self._held: deque[tuple[bytes, int]] = deque()
        self._parts: list[str] = []
        self._length = 0
        self._judged = 0
        self._pending = 0
        self._pending_since: float | None = None
        self._judging = False
        self.held_bytes = 0
        self.tokens = max(1, tokens)
        self.interval = interval
        self.windows = 0
        self.margin = max(0, margin)
        # Whether an event carrying text has been released yet (the client's first
        # token: what came before it carried none, a role chunk say).
        self.released_text = False

    @property
    def judging(self) -> bool:
        return self._judging

    @property
    def unjudged(self) -> bool:
        """Whether some text has not been judged yet (nor is being judged)."""
        return self._length > self._judged and (not self._judging or self._pending > 0)

    def add(self, event: bytes, text: str, now: float) -> None:
        """An event from the engine, with the text it carries ('' for none)."""
        if text:
            self._parts.append(text)
            self._length += len(text)
            self._pending += 1
            if self._pending_since is None:
                self._pending_since = now
        self._held.append((event, self._length))
        self.held_bytes += len(event)

    def due(self, now: float) -> bool:
        """Whether a window should be judged now."""
        if self._judging or not self._pending:
            return False
        if self._pending >= self.tokens:
            return True
        return self._pending_since is not None and now - self._pending_since >= self.interval

    def wait(self, now: float) -> float | None:
        """Seconds until a window is due by time alone (None: nothing waits)."""
        if self._judging or self._pending_since is None:
            return None
        return max(0.0, self._pending_since + self.interval - now)

    def start(self) -> Ticket:
        """Begin judging the text so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        self._judging = True
        self._pending = 0
        self._pending_since = None
        self.windows += 1
        return Ticket(self._parts[0] if self._parts else "", self._length)

    def allow(self, ticket: Ticket, final: bool = False) -> None:
        """The window's text was judged and may go out, but for its margin unless it is
        the answer's last window."""
        self._judging = False
        upto = ticket.upto if final else ticket.upto - self.margin
        self._judged = max(self._judged, upto)

    def releasable(self) -> list[bytes]:
        """The events that may be sent now, in order; they leave the hold."""
        out: list[bytes] = []
        while self._held and self._held[0][1] <= self._judged:
            event, upto = self._held.popleft()
            self.held_bytes -= len(event)
            out.append(event)
            self.released_text = self.released_text or upto > 0
        return out

    def text(self) -> str:
        """All the text the answer has carried so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def drop(self) -> None:
        """Forget what is held (the answer was refused, or the stream failed)."""
        self._held.clear()
        self.held_bytes = 0
