"""Tests of the catalog's rules, defaults and helpers (catalog.rules) and the engines' checks.

Plain data only: no database, no Django.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.discovery import is_mig_class
from agent.engines import ENGINES, RUNTIME_LORA_ENV, unsafe_args, unsafe_env
from catalog.durations import HOUR, MINUTE, SECOND
from catalog.problems import Problem
from catalog.rules import (
    CLASSES,
    FACILITY_LEVELS,
    GUARD_FORMATS,
    ROLE_GUARD,
    Catalog,
    build_catalog,
    canary_limits,
    check_catalog,
    check_model,
    class_rank,
    clock,
    cpu_capable,
    cpu_only,
    effective_class,
    effective_scale,
    fingerprint,
    is_external,
    is_guard,
    is_peer,
    kv_index,
    normalize,
    normalized_profiles,
    on_demand,
    parse_level,
    profile_by_name,
    repository_page,
    short_revision,
    simulated,
    suggest_cores,
    valid_owner,
    window_at,
)
from catalog.spec import (
    Adapter,
    Canary,
    EvalGate,
    External,
    GuardModel,
    Model,
    Profile,
    ScaleWindow,
    Scaling,
)

H100 = "nvidia-h100-80gb"
MIG = "nvidia-a100-80gb-mig-1g.10gb"


def gpu(**kw) -> Profile:
    """Return a valid one-card vLLM profile, changed by kw."""
    return Profile(**{"name": "gpu", "gpu_class": H100, **kw})


def cpu(**kw) -> Profile:
    """Return a valid llama.cpp CPU profile, changed by kw."""
    return Profile(**{"name": "cpu", "engine": "llamacpp", **kw})


def model(*profiles: Profile, **kw) -> Model:
    """Return a valid model (one GPU profile unless given), changed by kw."""
    fields = {
        "name": "chat",
        "source": "org/chat",
        "profiles": list(profiles) or [gpu()],
        "scaling": Scaling(min=1),
        **kw,
    }
    return Model(**fields)


def external(**kw) -> Model:
    """Return a valid external model, changed by kw."""
    ext = External(url="https://api.openai.com", model="gpt-4o")
    return Model(**{"name": "cloud", "source": "cloud", "external": ext, **kw})


def guard(**kw) -> Model:
    """Return a valid guard model, changed by kw."""
    fields = {"name": "judge", "role": ROLE_GUARD, "guard": GuardModel("llamaguard3")}
    return model(**{**fields, **kw})


def only(problems: list[Problem]) -> Problem:
    """Return the one problem found, failing on none or several."""
    assert len(problems) == 1, problems
    return problems[0]


def assert_problem(problem: Problem, path: tuple, code: str, *words: str) -> None:
    """Assert a problem's path and code, and that its message has each word."""
    assert (problem.path, problem.code) == (path, code), problem
    for w in words:
        assert w in problem.message, (w, problem.message)


# agent.engines


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("1ABC", "not a variable name"),
        ("A-B", "not a variable name"),
        ("", "not a variable name"),
        ("A\n", "not a variable name"),
        ("PATH", "programs and libraries"),
        ("LD_PRELOAD", "programs and libraries"),
        ("LD_LIBRARY_PATH", "programs and libraries"),
        ("PYTHONPATH", "Python code"),
        ("PYTHONHOME", "Python code"),
        ("PYTHONSTARTUP", "Python code"),
        ("PYTHONUSERBASE", "Python code"),
        ("PYTHONEXECUTABLE", "Python code"),
        ("CUDA_VISIBLE_DEVICES", "gpu_class and gpus_per_node"),
        ("NVIDIA_VISIBLE_DEVICES", "gpu_class and gpus_per_node"),
        ("HIP_VISIBLE_DEVICES", "gpu_class and gpus_per_node"),
        ("ROCR_VISIBLE_DEVICES", "gpu_class and gpus_per_node"),
    ],
)
def test_unsafe_env_refuses_with_reason(key, reason):
    why = unsafe_env(key)
    assert why is not None
    assert reason in why


@pytest.mark.parametrize(
    "key", ["VLLM_LOGGING_LEVEL", "PYTHONHASHSEED", "OMP_NUM_THREADS", "NCCL_DEBUG"]
)
def test_unsafe_env_allows_listed_names(key):
    assert unsafe_env(key) is None


@pytest.mark.parametrize("key", ["HF_HOME", "XPATH", "CLASSPATH", "hf_home"])
def test_unsafe_env_refuses_names_that_name_a_thing(key):
    assert "names a file" in unsafe_env(key)


@pytest.mark.parametrize("key", ["_X", "a1", "NCCL_NEW_KNOB"])
def test_unsafe_env_passes_names_no_engine_lists_and_warns_of_them(key):
    from agent.flags import env_warning

    assert unsafe_env(key) is None
    assert "not a variable" in env_warning(key, "vllm")


UNSAFE_FLAGS = [
    *[
        (e, f, "agent")
        for e in ("vllm", "sglang", "llamacpp", "trtllm")
        for f in ("--host", "--port")
    ],
    ("vllm", "--model", "source"),
    ("vllm", "--served-model-name", "name"),
    ("vllm", "--tensor-parallel-size", "tp"),
    ("vllm", "-tp", "tp"),
    ("vllm", "--pipeline-parallel-size", "pp"),
    ("vllm", "-pp", "pp"),
    ("sglang", "--model-path", "source"),
    ("sglang", "--served-model-name", "name"),
    ("sglang", "--tp-size", "tp"),
    ("sglang", "--tp", "tp"),
    ("sglang", "--pp-size", "pp"),
    ("sglang", "--nnodes", "nodes"),
    ("sglang", "--node-rank", "nodes"),
    ("sglang", "--dist-init-addr", "nodes"),
    ("trtllm", "--tp_size", "tp"),
    ("trtllm", "--pp_size", "pp"),
    ("llamacpp", "-m", "source"),
    ("llamacpp", "--model", "source"),
    ("llamacpp", "--alias", "name"),
    ("llamacpp", "-t", "cpu_cores"),
    ("llamacpp", "--threads", "cpu_cores"),
    ("llamacpp", "--lora", "adapters"),
    ("llamacpp", "--lora-scaled", "adapters"),
]


@pytest.mark.parametrize(("engine", "flag", "field"), UNSAFE_FLAGS)
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_unsafe_args_refuses_what_the_agent_sets(engine, flag, field, form):
    ok = {"vllm": "--enforce-eager", "sglang": "--is-embedding", "llamacpp": "--jinja"}
    first = ok.get(engine, "--enable_chunked_prefill")
    args = [first, flag, "1"] if form == "separate" else [first, f"{flag}=1"]
    why = unsafe_args(engine, args)
    assert why is not None
    assert f'"{flag}"' in why
    assert field in why


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("sim", ["--load-time", "5", "--tps=80", "--logprob-style", "llamacpp"]),
        ("vllm", ["--max-model-len", "8192", "--enforce-eager", "--gpu-memory-utilization=0.9"]),
        ("vllm", ["--max-model-len", "32k", "--no-enable-prefix-caching", "--seed", "-1"]),
        ("llamacpp", ["--ctx-size", "8192", "--flash-attn", "on", "--jinja", "-ts", "3,1"]),
        ("llamacpp", ["--flash-attn", "on", "--cache-type-k", "q8_0", "--temp", ".7"]),
        ("trtllm", ["--max_batch_size", "8", "--enable_chunked_prefill"]),
        ("sglang", ["--mem-fraction-static", "0.8", "--disable-radix-cache"]),
        ("vllm", []),
    ],
)
def test_unsafe_args_allows_other_flags(engine, args):
    assert unsafe_args(engine, args) is None


