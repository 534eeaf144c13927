"""Tests for catalog.files: reading catalog files strictly, writing them stably."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog import yamlfile
from catalog.durations import HOUR, MILLISECOND, MINUTE
from catalog.files import MAX_FILE_BYTES, dump_catalog, load_catalog_text
from catalog.problems import Problem
from catalog.spec import GuardModel, Model, Profile, ScaleWindow
from tests.catalog.test_codec import models

# A catalog using every part of the format, written as dump_catalog writes it: a vLLM
# profile across two nodes, a llama.cpp CPU profile, a schedule past midnight,
# adapters, a canary, an external model, a guard and an origin with its previous one.
SAMPLE = """\
models:
- name: llama-3.1-405b
  aliases:
  - llama405
  description: |-
    Llama 3.1 405B Instruct, across two nodes.
    Slow to load: keep one replica warm.
  source: hf://meta-llama/Llama-3.1-405B-Instruct
  profiles:
  - name: h100-2x8
    engine: vllm
    engine_version: '0.11'
    gpu_class: nvidia-h100-80gb
    tp: 8
    pp: 2
    gpus_per_node: 8
    nodes: 2
    args:
    - --max-model-len
    - '32768'
    - --enable-prefix-caching
    env:
      NCCL_IB_DISABLE: '0'
      VLLM_ATTENTION_BACKEND: FLASHINFER
    min_memory_gb: 1024
    min_disk_gb: 900
    node_selector:
      llmgw.io/rack: r12
    power_watts: 11200.5
    keep_within: rack
    weight: 1.5
    priority: 10
    startup_timeout: 45m
    kv_events: true
  scaling:
    min: 1
    max: 2
    idle_timeout: 1h30m
    schedule:
    - days:
      - weekdays
      from: '08:00'
      to: '18:00'
      min: 2
    - days:
      - fri
      - sat
      from: '22:00'
      to: '02:00'
      min: 0
      max: 1
    prewarm: 10m
  class: interactive
  owner: team-research
  adapters:
  - name: llama405-sql
    source: hf://acme/llama405-sql-lora
    scale: 0.75
  - name: llama405-legal
    source: /models/adapters/legal
  max_loaded_adapters: 2
  fallbacks:
  - llama-3.1-70b
  - gpt-4o
  canary:
    model: llama-3.3-405b-candidate
    percent: 5
    min_requests: 500
    max_error_increase: 0.02
    max_ttft_ratio: 1.25
  eval:
    suite: chat-core
    min_score: 0.8
    judge: qwen3-guard
  slo:
    ttft_p99: 2s
    tpot_p99: 80ms
  context_length: 131072
  max_output: 8192
  capabilities:
    tools: true
  origin:
    repo: meta-llama/Llama-3.1-405B-Instruct
    revision: be673f326cab4cd22ccfef76109faf68e41aa5f1
    files:
    - path: model-00001-of-00191.safetensors
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      bytes: 4882298320
    previous:
      source: hf://meta-llama/Llama-3.1-405B-Instruct@0e9e39f
      revision: 0e9e39f249a16976918f6564b8830bc894c89659
      files:
      - path: model-00001-of-00191.safetensors
        bytes: 4882298000
- name: llama-3.2-3b-cpu
  source: /models/llama-3.2-3b-q4_k_m.gguf
  profiles:
  - name: cpu
    engine: llamacpp
    args:
    - --ctx-size
    - '8192'
    min_memory_gb: 8
    cpu_cores: 16
  scaling:
    max: 2
    idle_timeout: 20m
  class: batch
  context_length: 8192
- name: gpt-4o
  external:
    url: https://api.openai.com/v1
    model: gpt-4o-2024-08-06
    api_key_file: /run/secrets/openai
  context_length: 128000
  capabilities:
    tools: true
    vision: true
- name: qwen3-guard
  source: hf://Qwen/Qwen3Guard-Gen-8B
  profiles:
  - name: l4
    engine: vllm
    gpu_class: nvidia-l4-24gb
  scaling:
    min: 1
    max: 1
  role: guard
  guard:
    format: qwen3guard
    categories:
    - violent
    - pii
