"""An operator's first hour: a roll and a drain, watched in a real browser, never dark.

A real Chromium against a real ``manage.py serve`` (the reconciler in-process every
second) and agents with simulated cards running sim engines that load for a few seconds.
The page records, with a MutationObserver, every ready count the model's block shows
while it changes: it must never read 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from catalog import rules
from catalog.models import ServedModel
from cluster.models import Assignment, ClusterAction, Node, Replica
from tests.browser.conftest import wait_js
from tests.catalog.samples import all_day, sim_model, store
from tests.e2e.conftest import Agent, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"
LOAD = "3"  # seconds each sim engine loads: the page sees replicas starting and loading

# Records each ready count the model's block shows (replicas being stopped left out).
RECORD_READY = """
([sel, model]) => {
  window.__ready = [];
  const count = () => {
    let n = 0;
    for (const block of document.querySelectorAll(sel)) {
      const head = block.querySelector('h3');
      if (!head || head.textContent.trim() !== model) continue;
      n += block.querySelectorAll('tr.replica[data-state=ready]:not(.leaving)').length;
    }
    return n;
  };
  const look = () => {
    const n = count();
    if (window.__ready[window.__ready.length - 1] !== n) window.__ready.push(n);
  };
  look();
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
}
"""


def scheduled(name: str) -> dict[str, Any]:
    """A model whose schedule window is in force all day, every day: min 2, max 2."""
    return sim_model(name, 1, most=2, gpu_class=L4, tp=None,
                     profile={"args": ["--load-time", LOAD]}, schedule=all_day(2, 2))  # fmt: skip


def ready_nodes(*names: str) -> list[Node]:
    return wait_for(
        lambda: (found := list(Node.objects.filter(name__in=names, health="ready")))
        and len(found) == len(names)
        and found,
        30,
        f"nodes {names}",
    )


def ready(name: str, count: int) -> None:
    wait_for(
        lambda: Replica.objects.filter(model_name=name, desired=True, state="ready").count()
        == count,
        60,
        f"{count} ready replicas of {name}",
    )


def all_current(name: str) -> bool:
    m = rules.normalize(ServedModel.objects.get(name=name).to_spec())
    prints = {p.name: rules.fingerprint(p) for p in m.profiles}
    left = list(Replica.objects.filter(model_name=name))
    return bool(left) and all(r.desired and r.fingerprint == prints[r.profile] for r in left)


def edit_and_roll(page: Any, name: str) -> None:
    """Change the profile's args in the console's form, then press Roll on the model's page."""
    page.goto(page.url.split("/cluster/")[0] + f"/catalog/models/{name}/edit/")
    page.locator("textarea[name$='-args']").first.fill("--load-time\n2")
    page.locator("button[type=submit]", has_text="Save").click()
    page.wait_for_url(f"**/catalog/models/{name}/")
    page.wait_for_selector("[data-live-status].on")
    block = page.locator(".live-replicas article")
    assert block.locator(".badge", has_text="old definition").count() == 2
    page.evaluate(RECORD_READY, [".live-replicas article", name])
    # Roll asks first, as Restart and Drain do: the operator says yes.
    page.once("dialog", lambda dialog: dialog.accept())
    block.locator("button", has_text="Roll").click()


def finished(page: Any, name: str) -> None:
    """Wait until the page shows two ready replicas of the current definition, and no more."""
    block = page.locator(".live-replicas article")
    wait_js(
        page,
        """() => {
          const b = document.querySelector('.live-replicas article');
          const rows = b.querySelectorAll('tr.replica');
          return rows.length === 2
            && [...rows].every(r => r.dataset.state === 'ready')
            && !b.querySelector('.badge.outdated');
        }""",
        timeout=120,
        what=f"two ready replicas of {name}'s current definition on its page",
    )
    assert "2 of 2 ready" in block.inner_text()
    assert wait_for(lambda: all_current(name), 30, "only current replicas in the database")


def test_a_roll_of_a_scheduled_model_ends_current_and_never_dark(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any
) -> None:
    agents("roll-1", "--simulate", f"2x {L4}")
    agents("roll-2", "--simulate", f"2x {L4}")
    ready_nodes("roll-1", "roll-2")
    store(scheduled("roll-chat"))
    ready("roll-chat", 2)
    page = console(operator)
    edit_and_roll(page, "roll-chat")
    finished(page, "roll-chat")
    seen = page.evaluate("window.__ready")
    assert min(seen) >= 1, seen
    # Room for both replacements beside the old: two served throughout.
    assert min(seen) == 2, seen


def test_without_room_the_roll_goes_one_at_a_time_and_says_so(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any
) -> None:
    agents("tight-1", "--simulate", f"2x {L4}")
    ready_nodes("tight-1")
    store(scheduled("tight-chat"))
    ready("tight-chat", 2)
    page = console(operator)
    edit_and_roll(page, "tight-chat")
    note = page.locator(".live-replicas [data-role=roll-note]").first
    note.wait_for(timeout=30_000)
    assert "one replica at a time" in note.inner_text()
    finished(page, "tight-chat")
    seen = page.evaluate("window.__ready")
    assert min(seen) >= 1, seen