def test_unsafe_args_refuses_unknown_engine_naming_the_five():
    why = unsafe_args("tgi", [])
    assert why is not None
    assert '"tgi"' in why
    for e in ENGINES:
        assert e in why


def test_engines_are_the_five():
    assert ENGINES == ("vllm", "sglang", "llamacpp", "trtllm", "sim")
    assert RUNTIME_LORA_ENV == "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


# agent.discovery


@pytest.mark.parametrize(
    ("gpu_class", "mig"),
    [
        (MIG, True),
        ("NVIDIA-A100-80GB-MIG-3G.40GB", True),
        (H100, False),
        ("mig-nvidia", False),
        ("", False),
    ],
)
def test_is_mig_class(gpu_class, mig):
    assert is_mig_class(gpu_class) is mig


# Helpers


def test_cpu_capable_is_llamacpp_only():
    assert cpu_capable("llamacpp")
    assert not any(cpu_capable(e) for e in ENGINES if e != "llamacpp")


def test_cpu_only_needs_no_class_and_a_capable_engine():
    assert cpu_only(cpu())
    assert not cpu_only(cpu(gpu_class=H100))
    assert not cpu_only(Profile(engine="vllm"))
    assert not cpu_only(Profile(engine="sim"))


@pytest.mark.parametrize(
    ("m", "want"),
    [
        (model(), "standard"),
        (model(scaling=Scaling(min=0, max=2)), "opportunistic"),
        (model(scaling=Scaling(min=0, max=0)), "standard"),
        (guard(), "critical"),
        (guard(class_="opportunistic"), "opportunistic"),
        (model(class_="critical", scaling=Scaling(min=0, max=2)), "critical"),
    ],
)
def test_effective_class(m, want):
    assert effective_class(m) == want


def test_class_rank_orders_the_classes():
    assert class_rank("critical") == 3
    assert class_rank("standard") == class_rank("") == 2
    assert class_rank("opportunistic") == class_rank("bogus") == 1
    assert CLASSES == ("critical", "standard", "opportunistic")


def test_on_demand_is_min_zero_with_max_above():
    assert on_demand(Scaling(min=0, max=1))
    assert not on_demand(Scaling(min=0, max=0))
    assert not on_demand(Scaling(min=1, max=2))


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("00:00", 0),
        ("08:30", 510),
        ("23:59", 1439),
        ("24:00", None),
        ("08:60", None),
        ("8:00", None),
        ("08:00 ", None),
        ("+1:30", None),
        ("1:5xx", None),
        ("08.00", None),
        ("\uff10\uff18:00", None),  # fullwidth digits are digits to Python's \d
        ("", None),
    ],
)
def test_clock_reads_hh_mm_only(text, minutes):
    assert clock(text) == minutes


def test_suggest_cores_is_half_the_smallest():
    assert suggest_cores([16, 8, 0, -1]) == 4
    assert suggest_cores([1]) == 1
    assert suggest_cores([3]) == 1
    assert suggest_cores([0, -2]) == 0
    assert suggest_cores([]) == 0


def test_simulated_needs_every_profile_sim():
    assert simulated(model(gpu(engine="sim"), gpu(name="b", engine="sim")))
    assert not simulated(model(gpu(engine="sim"), gpu(name="b")))
    assert not simulated(external())


def test_canary_limits_fill_defaults():
    assert canary_limits(Canary(model="x")) == (50, 0.05, 1.5)
    assert canary_limits(Canary(model="x", min_requests=-1, max_ttft_ratio=-2)) == (
        50,
        0.05,
        1.5,
    )
    assert canary_limits(Canary("x", 5, 10, 0.1, 2.0)) == (10, 0.1, 2.0)


