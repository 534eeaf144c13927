"""The batch runner: each line of a batch sent over HTTP to the gateway itself
(``LLMGW_GATEWAY_URL``), as the key that made the batch, in the lowest admission band
(``gateway.batch.token``): the key's scope, budgets, owner quota, admission, routing,
fallbacks and the guard apply to each line exactly as to a live request.

A line held back (429: the batch band waits while the model is past its slo, or a budget
is spent; 503: no replica yet) waits as it was told (``Retry-After``) and goes again, until
the batch is cancelled or its window ends. Any other answer is the line's result: 200 in
the output file, anything else in the error file with the gateway's status and body (a
guard's refusal names its judge and category there).

Each result is written to the batch's journal and flushed before it is counted
(``store.Journal``); a runner that starts a batch takes its OS lock first, so two never
run one batch, and one killed mid-batch lets the lock go: the next run reads the journal
and sends only the lines not in it. At the end the output and error files are written from
the journal in line order.

A batch made with ``"schedule_window": true`` sends a line only while the model it names
(by its name, an alias or an adapter) is inside one of its schedule windows
(``gateway.batch.window``; the catalog read every ``REREAD`` seconds): outside them the
line is set aside with the others naming that model, saying why on the batch (``held``,
the Batches page shows it), and the lines of other models go on; the set-aside lines go
when their model's window opens, or end with the batch (cancelled, or its own window over:
``expired``, what finished kept). Once all a batch has left waits for a window, its run
lets the batch go (``PARKED``) and the runner takes up the next batch: a held batch never
keeps a worker, nor the batches behind it, waiting for the night; a later call takes it up
again (not before ``REREAD`` seconds, unless it was cancelled or its window is over). A line
whose model has no schedule window at all is an error line at once (nothing would open);
one naming no catalog model is sent, and the gateway's answer (404) is its result.
"""

from __future__ import annotations

import heapq
import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from catalog.models import ServedModel
from gateway.batch import lines, status, store, token, window

log = logging.getLogger("gateway.batch")

# The longest a held-back line waits before it goes again (it may be told longer).
MOST_WAIT = 30.0
# How often the runner looks at the batch (a cancel, the window's end) while lines run.
LOOK = 0.5
# How often a batch held to its models' schedule windows reads the catalog again.
REREAD = 30.0


# What ``run`` returns when all its batch has left waits for a schedule window: the batch
# let go, the runner free for the next.
PARKED = "parked"
# Batches let go that way in this process: id -> when (monotonic), taken up again after
# REREAD seconds.
_parked: dict[str, float] = {}
_parked_lock = threading.Lock()


class Unreachable(Exception):
    """The gateway could not be reached: the line is not recorded, the run stops."""


def run_next() -> int:
    """Run the oldest batch not ended that no other runner holds, to its end; return how
    many it took up. One runs to its end a call: a run lasts at most the batch's window
    (and one line's timeout), and each next call (every ``LLMGW_BATCH_INTERVAL``, on any
    worker) takes up another batch beside it. A held batch whose every line left waits for
    a schedule window is let go (``PARKED``) and the next one taken up in the same call."""
    took = 0
    for batch in reversed(store.list_batches(None)):
        if batch["status"] in status.ENDED or _resting(batch):
            continue
        with store.running(batch["id"]) as mine:
            if mine:
                took += 1
                try:
                    outcome = run(batch["id"])
                except Unreachable as error:
                    log.warning("batch %s paused: %s", batch["id"], error)
                    return took
                with _parked_lock:
                    if outcome == PARKED:
                        _parked[batch["id"]] = time.monotonic()
                        continue
                    _parked.pop(batch["id"], None)
                return took
    return took


def _resting(batch: dict[str, Any]) -> bool:
    """A batch let go here within ``REREAD`` seconds because all it had left waited for a
    schedule window (a cancelled one, or one past its window, is taken up at once)."""
    with _parked_lock:
        since = _parked.get(batch["id"])
    if since is None or batch["status"] == status.CANCELLING:
        return False
    return time.monotonic() - since < REREAD and time.time() < batch["expires_at"]