"""


def load(text: str | bytes) -> list[Model]:
    """Return the models of a file that must be valid."""
    models, problems = load_catalog_text(text)
    assert problems == []
    assert models is not None
    return models


def refused(text: str | bytes, name: str = "<file>") -> list[Problem]:
    """Return the problems of a file that must be refused."""
    models, problems = load_catalog_text(text, name)
    assert models is None
    assert problems
    return problems


def only(text: str | bytes, name: str = "<file>") -> Problem:
    """Return the one problem of a refused file."""
    problems = refused(text, name)
    assert len(problems) == 1, problems
    return problems[0]


# The sample catalog.


def test_sample_loads_with_every_part() -> None:
    big, cpu, external, guard = load(SAMPLE)
    assert [p.name for p in big.profiles] == ["h100-2x8"]
    assert big.profiles[0].nodes == 2
    assert big.profiles[0].env == {
        "NCCL_IB_DISABLE": "0",
        "VLLM_ATTENTION_BACKEND": "FLASHINFER",
    }
    assert big.profiles[0].startup_timeout == 45 * MINUTE
    assert big.scaling.idle_timeout == HOUR + 30 * MINUTE
    assert big.scaling.schedule[1] == ScaleWindow(
        days=["fri", "sat"], from_="22:00", to="02:00", min=0, max=1
    )
    assert big.description.endswith("keep one replica warm.")
    assert big.slo.tpot_p99 == 80 * MILLISECOND
    assert [a.name for a in big.adapters] == ["llama405-sql", "llama405-legal"]
    assert big.canary is not None
    assert big.canary.percent == 5
    assert big.origin is not None
    assert big.origin.previous is not None
    assert big.origin.previous.files[0].bytes == 4882298000
    assert cpu.profiles[0].cpu_cores == 16
    assert cpu.profiles[0].gpu_class == ""
    assert external.external is not None
    assert external.external.api_key_file == "/run/secrets/openai"
    assert guard.guard == GuardModel(format="qwen3guard", categories=["violent", "pii"])


def test_sample_dumps_byte_identical() -> None:
    assert dump_catalog(load(SAMPLE)) == SAMPLE


def test_sample_loads_from_bytes_with_a_byte_order_mark() -> None:
    assert load(b"\xef\xbb\xbf" + SAMPLE.encode()) == load(SAMPLE)


def test_unquoted_times_and_words_are_text() -> None:
    """Reads YAML 1.2 scalars, as the reference's yaml.v3 does: 22:00 is not 1320."""
    text = (
        "models:\n"
        "- name: on\n"
        "  description: 2024-01-01\n"
        "  scaling:\n"
        "    schedule:\n"
        "    - from: 22:00\n"
        "      to: 06:30\n"
        "      days: [sat, sun]\n"
    )
    (model,) = load(text)
    assert model.name == "on"
    assert model.description == "2024-01-01"
    assert model.scaling.schedule[0].from_ == "22:00"
    assert model.scaling.schedule[0].to == "06:30"


def test_yaml_numbers_and_booleans_are_read() -> None:
    text = (
        "models:\n"
        "- name: m\n"
        "  max_output: 0x1000\n"
        "  context_length: 131_072\n"
        "  profiles:\n"
        "  - weight: 1e-1\n"
        "    power_watts: .5\n"
        "    kv_events: True\n"
        "    priority: -3\n"
    )
    (model,) = load(text)
    assert model.max_output == 4096
    assert model.context_length == 131072
    assert model.profiles[0] == Profile(weight=0.1, power_watts=0.5, kv_events=True, priority=-3)


def test_anchors_and_merge_keys_are_allowed() -> None:
    text = (
        "models:\n"
        "- name: a\n"
        "  profiles:\n"
        "  - &h100\n"
        "    name: h100\n"
        "    engine: vllm\n"
        "    tp: 2\n"
        "- name: b\n"
        "  profiles:\n"
        "  - <<: *h100\n"
        "    tp: 4\n"
        "  - *h100\n"
    )
    a, b = load(text)
    assert a.profiles == [Profile(name="h100", engine="vllm", tp=2)]
    assert b.profiles == [
        Profile(name="h100", engine="vllm", tp=4),
        Profile(name="h100", engine="vllm", tp=2),
    ]


def test_empty_models_is_an_empty_catalog() -> None:
    assert load("models: []\n") == []
    assert load("models:\n") == []


# File problems.


def test_too_large() -> None:
    text = "models: []\n" + "#" * MAX_FILE_BYTES
    for data in (text, text.encode()):
        problem = only(data, "big.yaml")
        assert problem.code == "too_large"
        assert problem.path == ()
        assert problem.index is None
        assert problem.message == (
            f"big.yaml is {MAX_FILE_BYTES + 11:,} bytes; the limit is 10 MB "
            "(10,485,760 bytes): split it into smaller files"
        )


