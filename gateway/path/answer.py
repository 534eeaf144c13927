"""An engine's answer passed on to the client: whole, or streamed event by event.

A whole answer is read to its end (bounded), made OpenAI's shape when it is an engine's
error, judged whole when the policy judges answers, and sent. A stream is framed as
server-sent events and relayed as they come; under a guard that judges answers it is
held in windows (``gateway.path.holdback``) and only judged text leaves. An engine's own
Responses or Messages answer is first read into the chat answer or chunks it means
(``gateway.path.dialect``, ``gateway.path.dialects.native``), so both are judged alike. Before the first
byte reaches the client a failure raises ``Retry`` (another replica may answer); after
it the stream ends with an error event and ``[DONE]``.

Tokens in and out are read from the answer's usage on the way (without parsing it all).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.path import body as bodies
from gateway.path import errors, sse
from gateway.path.dialect import usage_counted
from gateway.path.dialects.native import NativeError
from gateway.path.guarding import GuardRefused, filtered_end, held_text
from gateway.path.holdback import Holdback
from llmgw_core.upstream import BROKEN, TIMEOUT, Response, UpstreamError

if TYPE_CHECKING:
    from catalog.timeouts import Waits
    from gateway.path.cycle import Cycle
    from gateway.path.guarding import Judging
    from gateway.path.options import Options

log = logging.getLogger("gateway")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# Chunks before a stream's first token held back with it, at most (then sent as they are).
MAX_EARLY = 64
DONE = b"data: [DONE]\n\n"


class Retry(Exception):
    """The engine failed before any byte reached the client: another replica may answer."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


async def whole(judging: Judging, options: Options, cycle: Cycle, resp: Response) -> None:
    """Read, judge (when the policy judges answers) and send a whole answer."""
    req = cycle.req
    assert req is not None
    raw = await resp.read(options.max_answer)
    cycle.engine_token()  # the engine's answer is here; the client's when it is sent
    status = resp.status
    if status == 200 and cycle.dialect is not None and cycle.dialect.native is not None:
        # An engine's own dialect answer, read as the chat answer it means: judged and
        # written back as every answer is (gateway.path.dialects.native).
        raw = cycle.dialect.native_whole(raw)
    content_type = resp.header(b"content-type") or b"application/json"
    if status >= 400:
        # The engine's own shape of error (FastAPI's detail, a numeric code, text),
        # made OpenAI's.
        raw = errors.from_engine(status, raw, content_type)
        content_type = b"application/json"
    if status == 200 and cycle.answers and req.kind not in bodies.NO_TEXT:
        await judging.whole(req, raw)
    usage_from(raw, cycle)
    if cycle.dialect is not None:
        # The chat answer (judged as chat's is) as the dialect's object or error.
        raw = (cycle.dialect.whole(raw) if status == 200
               else cycle.dialect.engine_error(status, raw))  # fmt: skip
        content_type = b"application/json"
    # Its length said: sent as it is, not in chunked framing.
    await cycle.start(
        status, [(b"content-type", content_type), (b"content-length", b"%d" % len(raw))]
    )
    await cycle.body(raw, more=False)


async def streamed(
    judging: Judging,
    options: Options,
    cycle: Cycle,
    resp: Response,
    waits: Waits,
    sent_at: float,
    failed_late: Callable[[str, int | None, str], None],
) -> bool:
    """Relay a streamed answer to its end (``Stream``, below), as ``whole`` sends a whole
    one: False when the engine failed after the first byte (the client was told so)."""
    return await Stream(judging, options, cycle, resp, waits, sent_at, failed_late).relay()


