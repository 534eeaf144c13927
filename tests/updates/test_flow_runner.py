"""The eval runner (updates.evals.runner) against a real sim engine, and its suites'
lookup: the shipped ones, an operator's in LLMGW_EVAL_DIR, refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.test_sim import Sim, launch
from updates.evals import runner
from updates.evals import suite as s

FAST = ("--ttft", "0.01", "--tps", "1000")


@pytest.fixture
def sim_with(tmp_path: Path) -> Iterator[Any]:
    started: list[Sim] = []

    def start(**figures: float) -> Sim:
        path = tmp_path / f"w{len(started)}.json"
        path.write_text(json.dumps({"llmgw-sim-weights": 1, **figures}))
        server = launch("--model", "cand", "--weights", str(path), *FAST)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def target(server: Sim) -> runner.Target:
    return runner.Target(server.url, "no-key", "cand")


def test_good_weights_pass_every_shipped_case_even_failing_every_second_request(
    sim_with: Any,
) -> None:
    server = sim_with(error_rate=0.5)
    for name in ("arithmetic", "json-format"):
        suite = runner.load(name).suite
        seen: list[int] = []
        results = runner.run(
            suite, target(server), on_result=lambda r, done, seen=seen: seen.append(done)
        )
        assert [r.passed for r in results] == [True] * len(suite.cases), results
        assert seen == list(range(1, len(suite.cases) + 1))


def test_worse_weights_score_low_naming_the_failed_cases(sim_with: Any) -> None:
    suite = runner.load("arithmetic").suite
    results = runner.run(suite, target(sim_with(arithmetic=0.3)))
    score = s.score(results)
    assert score < 0.6
    failed = [r for r in results if not r.passed]
    assert failed and all(r.why.startswith("expected ") for r in failed)


def test_no_engine_fails_each_case_saying_why() -> None:
    suite = runner.load("arithmetic").suite
    dead = runner.Target("http://127.0.0.1:9", "k", "cand")
    with httpx.Client(timeout=2) as http:
        answer, why = runner.ask(http, dead, suite.cases[0], timeout=2)
        assert answer is None and why.startswith("no answer from the gateway")
        assert runner.wait_ready(http, dead, timeout=0.5).endswith("after 0.5 s")


def test_wait_ready_answers_once_the_model_is_listed(sim_with: Any) -> None:
    server = sim_with()
    with httpx.Client(timeout=5) as http:
        assert runner.wait_ready(http, target(server), timeout=5) == ""
        other = runner.Target(server.url, "k", "not-served")
        assert "does not list not-served" in runner.wait_ready(http, other, timeout=0.5)


def test_a_rubric_case_without_a_judge_fails_saying_so(sim_with: Any) -> None:
    suite, problems = s.read_suite("name: r\ncases: [{prompt: 'What is 1 + 1?', rubric: right}]")
    assert suite is not None, problems
    (result,) = runner.run(suite, target(sim_with()))
    assert not result.passed and "set the model's eval.judge" in result.why


def test_an_operators_suite_is_found_first_and_a_bad_one_refused(
    tmp_path: Path, settings: Any
) -> None:
    settings.LLMGW_EVAL_DIR = str(tmp_path)
    (tmp_path / "arithmetic.yaml").write_text(
        "name: arithmetic\ncases: [{prompt: 'x', exact: y}]\n"
    )
    (tmp_path / "broken.yaml").write_text("name: broken\ncases: [{prompt: 'x'}]\n")
    assert len(runner.load("arithmetic").suite.cases) == 1  # the operator's, in place of ours
    assert runner.load("json-format").path.endswith("json-format.yaml")  # still ours
    with pytest.raises(runner.SuiteRefused, match="broken.yaml, .*exactly one of"):
        runner.load("broken")
    with pytest.raises(
        runner.SuiteRefused, match='no suite "nope" .*the suites: arithmetic, broken, json-format'
    ):
        runner.load("nope")
    with pytest.raises(runner.SuiteRefused, match="is not a suite name"):
        runner.load("../etc/passwd")