def _fail(batch_id: str, problems: list[tuple[int | None, str]], code: str) -> None:
    data = [{"code": code, "message": what, "param": None, "line": n} for n, what in problems]

    def change(batch: dict[str, Any]) -> dict[str, Any]:
        if batch["status"] != status.VALIDATING:
            return batch
        failed = status.move(batch, status.FAILED, int(time.time()))
        failed["errors"] = {"object": "list", "data": data}
        return failed

    store.update(batch_id, change)


def _lines(batch: dict[str, Any]) -> list[lines.Line] | None:
    raw = store.file_content(batch["owner"], batch["input_file_id"])
    if raw is None:
        _fail(batch["id"], [(None, f"the input file {batch['input_file_id']} is gone")],
              "file_not_found")  # fmt: skip
        return None
    try:
        found = lines.check(raw, settings.LLMGW_FILES_MAX_LINES)
        lines.for_endpoint(found, batch["endpoint"])
    except lines.LinesError as error:
        _fail(batch["id"], list(error.problems), "invalid_line")
        return None
    return found


def run(batch_id: str) -> str | None:
    """Run one batch to its end (or as far as it can go now), holding its lock; ``PARKED``
    when all it has left waits for a schedule window."""
    batch = store.get_batch(None, batch_id)
    if batch is None or batch["status"] in status.ENDED:
        return None
    found = _lines(batch)
    if found is None:
        return None

    def started(b: dict[str, Any]) -> dict[str, Any]:
        b = dict(b, request_counts=dict(b["request_counts"], total=len(found)))
        if b["status"] == status.VALIDATING:
            b = status.move(b, status.IN_PROGRESS, int(time.time()))
        return b

    batch = store.update(batch_id, started)
    done = store.journal(batch_id)
    pending = Pending([line for line in found if line.number not in done])
    secret = token.make(batch["key_digest"], batch_id, int(batch["expires_at"]),
                        scale=bool(batch.get("scale_up")))  # fmt: skip
    stop = threading.Event()
    journal = store.Journal(batch_id)
    models = Models() if batch.get("schedule_window") else None
    counts = {"completed": sum(1 for r in done.values() if r["ok"]),
              "failed": sum(1 for r in done.values() if not r["ok"])}  # fmt: skip
    unreachable: Exception | None = None
    try:
        with ThreadPoolExecutor(settings.LLMGW_BATCH_CONCURRENCY,
                                thread_name_prefix="batch-line") as pool:  # fmt: skip
            running: set[Future[dict[str, Any]]] = set()
            while True:
                batch = store.get_batch(None, batch_id) or batch
                if batch["status"] == status.CANCELLING or time.time() >= batch["expires_at"]:
                    stop.set()
                if models is not None:
                    pending.look_again(models)
                while not stop.is_set() and unreachable is None \
                        and len(running) < settings.LLMGW_BATCH_CONCURRENCY:  # fmt: skip
                    verdict, line, why = pending.next(models)
                    if line is None:
                        break  # none left, or all left wait for their models' windows
                    if verdict == window.FAIL:
                        record = refused(line, why)
                        journal.write(record)
                        counts["failed"] += 1
                        store.update(batch_id, lambda b, r=record: counted(b, counts, r))
                        continue
                    running.add(pool.submit(send, secret, line, stop, batch["expires_at"]))
                held = pending.held()
                if batch.get("held", "") != held:
                    batch = store.update(batch_id, lambda b, h=held: dict(b, held=h))
                if not running:
                    if held and not stop.is_set() and unreachable is None:
                        return PARKED  # all it has left waits: the runner takes up another
                    break
                finished, running = wait(running, timeout=LOOK, return_when=FIRST_COMPLETED)
                for future in finished:
                    try:
                        record = future.result()
                    except Unreachable as error:
                        unreachable = error
                        stop.set()
                        continue
                    if record is None:
                        continue  # stopped before it had an answer: not run
                    journal.write(record)
                    counts["completed" if record["ok"] else "failed"] += 1
                    store.update(batch_id, lambda b, r=record: counted(b, counts, r))
    finally:
        journal.close()
        if models is not None:
            models.close()
    if unreachable is not None:
        raise Unreachable(str(unreachable))
    finish(batch_id)
    return None


