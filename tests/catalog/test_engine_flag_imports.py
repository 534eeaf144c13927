"""Catalogs with real engines' command lines import."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from catalog.models import ServedModel

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"

MODELS = [
    {
        "name": "qwen3-moe",
        "source": "Qwen/Qwen3-30B-A3B",
        "profiles": [
            {
                "name": "ep",
                "engine": "vllm",
                "gpu_class": H100,
                "tp": 2,
                "args": ["--enable-expert-parallel", "--enable-lora", "--max-model-len", "32k"],
                "env": {"OMP_PROC_BIND": "close", "VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
            }
        ],
    },
    {
        "name": "bge-m3",
        "source": "BAAI/bge-m3",
        "profiles": [
            {"name": "embed", "engine": "vllm", "gpu_class": H100, "tp": 1,
             "args": ["--task", "embed"]}
        ],
    },
    {
        "name": "smollm",
        "source": "/weights/smollm2-135m-q8_0.gguf",
        "profiles": [
            {"name": "cpu", "engine": "llamacpp", "args": ["--n-gpu-layers", "0", "-c", "4096"]}
        ],
    },
    {
        "name": "deepseek",
        "source": "deepseek-ai/DeepSeek-V3",
        "profiles": [
            {"name": "sgl", "engine": "sglang", "gpu_class": H100, "tp": 1,
             "args": ["--ep-size", "8", "--speculative-algorithm", "EAGLE",
                      "--speculative-num-steps", "3"]}
        ],
    },
]  # fmt: skip


def _import(tmp_path: Path, models: list[dict]) -> tuple[int, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("catalog", "import", str(path), stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue() + err.getvalue()


def test_a_catalog_of_real_engine_command_lines_imports(tmp_path: Path) -> None:
    code, said = _import(tmp_path, MODELS)
    assert code == 0, said
    assert set(ServedModel.objects.values_list("name", flat=True)) == {m["name"] for m in MODELS}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ctx-size", "2048", "--ctx-size", "999999999"], "given twice"),
        (["--log-file", "/etc/cron.d/x"], "names a file"),
        (["--api-key", "k"], "sets what the agent sets"),
    ],
)
def test_a_bad_line_is_refused_at_its_field_and_nothing_changes(tmp_path, args, says) -> None:
    model = {"name": "m", "source": "/w/m.gguf", "profiles": [
        {"name": "cpu", "engine": "llamacpp", "args": args}]}  # fmt: skip
    code, said = _import(tmp_path, [model])
    assert code == 1
    assert "models[0].profiles[0].args" in said and says in said
    assert not ServedModel.objects.exists()
