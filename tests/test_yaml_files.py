"""One YAML reader: a catalog file and a guard file read the same text the same way.

Each case goes in through the catalog's file path (``catalog.files.load_catalog_text``,
what ``catalog validate/import`` and the console's import call) and the guard's
(``guard.evaluation.read_set``, what ``guard eval`` and the console's evaluation call; the
policy's ``--file`` reads through the same ``catalog.yamlfile.read``), and must come out the
same: the same value, or the same refusal with the same message.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import codec, files, yamlfile
from catalog.problems import Problem
from guard import evaluation as ev


def catalog_value(plain: str) -> tuple[str, Any]:
    """Return what the catalog path reads a plain scalar as: ("text", s) or ("not text", msg)."""
    models, problems = files.load_catalog_text(f"models:\n- name: m\n  description: {plain}\n")
    if models is not None:
        return "text", models[0].description
    (problem,) = problems
    assert problem.code == "wrong_type", problem
    return "not text", problem.message


def guard_value(plain: str) -> tuple[str, Any]:
    """Return what the guard path reads a plain scalar as: ("text", s) or ("not text", msg)."""
    found, problems = ev.read_set(f"name: {plain}\ntexts:\n  - {{text: a, label: ordinary}}\n")
    if found is not None:
        return "text", found.name
    (problem,) = problems
    assert problem.code == "bad_type", problem
    return "not text", problem.message


def assert_both_read(plain: str, expected: Any) -> None:
    """Both paths read ``plain`` as ``expected``: text as itself, else described in words."""
    at_catalog, at_guard = catalog_value(plain), guard_value(plain)
    if isinstance(expected, str):
        assert at_catalog == at_guard == ("text", expected)
        return
    assert at_catalog[0] == at_guard[0] == "not text"
    # Each path says what it read in its own words; both must name the expected value.
    assert codec._describe(expected) in at_catalog[1]
    assert f"not {ev.describe_kind(expected)}" in at_guard[1]


@pytest.mark.parametrize(
    ("plain", "expected"),
    [
        # Numbers as YAML 1.2's core schema and yaml.v3 read them: underscores, and
        # 0x/0o/0b with either case of the letter.
        ("1_000", 1000),
        ("131_072", 131072),
        ("0b101", 5),
        ("0B101", 5),
        ("0X1F", 31),
        ("0x1f", 31),
        ("0o17", 15),
        ("0777", 777),  # decimal, as YAML 1.2 says (YAML 1.1 would read 511)
        ("-0x10", -16),
        ("1e3", 1000.0),
        (".5", 0.5),
        (".inf", math.inf),
        ("-.Inf", -math.inf),
        # YAML 1.1's words are text (an operator typing "no" means no, not false).
        ("yes", "yes"),
        ("no", "no"),
        ("on", "on"),
        ("off", "off"),
        ("Y", "Y"),
        ("22:00", "22:00"),
        ("2024-01-01", "2024-01-01"),
        ("0x", "0x"),
        ("1_000.5.1", "1_000.5.1"),
        # The core schema's own words.
        ("true", True),
        ("FALSE", False),
        ("~", None),
        ("null", None),
    ],
)
def test_a_scalar_reads_the_same_in_a_catalog_and_a_guard_file(plain: str, expected: Any) -> None:
    assert_both_read(plain, expected)


def test_nan_reads_as_a_number_in_both() -> None:
    at_catalog, at_guard = catalog_value(".nan"), guard_value(".nan")
    assert "the number nan" in at_catalog[1] and "not nan (a number)" in at_guard[1]


@settings(deadline=None)  # a loaded machine's pauses are not the reader's
@given(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from(["{:_}", "{:d}", "0x{:x}", "0X{:X}", "0o{:o}", "0b{:b}", "0B{:_b}"]),
)
def test_any_whole_number_in_any_spelling_reads_as_that_number(n: int, spelling: str) -> None:
    sign = "-" if n < 0 else ""
    plain = spelling.format(n) if spelling.startswith("{") else sign + spelling.format(abs(n))
    assert_both_read(plain, n)


@settings(deadline=None)
@given(st.from_regex(r"[-+]?(0[xXoObB])?[0-9a-fA-F_]{1,6}(\.[0-9_eE+-]{0,4})?", fullmatch=True))
def test_number_like_text_reads_the_same_in_both(plain: str) -> None:
    expected = yamlfile.resolve_plain(plain)
    at_catalog, at_guard = catalog_value(plain), guard_value(plain)
    if isinstance(expected, str):
        assert at_catalog == at_guard == ("text", plain)
    else:
        assert at_catalog[0] == at_guard[0] == "not text"


def reader_problems(problems: list[Problem], codes: set[str]) -> list[tuple[str, str]]:
    """Return the (code, message) of the reader's problems among a path's problems."""
    return [(p.code, p.message) for p in problems if p.code in codes]


def both_refuse(text: str | bytes, code: str) -> list[tuple[str, str]]:
    """Read one text through both paths; return the reader's problems, the same in both."""
    models, at_catalog = files.load_catalog_text(text, "f.yaml")
    found, at_guard = ev.read_set(text, "f.yaml")
    assert models is None and found is None
    mine = reader_problems(at_catalog, {code})
    assert mine, at_catalog
    assert reader_problems(at_guard, {code}) == mine
    return mine