class Pending:
    """A batch's lines not yet sent, the first in line first; of a held batch, the lines
    whose model waits for its schedule window set aside by the name they give, so the
    lines of other models go on, and put back in line when it opens."""

    def __init__(self, found: list[lines.Line]) -> None:
        self.ready = [(line.number, line) for line in found]
        heapq.heapify(self.ready)
        self.waiting: dict[str, list[lines.Line]] = {}  # name -> its lines, in order
        self.why: dict[str, str] = {}  # name -> what it waits for
        self.looked = time.monotonic()

    def next(self, models: Models | None) -> tuple[str, lines.Line | None, str]:
        """The next line to send (``GO``) or to end as an error line (``FAIL``), and why;
        ``(WAIT, None, "")`` when none is left that may go now."""
        while self.ready:
            _, line = heapq.heappop(self.ready)
            if models is None:
                return window.GO, line, ""
            name = str(line.body["model"])
            if name in self.waiting:
                self.waiting[name].append(line)  # its model waits: so does it
                continue
            verdict, why = models.verdict(name)
            if verdict == window.WAIT:
                self.waiting[name], self.why[name] = [line], why
                continue
            return verdict, line, why
        return window.WAIT, None, ""

    def look_again(self, models: Models) -> None:
        """At most every ``LOOK``: the names set aside whose model now goes (or never
        will: their lines end as error lines) back in line."""
        if not self.waiting or time.monotonic() - self.looked < LOOK:
            return
        self.looked = time.monotonic()
        for name in list(self.waiting):
            verdict, why = models.verdict(name)
            if verdict == window.WAIT:
                self.why[name] = why
                continue
            for line in self.waiting.pop(name):
                heapq.heappush(self.ready, (line.number, line))
            del self.why[name]

    def held(self) -> str:
        """What the lines set aside wait for ("" when none is)."""
        return "; ".join(self.why[name] for name in sorted(self.why))


class Models:
    """The catalog's models a held batch's lines name, read again every ``REREAD``
    seconds (a schedule edited meanwhile counts), asked whether each is inside a
    schedule window now (``gateway.batch.window``)."""

    def __init__(self) -> None:
        self.read_at = -float("inf")
        self.found: dict[str, Any] = {}
        self.failed = ""

    def verdict(self, name: str) -> tuple[str, str]:
        """Whether a line naming ``name`` (a model, an alias, an adapter) goes now, waits
        for a window, or ends as an error line, and why (``gateway.batch.window``); the
        catalog unreadable: it waits."""
        if time.monotonic() - self.read_at >= REREAD:
            self._read()
        if self.failed:
            return window.WAIT, self.failed
        now = timezone.now().astimezone(ZoneInfo(settings.TIME_ZONE))
        return window.verdict(self.found, name, now)

    def close(self) -> None:
        """Let this thread's database connection go (the run is over)."""
        connection.close()

    def _read(self) -> None:
        self.read_at = time.monotonic()
        try:
            close_old_connections()
            self.found = {m.name: m.to_spec() for m in ServedModel.objects.all()}
            self.failed = ""
        except DatabaseError as error:  # bounded by the database's timeouts
            log.warning("a held batch could not read the catalog: %s", error)
            self.failed = "the catalog cannot be read now; trying again"


def refused(line: lines.Line, why: str) -> dict[str, Any]:
    """The error line of a held batch's line that is not sent: its model has no schedule
    window to wait for (``gateway.batch.window``)."""
    error = {"code": "no_schedule_window", "message": why}
    out = status.output_line("batch_req_" + secrets.token_hex(12), line.custom_id, None, None,
                             error)  # fmt: skip
    return {"line": line.number, "ok": False, "out": out}


