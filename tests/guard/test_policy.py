"""Test the guard policy: reading it (every problem), writing it back, and decide()."""

from __future__ import annotations

from typing import Any

import pytest

from guard.formats import QWEN3GUARD_CATEGORIES, Verdict
from guard.policy import BASELINE, Policy, decide, to_data, validate


def problems(data: Any) -> list[tuple[str, str, str]]:
    policy, found = validate(data)
    assert policy is None
    return [(p.field, p.code, p.message) for p in found]


def test_baseline_is_qwen3guard_open_with_qwen_categories() -> None:
    assert BASELINE.judge_models == ("qwen3guard-0.6b",)
    assert BASELINE.controversial == "safe"
    assert BASELINE.fail == "open"
    assert BASELINE.directions == ("requests", "answers")
    assert BASELINE.refuse_categories == QWEN3GUARD_CATEGORIES
    assert "Non-violent Illegal Acts" in BASELINE.refuse_categories


def test_empty_dict_is_the_baseline() -> None:
    assert validate({}) == (BASELINE, [])


def test_full_policy_reads() -> None:
    policy, found = validate(
        {
            "judge": {"models": ["llamaguard3-8b", "qwen3guard-4b"], "controversial": "unsafe"},
            "fail": "closed",
            "directions": ["answers"],
            "categories": ["Hate", "PII"],
        }
    )
    assert found == []
    assert policy == Policy(
        judge_models=("llamaguard3-8b", "qwen3guard-4b"),
        controversial="unsafe",
        fail="closed",
        judge_requests=False,
        judge_answers=True,
        refuse_categories=("Hate", "PII"),
    )


def test_dotted_keys_read_as_nested() -> None:
    policy, found = validate({"judge.models": ["a"], "judge.controversial": "unsafe"})
    assert found == []
    assert policy is not None
    assert policy.judge_models == ("a",)
    assert policy.controversial == "unsafe"


def test_choices_are_trimmed_and_lowercased() -> None:
    policy, _ = validate({"fail": " Closed ", "judge": {"controversial": "UNSAFE"}})
    assert policy is not None
    assert (policy.fail, policy.controversial) == ("closed", "unsafe")


@pytest.mark.parametrize("policy", [BASELINE, validate({"fail": "closed", "directions": []})[0]])
def test_round_trip(policy: Policy) -> None:
    assert validate(to_data(policy)) == (policy, [])


def test_to_data_shape() -> None:
    assert to_data(BASELINE) == {
        "judge": {"models": ["qwen3guard-0.6b"], "controversial": "safe"},
        "fail": "open",
        "directions": ["requests", "answers"],
        "categories": list(QWEN3GUARD_CATEGORIES),
    }


def test_empty_directions_judge_nothing() -> None:
    policy, found = validate({"directions": []})
    assert found == [] and policy is not None
    assert not policy.judges("requests") and not policy.judges("answers")


def test_judges_refuses_an_unknown_direction() -> None:
    with pytest.raises(ValueError, match="requests, answers"):
        BASELINE.judges("both")


def test_not_a_mapping() -> None:
    assert problems(["judge"]) == [("", "bad_type", "a policy is a mapping of keys, not a list")]


def test_unknown_keys() -> None:
    assert problems({"fails": "open", "judge": {"model": ["a"]}, "guard.x": 1}) == [
        (
            "guard.x",
            "unknown_key",
            'unknown key "guard.x": a policy has judge, fail, directions, categories',
        ),
        (
            "fails",
            "unknown_key",
            'unknown key "fails": a policy has judge, fail, directions, categories',
        ),
        (
            "judge.model",
            "unknown_key",
            'unknown key "judge.model": judge has models, controversial',
        ),
    ]


def test_key_given_twice() -> None:
    assert problems({"judge": {"models": ["a"]}, "judge.models": ["b"]}) == [
        (
            "judge.models",
            "twice",
            'judge.models is given twice, as "judge.models" and under judge: keep one',
        )
    ]


def test_judge_not_a_mapping() -> None:
    assert problems({"judge": "qwen3guard-0.6b"}) == [
        (
            "judge",
            "bad_type",
            'judge is a mapping (models, controversial), not "qwen3guard-0.6b" (a string)',
        )
    ]


