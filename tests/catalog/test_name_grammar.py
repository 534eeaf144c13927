"""The grammar of a name (model, alias, adapter, node, owner): the OpenAI model ids clients
send and a federation's PEER/MODEL pass; what a URL or a browser reads as something else
is refused with the reason, on the rules every surface goes through."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import codec
from catalog.rules import check_model
from catalog.rules.names import MAX_NAME, ROUTE_WORDS, name_problem
from tests.catalog.samples import cpu_model

ACCEPTED = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "qwen2.5:7b",
    "gpt-4o-mini",
    "PEER/MODEL",
    "org/chat",
    "edit",  # a route word alone is a name: only after a slash would it be an action
    "org/edit-2",
    "a" * MAX_NAME,
    "модель",
]
REFUSED = {
    "../etc": '".."',
    "org/./x": '"."',
    "..": '".."',
    "a b": "space",
    "a\u00a0b": "space",
    "a\tb": "control character",
    "a\nb": "line break",
    "/org/x": "starts or ends with /",
    "org/x/": "starts or ends with /",
    "org//x": "//",
    "a?b": '"?"',
    "a#b": '"#"',
    "a%2Fb": '"%"',
    "a\\b": '"\\"',
    "org/edit": "/edit",
    "../models/fb-c": '".."',
    "a" * (MAX_NAME + 1): "at most 200",
    "": "empty",
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_client_model_id_is_a_name(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize(("name", "reason"), REFUSED.items())
def test_a_name_a_url_cannot_carry_is_refused_with_the_reason(name: str, reason: str) -> None:
    why = name_problem(name)
    assert why is not None and reason in why, why


def test_every_route_word_after_a_slash_is_refused() -> None:
    for word in ROUTE_WORDS:
        assert name_problem(f"org/{word}") is not None
        assert name_problem(word) is None


@given(st.text(min_size=1, max_size=40))
def test_an_accepted_name_has_no_step_no_space_and_no_url_character(text: str) -> None:
    if name_problem(text) is None:
        parts = text.split("/")
        assert "" not in parts and "." not in parts and ".." not in parts
        assert not any(c.isspace() or c in "?#%\\" for c in text)


def _problems(data: dict) -> list:
    m, problems = codec.decode_model(data)
    assert not problems, problems
    return check_model(m)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (cpu_model("../etc"), ("name",)),
        (cpu_model("a b"), ("name",)),
        (cpu_model("ok", aliases=["fine", "x/../y"]), ("aliases", 1)),
        (cpu_model("ok", owner="org:a b"), ("owner",)),
        (cpu_model("ok", owner="team:x\r\ny"), ("owner",)),
        (cpu_model("ok", adapters=[{"name": "bad name", "source": "/a.gguf"}]),
         ("adapters", 0, "name")),
    ],
)  # fmt: skip
def test_the_model_rules_refuse_a_bad_name_at_its_field(data: dict, path: tuple) -> None:
    problems = [p for p in _problems(data) if p.path == path]
    assert len(problems) == 1, problems
    assert problems[0].code in ("bad_name", "control_character", "bad_owner")


def test_a_model_named_like_a_client_id_passes_the_rules() -> None:
    data = cpu_model("meta-llama/Llama-3.1-8B-Instruct", aliases=["qwen2.5:7b"], owner="org:acme")
    assert _problems(data) == []


@pytest.mark.django_db
def test_catalog_validate_refuses_a_name_outside_the_grammar_with_the_reason(tmp_path) -> None:
    import io

    import yaml
    from django.core.management import call_command

    path = tmp_path / "c.yaml"
    models = [cpu_model("org/fine"), cpu_model("../etc"), cpu_model("a b")]
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("catalog", "validate", str(path), stdout=io.StringIO(), stderr=err)
    assert exit_.value.code == 1
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("models[1].name") and '".."' in lines[0], lines
    assert lines[1].startswith("models[2].name") and "space" in lines[1], lines


@pytest.mark.parametrize(
    ("origin", "path"),
    [
        ({"repo": "org/chat\r\nX: y", "revision": "abc"}, ("origin", "repo")),
        ({"repo": "org/chat", "revision": "abc",
          "files": [{"path": "ok.gguf"}, {"path": "evil\n.gguf"}]}, ("origin", "files", 1, "path")),
        ({"repo": "org/chat", "revision": "abc",
          "previous": {"source": "org/old\x1b", "revision": "def"}},
         ("origin", "previous", "source")),
    ],
)  # fmt: skip
def test_an_origin_path_with_a_control_character_is_refused_at_its_field(
    origin: dict, path: tuple
) -> None:
    problems = [p for p in _problems(cpu_model("ok", origin=origin)) if p.path == path]
    assert len(problems) == 1 and problems[0].code == "control_character", problems


@pytest.mark.django_db
def test_the_api_refuses_an_origin_file_with_a_line_break(api_for, operator) -> None:
    from catalog.models import ServedModel

    body = cpu_model("ok", origin={"repo": "org/ok", "revision": "a", "files": [{"path": "a\nb"}]})
    r = api_for(operator).post("/api/v1/catalog/models/", body, format="json")
    assert r.status_code == 400, r.json()
    assert "origin" in str(r.json()) and "U+000A" in str(r.json())
    assert not ServedModel.objects.exists()