@pytest.mark.parametrize(
    ("source", "repo"),
    [
        ("https://huggingface.co/Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("https://huggingface.co/Qwen/Qwen3-8B/", "Qwen/Qwen3-8B"),
        ("http://huggingface.co/Qwen/Qwen3-8B/tree/main", "Qwen/Qwen3-8B"),
        ("https://hf.co/org/repo/blob/main/x.gguf", "org/repo"),
        ("https://huggingface.co/org/repo/resolve/main/x.gguf", None),
        ("https://huggingface.co/org", None),
        ("https://huggingface.co/", None),
        ("Qwen/Qwen3-8B", None),
        ("https://example.com/org/repo", None),
        ("/models/x.gguf", None),
    ],
)
def test_repository_page(source, repo):
    assert repository_page(source) == repo


def test_short_revision():
    assert short_revision("0123456789abcdef") == "01234567"
    assert short_revision("abc") == "abc"


def test_effective_scale_defaults_to_one():
    assert effective_scale(Adapter("a", "s", 0)) == 1
    assert effective_scale(Adapter("a", "s", -1)) == 1
    assert effective_scale(Adapter("a", "s", 0.5)) == 0.5


def test_kv_index_when_any_profile_publishes():
    assert kv_index(model(gpu(), gpu(name="b", kv_events=True)))
    assert not kv_index(model())


def test_is_guard_external_peer():
    assert is_guard(guard())
    assert not is_guard(model())
    assert is_external(external())
    assert not is_external(model())
    assert not is_peer(external())
    assert is_peer(external(external=External("https://p", "m", peer="east")))
    assert not is_peer(model())


def test_profile_by_name():
    m = model(gpu(), cpu())
    assert profile_by_name(m, "cpu") is m.profiles[1]
    assert profile_by_name(m, "nope") is None


@pytest.mark.parametrize(
    ("owner", "valid"),
    [
        ("org:acme", True),
        ("team:7", True),
        ("project:x", True),
        ("org:", False),
        ("user:1", False),
        ("acme", False),
        ("", False),
    ],
)
def test_valid_owner(owner, valid):
    assert valid_owner(owner) is valid


def test_parse_level_trims_and_lowercases():
    assert parse_level(" Rack ") == "rack"
    assert [parse_level(x) for x in FACILITY_LEVELS] == list(FACILITY_LEVELS)


@pytest.mark.parametrize("text", ["floor", "", "  ", "racks"])
def test_parse_level_refuses_naming_the_four(text):
    with pytest.raises(ValueError, match="rack, row, room, site"):
        parse_level(text)


# fingerprint: vectors from the reference's json.Marshal, run by Go


def test_fingerprint_matches_go():
    p = Profile(
        name="gpu",
        engine="vllm",
        gpu_class=H100,
        tp=4,
        gpus_per_node=4,
        nodes=1,
        weight=1.0,
        startup_timeout=20 * MINUTE,
    )
    assert fingerprint(p) == "5dc3d3ef5cae1269"
    assert fingerprint(Profile()) == "44136fa355b3678a"


def test_fingerprint_matches_go_for_maps_escapes_and_floats():
    p = Profile(
        name="cpu",
        engine="llamacpp",
        args=["--ctx-size", "8192"],
        env={"Z": "1", "A": "<&>"},
        node_selector={"llmgw.io/rack": "r1", "b": "2"},
        power_watts=1e21,
        weight=0.000001,
        cpu_cores=4,
        keep_within="rack",
        priority=-3,
        startup_timeout=90 * SECOND,
        kv_events=True,
    )
    assert fingerprint(p) == "b99c55ccf9896568"
    p = Profile(name="é漢\u2028", power_watts=1e-7, weight=1e20)
    assert fingerprint(p) == "487c743c53eb5837"


def test_fingerprint_changes_with_contents_and_is_16_hex():
    a = fingerprint(gpu())
    assert re.fullmatch(r"[0-9a-f]{16}", a)
    assert a == fingerprint(gpu())
    assert a != fingerprint(gpu(node_selector={"zone": "a"}))
    assert fingerprint(gpu(weight=1.0)) == fingerprint(gpu(weight=1))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_fingerprint_of_a_non_finite_number_is_unmarshalable(value):
    assert fingerprint(gpu(weight=value)) == "unmarshalable"


# normalize


def test_normalize_fills_profile_defaults():
    p = normalize(model(Profile(name="gpu", gpu_class=H100))).profiles[0]
    assert (p.engine, p.tp, p.nodes, p.gpus_per_node) == ("vllm", 1, 1, 1)
    assert p.startup_timeout == 20 * MINUTE
    assert p.weight == 1


def test_normalize_keeps_given_values():
    given_ = gpu(engine="sglang", tp=4, nodes=2, gpus_per_node=2, startup_timeout=HOUR, weight=3)
    assert normalize(model(given_)).profiles[0] == given_


@pytest.mark.parametrize(
    ("tp", "nodes", "gpus_per_node"), [(4, 1, 4), (8, 2, 4), (1, 2, 1), (3, 4, 1)]
)
def test_normalize_gpus_per_node_is_tp_over_nodes(tp, nodes, gpus_per_node):
    p = normalize(model(gpu(tp=tp, nodes=nodes))).profiles[0]
    assert p.gpus_per_node == gpus_per_node


def test_normalize_cpu_profile_has_no_gpus():
    p = normalize(model(cpu(gpus_per_node=2, tp=2))).profiles[0]
    assert p.gpus_per_node == 0


@pytest.mark.parametrize(
    ("tp", "pp", "gpus_per_node", "want"),
    [
        (4, 0, 0, (4, 1, 0)),
        (2, 2, 0, (4, 1, 0)),
        (2, 0, 2, (2, 1, 0)),
        (2, 0, -1, (2, 1, 0)),
        (2, 0, 4, (4, 2, 0)),  # both given and disagreeing: left for the check
    ],
)
def test_normalize_reads_llamacpp_tp_as_gpus_per_node(tp, pp, gpus_per_node, want):
    p = cpu(gpu_class=H100, tp=tp, pp=pp, gpus_per_node=gpus_per_node)
    p = normalize(model(p)).profiles[0]
    assert (p.gpus_per_node, p.tp, p.pp) == want


def test_normalize_leaves_multi_node_llamacpp_tp():
    p = normalize(model(cpu(gpu_class=H100, tp=4, nodes=2))).profiles[0]
    assert (p.gpus_per_node, p.tp) == (2, 4)


@pytest.mark.parametrize(
    ("scaling", "want"),
    [
        (Scaling(min=2), (2, 2)),
        (Scaling(min=-3), (0, 0)),
        (Scaling(min=-3, max=2), (0, 2)),
        (Scaling(min=0, max=0), (0, 0)),
        (Scaling(min=1, max=3), (1, 3)),
    ],
)
def test_normalize_scaling(scaling, want):
    s = normalize(model(scaling=scaling)).scaling
    assert (s.min, s.max) == want


def test_normalize_reads_a_repository_page_as_its_id():
    page = "https://huggingface.co/Qwen/Qwen3-8B/tree/main"
    assert normalize(model(source=page)).source == "Qwen/Qwen3-8B"
    assert normalize(model(gpu(), cpu(), source=page)).source == page
    assert normalize(external(source=page)).source == page


def test_normalize_returns_a_copy_and_leaves_its_input():
    m = model(Profile(name="gpu", gpu_class=H100), scaling=Scaling(min=2))
    before = copy.deepcopy(m)
    out = normalize(m)
    assert m == before
    assert out is not m
    assert out.profiles[0] is not m.profiles[0]


@pytest.mark.parametrize(
    "m",
    [
        model(Profile(name="gpu", gpu_class=H100), cpu(gpus_per_node=2, tp=2)),
        model(cpu(gpu_class=H100, tp=2, pp=2), gpu(tp=8, nodes=2)),
        model(gpu(), source="https://huggingface.co/Qwen/Qwen3-8B/tree/main"),
        model(gpu(), cpu(), source="https://huggingface.co/Qwen/Qwen3-8B/tree/main"),
    ],
)
def test_normalized_profiles_are_what_normalize_gives_and_leave_the_input(m):
    before = copy.deepcopy(m)
    source, profiles = normalized_profiles(m)
    whole = normalize(m)
    assert (source, profiles) == (whole.source, whole.profiles)
    assert m == before
    assert all(p is not q for p, q in zip(profiles, m.profiles, strict=True))


# check_model: one test per rule


def test_a_valid_model_has_no_problems():
    assert check_model(model()) == []
    assert check_model(model(cpu())) == []
    assert check_model(external()) == []
    assert check_model(guard()) == []
    assert check_model(model(gpu(tp=4, nodes=2, gpus_per_node=2))) == []
    assert check_model(model(gpu(tp=2, pp=2, gpus_per_node=4))) == []
    assert check_model(model(cpu(gpu_class=H100, tp=2))) == []
    assert check_model(model(gpu(gpu_class=MIG))) == []


RULES = [
    pytest.param(model(name=""), ("name",), "required", ["no name"], id="name"),
    pytest.param(model(source=""), ("source",), "required", ["source"], id="source"),
    pytest.param(
        model(cpu(), source="https://huggingface.co/org/repo"),
        ("source",),
        "repository_page",
        ["repository page", ".gguf", "mirror", "org/repo"],
        id="repository_page_llamacpp",
    ),
    pytest.param(
        external(source="https://huggingface.co/org/repo"),
        ("source",),
        "repository_page",
        ["repository page", "org/repo"],
        id="repository_page_no_profiles",
    ),
    pytest.param(
        model(max_loaded_adapters=-1),
        ("max_loaded_adapters",),
        "negative_max_loaded_adapters",
        ["negative"],
        id="negative_max_loaded_adapters",
    ),
    pytest.param(
        model(gpu(), cpu(), max_loaded_adapters=2),
        ("max_loaded_adapters",),
        "max_loaded_adapters_engine",
        ['profile "cpu"', "llamacpp", "vllm"],
        id="max_loaded_adapters_engine",
    ),
    pytest.param(
        external(adapters=[Adapter("a", "s")]),
        ("adapters",),
        "external_adapters",
        ["external", "adapters"],
        id="external_adapters",
    ),
    pytest.param(
        model(gpu(engine="sglang"), adapters=[Adapter("a", "s")]),
        ("profiles", 0, "engine"),
        "adapter_engine",
        ['profile "gpu"', "llamacpp and vllm", "sglang"],
        id="adapter_engine",
    ),
    pytest.param(
        model(gpu(env={RUNTIME_LORA_ENV: "1"}), adapters=[Adapter("a", "s")]),
        ("profiles", 0, "env", RUNTIME_LORA_ENV),
        "unsafe_env",
        ['profile "gpu"', "max_loaded_adapters", RUNTIME_LORA_ENV],
        id="runtime_lora_env",
    ),
    pytest.param(
        model(adapters=[Adapter("", "s")]),
        ("adapters", 0, "name"),
        "required",
        ["adapters[0]", "name and a source"],
        id="adapter_name",
    ),
    pytest.param(
        model(adapters=[Adapter("a", "")]),
        ("adapters", 0, "source"),
        "required",
        ['adapter "a"', "no source"],
        id="adapter_source",
    ),
    pytest.param(
        model(adapters=[Adapter("chat", "s")]),
        ("adapters", 0, "name"),
        "adapter_is_model_name",
        ['adapter "chat"', "own name"],
        id="adapter_is_model_name",
    ),
    pytest.param(
        model(adapters=[Adapter("a", "s"), Adapter("a", "t")]),
        ("adapters", 1, "name"),
        "duplicate_adapter",
        ['adapter "a"', "twice"],
        id="duplicate_adapter",
    ),
    pytest.param(
        model(adapters=[Adapter("a", "s", -0.5)]),
        ("adapters", 0, "scale"),
        "negative_scale",
        ['adapter "a"', "negative scale"],
        id="negative_scale",
    ),
    *[
        pytest.param(
            model(max_loaded_adapters=1, adapters=[Adapter(name, "s")]),
            ("adapters", 0, "name"),
            "adapter_name_path",
            ["slash", "on demand"],
            id=f"adapter_name_path_{i}",
        )
        for i, name in enumerate(["a/b", "a\\b", ".", ".."])
    ],
    pytest.param(
        external(profiles=[gpu()]),
        ("profiles",),
        "external_profiles",
        ["external", "no profiles"],
        id="external_profiles",
    ),
    pytest.param(
        external(external=External(url="https://api.x.com", model=" ")),
        ("external", "model"),
        "required",
        ["name the provider knows it by"],
        id="external_model",
    ),
    pytest.param(
        model(profiles=[]),
        ("profiles",),
        "no_profiles",
        ["at least one profile"],
        id="no_profiles",
    ),
    pytest.param(
        model(owner="user:1"),
        ("owner",),
        "bad_owner",
        ['"user:1"', "org:ID, team:ID or project:ID"],
        id="bad_owner",
    ),
    pytest.param(
        model(class_="gold"),
        ("class",),
        "bad_class",
        ['"gold"', "critical, standard, opportunistic"],
        id="bad_class",
    ),
    pytest.param(
        model(eval=EvalGate(suite=" ")),
        ("eval", "suite"),
        "required",
        ["no suite"],
        id="eval_suite",
    ),
    *[
        pytest.param(
            model(eval=EvalGate(suite="s", min_score=score)),
            ("eval", "min_score"),
            "min_score_range",
            ["min_score", "0 to 1"],
            id=f"min_score_range_{score}",
        )
        for score in (1.5, -0.1, math.nan)
    ],
    pytest.param(
        model(canary=Canary(model="")),
        ("canary", "model"),
        "required",
        ["canary names no model"],
        id="canary_model",
    ),
    *[
        pytest.param(
            model(canary=Canary(model="next", percent=percent)),
            ("canary", "percent"),
            "canary_percent",
            [f"percent {percent}", "0 to 100"],
            id=f"canary_percent_{percent}",
        )
        for percent in (101, -1)
    ],
    pytest.param(
        model(gpu(weight=math.nan)),
        ("profiles", 0, "weight"),
        "not_finite",
        ['profile "gpu"', "weight", "finite"],
        id="not_finite_weight",
    ),
    pytest.param(
        model(gpu(power_watts=math.inf)),
        ("profiles", 0, "power_watts"),
        "not_finite",
        ["power_watts", "finite"],
        id="not_finite_power",
    ),
    pytest.param(
        model(adapters=[Adapter("a", "s", math.nan)]),
        ("adapters", 0, "scale"),
        "not_finite",
        ['adapter "a"', "finite"],
        id="not_finite_scale",
    ),
    pytest.param(
        model(canary=Canary(model="next", max_ttft_ratio=math.inf)),
        ("canary", "max_ttft_ratio"),
        "not_finite",
        ["max_ttft_ratio", "finite"],
        id="not_finite_canary",
    ),
    pytest.param(
        model(guard=GuardModel("json")),
        ("guard",),
        "guard_without_role",
        ["role: guard"],
        id="guard_without_role",
    ),
    pytest.param(
        model(role="judge"),
        ("role",),
        "bad_role",
        ['"judge"', "not guard"],
        id="bad_role",
    ),
    pytest.param(
        guard(guard=None),
        ("guard", "format"),
        "required",
        ["guard.format", *GUARD_FORMATS],
        id="guard_format_missing",
    ),
    pytest.param(
        guard(guard=GuardModel("")),
        ("guard", "format"),
        "required",
        ["guard.format"],
        id="guard_format_empty",
    ),
    pytest.param(
        guard(guard=GuardModel("openai")),
        ("guard", "format"),
        "unknown_guard_format",
        ['"openai"', *GUARD_FORMATS],
        id="unknown_guard_format",
    ),
    pytest.param(
        guard(scaling=Scaling(min=0, max=1)),
        ("scaling", "min"),
        "guard_on_demand",
        ["always run", "scaling.min"],
        id="guard_on_demand",
    ),
    pytest.param(
        external(role=ROLE_GUARD, guard=GuardModel("json"), scaling=Scaling(min=1)),
        ("external",),
        "guard_external",
        ["guard", "external"],
        id="guard_external",
    ),
    *[
        pytest.param(
            model(scaling=Scaling(min=1, schedule=[ScaleWindow(**window)])),
            ("scaling", "schedule", 0, key),
            "bad_clock",
            ["scaling.schedule[0]", f'{key} "{bad}"', "HH:MM"],
            id=f"bad_clock_{key}_{bad}",
        )
        for key, bad, window in [
            ("from", "8:00", {"from_": "8:00", "to": "17:00"}),
            ("to", "24:00", {"from_": "08:00", "to": "24:00"}),
            ("from", "08:60", {"from_": "08:60", "to": "17:00"}),
        ]
    ],
    pytest.param(
        model(scaling=Scaling(min=1, schedule=[ScaleWindow(from_="08:00", to="08:00")])),
        ("scaling", "schedule", 0, "to"),
        "empty_window",
        ["scaling.schedule[0]", "same time"],
        id="empty_window",
    ),
    pytest.param(
        model(
            scaling=Scaling(
                min=1,
                schedule=[ScaleWindow(days=["mon", "monday"], from_="08:00", to="09:00")],
            )
        ),
        ("scaling", "schedule", 0, "days", 1),
        "bad_day",
        ['"monday"', "mon … sun, weekdays or weekends"],
        id="bad_day",
    ),
    *[
        pytest.param(
            model(
                scaling=Scaling(
                    min=1,
                    schedule=[
                        ScaleWindow(from_="00:00", to="01:00"),
                        ScaleWindow(from_="08:00", to="09:00", min=lo, max=hi),
                    ],
                )
            ),
            ("scaling", "schedule", 1, key),
            "bad_window_range",
            ["scaling.schedule[1]", f"min {lo} and max {hi}"],
            id=f"bad_window_range_{lo}_{hi}",
        )
        for lo, hi, key in [(-1, 0, "min"), (0, -1, "max"), (3, 2, "max")]
    ],
    *[
        pytest.param(
            model(scaling=Scaling(min=1, prewarm=prewarm)),
            ("scaling", "prewarm"),
            "prewarm_range",
            ["prewarm", "0 and 12h"],
            id=f"prewarm_range_{prewarm}",
        )
        for prewarm in (-SECOND, 12 * HOUR + 1)
    ],
    pytest.param(
        model(scaling=Scaling(min=3, max=2)),
        ("scaling", "max"),
        "max_below_min",
        ["max 2 is below min 3"],
        id="max_below_min",
    ),
    pytest.param(
        model(scaling=Scaling(min=0, max=-1)),
        ("scaling", "max"),
        "max_below_min",
        ["max -1 is below min 0"],
        id="max_below_min_negative",
    ),
    pytest.param(
        model(gpu(name="")),
        ("profiles", 0, "name"),
        "required",
        ["profiles[0]", "no name"],
        id="profile_name",
    ),
    pytest.param(
        model(gpu(), gpu(gpu_class="nvidia-l4-24gb")),
        ("profiles", 1, "name"),
        "duplicate_profile",
        ['profile "gpu"', "twice"],
        id="duplicate_profile",
    ),
    pytest.param(
        model(gpu(env={"VLLM_LOGGING_LEVEL": "INFO", "PATH": "/x"})),
        ("profiles", 0, "env", "PATH"),
        "unsafe_env",
        ['profile "gpu"', "PATH", "programs and libraries"],
        id="unsafe_env",
    ),
    pytest.param(
        model(gpu(engine="tgi", gpu_class="", args=["--port", "1"], kv_events=True)),
        ("profiles", 0, "engine"),
        "unknown_engine",
        ['profile "gpu"', '"tgi"', *ENGINES],
        id="unknown_engine",
    ),
    pytest.param(
        model(gpu(args=["--max-model-len", "8192", "--port", "8000"])),
        ("profiles", 0, "args"),
        "unsafe_arg",
        ['profile "gpu"', '"--port"', "agent"],
        id="unsafe_arg",
    ),
    pytest.param(
        model(gpu(args=["--tensor-parallel-size=2"])),
        ("profiles", 0, "args"),
        "unsafe_arg",
        ['"--tensor-parallel-size"', "tp"],
        id="unsafe_arg_equals",
    ),
    pytest.param(
        model(gpu(engine="sglang", kv_events=True)),
        ("profiles", 0, "kv_events"),
        "kv_events_engine",
        ['profile "gpu"', "vLLM", "sglang"],
        id="kv_events_engine",
    ),
    pytest.param(
        model(gpu(power_watts=-5)),
        ("profiles", 0, "power_watts"),
        "negative_power",
        ['profile "gpu"', "power_watts -5", "negative"],
        id="negative_power",
    ),
    pytest.param(
        model(gpu(keep_within="floor")),
        ("profiles", 0, "keep_within"),
        "bad_level",
        ['profile "gpu"', "keep_within", '"floor"', "rack, row, room, site"],
        id="bad_level",
    ),
    pytest.param(
        model(gpu(gpu_class="")),
        ("profiles", 0, "gpu_class"),
        "gpu_class_required",
        ['profile "gpu"', "gpu_class is required", "vllm"],
        id="gpu_class_required",
    ),
    pytest.param(
        model(gpu(engine="sim", gpu_class="")),
        ("profiles", 0, "gpu_class"),
        "gpu_class_required",
        ["sim"],
        id="gpu_class_required_sim",
    ),
    pytest.param(
        model(cpu(nodes=2)),
        ("profiles", 0, "nodes"),
        "cpu_multi_node",
        ['profile "cpu"', "CPU profile", "2 nodes"],
        id="cpu_multi_node",
    ),
    *[
        pytest.param(
            model(gpu(gpu_class=MIG, **wide)),
            ("profiles", 0, "gpu_class"),
            "mig_multi",
            ['profile "gpu"', MIG, "MIG instance", "tp 1"],
            id=f"mig_multi_{next(iter(wide))}",
        )
        for wide in ({"tp": 2}, {"nodes": 2}, {"gpus_per_node": 2}, {"pp": 2})
    ],
    pytest.param(
        model(cpu(gpu_class=H100, nodes=2)),
        ("profiles", 0, "nodes"),
        "llamacpp_multi_node",
        ['profile "cpu"', "does not span nodes", "2-node"],
        id="llamacpp_multi_node",
    ),
    pytest.param(
        model(cpu(gpu_class=H100, tp=2, gpus_per_node=4)),
        ("profiles", 0, "tp"),
        "llamacpp_tp",
        ['profile "cpu"', "tp 2", "gpus_per_node 4", "gpus_per_node alone"],
        id="llamacpp_tp",
    ),
    pytest.param(
        model(cpu(gpu_class=H100, pp=2, gpus_per_node=4)),
        ("profiles", 0, "pp"),
        "llamacpp_tp",
        ["tp 2", "gpus_per_node 4"],
        id="llamacpp_pp",
    ),
    pytest.param(
        model(gpu(engine="trtllm"), source="/models/Qwen.GGUF/"),
        ("source",),
        "trtllm_gguf",
        ['profile "gpu"', "trtllm", ".gguf", "llamacpp"],
        id="trtllm_gguf",
    ),
    pytest.param(
        model(gpu(engine="trtllm", tp=2, nodes=2)),
        ("profiles", 0, "nodes"),
        "trtllm_multi_node",
        ['profile "gpu"', "one node", "2-node"],
        id="trtllm_multi_node",
    ),
    pytest.param(
        model(gpu(tp=4, nodes=2, gpus_per_node=4)),
        ("profiles", 0, "tp"),
        "tp_mismatch",
        ['profile "gpu": 2 nodes x 4 GPUs does not match tp 4 x pp 1'],
        id="tp_mismatch",
    ),
    pytest.param(
        model(gpu(tp=2, pp=2, gpus_per_node=2)),
        ("profiles", 0, "tp"),
        "tp_mismatch",
        ["1 nodes x 2 GPUs does not match tp 2 x pp 2"],
        id="tp_mismatch_pp",
    ),
]


@pytest.mark.parametrize(("m", "path", "code", "words"), RULES)
def test_check_model_rule(m, path, code, words):
    assert_problem(only(check_model(m)), path, code, *words)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://api.x.com",
        "api.openai.com",
        "https://",
        "https://user@",
        "http://exa mple.com",
        "https://host:port",
        "https://host\n",
        "",
    ],
)
def test_check_model_bad_url(url):
    m = external(external=External(url=url, model="m"))
    assert_problem(only(check_model(m)), ("external", "url"), "bad_url", "http(s)", "https://")


