"""The first start's demo: LLMGW_SIMULATE read strictly, init adding the demo once and never
again, and the console's simulated-cluster banner."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from catalog import codec
from catalog.choices import Surface
from catalog.models import ChangeRecord, ServedModel
from catalog.services import Actor, Refused, delete_model, save_model
from cluster.choices import NodeHealth
from cluster.models import Node
from guard import services as guard_services
from guard.models import PolicyChange
from llmgw_admin import demo
from tests.catalog.samples import sim_model
from tests.cluster.helpers import join_node
from tests.redisserver import url as redis_url

ROOT = Path(__file__).resolve().parent.parent
DEMO = [demo.CHAT, demo.ON_DEMAND, demo.SIM_JUDGE]
BASELINE_JUDGE = "qwen3guard-0.6b"


def init() -> str:
    out = io.StringIO()
    call_command("init", stdout=out, stderr=out)
    return out.getvalue()


def names() -> list[str]:
    return sorted(ServedModel.objects.values_list("name", flat=True))


@pytest.fixture
def simulate(settings: Any) -> None:
    """The embedded default's simulated nodes (the tests' settings are production's: off)."""
    settings.LLMGW_SIMULATE = demo.parse_simulate(settings.SIMULATE_EMBEDDED)


# -- LLMGW_SIMULATE ---------------------------------------------------------------------


