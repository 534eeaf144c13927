"""The model form as an operator meets it: an engine's arguments pasted as a command line,
and role, class and engine chosen from the same lists the catalog's filters offer."""

from __future__ import annotations

from typing import Any

import pytest

from agent.engines import ENGINES
from catalog.forms import ArgsField
from catalog.models import Profile
from tests.catalog.samples import cpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)

L4 = "nvidia-l4-24gb"


def test_args_pasted_as_a_command_line_or_one_a_line_are_split_as_a_shell_does(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    store(cpu_model("small"))
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/models/small/edit/")
    args = page.locator("textarea[name='profiles-0-args']")
    args.fill("--n-gpu-layers 0 --ctx-size 4096\n--chat-template 'my small'")
    page.click("button:text('Save')")
    page.wait_for_url(f"{live_server.url}/catalog/models/small/")
    assert Profile.objects.get(model__name="small").args == [
        "--n-gpu-layers", "0", "--ctx-size", "4096", "--chat-template", "my small",
    ]  # fmt: skip
    # Shown again one a line, quoted where a shell needs it: saved again unchanged.
    page.goto(f"{live_server.url}/catalog/models/small/edit/")
    assert args.input_value() == "--n-gpu-layers\n0\n--ctx-size\n4096\n--chat-template\n'my small'"

    # An unclosed quote says where, and saves nothing.
    args.fill("--chat-template 'my small")
    page.click("button:text('Save')")
    error = page.locator("#err-profiles-0-args")
    error.get_by_text("line 1: No closing quotation").wait_for()
    assert Profile.objects.get(model__name="small").args[-1] == "my small"


def test_role_class_and_engine_are_chosen_from_lists(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/new/")

    def options(selector: str) -> list[str]:
        return page.eval_on_selector_all(f"{selector} option", "os => os.map(o => o.value)")

    assert page.locator("select#id_role").count() == 1
    assert options("#id_role") == ["", "guard"]
    assert "serve" in page.locator("#id_role option[value='']").inner_text()
    assert options("#id_capacity_class") == ["", "critical", "standard", "opportunistic"]
    assert options("#id_profiles-0-engine") == ["", *ENGINES]
    # The list's filters offer the same roles, classes and engines.
    page.goto(f"{live_server.url}/catalog/")
    assert options("select[name=role]") == ["", "serve", "guard"]
    assert options("select[name=class]") == ["", "critical", "standard", "opportunistic"]
    assert options("select[name=engine]") == ["", *ENGINES]


def test_args_field_splits_and_quotes_back() -> None:
    field = ArgsField()
    assert field.clean("--n-gpu-layers 0") == ["--n-gpu-layers", "0"]
    assert field.clean("--n-gpu-layers\n0\n\n") == ["--n-gpu-layers", "0"]
    assert field.clean(field.prepare_value(["--alias", "a b", "--x=it's"])) == [
        "--alias", "a b", "--x=it's",
    ]  # fmt: skip


def test_a_new_models_tp_past_its_class_nodes_cards_warns_as_it_is_typed(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    from cluster.choices import NodeHealth
    from cluster.models import Card, Node

    for name in ("w1", "w2"):
        n = Node.objects.create(name=name, health=NodeHealth.READY)
        Card.objects.bulk_create(Card(node=n, index=i, gpu_class=L4) for i in range(2))
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/new/")
    page.fill("#id_name", "wide")
    page.fill("#id_source", "org/wide")
    page.fill("#id_profiles-0-name", "l4")
    page.select_option("#id_profiles-0-engine", "vllm")
    page.locator("#id_profiles-0-gpu_class").click()
    page.keyboard.type(L4)
    page.locator("#id_profiles-0-tp").click()
    page.keyboard.type("4")  # typed, not left
    page.locator("#profiles-0-gpu_class-note").get_by_text(
        f"no node has 4 free {L4}; the best has 2: replicas will be unplaced"
    ).wait_for()


@pytest.mark.parametrize("width", [390, 1280])
def test_a_check_box_has_its_name_beside_it_and_its_help_below_both(
    signed_in: Any, operator: Any, live_server: Any, width: int
) -> None:
    """trust_remote_code and the capabilities: the box, its name on the same line, the
    help under them the form's width (at 390 px the help once sat between box and name,
    the name broken a letter group a line)."""
    page = signed_in(operator)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/catalog/new/")
    for name in ("trust_remote_code", "capabilities_rerank"):
        box = page.locator(f"input[type=checkbox][name='{name}']").bounding_box()
        field = page.locator(f".field.check:has(input[name='{name}'])")
        label = field.locator("label").bounding_box()
        help_ = field.locator(".help").bounding_box()
        assert box and label and help_, name
        assert abs((label["y"] + label["height"] / 2) - (box["y"] + box["height"] / 2)) < 8, name
        assert label["height"] < 30, f"{name}'s name is broken over lines: {label}"
        assert help_["y"] >= label["y"] + label["height"] - 1, name