@pytest.mark.parametrize(
    "url", ["https://api.openai.com", "https://127.0.0.1:8000/", "HTTPS://user@host"]
)
def test_check_model_good_url(url):
    assert check_model(external(external=External(url=url, model="m"))) == []


def test_check_model_reports_every_problem():
    m = model(
        gpu(tp=4, nodes=2, gpus_per_node=4, env={"PATH": "x", "LD_X": "y"}),
        name="",
        owner="bad",
        scaling=Scaling(min=3, max=2),
    )
    codes = [(p.code, p.path) for p in check_model(m)]
    assert codes == [
        ("required", ("name",)),
        ("bad_owner", ("owner",)),
        ("max_below_min", ("scaling", "max")),
        ("unsafe_env", ("profiles", 0, "env", "LD_X")),
        ("unsafe_env", ("profiles", 0, "env", "PATH")),
        ("tp_mismatch", ("profiles", 0, "tp")),
    ]


def test_check_model_reports_each_unsafe_arg():
    m = model(gpu(args=["--port", "1", "--host=x"]))
    assert [p.message.split(": ", 1)[1][:16] for p in check_model(m)] == [
        'argument "--port',
        'argument "--host',
    ]


def test_check_model_normalizes_first():
    # Written with tp, llama.cpp's width is read as gpus_per_node and passes.
    assert check_model(model(cpu(gpu_class=H100, tp=4))) == []
    # A repository page is read as the id for vLLM, so it is not refused.
    assert check_model(model(source="https://huggingface.co/org/repo")) == []