def test_parse_simulate_reads_nodes_and_off() -> None:
    assert demo.parse_simulate(django_settings.SIMULATE_EMBEDDED) == [
        demo.SimNode("sim-1", "2x nvidia-l4-24gb,1x nvidia-h100-80gb"),
        demo.SimNode("sim-2", "2x nvidia-l4-24gb,1x nvidia-h100-80gb"),
    ]
    assert demo.parse_simulate(" OFF ") == [] == demo.parse_simulate("false")
    assert demo.parse_simulate("4x nvidia-a100-80gb;") == [
        demo.SimNode("sim-1", "4x nvidia-a100-80gb")
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2x nvidia-h100", 'node 1 ("2x nvidia-h100"): "nvidia-h100" is not a GPU class'),
        ("1x nvidia-l4-24gb; two", 'node 2 ("two"): "two" is not a GPU class'),
        (
            "0x nvidia-l4-24gb",
            'node 1 ("0x nvidia-l4-24gb"): "0x nvidia-l4-24gb" asks for no cards',
        ),
        (" ; ", 'names no node: write "off"'),
        (";".join(["nvidia-l4-24gb"] * 9), "names 9 nodes; at most 8 run inside the web process"),
    ],
)
def test_parse_simulate_refuses_saying_where_and_what_to_write(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        demo.parse_simulate(value)


def settings_simulate(tmp_path: Path, **env: str) -> str:
    """Return what LLMGW_SIMULATE reads as in a process with this environment only."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    clean.update(LLMGW_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="llmgw_admin.settings")
    clean.update({f"LLMGW_{k}": v for k, v in env.items()})
    code = "from django.conf import settings; print([n.name for n in settings.LLMGW_SIMULATE])"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True
    )
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def test_simulate_is_on_only_on_the_embedded_default_unless_asked(tmp_path: Path) -> None:
    redis = redis_url(15)
    assert settings_simulate(tmp_path) == "['sim-1', 'sim-2']"
    assert settings_simulate(tmp_path, REDIS_URL=redis) == "[]"
    assert settings_simulate(tmp_path, DATABASE_URL="postgres://x@127.0.0.1/x") == "[]"
    asked = settings_simulate(tmp_path, REDIS_URL=redis, SIMULATE="1x nvidia-h100-80gb")
    assert asked == "['sim-1']"
    assert settings_simulate(tmp_path, SIMULATE="off") == "[]"
    assert settings_simulate(tmp_path, SIMULATE="2x h100") == (
        'django.core.exceptions.ImproperlyConfigured: LLMGW_SIMULATE: node 1 ("2x h100"): '
        '"h100" is not a GPU class: write vendor, model and memory, as in "nvidia-h100-80gb"; '
        'write "off", or each node\'s cards as "2x nvidia-l4-24gb,1x nvidia-h100-80gb" with ";" '
        "between nodes"
    )


def test_demo_models_use_the_simulated_classes_and_load_for_a_few_seconds() -> None:
    models = {m.name: m for m in demo.demo_models({"nvidia-a100-40gb": 40960})}
    assert sorted(models) == sorted(DEMO)
    for m in models.values():
        (p,) = m.profiles
        assert (p.engine, p.gpu_class) == ("sim", "nvidia-a100-40gb")
        assert p.args == ["--load-time", str(demo.LOAD_TIME_S)]
    assert models[demo.SIM_JUDGE].guard.format == "qwen3guard"
    two = {
        m.name: m for m in demo.demo_models({"nvidia-l4-24gb": 24576, "nvidia-h100-80gb": 81920})
    }
    assert two[demo.CHAT].profiles[0].gpu_class == "nvidia-l4-24gb"
    assert two[demo.ON_DEMAND].profiles[0].gpu_class == "nvidia-h100-80gb"
    assert two[demo.SIM_JUDGE].profiles[0].gpu_class == "nvidia-h100-80gb"
    with pytest.raises(ValueError, match="no GPU class"):
        demo.demo_models({})


# -- init -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_init_adds_the_demo_once_with_the_sim_judge_after_the_real_one(simulate: None) -> None:
    out = init()
    assert names() == sorted([*DEMO, BASELINE_JUDGE])
    assert "init: demo models demo-chat, demo-coder, qwen3guard-0.6b-sim added" in out
    policy = guard_services.current_policy()
    assert policy.judge_models == (BASELINE_JUDGE, demo.SIM_JUDGE)
    records = ChangeRecord.objects.count()
    again = init()
    assert "demo" not in again
    assert ChangeRecord.objects.count() == records == 4
    assert PolicyChange.objects.count() == 2
    assert set(
        ChangeRecord.objects.filter(model_name__in=DEMO).values_list("actor_name", flat=True)
    ) == {demo.ACTOR}
    # The catalog's rules were applied: the stored models read back as they were made.
    stored = ServedModel.objects.get(name=demo.CHAT).to_spec()
    assert stored.scaling.schedule[0].min == 2 and stored.profiles[0].engine == "sim"


@pytest.mark.django_db
def test_init_never_adds_back_what_an_operator_deleted_or_changed(
    simulate: None, operator: Any
) -> None:
    init()
    actor = Actor(user=operator, surface=Surface.CONSOLE)
    delete_model(demo.ON_DEMAND, actor)
    # An air-gapped site points the baseline judge at a mirror.
    judge = ServedModel.objects.get(name=BASELINE_JUDGE).to_spec()
    judge.source = "https://mirror.example.org/qwen3guard-0.6b.gguf"
    save_model(judge, actor, replacing=BASELINE_JUDGE)
    init()
    assert demo.ON_DEMAND not in names()
    assert ServedModel.objects.get(name=BASELINE_JUDGE).source.startswith("https://mirror.")
    # A judge the policy names and judges with is not deleted: the operator
    # has the policy judge nothing first.
    with pytest.raises(Refused, match="named by the guard policy"):
        delete_model(BASELINE_JUDGE, actor)
    guard_services.set_policy({"judge": {"models": [BASELINE_JUDGE]}, "directions": []},
                              surface="cli", name="test")  # fmt: skip
    delete_model(demo.SIM_JUDGE, actor)
    delete_model(BASELINE_JUDGE, actor)
    init()
    assert names() == [demo.CHAT]


@pytest.mark.django_db
def test_init_adds_no_demo_to_an_install_an_operator_has_changed(
    simulate: None, operator: Any
) -> None:
    m, problems = codec.decode_model(
        sim_model("mine", 0, most=0, gpu_class="nvidia-l4-24gb", tp=None)
    )
    assert not problems
    save_model(m, Actor(user=operator, surface=Surface.CONSOLE))
    init()
    assert names() == sorted(["mine", BASELINE_JUDGE])
    assert guard_services.current_policy().judge_models == (BASELINE_JUDGE,)


@pytest.mark.django_db
def test_init_adds_no_demo_when_simulate_is_off(settings: Any) -> None:
    settings.LLMGW_SIMULATE = []
    init()
    assert names() == [BASELINE_JUDGE]
    # Turned on later, on an install nobody has changed yet: the demo comes then.
    settings.LLMGW_SIMULATE = demo.parse_simulate("1x nvidia-h100-80gb")
    init()
    assert names() == sorted([*DEMO, BASELINE_JUDGE])


# -- the banner -------------------------------------------------------------------------


def banner(html: str) -> str | None:
    found = re.search(r'<div id="simulated-banner".*?</div>', html, re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(0)).split()) if found else None


@pytest.mark.django_db
def test_banner_names_the_simulated_nodes_on_every_page(
    viewer: Any, operator: Any, client_for: Any
) -> None:
    client = client_for(viewer)
    join_node("gpu-real", ["nvidia-h100-80gb"])
    assert banner(client.get("/catalog/").content.decode()) is None
    join_node("sim-2", ["nvidia-l4-24gb"], simulated=True)
    join_node("sim-1", ["nvidia-l4-24gb"], simulated=True)
    for who, url in ((client, "/catalog/"), (client_for(operator), "/catalog/new/")):
        page = who.get(url)
        assert page.status_code == 200, url
        text = banner(page.content.decode())
        assert text is not None, url
        assert text.startswith(
            "Simulated cluster: nodes sim-1, sim-2 run simulated cards and sim engines"
        )
        assert "Set LLMGW_SIMULATE=off and start again" in text
    # A simulated node that is lost (LLMGW_SIMULATE=off since) no longer counts.
    Node.objects.filter(name="sim-2").update(health=NodeHealth.LOST)
    text = banner(client.get("/catalog/").content.decode())
    assert text is not None and text.startswith("Simulated cluster: node sim-1 runs simulated")
    Node.objects.filter(name="sim-1").update(health=NodeHealth.LOST)
    assert banner(client.get("/catalog/").content.decode()) is None


@pytest.mark.django_db
def test_banner_is_not_shown_before_sign_in(client: Any, django_assert_num_queries: Any) -> None:
    join_node("sim-1", ["nvidia-l4-24gb"], simulated=True)
    with django_assert_num_queries(0):
        page = client.get("/login/")
    assert page.status_code == 200 and banner(page.content.decode()) is None
