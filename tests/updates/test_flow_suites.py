"""Eval suites (updates.evals.suite): the file, the checks by code, the score. Pure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import simweights
from updates.evals import suite as s

SUITES = Path(__file__).resolve().parents[2] / "updates" / "evals" / "suites"


def read(text: str) -> s.Suite:
    found, problems = s.read_suite(text, "t.yaml")
    assert problems == [], [p.message for p in problems]
    assert found is not None
    return found


def problems(text: str) -> list[str]:
    found, out = s.read_suite(text, "t.yaml")
    assert found is None
    return [p.message for p in out]


@pytest.mark.parametrize("name", ["arithmetic", "json-format"])
def test_the_shipped_suites_read_and_name_themselves(name: str) -> None:
    suite = read((SUITES / f"{name}.yaml").read_text())
    assert suite.name == name
    assert len(suite.cases) >= 10
    assert not suite.graded
    assert 0 < suite.threshold <= 1


def test_a_suite_with_every_check() -> None:
    suite = read(
        """
name: mine
description: a bit of each
threshold: 0.5
cases:
  - {id: capital, prompt: "Capital of France?", exact: Paris}
  - {prompt: "6 * 7?", number: 42}
  - {prompt: "json", json_keys: [a, b], max_tokens: 100}
  - {prompt: "explain", rubric: "explains it"}