def test_check_model_leaves_its_input():
    m = model(gpu(tp=0), scaling=Scaling(min=-1))
    before = copy.deepcopy(m)
    check_model(m)
    assert m == before


def test_guard_model_not_running_is_allowed():
    # As in the reference: min 0 max 0 is switched off, not on demand.
    assert check_model(guard(scaling=Scaling(min=0, max=0))) == []


# check_catalog


def codes(problems: list[Problem]) -> list[tuple]:
    """Return (index, model, path, code) of each problem."""
    return [(p.index, p.model, p.path, p.code) for p in problems]


def test_check_catalog_valid():
    models = [
        model(aliases=["c"], fallbacks=["cloud"], canary=Canary("chat-next", 10)),
        model(name="chat-next", adapters=[Adapter("sql", "s")]),
        external(),
        guard(),
    ]
    assert check_catalog(models) == []


def test_check_catalog_sets_model_and_index_of_model_problems():
    problems = check_catalog([model(), model(name="b", owner="x")])
    assert codes(problems) == [(1, "b", ("owner",), "bad_owner")]
    assert problems[0].file_path == "models[1].owner"


def test_check_catalog_duplicate_name():
    problems = check_catalog([model(), external(), model(aliases=["x"])])
    p = only(problems)
    assert (p.index, p.model) == (2, "chat")
    assert_problem(p, ("name",), "duplicate_name", '"chat"', "twice", "models[0]")


