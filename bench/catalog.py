"""Measure the catalog at a large site's size: validate, import and export a file of
2,000 models, the API's pages, and the console's pages at 2,000 models and 1,000 nodes.

    .venv/bin/python bench/catalog.py [--models 2000] [--nodes 1000]

Runs on a throwaway database created on the configured server (tests/settings.py: the
local PostgreSQL unless LLMGW_TEST_DATABASE_URL says otherwise) and drops it after. The
nodes are bench/placement.py's (H100, A100, L4, MIG and CPU nodes in racks of 20 under
power caps), stored as rows; one reconciler tick then creates the models' replicas and
places what fits, so the dashboard and a model's page show a cluster at work. The pages
are first measured at 10 models and 10 nodes, then at the full size: each page's median
time over 5 renders (Django's test client, in this process, signed in as a viewer) and
its query count. Prints figures and the machine's load; asserts nothing about time.
Goals: validate under 1 s, import under 10 s; the catalog list, a model's page and the
dashboard under 400 ms each, their query counts the same at 10 and at 2,000 models.
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

from bench import placement as synthetic  # noqa: E402
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


def store_nodes(start: int, stop: int, rng: random.Random) -> None:
    """Store nodes ``start`` to ``stop`` (bench/placement.py's), their cards, their racks'
    budgets."""
    from django.utils import timezone

    from cluster.choices import NodeHealth
    from cluster.models import Card, FacilityBudget, Node

    now = timezone.now()
    specs = [synthetic.make_node(i, rng) for i in range(start, stop)]
    rows = Node.objects.bulk_create(
        Node(
            name=n.name, labels=dict(n.labels), cpu_cores=n.cpu_cores, memory_mb=n.memory_mb,
            disk_free_mb=n.disk_free_mb, engines=dict(n.engines), weights=sorted(n.holds),
            health=NodeHealth.READY if n.schedulable else NodeHealth.NOT_READY,
            last_heartbeat=now,
        )
        for n in specs
    )  # fmt: skip
    Card.objects.bulk_create(
        Card(
            node=row, index=c.index, gpu_class=c.gpu_class, memory_mb=c.memory_mb,
            power_limit_w=c.power_limit_w, mig_of=c.mig_of,
        )
        for row, n in zip(rows, specs, strict=True)
        for c in n.cards
    )  # fmt: skip
    racks = {n.labels["llmgw.io/rack"] for n in specs}
    have = set(FacilityBudget.objects.filter(level="rack").values_list("name", flat=True))
    FacilityBudget.objects.bulk_create(
        FacilityBudget(level="rack", name=r, cap_watts=60_000 if int(r[1:]) % 4 else 20_000)
        for r in sorted(racks - have)
    )


def reconcile() -> str:
    """Run one reconciler tick; say what it did and how long it took."""
    from cluster import reconciler

    t = time.perf_counter()
    result = reconciler.tick()
    return (
        f"one reconciler tick: {time.perf_counter() - t:.1f} s, "
        f"{sum(result.created.values())} replicas created, {len(result.placed)} placed"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    n = args.models
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (1, 5, 15 min)"
    )

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
        from django.test import Client
        from rest_framework.test import APIClient

        actor = services.Actor(user=None, surface=Surface.FILE, name="bench")
        user = User.objects.create_user("bench", password="x")
        user.groups.add(Group.objects.get_or_create(name="viewer")[0])
        api = APIClient()
        api.force_authenticate(user)
        console = Client()
        console.force_login(user)

        def page(client: Any, url: str) -> tuple[int, float]:
            client.get(url)
            times = []
            for _ in range(5):
                with CaptureQueriesContext(connection) as ctx:
                    t = time.perf_counter()
                    r = client.get(url)
                    times.append(time.perf_counter() - t)
                assert r.status_code == 200, (url, r.status_code)
            return len(ctx), statistics.median(times)

        pages = {
            "API list (100 a page)": (api, "/api/v1/catalog/models/"),
            "API model": (api, "/api/v1/catalog/models/model-0001/"),
            "catalog list": (console, "/catalog/"),
            "model page": (console, "/catalog/models/model-0001/"),
            "dashboard": (console, "/cluster/"),
        }
        small = min(10, n)
        services.import_catalog(models[:small], actor)
        node_rng = random.Random(1)
        store_nodes(0, min(10, args.nodes), node_rng)
        print(f"at {small} models and {min(10, args.nodes)} nodes: {reconcile()}")
        at_small = {name: page(*where) for name, where in pages.items()}
        services.import_catalog([], actor, replace=True)

        t_import, result = timed(lambda: services.import_catalog(models, actor))
        assert len(result.added) == n
        store_nodes(min(10, args.nodes), args.nodes, node_rng)
        print(f"at {n} models and {args.nodes} nodes: {reconcile()}")
        at_large = {name: page(*where) for name, where in pages.items()}
        one = codec.decode_model(make_model(10_001, rng))[0]
        t_save, _ = timed(lambda: services.save_model(one, actor))
        t_export, exported = timed(lambda: files.dump_catalog(services.export_specs()))
        load = os.getloadavg()
        print(
            f"pages (median of 5; queries), at {small} models and at {n} models, {args.nodes} nodes:"
        )
        for name in pages:
            (q1, t1), (q2, t2) = at_small[name], at_large[name]
            print(f"  {name:<22} {t1 * 1000:7.1f} ms, {q1:3d} queries | "
                  f"{t2 * 1000:7.1f} ms, {q2:3d} queries")  # fmt: skip
        print(f"  one save checked against {n} models: {t_save * 1000:.0f} ms")
        print(f"  export {n} models: {t_export:.3f} s ({len(exported) / 1e6:.2f} MB)")
    finally:
        webproc.drop_database(old_name)

    print(f"machine load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"validate {n} models: {t_validate:.3f} s")
    print(f"import {n} models: {t_import:.3f} s")
    print(f"export {n} models: {t_export:.3f} s")
    for name in ("catalog list", "model page", "dashboard"):
        (q1, _), (q2, t2) = at_small[name], at_large[name]
        print(f"{name} at {n} models, {args.nodes} nodes: {t2 * 1000:.0f} ms "
              f"({q1} queries at {small}, {q2} at {n})")  # fmt: skip


if __name__ == "__main__":
    main()
