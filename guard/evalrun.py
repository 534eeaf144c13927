"""Run a labelled set through judges and keep what each said (``guard eval``).

The judges are asked the way a check asks them (``guard.client.ask_judge`` on a ready
replica, the policy's ``judge.controversial``, the judge's context, categories and
variant from the catalog, long texts cut by ``guard.longtext``), one text at a time so
each latency is the judge's own. The figures are ``guard.evaluation``'s. An evaluation
is not traffic: it is not counted in the judges' health or decisions.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from catalog import rules
from catalog.models import ServedModel
from catalog.problems import Problem
from cluster.choices import ReplicaState
from cluster.models import Replica
from guard import client, known, services, snapshots
from guard import evaluation as ev
from guard.chain import NO_REPLICA
from guard.models import EvalResult, EvalRun
from llmgw_core import advisory, events
from llmgw_core.refused import Refused

log = logging.getLogger(__name__)

SET_DIR = Path(__file__).resolve().parent / "evalsets"
# Texts asked between two writes of results (each pushed to the consoles showing the run).
BATCH = 5
DEFAULT_SET = "coding-ops"


class SetRefused(Refused):
    """A labelled set that cannot be read; ``problems`` say where and what."""

    def __init__(self, source: str, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.source = source
        self.problems = list(problems)


@dataclass(frozen=True)
class LoadedSet:
    """A labelled set, where it came from and the SHA-256 of its bytes."""

    labelled: ev.LabelledSet
    source: str
    digest: str


def packaged_sets() -> list[str]:
    """Return the names of the sets shipped in ``guard/evalsets`` (``coding-ops``, ...)."""
    return sorted(p.stem for p in SET_DIR.glob("*.yaml"))


def load_set(name_or_path: str | None = None) -> LoadedSet:
    """Return a labelled set: a packaged one by name (the default ``coding-ops``), or a file.

    Raises:
        SetRefused: the file cannot be read, or what it holds is not a labelled set.
    """
    wanted = name_or_path or DEFAULT_SET
    path = Path(wanted)
    packaged = wanted in packaged_sets()
    if packaged:
        path = SET_DIR / f"{wanted}.yaml"
    shipped = ", ".join(packaged_sets())
    try:
        if not path.is_file():  # a folder, a device (/dev/zero would never end), a FIFO
            raise OSError(0, "not a file" if path.exists() else "no such file")
        raw = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SetRefused(
            wanted,
            [Problem((), f"cannot read {wanted}: {reason} (the packaged sets: {shipped})", "io")],
        ) from None
    labelled, problems = ev.read_set(raw, str(path.name))
    if labelled is None:
        if not packaged and not ev.meant_as_set(raw):
            # Nothing of the file is shown: any file a path names may be given here.
            problems = [
                Problem(
                    (),
                    f"{wanted} is not a labelled set (a YAML mapping with name, description "
                    f"and texts, docs/guard.md); nothing of it is shown. The packaged sets: "
                    f"{shipped}",
                    "not_a_set",
                )
            ]
        raise SetRefused(str(path), problems)
    return LoadedSet(labelled, str(path), hashlib.sha256(raw).hexdigest())


def guard_models() -> list[str]:
    """Return the catalog's guard models (with a format), by name."""
    return list(
        ServedModel.objects.filter(role=rules.ROLE_GUARD)
        .exclude(guard_format="")
        .order_by("name")
        .values_list("name", flat=True)
    )


def default_judges() -> list[str]:
    """Return the judges an evaluation asks when none are named.

    Every judge the policy names, in its order, then every known judge in the catalog
    with a ready replica (the candidates an operator could switch to).
    """
    names = list(services.current_policy().judge_models)
    ready = set(
        Replica.objects.filter(state=ReplicaState.READY, desired=True)
        .exclude(endpoint="")
        .values_list("model_name", flat=True)
    )
    for name in guard_models():
        if name in known.KNOWN and name in ready and name not in names:
            names.append(name)
    return names


def check_judges(names: Sequence[str]) -> list[str]:
    """Return the named judges once each, in order.

    Raises:
        ValueError: a name that is not a guard model in the catalog (the message lists
            them, and says how to add a known judge).
    """
    catalog = guard_models()
    out: list[str] = []
    for name in names:
        if name in out:
            continue
        if name not in catalog:
            hint = (
                f"; add it with: python manage.py guard judge enable {name}"
                if name in known.KNOWN
                else ""
            )
            have = ", ".join(catalog) or "none"
            raise ValueError(
                f'"{name}" is not a guard model in the catalog (guard models: {have}){hint}'
            )
        out.append(name)
    if not out:
        raise ValueError("no judge to evaluate: name one with --judges, or enable a judge")
    return out


