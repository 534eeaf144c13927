"""The console's big pages read a fixed number of queries however large the site: the
catalog list, a model's page and the dashboard, at 20 and at 200 models and nodes, with
the replicas one reconciler tick places (bench/catalog.py times them at 2,000 models and
1,000 nodes). Counted with CaptureQueriesContext; nothing here is timed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog import codec, services
from catalog.choices import Surface
from cluster import reconciler
from cluster.models import Assignment, FacilityBudget
from tests.catalog.samples import cpu_model, gpu_model, sim_model
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
# The model whose page is read: its replicas grow with the site (one per 10 nodes).
WATCHED = "m000"


def grow_to(size: int) -> None:
    """Make the site ``size`` models and ``size`` nodes large, then place its replicas."""
    from catalog.models import ServedModel
    from cluster.models import Node

    have = Node.objects.count()
    for i in range(have, size):
        join_node(f"n{i:03d}", [H100] * 8, labels={"llmgw.io/rack": f"r{i // 20}"})
        if i % 20 == 0:
            FacilityBudget.objects.create(level="rack", name=f"r{i // 20}", cap_watts=60_000)
    models = []
    for i in range(size):
        name = f"m{i:03d}"
        if i == 0:
            data = gpu_model(name, scaling={"min": size // 10, "max": size // 10})
        elif i % 10 == 5:
            # A judge (the dashboard lists every one, with its hint when it is idle).
            data = sim_model(name, 1, most=2, tp=None, source=f"org/{name}", judge="qwen3guard",
                             context_length=32768, max_output=64)  # fmt: skip
        elif i % 10 == 7:
            data = gpu_model(
                name, adapters=[{"name": f"{name}-sql", "source": f"/lora/{name}/sql"}],
                max_loaded_adapters=1, fallbacks=[f"m{i - 1:03d}"],
            )  # fmt: skip
        elif i % 3 == 0:
            data = cpu_model(name, aliases=[f"{name}-latest"], scaling={"min": 1, "max": 1})
        else:
            data = gpu_model(name, aliases=[f"{name}-latest"], owner=f"team:t{i % 4}")
        m, problems = codec.decode_model(data)
        assert not problems, problems
        models.append(m)
    actor = services.Actor(user=None, surface=Surface.FILE, name="fixture")
    services.import_catalog(models, actor, replace=True)
    reconciler.tick()
    assert ServedModel.objects.count() == size


def count(client: Any, url: str) -> tuple[list[str], str]:
    """Return the queries of one GET (after a first that warms the caches) and its page."""
    assert client.get(url).status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return [q["sql"] for q in ctx.captured_queries], response.content.decode()


@pytest.mark.parametrize(
    "url",
    [
        "/catalog/",
        f"/catalog/models/{WATCHED}/",
        "/cluster/",
        "/cluster/?nodes_page=4&models_page=4",
    ],
    ids=["catalog list", "model page", "dashboard", "dashboard's last pages"],
)
def test_page_reads_as_many_queries_at_200_models_and_nodes_as_at_20(
    client_for: Any, viewer: Any, url: str
) -> None:
    c = client_for(viewer)
    grow_to(20)
    few, _ = count(c, url)
    grow_to(200)
    many, page = count(c, url)
    assert len(many) == len(few), "\n".join(sorted(set(many) - set(few)))[:4000]
    # And the page shows the larger site.
    placed = Assignment.objects.filter(replica__model_name=WATCHED, replica__desired=True)
    if url == "/catalog/":
        assert page.count('<td class="name">') == 100  # a page of the 200
        assert '200 models, <span data-role="range">1–100</span>' in page
    elif url == "/cluster/":
        # A page of 50 nodes and 50 models, and the counts of all 200 of each.
        assert page.count('class="node card') == 50
        assert page.count('class="model card') == 50
        assert 'data-count="nodes">200<' in page and 'data-count="models">200<' in page
        assert page.count('data-role="page-of">page 1 of 4<') == 4  # above and below each
        assert f">n{199:03d}<" not in page
    elif url.startswith("/cluster/"):
        assert page.count('class="node card') == 50
        assert f">n{199:03d}<" in page and f">n{149:03d}<" not in page
        assert page.count('data-role="page-of">page 4 of 4<') == 4
    else:
        assert placed.count() == 20
        for a in placed.select_related("node"):
            assert re.search(rf"[>,] ?{a.node.name}\b", page), a.node.name
