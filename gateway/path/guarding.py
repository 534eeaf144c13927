"""The guard's part of a request: asking it (``Guard``: on the event loop when the guard
holds what it needs, else on a few threads of the gateway's own, ``guard.checks.check``;
never per request when nothing is judged), and what the gateway does with its verdicts
(``Judging``): the request's verdict awaited before the answer's first byte, a whole
answer judged whole, a streamed one in windows (``gateway.path.holdback``), a text too long
for a judge judged again in overlapping halves, and a refusal made the client's error
(``GuardRefused``) and recorded.

Each judge's circuit breaker in this process (``guard.checks.BREAKERS``) is exported to
``/metrics`` as it changes: ``llmgw_guard_judge_breaker{judge,state,pid}``, 1 for the
state it is in (``closed``, ``open``, ``half_open``) and 0 for the others, per live
process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from gateway.path import body as bodies
from gateway.path import errors, series, sse
from gateway.path.errors import ApiError
from gateway.records.observe import RefusalHeard
from guard import breaker, checks, perrequest, snapshots
from guard.policy import ANSWERS, REQUESTS

if TYPE_CHECKING:
    from gateway.path.cycle import Cycle
    from gateway.path.holdback import Holdback
    from gateway.path.parts import Parts

log = logging.getLogger("gateway")

THREADS = 16
_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="gateway-guard")


_check_on_pool = sync_to_async(checks.check_on_thread, thread_sensitive=False, executor=_executor)

_gauge: Any = None
_gauge_lock = threading.Lock()


def breaker_metric(judge: str, state: breaker.State) -> None:
    """Set a judge's breaker gauge (``guard.breaker.Breakers``' listener)."""
    global _gauge
    with _gauge_lock:
        if _gauge is None:
            # Imported here: prometheus_client picks its value class as it is imported; this
            # process's multiprocess folder is set first (series.multiprocess).
            from prometheus_client import Gauge  # noqa: PLC0415

            series.multiprocess()  # the multiprocess mode, before any metric is made
            _gauge = Gauge("llmgw_guard_judge_breaker",
                           "a judge's circuit breaker in this process: 1 for its state",
                           ("judge", "state"), multiprocess_mode="liveall",
                           registry=None)  # fmt: skip
    for name in breaker.STATES:
        _gauge.labels(judge, name).set(1 if name == state.state else 0)


checks.BREAKERS.listen(breaker_metric)


class Guard:
    def directions(self) -> tuple[bool, bool]:
        """Whether requests and answers are judged, by the policy in memory. Unknown (not
        in memory yet): both, so the check reads the policy and decides (it answers
        ``allow`` with ``judged: false`` for a direction it does not judge)."""
        policy = snapshots.policy_in_memory()
        if policy is None:
            return True, True
        return policy.judges(REQUESTS), policy.judges(ANSWERS)

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        done = await checks.check_on_loop(request, answer)  # the judge's timeout bounds it
        if isinstance(done, dict):
            return done
        # On a thread: bounded as a whole (its judges' timeouts, its reads, the pool's
        # queue); past the bound the policy's fail decides, as if every judge timed out.
        bound = checks.check_bound()
        try:
            return await asyncio.wait_for(_check_on_pool(request, answer, done), bound)
        except TimeoutError:
            log.warning("a guard check got no answer within %g s: the policy's fail decides",
                        bound)  # fmt: skip
            return checks.unanswered(request, answer, bound)


REQUEST, ANSWER = "request", "answer"
# An answer too long for its judge is judged again in parts overlapping by this many
# characters; a part this short that is still too long for the judge cannot be judged.
PART_OVERLAP = 200
MIN_PART = 2 * PART_OVERLAP + 100
PARTS_AT_ONCE = 8  # judged at once, of one text


class GuardRefused(Exception):
    """The guard refused a request or an answer (or could not judge it under ``fail:
    closed``): ``error`` is what the client is told, ``verdict`` the refusal's record."""

    def __init__(self, error: ApiError, verdict: dict[str, Any]) -> None:
        super().__init__(error.message)
        self.error = error
        self.verdict = verdict