Progress = Callable[[str, int, int], None]


def run(
    loaded: LoadedSet,
    names: Sequence[str],
    *,
    user: Any = None,
    actor_name: str = "",
    surface: str,
    timeout: float = 30.0,
    progress: Progress | None = None,
) -> EvalRun:
    """Ask each judge about every text of the set; keep and return the run.

    A judge with no ready replica fails every text (``no_replica``) without being
    asked; any other failure is the ask's (``guard.client.JudgeFailure`` kinds).
    ``progress(judge, done, total)`` is called after each text.
    """
    record = begin(loaded, names, user=user, actor_name=actor_name, surface=surface)
    execute(record, loaded, timeout=timeout, progress=progress)
    return record


def begin(
    loaded: LoadedSet, names: Sequence[str], *, user: Any = None, actor_name: str = "", surface: str
) -> EvalRun:
    """Keep a new run of ``names`` on the set, not yet asked (status running)."""
    labelled = loaded.labelled
    return EvalRun.objects.create(
        started=timezone.now(),
        set_name=labelled.name,
        set_description=labelled.description,
        set_source=loaded.source[-500:],
        set_digest=loaded.digest,
        texts=len(labelled.texts),
        judges=list(names),
        controversial=services.current_policy().controversial,
        actor=user if getattr(user, "pk", None) else None,
        actor_name=getattr(user, "username", "") or actor_name or "system",
        surface=surface,
    )


