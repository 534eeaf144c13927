"""A refused drain's note survives the pushes that re-render the node's card and the model's
block; it goes only once a model it names has no block left (its "Drain anyway" would act
on what is no longer so).

In Chromium on the dashboard: Drain is pressed for real (refused: no room elsewhere); the
pushes are applied as htmx's ws extension applies a message (each element swapped by its
id, then ``htmx:wsAfterMessage``), with the fragments the live view renders.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import live
from cluster.choices import NodeHealth
from cluster.models import Assignment, Card, Node, Replica
from tests.catalog.samples import sim_model, store

pytestmark = pytest.mark.django_db(transaction=True)

L4 = "nvidia-l4-24gb"

# Applies a live message as htmx's ws extension does: each top-level element swapped by
# its id (out of band), then htmx:wsAfterMessage.
PUSH = """
(html) => {
  const box = document.createElement('template');
  box.innerHTML = html;
  for (const el of [...box.content.children]) {
    htmx.swap('#' + el.id, el.outerHTML, {swapStyle: 'outerHTML'});
  }
  document.body.dispatchEvent(new CustomEvent('htmx:wsAfterMessage', {bubbles: true}));
}
"""


def test_a_drain_refusal_survives_pushes_of_its_card_and_block(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    node = Node.objects.create(name="d1", health=NodeHealth.READY)
    Card.objects.bulk_create(Card(node=node, index=i, gpu_class=L4) for i in range(2))
    store(sim_model("dchat", 2, gpu_class=L4, tp=None))
    for i in range(2):
        r = Replica.objects.create(model_name="dchat", state="ready", desired=True,
                                   endpoint=f"http://127.0.0.1:{9 + i}")  # fmt: skip
        Assignment.objects.create(replica=r, node=node, cards=[i])
    page = signed_in(operator)
    page.goto(f"{live_server.url}/cluster/")
    page.on("dialog", lambda d: d.accept())
    card = page.locator(f"#cluster-node-{node.pk}")
    card.get_by_role("button", name="Drain", exact=True).click()
    refusal = card.locator("[data-role=drain-refused]")
    refusal.wait_for()
    assert "dchat" in refusal.inner_text()

    # Pushes re-render the card, the model's block, then both in one message.
    node_html = live.render_node(live.node_rows([node.pk])[0], can_act=True)
    block_html = live.models_changed(["dchat"], True)["dchat"]
    for html in (node_html, block_html, node_html + "\n" + block_html):
        page.evaluate(PUSH, html)
        assert card.locator("[data-role=drain-refused]").count() == 1
    assert "dchat" in refusal.inner_text()

    # The model's block goes (its replicas gone): the note goes with it.
    page.evaluate(
        "(id) => { document.getElementById(id)?.remove();"
        " document.body.dispatchEvent(new CustomEvent('htmx:wsAfterMessage', {bubbles: true})); }",
        live.model_dom_id("dchat"),
    )
    assert card.locator("[data-role=drain-refused]").count() == 0