class Judging:
    """What the gateway does with the guard's verdicts on one request's text.

    Its ``parts`` are the gateway's: their ``guard`` (which
    ``gateway.records.metrics.exported`` may wrap after it is built) and ``observer`` are
    read at each call."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def start(self, cycle: Cycle) -> None:
        """Start the guard on the request, beside the engine's start, when the policy
        judges requests; note whether it judges answers."""
        req = cycle.req
        assert req is not None
        # One bound for the request's every check: a judge that fails on it is not asked
        # again for it (guard.perrequest), in this request's context.
        perrequest.begin()
        judging_requests, cycle.answers = self.parts.guard.directions()
        if judging_requests and req.token_ids:
            raise errors.token_ids_unjudgeable("prompt" if req.kind == bodies.COMPLETION
                                               else "input")  # fmt: skip
        if judging_requests and req.text:
            cycle.verdict = asyncio.create_task(self.parts.guard.judge(req.text))

    async def request(self, cycle: Cycle) -> None:
        """The request's verdict (started by ``start``), before any byte of the answer:
        ``GuardRefused`` when refused."""
        assert cycle.verdict is not None and cycle.req is not None
        result = self.allowed(REQUEST, await cycle.verdict)
        if result.get("request_cut"):
            # Too long for the judge: it read the start and the end; the middle too.
            await self.in_parts(cycle.req, cycle.req.text, REQUEST)

    async def whole(self, req: bodies.Request, raw: bytes) -> None:
        """A whole answer, judged as the client would read it."""
        try:
            text = answer_text(json.loads(raw))
        except ValueError:
            # Not JSON: whatever it is, it is judged as it would reach the client.
            text = raw.decode("utf-8", "replace")
        if text:
            result = await self.answer(req, text)
            if result.get("answer_cut"):
                await self.in_parts(req, text, ANSWER)

    async def window(
        self, req: bodies.Request, hold: Holdback, read: int, final: bool = False
    ) -> int:
        """Judge a stream's text so far; return how far into it every character was read."""
        ticket = hold.start()
        result = await self.answer(req, ticket.text)
        if result.get("answer_cut"):
            # Too long for the judge: it read the start and the end. What came since the
            # last window read whole is judged on its own (in parts if need be).
            await self.in_parts(req, ticket.text[max(0, read - PART_OVERLAP) :], ANSWER)
        hold.allow(ticket, final)
        return ticket.upto

    async def answer(self, req: bodies.Request, text: str) -> dict[str, Any]:
        """The guard's verdict on an answer's text: a refusal raises ``GuardRefused``."""
        return self.allowed(ANSWER, await self.parts.guard.judge(req.text, text))

    def allowed(self, direction: str, result: dict[str, Any]) -> dict[str, Any]:
        if result.get("decision") != "allow":
            raise GuardRefused(refusal(direction, result), refused(direction, result))
        if result.get("failed_open"):
            self.parts.observer.failed_open()
        return result

    async def in_parts(self, req: bodies.Request, text: str, direction: str) -> None:
        """Judge ``text`` (the request's, or the answer's) in halves, overlapping so no
        phrase is only ever split, each halved again while the judge still reads only its
        start and end: nothing passes that a judge did not read. ``GuardRefused`` at the
        first refusal; a part of ``MIN_PART`` characters still too long is refused as
        unjudgeable. An answer's parts are judged with the request, as every answer is."""
        room = asyncio.Semaphore(PARTS_AT_ONCE)
        cut = f"{direction}_cut"

        async def judged(part: str) -> dict[str, Any]:
            async with room:
                if direction == REQUEST:
                    return self.allowed(REQUEST, await self.parts.guard.judge(part))
                return await self.answer(req, part)

        parts = halves(text)
        while parts:
            results = await asyncio.gather(*(judged(p) for p in parts))
            again = [p for p, r in zip(parts, results, strict=True) if r.get(cut)]
            short = min((len(p) for p in again), default=MIN_PART + 1)
            if short <= MIN_PART:
                raise GuardRefused(errors.too_long_to_judge(direction, short), {
                    "decision": "refuse", "judged": False, "judge": None, "categories": [],
                    "direction": direction,
                })  # fmt: skip
            parts = [half for p in again for half in halves(p)]

    def record(self, cycle: Cycle, model: str, refused_: GuardRefused) -> None:
        """Tell the observers (counts, the refusal's record) and the log of a refusal."""
        verdict = refused_.verdict
        key = cycle.key
        assert key is not None
        observer = self.parts.observer
        categories = tuple(verdict.get("categories") or ())
        observer.refused(verdict["direction"], verdict.get("judge") or "", categories)
        observer.refusal(RefusalHeard(
            request_id=cycle.request_id, key=key.name, owner=key.owner, model=model,
            direction=verdict["direction"], judge=verdict.get("judge") or "",
            verdict=verdict.get("verdict") or "", categories=categories,
            score=verdict.get("score"), judged=verdict.get("judged", True) is not False,
            failures=tuple(verdict.get("failed") or ()),
        ))  # fmt: skip
        log.info("refused %s (%s) of %s on %s: judge %s, %s", cycle.request_id,
                 verdict["direction"], key.name, model, verdict.get("judge") or "none answered",
                 ", ".join(categories) or "-")  # fmt: skip