@pytest.mark.parametrize(
    ("models", "index", "j", "words"),
    [
        ([model(aliases=["x", "cloud"]), external()], 0, 1, ['"cloud"', "another model"]),
        ([external(), model(aliases=["chat"])], 1, 0, ['"chat"', "own name"]),
    ],
)
def test_check_catalog_alias_collision(models, index, j, words):
    p = only(check_catalog(models))
    assert p.index == index
    assert_problem(p, ("aliases", j), "alias_collision", *words, "namespace")


def test_check_catalog_alias_claimed_by_two_models():
    p = only(check_catalog([model(aliases=["x"]), external(aliases=["y", "x"])]))
    assert (p.index, p.model) == (1, "cloud")
    assert_problem(p, ("aliases", 1), "alias_claimed", '"x"', '"chat"')


def test_check_catalog_alias_listed_twice():
    p = only(check_catalog([model(aliases=["x", "x"])]))
    assert_problem(p, ("aliases", 1), "alias_claimed", '"x"', "this model")


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("cloud", ['the model "cloud"']),
        ("gpt", ['an alias of "cloud"']),
        ("sql", ['an adapter of "chat"']),
    ],
)
def test_check_catalog_adapter_collision(name, words):
    models = [
        model(adapters=[Adapter("sql", "s")]),
        external(aliases=["gpt"]),
        model(name="other", adapters=[Adapter("ok", "s"), Adapter(name, "s")]),
    ]
    p = only(check_catalog(models))
    assert (p.index, p.model) == (2, "other")
    assert_problem(p, ("adapters", 1, "name"), "adapter_collision", *words)


def test_check_catalog_does_not_repeat_model_adapter_problems():
    models = [model(adapters=[Adapter("a", "s"), Adapter("a", "s"), Adapter("chat", "s")])]
    assert [p.code for p in check_catalog(models)] == [
        "duplicate_adapter",
        "adapter_is_model_name",
    ]


def test_check_catalog_unknown_fallback():
    p = only(check_catalog([model(fallbacks=["c", "nope"], aliases=["c"])]))
    assert_problem(p, ("fallbacks", 1), "unknown_fallback", '"nope"', "not in the catalog")


@pytest.mark.parametrize(
    ("models", "index", "code", "words"),
    [
        ([model(canary=Canary("nope"))], 0, "unknown_canary", ['"nope"', "not in"]),
        ([model(aliases=["me"], canary=Canary("me"))], 0, "canary_self", ["own canary"]),
        ([model(canary=Canary("judge")), guard()], 0, "canary_guard", ['"judge"', "guard"]),
        (
            [model(canary=Canary("b")), model(name="b", canary=Canary("c")), model(name="c")],
            0,
            "canary_chained",
            ['"b"', "canary of its own"],
        ),
        (
            [
                model(canary=Canary("c")),
                model(name="b", canary=Canary("cc")),
                model(name="c", aliases=["cc"]),
            ],
            1,
            "canary_taken",
            ['"cc"', 'already the canary of "chat"'],
        ),
    ],
)
def test_check_catalog_canary(models, index, code, words):
    p = only(check_catalog(models))
    assert p.index == index
    assert_problem(p, ("canary", "model"), code, *words)


def test_check_catalog_canary_percent_reported_once():
    models = [model(canary=Canary("b", 150)), model(name="b")]
    assert codes(check_catalog(models)) == [(0, "chat", ("canary", "percent"), "canary_percent")]


def test_check_catalog_leaves_its_input():
    models = [model(gpu(tp=0)), model(name="b", scaling=Scaling(min=-1))]
    before = copy.deepcopy(models)
    check_catalog(models)
    assert models == before


# Catalog and build_catalog


def sample_catalog() -> Catalog:
    catalog, problems = build_catalog(
        [
            model(name="chat-small", aliases=["small"], fallbacks=["big", "cloud"]),
            model(
                name="chat-large",
                aliases=["big", "large"],
                fallbacks=["cloud"],
                canary=Canary("next"),
                adapters=[Adapter("sql", "s"), Adapter("law", "t")],
            ),
            model(name="chat-next", aliases=["next"], fallbacks=["chat-next"]),
            external(),
        ]
    )
    assert problems == []
    assert catalog is not None
    return catalog


def test_build_catalog_refuses_with_problems():
    catalog, problems = build_catalog([model(), model()])
    assert catalog is None
    assert [p.code for p in problems] == ["duplicate_name"]


def test_build_catalog_holds_normalized_models():
    catalog, _ = build_catalog([model(Profile(name="gpu", gpu_class=H100))])
    assert catalog is not None
    assert catalog.models()[0].profiles[0].startup_timeout == 20 * MINUTE


def test_catalog_models_in_order_and_names_sorted():
    catalog = sample_catalog()
    assert [m.name for m in catalog.models()] == [
        "chat-small",
        "chat-large",
        "chat-next",
        "cloud",
    ]
    assert catalog.names() == ["chat-large", "chat-next", "chat-small", "cloud"]


def test_catalog_resolve_by_name_or_alias():
    catalog = sample_catalog()
    resolved = catalog.resolve("big")
    assert resolved is not None
    assert resolved.name == "chat-large"
    assert catalog.resolve("chat-large") is resolved
    assert catalog.resolve("sql") is None
    assert catalog.resolve("nope") is None


def test_catalog_resolve_adapter():
    catalog = sample_catalog()
    found = catalog.resolve_adapter("law")
    assert found is not None
    m, a, i = found
    assert (m.name, a.name, a.source, i) == ("chat-large", "law", "t", 1)
    assert catalog.resolve_adapter("chat-large") is None


def test_catalog_aliases_of():
    catalog = sample_catalog()
    assert catalog.aliases_of("chat-large") == ["big", "large"]
    assert catalog.aliases_of("large") == ["big", "large"]
    assert catalog.aliases_of("cloud") == []
    assert catalog.aliases_of("nope") == []


def test_catalog_canary_of():
    catalog = sample_catalog()
    assert catalog.canary_of("chat-next") == "chat-large"
    assert catalog.canary_of("chat-large") == ""


def test_catalog_dependents():
    catalog = sample_catalog()
    assert catalog.dependents("chat-large") == [("chat-small", "fallbacks")]
    assert catalog.dependents("large") == [("chat-small", "fallbacks")]
    assert catalog.dependents("cloud") == [
        ("chat-small", "fallbacks"),
        ("chat-large", "fallbacks"),
    ]
    # chat-next's fallback to itself goes with it.
    assert catalog.dependents("chat-next") == [("chat-large", "canary")]
    assert catalog.dependents("chat-small") == []
    assert catalog.dependents("nope") == []