class Stream:
    """One streamed answer relayed: its first event is due ``waits.first_token`` after
    it was sent (``sent_at``, the loop's clock), each next within ``waits.between`` of
    the last. ``judging`` judges its windows (sized by ``options``); ``failed_late`` hears
    of an engine that failed after the first byte reached the client (model, replica,
    what it was told), as uvicorn's ``RequestResponseCycle`` is handed ``on_response``."""

    def __init__(
        self,
        judging: Judging,
        options: Options,
        cycle: Cycle,
        resp: Response,
        waits: Waits,
        sent_at: float,
        failed_late: Callable[[str, int | None, str], None],
    ) -> None:
        self.judging = judging
        self.failed_late = failed_late
        self.cycle = cycle
        self.resp = resp
        self.waits = waits
        self.sent_at = sent_at
        self.loop = asyncio.get_running_loop()
        self.framer = sse.Framer()
        self.hold = (
            Holdback(options.window_tokens, options.window_ms / 1000) if cycle.answers else None
        )
        assert cycle.req is not None
        self.req = cycle.req
        self.strip_usage = not self.req.include_usage
        # The reader of an engine's own dialect stream (None: chat chunks as they come).
        self.native = cycle.dialect.native if cycle.dialect is not None else None
        self.ended = False  # [DONE] came
        self.seen = False  # the first token (not a chunk with only the role)
        # What came before the first token (the role) waits for it: until a byte has
        # reached the client the request can still move to another replica.
        self.early: list[bytes] = []
        self.read = 0  # how far into the answer's text the judges have read every character

    async def relay(self) -> bool:
        """Relay the stream to its end; False when the engine failed after the first byte
        (the client was told so)."""
        try:
            while not self.ended:
                data = await self._next()
                if data is None:
                    break
                out = self._events(data)
                if self.hold is not None:
                    if self.hold.due(self.loop.time()):
                        self.read = await self.judging.window(self.req, self.hold, self.read)
                    out = self.hold.releasable()
                await self._forward(out)
            if self.native is not None and not self.native.ended:
                # A native stream that stopped short of its ending event broke.
                raise UpstreamError(BROKEN, "the engine's stream ended before its answer did")
            await self._finish()
            return True
        except GuardRefused as refused:
            self._drop()
            dialect = self.cycle.dialect
            if dialect is not None:
                # A dialect's stream always ends in its own way, even when nothing was
                # released yet: its client reads a refused answer, not an error.
                if not self.cycle.started:
                    await self.cycle.start(200, SSE_HEADERS)
                await self.cycle.body(dialect.refuse(self._counted()), more=False, text=False)
                raise
            if not self.cycle.started:
                raise
            await self.cycle.body(filtered_end(refused), more=False)
            raise
        except UpstreamError as error:
            self._drop()
            return await self._failed(error)

    async def _next(self) -> bytes | None:
        """The engine's next bytes (b'' when a window falls due before they come)."""
        hold, waits, loop = self.hold, self.waits, self.loop
        timeout = (waits.between if self.seen
                   else max(0.0, self.sent_at + waits.first_token - loop.time()))  # fmt: skip
        if hold is not None:
            wait = hold.wait(loop.time())
            if wait is not None:
                timeout = min(timeout, wait + 0.001)
        try:
            return await self.resp.next(timeout)
        except UpstreamError as error:
            if error.kind == TIMEOUT and hold is not None and hold.wait(loop.time()) == 0:
                return b""
            raise

    def _events(self, data: bytes) -> list[bytes]:
        """The events in ``data``, as the client may have them (held, under a guard)."""
        out: list[bytes] = []
        for event in self.framer.feed(data):
            payload = sse.data_of(event)
            if payload is None:
                continue
            if payload == sse.DONE:
                self.ended = True
                break
            if self.native is None:
                self._chunk(payload, out)
                continue
            try:
                chunks = self.cycle.dialect.native_events(payload)  # type: ignore[union-attr]
            except NativeError as error:
                raise UpstreamError(BROKEN, f"the engine's answer failed: {error}") from None
            for chunk in chunks:
                self._chunk(chunk, out)
            if self.native.ended:
                self.ended = True
                break
        return out

    def _chunk(self, payload: bytes, out: list[bytes]) -> None:
        """One chat chunk: kept in ``out`` to be sent, or held under the guard."""
        cycle = self.cycle
        if not self.seen:
            self.seen = carries_token(payload)
            if self.seen:
                cycle.engine_token()
        if b'"usage"' in payload:  # one look for the chunks that carry none (nearly all)
            if b'"usage":{' in payload or b'"usage": {' in payload:
                usage_from(payload, cycle)
            if self.strip_usage:
                stripped = without_usage(payload)
                if stripped is None:
                    return
                payload = stripped
        chunk_bytes = b"data: " + payload + b"\n\n"
        if self.hold is None:
            out.append(chunk_bytes)
        else:
            self.hold.add(chunk_bytes, held_text(payload), self.loop.time())

    async def _forward(self, out: list[bytes]) -> None:
        """Send ``out``, or keep it with what came before the first token."""
        if out and not self.seen and len(self.early) + len(out) <= MAX_EARLY:
            self.early += out
        elif out:
            if self.early:
                out, self.early = self.early + out, []
            if not self.cycle.started:
                await self.cycle.start(200, SSE_HEADERS)
            # The client's TTFT: the first token released to it (held, only once judged).
            text = self.seen if self.hold is None else self.hold.released_text
            await self.cycle.body(self._written(out), text=text)

    def _written(self, events: list[bytes]) -> bytes:
        """Chat events as the client reads them: as they are, or in its dialect."""
        if self.cycle.dialect is None:
            return b"".join(events)
        return self.cycle.dialect.events(events) if events else b""

    def _counted(self) -> Any:
        """The usage the gateway counted so far (a dialect's ending says it)."""
        cycle = self.cycle
        return usage_counted(cycle.tokens_in, cycle.tokens_out, cycle.tokens_cached)

    async def _finish(self) -> None:
        rest = self.early
        if self.hold is not None:
            if self.hold.unjudged:
                await self.judging.window(self.req, self.hold, self.read, final=True)
            rest += self.hold.releasable()
        if not self.cycle.started:
            await self.cycle.start(200, SSE_HEADERS)
        dialect = self.cycle.dialect
        written = self._written(rest)  # before the ending: a dialect's ends its events
        end = DONE if dialect is None else dialect.finish(self._counted())
        await self.cycle.body(written + end, more=False, text=bool(rest))

    def _drop(self) -> None:
        self.resp.release()  # the engine stops
        if self.hold is not None:
            self.hold.drop()

    async def _failed(self, error: UpstreamError) -> bool:
        cycle, waits = self.cycle, self.waits
        if error.kind == TIMEOUT:
            error = UpstreamError(TIMEOUT, (
                f"the engine sent nothing for {waits.between:g} s" if self.seen
                else f"no first token within {waits.first_token:g} s"))  # fmt: skip
        log.warning("%s: %s's stream failed: %s", cycle.request_id, cycle.model, error)
        told = error.args[0] if error.kind == TIMEOUT else told_of(error)
        if not cycle.started:
            raise Retry(told) from None
        self.failed_late(cycle.model, cycle.replica, told)
        failure = errors.stream_failed(told)
        if cycle.dialect is not None:
            await cycle.body(cycle.dialect.fail(failure.message), more=False)
            return False
        await cycle.body(sse.encode_json(failure.payload()) + DONE, more=False)
        return False


