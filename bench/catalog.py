"""Measure the catalog at 1,000 models: validate and import a file, and the API's pages.

    .venv/bin/python bench/catalog.py [--models 1000]

Runs on a throwaway database created on the configured server (tests/settings.py: the
local PostgreSQL unless LLMGW_TEST_DATABASE_URL says otherwise) and drops it after.
Prints figures; asserts nothing about time. Goals: validate under 1 s, import
under 10 s, the same small number of queries for the list at 10 and at 1,000 models.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bench import webproc  # noqa: E402

GPU_CLASSES = [
    "nvidia-h100-80gb",
    "nvidia-l4-24gb",
    "nvidia-a100-80gb",
    "nvidia-a100-80gb-mig-1g.10gb",
]


def make_model(i: int, rng: random.Random) -> dict[str, Any]:
    """Return a realistic model: GPU and CPU profiles, schedules, aliases, adapters."""
    kind = i % 5
    name = f"model-{i:04d}"
    data: dict[str, Any] = {
        "name": name,
        "aliases": [f"{name}-latest"],
        "description": f"benchmark model {i}",
        "source": f"org/{name}",
        "scaling": {"min": 1, "max": 1 + i % 4},
    }
    if kind == 0:
        data["source"] = f"/models/{name}.gguf"
        data["profiles"] = [
            {"name": "cpu", "engine": "llamacpp", "cpu_cores": 4, "min_memory_gb": 8}
        ]
        data["scaling"] = {"min": 0, "max": 2, "idle_timeout": "30m"}
    elif kind == 1:
        data["profiles"] = [
            {
                "name": "big",
                "engine": "vllm",
                "gpu_class": "nvidia-h100-80gb",
                "tp": 8,
                "nodes": 2,
                "gpus_per_node": 4,
                "priority": 2,
                "keep_within": "rack",
            },
            {
                "name": "small",
                "engine": "vllm",
                "gpu_class": "nvidia-a100-80gb",
                "tp": 4,
                "args": ["--max-model-len", "32768"],
                "env": {"VLLM_LOGGING_LEVEL": "INFO"},
            },
        ]
        data["scaling"]["schedule"] = [
            {"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2, "max": 6},
            {"days": ["sat"], "from": "22:00", "to": "02:00", "min": 1},
        ]
        data["scaling"]["prewarm"] = "20m"
    elif kind == 2:
        data["profiles"] = [{"name": "mig", "engine": "vllm", "gpu_class": GPU_CLASSES[3]}]
        data["adapters"] = [{"name": f"{name}-sql", "source": f"/lora/{name}/sql"}]
        data["max_loaded_adapters"] = 2
    elif kind == 3:
        data["profiles"] = [
            {"name": "l4", "engine": "sglang", "gpu_class": "nvidia-l4-24gb", "tp": 2}
        ]
        data["fallbacks"] = [f"model-{i - 1:04d}"]
        data["class"] = rng.choice(["critical", "standard", "opportunistic"])
        data["owner"] = f"team:t{i % 7}"
    else:
        data["profiles"] = [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-l4-24gb"}]
        data["role"] = "guard"
        data["guard"] = {"format": "qwen3guard"}
        data["context_length"] = 32768
        data["max_output"] = 64
    return data


def timed(fn: Any, repeat: int = 1) -> tuple[float, Any]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=1000)
    args = parser.parse_args()
    n = args.models

    import yaml

    from catalog import codec, files, rules, services
    from catalog.choices import Surface

    rng = random.Random(7)
    data = {"models": [make_model(i, rng) for i in range(n)]}
    text = yaml.safe_dump(data, sort_keys=False)
    print(f"file: {n} models, {len(text) / 1e6:.2f} MB")

    def validate() -> Any:
        models, problems = files.load_catalog_text(text)
        assert not problems, problems[:3]
        problems = rules.check_catalog(models)
        assert not problems, problems[:3]
        return models

    t_load, models = timed(lambda: files.load_catalog_text(text), repeat=3)
    t_validate, models = timed(validate, repeat=3)
    print(f"  load (YAML + shape): {t_load:.3f} s; rules: {t_validate - t_load:.3f} s")

    old_name, test_db = webproc.throwaway_database("llmgw_bench_catalog")
    print(f"database: {connection.vendor} {test_db}")
    try:
        from django.contrib.auth.models import Group, User
        from rest_framework.test import APIClient

        actor = services.Actor(user=None, surface=Surface.FILE, name="bench")
        user = User.objects.create_user("bench", password="x")
        user.groups.add(Group.objects.get_or_create(name="viewer")[0])
        api = APIClient()
        api.force_authenticate(user)

        def page(url: str) -> tuple[int, float]:
            api.get(url)
            times = []
            for _ in range(5):
                with CaptureQueriesContext(connection) as ctx:
                    t = time.perf_counter()
                    r = api.get(url)
                    times.append(time.perf_counter() - t)
                assert r.status_code == 200, r.status_code
            return len(ctx), statistics.median(times)

        services.import_catalog(models[:10], actor)
        q10, t10 = page("/api/v1/catalog/models/")
        d10, td10 = page("/api/v1/catalog/models/model-0001/")
        services.import_catalog([], actor, replace=True)

        t_import, result = timed(lambda: services.import_catalog(models, actor))
        assert len(result.added) == n
        q1000, t1000 = page("/api/v1/catalog/models/")
        d1000, td1000 = page("/api/v1/catalog/models/model-0001/")
        one = codec.decode_model(make_model(10_001, rng))[0]
        t_save, _ = timed(lambda: services.save_model(one, actor))
        t_export, exported = timed(lambda: files.dump_catalog(services.export_specs()))
        print(f"  list page (100 a page): {t10 * 1000:.1f} ms at 10, {t1000 * 1000:.1f} ms at {n}")
        print(
            f"  model page: {d10} and {d1000} queries; {td10 * 1000:.1f} ms and {td1000 * 1000:.1f} ms"
        )
        print(f"  one save checked against {n} models: {t_save * 1000:.0f} ms")
        print(f"  export {n} models: {t_export:.3f} s ({len(exported) / 1e6:.2f} MB)")
    finally:
        webproc.drop_database(old_name)

    print(f"validate {n} models: {t_validate:.3f} s")
    print(f"import {n} models: {t_import:.3f} s")
    print(f"list queries at 10 and {n} models: {q10} {q1000}")


if __name__ == "__main__":
    main()
