"""The GPU class picker of the model form: the cluster's classes and each profile's fit.

The catalog reads the classes through ``catalog.inventory`` (registered by llmgw_admin);
nodes and cards are real rows in the test database.
"""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from catalog import inventory
from catalog.models import ServedModel
from cluster.choices import NodeHealth
from cluster.models import Assignment, Card, Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.catalog.test_views import error_at, scrape

pytestmark = pytest.mark.django_db

L4 = "nvidia-l4-24gb"
MIG = "nvidia-a100-80gb-mig-1g.10gb"
VALIDATE = reverse("catalog:servedmodel_validate")
EDIT = reverse("catalog:servedmodel_edit", args=["chat"])
SHORT = "no node has 4 free nvidia-l4-24gb; the best has 2: replicas will be unplaced"


def node(name: str, *classes: str, cordoned: bool = False) -> Node:
    n = Node.objects.create(name=name, health=NodeHealth.READY, cordoned=cordoned)
    Card.objects.bulk_create(Card(node=n, index=i, gpu_class=c) for i, c in enumerate(classes))
    return n


@pytest.fixture
def cluster(db: Any) -> None:
    """Two L4 nodes with 2 free cards each (one more card held), and a MIG node."""
    a = node("a", L4, L4)
    b = node("b", L4, L4, L4)
    node("c", "nvidia-a100-80gb", MIG, MIG)
    Card.objects.filter(node__name="c", gpu_class=MIG).update(mig_of=0)
    Assignment.objects.create(replica=Replica.objects.create(model_name="x"), node=b, cards=[2])
    assert a and b


@pytest.fixture
def chat(db: Any) -> ServedModel:
    """A vLLM model with one profile on one L4."""
    store(gpu_model("chat", profiles=[{"name": "l4", "engine": "vllm", "gpu_class": L4, "tp": 1}]))
    return ServedModel.objects.get(name="chat")


def note(html: str, row: int = 0) -> str:
    """Return the text of a profile row's class note."""
    m = re.search(
        rf'<div class="class-note[^"]*" id="profiles-{row}-gpu_class-note"[^>]*>(.*?)</div>',
        html,
        re.S,
    )
    assert m, f"no class note for profile {row}"
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", m.group(1))).split())


def test_edit_page_lists_the_clusters_classes_with_free_and_total(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel
) -> None:
    html = client_for(operator).get(EDIT).content.decode()
    # The suggestions of every gpu_class box, and the picker under it.
    assert 'list="gpu-class-options"' in html
    assert f'<option value="{L4}">4/5 free</option>' in html
    assert f'<option value="{MIG}">2/2 free · MIG</option>' in html
    picker = html[html.index('<details class="class-picker">') :]
    picker = picker[: picker.index("</details>")]
    assert f'data-pick="{L4}"><code>{L4}</code> <span class="count">4/5 free</span>' in picker
    assert f'data-pick="{MIG}"><code>{MIG}</code> <span class="count">2/2 free</span> ' in picker
    assert '<span class="badge mig">MIG</span>' in picker
    # The stored profile's class, as the cluster has it.
    assert note(html) == f"{L4}: 4 free of 5 on 2 nodes"


def test_width_too_wide_for_any_node_warns_but_is_allowed(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel
) -> None:
    c = client_for(operator)
    data = scrape(c.get(EDIT).content.decode())
    # gpus_per_node left blank: the rules read it as tp / nodes, 4 cards on one node.
    data.update({"profiles-0-tp": "4", "profiles-0-gpus_per_node": "", "_touched": "profiles-0-tp"})
    html = c.post(VALIDATE, data).content.decode()
    assert note(html) == f"{SHORT} {L4}: 4 free of 5 on 2 nodes"
    assert (
        'class="class-note warn" id="profiles-0-gpu_class-note" aria-live="polite" hx-swap-oob="true"'
        in html
    )
    assert error_at(html, "profiles-0-tp") == ""
    assert "No problems" in html
    # Saved as asked: the catalog does not know the cluster.
    r = c.post(EDIT, data)
    assert r.status_code == 302
    assert ServedModel.objects.get(name="chat").to_spec().profiles[0].tp == 4