def told_of(error: UpstreamError) -> str:
    """What a client is told of an engine's failure: its kind, never an address (the
    operator's log has the whole error, by request id)."""
    if error.kind == TIMEOUT:
        return "timeout"
    if error.kind == BROKEN:
        return "the engine's connection broke"
    return "no connection to the engine"


_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_CACHED_TOKENS = re.compile(rb'"cached_tokens":\s*(\d+)')


def usage_from(raw: bytes, cycle: Cycle) -> None:
    """Tokens in, cached and out from an answer's (or a chunk's) usage, without parsing
    it all (cached: ``prompt_tokens_details.cached_tokens``, never more than the prompt)."""
    found = _PROMPT_TOKENS.search(raw)
    if found:
        cycle.tokens_in = int(found.group(1))
        cached = _CACHED_TOKENS.search(raw)
        cycle.tokens_cached = min(int(cached.group(1)), cycle.tokens_in) if cached else 0
    found = _COMPLETION_TOKENS.search(raw)
    if found:
        cycle.tokens_out = int(found.group(1))


def carries_token(payload: bytes) -> bool:
    """Whether a streamed event is the first token or later (``sse.carries_token``)."""
    try:
        return sse.carries_token(json.loads(payload))
    except (ValueError, RecursionError):
        return True


def without_usage(payload: bytes) -> bytes | None:
    """A chunk without the usage the client did not ask for; None for a usage-only one."""
    if payload.endswith(b',"usage":null}'):
        return payload[: -len(b',"usage":null}')] + b"}"
    try:
        chunk = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(chunk, dict) or "usage" not in chunk:
        return payload
    if not chunk.get("choices"):
        return None
    chunk.pop("usage", None)
    return json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode()