def test_not_utf8() -> None:
    problem = only(b"models:\n- name: caf\xe9\n", "c.yaml")
    assert problem.code == "not_utf8"
    assert problem.message == (
        "c.yaml is not UTF-8 text: the byte 0xe9 on line 2 (offset 19) is not valid "
        "UTF-8; save the file as UTF-8"
    )


def test_not_unicode_text() -> None:
    problem = only("models:\n- name: \ud800\n")
    assert problem.code == "not_utf8"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "models:\n  - name: x\n   bad: [\n",
            "c.yaml is not valid YAML: line 3, column 4: did not find expected '-' "
            "indicator (while parsing a block collection)",
        ),
        (
            "models:\n\t- name: x\n",
            "c.yaml is not valid YAML: line 2, column 1: found character that cannot "
            "start any token (while scanning for the next token)",
        ),
        (
            "models:\n- name: \x00\n",
            "c.yaml is not valid YAML: line 2: control characters are not allowed (character 0x00)",
        ),
        (
            "models: []\n---\nmodels: []\n",
            "c.yaml holds more than one YAML document (a second starts at line 2): keep one",
        ),
        (
            "models: [*x]\n",
            "*x at line 1 refers to no anchor &x before it (or to a block it is itself inside)",
        ),
        (
            "models: &x [*x]\n",
            "*x at line 1 refers to no anchor &x before it (or to a block it is itself inside)",
        ),
    ],
)
def test_not_yaml(text: str, message: str) -> None:
    problem = only(text, "c.yaml")
    assert problem.code == "not_yaml"
    assert problem.message == message
    assert problem.index is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "- name: x\n",
            'the top of <file> must be a mapping with the key "models:", not a list: '
            'write "models:" on the first line and indent the list under it',
        ),
        (
            "just text\n",
            'the top of <file> must be a mapping with the key "models:", not a single value',
        ),
    ],
)
def test_not_mapping(text: str, message: str) -> None:
    problem = only(text)
    assert problem.code == "not_mapping"
    assert problem.path == ()
    assert problem.message == message


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "null\n"])
def test_empty_file_has_no_models(text: str) -> None:
    problem = only(text)
    assert problem.code == "no_models"
    assert problem.message == '<file> is empty: put the models under "models:", as a list'


def test_no_models_key() -> None:
    problems = refused("model:\n- name: x\n")
    assert [(p.code, p.path) for p in problems] == [
        ("no_models", ()),
        ("unknown_key", ("model",)),
    ]
    assert problems[0].message == (
        '<file> has no "models:" key: put the models under "models:", as a list'
    )
    assert problems[1].message == (
        'unknown key "model" at the top of the file: did you mean "models"?'
    )


def test_other_top_level_keys() -> None:
    problem = only("models: []\nversion: 2\n")
    assert problem.code == "unknown_key"
    assert problem.path == ("version",)
    assert problem.index is None
    assert problem.message == (
        'unknown key "version" at the top of the file: a catalog file has only "models:" at its top'
    )


def test_models_not_a_list() -> None:
    problem = only("models:\n  name: x\n")
    assert problem.code == "wrong_type"
    assert problem.path == ("models",)
    assert problem.field == "models"
    assert problem.message == (
        '"models" must be a list of models, one "- " item each, not a mapping'
    )


def test_model_not_a_mapping() -> None:
    problem = only("models:\n- name: ok\n- chat\n")
    assert problem.code == "wrong_type"
    assert problem.index == 1
    assert problem.path == ()
    assert problem.file_path == "models[1]"


def test_duplicate_key_inside_a_model() -> None:
    text = "models:\n- name: m\n  profiles:\n  - name: p\n    tp: 2\n    tp: 4\n"
    problem = only(text)
    assert problem == Problem(
        path=("profiles", 0, "tp"),
        message='"tp" is written twice in models[0].profiles[0] (lines 5 and 6): '
        "YAML would keep only the last, so remove one",
        code="duplicate_key",
        model="m",
        index=0,
    )


def test_duplicate_key_at_the_top_and_in_a_block() -> None:
    text = "models:\n- name: a\n- name: b\n  scaling:\n    min: 1\n    min: 2\nmodels: []\n"
    problems = refused(text)
    # The second "models" replaced the first, so the first's problem has no model to
    # belong to: it is reported from the top of the file.
    assert [(p.code, p.path, p.index) for p in problems] == [
        ("duplicate_key", ("models", 1, "scaling", "min"), None),
        ("duplicate_key", ("models",), None),
    ]
    assert "at the top of the file (lines 1 and 7)" in problems[1].message
    text = text.removesuffix("models: []\n")
    (problem,) = refused(text)
    assert (problem.path, problem.index, problem.model) == (("scaling", "min"), 1, "b")


