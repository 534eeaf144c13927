"""Run an eval suite against a model through the gateway, as a client would.

The suites: the ones the project carries (``updates/evals/suites/``) and an operator's
own in ``LLMGW_EVAL_DIR`` (``NAME.yaml``, ``.yml`` or ``.json``; one there with a shipped
suite's name is used instead of it). Each case is one chat request to the gateway's
``/v1/chat/completions`` (``LLMGW_GATEWAY_URL``) naming the model, with a client key the
update made for its eval (``updates.run``), ``temperature`` 0 and the case's
``max_tokens``. An answer of 5xx, or no answer, is asked again (``ATTEMPTS`` in all): the
eval measures what the weights answer, the canary how often they fail. A rubric case is
graded by the judge the model's ``eval.judge`` names, through the guard's judge client
(``guard.client.ask_judge`` on a ready replica of it): asked about the answer, with the
rubric beside the prompt, the case passes when the judge calls it safe.

Every call has a timeout; a case that gets no answer is failed with why, never raised.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.conf import settings

from catalog.problems import Problem
from guard import client, snapshots
from guard.formats import SAFE
from llmgw_core.refused import Refused
from updates.evals import suite as s

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parent / "suites"
SUFFIXES = (".yaml", ".yml", ".json")
ATTEMPTS = 3
TIMEOUT_S = 60.0
# How long a new key and candidate may take to reach the gateway's table.
READY_S = 60.0


class SuiteRefused(Refused):
    """A suite that cannot be found or read; ``problems`` say where and what."""

    def __init__(self, name: str, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.name = name
        self.problems = problems


@dataclass(frozen=True)
class Loaded:
    """A suite, the file it was read from and the SHA-256 of its bytes."""

    suite: s.Suite
    path: str
    digest: str


def folders() -> list[Path]:
    """Return where suites are looked for, in order: the operator's, then the shipped."""
    own = str(settings.LLMGW_EVAL_DIR or "")
    return [Path(own), SHIPPED] if own else [SHIPPED]


def suite_names() -> list[str]:
    """Return every suite's name that can be named, sorted."""
    names: set[str] = set()
    for folder in folders():
        if folder.is_dir():
            names |= {p.stem for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file()}
    return sorted(n for n in names if s.NAME.fullmatch(n))


def load(name: str) -> Loaded:
    """Return the suite a model's ``eval.suite`` names.

    Raises:
        SuiteRefused: no such suite, or its file is not a suite.
    """
    if not s.NAME.fullmatch(name or ""):
        raise SuiteRefused(
            name, [Problem(("eval", "suite"), f'"{name}" is not a suite name', "bad_name")]
        )
    for folder in folders():
        for suffix in SUFFIXES:
            path = folder / f"{name}{suffix}"
            if not path.is_file():
                continue
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise SuiteRefused(
                    name, [Problem((), f"cannot read {path}: {exc.strerror}", "io")]
                ) from None
            found, problems = s.read_suite(raw, path.name)
            if found is None:
                raise SuiteRefused(name, problems)
            return Loaded(found, str(path), hashlib.sha256(raw).hexdigest())
    known = ", ".join(suite_names()) or "none"
    where = (
        f" (LLMGW_EVAL_DIR is {folders()[0]})"
        if len(folders()) > 1
        else " (LLMGW_EVAL_DIR is not set)"
    )
    raise SuiteRefused(
        name,
        [
            Problem(
                ("eval", "suite"), f'no suite "{name}"{where}; the suites: {known}', "unknown_suite"
            )
        ],
    )


@dataclass(frozen=True)
class Target:
    """Where the cases go: a gateway's base URL, the client key, the model's name."""

    url: str
    key: str
    model: str