# window_at

MONDAY = date(2025, 1, 6)


def at(day: int, hh: int, mm: int = 0, tz=UTC) -> datetime:
    """Return a time in the week of Monday 6 January 2025 (day 0 is Monday)."""
    d = MONDAY + timedelta(days=day)
    return datetime(d.year, d.month, d.day, hh, mm, tzinfo=tz)


def scaling(*windows: ScaleWindow, prewarm: int = 0) -> Scaling:
    return Scaling(min=1, schedule=list(windows), prewarm=prewarm)


def test_window_at_inside_and_outside():
    w = ScaleWindow(from_="08:00", to="17:00", min=3)
    s = scaling(w)
    assert window_at(s, at(0, 8)) is w
    assert window_at(s, at(0, 16, 59)) is w
    assert window_at(s, at(0, 7, 59)) is None
    assert window_at(s, at(0, 17)) is None


def test_window_at_past_midnight():
    w = ScaleWindow(days=["fri"], from_="22:00", to="06:00")
    s = scaling(w)
    assert window_at(s, at(4, 22)) is w
    assert window_at(s, at(5, 5, 59)) is w  # opened yesterday, a Friday
    assert window_at(s, at(5, 6)) is None
    assert window_at(s, at(5, 22)) is None  # Saturday opens none
    assert window_at(s, at(4, 5)) is None  # Thursday's night is not Friday's


def test_window_at_prewarm_opens_early():
    w = ScaleWindow(from_="08:00", to="17:00")
    s = scaling(w, prewarm=30 * MINUTE)
    assert window_at(s, at(0, 7, 30)) is w
    assert window_at(s, at(0, 7, 29)) is None
    assert window_at(s, at(0, 17)) is None


def test_window_at_prewarm_opens_tomorrows_today():
    w = ScaleWindow(days=["tue"], from_="00:30", to="02:00")
    s = scaling(w, prewarm=HOUR)
    assert window_at(s, at(0, 23, 30)) is w  # Monday, for Tuesday's window
    assert window_at(s, at(0, 23, 29)) is None
    assert window_at(s, at(1, 23, 30)) is None  # Wednesday's does not open


def test_window_at_first_that_holds_wins():
    a = ScaleWindow(from_="08:00", to="12:00", min=2)
    b = ScaleWindow(from_="10:00", to="18:00", min=5)
    s = scaling(a, b)
    assert window_at(s, at(0, 11)) is a
    assert window_at(s, at(0, 13)) is b


@pytest.mark.parametrize(
    ("days", "open_on"),
    [
        ([], {0, 1, 2, 3, 4, 5, 6}),
        (["MON", "Wed"], {0, 2}),
        (["weekdays"], {0, 1, 2, 3, 4}),
        (["WEEKENDS"], {5, 6}),
        (["sun", "weekends"], {5, 6}),
    ],
)
def test_window_at_days(days, open_on):
    w = ScaleWindow(days=days, from_="09:00", to="10:00")
    s = scaling(w)
    assert {d for d in range(7) if window_at(s, at(d, 9, 30))} == open_on


def test_window_at_needs_an_aware_time():
    with pytest.raises(ValueError, match="aware"):
        window_at(scaling(), datetime(2025, 1, 6, 9))


def test_window_at_reads_days_in_the_given_zone():
    tokyo = timezone(timedelta(hours=9))
    w = ScaleWindow(days=["mon"], from_="08:00", to="09:00")
    # Monday 08:30 in Tokyo is Sunday 23:30 UTC.
    assert window_at(scaling(w), at(0, 8, 30, tokyo)) is w
    assert window_at(scaling(w), at(0, 8, 30, tokyo).astimezone(UTC)) is None


BERLIN = ZoneInfo("Europe/Berlin")


def test_window_at_dst_spring_opens_by_the_wall_clock():
    # 30 March 2025: Berlin's clocks go from 02:00 to 03:00. A window from 08:00 to
    # 17:00 still opens at 08:00 and closes at 17:00 local time.
    w = ScaleWindow(from_="08:00", to="17:00")
    s = scaling(w)
    day = datetime(2025, 3, 30, tzinfo=BERLIN)
    assert window_at(s, day.replace(hour=7, minute=59)) is None
    assert window_at(s, day.replace(hour=8)) is w
    assert window_at(s, day.replace(hour=16, minute=59)) is w
    assert window_at(s, day.replace(hour=17)) is None
    assert window_at(s, datetime(2025, 3, 31, 8, tzinfo=BERLIN)) is w


def test_window_at_dst_autumn_opens_by_the_wall_clock():
    # 26 October 2025: 03:00 goes back to 02:00; 08:00 is still 08:00.
    w = ScaleWindow(from_="08:00", to="17:00")
    s = scaling(w)
    day = datetime(2025, 10, 26, tzinfo=BERLIN)
    assert window_at(s, day.replace(hour=7, minute=59)) is None
    assert window_at(s, day.replace(hour=8)) is w
    assert window_at(s, day.replace(hour=16, minute=59)) is w
    assert window_at(s, day.replace(hour=17)) is None


def test_window_at_dst_prewarm_is_elapsed_time_across_the_change():
    # Prewarm of 8h before a 09:00 opening on the spring day: 8 real hours earlier is
    # 00:00 local (the clock skipped an hour in between).
    w = ScaleWindow(from_="09:00", to="17:00")
    s = Scaling(schedule=[w], prewarm=8 * 3600 * 10**9)
    day = datetime(2025, 3, 30, tzinfo=BERLIN)
    assert window_at(s, day.replace(hour=0, minute=0)) is w
    assert window_at(s, datetime(2025, 3, 29, 23, 59, tzinfo=BERLIN)) is None


def test_window_at_repeated_hour_holds_through_both_passes():
    # From 02:30 (first pass) to 03:00 (after the repeat) by the wall clock: both
    # passes of 02:40 are inside, and 03:00 is not.
    w = ScaleWindow(from_="02:30", to="03:00")
    s = scaling(w)
    first = datetime(2025, 10, 26, 2, 40, tzinfo=BERLIN, fold=0)
    second = datetime(2025, 10, 26, 2, 40, tzinfo=BERLIN, fold=1)
    assert window_at(s, first) is w
    assert window_at(s, second) is w
    assert window_at(s, datetime(2025, 10, 26, 3, 0, tzinfo=BERLIN)) is None


DAY_SETS = {
    "mon": {0},
    "tue": {1},
    "wed": {2},
    "thu": {3},
    "fri": {4},
    "sat": {5},
    "sun": {6},
    "weekdays": {0, 1, 2, 3, 4},
    "weekends": {5, 6},
}
day_names = st.sampled_from([*DAY_SETS, "MON", "Fri", "WeekEnds", "WEEKDAYS"])
clocks = st.integers(0, 24 * 60 - 1).map(lambda m: f"{m // 60:02d}:{m % 60:02d}")


@st.composite
def windows(draw):
    start, end = draw(clocks), draw(clocks)
    assume(start != end)
    return ScaleWindow(
        days=draw(st.lists(day_names, max_size=3)),
        from_=start,
        to=end,
        min=draw(st.integers(0, 3)),
    )