def deep(levels: int) -> str:
    return "a: " + "[" * levels + "]" * levels + "\n"


def bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        (
            "a: 1\nb: 2\na: 3\n",
            "duplicate_key",
            '"a" is written twice at the top of the file (lines 1 and 3): YAML would keep '
            "only the last, so remove one",
        ),
        (
            "b:\n  c: 1\n  c: 2\n",
            "duplicate_key",
            '"c" is written twice in b (lines 2 and 3): YAML would keep only the last, so '
            "remove one",
        ),
        (
            deep(yamlfile.MAX_DEPTH),
            "too_deep",
            f"f.yaml is nested more than {yamlfile.MAX_DEPTH} levels deep at line 1: no file "
            "llmgw reads is nested that deep; check the brackets and the indentation",
        ),
        (
            deep(100_000),
            "too_deep",
            f"f.yaml is nested more than {yamlfile.MAX_DEPTH} levels deep at line 1: no file "
            "llmgw reads is nested that deep; check the brackets and the indentation",
        ),
        (
            "a: 1\n" + "#" * yamlfile.MAX_BYTES,
            "too_large",
            f"f.yaml is {yamlfile.MAX_BYTES + 5:,} bytes; the limit is 10 MB (10,485,760 bytes): "
            "split it into smaller files",
        ),
        (
            bomb(),
            "too_large",
            "f.yaml's aliases expand to more than 1,000,000 values (at *a4, line 6): write "
            "the shared parts out, or use fewer aliases",
        ),
        (
            "a: *x\n",
            "not_yaml",
            "*x at line 1 refers to no anchor &x before it (or to a block it is itself inside)",
        ),
        (
            "a: 1\n---\na: 2\n",
            "not_yaml",
            "f.yaml holds more than one YAML document (a second starts at line 2): keep one",
        ),
        (
            "a: 1\nb: [\n",
            "not_yaml",
            "f.yaml is not valid YAML: line 3, column 1: did not find expected node content "
            "(while parsing a flow node)",
        ),
        (
            "a: !!binary aGk=\n",
            "unsupported_yaml",
            "the tag !!binary at line 1 is not supported: these files hold only text, "
            "numbers, true/false, null, lists and mappings; remove the tag",
        ),
        (
            "a: !!int x\n",
            "not_yaml",
            '"x" at line 1 is not a valid !!int: write it as one, or drop the tag',
        ),
        (
            "1: a\n",
            "wrong_type",
            "a key at the top of the file (line 1) is the number 1: keys must be text (quote it)",
        ),
        (
            "~: a\n",
            "wrong_type",
            "a key at the top of the file (line 1) is null (empty): keys must be text (quote it)",
        ),
        (
            "[a]: b\n",
            "wrong_type",
            "a key at the top of the file (line 1) is a list: keys must be text",
        ),
        (
            b"a: caf\xe9\n",
            "not_utf8",
            "f.yaml is not UTF-8 text: the byte 0xe9 on line 1 (offset 6) is not valid UTF-8; "
            "save the file as UTF-8",
        ),
    ],
    ids=[
        "duplicate-top",
        "duplicate-nested",
        "one-too-deep",
        "very-deep",
        "oversize",
        "alias-bomb",
        "unknown-alias",
        "two-documents",
        "not-yaml",
        "binary-tag",
        "bad-int-tag",
        "number-key",
        "null-key",
        "list-key",
        "not-utf8",
    ],
)
def test_a_bad_file_is_refused_the_same_way_by_both(
    text: str | bytes, code: str, message: str
) -> None:
    assert both_refuse(text, code) == [(code, message)]


def test_as_deep_as_the_limit_is_read() -> None:
    doc, problems = yamlfile.read(deep(yamlfile.MAX_DEPTH - 1))
    assert problems == [] and doc is not None


def test_anchors_aliases_and_merge_keys_are_read_by_both() -> None:
    models, problems = files.load_catalog_text(
        "models:\n- name: &n m\n  description: *n\n  scaling: &s {min: 1}\n"
        "- name: n\n  scaling:\n    <<: *s\n    max: 2\n"
    )
    assert problems == [] and models is not None
    assert models[0].description == "m"
    assert (models[1].scaling.min, models[1].scaling.max) == (1, 2)
    found, problems = ev.read_set(
        "name: &n x\ntexts:\n  - &t {text: *n, label: ordinary}\n  - {<<: *t, text: y}\n"
    )
    assert problems == [] and found is not None
    assert [(t.text, t.label) for t in found.texts] == [("x", "ordinary"), ("y", "ordinary")]


def test_a_value_reached_through_an_alias_shares_the_lines_of_its_anchor() -> None:
    doc, problems = yamlfile.read("a: &x\n  b: 1\nc: *x\nd:\n  - 1\n  - e: 2\n")
    assert problems == [] and doc is not None
    assert doc.line(()) == 1
    assert doc.line(("c",)) == 3
    assert doc.line(("c", "b")) == 2
    assert doc.line(("d", 1, "e")) == 6
    assert doc.line(("d", 5)) == 4  # not in the file: its parent's