def test_empty_judge_list() -> None:
    assert problems({"judge": {"models": []}}) == [
        (
            "judge.models",
            "no_judges",
            "judge.models is empty: name at least one judge (a catalog guard model)",
        )
    ]


def test_judge_list_items() -> None:
    assert problems({"judge": {"models": ["a", 3, " ", "a"]}}) == [
        ("judge.models[1]", "bad_type", "judge.models[1] is a name (a string), not 3 (a number)"),
        ("judge.models[2]", "empty", "judge.models[2] is empty: write a name or remove it"),
        (
            "judge.models[3]",
            "duplicate",
            'judge.models[3] "a" repeats judge.models[0]: list each once',
        ),
    ]


def test_list_written_as_a_string() -> None:
    assert problems({"judge": {"models": "a"}}) == [
        ("judge.models", "bad_type", 'judge.models is a list, not "a" (a string)')
    ]


def test_wrong_values_name_the_allowed_ones() -> None:
    assert problems({"judge": {"controversial": "maybe"}, "fail": True}) == [
        ("judge.controversial", "bad_value", 'judge.controversial "maybe" is not safe or unsafe'),
        ("fail", "bad_type", "fail is open or closed, not true (a boolean)"),
    ]
    assert problems({"fail": "shut"}) == [
        ("fail", "bad_value", 'fail "shut" is not open or closed')
    ]
    assert problems({"fail": None}) == [
        ("fail", "bad_type", "fail is open or closed, not empty (null)")
    ]


def test_directions() -> None:
    assert problems({"directions": ["requests", "replies", "requests"]}) == [
        (
            "directions[2]",
            "duplicate",
            'directions[2] "requests" repeats directions[0]: list each once',
        ),
    ]
    assert problems({"directions": ["requests", "replies"]}) == [
        ("directions[1]", "bad_value", 'direction "replies" is not one of requests, answers'),
    ]
    assert problems({"directions": {"requests": True}}) == [
        ("directions", "bad_type", "directions is a list, not a mapping")
    ]


def test_categories_repeat_without_regard_to_case() -> None:
    assert problems({"categories": ["PII", "pii"]}) == [
        ("categories[1]", "duplicate", 'categories[1] "pii" repeats categories[0]: list each once')
    ]


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"fail": "x", "judge": {"models": []}, "directions": ["y"], "extra": 1})
    assert [code for _, code, _ in found] == ["unknown_key", "no_judges", "bad_value", "bad_value"]


POLICY = Policy(judge_models=("j",), refuse_categories=("Violent", "PII"))
STRICT = Policy(judge_models=("j",), controversial="unsafe", refuse_categories=("Violent", "PII"))


@pytest.mark.parametrize(
    ("policy", "verdict", "categories", "decision"),
    [
        (POLICY, "safe", (), "allow"),
        (STRICT, "safe", (), "allow"),
        (POLICY, "unsafe", (), "refuse"),
        (POLICY, "unsafe", ("Violent",), "refuse"),
        (POLICY, "unsafe", ("violent",), "refuse"),
        (POLICY, "unsafe", ("Jailbreak", "PII"), "refuse"),
        (POLICY, "unsafe", ("Jailbreak",), "allow"),
        (POLICY, "controversial", (), "allow"),
        (POLICY, "controversial", ("Violent",), "allow"),
        (STRICT, "controversial", (), "refuse"),
        (STRICT, "controversial", ("PII",), "refuse"),
        (STRICT, "controversial", ("Jailbreak",), "allow"),
    ],
)
def test_decide(policy: Policy, verdict: str, categories: tuple[str, ...], decision: str) -> None:
    assert decide(policy, Verdict(verdict, categories)) == decision


def test_decide_with_no_refusing_categories_refuses_only_unnamed_unsafe() -> None:
    monitor = Policy(judge_models=("j",), refuse_categories=())
    assert decide(monitor, Verdict("unsafe", ("PII",))) == "allow"
    assert decide(monitor, Verdict("unsafe")) == "refuse"