def ask(
    http: httpx.Client, target: Target, case: s.Case, timeout: float = TIMEOUT_S
) -> tuple[str | None, str]:
    """Return the model's answer to a case (or None) and, with None, why there is none."""
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": case.prompt}],
        "max_tokens": case.max_tokens,
        "temperature": 0,
    }
    why = ""
    for _ in range(ATTEMPTS):
        try:
            r = http.post(
                target.url.rstrip("/") + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {target.key}"},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            why = f"no answer from the gateway: {type(exc).__name__}"
            continue
        if r.status_code >= 500:
            why = f"the gateway answered {r.status_code}: {_error(r)}"
            continue
        if r.status_code != 200:
            return None, f"the gateway answered {r.status_code}: {_error(r)}"
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None, "the answer is not a chat completion"
        return (content if isinstance(content, str) else ""), ""
    return None, why


def _error(r: httpx.Response) -> str:
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = r.text
    return str(message)[:200]


def wait_ready(http: httpx.Client, target: Target, timeout: float = READY_S) -> str:
    """Wait until the gateway takes the key and lists the model (a new key and a new
    candidate reach every gateway process's table a moment after they are written);
    return "" then, or why not after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    why = ""
    while True:
        try:
            r = http.get(target.url.rstrip("/") + "/v1/models",
                         headers={"Authorization": f"Bearer {target.key}"}, timeout=10)  # fmt: skip
            if r.status_code == 200 and any(
                m.get("id") == target.model for m in r.json().get("data", []) if isinstance(m, dict)
            ):
                return ""
            why = (
                f"the gateway answered {r.status_code}"
                if r.status_code != 200
                else (f"the gateway does not list {target.model} yet")
            )
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            why = f"no answer from the gateway at {target.url}: {type(exc).__name__}"
        if time.monotonic() >= deadline:
            return f"{why} after {timeout:g} s"
        time.sleep(0.5)


Grader = Callable[[s.Case, str], s.Result]


def judge_grader(judge_name: str, timeout: float = 30.0) -> Grader:
    """Return what grades rubric cases: the judge ``judge_name`` on a ready replica."""

    def grade(case: s.Case, answer: str) -> s.Result:
        if not judge_name:
            return s.failed(case, "a rubric case needs a judge: set the model's eval.judge", answer)
        found = snapshots.judges([judge_name])
        judge = found[0] if found else None
        if judge is None or not judge.endpoint or not judge.format:
            reason = (judge.missing if judge is not None else "") or "no ready replica"
            return s.failed(case, f"judge {judge_name}: {reason}", answer)
        try:
            verdict = client.ask_judge(
                judge.endpoint, judge.format, f"{case.prompt}\n\nRubric: {case.expected}", answer,
                context_length=judge.context_length, categories=judge.categories or None,
                variant=judge.variant, timeout=min(timeout, judge.timeout * 3), model=judge.name,
                key=judge.key,
            )  # fmt: skip
        except client.JudgeFailure as exc:
            return s.failed(case, f"judge {judge_name} gave no verdict: {exc.kind}", answer)
        if verdict.verdict == SAFE:
            return s.Result(case.id, True, s.shown(answer))
        return s.Result(
            case.id, False, s.shown(answer), f"judge {judge_name} said {verdict.verdict}"
        )

    return grade


def run(
    suite: s.Suite,
    target: Target,
    *,
    grader: Grader | None = None,
    on_result: Callable[[s.Result, int], None] | None = None,
    http: httpx.Client | None = None,
    timeout: float = TIMEOUT_S,
) -> list[s.Result]:
    """Send every case of ``suite`` to ``target`` one at a time; return each result.

    ``on_result(result, done)`` is told of each as it comes (the page's progress).
    """
    own = http is None
    client = http or httpx.Client(timeout=timeout)
    results: list[s.Result] = []
    try:
        for case in suite.cases:
            answer, why = ask(client, target, case, timeout)
            if answer is None:
                result = s.failed(case, why)
            elif case.graded:
                result = (grader or judge_grader(""))(case, answer)
            else:
                result = s.check(case, answer)
            results.append(result)
            if on_result is not None:
                on_result(result, len(results))
    finally:
        if own:
            client.close()
    return results