def brute_force_window(s: Scaling, week: datetime) -> list[ScaleWindow | None]:
    """Return the window in force at each minute of a week, from every opening."""
    openings = []
    for i, w in enumerate(s.schedule):
        start, end = clock(w.from_), clock(w.to)
        assert start is not None and end is not None
        span = (end - start) % (24 * 60) or 24 * 60
        on = set().union(*(DAY_SETS[d.lower()] for d in w.days)) if w.days else set(range(7))
        for k in range(-3, 10):
            day = week + timedelta(days=k)
            if day.weekday() in on:
                opens = day + timedelta(minutes=start) - timedelta(microseconds=s.prewarm // 1000)
                closes = day + timedelta(minutes=start + span)
                openings.append((i, opens, closes))
    out = []
    for minute in range(7 * 24 * 60):
        t = week + timedelta(minutes=minute)
        holding = [i for i, opens, closes in openings if opens <= t < closes]
        out.append(s.schedule[min(holding)] if holding else None)
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedule=st.lists(windows(), min_size=1, max_size=3),
    prewarm=st.integers(0, 12 * 60),
    offset=st.integers(-48, 56).map(lambda q: timedelta(minutes=15 * q)),
    start=st.dates(date(2000, 1, 1), date(2099, 12, 1)),
)
def test_window_at_agrees_with_brute_force(schedule, prewarm, offset, start):
    s = Scaling(min=1, schedule=schedule, prewarm=prewarm * MINUTE)
    week = datetime(start.year, start.month, start.day, tzinfo=timezone(offset))
    want = brute_force_window(s, week)
    for minute, expected in enumerate(want):
        got = window_at(s, week + timedelta(minutes=minute))
        assert got is expected, (minute, got, expected)


# Properties over arbitrary models

names = st.one_of(st.sampled_from(["chat", "big", "cloud", "a", ""]), st.text(max_size=6))
small_ints = st.one_of(st.integers(-3, 9), st.integers(-(2**63), 2**63 - 1))
any_floats = st.floats()
durations = st.one_of(st.integers(-2 * HOUR, 14 * HOUR), st.sampled_from([0, 20 * MINUTE]))
profiles = st.builds(
    Profile,
    name=names,
    engine=st.sampled_from([*ENGINES, "", "tgi"]),
    engine_version=st.text(max_size=4),
    gpu_class=st.sampled_from(["", H100, MIG, "NVIDIA-A100-MIG-x"]),
    tp=small_ints,
    pp=small_ints,
    gpus_per_node=small_ints,
    nodes=small_ints,
    args=st.lists(
        st.one_of(st.sampled_from(["--port", "8000", "-tp=2", "-t", "--x"]), st.text(max_size=5)),
        max_size=3,
    ),
    env=st.dictionaries(
        st.one_of(st.sampled_from(["PATH", "LD_X", "1A", RUNTIME_LORA_ENV]), st.text(max_size=5)),
        st.text(max_size=3),
        max_size=2,
    ),
    min_memory_gb=small_ints,
    cpu_cores=small_ints,
    min_disk_gb=small_ints,
    node_selector=st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    power_watts=any_floats,
    keep_within=st.sampled_from(["", "rack", " Row ", "floor"]),
    weight=any_floats,
    priority=small_ints,
    startup_timeout=durations,
    kv_events=st.booleans(),
)
scale_windows = st.builds(
    ScaleWindow,
    days=st.lists(st.one_of(day_names, st.text(max_size=4)), max_size=2),
    from_=st.one_of(clocks, st.text(max_size=5)),
    to=st.one_of(clocks, st.text(max_size=5)),
    min=small_ints,
    max=small_ints,
)
models = st.builds(
    Model,
    name=names,
    aliases=st.lists(names, max_size=2),
    description=st.text(max_size=3),
    source=st.one_of(
        st.sampled_from(
            ["", "org/x", "https://huggingface.co/org/x", "/m/x.gguf", "https://hf.co/a"]
        ),
        st.text(max_size=8),
    ),
    profiles=st.lists(profiles, max_size=3),
    scaling=st.builds(
        Scaling,
        min=small_ints,
        max=small_ints,
        idle_timeout=durations,
        schedule=st.lists(scale_windows, max_size=2),
        prewarm=durations,
    ),
    class_=st.sampled_from(["", *CLASSES, "gold"]),
    owner=st.sampled_from(["", "org:a", "team:", "x"]),
    external=st.none()
    | st.builds(
        External,
        url=st.one_of(st.sampled_from(["https://a.b", "ftp://x", ""]), st.text(max_size=8)),
        model=st.text(max_size=3),
        peer=st.text(max_size=2),
    ),
    adapters=st.lists(
        st.builds(Adapter, name=names, source=st.text(max_size=3), scale=any_floats),
        max_size=3,
    ),
    max_loaded_adapters=small_ints,
    fallbacks=st.lists(names, max_size=2),
    canary=st.none()
    | st.builds(
        Canary,
        model=names,
        percent=small_ints,
        min_requests=small_ints,
        max_error_increase=any_floats,
        max_ttft_ratio=any_floats,
    ),
    eval=st.none() | st.builds(EvalGate, suite=st.text(max_size=3), min_score=any_floats),
    role=st.sampled_from(["", ROLE_GUARD, "judge"]),
    guard=st.none() | st.builds(GuardModel, format=st.sampled_from(["", *GUARD_FORMATS, "x"])),
)

SNAKE = re.compile(r"[a-z]+(_[a-z0-9]+)*")
TOP_KEYS = {"class" if f.name == "class_" else f.name for f in dataclasses.fields(Model)}


@settings(max_examples=100, deadline=None)
@given(models)
def test_normalize_is_idempotent_and_leaves_its_input(m):
    before = copy.deepcopy(m)
    once = normalize(m)
    assert normalize(once) == once
    assert m == before


@settings(max_examples=100, deadline=None)
@given(models)
def test_check_model_never_raises(m):
    before = copy.deepcopy(m)
    problems = check_model(m)
    assert m == before
    assert check_model(normalize(m)) == problems
    for p in problems:
        assert SNAKE.fullmatch(p.code), p
        assert p.message
        assert p.path[0] in TOP_KEYS, p
    for prof in m.profiles:
        assert re.fullmatch(r"[0-9a-f]{16}|unmarshalable", fingerprint(prof))


@settings(max_examples=40, deadline=None)
@given(st.lists(models, max_size=4))
def test_check_catalog_never_raises_and_builds_when_clean(ms):
    problems = check_catalog(ms)
    for p in problems:
        assert p.index is not None
        assert 0 <= p.index < len(ms)
        assert p.model == ms[p.index].name
    catalog, again = build_catalog(ms)
    assert again == problems
    assert (catalog is None) == bool(problems)


def test_keep_origin_keeps_the_recorded_origin_of_the_same_source_only() -> None:
    from dataclasses import replace

    from catalog.rules import keep_origin
    from catalog.spec import Model, Origin, PreviousOrigin, Profile

    recorded = Origin(repo="org/chat", revision="abc", previous=PreviousOrigin("org/chat", "old"))
    vllm = [Profile(name="h100", engine="vllm", gpu_class="h100")]
    before = Model(name="chat", source="org/chat", profiles=vllm, origin=recorded)
    new = Model(name="chat", source="org/chat", profiles=vllm, description="edited")
    kept = keep_origin(new, before)
    assert kept.origin == recorded and kept.description == "edited"
    assert new.origin is None and kept.origin is not before.origin  # inputs left alone
    # The repository's page is the same source once normalized (for vLLM).
    page = replace(new, source="https://huggingface.co/org/chat")
    assert keep_origin(page, before).origin == recorded
    # Another source, a model given its own origin, nothing recorded: as given.
    assert keep_origin(replace(new, source="org/other"), before).origin is None
    own = Origin(repo="org/chat", revision="def")
    assert keep_origin(replace(new, origin=own), before).origin == own
    assert keep_origin(new, None).origin is None
    assert keep_origin(new, replace(before, origin=None)).origin is None