def test_a_class_no_node_has_is_allowed_with_a_note(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel
) -> None:
    c = client_for(operator)
    data = scrape(c.get(EDIT).content.decode())
    data.update({"profiles-0-gpu_class": "nvidia-b200-192gb", "_touched": "profiles-0-gpu_class"})
    html = c.post(VALIDATE, data).content.decode()
    assert note(html) == "no node has nvidia-b200-192gb: replicas will be unplaced"
    assert "No problems" in html


def test_a_mig_class_is_marked_and_its_width_is_the_rules_to_refuse(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel
) -> None:
    c = client_for(operator)
    data = scrape(c.get(EDIT).content.decode())
    data.update({"profiles-0-gpu_class": MIG, "_touched": "profiles-0-gpu_class"})
    html = c.post(VALIDATE, data).content.decode()
    assert note(html) == f"{MIG}: 2 free of 2 on 1 node · MIG instance"
    data.update({"profiles-0-tp": "2"})
    html = c.post(VALIDATE, data).content.decode()
    assert "is a MIG instance, and a replica runs on exactly one" in error_at(
        html, "profiles-0-gpu_class"
    )


def test_the_width_rule_shows_at_tp_when_another_width_field_is_typed(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel
) -> None:
    c = client_for(operator)
    data = scrape(c.get(EDIT).content.decode())
    data.update(
        {
            "profiles-0-nodes": "2",
            "profiles-0-gpus_per_node": "2",
            "_touched": "profiles-0-gpus_per_node",
        }
    )
    html = c.post(VALIDATE, data).content.decode()
    assert "2 nodes x 2 GPUs does not match tp 1 x pp 1" in error_at(html, "profiles-0-tp")
    # Fields outside the profile's width still wait until touched.
    data.update({"source": "", "_touched": "profiles-0-gpus_per_node"})
    assert error_at(c.post(VALIDATE, data).content.decode(), "source") == ""
    # With tp 4 the arithmetic holds; two nodes with 2 free each fit it.
    data.update({"profiles-0-tp": "4", "source": "org/chat"})
    html = c.post(VALIDATE, data).content.decode()
    assert error_at(html, "profiles-0-tp") == ""
    assert note(html) == f"{L4}: 4 free of 5 on 2 nodes"


def test_a_cordoned_node_has_no_free_cards(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel
) -> None:
    Node.objects.filter(name="a").update(cordoned=True)
    c = client_for(operator)
    data = scrape(c.get(EDIT).content.decode())
    data.update({"profiles-0-tp": "2", "profiles-0-nodes": "2", "_touched": "profiles-0-tp"})
    html = c.post(VALIDATE, data).content.decode()
    assert note(html).startswith(
        "only 1 node has 1 free nvidia-l4-24gb; the profile needs 2 such nodes: replicas will be unplaced"
    )


def test_an_added_profile_row_has_the_picker(client_for: Any, operator: Any, cluster: None) -> None:
    url = reverse("catalog:servedmodel_formrow", args=["profiles"])
    html = client_for(operator).get(url, {"profiles-TOTAL_FORMS": "1"}).content.decode()
    assert 'id="id_profiles-1-gpu_class"' in html and 'list="gpu-class-options"' in html
    assert f'data-pick="{L4}"' in html
    assert note(html, 1) == ""


def test_an_empty_cluster_says_so(client_for: Any, operator: Any, chat: ServedModel) -> None:
    html = client_for(operator).get(EDIT).content.decode()
    assert "No node has reported a GPU yet." in html
    assert note(html) == f"no node has {L4}: replicas will be unplaced"


@pytest.fixture
def no_inventory() -> Iterator[None]:
    saved = inventory.source()
    inventory.register(None)
    yield
    inventory.register(saved)


def test_without_an_inventory_the_form_says_nothing_of_classes(
    client_for: Any, operator: Any, cluster: None, chat: ServedModel, no_inventory: None
) -> None:
    c = client_for(operator)
    html = c.get(EDIT).content.decode()
    assert "class-picker" not in html and 'gpu-class-options">' not in html
    assert "-gpu_class-note" not in html
    data = scrape(html)
    data.update({"profiles-0-tp": "4", "_touched": "profiles-0-tp"})
    assert "-gpu_class-note" not in c.post(VALIDATE, data).content.decode()