"""
    )
    assert [c.id for c in suite.cases] == ["capital", "case-2", "case-3", "case-4"]
    assert [c.check for c in suite.cases] == ["exact", "number", "json_keys", "rubric"]
    assert suite.cases[2].max_tokens == 100 and suite.cases[0].max_tokens == s.MAX_TOKENS
    assert suite.graded and suite.threshold == 0.5


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[1]", "a suite is a mapping"),
        ("name: x\ncases: []", '"cases" is a list of at least one case'),
        ("name: ../etc\ncases: [{prompt: a, exact: b}]", "name is required: letters"),
        ("name: x\nthreshold: 0\ncases: [{prompt: a, exact: b}]", "threshold is 0 (a number)"),
        ("name: x\nthreshold: 2\ncases: [{prompt: a, exact: b}]", "above 0 up to 1"),
        ("name: x\nextra: 1\ncases: [{prompt: a, exact: b}]", 'unknown key "extra"'),
        (
            "name: x\ncases: [{prompt: a}]",
            "exactly one of exact, number, json_keys, rubric (this one: none)",
        ),
        ("name: x\ncases: [{prompt: a, exact: b, number: 1}]", "(this one: exact, number)"),
        ("name: x\ncases: [{prompt: a, number: '1'}]", "number is a number, not text"),
        ("name: x\ncases: [{prompt: a, exact: 4}]", 'quote it: "4"'),
        ("name: x\ncases: [{prompt: a, json_keys: [a, a]}]", "json_keys is a list of different"),
        ("name: x\ncases: [{exact: b}]", "prompt is required"),
        ("name: x\ncases: [{prompt: a, exact: b, max_tokens: 0}]", "max_tokens is a whole number"),
        (
            "name: x\ncases: [{id: a, prompt: a, exact: b}, {id: a, prompt: c, exact: b}]",
            'id "a" repeats cases[0]',
        ),
        ("name: x\ncases: [{prompt: a, exact: b, colour: red}]", 'unknown key "colour"'),
    ],
)
def test_a_wrong_suite_is_refused_saying_where_and_what(text: str, said: str) -> None:
    found = problems(text)
    assert any(said in p for p in found), found
    assert all(p.startswith("t.yaml") for p in found), found


def case(check: str, expected: object) -> s.Case:
    return s.Case("c", "q", check, expected)


@pytest.mark.parametrize(
    ("answer", "passed"),
    [
        ("Paris", True),
        ("  Paris.\n", True),
        ("paris", False),
        ("Paris, France", False),
        ("", False),
    ],
)
def test_exact_is_the_trimmed_answer(answer: str, passed: bool) -> None:
    assert s.check(case("exact", "Paris"), answer).passed is passed


@pytest.mark.parametrize(
    ("answer", "passed", "why"),
    [
        ("42", True, ""),
        ("The answer is 42.", True, ""),
        ("6 * 7 = 42", True, ""),
        ("1,042", False, "expected 42, got 1042"),
        ("41", False, "expected 42, got 41"),
        ("forty-two", False, "expected 42, got no number"),
        ("42.0", True, ""),
    ],
)
def test_number_is_the_last_number_in_the_answer(answer: str, passed: bool, why: str) -> None:
    result = s.check(case("number", 42), answer)
    assert (result.passed, result.why) == (passed, why)


@pytest.mark.parametrize(
    ("answer", "passed", "why"),
    [
        ('{"a": 1, "b": "x"}', True, ""),
        ('```json\n{"a": 1, "b": 2}\n```', True, ""),
        ('{"a": 1}', False, "missing b"),
        ('{"a": 1, "b": 2, "c": 3}', False, "unexpected c"),
        ("[1, 2]", False, "JSON, but not an object"),
        ("a is 1, b is 2", False, "not JSON"),
    ],
)
def test_json_keys_is_an_object_with_exactly_those_keys(
    answer: str, passed: bool, why: str
) -> None:
    result = s.check(case("json_keys", ("a", "b")), answer)
    assert (result.passed, result.why) == (passed, why)


def test_a_rubric_is_not_checked_by_code() -> None:
    with pytest.raises(ValueError, match="graded by a judge"):
        s.check(case("rubric", "explains it"), "an answer")


def test_a_failed_case_shows_a_bounded_part_of_its_answer() -> None:
    result = s.check(case("exact", "x"), "y" * 10_000)
    assert len(result.answer) == s.SHOWN_CHARS and result.answer.endswith("…")


@given(st.lists(st.booleans(), max_size=50), st.integers(0, 20))
def test_the_score_is_the_share_passed_of_every_case(passed: list[bool], missing: int) -> None:
    results = [s.Result(f"c{i}", p) for i, p in enumerate(passed)]
    total = len(results) + missing
    value = s.score(results, total)
    assert 0 <= value <= 1
    assert value == (sum(passed) / total if total else 0.0)


@given(st.floats(0, 1), st.floats(0.01, 1))
def test_the_threshold_is_the_models_min_score_else_the_suites(
    min_score: float, own: float
) -> None:
    suite = s.Suite("x", "", own, ())
    at = s.threshold(suite, min_score)
    assert at == (min_score if min_score > 0 else own)
    assert s.passes(at, at) and not s.passes(at - 0.01, at)


@pytest.mark.parametrize(
    ("accuracy", "passes"), [(1.0, True), (0.97, True), (0.5, False), (0.0, False)]
)
def test_sim_weights_score_on_the_arithmetic_suite_by_their_accuracy(
    accuracy: float, passes: bool
) -> None:
    suite = read((SUITES / "arithmetic.yaml").read_text())
    w = simweights.Weights(arithmetic=accuracy)
    results = [s.check(c, simweights.answer(w, c.prompt) or "") for c in suite.cases]
    assert s.passes(s.score(results), suite.threshold) is passes


def test_sim_weights_answer_the_json_suite_by_their_figure() -> None:
    suite = read((SUITES / "json-format.yaml").read_text())
    good = [
        s.check(c, simweights.answer(simweights.Weights(), c.prompt) or "") for c in suite.cases
    ]
    assert all(r.passed for r in good), [r for r in good if not r.passed]
    bad = simweights.Weights(json_format=0.0)
    assert not any(s.check(c, simweights.answer(bad, c.prompt) or "").passed for c in suite.cases)
    assert json.loads(simweights.answer(simweights.Weights(), suite.cases[0].prompt) or "")


def test_a_misspelt_key_is_named_with_its_file_line_and_the_key_it_may_mean() -> None:
    said = problems("name: x\ncases:\n  - prompt: a\n    exakt: b\nthreshhold: 0.5\n")
    assert (
        't.yaml, cases[0].exakt (line 4): unknown key "exakt": a case has id, prompt, '
        'max_tokens, exact, number, json_keys, rubric; did you mean "exact"? '
        "rename it, or remove it"
    ) in said, said
    assert any(
        m.startswith('t.yaml, threshhold (line 5): unknown key "threshhold"')
        and 'did you mean "threshold"?' in m
        for m in said
    ), said


def test_an_empty_suite_file_is_refused_saying_what_to_write() -> None:
    assert problems("# nothing yet\n") == [
        "t.yaml is empty: write its name, description, threshold, cases"
    ]