def halves(text: str) -> list[str]:
    """``text`` in two halves that overlap by ``PART_OVERLAP`` characters."""
    middle = len(text) // 2
    return [text[: middle + PART_OVERLAP], text[max(0, middle - PART_OVERLAP) :]]


def held_text(payload: bytes) -> str:
    """The text a streamed chunk would put before the client, for the guard's windows.

    Every chunk is read (only under a guard that judges answers): one that cannot be
    read is judged as its raw data, never released as if it carried no text."""
    try:
        chunk = json.loads(payload)
    except (ValueError, RecursionError):
        return payload.decode("utf-8", "replace")
    if not isinstance(chunk, dict):
        return payload.decode("utf-8", "replace")
    return sse.chunk_text(chunk)


def answer_text(answer: Any) -> str:
    """Everything of a whole answer a client would read: content, reasoning, refusals,
    tool calls' names and arguments, completions' text."""
    if not isinstance(answer, dict):
        return json.dumps(answer)
    texts = []
    for choice in answer.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            for name in ("content", "reasoning_content", "refusal"):
                if isinstance(message.get(name), str):
                    texts.append(message[name])
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    texts.extend(
                        function[key]
                        for key in ("name", "arguments")
                        if isinstance(function.get(key), str)
                    )
        if isinstance(choice.get("text"), str):
            texts.append(choice["text"])
    return "\n".join(texts)


def refused(direction: str, result: dict[str, Any]) -> dict[str, Any]:
    """A refusal's record (``GuardRefused.verdict``): ``judged`` false when no judge
    answered (each failed or was skipped by its breaker, and the policy fails closed),
    and ``failed``, each judge that gave no verdict on the way with how: (judge, kind)."""
    answered = result.get("judge") is not None and result.get("verdict") is not None
    failed = tuple(
        (str(f.get("judge") or ""), str(f.get("kind") or ""))
        for f in result.get("failures") or ()
        if isinstance(f, dict)
    )
    judged = answered and result.get("judged", True) is not False
    return {**result, "direction": direction, "judged": judged, "failed": failed}


def refusal(direction: str, result: dict[str, Any]) -> ApiError:
    """What the client is told of a refusal."""
    if result.get("judged") is False or (result.get("verdict") is None and result.get("failures")):
        return errors.unjudged(direction)
    return errors.content_filter(
        direction, result.get("judge") or "?", list(result.get("categories") or ())
    )


def filtered_end(refused_: GuardRefused) -> bytes:
    """A stream's end when the guard refused its answer midway: a ``content_filter``
    finish, the error as an event, ``[DONE]``."""
    end = {
        "id": "llmgw-guard",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}],
    }
    return sse.encode_json(end) + sse.encode_json(refused_.error.payload()) + b"data: [DONE]\n\n"