def test_duplicate_key_in_env_and_merge() -> None:
    text = (
        "models:\n"
        "- name: m\n"
        "  profiles:\n"
        "  - env:\n"
        "      A: '1'\n"
        "      A: '2'\n"
        "    <<: {}\n"
        "    <<: {}\n"
    )
    problems = refused(text)
    assert [p.path for p in problems] == [
        ("profiles", 0, "env", "A"),
        ("profiles", 0, "<<"),
    ]
    assert {p.code for p in problems} == {"duplicate_key"}


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 8):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    problem = only("\n".join(lines) + "\nmodels: []\n")
    assert problem.code == "too_large"
    assert problem.message.startswith(
        f"<file>'s aliases expand to more than {yamlfile.MAX_ALIAS_NODES:,} values"
    )


def test_deep_nesting_is_refused() -> None:
    depth = 100_000
    problem = only("models: " + "[" * depth + "]" * depth + "\n")
    assert problem.code == "too_deep"
    assert problem.message == (
        f"<file> is nested more than {yamlfile.MAX_DEPTH} levels deep at line 1: no file "
        "llmgw reads is nested that deep; check the brackets and the indentation"
    )


def test_tags_other_than_plain_data_are_refused() -> None:
    text = (
        "models:\n"
        "- name: !!binary aGk=\n"
        "  source: !!python/object:os.system x\n"
        "  description: !!str 12\n"
        "  max_output: !!int '12'\n"
        "  aliases: !!set {a: null}\n"
    )
    problems = refused(text)
    assert [(p.code, p.path) for p in problems] == [
        ("unsupported_yaml", ("name",)),
        ("unsupported_yaml", ("source",)),
        ("unsupported_yaml", ("aliases",)),
        ("wrong_type", ("aliases",)),
    ]
    assert problems[0].message == (
        "the tag !!binary at line 2 is not supported: these files hold only text, "
        "numbers, true/false, null, lists and mappings; remove the tag"
    )


def test_a_key_that_is_a_block() -> None:
    problem = only("models:\n- ? [a]\n  : x\n")
    assert problem.code == "wrong_type"
    assert problem.index == 0
    assert problem.message == "a key in models[0] (line 2) is a list: keys must be text"


def test_model_problems_carry_index_and_name_and_all_are_reported() -> None:
    text = (
        "models:\n"
        "- name: good\n"
        "- name: bad\n"
        "  profiles:\n"
        "  - tp: two\n"
        "    gpu_clas: x\n"
        "- name: worse\n"
        "  scaling: {idle_timeout: 90}\n"
        "extra: 1\n"
    )
    problems = refused(text)
    assert [(p.index, p.model, p.code, p.file_path) for p in problems] == [
        (None, "", "unknown_key", "extra"),
        (1, "bad", "wrong_type", "models[1].profiles[0].tp"),
        (1, "bad", "unknown_key", "models[1].profiles[0].gpu_clas"),
        (2, "worse", "duration_unit", "models[2].scaling.idle_timeout"),
    ]
    assert problems[1].line() == (
        'models[1].profiles[0].tp (model "bad"): tp must be a whole number, not the text "two"'
    )


def test_yes_is_not_a_boolean() -> None:
    problem = only("models:\n- name: m\n  capabilities: {tools: yes}\n")
    assert problem.code == "wrong_type"
    assert problem.message == (
        'tools must be true or false, not the text "yes": write true or false, without quotes'
    )


# Writing.


@pytest.mark.parametrize(
    "text",
    [
        "yes",
        "no",
        "on",
        "Off",
        "y",
        "N",
        "08:00",
        "1:30",
        "1e3",
        "1_000",
        "0x1f",
        "0o17",
        "0777",
        ".5",
        "+1",
        "-1",
        ".inf",
        ".NaN",
        "null",
        "Null",
        "~",
        "",
        "true",
        "FALSE",
        "2024-01-01",
        "<<",
        "=",
        "- a",
        "a: b",
        "#x",
        " x",
        "x ",
        "a\nb",
        "a\r\nb",
        "a\n",
        "\ufeff",
        "\x85",
        "ünïcödé",
        "'",
        '"',
    ],
)
def test_text_that_yaml_would_misread_is_quoted(text: str) -> None:
    model = Model(name="m", description=text, aliases=[text])
    dumped = dump_catalog([model])
    assert load(dumped) == [model]
    assert dump_catalog(load(dumped)) == dumped