def execute(
    record: EvalRun,
    loaded: LoadedSet,
    *,
    timeout: float = 30.0,
    progress: Progress | None = None,
) -> None:
    """Ask the run's judges about every text and keep the results, a few texts at a
    time (each batch pushed to the consoles showing the run); mark it done or failed."""
    texts = loaded.labelled.texts
    http = httpx.Client(limits=httpx.Limits(max_connections=4))
    try:
        for judge in snapshots.judges(list(record.judges)):
            rows = []
            for i, text in _progress(texts, judge.name, progress):
                rows.append(_ask(http, judge, i, text, record.controversial, timeout, record))
                if len(rows) == BATCH or i == len(texts) - 1:
                    EvalResult.objects.bulk_create(rows)
                    rows = []
                    events.changed(evals=[record.pk])
    except BaseException as exc:
        _finish(record, EvalRun.Status.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        http.close()
    _finish(record, EvalRun.Status.DONE)


def _finish(record: EvalRun, status: str, error: str = "") -> None:
    record.status = status
    record.error = error[:2000]
    record.finished = timezone.now()
    record.save(update_fields=["status", "error", "finished"])
    events.changed(evals=[record.pk])


def start(set_name: str, names: Sequence[str], *, user: Any, surface: str) -> EvalRun:
    """Keep a new run and have it asked in the background; return it at once.

    In production a Celery worker asks (``guard.tasks.run_evaluation``); embedded, a
    thread of this process. The set is read again there and must be the same bytes.

    Raises:
        SetRefused: the set cannot be read.
        ValueError: a judge that is not a guard model in the catalog (``check_judges``).
    """
    loaded = load_set(set_name)
    record = begin(loaded, check_judges(names), user=user, surface=surface)
    if settings.REDIS_URL:
        # Imported here: guard.tasks imports this module (its task runs ``execute_kept``).
        from guard.tasks import run_evaluation  # noqa: PLC0415

        transaction.on_commit(lambda: run_evaluation.delay(record.pk))
    else:
        transaction.on_commit(
            lambda: threading.Thread(
                target=_in_thread, args=(record.pk,), name=f"eval-{record.pk}", daemon=True
            ).start()
        )
    return record


def execute_kept(pk: int) -> None:
    """Ask the judges of a run ``start`` kept (the worker's or the thread's part).

    A run that has results already was being asked by a worker that died (the task is
    delivered again then): what it wrote is dropped and the run asked from the start.
    A task may also be delivered twice while the first copy runs (a publish retried after
    Redis answered it late): the copy that holds the run's lock asks, another does
    nothing (a worker that dies lets go of the lock with its connection).
    """
    with _asking(pk) as mine:
        if not mine:
            log.info("evaluation %s is being asked by another delivery of its task", pk)
            return
        _execute_kept(pk)


# The runs' locks are this number shifted 32 bits up plus the run's id: any fixed 31-bit
# number no other code uses (``llmgw_core.advisory``).
ASKING_LOCK = 0x6C6C6D65  # "llme"


def _asking(pk: int) -> contextlib.AbstractContextManager[bool]:
    """Hold run ``pk``'s lock while it is asked; yield whether this delivery got it."""
    return advisory.held((ASKING_LOCK << 32) | (pk & 0xFFFFFFFF))


def _execute_kept(pk: int) -> None:
    record = EvalRun.objects.filter(pk=pk).first()
    if record is None or record.status != EvalRun.Status.RUNNING:
        return  # deleted, or ended already
    record.results.all().delete()
    try:
        loaded = load_set(record.set_source)
    except SetRefused as exc:
        _finish(record, EvalRun.Status.FAILED, f"the set cannot be read now: {exc}")
        return
    if loaded.digest != record.set_digest:
        _finish(
            record,
            EvalRun.Status.FAILED,
            f"{record.set_source} changed after the evaluation was started: start it again",
        )
        return
    execute(record, loaded)


def abandon_running(reason: str) -> int:
    """Mark every run still running failed, saying ``reason``; return how many.

    Embedded, runs are asked by threads of the web process: at its start, none of them
    is being asked any more.
    """
    stopped = list(EvalRun.objects.filter(status=EvalRun.Status.RUNNING))
    for record in stopped:
        _finish(record, EvalRun.Status.FAILED, reason)
    return len(stopped)


def _in_thread(pk: int) -> None:
    try:
        execute_kept(pk)
    except Exception:
        log.exception("evaluation %s failed", pk)
    finally:
        connection.close()


def _progress(texts: Sequence[ev.LabelledText], judge: str, progress: Progress | None) -> Any:
    for i, text in enumerate(texts):
        yield i, text
        if progress is not None:
            progress(judge, i + 1, len(texts))


def _ask(
    http: httpx.Client,
    judge: snapshots.Judge,
    position: int,
    text: ev.LabelledText,
    controversial: str,
    timeout: float,
    record: EvalRun,
) -> EvalResult:
    """Ask one judge about one text; return the result row (not saved)."""
    row = EvalResult(
        run=record,
        judge=judge.name,
        position=position,
        text=text.text,
        answer=text.answer,
        label=text.label,
        category=text.category,
        note=text.note,
    )
    if not judge.endpoint or not judge.format:
        row.failure_kind, row.failure = NO_REPLICA, "no ready replica"
        return row
    began = time.perf_counter()
    try:
        answer = client.ask_judge(
            judge.endpoint,
            judge.format,
            text.text,
            text.answer,
            context_length=judge.context_length,
            categories=judge.categories or None,
            variant=judge.variant,
            timeout=timeout,
            model=judge.name,
            controversial=controversial,
            client=http,
            key=judge.key,
        )
    except client.JudgeFailure as exc:
        row.failure_kind, row.failure = exc.kind, exc.message[:2000]
        row.latency_ms = (time.perf_counter() - began) * 1000.0
        return row
    except Exception as exc:  # noqa: BLE001 - a bug in one ask is that text's failure
        row.failure_kind, row.failure = "error", f"{type(exc).__name__}: {exc}"[:2000]
        return row
    result = ev.outcome(text.label, answer.verdict, answer.score, answer.latency_ms, controversial)
    row.verdict = answer.verdict
    row.categories = list(answer.categories)
    row.score = result.score
    row.score_source = result.source
    row.flagged = result.flagged
    row.latency_ms = answer.latency_ms
    return row


# Reading a run back


def outcomes(results: Sequence[EvalResult]) -> list[ev.Outcome]:
    """Return the outcomes of result rows, for ``guard.evaluation.summarise``."""
    return [
        ev.Outcome(
            label=r.label,
            verdict=r.verdict or None,
            score=r.score,
            source=r.score_source,
            latency_ms=r.latency_ms,
            failure=r.failure_kind,
            flagged=r.flagged,
        )
        for r in results
    ]


@dataclass(frozen=True)
class TextRow:
    """One text of a run with each judge's result, in the run's judge order."""

    position: int
    text: str
    label: str
    category: str
    note: str
    results: list[EvalResult | None]
    answer: str | None = None


def read_run(record: EvalRun) -> tuple[list[ev.Summary], list[TextRow]]:
    """Return a run's figures per judge (in its order) and its texts with every result."""
    results = list(record.results.all())
    judges = list(record.judges)
    by_judge: dict[str, list[EvalResult]] = {j: [] for j in judges}
    by_text: dict[int, dict[str, EvalResult]] = {}
    for r in results:
        by_judge.setdefault(r.judge, []).append(r)
        by_text.setdefault(r.position, {})[r.judge] = r
    summaries = [ev.summarise(j, outcomes(by_judge[j])) for j in judges]
    rows = []
    for position in sorted(by_text):
        found = by_text[position]
        first = next(iter(found.values()))
        rows.append(
            TextRow(
                position=position,
                text=first.text,
                label=first.label,
                category=first.category,
                note=first.note,
                results=[found.get(j) for j in judges],
                answer=first.answer,
            )
        )
    return summaries, rows
