"""The model's page says what context one request really gets where llama-server divides
its --ctx-size across --parallel slots (the gateway enforces the same figure)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from tests.catalog.samples import cpu_model, store


def test_the_page_says_a_request_gets_a_slots_share(client_for: Any, viewer: Any) -> None:
    store(cpu_model("slotted", context_length=8192, profiles=[
        {"name": "cpu", "engine": "llamacpp", "cpu_cores": 2,
         "args": ["--ctx-size", "8192", "--parallel", "4"]}]))  # fmt: skip
    store(cpu_model("whole", context_length=2048))
    html = (
        client_for(viewer)
        .get(reverse("catalog:servedmodel_detail", args=["slotted"]))
        .content.decode()
    )
    assert "2048 tokens a request" in html and "shared by 4 slot(s)" in html
    html = (
        client_for(viewer)
        .get(reverse("catalog:servedmodel_detail", args=["whole"]))
        .content.decode()
    )
    assert "tokens a request" not in html