# Notes, in the page, each request htmx sends and its answer's status (said when neither
# the refusal nor the drain comes).
NOTE_REQUESTS = """
() => {
  window.__requests = [];
  const note = (e) => window.__requests.push(e.type.slice(5) + ' ' + e.detail.requestConfig?.path
    + ' ' + (e.detail.xhr?.status ?? ''));
  document.addEventListener('htmx:beforeRequest', note);
  document.addEventListener('htmx:afterRequest', note);
}
"""


def on_node(node: Node, model: str, count: int) -> bool:
    """Whether the node is ready, uncordoned, and holds ``count`` ready replicas of the model."""
    node.refresh_from_db()
    held = Replica.objects.filter(
        model_name=model, desired=True, state="ready", assignments__node=node
    ).distinct()
    return node.health == "ready" and not node.cordoned and held.count() == count


def drain_refused(page: Any, node: Node, model: str, count: int) -> Any:
    """Press Drain on the node once the refusal's preconditions hold; return the refusal.

    A drain is refused only while the model's ready replicas are on the node. A heartbeat
    later than the node's lost-after (4 s here), as on a loaded machine, marks the node
    lost and releases them: the drain then rightly finds nothing to move and cordons
    the node ("0 replaced elsewhere before stopping, 0 stopped"), and no refusal comes.
    Then the node is uncordoned, and Drain pressed again once they are back on it; a
    drain allowed for any other reason fails here, saying what it did.
    """
    card = page.locator(f"#cluster-node-{node.pk}")
    refusal = card.locator("[data-role=drain-refused]")
    for _ in range(3):
        wait_for(lambda: on_node(node, model, count), 60, f"{count} ready {model} on {node.name}")
        before = ClusterAction.objects.filter(action="drain").count()
        page.evaluate(NOTE_REQUESTS)
        card.get_by_role("button", name="Drain", exact=True).click()
        try:
            outcome = wait_for(
                lambda before=before: (refusal.count() and "refused")
                or (ClusterAction.objects.filter(action="drain").count() > before and "drained"),
                30,
                "the drain's refusal, or the drain",
            )
        except AssertionError as exc:
            node.refresh_from_db()
            raise AssertionError(
                f"{exc}; the page's requests: {page.evaluate('window.__requests')}; the node: "
                f"{node.health}, {node.reason!r}"
            ) from None
        if outcome == "refused":
            refusal.wait_for()
            return refusal
        done = ClusterAction.objects.filter(action="drain").first()
        assert done is not None and done.detail.startswith("0 replaced elsewhere"), (
            f"the drain was allowed with {model}'s replicas on the node: {done.detail}"
        )
        from cluster import services

        services.set_cordon(Node.objects.get(pk=node.pk), False)
    raise AssertionError(f"{node.name} was lost at each of 3 drains: its heartbeats are late")


def test_a_drain_of_a_min_2_model_is_refused_without_room_then_has_no_gap(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any
) -> None:
    agents("drain-1", "--simulate", f"2x {L4}")
    (first,) = ready_nodes("drain-1")
    model = scheduled("drain-chat")
    model["scaling"] = {"min": 2, "max": 2}
    store(model)
    ready("drain-chat", 2)
    page = console(operator)
    page.on("dialog", lambda d: d.accept())
    page.evaluate(RECORD_READY, ["#cluster-models article", "drain-chat"])

    # Nowhere else to go: the console says so, names the model, and changes nothing.
    node = page.locator(f"#cluster-node-{first.pk}")
    refusal = drain_refused(page, first, "drain-chat", 2)
    assert "drain-chat" in refusal.inner_text() and "no ready replica" in refusal.inner_text()
    assert refusal.locator("button", has_text="Drain anyway").count() == 1
    first.refresh_from_db()
    assert not first.cordoned

    # A second node joins: the drain starts replacements there and stops the old ones
    # only once they are ready.
    agents("drain-2", "--simulate", f"2x {L4}")
    ready_nodes("drain-2")
    node.get_by_role("button", name="Drain", exact=True).click()
    page.locator(f"#cluster-node-{first.pk} [data-role=node-state]", has_text="cordoned").wait_for()
    wait_for(
        lambda: set(
            Assignment.objects.filter(replica__model_name="drain-chat").values_list(
                "node__name", flat=True
            )
        )
        == {"drain-2"}
        and Replica.objects.filter(model_name="drain-chat", state="ready").count() == 2,
        90,
        "both replicas ready on drain-2, none left on drain-1",
    )
    block = page.locator("#cluster-models article", has_text="drain-chat")
    wait_js(
        page,
        """() => [...document.querySelectorAll('#cluster-models article')]
            .filter(b => b.querySelector('h3')?.textContent.trim() === 'drain-chat')
            .some(b => b.querySelectorAll('tr.replica').length === 2
                && [...b.querySelectorAll('tr.replica')].every(r => r.dataset.state === 'ready'))""",
        timeout=60,
        what="drain-chat's two ready replicas on the dashboard",
    )
    assert "drain-2" in block.inner_text() and "drain-1" not in block.inner_text()
    seen = page.evaluate("window.__ready")
    assert min(seen) >= 1, seen
