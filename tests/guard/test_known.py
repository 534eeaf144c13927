"""Test the known judges: each passes the catalog's rules on CPUs, a GPU and the simulator,
enabling picks the roomiest GPU class, and use() says what it replaced.
"""

from __future__ import annotations

import pytest

from catalog.rules import check_catalog, effective_class, simulated
from guard.formats import FORMATS, LLAMA_GUARD_CATEGORIES, QWEN3GUARD_CATEGORIES
from guard.known import KNOWN, Replacement, enable_spec, equivalents, roomiest_class, use
from guard.policy import BASELINE, Policy

CLASSES = {"l4": 23034, "h100-80gb": 81559, "a100-40gb": 40960}
NAMES = ["qwen3guard-0.6b", "qwen3guard-4b", "qwen3guard-8b", "llamaguard3-1b", "llamaguard3-8b"]


def test_the_five_known_judges() -> None:
    assert list(KNOWN) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_known_judge_data(name: str) -> None:
    judge = KNOWN[name]
    assert judge.format in FORMATS
    assert judge.gguf.startswith("https://huggingface.co/") and "/resolve/main/" in judge.gguf
    assert judge.gguf.endswith(".gguf")
    assert "/" in judge.hf_repo and not judge.hf_repo.startswith("http")
    assert judge.memory_gb > judge.gguf_gb
    if judge.format == "llamaguard3":
        assert judge.variant in ("1b", "8b")
        assert judge.context_length == 8192
    else:
        assert judge.variant is None
        assert judge.context_length == 32768  # §1.8
        assert judge.categories == QWEN3GUARD_CATEGORIES


def test_llama_guard_1b_reports_no_code_interpreter_abuse() -> None:
    assert "Code Interpreter Abuse" not in KNOWN["llamaguard3-1b"].categories
    assert len(KNOWN["llamaguard3-8b"].categories) == len(LLAMA_GUARD_CATEGORIES)


def test_seed_memory_of_the_baseline_judge() -> None:
    # The seed: Qwen3Guard-Gen 0.6B "in 0.8 GB on CPUs" (its weights).
    assert KNOWN["qwen3guard-0.6b"].gguf_gb == pytest.approx(0.8, abs=0.05)


@pytest.mark.parametrize("name", NAMES)
def test_cpu_spec_passes_the_catalog(name: str) -> None:
    m = enable_spec(name, node_cores=[32, 8, 0])
    assert check_catalog([m]) == []
    assert (m.name, m.role, m.guard.format if m.guard else None) == (
        name,
        "guard",
        KNOWN[name].format,
    )
    assert m.source == KNOWN[name].gguf
    assert m.context_length == KNOWN[name].context_length
    assert (m.scaling.min, m.scaling.max) == (1, 1)
    [p] = m.profiles
    assert (p.engine, p.gpu_class, p.cpu_cores) == ("llamacpp", "", 4)
    assert p.min_memory_gb == KNOWN[name].min_memory_gb
    assert m.class_ == "" and effective_class(m) == "critical"


@pytest.mark.parametrize("name", NAMES)
def test_gpu_spec_passes_the_catalog(name: str) -> None:
    m = enable_spec(name, gpu=True, gpu_classes=CLASSES)
    assert check_catalog([m]) == []
    assert m.source == KNOWN[name].hf_repo
    [p] = m.profiles
    assert (p.engine, p.gpu_class) == ("vllm", "h100-80gb")
    assert m.class_ == "standard"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gpu", [False, True])
def test_sim_spec_passes_the_catalog(name: str, gpu: bool) -> None:
    m = enable_spec(name, gpu=gpu, sim=True, gpu_classes={"sim-24gb": 24576})
    assert check_catalog([m]) == []
    assert simulated(m)
    assert [(p.engine, p.gpu_class) for p in m.profiles] == [("sim", "sim-24gb")]
    assert effective_class(m) == ("standard" if gpu else "critical")


def test_all_known_judges_together_pass_the_catalog() -> None:
    models = [enable_spec(n, node_cores=[8]) for n in NAMES]
    assert check_catalog(models) == []


def test_default_names() -> None:
    assert enable_spec(None).name == "qwen3guard-0.6b"
    m = enable_spec(None, gpu=True, gpu_classes=CLASSES)
    assert (m.name, m.class_, m.profiles[0].gpu_class) == ("qwen3guard-4b", "standard", "h100-80gb")


def test_roomiest_class() -> None:
    assert roomiest_class(CLASSES) == "h100-80gb"
    assert roomiest_class({"b": 100, "a": 100, "c": 50}) == "a"
    with pytest.raises(ValueError, match="no GPU class"):
        roomiest_class({})


