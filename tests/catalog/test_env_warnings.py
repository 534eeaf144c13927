"""An engine's environment: what loads code, names files or carries keys is refused; any
other variable passes, one its engine does not document with a warning on every surface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.flags import env_warning, unsafe_env
from catalog.models import ServedModel
from tests.catalog.samples import gpu_model
from tests.catalog.test_commands import run, write
from tests.catalog.test_validation_matrix import post_data

pytestmark = pytest.mark.django_db

URL = "/api/v1/catalog/models/"


@pytest.mark.parametrize(
    ("key", "warned"),
    [
        ("HF_HUB_OFFLINE", False),
        ("hf_hub_offline", True),
        ("_X1", True),
        ("NCCL_ALGO", False),
        ("NCCL_NCHANNELS_PER_NET_PEER", True),
        ("CUDA_MODULE_LOADING", False),
        ("TORCH_COMPILE_DEBUG", True),
        ("VLLM_ATTENTION_BACKEND", False),
    ],
)
def test_a_variable_that_names_nothing_passes_and_an_undocumented_one_is_warned_of(
    key: str, warned: bool
) -> None:
    assert unsafe_env(key, "vllm", "1") is None
    assert (env_warning(key, "vllm") is not None) is warned


@pytest.mark.parametrize("key", ["hf_token", "ld_preload", "VLLM_X_PLUGINS", "NCCL_TOPO_FILE"])
def test_what_names_a_file_or_carries_a_key_is_refused_whatever_its_case(key: str) -> None:
    assert unsafe_env(key, "vllm", "1") is not None
    assert env_warning(key, "vllm") is None  # refused, not warned of


def _with_env(name: str, **env: str) -> dict[str, Any]:
    data = gpu_model(name)
    data["profiles"][0]["env"] = env
    return data


def test_the_api_answers_the_warning_and_stores_the_model(api_for: Any, operator: Any) -> None:
    r = api_for(operator).post(URL, _with_env("m", hf_hub_offline="1", NCCL_ALGO="Ring"),
                               format="json")  # fmt: skip
    assert r.status_code == 201, r.json()
    (warning,) = r.json()["meta"]["warnings"]
    assert warning.startswith('profile "h100": hf_hub_offline is not a variable vllm serve')
    assert 'did you mean "HF_HUB_OFFLINE"?' in warning
    assert ServedModel.objects.filter(name="m").exists()
    r = api_for(operator).post(URL, _with_env("n", HF_HUB_OFFLINE="1"), format="json")
    assert r.status_code == 201 and r.json()["meta"]["warnings"] == []


def test_the_consoles_form_warns_and_saves(client_for: Any, operator: Any) -> None:
    r = client_for(operator).post("/catalog/new/", post_data(_with_env("m", _X1="1")), follow=True)
    assert r.status_code == 200
    said = [str(m) for m in r.context["messages"]]
    assert any("_X1 is not a variable vllm serve documents" in m for m in said), said
    assert ServedModel.objects.get(name="m").profiles.get().env == {"_X1": "1"}


def test_catalog_validate_prints_the_warning_and_exits_0(tmp_path: Path) -> None:
    code, out, err = run("validate", write(tmp_path, [_with_env("m", hf_hub_offline="1")]))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(
        'warning: models[0].profiles[0].env.hf_hub_offline (model "m"): profile "h100": '
        "hf_hub_offline is not a variable vllm serve documents"
    ), lines
    assert lines[-1].endswith("1 models, valid")