def counted(batch: dict[str, Any], counts: dict[str, int],
            record: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The batch with its counts as they now are and an error line's kind counted."""
    batch = dict(batch, request_counts=dict(batch["request_counts"], **counts))
    if not record["ok"]:
        batch["line_errors"] = status.count_error(batch.get("line_errors"), record["out"])
    return batch


def send(secret: str, line: lines.Line, stop: threading.Event,
         deadline: float) -> dict[str, Any] | None:  # fmt: skip
    """The line's result (None: stopped before it had one)."""
    url = settings.LLMGW_GATEWAY_URL + line.url
    body = json.dumps(line.body, ensure_ascii=False).encode()
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json",
               "User-Agent": "llmgw-batch"}  # fmt: skip
    line_id = "batch_req_" + secrets.token_hex(12)
    while not stop.is_set():
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=settings.LLMGW_BATCH_LINE_TIMEOUT) as r:
                code, raw, request_id = r.status, r.read(), r.headers.get("x-request-id", "")
                retry = None
        except urllib.error.HTTPError as error:
            code, raw = error.code, error.read()
            request_id = error.headers.get("x-request-id", "")
            retry = error.headers.get("retry-after")
        except TimeoutError:
            error_ = {"code": "line_timeout", "message": "no answer within "
                      f"{settings.LLMGW_BATCH_LINE_TIMEOUT} s (LLMGW_BATCH_LINE_TIMEOUT)"}  # fmt: skip
            out = status.output_line(line_id, line.custom_id, None, None, error_)
            return {"line": line.number, "ok": False, "out": out}
        except (urllib.error.URLError, ConnectionError) as error:
            raise Unreachable(f"{url}: {getattr(error, 'reason', error)}") from error
        if code in (429, 503):
            # Held back (the batch band while the model is past its slo, a budget, no
            # replica yet): wait as told, then again; a cancel or the window ends it.
            try:
                pause = float(retry or 1)
            except ValueError:
                pause = 1.0
            pause = max(0.1, min(pause, MOST_WAIT, deadline - time.time()))
            if stop.wait(pause) or time.time() >= deadline:
                return None
            continue
        try:
            answer: Any = json.loads(raw)
        except ValueError:
            answer = raw.decode("utf-8", "replace")
        out = status.output_line(line_id, line.custom_id, code, answer, None, request_id)
        return {"line": line.number, "ok": code == 200, "out": out}
    return None


def finish(batch_id: str) -> dict[str, Any]:
    """Write the output and error files from the journal, then end the batch: cancelled
    when asked, expired past its window, else completed (every line answered)."""
    batch = store.get_batch(None, batch_id)
    assert batch is not None
    done = store.journal(batch_id)
    total = batch["request_counts"]["total"]
    now = int(time.time())
    cancelling = batch["status"] == status.CANCELLING
    expired = not cancelling and len(done) < total and now >= batch["expires_at"]
    if not cancelling and not expired and len(done) < total:
        return batch  # not at its end yet (a later run goes on)
    if not cancelling and not expired:
        batch = store.update(batch_id, lambda b: status.move(b, status.FINALIZING, now)
                             if b["status"] == status.IN_PROGRESS else b)  # fmt: skip
    ordered = [done[n] for n in sorted(done)]
    files: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
    for field, ok, name in (("output_file_id", True, "output"), ("error_file_id", False, "error")):
        chosen = [r["out"] for r in ordered if r["ok"] is ok]
        if chosen:
            data = "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in chosen).encode()
            meta = store.save_file(batch["owner"], f"{batch_id}_{name}.jsonl", "batch_output",
                                   data)  # fmt: skip
            files[field] = meta["id"]
    counts = {"total": total, "completed": sum(1 for r in ordered if r["ok"]),
              "failed": sum(1 for r in ordered if not r["ok"])}  # fmt: skip

    kinds: dict[str, Any] = {}
    for r in ordered:
        if not r["ok"]:
            kinds = status.count_error(kinds, r["out"])

    def ended(b: dict[str, Any]) -> dict[str, Any]:
        # Counted again from the journal: a runner killed between a line's journal write
        # and its count left the running figures one short.
        b = dict(b, request_counts=counts, line_errors=kinds, **files)
        if b["status"] == status.CANCELLING:
            return status.move(b, status.CANCELLED, now)
        if b["status"] == status.FINALIZING:
            return status.move(b, status.COMPLETED, now)
        if b["status"] in (status.IN_PROGRESS, status.VALIDATING):
            return status.move(b, status.EXPIRED, now)
        return b

    return store.update(batch_id, ended)