def test_gpu_without_classes_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU class"):
        enable_spec("qwen3guard-4b", gpu=True)
    with pytest.raises(ValueError, match="no GPU class"):
        enable_spec("qwen3guard-4b", sim=True)


def test_gpu_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="needs 16.4 GB of GPU memory and the roomiest class, l4"):
        enable_spec("qwen3guard-8b", gpu=True, gpu_classes={"l4": 15360})


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match='no known judge "shieldgemma-2b": one of qwen3guard-0.6b'):
        enable_spec("shieldgemma-2b")


def test_no_node_cores_reserves_nothing() -> None:
    assert enable_spec("qwen3guard-0.6b").profiles[0].cpu_cores == 0


def test_equivalents_go_both_ways() -> None:
    assert equivalents("PII") == ("Privacy",)
    assert equivalents("privacy") == ("PII",)
    assert equivalents("Violent Crimes") == ("Violent",)
    assert equivalents("Jailbreak") == ()
    # Same name in both taxonomies: nothing else answers to it.
    assert equivalents("Suicide & Self-Harm") == ()
    for qwen in QWEN3GUARD_CATEGORIES:
        assert all(c in KNOWN["llamaguard3-8b"].categories for c in equivalents(qwen))


def test_use_sets_the_order_and_keeps_what_a_judge_reports() -> None:
    policy, replaced = use(BASELINE, ["qwen3guard-4b", "llamaguard3-8b"])
    assert policy.judge_models == ("qwen3guard-4b", "llamaguard3-8b")
    # Every baseline category is kept, and each gains the Llama Guard names it maps to,
    # so whichever judge decides, the same harms refuse.
    assert policy.refuse_categories[: len(BASELINE.refuse_categories)] == BASELINE.refuse_categories
    assert {"Violent Crimes", "Privacy"} <= set(policy.refuse_categories)
    assert [r for r in replaced if not r.added] == []
    assert (policy.fail, policy.controversial) == (BASELINE.fail, BASELINE.controversial)


def test_use_replaces_what_no_listed_judge_reports() -> None:
    policy, replaced = use(BASELINE, ["llamaguard3-1b"])
    assert replaced[0] == Replacement("Violent", ("Violent Crimes", "Indiscriminate Weapons"))
    assert Replacement("PII", ("Privacy",)) in replaced
    assert replaced[-1] == Replacement("Jailbreak", ())
    assert "Suicide & Self-Harm" not in [r.category for r in replaced]
    assert [r.category for r in replaced] == [
        c for c in QWEN3GUARD_CATEGORIES if c != "Suicide & Self-Harm"
    ]
    assert all(c in KNOWN["llamaguard3-1b"].categories for c in policy.refuse_categories)
    assert policy.refuse_categories[:2] == ("Violent Crimes", "Indiscriminate Weapons")
    assert (
        replaced[-1].line() == '"Jailbreak": no listed judge reports it or an equivalent; removed'
    )
    assert replaced[0].line() == (
        '"Violent": no listed judge reports it; replaced by "Violent Crimes", "Indiscriminate Weapons"'
    )


def test_use_does_not_repeat_a_category_already_there() -> None:
    start = Policy(judge_models=("x",), refuse_categories=("Privacy", "PII"))
    policy, replaced = use(start, ["llamaguard3-8b"])
    assert policy.refuse_categories == ("Privacy",)
    assert replaced == [Replacement("PII", ("Privacy",))]


def test_use_back_to_qwen() -> None:
    start = Policy(judge_models=("x",), refuse_categories=("Specialized Advice", "Hate"))
    policy, replaced = use(start, ["qwen3guard-0.6b"])
    assert policy.refuse_categories == ("Unethical Acts",)
    assert replaced == [
        Replacement("Specialized Advice", ()),
        Replacement("Hate", ("Unethical Acts",)),
    ]


def test_use_reads_catalog_judges_from_reports() -> None:
    start = Policy(judge_models=("x",), refuse_categories=("Violent", "toxic"))
    policy, replaced = use(start, ["my-json-judge"], reports={"my-json-judge": ["Toxic"]})
    assert policy.judge_models == ("my-json-judge",)
    assert policy.refuse_categories == ("toxic",)
    assert replaced == [Replacement("Violent", ())]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "at least one judge"),
        (["qwen3guard-4b", "qwen3guard-4b"], "listed twice"),
        (["nope"], 'no judge "nope" in the catalog or known: one of llamaguard3-1b'),
    ],
)
def test_use_refuses(names: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        use(BASELINE, names)