def test_dump_quotes_times_and_keeps_unicode() -> None:
    model = Model(
        name="çat",
        description="yes",
        profiles=[Profile(env={"B": "08:00", "A": "1e3"})],
    )
    assert dump_catalog([model]) == (
        "models:\n"
        "- name: çat\n"
        "  description: 'yes'\n"
        "  profiles:\n"
        "  - env:\n"
        "      A: '1e3'\n"
        "      B: '08:00'\n"
    )


def test_dump_of_no_models() -> None:
    assert dump_catalog([]) == "models: []\n"
    assert load(dump_catalog([])) == []


def test_dump_writes_multi_line_text_as_a_block() -> None:
    model = Model(name="m", description="one\ntwo\n")
    assert dump_catalog([model]) == "models:\n- name: m\n  description: |\n    one\n    two\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(models, max_size=3))
def test_load_of_dump_is_the_same_and_dump_is_stable(catalog: list[Model]) -> None:
    dumped = dump_catalog(catalog)
    loaded = load(dumped)
    assert loaded == catalog
    assert dump_catalog(loaded) == dumped


_no_nul = st.text(st.characters(codec="utf-8", blacklist_characters="\x00"))


@settings(max_examples=300, deadline=None)
@given(_no_nul, st.dictionaries(_no_nul, _no_nul, max_size=3))
def test_any_text_survives_a_dump(text: str, env: dict[str, str]) -> None:
    model = Model(name=text, aliases=[text], profiles=[Profile(env=env)])
    dumped = dump_catalog([model])
    assert load(dumped) == [model]
    assert dump_catalog(load(dumped)) == dumped


def test_a_thousand_models_load() -> None:
    models = load(SAMPLE)
    text = dump_catalog(
        [
            m
            for i in range(250)
            for m in (Model(**{**vars(model), "name": f"{model.name}-{i}"}) for model in models)
        ]
    )
    loaded = load(text)
    assert len(loaded) == 1000
    assert loaded[-1].name == "qwen3-guard-249"


@pytest.mark.parametrize(("limit", "codes"), [(31, ["unknown_key"] * 3), (30, ["too_large"])])
def test_values_reached_through_aliases_are_counted_by_size(
    monkeypatch: Any, limit: int, codes: list[str]
) -> None:
    # a holds 7 values (the list, three positions, three items); b reaches a twice
    # (14) and holds 17; c reaches b (17): 31 in all.
    monkeypatch.setattr(yamlfile, "MAX_ALIAS_NODES", limit)
    text = "a: &a [1, 2, 3]\nb: &b [*a, *a]\nmodels: []\nc: *b\n"
    assert [p.code for p in refused(text)] == codes


def test_explicit_keys_win_over_merged_ones_wherever_they_are() -> None:
    text = (
        "models:\n"
        "- name: a\n"
        "  profiles:\n"
        "  - &base {name: base, tp: 2, pp: 1}\n"
        "  - &more {name: more, tp: 8, nodes: 2}\n"
        "  - tp: 4\n"
        "    <<: [*base, *more]\n"
    )
    (model,) = load(text)
    assert model.profiles[2] == Profile(name="base", tp=4, pp=1, nodes=2)


def test_numbers_too_long_for_python_are_text() -> None:
    digits = "1" * 5000
    problem = only(f"models:\n- name: m\n  max_output: {digits}\n")
    assert problem.code == "wrong_type"
    problem = refused(f"models:\n- name: m\n  max_output: !!int {digits}\n")[0]
    assert problem.code == "not_yaml"
    assert (
        problem.message
        == f'"{digits[:39]}…" at line 3 is not a valid !!int: write it as one, or drop the tag'
    )


def test_a_tagged_number_that_is_not_one() -> None:
    problem = refused("models:\n- name: m\n  max_output: !!int 1.5\n")[0]
    assert problem.code == "not_yaml"
    assert problem.path == ("max_output",)
    assert (
        problem.message == '"1.5" at line 3 is not a valid !!int: write it as one, or drop the tag'
    )
    (model,) = load("models:\n- name: m\n  profiles: [{weight: !!float 2, tp: !!int '3'}]\n")
    assert model.profiles[0] == Profile(weight=2.0, tp=3)
